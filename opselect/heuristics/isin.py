"""Cost model of the isin backends: roofline terms per backend, in seconds.

M elements of s bytes are read and M bools written by every backend; they differ in the work done
per element (comparisons, dependent loads, probes) and the set-up (a sort, a table build, a sync).
"""

from __future__ import annotations

import math

OP = "isin"


def _stream(call, model) -> float:
    s = call.elements.dtype.itemsize
    return model.stream(call.m * (s + 1) + call.n * s)


def torch_(call, model):
    m, n, s = call.m, call.n, call.elements.dtype.itemsize
    if m == 0 or n == 0:
        return model.estimate(OP, "torch", triton=False, launch=model.launch)
    # ATen's rule (from numpy): a brute-force loop when N < 10 * M**0.145, sorting otherwise.
    if n < 10.0 * m ** 0.145:
        # One elementwise pass over the elements per test element.
        return model.estimate(OP, "torch", triton=False, launch=n * model.launch,
                              memory=n * model.stream(m * (s + 2)))
    # unique(elements, return_inverse) and unique(test) (each a sort with indices), then a sort of
    # both with indices and a scatter back to the elements' order: about four sorts of M + N.
    sorts = 2 * model.sort(m, s, 8) + model.sort(n, s, 0) + model.sort(m + n, s, 8)
    return model.estimate(OP, "torch", triton=False, sorts=sorts, launch=12 * model.launch,
                          memory=model.stream(m * (s + 1 + 16)))


def compare(call, model):
    return model.estimate(OP, "compare", triton=True, launch=model.launch, memory=_stream(call, model),
                          compares=call.m * max(call.n, 16) * model.compare)


def search(call, model):
    m, n, s = call.m, call.n, call.elements.dtype.itemsize
    steps = max(1, math.ceil(math.log2(max(n, 2)))) + 1
    # The top ~10 levels of the implicit search tree are shared by all lanes and stay in L1.
    cached = min(steps, 10)
    lookups = m * cached * model.gather_smem + model.gather(m * (steps - cached), n * s)
    return model.estimate(OP, "search", triton=True, sort=model.sort(n, s), launch=2 * model.launch,
                          memory=_stream(call, model), lookups=lookups)


def table_bytes(call) -> int:
    key_bytes = 8 if call.elements.dtype.itemsize == 8 else 4
    return (1 << max(4, (2 * call.n - 1).bit_length())) * key_bytes


def hash_(call, model, *, local_table_bytes: int):
    m, n = call.m, call.n
    t_bytes = table_bytes(call)
    local = t_bytes <= local_table_bytes
    # Linear probing at load factor 1/4..1/2: about 1.5 lookups per element on average, but a block
    # waits for its longest probe; 2 is the observed average per element.
    probes = 2.0 * (model.gather(m, 0, on_chip=True) if local else model.gather(m, t_bytes))
    if local:
        # Each program copies the table on chip before its blocks.
        programs = max(1, m // 8192)
        probes += model.stream(min(programs, 4 * model.sm_count) * t_bytes) * 0.25
    build = model.stream(t_bytes) + n * model.atomic + model.launch
    return model.estimate(OP, "hash", triton=True, launch=2 * model.launch,
                          memory=_stream(call, model), build=build, probes=probes)


def bitmap(call, model, *, needs_sync: bool, max_bits: int):
    m, n, s = call.m, call.n, call.elements.dtype.itemsize
    notes: tuple[str, ...] = ()
    parts = dict(launch=2 * model.launch, memory=_stream(call, model))
    if needs_sync:
        # The range is data: min/max on the device, then one host sync to size the bitmap. The
        # model cannot see the range, so it assumes one as wide as the test set is long (at worst
        # the backend falls back to hash above max_bits; measuring finds the narrow ranges).
        notes = ("syncs with the host to read the value range",
                 f"falls back to hash when the range exceeds {max_bits} values")
        parts.update(minmax=model.stream(n * s) + model.launch, sync=model.sync)
        bits = max(8 * n, 1 << 16)
    else:
        bits = 1 << (8 * s)
    bit_bytes = bits / 8
    parts.update(build=model.stream(bit_bytes) + n * model.atomic,
                 probes=model.gather(m, bit_bytes))
    return model.estimate(OP, "bitmap", triton=True, notes=notes, **parts)
