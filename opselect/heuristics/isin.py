"""Cost model of the isin backends: roofline terms per backend, in seconds.

M elements of s bytes are read and M bools written by every backend; they differ in the work done
per element (comparisons, dependent loads, probes) and the set-up (a sort, a table build, a sync).

A constant or rule fitted to measured calls names its heading in
benchmarks/results/h200/fits/isin.md (as `fits/isin.md, "HEADING"`), which keeps the measurements.
"""

from __future__ import annotations

import math

from .device_model import BOUND_LAUNCH

OP = "isin"

#: Seconds per element pair of torch.isin's brute-force kernel, which loops over the test set for
#: each element, reloading every test element from memory: some 100x the cost of a compare that
#: keeps the test element in a register for a whole block (fits/isin.md, "TORCH_BRUTE_PAIR_S").
TORCH_BRUTE_PAIR_S = 1e-11


def _stream(call, model) -> float:
    s = call.elements.dtype.itemsize
    return model.stream(call.m * (s + 1) + call.n * s)


def torch_(call, model, plan=None):
    m, n, s = call.m, call.n, call.elements.dtype.itemsize
    if m == 0 or n == 0:
        return model.estimate(OP, "torch", triton=False, launch=model.torch_launch)
    # ATen's rule (from numpy): a brute-force loop when N < 10 * M**0.145, sorting otherwise.
    if n < 10.0 * m ** 0.145:
        # One kernel; each element walks the test set until it finds itself (about half of it
        # for members, all of it for the rest).
        pairs = m * n * 0.75 * TORCH_BRUTE_PAIR_S
        return model.estimate(OP, "torch", triton=False, launch=2 * model.torch_launch,
                              memory=model.stream(m * (s + 1)), compares=pairs)
    # unique(elements, return_inverse) and unique(test) (each a sort with indices), then a sort of
    # both with indices and a scatter back to the elements' order: about four sorts of M + N.
    sorts = 2 * model.sort(m, s, 8) + model.sort(n, s, 0) + model.sort(m + n, s, 8)
    return model.estimate(OP, "torch", triton=False, sorts=sorts, launch=25 * model.torch_launch,
                          memory=model.stream(m * (s + 1 + 16)))


#: Seconds per step of the compare kernel's loop over the test set, when that loop, not the
#: memory, is the bound (one program walks the whole test set): a scalar load, a compare and an or
#: for the streaming variant; a [64, 64] tile for the tiled one.
COMPARE_STEP_S = {1: 60e-9, 64: 300e-9}
#: The unrolled variant (tiny test sets) waits for one round of loads, then compares.
COMPARE_UNROLLED_WAIT_S, COMPARE_UNROLLED_STEP_S = 1e-6, 5e-9


