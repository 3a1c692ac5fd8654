"""Cost model of the isin backends: roofline terms per backend, in seconds.

M elements of s bytes are read and M bools written by every backend; they differ in the work done
per element (comparisons, dependent loads, probes) and the set-up (a sort, a table build, a sync).
"""

from __future__ import annotations

import math

OP = "isin"

#: torch.isin's brute-force kernel loops over the test set for each element, reloading every test
#: element from memory: about 1e-11 s per element pair on an H200 (measured), some 100x slower
#: than a compare that keeps the test element in a register for a whole block.
TORCH_BRUTE_PAIR_S = 1e-11


def _stream(call, model) -> float:
    s = call.elements.dtype.itemsize
    return model.stream(call.m * (s + 1) + call.n * s)


def torch_(call, model):
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


def compare(call, model, *, tile_n: int = 1, block: int = 2048, unrolled: bool = False):
    m, n = call.m, call.n
    programs = max(1, -(-m // block))
    waves = -(-programs // (4 * model.sm_count))
    if tile_n == 1 and unrolled:
        latency = waves * (COMPARE_UNROLLED_WAIT_S + n * COMPARE_UNROLLED_STEP_S)
    else:
        steps = n if tile_n == 1 else -(-n // tile_n)
        latency = waves * steps * COMPARE_STEP_S[1 if tile_n == 1 else 64]
    return model.estimate(OP, "compare", triton=True, launch=model.launch + model.torch_launch,
                          memory=_stream(call, model),
                          compares=max(m * max(n, 16) * model.compare, latency))


def search(call, model):
    m, n, s = call.m, call.n, call.elements.dtype.itemsize
    steps = max(1, math.ceil(math.log2(max(n, 2)))) + 1
    # The top ~10 levels of the implicit search tree are shared by all lanes and stay in L1.
    cached = min(steps, 10)
    lookups = m * cached * model.gather_smem + model.gather(m * (steps - cached), n * s)
    return model.estimate(OP, "search", triton=True, sort=model.sort(n, s),
                          launch=model.launch + 2 * model.torch_launch,
                          memory=_stream(call, model), lookups=lookups)


def table_bytes(call, slots_per_key: int = 4) -> int:
    key_bytes = 8 if call.elements.dtype.itemsize == 8 else 4
    return (1 << max(4, (slots_per_key * call.n - 1).bit_length())) * key_bytes


#: Shared-memory bytes/s a whole GPU writes when every program stages an on-chip table (Triton
#: copies the table into shared memory at each gather).
SMEM_STAGING_BPS = 3e13


def hash_(call, model, *, local_table_bytes: int, block: int = 4096):
    m, n = call.m, call.n
    t_bytes = table_bytes(call)
    if t_bytes <= local_table_bytes:
        # A first probe gathered from the on-chip copy (staged again for every block of `block`
        # elements); a quarter of the lanes probe on through L1.
        probes = (m * model.gather_smem + 0.25 * model.gather(m, 0, on_chip=True) * 4
                  + (m / block) * t_bytes / SMEM_STAGING_BPS)
    else:
        # One 16/32-byte bucket per element, read through L2 (or DRAM when the table is big).
        probes = model.gather(1.1 * m, t_bytes)
    build = model.stream(t_bytes) + 1.3 * n * model.atomic
    return model.estimate(OP, "hash", triton=True, launch=2 * model.launch + 3 * model.torch_launch,
                          memory=_stream(call, model), build=build, probes=probes)


def bitmap(call, model, *, cap_bits: int, local_bytes: int):
    m, n, s = call.m, call.n, call.elements.dtype.itemsize
    bit_bytes = cap_bits / 8
    local = bit_bytes <= local_bytes
    parts = dict(launch=4 * model.launch + 5 * model.torch_launch, memory=_stream(call, model),
                 setup=model.stream(bit_bytes) + n * model.atomic)
    narrow = 1.2 * model.gather(m, 0, on_chip=True) if local else model.gather(m, bit_bytes)
    if s <= 2:  # 8/16-bit integers: the whole range always fits
        return model.estimate(OP, "bitmap", triton=True, probes=narrow, **parts)
    # Wider integers: the range is data, measured on the device, and the model cannot see it.
    # With even odds of a narrow range (bitmap) and a wide one (the hash set's probes), the
    # expected cost is the mean; tuning measures the real data.
    wide = hash_(call, model, local_table_bytes=local_bytes).parts["probes"]
    parts.update(minmax=model.stream(n * s), probes=0.5 * (narrow + wide))
    notes = ("bitmap or hash set, decided on the device from the value range (no host sync)",
             "the model assumes even odds of a narrow range")
    return model.estimate(OP, "bitmap", triton=True, notes=notes, **parts)
