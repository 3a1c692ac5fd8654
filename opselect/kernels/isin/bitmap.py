"""isin's bitmap backend: one bit per value of the test set's range (integers), or the hash set
when the range is too wide, decided on the device."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ...heuristics import isin as cost
from .._common import allocator, cdiv, needs_int64, next_pow2
from .call import IsinCall, _prepared_call, _reader
from .common import (LOCAL_TABLE_BYTES, REPEATS_FOR_CHECK, WIDE_BUCKET, SetPlan, _blocks_per_program, _hash_insert,
                     _hash_probe_blocks, _key_bits, plan_launcher, check_config, table_plan,
                     TritonBackend)


# The bitmap never exceeds this many bits (it must stay in L2); wider value ranges use the hash set.
BITMAP_MAX_BITS = 1 << 28  # 32 MiB


# The bitmap backend decides on the device, without a host sync, between a bitmap (when the test
# set's value range fits its capacity) and the hash set (when it does not). params[0] holds the
# range's low end, params[1] 1 for the bitmap and 0 for the hash set, params[2] 1 when the
# pre-insert found repeated test values (the build then checks before its atomics).
@triton.jit
def _minmax_partials_kernel(t_ptr, part_ptr, N, minmax_block: tl.constexpr,
                            minmax_blocks_per_program: tl.constexpr):
    pid = tl.program_id(0)
    lo = tl.full([minmax_block], 0x7FFFFFFFFFFFFFFF, tl.int64)
    hi = tl.full([minmax_block], -0x7FFFFFFFFFFFFFFF - 1, tl.int64)
    for i in range(minmax_blocks_per_program):
        offs = (pid * minmax_blocks_per_program + i) * minmax_block + tl.arange(0, minmax_block)
        ok = offs < N
        v = tl.load(t_ptr + offs, mask=ok, other=0).to(tl.int64)
        lo = tl.where(ok, tl.minimum(lo, v), lo)
        hi = tl.where(ok, tl.maximum(hi, v), hi)
    tl.store(part_ptr + 2 * pid, tl.min(lo, axis=0))
    tl.store(part_ptr + 2 * pid + 1, tl.max(hi, axis=0))


@triton.jit
def _bitmap_setup_kernel(part_ptr, P, params_ptr, bits_ptr, table_ptr, cap_bits, T,
                         FULL_RANGE_LO, full_range: tl.constexpr, key_bits: tl.constexpr,
                         partials_padded: tl.constexpr, setup_block: tl.constexpr):
    """Every program reduces the partial min/max itself (P is small), so no extra launch is
    needed; then it clears its share of the bitmap, or fills its share of the hash table."""
    pid = tl.program_id(0)
    if full_range:
        # 8- and 16-bit integers: the bitmap spans the whole dtype, nothing to measure.
        lo = tl.full([], FULL_RANGE_LO, tl.int64)
        fits = tl.full([], 1, tl.int1)
    else:
        idx = tl.arange(0, partials_padded)
        lo = tl.min(tl.load(part_ptr + 2 * idx, mask=idx < P, other=0x7FFFFFFFFFFFFFFF), axis=0)
        hi = tl.max(tl.load(part_ptr + 2 * idx + 1, mask=idx < P, other=-0x7FFFFFFFFFFFFFFF - 1),
                    axis=0)
        span = hi - lo  # wraps negative only when the range exceeds 2**63: then it does not fit
        fits = (span >= 0) & (span < cap_bits)
    if pid == 0:
        tl.store(params_ptr, lo)
        tl.store(params_ptr + 1, fits.to(tl.int64))
        tl.store(params_ptr + 2, tl.zeros([], tl.int64))  # the pre-insert's flag: off
    offs = pid * setup_block + tl.arange(0, setup_block)
    if fits:
        tl.store(bits_ptr + offs, tl.zeros([setup_block], tl.int32), mask=offs < cap_bits // 32)
    else:
        tl.store(table_ptr + offs, tl.full([setup_block], -(1 << (key_bits - 1)), table_ptr.dtype.element_ty),
                 mask=offs < T)


@triton.jit
def _bitmap_insert(v, ok, params_ptr, bits_ptr, table_ptr, flag_ptr, cap_bits, log_t,
                   key_bits: tl.constexpr, bucket_width: tl.constexpr, check_first):
    """The test values v (where ok) into the bitmap, or into the hash set when the range is too
    wide; the lanes whose value was in already. check_first (a constexpr or a device flag): a
    lane whose bit is already set is done without an atomic (atomics on one word serialise; see
    _hash_insert)."""
    if tl.load(params_ptr + 1) != 0:
        rel = v.to(tl.int64) - tl.load(params_ptr)
        ok = ok & (rel >= 0) & (rel < cap_bits)
        word = (rel >> 5).to(tl.int32)
        bit = (rel & 31).to(tl.int32)
        todo = ok
        if check_first:
            held = tl.load(bits_ptr + word, mask=ok, other=0)
            todo = ok & (((held >> bit) & 1) == 0)
        old = tl.atomic_or(bits_ptr + word, (1 << bit).to(tl.int32), mask=todo, sem="relaxed")
        there = ok & (~todo | (((old >> bit) & 1) != 0))
    else:
        there = _hash_insert(table_ptr, flag_ptr, v, ok, log_t, key_bits, bucket_width, False,
                             check_first)
    return there


@triton.jit
def _bitmap_preinsert_kernel(t_ptr, params_ptr, bits_ptr, table_ptr, flag_ptr, stride, cap_bits,
                             log_t, key_bits: tl.constexpr, bucket_width: tl.constexpr,
                             preinsert_block: tl.constexpr):
    """One program: every stride-th test element first; params[2] = 1 where enough of them
    were repeats, which turns the build's checks on (as _hash_preinsert_kernel)."""
    offs = tl.arange(0, preinsert_block) * stride
    v = tl.load(t_ptr + offs)
    there = _bitmap_insert(v, offs >= 0, params_ptr, bits_ptr, table_ptr, flag_ptr, cap_bits,
                           log_t, key_bits, bucket_width, False)
    repeats = tl.sum(there.to(tl.int32), axis=0)
    tl.store(params_ptr + 2, (repeats >= REPEATS_FOR_CHECK).to(tl.int64))


