"""isin: is each element of `elements` among `test_elements`?

Five algorithms, with M = elements.numel() and N = test_elements.numel():

  torch    torch.isin (N passes over the elements when N is small, several sorts otherwise)
  compare  every element against every test element, one fused kernel: O(M * N), wins for tiny N
  search   sort the test elements, then a branchless lower-bound search per element:
           log2(N) dependent loads each
  hash     an open-addressing hash set of the test elements built with atomic compare-and-swap,
           then one probe (about 1.5 loads) per element; a table of up to LOCAL_TABLE_BYTES is held
           on chip by every program (gathers from shared memory), larger ones are read through L2
  bitmap   one bit per value between the test set's min and max, set with atomic or; one bit test
           per element. 8/16-bit integers use their whole range (no host sync); wider integers need
           min and max on the host (one sync) and fall back to hash above BITMAP_MAX_BITS

Semantics are torch's: NaN is never a member, -0.0 equals 0.0. The kernels compare keys, not floats:
a float is canonicalised (-0.0 -> +0.0) and its bits reinterpreted as an integer, so hashing and
equality are exact and NaN is simply never inserted.
"""

from __future__ import annotations

import math
import warnings

import torch
import triton
import triton.language as tl

from ..dispatch.backend import Backend, Estimate, TorchBackend
from ..dispatch.device import device_info
from ..dispatch.op import Call, Op, register
from ..dispatch.signature import bucket
from ..errors import InvalidArgument, UnsupportedDType
from ..heuristics import isin as cost
from ._common import FLOAT_DTYPES, cdiv, flat, needs_int64, next_pow2

# Tables at most this large are copied on chip by every program of the probe kernel.
LOCAL_TABLE_BYTES = 16 * 1024
# Bitmaps above this many bits would not stay in L2; such value ranges go to the hash set instead.
BITMAP_MAX_BITS = 1 << 28  # 32 MiB

SUPPORTED_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                    *FLOAT_DTYPES)


# ---------------------------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------------------------
@triton.jit
def _to_key(v, IS_FLOAT: tl.constexpr, KEY_BITS: tl.constexpr):
    """An integer key equal for equal values: floats lose the sign of zero and are bit-cast."""
    if IS_FLOAT:
        v = tl.where(v == 0, tl.zeros_like(v), v)
        if v.dtype == tl.float16 or v.dtype == tl.bfloat16:
            v = v.to(tl.int16, bitcast=True)
        elif v.dtype == tl.float32:
            v = v.to(tl.int32, bitcast=True)
        else:
            v = v.to(tl.int64, bitcast=True)
    if KEY_BITS == 32:
        return v.to(tl.int32)
    return v.to(tl.int64)


@triton.jit
def _hash(key, LOG_T: tl.constexpr, KEY_BITS: tl.constexpr):
    """Multiplicative (Fibonacci) hashing: the top LOG_T bits of key * 2^32/phi (mod 2^32)."""
    if KEY_BITS == 64:
        lo = key.to(tl.int32)
        hi = (key >> 32).to(tl.int32)
        key = lo ^ (hi * -2048144789)  # 0x85EBCA6B: mixes the high word in before the multiply
    mixed = (key * -1640531535).to(tl.uint32, bitcast=True)  # 0x9E3779B1 as int32
    return (mixed >> (32 - LOG_T)).to(tl.int32)


@triton.jit
def _compare_kernel(x_ptr, t_ptr, out_ptr, M, N,
                    INVERT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    I64: tl.constexpr):
    pid = tl.program_id(0)
    if I64:
        pid = pid.to(tl.int64)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    x = tl.load(x_ptr + rows, mask=row_ok)
    # Accumulate the matches tile by tile and reduce once at the end: one reduction, not N/BLOCK_N.
    hit = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.int1)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        t = tl.load(t_ptr + cols, mask=cols < N)
        # == is IEEE equality: NaN matches nothing, -0.0 matches 0.0, as torch.isin.
        hit = hit | ((x[:, None] == t[None, :]) & (cols < N)[None, :])
    found = tl.max(hit.to(tl.int8), axis=1) > 0
    tl.store(out_ptr + rows, found != INVERT, mask=row_ok)


