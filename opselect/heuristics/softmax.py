"""Cost model of softmax / log_softmax's Triton backends: roofline terms per backend, in seconds
(torch's own op: softmax_torch.py; what the two share: softmax_shared.py).

Every backend must read the input and write the output once (numel * (in + out) bytes); they differ
in how many more passes they make over the input (torch's long-row kernel reads a row three times,
online twice, the second time partly from L2), in how many programs keep the memory system busy
(one program per row cannot saturate HBM with 32 rows), and in per-tile latency (two block-wide
reductions per tile, which many-short-row calls pay millions of times).

The part named `launch` is host time (the model takes the longer of host and device): launches,
allocations, and under grad the autograd.Function and engine.

Under autograd (call.grad) tuning times the forward and the backward (kernels/softmax/autograd.py,
`_with_backward`), so every estimate adds its backward as parts named `backward*` (host time in
`launch`): the Triton backends' autograd.backward() reads y and dy and writes dx once, or sums in a
first pass and re-reads partly from L2 in a second (long rows, split rows, long strided dims);
torch's softmax_backward_data forms dy * y first (softmax only), reads it twice on the block and
spatial paths (a sum pass, a write pass), and on the spatial path walks the dim serially in each
thread (latency, not bandwidth). A narrowing dtype= cast done by torch first is undone on the
gradient. The autograd engine's own host time, the same whichever backend ran, is charged to all.

The constants are first guesses from the kernels' structure, except those fitted to measured
calls, which name their heading in benchmarks/results/h200/fits/softmax.md. `opselect calibrate`
fits one scale per backend on top; the tune cache replaces the model where a call was measured.
"""

from __future__ import annotations

import math

from .device_model import ALLOCATION, BOUND_LAUNCH
# (SHORT_DIM_MAX, SHORT_FWD_COLUMNS_MAX and single_warps for the kernels, as cost.<name>)
from .softmax_tiles import (SHORT_DIM_MAX, SHORT_FWD_COLUMNS_MAX, _cdiv, _pow2,  # noqa: F401
                            single_warps, strided_plan)
from .softmax_shared import AUTOGRAD_ENGINE_HOST, L2_USABLE, busy, input_copy, op_name, torch_launch

#: enable()'s eager softmax calls that torch's op answers before any key is made
#: (fronts/softmax.py): contiguous rows over the last dim of at most TORCH_ROWS_LENGTH elements,
#: no dtype, at most TORCH_ROWS_NUMEL elements in all, no forced backend, tuning off. Below
#: these the model's eager choice is torch on every GPU it knows (a launch-bound torch against
#: a Triton call's longer host time): over random such calls, the least with another choice
#: had 963,900 elements (A100, float64 rows), 2.5M on the H200; tests/test_cost_model.py
#: checks the bound on random calls. What it saves is the key and the route lookup, most of a
#: routed call's host time in a model's layer (docs/MODELS.md).
TORCH_ROWS_LENGTH = 1024
TORCH_ROWS_NUMEL = 1 << 18