@triton.jit
def _bitmap_build_kernel(t_ptr, params_ptr, bits_ptr, table_ptr, flag_ptr, N, cap_bits, log_t,
                         key_bits: tl.constexpr, bucket_width: tl.constexpr,
                         build_block: tl.constexpr):
    offs = tl.program_id(0) * build_block + tl.arange(0, build_block)
    ok = offs < N
    v = tl.load(t_ptr + offs, mask=ok, other=0)
    _bitmap_insert(v, ok, params_ptr, bits_ptr, table_ptr, flag_ptr, cap_bits, log_t, key_bits,
                   bucket_width, tl.load(params_ptr + 2) == 1)


@triton.jit
def _bitmap_probe_kernel(x_ptr, params_ptr, bits_ptr, table_ptr, flag_ptr, out_ptr, M, cap_bits,
                         log_t, key_bits: tl.constexpr, on_chip_words: tl.constexpr,
                         on_chip_slots: tl.constexpr, invert: tl.constexpr,
                         probe_block: tl.constexpr, blocks_per_program: tl.constexpr,
                         offsets_64bit: tl.constexpr):
    """on_chip_words > 0: the bitmap (that many words) is copied on chip; on_chip_slots > 0: the
    hash table (that many slots) is, should the data need it."""
    pid = tl.program_id(0)
    if offsets_64bit:
        pid = pid.to(tl.int64)
    lo = tl.load(params_ptr)
    if tl.load(params_ptr + 1) != 0:
        words = 0
        if on_chip_words > 0:
            words = tl.load(bits_ptr + tl.arange(0, on_chip_words))
        for i in range(blocks_per_program):
            offs = (pid * blocks_per_program + i) * probe_block + tl.arange(0, probe_block)
            ok = offs < M
            rel = tl.load(x_ptr + offs, mask=ok, other=0).to(tl.int64) - lo
            inside = ok & (rel >= 0) & (rel < cap_bits)
            w_idx = tl.where(inside, rel >> 5, 0).to(tl.int32)
            if on_chip_words > 0:
                word = tl.gather(words, w_idx, 0)
            else:
                word = tl.load(bits_ptr + w_idx, mask=inside, other=0)
            found = inside & (((word >> (rel & 31).to(tl.int32)) & 1) != 0)
            tl.store(out_ptr + offs, found != invert, mask=ok)
    else:
        _hash_probe_blocks(x_ptr, table_ptr, flag_ptr, out_ptr, M, log_t, pid, key_bits,
                           on_chip_slots, invert, probe_block, blocks_per_program, False)