@triton.jit
def _search_kernel(x_ptr, sorted_ptr, out_ptr, M, N,
                   STEPS: tl.constexpr, INVERT: tl.constexpr, BLOCK: tl.constexpr,
                   I64: tl.constexpr):
    pid = tl.program_id(0)
    if I64:
        pid = pid.to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    ok = offs < M
    x = tl.load(x_ptr + offs, mask=ok)
    # Branchless lower bound: the window [base, base + n) halves each step for every lane alike,
    # so the loop has a fixed trip count (STEPS = ceil(log2 N)) and no divergence. The first steps
    # read the same few addresses from every lane, which stay in L1.
    base = tl.zeros([BLOCK], dtype=tl.int64 if I64 else tl.int32)
    n = N
    for _ in tl.static_range(STEPS):
        half = n // 2
        probe = tl.load(sorted_ptr + base + half)
        base = tl.where(probe < x, base + half, base)
        n = n - half
    first = tl.load(sorted_ptr + base)
    # lower_bound is base + (first < x); it is a hit if in range and equal (NaN never is).
    after = base + 1
    second = tl.load(sorted_ptr + after, mask=(first < x) & (after < N))
    found = (first == x) | ((first < x) & (after < N) & (second == x))
    tl.store(out_ptr + offs, found != INVERT, mask=ok)