#: Latency of one fused tile (load, two block reductions, store) others cannot overlap, and of a
#: multirow tile (its reductions stay inside a warp or two).
FUSED_TILE_S = 0.6e-6
MULTIROW_TILE_S = 0.4e-6
#: A strided program's step over a tile of a dim too long for its registers (load, online
#: update; H200: few programs of long columns; fits/softmax.md, "Few long columns: the split").
STRIDED_STEP_S = 1.08e-6
#: A split strided call took STRIDED_SPLIT_SLOW times the terms above plus STRIDED_SPLIT_FIXED_S
#: of device time (H200, fitted on 74 timings of 19 calls of 10-400 MB, median error 7%): the
#: second launch re-reads the columns at short-segment grain, waits for the first to drain, and
#: merges each column's chunks (fits/softmax.md, "Few long columns: the split").
STRIDED_SPLIT_SLOW = 1.18
STRIDED_SPLIT_FIXED_S = 15.5e-6
#: Strided splits (strided_splits): chunks of about SPLIT_ROWS rows of the dim, at most
#: SPLITS_MAX of them (the merge holds a column's partials in one tile), none shorter than
#: SPLIT_ROWS_MIN rows; none where the unsplit programs walk fewer than SPLIT_MIN_TILES tiles
#: (strided_walk_bound; about 15 us on the H200: the second launch costs more than it saves).
SPLIT_ROWS = 1024
SPLIT_ROWS_MIN = 256
SPLITS_MAX = 128
SPLIT_MIN_TILES = 14
#: A forward split puts at most this many programs an SM in all: its merge reads every chunk of
#: a column, and on 5 calls of 133-300 column blocks 64 an SM lost 1.1-1.35x to 16 (the backward's
#: merge is a sum: it takes chunks of SPLIT_ROWS however many).
SPLIT_PROGRAMS_PER_SM = 16
UNALIGNED_EFF = 0.85  # rows off the 16-byte grid (no vector access): of the aligned rate
TRITON_EFF = 0.92  # of the copy bandwidth, a single-pass Triton kernel
#: Host seconds of a Triton backend's call beyond its launches and allocations: what a repeated
#: fused call took beyond them (fits/softmax.md, "TRITON_GLUE_HOST").
TRITON_GLUE_HOST = 3.5e-6
#: Host seconds, forward and backward together (fits/softmax.md, "AUTOGRAD_HOST"): the Python
#: autograd.Function around the Triton backends (torch's is C++), beyond their launches and
#: allocations (the engine's own work: AUTOGRAD_ENGINE_HOST, charged to every backend).
AUTOGRAD_HOST = 40e-6
# -- The backward under autograd ----------------------------------------------------------------
#: Host seconds of the Triton backward's Python (checks, layout arithmetic), timed with its launches
#: stubbed out (fits/softmax.md, "BWD_PYTHON_HOST"); its launches and allocations come on top.
BWD_PYTHON_HOST = 7e-6
#: autograd.backward holds rows up to this long in registers (y and dy: half the forward's limit);
#: longer rows take two passes, or are split over programs when rows are fewer than SMs.
BWD_SINGLE_MAX = 16384
BWD_SINGLE_MAX_F64 = 8192
#: Rows up to this long are packed many to a tile, as multirow does (common.MULTIROW_MAX).
BWD_MULTIROW_MAX = 256
#: Chunk of a row per step of the two-pass rows kernel (4096 there, 2048 for float64), and of the
#: split kernels (2048).
BWD_CHUNK = 4096
BWD_SPLIT_CHUNK = 2048
#: The lagged backward (kernels/softmax/lagged.py: BWD_LAG_SHAPE, the forward's limits): chunks of
#: this many bytes of y, its lag in programs, where it runs (2 to 128 chunks, 2,048 programs).
BWD_LAGGED_CHUNK, BWD_LAG = 8192, 384
LAGGED_MAX_SPLIT, LAGGED_MIN_PROGRAMS = 128, 2048
#: Elements a strided backward tile holds: half of common.TILE_MAX, as it holds y and dy.
BWD_STRIDED_TILE = 8192
#: The strided backward's rate of moving a byte, as a fraction of the forward's terms (short-segment
#: discount included), and the device time a split backward takes beyond its traffic (the second
#: launch waits for the first to drain): fitted on 30 prepared backwards of 17-700 us on the H200,
#: median error 7% (fits/softmax.md, "STRIDED_BWD_EFF").
STRIDED_BWD_EFF = 0.9
STRIDED_SPLIT_BWD_FIXED_S = 12e-6


def _host(call, model, *, kernels: int = 1, allocations: int = 1, in_place: bool = False) -> float:
    """Host seconds of a Triton backend: its launches (bound: kernels/_common.py), torch
    allocations, the cast or copy done by torch first (none where the kernel reads the layout
    in place), the autograd.Function, and the Python around them (TRITON_GLUE_HOST)."""
    host = TRITON_GLUE_HOST + kernels * BOUND_LAUNCH + allocations * ALLOCATION
    if call.cast_first or not (call.fast or in_place):
        host += torch_launch(model)
    if call.grad:
        host += AUTOGRAD_HOST
    return host


def _prepass(call, model) -> dict:
    """Device time of the torch cast (narrowing dtype=) or contiguous copy done first."""
    n = call.numel
    e_x = call.x.dtype.itemsize
    if call.cast_first:
        return {"cast": model.stream(n * (e_x + call.out_dtype.itemsize))}
    if not call.fast:
        return {"copy": input_copy(call, model, e_x)}
    return {}


def _aligned(call) -> bool:
    """Whether rows start 16-byte aligned (the kernels use vector loads then)."""
    step = call.n if call.inner == 1 else call.inner
    return (step * call.in_bytes) % 16 == 0