# Each Launcher's spec is the BitmapPlan (made per dtype, sizes and flag: it fixes every integer
# argument and every constexpr).
_MINMAX = plan_launcher(_minmax_partials_kernel, num_warps=4)
_BITMAP_SETUP = plan_launcher(_bitmap_setup_kernel, num_warps=4)
_BITMAP_PREINSERT = plan_launcher(_bitmap_preinsert_kernel, num_warps=4)
_BITMAP_BUILD = plan_launcher(_bitmap_build_kernel, num_warps=4)
_BITMAP_PROBE = plan_launcher(_bitmap_probe_kernel)

#: The keys of a bitmap config: probe_block, blocks_per_program (the most a program probes, with
#: a bitmap or table on chip) and num_warps (of the probing launch).
CONFIG_KEYS = frozenset({"probe_block", "blocks_per_program", "num_warps"})


def _fits_on_chip(nbytes: int) -> bool:
    return nbytes <= LOCAL_TABLE_BYTES


def bitmap_capacity(n: int, dtype: torch.dtype) -> int:
    """Bits of the bitmap: the whole range for 8/16-bit integers; else 32 bits per test element
    (no more memory than the hash table would take), at least 2**16 and at most BITMAP_MAX_BITS."""
    if dtype.itemsize <= 2:
        return 1 << (8 * dtype.itemsize)
    return min(BITMAP_MAX_BITS, max(1 << 16, 32 * next_pow2(n)))


@dataclass(frozen=True, eq=False)
class BitmapPlan(SetPlan):
    """The launches of the bitmap backend (the test set's min and max, setup, build, probe):
    the Launchers' spec and the cost model's input. Which structure a call uses (the bitmap
    or, for a range past its capacity, the hash set) is decided on the device; the plan sizes
    both."""

    full_range: bool  # 8/16-bit keys: the bitmap covers the dtype's whole range (no min/max)
    capacity_bits: int  # bits of the bitmap (bitmap_capacity)
    on_chip_bytes: int  # a bitmap or table up to this size is copied on chip by each program
    on_chip_words: int  # 32-bit words of bitmap each probing program copies on chip (0: none)
    table_slots: int  # the hash set's slots with its flag (0: full range, no hash set)
    minmax_block: int  # test elements per block of the min/max launch
    minmax_blocks_per_program: int  # blocks each min/max program reduces
    partials: int  # min/max programs (0: full range, no min/max launch)
    partials_padded: int  # partials rounded up to a power of two (the setup reduces them)
    setup_block: int  # bitmap words or table slots each setup program initialises