@triton.jit
def _hash_build_kernel(t_ptr, table_ptr, flag_ptr, N,
                       IS_FLOAT: tl.constexpr, KEY_BITS: tl.constexpr, LOG_T: tl.constexpr,
                       BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < N
    v = tl.load(t_ptr + offs, mask=ok, other=0)
    key = _to_key(v, IS_FLOAT, KEY_BITS)
    empty = tl.full([BLOCK], -(1 << (KEY_BITS - 1)), key.dtype)
    # The empty-slot marker is the key type's minimum. Floats never produce it (it is -0.0's
    # bits, canonicalised away); an integer test set may contain it, which a flag records.
    tl.store(flag_ptr + tl.zeros([BLOCK], dtype=tl.int32), tl.full([BLOCK], 1, tl.int8),
             mask=ok & (key == empty))
    todo = ok & (key != empty) & (v == v)  # NaN is never a member
    slot = _hash(key, LOG_T, KEY_BITS)
    mask_t = (1 << LOG_T) - 1
    while tl.max(todo.to(tl.int32), axis=0) > 0:
        # atomic_cas has no mask: lanes already done swap their key for itself, which changes
        # nothing, so every lane can take part in every round.
        old = tl.atomic_cas(table_ptr + slot, tl.where(todo, empty, key), key, sem="relaxed")
        todo = todo & (old != empty) & (old != key)
        slot = tl.where(todo, (slot + 1) & mask_t, slot)


@triton.jit
def _hash_probe_kernel(x_ptr, table_ptr, flag_ptr, out_ptr, M,
                       IS_FLOAT: tl.constexpr, KEY_BITS: tl.constexpr, LOG_T: tl.constexpr,
                       LOCAL: tl.constexpr, INVERT: tl.constexpr, BLOCK: tl.constexpr,
                       BLOCKS_PER_PROGRAM: tl.constexpr, I64: tl.constexpr):
    pid = tl.program_id(0)
    if I64:
        pid = pid.to(tl.int64)
    mask_t = (1 << LOG_T) - 1
    has_empty_key = tl.load(flag_ptr) != 0
    if LOCAL:
        # Small tables are held by the program itself: lookups become on-chip gathers.
        table = tl.load(table_ptr + tl.arange(0, 1 << LOG_T))
    for i in range(BLOCKS_PER_PROGRAM):
        offs = (pid * BLOCKS_PER_PROGRAM + i) * BLOCK + tl.arange(0, BLOCK)
        ok = offs < M
        v = tl.load(x_ptr + offs, mask=ok, other=0)
        key = _to_key(v, IS_FLOAT, KEY_BITS)
        empty = tl.full([BLOCK], -(1 << (KEY_BITS - 1)), key.dtype)
        found = (key == empty) & has_empty_key
        todo = ok & (key != empty)
        slot = _hash(key, LOG_T, KEY_BITS)
        # Linear probing ends at the key (a hit) or an empty slot (a miss); the block stops when
        # its longest probe does.
        while tl.max(todo.to(tl.int32), axis=0) > 0:
            if LOCAL:
                seen = tl.gather(table, slot, 0)
            else:
                seen = tl.load(table_ptr + slot, mask=todo, other=-(1 << (KEY_BITS - 1)))
            hit = todo & (seen == key)
            found = found | hit
            todo = todo & ~hit & (seen != empty)
            slot = (slot + 1) & mask_t
        found = found & (v == v)
        tl.store(out_ptr + offs, found != INVERT, mask=ok)


@triton.jit
def _bitmap_build_kernel(t_ptr, bits_ptr, lo_ptr, N, RANGE_BITS,
                         BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < N
    v = tl.load(t_ptr + offs, mask=ok, other=0).to(tl.int64)
    rel = v - tl.load(lo_ptr)
    ok = ok & (rel >= 0) & (rel < RANGE_BITS)
    word = (rel >> 5).to(tl.int32)
    bit = (rel & 31).to(tl.int32)
    tl.atomic_or(bits_ptr + word, (1 << bit).to(tl.int32), mask=ok, sem="relaxed")


@triton.jit
def _bitmap_probe_kernel(x_ptr, bits_ptr, lo_ptr, out_ptr, M, RANGE_BITS,
                         INVERT: tl.constexpr, BLOCK: tl.constexpr, I64: tl.constexpr):
    pid = tl.program_id(0)
    if I64:
        pid = pid.to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    ok = offs < M
    v = tl.load(x_ptr + offs, mask=ok, other=0).to(tl.int64)
    rel = v - tl.load(lo_ptr)
    inside = ok & (rel >= 0) & (rel < RANGE_BITS)
    word = tl.load(bits_ptr + (rel >> 5).to(tl.int32), mask=inside, other=0)
    found = inside & (((word >> (rel & 31).to(tl.int32)) & 1) != 0)
    tl.store(out_ptr + offs, found != INVERT, mask=ok)


# ---------------------------------------------------------------------------------------------
# The call: torch.isin's argument rules
# ---------------------------------------------------------------------------------------------
class IsinCall(Call):
    __slots__ = ("elements", "test", "invert", "assume_unique", "m", "n", "out")

    def describe(self) -> str:
        e, t = self.elements, self.test
        return (f"elements {tuple(e.shape)} {str(e.dtype)[6:]}, test_elements {tuple(t.shape)}"
                f"{', invert' if self.invert else ''} on {e.device}")


def _as_tensor(value, name: str, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    if isinstance(value, bool):
        raise UnsupportedDType(f"isin: {name} is a bool; expected an integer or floating value "
                               "(torch.isin does not accept bool)")
    if not isinstance(value, (int, float)):
        raise InvalidArgument(f"isin: {name} must be a tensor or a Python number, "
                              f"got {type(value).__name__}")
    # torch casts a Python number to the promoted dtype with wrap-around (300 -> int8 44).
    return torch.tensor(value, device=device).to(dtype)


def prepare(elements, test_elements, *, assume_unique: bool = False, invert: bool = False,
            out: torch.Tensor | None = None) -> IsinCall:
    e_is_t = isinstance(elements, torch.Tensor)
    t_is_t = isinstance(test_elements, torch.Tensor)
    if e_is_t and t_is_t:
        dtype = elements.dtype
        if test_elements.dtype is not dtype:
            dtype = torch.result_type(elements, test_elements)
        if elements.device != test_elements.device:
            elements, test_elements = _same_device(elements, test_elements)
    elif e_is_t or t_is_t:
        ref = elements if e_is_t else test_elements
        other = test_elements if e_is_t else elements
        if isinstance(other, torch.Tensor):  # pragma: no cover - excluded above
            raise AssertionError
        if isinstance(other, bool) or not isinstance(other, (int, float)):
            _as_tensor(other, "test_elements" if e_is_t else "elements", ref.dtype, ref.device)
        dtype = torch.result_type(ref, other)
        if e_is_t:
            test_elements = _as_tensor(other, "test_elements", dtype, ref.device)
        else:
            elements = _as_tensor(other, "elements", dtype, ref.device)
    else:
        raise InvalidArgument("isin: at least one of elements and test_elements must be a tensor "
                              f"(got {type(elements).__name__} and {type(test_elements).__name__})")
    if dtype not in SUPPORTED_DTYPES:
        bad = "elements" if elements.dtype not in SUPPORTED_DTYPES else "test_elements"
        raise UnsupportedDType(
            f"isin: {bad} has dtype {elements.dtype if bad == 'elements' else test_elements.dtype} "
            f"(promoted: {dtype}); expected one of "
            f"{', '.join(str(d)[6:] for d in SUPPORTED_DTYPES)} as torch.isin does")
    if elements.dtype is not dtype:
        elements = elements.to(dtype)
    if test_elements.dtype is not dtype:
        test_elements = test_elements.to(dtype)
    if out is not None:
        _check_out(out, elements)
    call = IsinCall()
    call.elements, call.test, call.out = elements, test_elements, out
    call.invert, call.assume_unique = bool(invert), bool(assume_unique)
    call.m, call.n = elements.numel(), test_elements.numel()
    dev = elements.device
    call.info = device_info(dev)
    call.key = (dev.index if dev.type == "cuda" else dev.type, dtype, bucket(call.m),
                bucket(call.n), call.invert, call.assume_unique)
    return call


def _check_out(out, elements: torch.Tensor) -> None:
    if not isinstance(out, torch.Tensor):
        raise InvalidArgument(f"isin: out must be a tensor, got {type(out).__name__}")
    if out.dtype != torch.bool:
        raise InvalidArgument(f"isin: out must have dtype torch.bool, got {out.dtype}")
    if out.device != elements.device:
        raise InvalidArgument(f"isin: out is on {out.device} but elements is on {elements.device}")
    if out.shape != elements.shape:
        if out.numel() != 0:
            warnings.warn(f"isin: out has shape {tuple(out.shape)}, resizing it to "
                          f"{tuple(elements.shape)} (as torch does; pass an empty tensor to avoid "
                          "this warning)", UserWarning, stacklevel=4)
        out.resize_(elements.shape)


def _same_device(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # As in torch's binary ops, a 0-d CPU tensor may join a tensor on an accelerator.
    if b.dim() == 0 and b.device.type == "cpu":
        return a, b.to(a.device)
    if a.dim() == 0 and a.device.type == "cpu":
        return a.to(b.device), b
    raise InvalidArgument(f"isin: expected all tensors to be on the same device, but elements is "
                          f"on {a.device} and test_elements on {b.device}")


# ---------------------------------------------------------------------------------------------
# Backends
# ---------------------------------------------------------------------------------------------
def _torch_isin(call: IsinCall) -> torch.Tensor:
    if call.out is not None:
        return torch.isin(call.elements, call.test, assume_unique=call.assume_unique,
                          invert=call.invert, out=call.out)
    return torch.isin(call.elements, call.test, assume_unique=call.assume_unique,
                      invert=call.invert)


def _output(call: IsinCall) -> torch.Tensor:
    """Where the kernel writes: the caller's `out` when it is contiguous, else a new tensor."""
    if call.out is not None and call.out.is_contiguous():
        return call.out
    return torch.empty(call.elements.shape, dtype=torch.bool, device=call.elements.device)


def _finish(call: IsinCall, result: torch.Tensor) -> torch.Tensor:
    if call.out is not None and result is not call.out:
        call.out.copy_(result)
        return call.out
    return result


def _trivial(call: IsinCall) -> torch.Tensor | None:
    """Empty inputs: no kernel to launch."""
    if call.m == 0 or call.n == 0:
        return _finish(call, _output(call).fill_(call.invert))
    return None


def _key_bits(dtype: torch.dtype) -> int:
    return 64 if dtype.itemsize == 8 else 32


class CompareBackend(Backend):
    name = "compare"
    kernels = (_compare_kernel,)
    MAX_N = 1 << 16  # beyond this the O(M*N) work is never competitive; keep tuning short

    def supports(self, call: IsinCall) -> str | None:
        if call.n > self.MAX_N:
            return f"test_elements has {call.n} elements; compare is for at most {self.MAX_N}"
        return self.device_reason(call.info)

    def configs(self, call: IsinCall) -> list[dict]:
        bn = min(64, max(16, next_pow2(call.n)))
        return [{"BLOCK_M": 128, "BLOCK_N": bn, "num_warps": 4},
                {"BLOCK_M": 256, "BLOCK_N": bn, "num_warps": 8},
                {"BLOCK_M": 64, "BLOCK_N": min(128, 2 * bn), "num_warps": 4}]

    def run(self, call: IsinCall, config) -> torch.Tensor:
        done = _trivial(call)
        if done is not None:
            return done
        x, t = flat(call.elements), flat(call.test)
        out = _output(call)
        bm = config["BLOCK_M"]
        _compare_kernel[(cdiv(call.m, bm),)](
            x, t, out, call.m, call.n, INVERT=call.invert, BLOCK_M=bm, BLOCK_N=config["BLOCK_N"],
            I64=needs_int64(call.m), num_warps=config["num_warps"])
        return _finish(call, out)

    def cost(self, call: IsinCall, model) -> Estimate:
        return cost.compare(call, model)


class SearchBackend(Backend):
    name = "search"
    kernels = (_search_kernel,)

    def configs(self, call: IsinCall) -> list[dict]:
        return [{"BLOCK": 1024, "num_warps": 4}, {"BLOCK": 512, "num_warps": 4},
                {"BLOCK": 2048, "num_warps": 8}]

    def run(self, call: IsinCall, config) -> torch.Tensor:
        done = _trivial(call)
        if done is not None:
            return done
        x = flat(call.elements)
        table = torch.sort(flat(call.test)).values  # NaN sorts last: below it nothing is skipped
        out = _output(call)
        block = config["BLOCK"]
        _search_kernel[(cdiv(call.m, block),)](
            x, table, out, call.m, call.n, STEPS=max(0, (call.n - 1).bit_length()),
            INVERT=call.invert, BLOCK=block, I64=needs_int64(call.m, call.n),
            num_warps=config["num_warps"])
        return _finish(call, out)

    def cost(self, call: IsinCall, model) -> Estimate:
        return cost.search(call, model)


def _hash_table_log(n: int) -> int:
    """log2 of the table size: at least twice the test set (load factor <= 1/2), at least 2**4."""
    return max(4, (2 * n - 1).bit_length())


class HashBackend(Backend):
    name = "hash"
    kernels = (_hash_build_kernel, _hash_probe_kernel, _to_key, _hash)

    def supports(self, call: IsinCall) -> str | None:
        return self.device_reason(call.info)

    def configs(self, call: IsinCall) -> list[dict]:
        log_t = _hash_table_log(call.n)
        local = (1 << log_t) * _key_bits(call.elements.dtype) // 8 <= LOCAL_TABLE_BYTES
        if local:
            # The table is loaded once per program, so each program takes several blocks.
            return [{"BLOCK": 1024, "PER_PROGRAM": 8, "LOCAL": True, "num_warps": 8},
                    {"BLOCK": 2048, "PER_PROGRAM": 4, "LOCAL": True, "num_warps": 8},
                    {"BLOCK": 1024, "PER_PROGRAM": 1, "LOCAL": False, "num_warps": 4}]
        return [{"BLOCK": 1024, "PER_PROGRAM": 1, "LOCAL": False, "num_warps": 4},
                {"BLOCK": 512, "PER_PROGRAM": 1, "LOCAL": False, "num_warps": 4},
                {"BLOCK": 2048, "PER_PROGRAM": 1, "LOCAL": False, "num_warps": 8}]

    def run(self, call: IsinCall, config) -> torch.Tensor:
        done = _trivial(call)
        if done is not None:
            return done
        x, t = flat(call.elements), flat(call.test)
        dtype = x.dtype
        key_bits = _key_bits(dtype)
        is_float = dtype.is_floating_point
        log_t = _hash_table_log(call.n)
        local = bool(config.get("LOCAL")) and (1 << log_t) * key_bits // 8 <= LOCAL_TABLE_BYTES
        key_dtype = torch.int64 if key_bits == 64 else torch.int32
        table = torch.full((1 << log_t,), torch.iinfo(key_dtype).min, dtype=key_dtype,
                           device=x.device)
        flag = torch.zeros(1, dtype=torch.int8, device=x.device)
        build_block = 1024
        _hash_build_kernel[(cdiv(call.n, build_block),)](
            t, table, flag, call.n, IS_FLOAT=is_float, KEY_BITS=key_bits, LOG_T=log_t,
            BLOCK=build_block, num_warps=4)
        out = _output(call)
        block = config["BLOCK"]
        per = config["PER_PROGRAM"] if local else 1
        _hash_probe_kernel[(cdiv(call.m, block * per),)](
            x, table, flag, out, call.m, IS_FLOAT=is_float, KEY_BITS=key_bits, LOG_T=log_t,
            LOCAL=local, INVERT=call.invert, BLOCK=block, BLOCKS_PER_PROGRAM=per,
            I64=needs_int64(call.m), num_warps=config["num_warps"])
        return _finish(call, out)

    def cost(self, call: IsinCall, model) -> Estimate:
        return cost.hash_(call, model, local_table_bytes=LOCAL_TABLE_BYTES)


class BitmapBackend(Backend):
    name = "bitmap"
    kernels = (_bitmap_build_kernel, _bitmap_probe_kernel)

    def supports(self, call: IsinCall) -> str | None:
        if call.elements.dtype.is_floating_point:
            return "bitmap takes integer dtypes only (a float range has no bit per value)"
        return self.device_reason(call.info)

    def configs(self, call: IsinCall) -> list[dict]:
        return [{"BLOCK": 1024, "num_warps": 4}, {"BLOCK": 2048, "num_warps": 8}]

    @staticmethod
    def needs_sync(dtype: torch.dtype) -> bool:
        return dtype.itemsize > 2

    def run(self, call: IsinCall, config) -> torch.Tensor:
        done = _trivial(call)
        if done is not None:
            return done
        x, t = flat(call.elements), flat(call.test)
        dtype = x.dtype
        if self.needs_sync(dtype):
            # The bitmap's size depends on the data: the one host sync of this backend.
            lo_hi = torch.aminmax(t)
            lo_t = lo_hi.min.reshape(1).to(torch.int64)
            lo, hi = (int(v) for v in torch.stack([lo_hi.min, lo_hi.max]).tolist())
            range_bits = hi - lo + 1
            if range_bits > BITMAP_MAX_BITS:
                return _HASH.run(call, _HASH.configs(call)[0])
        else:
            info = torch.iinfo(dtype)
            range_bits = info.max - info.min + 1
            lo_t = torch.full((1,), info.min, dtype=torch.int64, device=x.device)
        bits = torch.zeros(cdiv(range_bits, 32), dtype=torch.int32, device=x.device)
        build_block = 1024
        _bitmap_build_kernel[(cdiv(call.n, build_block),)](
            t, bits, lo_t, call.n, range_bits, BLOCK=build_block, num_warps=4)
        out = _output(call)
        block = config["BLOCK"]
        _bitmap_probe_kernel[(cdiv(call.m, block),)](
            x, bits, lo_t, out, call.m, range_bits, INVERT=call.invert, BLOCK=block,
            I64=needs_int64(call.m), num_warps=config["num_warps"])
        return _finish(call, out)

    def cost(self, call: IsinCall, model) -> Estimate:
        return cost.bitmap(call, model, needs_sync=self.needs_sync(call.elements.dtype),
                           max_bits=BITMAP_MAX_BITS)


def sample(shapes, dtype: torch.dtype, options: dict, device: torch.device):
    """Inputs for warming and benchmarks. options: values = "wide" (the test set drawn from the
    dtype's whole range) or "narrow" (from [0, 2 * N)); half the elements are drawn from the test
    set, so about half are members; invert, assume_unique as for isin."""
    if len(shapes) != 2:
        raise InvalidArgument(f"isin sample: expected two shapes (elements, test_elements), got {shapes}")
    values = options.pop("values", "wide")
    if values not in ("wide", "narrow"):
        raise InvalidArgument(f"isin sample: values must be 'wide' or 'narrow', got {values!r}")
    m, n = math.prod(shapes[0]), math.prod(shapes[1])
    test = _random_values(n, dtype, device, narrow=values == "narrow")
    elements = _random_values(m, dtype, device, narrow=values == "narrow", hi_hint=2 * n)
    if n and m:
        hits = torch.rand(m, device=device) < 0.5
        picks = test[torch.randint(0, n, (m,), device=device)]
        elements = torch.where(hits, picks, elements)
    return (elements.reshape(shapes[0]), test.reshape(shapes[1])), options


def _random_values(n: int, dtype: torch.dtype, device, *, narrow: bool, hi_hint: int = 0):
    if dtype.is_floating_point:
        if narrow:
            return torch.randint(0, max(16, hi_hint or 2 * n), (n,), device=device).to(dtype)
        return (torch.randn(n, device=device) * 1e3).to(dtype)
    info = torch.iinfo(dtype)
    if narrow:
        hi = min(info.max, max(16, hi_hint or 2 * n))
        return torch.randint(0, hi, (n,), device=device, dtype=torch.int64).to(dtype)
    return torch.randint(info.min, info.max, (n,), device=device, dtype=dtype)


_HASH = HashBackend()

OP = register(Op("isin", prepare, [
    TorchBackend(_torch_isin, cost.torch_),
    CompareBackend(),
    SearchBackend(),
    _HASH,
    BitmapBackend(),
], sample=sample))
