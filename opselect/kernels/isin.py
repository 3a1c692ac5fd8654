"""isin: is each element of `elements` among `test_elements`?

Five algorithms, with M = elements.numel() and N = test_elements.numel():

  torch    torch.isin (N passes over the elements when N is small, several sorts otherwise)
  compare  every element against every test element, one fused kernel: O(M * N), wins for tiny N
  search   sort the test elements, then a branchless lower-bound search per element:
           log2(N) dependent loads each
  hash     an open-addressing hash set of the test elements built with atomic compare-and-swap,
           then one probe (about 1.5 loads) per element; a table of up to LOCAL_TABLE_BYTES is held
           on chip by every program (gathers from shared memory), larger ones are read through L2
  bitmap   integers: one bit per value from the test set's minimum up, set with atomic or; one bit
           test per element. 8/16-bit integers use their whole range; wider ones measure min and
           max on the device and, when the range exceeds the bitmap's capacity (32 bits per test
           element, at most BITMAP_MAX_BITS), the same kernels use the hash set instead. The choice
           is made on the device: no host sync.

Semantics are torch's: NaN is never a member, -0.0 equals 0.0, a subnormal is itself. The kernels
compare integer keys made from a value's bits, never floats (_value_key): float compares may flush
subnormals to zero (a GPU's flush-to-zero modes; Triton's interpreter converts bfloat16 subnormals
to 0.0), which made 0.0 a member of a test set holding only a subnormal. The key keeps the values'
order, so a test set sorted as floats is sorted as keys too.
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
from ..errors import InvalidArgument, TorchOnlyCall, UnsupportedDType
from ..heuristics import isin as cost
from ._common import FLOAT_DTYPES, Launcher, cdiv, flat, needs_int64, next_pow2

# Tables at most this large are copied on chip by every program of the probe kernel.
LOCAL_TABLE_BYTES = 32 * 1024
# Slots per bucket of a table read through L2: a lookup reads its bucket in one access (16 bytes
# of int32 keys, one memory sector). On-chip tables use single slots (a wider gather costs more).
WIDE_BUCKET = tl.constexpr(4)
# The bitmap never exceeds this many bits (it must stay in L2); wider value ranges use the hash set.
BITMAP_MAX_BITS = 1 << 28  # 32 MiB

SUPPORTED_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                    *FLOAT_DTYPES)


# ---------------------------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------------------------
@triton.jit
def _value_key(v):
    """(key, nan): an integer of v's own width, equal for equal values and ordered as the values
    are, made from the bits alone (no float operation, so no flush to zero). Floats: the
    magnitude bits, negated for negative values (so -0.0 and +0.0 are both 0), and the largest
    key for every NaN (torch.sort puts NaN last, whatever its sign); nan says which lanes are NaN,
    which are never members. Integers are their own keys."""
    if v.dtype == tl.float64:
        bits = v.to(tl.int64, bitcast=True)
        mag = bits & 0x7FFFFFFFFFFFFFFF
        nan = mag > 0x7FF0000000000000
        key = tl.where(nan, 0x7FFFFFFFFFFFFFFF, tl.where(bits < 0, -mag, mag))
    elif v.dtype == tl.float32:
        bits = v.to(tl.int32, bitcast=True)
        mag = bits & 0x7FFFFFFF
        nan = mag > 0x7F800000
        key = tl.where(nan, 0x7FFFFFFF, tl.where(bits < 0, -mag, mag))
    elif v.dtype == tl.float16:
        bits = v.to(tl.int16, bitcast=True)
        mag = bits & 0x7FFF
        nan = mag > 0x7C00
        key = tl.where(nan, 0x7FFF, tl.where(bits < 0, -mag, mag)).to(tl.int16)
    elif v.dtype == tl.bfloat16:
        bits = v.to(tl.int16, bitcast=True)
        mag = bits & 0x7FFF
        nan = mag > 0x7F80
        key = tl.where(nan, 0x7FFF, tl.where(bits < 0, -mag, mag)).to(tl.int16)
    else:
        key = v
        nan = v != v  # False: integers have no NaN
    return key, nan


@triton.jit
def _to_key(v, KEY_BITS: tl.constexpr):
    """(key, nan) with the key widened to KEY_BITS (the hash set's slots)."""
    key, nan = _value_key(v)
    # One return statement: the compiler rejects returns of different types in constexpr
    # branches (the interpreter does not).
    if KEY_BITS == 32:
        wide = key.to(tl.int32)
    else:
        wide = key.to(tl.int64)
    return wide, nan


@triton.jit
def _mul32(h, c):
    """h * c mod 2**32 for uint32 h (signed multiply: the same bits, no 64-bit widening)."""
    return (h.to(tl.int32, bitcast=True) * c).to(tl.uint32, bitcast=True)


@triton.jit
def _hash(key, log_t, KEY_BITS: tl.constexpr, MIX: tl.constexpr):
    """A slot in [0, 2**log_t), after folding a 64-bit key's high word into the low one.

    Integers: Fibonacci hashing (the top bits of key * 2**32 / phi), which spreads consecutive
    keys (ids, narrow ranges) exactly evenly. Floats (MIX): murmur3's finaliser. The bits of
    floats of small integers differ only in a few high bits, and Fibonacci hashing clusters them
    (mean linear-probing displacement 0.61 slots for 1e6 floats of integers below 2e6 at load
    1/4, against 0.12 with the finaliser; measured on the CPU)."""
    if KEY_BITS == 64:
        h = key.to(tl.int32) ^ ((key >> 32).to(tl.int32) * -2048144789)  # fold in the high word
    else:
        h = key
    h = h.to(tl.uint32, bitcast=True)
    h = h ^ (h >> 16)
    if MIX:
        h = _mul32(h, -2048144789)  # 0x85EBCA6B
        h = h ^ (h >> 13)
        h = _mul32(h, -1028477387)  # 0xC2B2AE35
        h = h ^ (h >> 16)
    else:
        h = _mul32(h, -1640531535)  # 0x9E3779B1
    return (h >> (32 - log_t)).to(tl.int32)


@triton.jit
def _compare_kernel(x_ptr, t_ptr, out_ptr, M, N, INVERT: tl.constexpr, BLOCK: tl.constexpr,
                    TILE_N: tl.constexpr, UNROLL: tl.constexpr, I64: tl.constexpr):
    pid = tl.program_id(0)
    if I64:
        pid = pid.to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    ok = offs < M
    x, x_nan = _value_key(tl.load(x_ptr + offs, mask=ok))
    # Keys are equal exactly when the values are (-0.0 matches 0.0); NaN lanes are dropped last.
    if TILE_N == 1 and UNROLL > 0:
        # A tiny test set (N <= UNROLL): the loop is unrolled, so its scalar loads are independent
        # straight-line code the compiler issues together, and a program waits for memory once
        # instead of once per test element. Indices past N re-read the last test element, which
        # changes no answer and needs no mask.
        found = tl.zeros([BLOCK], dtype=tl.int1)
        last = N - 1
        for j in tl.static_range(UNROLL):
            found = found | (x == _value_key(tl.load(t_ptr + tl.minimum(last, j)))[0])
    elif TILE_N == 1:
        # Many elements: each test element is one scalar load, the same address for every lane
        # (a broadcast from L1), then one compare and one or per element.
        found = tl.zeros([BLOCK], dtype=tl.int1)
        for j in range(0, N):
            found = found | (x == _value_key(tl.load(t_ptr + j))[0])
    else:
        # Few elements (few programs): a [BLOCK, TILE_N] tile of comparisons per step, so each
        # program walks the test set TILE_N elements at a time instead of one.
        hit = tl.zeros([BLOCK, TILE_N], dtype=tl.int1)
        for start in range(0, N, TILE_N):
            cols = start + tl.arange(0, TILE_N)
            t = _value_key(tl.load(t_ptr + cols, mask=cols < N))[0]
            hit = hit | ((x[:, None] == t[None, :]) & (cols < N)[None, :])
        found = tl.max(hit.to(tl.int8), axis=1) > 0
    found = found & ~x_nan
    tl.store(out_ptr + offs, found != INVERT, mask=ok)


# N is never specialised: with N == 1 folded in, triton 3.6's coalescing pass crashes on this kernel
# (an assertion in TritonGPUCoalesce; tools/compile_check.py --edges finds it).
@triton.jit(do_not_specialize=["N"])
def _search_kernel(x_ptr, sorted_ptr, out_ptr, M, N,
                   INVERT: tl.constexpr, BLOCK: tl.constexpr, I64: tl.constexpr):
    pid = tl.program_id(0)
    if I64:
        pid = pid.to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    ok = offs < M
    x, x_nan = _value_key(tl.load(x_ptr + offs, mask=ok))
    # Branchless lower bound: the window [base, base + n) halves each step for every lane alike,
    # so the loop has the same trip count (ceil(log2 N)) everywhere and no divergence; N is not a
    # compile-time constant, so one compiled kernel serves every size. The first steps read the
    # same few addresses from every lane, which stay in L1.
    base = tl.zeros([BLOCK], dtype=tl.int64 if I64 else tl.int32)
    n = N
    while n > 1:
        half = n // 2
        probe = _value_key(tl.load(sorted_ptr + base + half))[0]
        base = tl.where(probe < x, base + half, base)
        n = n - half
    first = _value_key(tl.load(sorted_ptr + base))[0]
    # lower_bound is base + (first < x); it is a hit if in range and equal (NaN never is).
    after = base + 1
    second = _value_key(tl.load(sorted_ptr + after, mask=(first < x) & (after < N)))[0]
    found = ((first == x) | ((first < x) & (after < N) & (second == x))) & ~x_nan
    tl.store(out_ptr + offs, found != INVERT, mask=ok)


@triton.jit
def _hash_insert(table_ptr, flag_ptr, v, ok, log_t,
                 KEY_BITS: tl.constexpr, BUCKET: tl.constexpr, MIX: tl.constexpr):
    """Insert the values v (where ok) into the linear-probing table of 2**log_t keys; probing
    starts at the first slot of the key's bucket of BUCKET slots.

    Slots only grow, by atomic max: a key takes an empty slot (the key type's minimum) or pushes
    out a smaller key, which then continues along its own probe sequence. No slot between a key's
    home and its place is ever empty again, so lookups stay correct, and unlike compare-and-swap
    (which has no mask in Triton) only the lanes still inserting touch memory."""
    key, nan = _to_key(v, KEY_BITS)
    empty = -(1 << (KEY_BITS - 1))
    # The empty marker is the key type's minimum. Float keys never reach it (the most negative is
    # -inf's, -(max magnitude)); an integer test set may contain it, which flag_ptr records (any
    # value but the marker).
    tl.store(flag_ptr + tl.zeros(key.shape, dtype=tl.int32), tl.zeros(key.shape, key.dtype),
             mask=ok & (key == empty))
    todo = ok & (key != empty) & ~nan  # NaN is never a member
    slot = (_hash(key, log_t, KEY_BITS, MIX) // BUCKET) * BUCKET
    while tl.max(todo.to(tl.int32), axis=0) > 0:
        old = tl.atomic_max(table_ptr + slot, key, mask=todo, sem="relaxed")
        # old == empty: placed. old == key: already there. old > key: that slot belongs to a
        # larger key, try the next. empty < old < key: placed, and `old` was pushed out.
        pushed = todo & (old != empty) & (old < key)
        key = tl.where(pushed, old, key)
        todo = todo & (old != empty) & (old != key) | pushed
        slot = tl.where(todo, (slot + 1) & ((1 << log_t) - 1), slot)


@triton.jit
def _hash_lookup(table_ptr, table, flag_ptr, v, ok, log_t,
                 KEY_BITS: tl.constexpr, LOCAL: tl.constexpr, MIX: tl.constexpr):
    """Membership of the values v in the table. LOCAL: `table` is the program's on-chip copy and
    keys start at their own slot; otherwise at their bucket of WIDE_BUCKET slots."""
    key, nan = _to_key(v, KEY_BITS)
    empty = -(1 << (KEY_BITS - 1))
    # (the flag is loaded as a vector: mixing a scalar bool into vector masks trips the interpreter)
    found = (key == empty) & (tl.load(flag_ptr + tl.zeros(key.shape, tl.int32)) != empty)
    todo = ok & (key != empty)
    if LOCAL:
        # The first probe, which settles most lanes, is a gather from the on-chip copy (Triton
        # stages the table in shared memory for it).
        slot = _hash(key, log_t, KEY_BITS, MIX)
        seen = tl.gather(table, slot, 0)
        found = found | (todo & (seen == key))
        todo = todo & (seen != key) & (seen != empty)
        slot = slot + 1
    else:
        # The key's whole bucket in one 16- or 32-byte load: at load factor <= 1/4 a bucket
        # almost always holds the key or an empty slot.
        home = tl.multiple_of((_hash(key, log_t, KEY_BITS, MIX) // WIDE_BUCKET) * WIDE_BUCKET,
                              WIDE_BUCKET)
        window = tl.load(table_ptr + home[:, None] + tl.arange(0, WIDE_BUCKET)[None, :],
                         mask=todo[:, None], other=empty)
        found = found | (todo & (tl.max((window == key[:, None]).to(tl.int32), axis=1) > 0))
        todo = todo & ~found & (tl.max((window == empty).to(tl.int32), axis=1) == 0)
        slot = home + WIDE_BUCKET
    # Linear probing goes on until the key (a hit) or an empty slot (a miss), for the few lanes
    # left, with masked loads (the table is hot in L1 / L2); a block waits for its longest probe.
    while tl.max(todo.to(tl.int32), axis=0) > 0:
        slot = slot & ((1 << log_t) - 1)
        seen = tl.load(table_ptr + slot, mask=todo, other=empty)
        found = found | (todo & (seen == key))
        todo = todo & (seen != key) & (seen != empty)
        slot = slot + 1
    return found & ~nan


@triton.jit
def _hash_build_kernel(t_ptr, table_ptr, flag_ptr, N, log_t,
                       KEY_BITS: tl.constexpr, BUCKET: tl.constexpr,
                       MIX: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < N
    v = tl.load(t_ptr + offs, mask=ok, other=0)
    _hash_insert(table_ptr, flag_ptr, v, ok, log_t, KEY_BITS, BUCKET, MIX)


@triton.jit
def _hash_probe_blocks(x_ptr, table_ptr, flag_ptr, out_ptr, M, log_t, pid,
                       KEY_BITS: tl.constexpr, LOCAL_SLOTS: tl.constexpr,
                       INVERT: tl.constexpr, BLOCK: tl.constexpr,
                       BLOCKS_PER_PROGRAM: tl.constexpr, MIX: tl.constexpr):
    """One program's blocks of elements looked up in the hash set. LOCAL_SLOTS > 0: the table
    has that many slots (2**log_t) and is copied on chip, once for all the program's blocks."""
    table = 0
    if LOCAL_SLOTS > 0:
        table = tl.load(table_ptr + tl.arange(0, LOCAL_SLOTS))
    for i in range(BLOCKS_PER_PROGRAM):
        offs = (pid * BLOCKS_PER_PROGRAM + i) * BLOCK + tl.arange(0, BLOCK)
        ok = offs < M
        v = tl.load(x_ptr + offs, mask=ok, other=0)
        found = _hash_lookup(table_ptr, table, flag_ptr, v, ok, log_t, KEY_BITS,
                             LOCAL_SLOTS > 0, MIX)
        tl.store(out_ptr + offs, found != INVERT, mask=ok)


@triton.jit
def _hash_probe_kernel(x_ptr, table_ptr, flag_ptr, out_ptr, M, log_t,
                       KEY_BITS: tl.constexpr, LOCAL_SLOTS: tl.constexpr,
                       INVERT: tl.constexpr, BLOCK: tl.constexpr,
                       BLOCKS_PER_PROGRAM: tl.constexpr, MIX: tl.constexpr, I64: tl.constexpr):
    pid = tl.program_id(0)
    if I64:
        pid = pid.to(tl.int64)
    _hash_probe_blocks(x_ptr, table_ptr, flag_ptr, out_ptr, M, log_t, pid, KEY_BITS,
                       LOCAL_SLOTS, INVERT, BLOCK, BLOCKS_PER_PROGRAM, MIX)


# The bitmap backend decides on the device, without a host sync, between a bitmap (when the test
# set's value range fits its capacity) and the hash set (when it does not). params[0] holds the
# range's low end, params[1] 1 for the bitmap and 0 for the hash set.
@triton.jit
def _minmax_partials_kernel(t_ptr, part_ptr, N, BLOCK: tl.constexpr, PER_PROGRAM: tl.constexpr):
    pid = tl.program_id(0)
    lo = tl.full([BLOCK], 0x7FFFFFFFFFFFFFFF, tl.int64)
    hi = tl.full([BLOCK], -0x7FFFFFFFFFFFFFFF - 1, tl.int64)
    for i in range(PER_PROGRAM):
        offs = (pid * PER_PROGRAM + i) * BLOCK + tl.arange(0, BLOCK)
        ok = offs < N
        v = tl.load(t_ptr + offs, mask=ok, other=0).to(tl.int64)
        lo = tl.where(ok, tl.minimum(lo, v), lo)
        hi = tl.where(ok, tl.maximum(hi, v), hi)
    tl.store(part_ptr + 2 * pid, tl.min(lo, axis=0))
    tl.store(part_ptr + 2 * pid + 1, tl.max(hi, axis=0))


@triton.jit
def _bitmap_setup_kernel(part_ptr, P, params_ptr, bits_ptr, table_ptr, cap_bits, T,
                         FULL_RANGE_LO, FULL_RANGE: tl.constexpr, KEY_BITS: tl.constexpr,
                         P_BLOCK: tl.constexpr, BLOCK: tl.constexpr):
    """Every program reduces the partial min/max itself (P is small), so no extra launch is
    needed; then it clears its share of the bitmap, or fills its share of the hash table."""
    pid = tl.program_id(0)
    if FULL_RANGE:
        # 8- and 16-bit integers: the bitmap spans the whole dtype, nothing to measure.
        lo = tl.full([], FULL_RANGE_LO, tl.int64)
        fits = tl.full([], 1, tl.int1)
    else:
        idx = tl.arange(0, P_BLOCK)
        lo = tl.min(tl.load(part_ptr + 2 * idx, mask=idx < P, other=0x7FFFFFFFFFFFFFFF), axis=0)
        hi = tl.max(tl.load(part_ptr + 2 * idx + 1, mask=idx < P, other=-0x7FFFFFFFFFFFFFFF - 1),
                    axis=0)
        span = hi - lo  # wraps negative only when the range exceeds 2**63: then it does not fit
        fits = (span >= 0) & (span < cap_bits)
    if pid == 0:
        tl.store(params_ptr, lo)
        tl.store(params_ptr + 1, fits.to(tl.int64))
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    if fits:
        tl.store(bits_ptr + offs, tl.zeros([BLOCK], tl.int32), mask=offs < cap_bits // 32)
    else:
        tl.store(table_ptr + offs, tl.full([BLOCK], -(1 << (KEY_BITS - 1)), table_ptr.dtype.element_ty),
                 mask=offs < T)


@triton.jit
def _bitmap_build_kernel(t_ptr, params_ptr, bits_ptr, table_ptr, flag_ptr, N, cap_bits, log_t,
                         KEY_BITS: tl.constexpr, BUCKET: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < N
    v = tl.load(t_ptr + offs, mask=ok, other=0)
    if tl.load(params_ptr + 1) != 0:
        rel = v.to(tl.int64) - tl.load(params_ptr)
        ok = ok & (rel >= 0) & (rel < cap_bits)
        word = (rel >> 5).to(tl.int32)
        bit = (rel & 31).to(tl.int32)
        tl.atomic_or(bits_ptr + word, (1 << bit).to(tl.int32), mask=ok, sem="relaxed")
    else:
        _hash_insert(table_ptr, flag_ptr, v, ok, log_t, KEY_BITS, BUCKET, False)


@triton.jit
def _bitmap_probe_kernel(x_ptr, params_ptr, bits_ptr, table_ptr, flag_ptr, out_ptr, M, cap_bits,
                         log_t, KEY_BITS: tl.constexpr, LOCAL_WORDS: tl.constexpr,
                         LOCAL_SLOTS: tl.constexpr, INVERT: tl.constexpr, BLOCK: tl.constexpr,
                         BLOCKS_PER_PROGRAM: tl.constexpr, I64: tl.constexpr):
    """LOCAL_WORDS > 0: the bitmap (that many words) is copied on chip; LOCAL_SLOTS > 0: the
    hash table (that many slots) is, should the data need it."""
    pid = tl.program_id(0)
    if I64:
        pid = pid.to(tl.int64)
    lo = tl.load(params_ptr)
    if tl.load(params_ptr + 1) != 0:
        words = 0
        if LOCAL_WORDS > 0:
            words = tl.load(bits_ptr + tl.arange(0, LOCAL_WORDS))
        for i in range(BLOCKS_PER_PROGRAM):
            offs = (pid * BLOCKS_PER_PROGRAM + i) * BLOCK + tl.arange(0, BLOCK)
            ok = offs < M
            rel = tl.load(x_ptr + offs, mask=ok, other=0).to(tl.int64) - lo
            inside = ok & (rel >= 0) & (rel < cap_bits)
            w_idx = tl.where(inside, rel >> 5, 0).to(tl.int32)
            if LOCAL_WORDS > 0:
                word = tl.gather(words, w_idx, 0)
            else:
                word = tl.load(bits_ptr + w_idx, mask=inside, other=0)
            found = inside & (((word >> (rel & 31).to(tl.int32)) & 1) != 0)
            tl.store(out_ptr + offs, found != INVERT, mask=ok)
    else:
        _hash_probe_blocks(x_ptr, table_ptr, flag_ptr, out_ptr, M, log_t, pid, KEY_BITS,
                           LOCAL_SLOTS, INVERT, BLOCK, BLOCKS_PER_PROGRAM, False)


# ---------------------------------------------------------------------------------------------
# The call: torch.isin's argument rules
# ---------------------------------------------------------------------------------------------
class IsinCall(Call):
    __slots__ = ("elements", "test", "invert", "assume_unique", "m", "n", "out")

    @property
    def empty(self) -> bool:
        return self.m == 0  # (no test elements is not empty: every answer is False, or True)

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
    # torch casts a Python number to the promoted dtype with wrap-around (300 -> int8 44). A
    # float is a double: made in float64 first (torch.tensor's default, float32, flushed the
    # float64 subnormal 5.6e-309 to 0.0, which then matched -0.0; found by tests/test_fuzz.py).
    wide = torch.float64 if isinstance(value, float) else torch.int64
    return torch.tensor(value, dtype=wide, device=device).to(dtype)


def prepare(elements, test_elements, *, assume_unique: bool = False, invert: bool = False,
            out: torch.Tensor | None = None) -> IsinCall:
    # The common case (two tensors of one supported dtype on one device) takes a handful of
    # attribute reads; everything else goes through _normalise.
    if (type(elements) is not torch.Tensor or type(test_elements) is not torch.Tensor
            or test_elements.dtype is not elements.dtype or elements.dtype not in _SUPPORTED
            or test_elements.device != elements.device):
        elements, test_elements = _normalise(elements, test_elements)
    dev = elements.device
    if out is not None:
        _check_out(out, elements)
    call = IsinCall()
    call.elements, call.test, call.out = elements, test_elements, out
    invert, assume_unique = bool(invert), bool(assume_unique)
    m, n = elements.numel(), test_elements.numel()
    call.invert, call.assume_unique, call.m, call.n = invert, assume_unique, m, n
    call.info = device_info(dev)
    call.key = (dev, elements.dtype, bucket(m), bucket(n), invert, assume_unique)
    return call


_SUPPORTED = frozenset(SUPPORTED_DTYPES)


def _normalise(elements, test_elements) -> tuple[torch.Tensor, torch.Tensor]:
    """torch.isin's rules: Python numbers, dtype promotion, devices, accepted dtypes."""
    e_is_t = isinstance(elements, torch.Tensor)
    t_is_t = isinstance(test_elements, torch.Tensor)
    for value, name, is_t in ((elements, "elements", e_is_t),
                              (test_elements, "test_elements", t_is_t)):
        # torch.isin refuses bool and complex in either argument, whatever the promotion gives
        # (RuntimeError "Unsupported input type"), Python scalars included.
        if is_t:
            bad = value.dtype == torch.bool or value.dtype.is_complex
            what = f"a {str(value.dtype)[6:]} tensor"
        else:
            bad = isinstance(value, (bool, complex))
            what = f"a {type(value).__name__}"
        if bad:
            raise UnsupportedDType(f"isin: {name} is {what}; torch.isin takes integers and "
                                   "floats, not bool or complex")
    if (e_is_t and elements.is_quantized) or (t_is_t and test_elements.is_quantized):
        raise TorchOnlyCall("isin: a quantized argument; opselect's kernels take plain tensors")
    if e_is_t and t_is_t:
        dtype = elements.dtype
        if test_elements.dtype is not dtype:
            if elements.device.type == "cuda":
                # torch's CUDA isin flattens both tensors before comparing: a 0-d tensor
                # promotes as a dimensioned one (float16 elements against a 0-d float32 test
                # value compare in float32). Its CPU kernels take result_type, where a 0-d
                # tensor defers to a dimensioned one of its category (they compare in float16).
                # Measured with torch 2.11 (scratch probe, H200) and 2.13 (CPU).
                dtype = torch.promote_types(elements.dtype, test_elements.dtype)
            else:
                dtype = torch.result_type(elements, test_elements)
        if elements.device != test_elements.device:
            elements, test_elements = _same_device(elements, test_elements)
    elif e_is_t or t_is_t:
        ref = elements if e_is_t else test_elements
        other = test_elements if e_is_t else elements
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
    if dtype not in _SUPPORTED:
        # uint16-64, float8, ...: torch answers (on devices with a kernel) or raises its own
        # NotImplementedError.
        raise TorchOnlyCall(f"isin: the promoted dtype is {dtype}; opselect's kernels take "
                            f"{', '.join(str(d)[6:] for d in SUPPORTED_DTYPES)}")
    if elements.dtype is not dtype:
        elements = elements.to(dtype)
    if test_elements.dtype is not dtype:
        test_elements = test_elements.to(dtype)
    return elements, test_elements


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
    # torch.isin takes no exception for 0-d CPU tensors (unlike its elementwise ops).
    raise InvalidArgument(f"isin: expected all tensors to be on the same device, but elements is "
                          f"on {a.device} and test_elements on {b.device}")


# ---------------------------------------------------------------------------------------------
# Backends
# ---------------------------------------------------------------------------------------------
def _torch_isin(call: IsinCall) -> torch.Tensor:
    # torch.isin .view()s a multi-dimensional test set and fails on non-contiguous ones (torch
    # 2.11-2.13); its shape does not matter, so hand it over flat.
    test = call.test if call.test.dim() <= 1 else flat(call.test)
    if call.out is not None:
        return torch.isin(call.elements, test, assume_unique=call.assume_unique,
                          invert=call.invert, out=call.out)
    return torch.isin(call.elements, test, assume_unique=call.assume_unique, invert=call.invert)


# Bound launches (kernels/_common.py): Triton binds a kernel's arguments once per spec, later calls
# go straight to the compiled kernel. A spec is every integer argument, constexpr and the warps,
# plus the dtype of the inputs (the other tensors' dtypes follow from it and the spec).
_COMPARE = Launcher(_compare_kernel)
_SEARCH = Launcher(_search_kernel)
_HASH_BUILD = Launcher(_hash_build_kernel)
_HASH_PROBE = Launcher(_hash_probe_kernel)
_MINMAX = Launcher(_minmax_partials_kernel)
_BITMAP_SETUP = Launcher(_bitmap_setup_kernel)
_BITMAP_BUILD = Launcher(_bitmap_build_kernel)
_BITMAP_PROBE = Launcher(_bitmap_probe_kernel)


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
    kernels = (_compare_kernel, _value_key)
    MAX_N = 4096  # beyond this the O(M * N) work is never competitive; keep tuning short
    # Test sets up to this size are walked by an unrolled loop (one compiled variant per power of
    # two, so at most 7).
    MAX_UNROLL = 64

    def supports(self, call: IsinCall) -> str | None:
        if call.n > self.MAX_N:
            return f"test_elements has {call.n} elements; compare is for at most {self.MAX_N}"
        return None

    def configs(self, call: IsinCall) -> list[dict]:
        streaming = [{"BLOCK": 2048, "TILE_N": 1, "num_warps": 8},
                     {"BLOCK": 1024, "TILE_N": 1, "num_warps": 4}]
        tiled = [{"BLOCK": 64, "TILE_N": 64, "num_warps": 4},
                 {"BLOCK": 128, "TILE_N": 32, "num_warps": 4}]
        # Too few blocks of 2048 to fill the GPU, and a test set worth splitting: tiles first.
        if cdiv(call.m, 2048) < 4 * call.info.sm_count and call.n > 32:
            return tiled + streaming
        return streaming + tiled

    def run(self, call: IsinCall, config) -> torch.Tensor:
        done = _trivial(call)
        if done is not None:
            return done
        x, t = flat(call.elements), flat(call.test)
        out = _output(call)
        block, tile_n, warps = config["BLOCK"], config["TILE_N"], config["num_warps"]
        m, n, invert = call.m, call.n, call.invert
        unroll = next_pow2(n) if n <= self.MAX_UNROLL else 0
        i64 = needs_int64(m)
        _COMPARE((x.dtype, m, n, invert, block, tile_n, unroll, i64, warps), (cdiv(m, block),),
                 (x, t, out, m, n),
                 lambda: dict(INVERT=invert, BLOCK=block, TILE_N=tile_n, UNROLL=unroll, I64=i64,
                              num_warps=warps))
        return _finish(call, out)

    def cost(self, call: IsinCall, model) -> Estimate:
        first = self.configs(call)[0]
        return cost.compare(call, model, tile_n=first["TILE_N"], block=first["BLOCK"],
                            unrolled=call.n <= self.MAX_UNROLL)


class SearchBackend(Backend):
    name = "search"
    kernels = (_search_kernel, _value_key)

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
        block, warps = config["BLOCK"], config["num_warps"]
        m, n, invert = call.m, call.n, call.invert
        i64 = needs_int64(m, n)
        _SEARCH((x.dtype, m, invert, block, i64, warps), (cdiv(m, block),),
                (x, table, out, m, n),
                lambda: dict(INVERT=invert, BLOCK=block, I64=i64, num_warps=warps))
        return _finish(call, out)

    def cost(self, call: IsinCall, model) -> Estimate:
        return cost.search(call, model)


def _hash_table_log(n: int, slots_per_key: int = 4) -> int:
    """log2 of the table size: at least slots_per_key slots per test element (load factor at most
    1/slots_per_key: short probe chains, and a block waits for its longest), at least 2**4."""
    return max(4, (slots_per_key * n - 1).bit_length())


def _fits_on_chip(nbytes: int) -> bool:
    return nbytes <= LOCAL_TABLE_BYTES


def table_plan(n: int, key_bits: int, local: bool, slots_per_key: int = 4) -> tuple[int, int]:
    """(log2 of the slots, slots held on chip or 0). On-chip tables come in two sizes only, a
    quarter of LOCAL_TABLE_BYTES and all of it: the size is a compile-time constant, and a few
    variants keep compilation rare; a roomier table only shortens the probes."""
    log_t = _hash_table_log(n, slots_per_key)
    most = LOCAL_TABLE_BYTES * 8 // key_bits
    if not local or (1 << log_t) > most:
        return log_t, 0
    slots = most // 4 if (1 << log_t) <= most // 4 else most
    return slots.bit_length() - 1, slots


def _blocks_per_program(m: int, block: int, per: int) -> int:
    """Several blocks per program amortise the on-chip copy of a table, but never more blocks
    than there are."""
    return max(1, min(per, cdiv(m, block)))


class HashBackend(Backend):
    name = "hash"
    kernels = (_hash_build_kernel, _hash_probe_kernel, _hash_probe_blocks, _hash_insert,
               _hash_lookup, _to_key, _value_key, _hash, _mul32)

    def configs(self, call: IsinCall) -> list[dict]:
        if table_plan(call.n, _key_bits(call.elements.dtype), True)[1]:
            # The table is copied on chip once per program, so each program takes several blocks;
            # the alternative reads it through L1.
            # (Triton stages the table in shared memory at every gather, so larger blocks amortise
            # that copy better than more blocks per program do.)
            return [{"BLOCK": 4096, "PER_PROGRAM": 2, "LOCAL": True, "SLOTS": 4, "num_warps": 8},
                    {"BLOCK": 2048, "PER_PROGRAM": 4, "LOCAL": True, "SLOTS": 4, "num_warps": 8},
                    {"BLOCK": 1024, "PER_PROGRAM": 1, "LOCAL": False, "SLOTS": 4, "num_warps": 4},
                    {"BLOCK": 4096, "PER_PROGRAM": 2, "LOCAL": True, "SLOTS": 8, "num_warps": 8}]
        return [{"BLOCK": 1024, "PER_PROGRAM": 1, "LOCAL": False, "SLOTS": 4, "num_warps": 4},
                {"BLOCK": 512, "PER_PROGRAM": 1, "LOCAL": False, "SLOTS": 4, "num_warps": 4},
                {"BLOCK": 1024, "PER_PROGRAM": 1, "LOCAL": False, "SLOTS": 2, "num_warps": 4},
                {"BLOCK": 2048, "PER_PROGRAM": 1, "LOCAL": False, "SLOTS": 8, "num_warps": 8}]

    def run(self, call: IsinCall, config) -> torch.Tensor:
        done = _trivial(call)
        if done is not None:
            return done
        x, t = flat(call.elements), flat(call.test)
        key_bits = _key_bits(x.dtype)
        log_t, local_slots = table_plan(call.n, key_bits, bool(config.get("LOCAL")),
                                        config.get("SLOTS", 4))
        key_dtype = torch.int64 if key_bits == 64 else torch.int32
        # One slot past the table records whether the empty marker's own value is a member.
        table = torch.full(((1 << log_t) + 1,), torch.iinfo(key_dtype).min, dtype=key_dtype,
                           device=x.device)
        flag = table[1 << log_t:]
        build_block = 1024
        # Floats go through murmur's finaliser in tables read through L2; on-chip tables (up
        # to 1K-4K keys) keep Fibonacci hashing, which measured better there (16M elements in
        # 1K floats of integers: 0.083 ms against 0.147 ms on the H200).
        is_float = x.dtype.is_floating_point
        mix = is_float and not local_slots
        m, n, invert = call.m, call.n, call.invert
        bucket_width = 1 if local_slots else WIDE_BUCKET.value
        _HASH_BUILD((x.dtype, n, log_t, bucket_width, mix), (cdiv(n, build_block),),
                    (t, table, flag, n, log_t),
                    lambda: dict(KEY_BITS=key_bits, BUCKET=bucket_width,
                                 MIX=mix, BLOCK=build_block, num_warps=4))
        out = _output(call)
        block, warps = config["BLOCK"], config["num_warps"]
        per = _blocks_per_program(m, block, config["PER_PROGRAM"] if local_slots else 1)
        i64 = needs_int64(m)
        _HASH_PROBE((x.dtype, m, log_t, local_slots, invert, block, per, mix, i64, warps),
                    (cdiv(m, block * per),), (x, table, flag, out, m, log_t),
                    lambda: dict(KEY_BITS=key_bits, LOCAL_SLOTS=local_slots,
                                 INVERT=invert, BLOCK=block, BLOCKS_PER_PROGRAM=per, MIX=mix,
                                 I64=i64, num_warps=warps))
        return _finish(call, out)

    def cost(self, call: IsinCall, model) -> Estimate:
        return cost.hash_(call, model, local_table_bytes=LOCAL_TABLE_BYTES)


def bitmap_capacity(n: int, dtype: torch.dtype) -> int:
    """Bits of the bitmap: the whole range for 8/16-bit integers; else 32 bits per test element
    (no more memory than the hash table would take), at least 2**16 and at most BITMAP_MAX_BITS."""
    if dtype.itemsize <= 2:
        return 1 << (8 * dtype.itemsize)
    return min(BITMAP_MAX_BITS, max(1 << 16, 32 * next_pow2(n)))


class BitmapBackend(Backend):
    """A bitmap over the test set's value range, decided on the device: no host sync. When the
    range exceeds the bitmap's capacity the same kernels use the hash set instead."""

    name = "bitmap"
    kernels = (_minmax_partials_kernel, _bitmap_setup_kernel, _bitmap_build_kernel,
               _bitmap_probe_kernel, _hash_probe_blocks, _hash_insert, _hash_lookup, _to_key,
               _value_key, _hash, _mul32)
    MINMAX_BLOCK = 1024
    MAX_PARTIALS = 1024

    def supports(self, call: IsinCall) -> str | None:
        if call.elements.dtype.is_floating_point:
            return "bitmap takes integer dtypes only (a float range has no bit per value)"
        return None

    def configs(self, call: IsinCall) -> list[dict]:
        return [{"BLOCK": 4096, "PER_PROGRAM": 2, "num_warps": 8},
                {"BLOCK": 2048, "PER_PROGRAM": 2, "num_warps": 8},
                {"BLOCK": 1024, "PER_PROGRAM": 1, "num_warps": 4}]

    def run(self, call: IsinCall, config) -> torch.Tensor:
        done = _trivial(call)
        if done is not None:
            return done
        x, t = flat(call.elements), flat(call.test)
        dev = x.device
        key_bits = _key_bits(x.dtype)
        cap_bits = bitmap_capacity(call.n, x.dtype)
        full_range = x.dtype.itemsize <= 2
        log_t, local_slots = table_plan(call.n, key_bits, not full_range)
        key_dtype = torch.int64 if key_bits == 64 else torch.int32
        # Both structures are allocated (O(N) each, from the caching allocator); the setup kernel
        # initialises only the one the data calls for.
        bits = torch.empty(cap_bits // 32, dtype=torch.int32, device=dev)
        # (the slot past the table is the hash set's flag, as in HashBackend)
        table = torch.empty(1 if full_range else (1 << log_t) + 1, dtype=key_dtype, device=dev)
        flag = table[table.numel() - 1:]
        params = torch.empty(2, dtype=torch.int64, device=dev)
        m, n, invert, dtype = call.m, call.n, call.invert, x.dtype
        if full_range:
            parts, n_parts = params, 0
        else:
            per = max(1, cdiv(n, self.MINMAX_BLOCK * self.MAX_PARTIALS))
            n_parts = cdiv(n, self.MINMAX_BLOCK * per)
            parts = torch.empty(2 * n_parts, dtype=torch.int64, device=dev)
            _MINMAX((dtype, n, per), (n_parts,), (t, parts, n),
                    lambda: dict(BLOCK=self.MINMAX_BLOCK, PER_PROGRAM=per, num_warps=4))
        setup_block = 1024
        slots = 0 if full_range else table.numel()
        lowest = torch.iinfo(dtype).min
        p_block = next_pow2(max(n_parts, 2))
        _BITMAP_SETUP((dtype, n_parts, cap_bits, slots, full_range),
                      (cdiv(max(cap_bits // 32, table.numel()), setup_block),),
                      (parts, n_parts, params, bits, table, cap_bits, slots, lowest),
                      lambda: dict(FULL_RANGE=full_range, KEY_BITS=key_bits, P_BLOCK=p_block,
                                   BLOCK=setup_block, num_warps=4))
        build_block = 1024
        bucket_width = 1 if local_slots else WIDE_BUCKET.value
        _BITMAP_BUILD((dtype, n, cap_bits, log_t, bucket_width), (cdiv(n, build_block),),
                      (t, params, bits, table, flag, n, cap_bits, log_t),
                      lambda: dict(KEY_BITS=key_bits, BUCKET=bucket_width, BLOCK=build_block,
                                   num_warps=4))
        out = _output(call)
        local_words = cap_bits // 32 if _fits_on_chip(cap_bits // 8) else 0
        block, warps = config["BLOCK"], config["num_warps"]
        per = _blocks_per_program(m, block,
                                  config["PER_PROGRAM"] if (local_words or local_slots) else 1)
        i64 = needs_int64(m)
        _BITMAP_PROBE((dtype, m, cap_bits, log_t, local_words, local_slots, invert, block, per,
                       i64, warps), (cdiv(m, block * per),),
                      (x, params, bits, table, flag, out, m, cap_bits, log_t),
                      lambda: dict(KEY_BITS=key_bits, LOCAL_WORDS=local_words,
                                   LOCAL_SLOTS=local_slots, INVERT=invert, BLOCK=block,
                                   BLOCKS_PER_PROGRAM=per, I64=i64, num_warps=warps))
        return _finish(call, out)

    def cost(self, call: IsinCall, model) -> Estimate:
        return cost.bitmap(call, model, cap_bits=bitmap_capacity(call.n, call.elements.dtype),
                           local_bytes=LOCAL_TABLE_BYTES)


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


def replay(call: IsinCall) -> tuple[tuple, dict]:
    """The public call a prepared one came from (tuning's first runs; without out=)."""
    return (call.elements, call.test), {"assume_unique": call.assume_unique,
                                        "invert": call.invert}


OP = register(Op("isin", prepare, [
    TorchBackend(_torch_isin, cost.torch_),
    CompareBackend(),
    SearchBackend(),
    HashBackend(),
    BitmapBackend(),
], sample=sample, replay=replay, calibration=[
    ([[1 << 22], [32]], torch.int32, {}),
    ([[1 << 22], [1024]], torch.int32, {}),
    ([[1 << 24], [1 << 16]], torch.int32, {}),
    ([[1 << 24], [1 << 20]], torch.int64, {}),
    ([[1 << 22], [1 << 20]], torch.float32, {"values": "narrow"}),
]))