class BitmapBackend(TritonBackend):
    """A bitmap over the test set's value range, decided on the device: no host sync. When the
    range exceeds the bitmap's capacity the same kernels use the hash set instead."""

    name = "bitmap"
    estimate = staticmethod(cost.bitmap)
    MINMAX_BLOCK = 1024
    MAX_PARTIALS = 1024

    def supports(self, call: IsinCall) -> str | None:
        if call.elements.dtype.is_floating_point:
            return "bitmap takes integer dtypes only (a float range has no bit per value)"
        return None

    def configs(self, call: IsinCall) -> list[dict]:
        # Blocks of 1024 first (the cold model runs the first config): tuning chose them on
        # about half of the measured calls and on most of the long ones, where the 4096 x 2
        # that came first before made cold picks up to 1.75x slower
        # (benchmarks/results/h200/fits/isin.md, "bitmap: the first config").
        return [{"probe_block": 1024, "blocks_per_program": 1, "num_warps": 4},
                {"probe_block": 4096, "blocks_per_program": 2, "num_warps": 8},
                {"probe_block": 2048, "blocks_per_program": 2, "num_warps": 8}]

    def _prepared(self, p, call: IsinCall):
        """The prepared call (call._prepared_call): the scratch, then the min/max (wider than
        16-bit keys), setup, pre-insert (large test sets), build and probe launches. Which
        structure the data calls for is still decided on the device, by the setup kernel."""
        device, index = call.elements.device, call.info.index
        key_dtype = torch.int64 if p.key_bits == 64 else torch.int32
        n, m, cap, log_t = p.test_elements, p.elements, p.capacity_bits, p.table_log2
        partials, table_slots, words = p.partials, p.table_slots, cap // 32
        # (the slot past the table is the hash set's flag, as in HashBackend)
        table_len = max(table_slots, 1)
        lowest = torch.iinfo(p.dtype).min
        minmax = None if p.full_range else _MINMAX.bind(p, (partials,), index)
        setup = _BITMAP_SETUP.bind(p, (cdiv(max(words, table_len), p.setup_block),), index)
        stride = p.preinsert_stride
        preinsert = _BITMAP_PREINSERT.bind(p, (1,), index) if stride else None
        build = _BITMAP_BUILD.bind(p, (cdiv(n, p.build_block),), index)
        probe = _BITMAP_PROBE.bind(p, (cdiv(m, p.probe_block * p.blocks_per_program),), index)

        new_bits = allocator((words,), torch.int32, device)
        new_table = allocator((table_len,), key_dtype, device)
        new_params = allocator((3,), torch.int64, device)
        new_parts = allocator((2 * partials,), torch.int64, device)

        def launches(x: torch.Tensor, t: torch.Tensor, out: torch.Tensor) -> None:
            # Both structures are allocated (O(N) each, from the caching allocator); the setup
            # kernel initialises only the one the data calls for.
            bits, table, params = new_bits(), new_table(), new_params()
            flag = table[table_len - 1:]
            if minmax is None:
                parts = params  # (a full range has no partials: the setup kernel reads none)
            else:
                parts = new_parts()
                minmax(t, parts, n)
            setup(parts, partials, params, bits, table, cap, table_slots, lowest)
            if preinsert is not None:
                preinsert(t, params, bits, table, flag, stride, cap, log_t)
            build(t, params, bits, table, flag, n, cap, log_t)
            probe(x, params, bits, table, flag, out, m, cap, log_t)

        return _prepared_call(call, _reader(call.test), launches)

    def make_plan(self, call: IsinCall, config, sms: int) -> BitmapPlan:
        check_config(f"isin {self.name}", config, CONFIG_KEYS)
        dtype, m, n = call.elements.dtype, call.m, call.n
        key_bits = _key_bits(dtype)
        cap_bits = bitmap_capacity(n, dtype)
        full_range = dtype.itemsize <= 2
        log_t, local_slots = table_plan(n, key_bits, not full_range)
        if full_range:
            per, n_parts = 1, 0
        else:
            per = max(1, cdiv(n, self.MINMAX_BLOCK * self.MAX_PARTIALS))
            n_parts = cdiv(n, self.MINMAX_BLOCK * per)
        local_words = cap_bits // 32 if _fits_on_chip(cap_bits // 8) else 0
        block = config["probe_block"]
        per_probe = _blocks_per_program(
            m, block, config["blocks_per_program"] if (local_words or local_slots) else 1)
        return BitmapPlan(
            dtype=dtype, elements=m, test_elements=n, invert=call.invert, key_bits=key_bits,
            full_range=full_range, capacity_bits=cap_bits, on_chip_bytes=LOCAL_TABLE_BYTES,
            on_chip_words=local_words, table_log2=log_t,
            table_slots=0 if full_range else (1 << log_t) + 1, on_chip_slots=local_slots,
            bucket_width=1 if local_slots else WIDE_BUCKET.value,
            minmax_block=self.MINMAX_BLOCK, minmax_blocks_per_program=per, partials=n_parts,
            partials_padded=next_pow2(max(n_parts, 2)), setup_block=1024, build_block=1024,
            probe_block=block, blocks_per_program=per_probe, offsets_64bit=needs_int64(m),
            num_warps=config["num_warps"])