def vector_shift(call) -> int:
    """Elements per 16-byte vector (of the narrower dtype) where multirow and the cooperative kernel
    read packed rows off the grid in shifted vectors (common._shifted_rows); else 0."""
    if call.inner != 1 or _aligned(call) or (call.fast and call.so != call.n and call.outer > 1):
        return 0
    per_vector = 16 // min(call.in_bytes, call.out_dtype.itemsize)
    return per_vector if call.n >= 2 * per_vector else 0


def _resident(model, warps: int, elements: int, f64: bool) -> int:
    per_thread = elements / (warps * 32) * (2 if f64 else 1)
    regs = min(255, 8 * math.ceil((24 + 1.25 * per_thread) / 8))
    return model.sm_count * max(1, min(64 // warps, 65536 // (regs * 32 * warps), 16))


def _warps(elements: int) -> int:
    """common._warps: about 16 elements per thread, 1 to 16 warps."""
    return max(1, min(16, _pow2(elements) // 512))


# ---------------------------------------------------------------------------------------------
# Passes and splits of the strided kernels; the backward (call.grad)
# ---------------------------------------------------------------------------------------------
def strided_backward_plan(n: int, inner: int, outer: int, itemsize: int,
                          sm_count: int) -> tuple[int, int, bool]:
    """(inner_block, dim_block, single) of the strided backward: strided_plan with a tile of
    BWD_STRIDED_TILE."""
    return strided_plan(n, inner, outer, itemsize, sm_count, tile=BWD_STRIDED_TILE)


def forward_pass_bytes(e_in: int, e_out: int) -> float:
    """Bytes a pass of the two-pass strided forward moves per element, on average: the first
    reads x, the second reads it again and writes y."""
    return (2 * e_in + e_out) / 2


def backward_pass_bytes(log: bool, e_y: int, e_g: int, e_dx: int) -> float:
    """The same for the two-pass strided backward: the sum pass reads dy (and y for softmax),
    the second reads y and dy and writes dx."""
    return ((e_g if log else e_y + e_g) + e_y + e_g + e_dx) / 2


def strided_walk_bound(blocks: int, step_elements: int, tiles: int, sm_count: int,
                       bandwidth: float, element_bytes: float) -> bool:
    """Whether a strided call's programs (`blocks` of columns, unsplit) are worth splitting over
    the dim: each walks `tiles` tiles of step_elements, SPLIT_MIN_TILES or more, and the walk,
    not the memory, sets the time: the blocks are fewer than SMs, or all of them together move
    less in one STRIDED_STEP_S step of their walks than the memory (`bandwidth`, bytes a
    second) could in that time. element_bytes: what a pass moves per element, on average over
    the two (fits/softmax.md, "Few long columns: the split")."""
    if tiles < SPLIT_MIN_TILES:
        return False
    step_bytes = blocks * step_elements * element_bytes
    return blocks < sm_count or step_bytes < STRIDED_STEP_S * bandwidth * TRITON_EFF


def strided_splits(n: int, blocks: int, sm_count: int, *, forward: bool) -> int:
    """Chunks of the dim for a walk-bound strided call (strided_walk_bound) of `blocks` column
    blocks, forward or backward; 0: none. Chunks of about SPLIT_ROWS rows, at least two
    programs an SM, at most SPLITS_MAX chunks, none shorter than SPLIT_ROWS_MIN; a forward's
    programs at most SPLIT_PROGRAMS_PER_SM an SM."""
    least = _cdiv(2 * sm_count, blocks)
    splits = max(_cdiv(n, SPLIT_ROWS), least)
    if forward:
        splits = min(splits, max(_cdiv(SPLIT_PROGRAMS_PER_SM * sm_count, blocks), least))
    splits = min(splits, SPLITS_MAX, _cdiv(n, SPLIT_ROWS_MIN))
    return splits if splits >= 2 else 0


def lagged_backward_split(call) -> int:
    """Chunks a row in the lagged backward (lagged.lagged_backward), 0 where it does not run."""
    split = _cdiv(call.n, BWD_LAGGED_CHUNK // call.out_dtype.itemsize)
    if call.f64 or not 1 < split <= LAGGED_MAX_SPLIT or call.outer * split < LAGGED_MIN_PROGRAMS:
        return 0
    return split


def _triton_backward(call, model) -> tuple[dict, float, str]:
    """Device parts, host seconds and a note of autograd.backward() on this call's output (the
    same kernels whichever Triton backend ran the forward); dx in the input's dtype, or the
    output's after torch's narrowing cast."""
    n, numel, outer, inner, f64 = call.n, call.numel, call.outer, call.inner, call.f64
    e_y = call.out_dtype.itemsize
    e_dx = e_y if call.cast_first else call.x.dtype.itemsize
    # What the sum pass reads, when the sum and dx take two passes: dy, and y for softmax.
    sum_bytes = e_y if call.log else 2 * e_y
    host = AUTOGRAD_ENGINE_HOST + BWD_PYTHON_HOST + BOUND_LAUNCH + torch_launch(model)  # dx
    parts: dict[str, float] = {}
    step = n if inner == 1 else inner
    eff = TRITON_EFF * (1.0 if (step * e_y) % 16 == 0 else UNALIGNED_EFF)
    latency, in_flight = 0.0, None  # in_flight: bytes the sum pass reads before they are re-read
    if inner > 1:
        block_i, block_n, single = strided_backward_plan(n, inner, outer, e_y, model.sm_count)
        programs = outer * _cdiv(inner, block_i)
        eff *= STRIDED_BWD_EFF
        if block_i < inner and block_i * e_y < 128:
            eff *= 0.6 + 0.4 * block_i * e_y / 128  # short segments, as the forward's
        note = "backward: strided tiles"
        if not single:
            tiles = 2 * _cdiv(n, block_n)
            splits = 0
            if strided_walk_bound(programs, block_i * block_n, tiles, model.sm_count,
                                  model.bandwidth, backward_pass_bytes(call.log, e_y, e_y, e_dx)):
                splits = strided_splits(n, programs, model.sm_count, forward=False)
            if splits:
                # Few long columns: the partial sums of each chunk, then dx (a second launch).
                programs *= splits
                in_flight = numel * sum_bytes
                tiles = 2 * _cdiv(_cdiv(n, splits), block_n)
                host += BOUND_LAUNCH + ALLOCATION
                parts["backward_split"] = STRIDED_SPLIT_BWD_FIXED_S
                note += ", the dim split over programs"
            else:
                in_flight = min(programs, 4 * model.sm_count) * n * block_i * sum_bytes
                note += ", two passes over the dim"
            # Each program's walk over its tiles (the forward's STRIDED_STEP_S).
            resident = _resident(model, _warps(block_n * block_i), 2 * block_n * block_i, f64)
            latency = math.ceil(programs / resident) * tiles * STRIDED_STEP_S
    elif n > BWD_SINGLE_MAX and (split := lagged_backward_split(call)):
        # One read from memory, one from L2 (lag rows later), one write; nothing waits.
        programs = (outer + max(1, min(outer, _cdiv(BWD_LAG, split)))) * split
        eff = TRITON_EFF * LAGGED_EFF * (1.0 if _aligned(call) or vector_shift(call) else
                                         UNALIGNED_EFF)
        note = "backward: lagged rows (a row's sum gathered while later rows are read)"
    elif n > (BWD_SINGLE_MAX_F64 if f64 else BWD_SINGLE_MAX) and outer < model.sm_count:
        split = max(1, min(_cdiv(2 * model.sm_count, outer), _cdiv(n, BWD_SPLIT_CHUNK)))
        chunk = _cdiv(_cdiv(n, split), BWD_SPLIT_CHUNK) * BWD_SPLIT_CHUNK
        programs = outer * _cdiv(n, chunk)
        # The sum kernel reads everything before the dx kernel re-reads it (in reverse order).
        in_flight = numel * sum_bytes
        host += BOUND_LAUNCH + torch_launch(model)  # the dx kernel, the partial sums
        note = "backward: rows split over programs (partial sums, then dx)"
    elif n > (BWD_SINGLE_MAX_F64 if f64 else BWD_SINGLE_MAX):
        chunk = BWD_CHUNK // 2 if f64 else BWD_CHUNK
        programs = outer
        resident = _resident(model, _warps(chunk), 2 * chunk, f64)
        in_flight = min(outer, resident) * n * sum_bytes
        note = "backward: two passes per row"
    else:
        bn = _pow2(n)
        block_r = 1
        if n <= BWD_MULTIROW_MAX:
            block_r = max(1, min((2048 if f64 else 4096) // bn, _pow2(outer)))
        tiles = _cdiv(outer, block_r)
        resident = _resident(model, _warps(block_r * bn), 2 * block_r * bn, f64)
        programs = min(tiles, resident)
        # A tile: two loads, one reduction, a store; about a forward tile's latency.
        latency = math.ceil(tiles / resident) * (MULTIROW_TILE_S if block_r > 1 else FUSED_TILE_S)
        note = "backward: rows in registers"
    reads = 2.0 * e_y
    if in_flight is not None:
        # The second pass re-reads what the first read; the part still in L2 costs no DRAM.
        reuse = min(1.0, L2_USABLE * model.l2_bytes / max(in_flight, 1))
        reads += (1.0 - reuse) * sum_bytes
        parts["backward_l2"] = numel * reuse * sum_bytes / model.l2_bandwidth
    memory = model.stream(numel * (reads + e_dx)) / (eff * busy(model, programs))
    parts["backward"] = max(memory, latency)
    if call.cast_first:
        # torch's .to() recorded the narrowing cast: its backward casts dx back to the input's.
        parts["backward_cast"] = model.stream(numel * (e_y + call.x.dtype.itemsize))
        host += torch_launch(model)
    return parts, host, note


def _triton_estimate(call, model, backend: str, host: float, parts: dict):
    """A Triton backend's estimate: its forward's parts and host time, plus the backward's under
    autograd."""
    notes: tuple[str, ...] = ()
    if call.grad:
        backward, bwd_host, note = _triton_backward(call, model)
        parts = {**parts, **backward}
        host += bwd_host
        notes = (note,)
    return model.estimate(op_name(call), backend, triton=True, notes=notes, launch=host, **parts)


def fused(call, model, *, warps: int):
    op = op_name(call)
    host = _host(call, model)
    if call.numel == 0:
        return model.estimate(op, "fused", triton=True, launch=host)
    parts = _prepass(call, model)
    resident = _resident(model, warps, _pow2(call.n), call.f64)
    eff = TRITON_EFF * busy(model, min(call.outer, resident))
    eff *= 1.0 if _aligned(call) else UNALIGNED_EFF
    memory = model.stream(call.numel * (call.in_bytes + call.out_dtype.itemsize)) / eff
    latency = math.ceil(call.outer / resident) * FUSED_TILE_S
    return _triton_estimate(call, model, "fused", host, {**parts, "memory": max(memory, latency)})


def multirow(call, model):
    op = op_name(call)
    host = _host(call, model)
    if call.numel == 0:
        return model.estimate(op, "multirow", triton=True, launch=host)
    parts = _prepass(call, model)
    bn = _pow2(call.n)
    block_r = max(1, min((2048 if call.f64 else 4096) // bn, _pow2(call.outer)))
    tiles = math.ceil(call.outer / block_r)
    resident = _resident(model, 4, block_r * bn, call.f64)
    eff = TRITON_EFF * busy(model, min(tiles, resident))
    eff *= 1.0 if _aligned(call) or vector_shift(call) else UNALIGNED_EFF
    memory = model.stream(call.numel * (call.in_bytes + call.out_dtype.itemsize)) / eff
    latency = math.ceil(tiles / resident) * MULTIROW_TILE_S
    return _triton_estimate(call, model, "multirow", host,
                            {**parts, "memory": max(memory, latency)})


#: Time a wave of cooperative programs of 16K-element chunks spends waiting for the row's other
#: chunks (fitted to 12 vocabulary rows, fits/softmax.md "online: the exchange") ...
COOP_WAIT_S = 1.75e-6
#: ... which scales with the chunk, as the sibling's load does (float64 chunks count double).
COOP_WAIT_CHUNK = 16384


#: The lagged kernel's rate, of a single-pass Triton kernel's (TRITON_EFF): each program reads
#: two chunks (one of them again, from L2) and holds both (fits/softmax.md, "online: lagged").
LAGGED_EFF = 0.88


def online(call, model, *, split: int, cooperative: bool = False,
           chunk: int = COOP_WAIT_CHUNK, lagged: int = 0):
    """lagged: the lagged kernel's rows of programs past the last row (0: not lagged): one read
    from memory, one from L2, one write; nothing waits; its words are the stream's, kept."""
    op = op_name(call)
    if lagged or cooperative:
        # One read and one write. Cooperative: a row's programs wait for each other, a few us
        # per wave of rows. Its partial sums and counters (lagged: its words) are the stream's.
        host = _host(call, model, kernels=1, allocations=1)
        if call.numel == 0:
            return model.estimate(op, "online", triton=True, launch=host)
        parts = _prepass(call, model)
        programs = (call.outer + lagged) * split
        vectors = _aligned(call) or vector_shift(call)
        eff = (TRITON_EFF * (LAGGED_EFF if lagged else 1.0) * busy(model, programs)
               * (1.0 if vectors else UNALIGNED_EFF))
        parts["memory"] = model.stream(call.numel * (call.in_bytes + call.out_dtype.itemsize)) / eff
        if not lagged:
            parts["sync"] = (COOP_WAIT_S * chunk / COOP_WAIT_CHUNK
                             * math.ceil(programs / (2 * model.sm_count)))
        return _triton_estimate(call, model, "online", host, parts)
    if split == 1:
        host = _host(call, model)
    else:  # two kernels, the output and two workspaces
        host = _host(call, model, kernels=2, allocations=3)
    if call.numel == 0:
        return model.estimate(op, "online", triton=True, launch=host)
    parts = _prepass(call, model)
    e_in, e_out = call.in_bytes, call.out_dtype.itemsize
    usable = L2_USABLE * model.l2_bytes
    if split == 1:
        programs = call.outer
        # Rows in flight while a program re-reads its own row (backwards, last chunks first).
        in_flight = min(call.outer, 2 * model.sm_count) * call.n * e_in
    else:
        programs = call.outer * split
        # The stats kernel reads everything before the normalising kernel re-reads it (reversed).
        in_flight = call.numel * e_in
    reuse = min(1.0, usable / max(in_flight, 1))
    eff = TRITON_EFF * busy(model, programs) * (1.0 if _aligned(call) else UNALIGNED_EFF)
    parts["memory"] = model.stream(call.numel * ((2.0 - reuse) * e_in + e_out)) / eff
    parts["l2"] = call.numel * reuse * e_in / model.l2_bandwidth
    return _triton_estimate(call, model, "online", host, parts)


def strided(call, model, *, block_i: int, single: bool, view: tuple, steps: int = 0,
            splits: int = 0, warps: int = 8, block_n: int = 1):
    """view: (outer, inner, alignment in elements) of what the kernel reads, x's columns in place
    where call.columns (no copy first). A dim too long for registers (not single) is walked in
    `steps` tiles of block_n x block_i a program, one after another: with few programs that
    walk, not the bandwidth, sets the time (STRIDED_STEP_S). splits: the dim in that many
    chunks of programs of their own, two launches (the chunks' statistics, then the writes)."""
    op, (outer, inner, align), columns = op_name(call), view, call.columns is not None
    host = _host(call, model, in_place=columns, kernels=2 if splits else 1,
                 allocations=2 if splits else 1)
    if call.numel == 0:
        return model.estimate(op, "strided", triton=True, launch=host)
    parts = {} if columns else _prepass(call, model)
    e_in, e_out = call.in_bytes, call.out_dtype.itemsize
    programs = outer * math.ceil(inner / block_i) * max(1, splits)
    if single:
        reads = 1.0
    else:
        # The second pass re-reads what the programs in flight read (all of it, split).
        in_flight = (call.numel if splits else
                     min(programs, 4 * model.sm_count) * call.n * block_i) * e_in
        reuse = min(1.0, L2_USABLE * model.l2_bytes / in_flight)
        reads = 2.0 - reuse
        parts["l2"] = call.numel * reuse * e_in / model.l2_bandwidth
    eff = TRITON_EFF * busy(model, programs) * (1.0 if align * e_in >= 16 else UNALIGNED_EFF)
    if block_i < inner and block_i * e_in < 128:
        # Row segments shorter than a 128-byte line: neighbouring programs read the line's other
        # sectors, mostly from L2, at some cost.
        eff *= 0.6 + 0.4 * block_i * e_in / 128
    parts["memory"] = model.stream(call.numel * (reads * e_in + e_out)) / eff
    if splits:
        parts["memory"] *= STRIDED_SPLIT_SLOW
        parts["l2"] *= STRIDED_SPLIT_SLOW
        parts["split_merge"] = STRIDED_SPLIT_FIXED_S
    if not single:
        # The programs' walks overlap the traffic: the longer of the two sets the time.
        resident = _resident(model, warps, block_n * block_i, call.f64)
        walk = math.ceil(programs / resident) * steps * STRIDED_STEP_S
        if walk > parts["memory"] + parts["l2"]:
            del parts["memory"], parts["l2"]
            parts["walk"] = walk
    return _triton_estimate(call, model, "strided", host, parts)