def compare(call, model, plan):
    """plan: the compare backend's ComparePlan (kernels/isin/compare.py)."""
    m, n = call.m, call.n
    tile_n, block, unrolled = plan.test_tile, plan.block_size, plan.unrolled_length > 0
    programs = max(1, -(-m // block))
    waves = -(-programs // (4 * model.sm_count))
    if tile_n == 1 and unrolled:
        latency = waves * (COMPARE_UNROLLED_WAIT_S + n * COMPARE_UNROLLED_STEP_S)
    else:
        steps = n if tile_n == 1 else -(-n // tile_n)
        latency = waves * steps * COMPARE_STEP_S[1 if tile_n == 1 else 64]
    return model.estimate(OP, "compare", triton=True, launch=BOUND_LAUNCH + model.torch_launch,
                          memory=_stream(call, model),
                          compares=max(m * max(n, 16) * model.compare, latency))


#: torch.sort of up to this many elements runs in one block; more take a multi-kernel radix sort
#: whose time does not fall below SORT_MULTI_KERNEL_FLOOR_S however few its bytes: measured
#: sorts of that size took many times what their kernels' work explains (fits/isin.md,
#: "SORT_MULTI_KERNEL_FLOOR_S").
SORT_ONE_BLOCK = 4096
SORT_MULTI_KERNEL_FLOOR_S = 60e-6


#: The host time of search's torch.sort (values and indices) and the tensors around it, in
#: torch launches: the H200's host measured 47.9 us a call back to back (isin 256 in 16 int64,
#: benchmarks/results/h200/dispatch.md) against the 22 us of the two launches charged before,
#: which had the cold model take search over hash on 1e6 elements in 1K values (regret 2.0).
SEARCH_TORCH_LAUNCHES = 5


def search(call, model, plan=None):
    m, n, s = call.m, call.n, call.elements.dtype.itemsize
    steps = max(1, math.ceil(math.log2(max(n, 2)))) + 1
    # The top ~10 levels of the implicit search tree are shared by all lanes and stay in L1.
    cached = min(steps, 10)
    lookups = m * cached * model.gather_smem + model.gather(m * (steps - cached), n * s)
    # torch.sort computes int64 indices whether or not they are used; past one block it is a
    # multi-kernel radix sort with a floor of its own.
    sort = model.sort(n, s, 8)
    if n > SORT_ONE_BLOCK:
        sort = max(sort, SORT_MULTI_KERNEL_FLOOR_S)
    return model.estimate(OP, "search", triton=True, sort=sort,
                          launch=BOUND_LAUNCH + SEARCH_TORCH_LAUNCHES * model.torch_launch,
                          memory=_stream(call, model), lookups=lookups)


#: Test sets of at least this many elements get the pre-insert launch (below it, the worst case,
#: every element one value, serialises about as long as the extra launch takes).
PREINSERT_FROM = 16384
#: The pre-insert launch of test sets of PREINSERT_FROM elements or more (one program inserts
#: a strided subset before the build, kernels/isin/common.py): its time on the device, a chain of
#: dependent L2 atomics (H200, benchmarks/ab_isin.py --builds: 1M distinct int32 values, hash
#: 60.9 -> 64.9 us, bitmap 87.5 -> 91.7).
PREINSERT_S = 4e-6


def _preinsert(call, model) -> tuple[float, float]:
    """(host, device) seconds of the pre-insert launch, (0, 0) for smaller test sets."""
    return (BOUND_LAUNCH, PREINSERT_S) if call.n >= PREINSERT_FROM else (0.0, 0.0)


def table_bytes(call, slots_per_key: int = 4, keys: int | None = None) -> int:
    """The hash table's bytes for the call's test values (or for `keys` of them)."""
    key_bytes = 8 if call.elements.dtype.itemsize == 8 else 4
    n = call.n if keys is None else keys
    return (1 << max(4, (slots_per_key * n - 1).bit_length())) * key_bytes


#: Shared-memory bytes/s a whole GPU writes when every program stages an on-chip table (Triton
#: copies the table into shared memory at each gather).
SMEM_STAGING_BPS = 3e13
#: Seconds per element of probing an on-chip table beyond its loads (the hash, the compare, the
#: bucket walk), 32-bit keys; 64-bit keys take twice that. The gathers alone explain a small part
#: of what on-chip probes measured past their stream (fits/isin.md, "HASH_LOCAL_PROBE_S").
HASH_LOCAL_PROBE_S = 3e-12
#: bitmap's kernels on a range too wide for the bitmap probe its hash set at this multiple of the
#: hash backend's time where the table lives in L2 or DRAM (its set-up and range check on top;
#: about 1x where it is on chip). An empirical factor, the middle of the measured ratios
#: (fits/isin.md, "BITMAP_WIDE_PENALTY and BITMAP_WIDE_BUILD").
BITMAP_WIDE_PENALTY = 1.8
#: ... and build it at this multiple of the hash backend's build (same heading).
BITMAP_WIDE_BUILD = 1.25


#: The share of L2 a table of random atomic updates can use before the updates go to DRAM. An
#: empirical share: a measured table of about half of L2 took its updates at about half L2's
#: atomic rate (fits/isin.md, "ATOMIC_L2_SHARE and ATOMIC_DRAM_ACCESSES").
ATOMIC_L2_SHARE = 0.3
#: An atomic update that misses L2 costs this many random DRAM accesses: a read and a write, and
#: their queueing (same heading).
ATOMIC_DRAM_ACCESSES = 2.5


def _atomics(n: float, table_bytes: float, model) -> float:
    """n atomic updates at random places of a table: at L2's rate while the table fits there,
    a read and a write of DRAM for the part that does not (a table far larger than L2 builds
    several times slower than L2 atomics would: fits/isin.md, "ATOMIC_L2_SHARE and
    ATOMIC_DRAM_ACCESSES")."""
    hit = min(1.0, ATOMIC_L2_SHARE * model.l2_bytes / max(table_bytes, 1.0))
    return n * (hit * model.atomic + (1 - hit) * ATOMIC_DRAM_ACCESSES * model.gather_dram)


def hash_(call, model, plan=None, *, local_table_bytes: int = 0, block: int = 4096):
    """plan: the hash backend's HashPlan (kernels/isin/hash.py); without one (bitmap's estimate of
    its hash-set fallback) the table is on chip when it fits in local_table_bytes."""
    m, n = call.m, call.n
    t_bytes = table_bytes(call)
    on_chip = plan.on_chip_slots > 0 if plan is not None else t_bytes <= local_table_bytes
    if on_chip:
        # A first probe gathered from the on-chip copy (staged again for every block of `block`
        # elements); a quarter of the lanes probe on through L1.
        probes = (m * model.gather_smem + 0.25 * model.gather(m, 0, on_chip=True) * 4
                  + (m / block) * t_bytes / SMEM_STAGING_BPS
                  + m * HASH_LOCAL_PROBE_S * (2 if call.elements.dtype.itemsize == 8 else 1))
    else:
        # One 16/32-byte bucket per element, read through L2 (or DRAM when the table is big).
        probes = model.gather(1.1 * m, t_bytes)
    # The inserts land on the slots of distinct values only: 8- and 16-bit keys have at most
    # 256 / 65536 of them, whose slots stay in L2 however many test values (fits/isin.md,
    # "hash: inserts of 8- and 16-bit keys").
    dtype = call.elements.dtype
    hot_bytes = t_bytes
    if dtype.itemsize <= 2 and not dtype.is_floating_point:
        hot_bytes = table_bytes(call, keys=min(n, 1 << (8 * dtype.itemsize)))
    build = model.stream(t_bytes) + _atomics(1.3 * n, hot_bytes, model)
    pre_host, pre_device = _preinsert(call, model)
    return model.estimate(OP, "hash", triton=True,
                          launch=2 * BOUND_LAUNCH + 3 * model.torch_launch + pre_host,
                          memory=_stream(call, model), build=build + pre_device, probes=probes)


#: The cuckoo backend (kernels/isin/cuckoo.py), fitted to its H200 timings (fits/isin.md,
#: "cuckoo"): seconds per element of a lookup in a table L1 holds (the hash, one or two slot
#: reads, the compares) beyond the stream; the table bytes L1 holds; and the build's time (a
#: fill launch, then rounds of atomic exchanges, which grow with the set up to a few rounds).
CUCKOO_L1_PROBE_S = 1.0e-12
CUCKOO_L1_BYTES = 128 * 1024
CUCKOO_BUILD_S = 4e-6
CUCKOO_BUILD_ROUNDS_S = 8e-6


def cuckoo(call, model, plan):
    """plan: the cuckoo backend's CuckooPlan. A key sits in one of two slots: a lookup reads one,
    or two where the first missed (about 1.5 reads an element, not knowing the data); the reads
    L1 does not hold go to L2."""
    m, n = call.m, call.n
    t_bytes = (1 << plan.table_log2) * plan.key_bits // 8
    in_l1 = min(1.0, CUCKOO_L1_BYTES / t_bytes)
    probes = m * CUCKOO_L1_PROBE_S + (1 - in_l1) * model.gather(1.5 * m, t_bytes)
    build = (model.stream(t_bytes) + CUCKOO_BUILD_S + CUCKOO_BUILD_ROUNDS_S * min(1.0, n / 1024)
             + _atomics(1.1 * n, t_bytes, model))
    return model.estimate(OP, "cuckoo", triton=True, launch=2 * BOUND_LAUNCH + 2 * model.torch_launch,
                          memory=_stream(call, model), build=build, probes=probes)


#: A bitmap of a few words (8- and 16-bit keys: 8 and 2048 words) takes every test value's
#: atomic OR on those words: updates of one word serialise, at about this many seconds each ...
BITMAP_WORD_UPDATE_S = 1.2e-9
#: ... and the few L2 lines of such a bitmap take them at this rate at best (both fitted to
#: measured calls: fits/isin.md, "BITMAP_WORD_UPDATE_S and BITMAP_SMALL_UPDATE_S").
BITMAP_SMALL_UPDATE_S = 3e-11


def _bitmap_contention(n: int, capacity_bits: int) -> float:
    words = max(1, capacity_bits // 32)
    return max(n / words * BITMAP_WORD_UPDATE_S, n * BITMAP_SMALL_UPDATE_S)


def bitmap(call, model, plan):
    """plan: the bitmap backend's BitmapPlan (kernels/isin/bitmap.py)."""
    cap_bits, local_bytes = plan.capacity_bits, plan.on_chip_bytes
    m, n, s = call.m, call.n, call.elements.dtype.itemsize
    bit_bytes = cap_bits / 8
    local = bit_bytes <= local_bytes
    bit_updates = _atomics(n, bit_bytes, model)
    pre_host, pre_device = _preinsert(call, model)
    parts = dict(launch=4 * BOUND_LAUNCH + 5 * model.torch_launch + pre_host,
                 memory=_stream(call, model), setup=model.stream(bit_bytes) + bit_updates + pre_device)
    narrow = 1.2 * model.gather(m, 0, on_chip=True) if local else model.gather(m, bit_bytes)
    if s <= 2:  # 8/16-bit integers: the whole range always fits, in a few words
        return model.estimate(OP, "bitmap", triton=True, probes=narrow,
                              contention=_bitmap_contention(n, cap_bits), **parts)
    # Wider integers: the range is data, measured on the device, and the model cannot see it.
    # With even odds of a narrow range (bitmap) and a wide one (the hash set's probes), the
    # expected cost is the mean; tuning measures the real data.
    wide_hash = hash_(call, model, local_table_bytes=local_bytes).parts
    wide = wide_hash["probes"]
    if table_bytes(call) > local_bytes:
        wide *= BITMAP_WIDE_PENALTY
    # The set-up charged the bitmap's updates; a wide range builds the hash set instead.
    parts["setup"] += 0.5 * (BITMAP_WIDE_BUILD * wide_hash["build"] - bit_updates)
    parts.update(minmax=model.stream(n * s), probes=0.5 * (narrow + wide))
    notes = ("bitmap or hash set, decided on the device from the value range (no host sync)",
             "the model assumes even odds of a narrow range")
    return model.estimate(OP, "bitmap", triton=True, notes=notes, **parts)
