"""topk's radix backend: a sampled threshold, a filter pass that keeps the survivors, and a finisher
that selects and sorts the k winners (one launch per row, cooperative, or split in two)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch
import triton
import triton.language as tl

from ...heuristics import topk as cost
from .._common import allocator, cdiv, next_pow2
from .call import TopkCall, _output_maker, _output_finisher, _reader
from .common import (COOP_ALLOWED, COUNTERS, MAX_ROW, SPIN_LIMIT, _PlannedBackend, _key64,
                     _key_limits, _kth, _order_key, _row_buffers, _row_stride, _select,
                     _src_tile, _store_winners, _typed, _write_out, check_config,
                     plan_launcher)


# The largest sample block (samples_per_block_max's default): samples are drawn in blocks of
# at most this many (see radix_plan for the block sizes and how many blocks a row draws).
SAMPLE_BLOCK = 2048


# The union of the per-block sample tops that every filter program searches (one register tile).
UNION_MAX = 4096


UNION: tl.constexpr = tl.constexpr(UNION_MAX)


# Keys each sample block keeps (its top); more when the threshold's rank needs them.
BLOCK_TOPS = 16


# Survivors the finisher holds in registers at once; rows up to this long skip sample + filter.
FINISH_TILE_MAX = 8192


# k up to this is sorted in registers by the finisher (networks of 64, 256 or 1024: one compiled
# variant each); larger k and 64-bit keys are sorted by torch.sort afterwards.
SORT_MAX = 1024


# Margins (in standard deviations, plus a constant) of the sample threshold.
SIGMAS = 5.0


@triton.jit
def _sample_keys(x_ptr, row_off, r, N, s, samples_per_block: tl.constexpr,
                 is_float: tl.constexpr, flip, key64: tl.constexpr):
    """Keys of samples_per_block sample positions of row r (block s of its sample). A Weyl
    sequence frac(i / phi + c_r) is equidistributed modulo every period, so periodic rows are
    sampled fairly; positions may repeat, the margins of the threshold allow for it."""
    i = (s * samples_per_block + tl.arange(0, samples_per_block)).to(tl.int64)
    h = (i * 2654435769 + r.to(tl.int64) * 1640531527 + 12345) & 0xFFFFFFFF
    pos = ((h >> 1) * N) >> 31  # (h / 2^32) * N without overflowing int64
    x = tl.load(x_ptr + row_off + pos)
    return _order_key(x, is_float, flip, key64)


@triton.jit
def _mth_largest(keys, ok, m, key64: tl.constexpr):
    """A threshold that at least m of the valid keys of a register tile reach (the m-th
    largest, or a value exactly m reach: see _kth): the same 4-ary search as the finisher's, so
    no sorting network is compiled for it. With fewer than m valid keys it returns their
    minimum (a lower threshold is always safe)."""
    lowest, highest = _key_limits(key64)
    lo = tl.min(tl.where(ok, keys, highest), axis=0).to(tl.int64)
    hi = tl.max(tl.where(ok, keys, lowest), axis=0).to(tl.int64)
    return _kth(keys, ok, m, lo, hi).to(keys.dtype)


@triton.jit
def _take_threshold(sbuf, sidx, n_gt, k, survivor_capacity, out_row,
                    PACK: tl.constexpr, finish_tile: tl.constexpr, key64: tl.constexpr):
    """Fewer than k keys exceed the threshold T but at least k reach it: the k-th key is T.
    Take every survivor (slots [0, n_gt)) and the first k - n_gt ties (slots from
    survivor_capacity)."""
    for start in range(0, n_gt, finish_tile):
        key, idx, ok = _src_tile(sbuf, 0, sbuf, sidx, start, n_gt, False, finish_tile, False, 0,
                                 key64)
        _store_winners(out_row + start, tl.arange(0, finish_tile), ok, key, idx, PACK)
    quota = k - n_gt
    for start in range(0, quota, finish_tile):
        key, idx, ok = _src_tile(sbuf, 0, sbuf + survivor_capacity, sidx + survivor_capacity,
                                 start, quota, False, finish_tile, False, 0, key64)
        _store_winners(out_row + n_gt + start, tl.arange(0, finish_tile), ok, key, idx, PACK)


@triton.jit
def _finish_row(x_ptr, r, row_off, N, k, ws_ptr, off_sbuf, off_sidx, survivor_capacity,
                tie_capacity, n_gt, n_eq, T, val_ptr, idx_ptr,
                FILTERED: tl.constexpr, sort_in_kernel: tl.constexpr, k_padded: tl.constexpr,
                finish_tile: tl.constexpr, is_float: tl.constexpr, flip, key64: tl.constexpr):
    """Select row r's k winners (from its survivors, from the threshold's ties, or from the
    whole row), then write them out sorted or not."""
    r64 = r.to(tl.int64)
    out_off = r64 * k
    idx_row = idx_ptr + out_off
    sbuf, sidx = _row_buffers(ws_ptr, off_sbuf, off_sidx, r64, survivor_capacity, tie_capacity,
                              key64)
    if FILTERED:
        kept = n_gt <= survivor_capacity
        # Usually the k-th key is among the few thousand survivors above T. If the sample was
        # off (fewer than k keys reach T, or the buffer overflowed) the whole row is the source.
        use_buf = kept & (n_gt >= k)
        if kept & (n_gt < k) & (n_gt + n_eq >= k):
            _take_threshold(sbuf, sidx, n_gt, k, survivor_capacity, idx_row, sort_in_kernel,
                            finish_tile, key64)
        else:
            _select(x_ptr, row_off, sbuf, sidx, tl.where(use_buf, n_gt, N), k,
                    T.to(tl.int64) + 1, ~use_buf, idx_row, sort_in_kernel, finish_tile, is_float,
                    flip, key64)
    else:
        _select(x_ptr, row_off, sbuf, sidx, N, k, tl.full([], 0, tl.int64), True, idx_row,
                sort_in_kernel, finish_tile, is_float, flip, key64)
    tl.debug_barrier()  # the winners written by all threads are visible to all threads
    _write_out(x_ptr, row_off, idx_row, val_ptr + out_off, k, sort_in_kernel, k_padded,
               finish_tile)


@triton.jit
def _filter_tile(x, ok, tile_ptr, tile_start, valid, T, sbuf, sidx, cnt_ptr, n_gt, n_eq,
                 survivor_capacity, tie_capacity, unit, ATOMIC: tl.constexpr,
                 tile: tl.constexpr, subtile: tl.constexpr, is_float: tl.constexpr, flip,
                 key64: tl.constexpr):
    """One tile of the filter: keys > T to the survivor slots [0, survivor_capacity) of the row's
    buffer, keys == T to its tie slots from survivor_capacity (tie_capacity of them). Both flags
    travel in one int32 (bits 0 and 16): one reduction counts both kinds, one cumsum ranks both.

    A tile without survivors stops after that one count, so the loop holds only the tile and
    its keys. A tile with survivors (usually one or two: a row keeps a few thousand) marks its
    parts (subtile lanes each) that have some in a bitmask (one small reduction); only those
    parts re-read their elements (from L1) and rank and scatter them, one per thread. So the
    scatter never needs the whole tile's registers nor a layout conversion of the tile, and a
    survivor costs about one part's reload, cumsum and store."""
    key = _order_key(x, is_float, flip, key64)
    code = ((key > T) & ok).to(tl.int32) | (((key == T) & ok).to(tl.int32) << 16)
    total = tl.sum(code, axis=0)
    c_gt = total & 0xFFFF
    c_eq = total >> 16
    if total > 0:
        if ATOMIC:
            # One atomic per tile and kind reserves the tile's slots in the row's buffer.
            base = tl.atomic_add(cnt_ptr, c_gt.to(tl.int64), mask=c_gt > 0, sem="relaxed")
            base_eq = tl.atomic_add(cnt_ptr + 1, c_eq.to(tl.int64), mask=c_eq > 0, sem="relaxed")
        else:
            base = n_gt
            base_eq = n_eq
        NSUB: tl.constexpr = tile // subtile
        busy = tl.max(tl.reshape(code, [NSUB, subtile]), axis=1) > 0
        parts_mask = tl.sum(tl.where(busy, 1 << tl.arange(0, NSUB).to(tl.int64), 0), axis=0)
        lane = tl.arange(0, subtile) * unit
        room = tl.maximum(tl.minimum(survivor_capacity - base, tile), 0).to(tl.int32)
        room_eq = tl.maximum(tl.minimum(tie_capacity - base_eq, tile), 0).to(tl.int32)
        prior = tl.full([], 0, tl.int32)  # packed ranks (bits 0 and 16) of earlier parts
        for j in range(NSUB):
            if ((parts_mask >> j) & 1) != 0:
                sub_ok = lane < valid - j * subtile
                ks = _order_key(tl.load(tile_ptr + j * subtile + lane, mask=sub_ok, other=0),
                                is_float, flip, key64)
                gt = (ks > T) & sub_ok
                eq = (ks == T) & sub_ok
                sub_code = gt.to(tl.int32) | (eq.to(tl.int32) << 16)
                rank = prior + tl.cumsum(sub_code, axis=0)
                prior += tl.sum(sub_code, axis=0)
                pos = tl.where(gt, (rank & 0xFFFF) - 1, (rank >> 16) - 1)
                keep = tl.where(gt, pos < room, eq & (pos < room_eq))
                slot = tl.where(gt, base, survivor_capacity + base_eq) + pos
                idx = (tile_start + j * subtile).to(tl.int32) + lane  # the index's low 32 bits
                if key64:
                    tl.store(sbuf + slot, ks, mask=keep)
                    tl.store(sidx + slot, idx, mask=keep)
                else:
                    tl.store(sbuf + slot,
                             (ks.to(tl.int64) << 32) | (idx.to(tl.int64) & 0xFFFFFFFF),
                             mask=keep)
    return n_gt + c_gt, n_eq + c_eq


@triton.jit
def _filter_chunk(x_ptr, row_off, N, start, ntiles, T, sbuf, sidx, cnt_ptr, survivor_capacity,
                  tie_capacity, ATOMIC: tl.constexpr, tile: tl.constexpr,
                  subtile: tl.constexpr, is_float: tl.constexpr, flip, key64: tl.constexpr):
    """Stream ntiles tiles of a row from `start` through the filter (positions: one atomic
    per tile on the row's counters when several programs share the row, else running counts).
    The next tile is loaded before the current one is processed: two tiles per program in
    flight. Lanes are 32-bit offsets from a 64-bit scalar base."""
    # `unit` is 1 at run time but unknown to the compiler: the rare survivor parts then get one
    # element per thread per access (coalesced, 128 bytes per warp), the layout their
    # scattered stores need, so nothing goes through a layout conversion in shared memory.
    # The tiles themselves keep the vectorised layout of 16-byte loads.
    unit = (N >= 0).to(tl.int32)
    lane = tl.arange(0, tile)
    n_gt = tl.full([], 0, tl.int64)
    n_eq = tl.full([], 0, tl.int64)
    row_ptr = x_ptr + row_off
    valid = tl.maximum(tl.minimum(N - start, tile), 0).to(tl.int32)
    x = tl.load(row_ptr + start + lane, mask=lane < valid, other=0)
    for t in range(ntiles):
        tile_start = start + t * tile
        valid = tl.maximum(tl.minimum(N - tile_start, tile), 0).to(tl.int32)
        valid_next = tl.maximum(tl.minimum(N - tile_start - tile, tile), 0).to(tl.int32)
        valid_next = tl.where(t + 1 < ntiles, valid_next, 0)
        x_next = tl.load(row_ptr + tile_start + tile + lane, mask=lane < valid_next, other=0)
        n_gt, n_eq = _filter_tile(x, lane < valid, row_ptr + tile_start, tile_start, valid, T,
                                  sbuf, sidx, cnt_ptr, n_gt, n_eq, survivor_capacity,
                                  tie_capacity, unit, ATOMIC, tile, subtile, is_float, flip, key64)
        x = x_next
    return n_gt, n_eq


# ---------------------------------------------------------------------------------------------
# Kernels: the radix launches
# ---------------------------------------------------------------------------------------------
@triton.jit
def _sample_top(x_ptr, row_off, r, N, s, lists, samples_per_block: tl.constexpr,
                tops_per_sample_block: tl.constexpr, is_float: tl.constexpr, flip,
                key64: tl.constexpr):
    """Sample block s of row r: samples_per_block keys, of which the top tops_per_sample_block
    (in no order) go to the row's list (the threshold needs only the top of each block): the
    tops_per_sample_block-th largest by the same search as everywhere else, then the keys above
    it and enough of its ties, ranked by a cumsum."""
    keys = _sample_keys(x_ptr, row_off, r, N, s, samples_per_block, is_float, flip, key64)
    every = keys == keys
    t = _mth_largest(keys, every, tops_per_sample_block, key64)
    above = keys > t
    tied = keys == t
    rank = tl.where(above, tl.cumsum(above.to(tl.int32), axis=0),
                    tl.sum(above.to(tl.int32), axis=0) + tl.cumsum(tied.to(tl.int32), axis=0)) - 1
    tl.store(lists + s * tops_per_sample_block + rank, keys,
             mask=(above | tied) & (rank < tops_per_sample_block))


# Integer arguments that would otherwise be specialised (== 1, divisible by 16) into separate
# compiled variants: only the row length and stride matter to the code (16-byte loads).
_SIZES = ["k", "threshold_rank", "survivor_capacity", "tie_capacity", "tiles_per_program",
          "programs_per_row", "sample_blocks", "flip", "off_lists", "off_sbuf", "off_sidx"]


@triton.jit(do_not_specialize=_SIZES + ["N", "row_stride"])
def _radix_sample_kernel(x_ptr, ws_ptr, off_lists, N, row_stride, sample_blocks, flip,
                         samples_per_block: tl.constexpr, tops_per_sample_block: tl.constexpr,
                         is_float: tl.constexpr, key64: tl.constexpr):
    """The split mode's first launch: the sample blocks of every row."""
    r = tl.program_id(0)
    s = tl.program_id(1)
    r64 = r.to(tl.int64)
    if s == 0:
        # The row's counters start at zero before the filter launch adds to them.
        tl.store(ws_ptr + COUNTERS * r64 + tl.arange(0, COUNTERS),
                 tl.zeros([COUNTERS], tl.int64))
    lists = _typed(ws_ptr, off_lists, True, key64) + r64 * (sample_blocks * tops_per_sample_block)
    _sample_top(x_ptr, r64 * row_stride, r, N, s, lists, samples_per_block, tops_per_sample_block,
                is_float, flip, key64)


@triton.jit(do_not_specialize=_SIZES)
def _radix_filter_kernel(x_ptr, ws_ptr, off_lists, off_sbuf, off_sidx, val_ptr, idx_ptr,
                         N, row_stride, k, threshold_rank, survivor_capacity, tie_capacity,
                         tiles_per_program, programs_per_row, sample_blocks, flip,
                         coop: tl.constexpr, samples_per_block: tl.constexpr,
                         tops_per_sample_block: tl.constexpr, tile: tl.constexpr,
                         subtile: tl.constexpr, sort_in_kernel: tl.constexpr,
                         k_padded: tl.constexpr, finish_tile: tl.constexpr,
                         is_float: tl.constexpr, key64: tl.constexpr):
    """programs_per_row programs share row r, sample_blocks sample blocks (of
    tops_per_sample_block tops each) feed its threshold. Per row, int64 counters: survivors,
    ties, programs that sampled, programs that filtered, programs that gave up waiting.

    coop (one launch, sample_blocks == programs_per_row): each program first draws sample block
    p of its row, then waits until all programs of the row have (a spin on the row's counter;
    the launcher keeps the whole grid within one program per SM, so every program is resident
    and the wait ends).
    Otherwise a previous launch drew the samples. Each program then derives the same threshold
    from the union of the sample tops, filters its chunk, and the last program of the row to
    finish (a ticket) selects the k winners from the survivors: no launch waits for the slowest
    row."""
    r = tl.program_id(0)
    p = tl.program_id(1)
    r64 = r.to(tl.int64)
    row_off = r64 * row_stride
    cnt = ws_ptr + COUNTERS * r64
    lists = _typed(ws_ptr, off_lists, True, key64) + r64 * (sample_blocks * tops_per_sample_block)
    ready = True
    if coop:
        _sample_top(x_ptr, row_off, r, N, p, lists, samples_per_block, tops_per_sample_block,
                    is_float, flip, key64)
        tl.debug_barrier()  # every thread's list stores precede the release below
        tl.atomic_add(cnt + 2, 1, sem="release")
        arrived = tl.atomic_add(cnt + 2, 0, sem="acquire")
        polls = tl.full([], 0, tl.int32)
        while (arrived < programs_per_row) & (polls < SPIN_LIMIT):
            arrived = tl.atomic_add(cnt + 2, 0, sem="acquire")
            polls += 1
        ready = arrived >= programs_per_row
        if arrived < programs_per_row:
            # Programs of the row that never became resident (another stream's persistent
            # kernel holding SMs?): stop waiting, mark the row, and let the finisher select
            # from the whole row. Slow, but it cannot hang.
            tl.atomic_add(cnt + 4, 1, sem="relaxed")
    j = tl.arange(0, UNION)
    used = j < sample_blocks * tops_per_sample_block
    tops = tl.load(lists + j, mask=used, other=0, cache_modifier=".cg")
    T = _mth_largest(tops, used, threshold_rank, key64)
    sbuf, sidx = _row_buffers(ws_ptr, off_sbuf, off_sidx, r64, survivor_capacity, tie_capacity,
                              key64)
    if ready:
        _filter_chunk(x_ptr, row_off, N, p.to(tl.int64) * tiles_per_program * tile,
                      tiles_per_program, T, sbuf, sidx, cnt, survivor_capacity, tie_capacity,
                      True, tile, subtile, is_float, flip, key64)
    tl.debug_barrier()  # every thread's survivor stores precede the release below
    ticket = tl.atomic_add(cnt + 3, 1, sem="acq_rel")
    if ticket == programs_per_row - 1:
        n_gt = tl.atomic_add(cnt, 0, sem="acquire")
        n_eq = tl.atomic_add(cnt + 1, 0, sem="acquire")
        if coop:
            # A marked row reads as an overflowing buffer: the finisher takes the whole row.
            n_gt = tl.where(tl.atomic_add(cnt + 4, 0, sem="acquire") > 0, survivor_capacity + 1,
                            n_gt)
        _finish_row(x_ptr, r, row_off, N, k, ws_ptr, off_sbuf, off_sidx, survivor_capacity,
                    tie_capacity, n_gt, n_eq, T, val_ptr, idx_ptr,
                    True, sort_in_kernel, k_padded, finish_tile, is_float, flip, key64)


@triton.jit(do_not_specialize=["N", "row_stride", "k", "flip"])
def _radix_direct_kernel(x_ptr, val_ptr, idx_ptr, N, row_stride, k, flip,
                         sort_in_kernel: tl.constexpr, k_padded: tl.constexpr,
                         finish_tile: tl.constexpr, is_float: tl.constexpr,
                         key64: tl.constexpr):
    """Rows short enough for one tile: one program per row selects from the row itself."""
    r = tl.program_id(0)
    r64 = r.to(tl.int64)
    zero = tl.full([], 0, tl.int64)
    if key64:
        T = zero
    else:
        T = zero.to(tl.int32)
    _finish_row(x_ptr, r, r64 * row_stride, N, k, idx_ptr, 0, 0, 0, 0, zero, zero, T,
                val_ptr, idx_ptr, False, sort_in_kernel, k_padded, finish_tile, is_float, flip,
                key64)


@triton.jit(do_not_specialize=_SIZES)
def _radix_rows_kernel(x_ptr, ws_ptr, off_sbuf, off_sidx, val_ptr, idx_ptr,
                       N, row_stride, k, threshold_rank, survivor_capacity, tie_capacity, flip,
                       samples_per_block: tl.constexpr, tile: tl.constexpr,
                       subtile: tl.constexpr, sort_in_kernel: tl.constexpr,
                       k_padded: tl.constexpr, finish_tile: tl.constexpr,
                       is_float: tl.constexpr, key64: tl.constexpr):
    """Sample, filter and finish one row in one program: many rows, one launch."""
    r = tl.program_id(0)
    r64 = r.to(tl.int64)
    row_off = r64 * row_stride
    keys = _sample_keys(x_ptr, row_off, r, N, 0, samples_per_block, is_float, flip, key64)
    T = _mth_largest(keys, keys == keys, threshold_rank, key64)
    sbuf, sidx = _row_buffers(ws_ptr, off_sbuf, off_sidx, r64, survivor_capacity, tie_capacity,
                              key64)
    n_gt, n_eq = _filter_chunk(x_ptr, row_off, N, tl.full([], 0, tl.int64),
                               tl.cdiv(N, tile), T, sbuf, sidx, ws_ptr, survivor_capacity,
                               tie_capacity, False, tile, subtile, is_float, flip, key64)
    tl.debug_barrier()  # the buffers written by all threads are read by all threads
    _finish_row(x_ptr, r, row_off, N, k, ws_ptr, off_sbuf, off_sidx, survivor_capacity,
                tie_capacity, n_gt, n_eq, T, val_ptr, idx_ptr,
                True, sort_in_kernel, k_padded, finish_tile, is_float, flip, key64)


# Each kernel's launches: Triton binds the arguments once per plan, later calls go straight to
# the compiled kernel (see Launcher: a call's host time is part of what a user waits for). The
# plan is the spec: made per call's sizes, dtype, layout and direction, it fixes every integer
# argument Triton specialises on, every constexpr (each the plan's field of its name) and the
# warps.
_RADIX_SAMPLE = plan_launcher(_radix_sample_kernel, num_warps="sample_warps")
_RADIX_FILTER = plan_launcher(_radix_filter_kernel)
_RADIX_DIRECT = plan_launcher(_radix_direct_kernel)
_RADIX_ROWS = plan_launcher(_radix_rows_kernel)


#: The config keys radix_plan reads (any other is refused: see check_config).
CONFIG_KEYS = frozenset({
    "coop",  # several programs per row in one launch that wait for each other (else split)
    "tile",  # elements a filtering program loads at once (before the warps' minimum)
    "subtile",  # elements of a tile re-read together where it has survivors
    "fused_tile",  # the tile of the fused mode (one program per row)
    "programs_per_sm",  # split mode: filtering programs per SM in all
    "one_program_per_row",  # True: one program per row (the fused mode) whatever the rows
    "samples_per_block_max",  # the largest sample block (sizes are quantised up to it)
    "finish_tile_max",  # the largest finisher tile; rows up to it skip sample and filter
    "num_warps",  # warps of the coop mode's programs
    "sm_count",  # SMs to plan for, in place of the device's (interpreter configs)
    "exact_sizes",  # sizes to the next power of two, not to the few compiled ones
})


@dataclass(frozen=True, eq=False)
class RadixPlan:
    """Launch parameters of the radix backend for one (R, N, k, dtype, layout, direction,
    config): every launch's spec (see the Launchers above).

    mode: direct (rows of one tile: one program per row selects from the row), fused (one
    program per row samples, filters and finishes), coop (several programs per row, one launch,
    a per-row wait after sampling) or split (the same in two launches: samples, then filter)."""

    mode: str = ""  # direct, fused, coop or split (see above)
    samples_per_block: int = 0  # elements each sampling block draws
    sample_blocks: int = 0  # sampling blocks per row
    tops_per_sample_block: int = 0  # largest keys each sampling block keeps for the threshold
    # the threshold is the m-th largest sample (k scaled to the sample, plus a margin)
    threshold_rank: int = 0
    programs_per_row: int = 0  # filtering programs per row
    tiles_per_program: int = 0  # tiles each filtering program streams
    tile: int = 0  # elements a program loads at once
    subtile: int = 0  # elements compared against the threshold at once within a tile
    survivor_capacity: int = 0  # survivors (keys above the threshold) a row's buffer holds
    tie_capacity: int = 0  # keys equal to the threshold a row's buffer holds
    finish_tile: int = 0  # survivors the finisher holds in registers at once (a compiled size)
    k_padded: int = 0  # k rounded up to a compiled sorting-network size
    sort_in_kernel: bool = False  # the finisher sorts the k winners
    sort_after: bool = False  # torch.sort orders them afterwards (64-bit keys, k past SORT_MAX)
    expected_survivors: int = 0  # survivors the model expects per row
    sampled_elements: int = 0  # elements sampled per row (0: no sampling)
    # int64 offsets of the workspace's parts (lists, sbuf, sidx)
    workspace_offsets: dict = field(default_factory=dict)
    workspace_elements: int = 0  # int64 elements of the workspace
    num_warps: int = 0  # warps of the filtering / finishing programs
    sample_warps: int = 4  # warps of the split mode's sampling launch
    is_float: bool = False  # floating-point keys (their bits are reordered to compare as integers)
    key64: bool = False  # 64-bit keys (indices kept apart from them)
    row_stride: int = 0  # elements between the rows the kernels read
    flip: int = 0  # 0, or -1 for the smallest k (complements every key: see _order_key)

    @property
    def coop(self) -> bool:
        """The filter kernel's programs of a row sample, then wait for each other (one launch)."""
        return self.mode == "coop"


def _margin(mu: float) -> int:
    return math.ceil(mu + SIGMAS * math.sqrt(mu) + SIGMAS)


def _quantize(n: int, steps: tuple[int, ...]) -> int:
    """The first of steps at least n (the last if none): few distinct constexprs, so few
    compiled variants (each costs tens of seconds of compilation on first use)."""
    for step in steps:
        if n <= step:
            return step
    return steps[-1]


def radix_plan(R: int, N: int, k: int, dtype: torch.dtype, sorted_: bool, sms: int,
               config: dict, *, row_stride: int | None = None,
               largest: bool = True) -> RadixPlan:
    """The plan of R rows of N (row_stride apart: N by default), k of each, largest or not."""
    check_config("topk radix", config, CONFIG_KEYS)
    key64 = _key64(dtype)
    p = SimpleNamespace()  # filled below, frozen at the end
    p.is_float, p.key64 = dtype.is_floating_point, key64
    p.row_stride, p.flip = N if row_stride is None else row_stride, 0 if largest else -1
    R, N, k = max(R, 1), max(N, 1), max(k, 1)  # empty calls never launch; the plan must exist
    sms = config.get("sm_count", sms)
    ft_max = config.get("finish_tile_max", FINISH_TILE_MAX)
    block = config.get("samples_per_block_max", SAMPLE_BLOCK)
    coop = config.get("coop", True)
    if config.get("exact_sizes"):
        # Sizes to the next power of two (the interpreter: no compiling, small networks).
        tiles_ft = tuple(1 << i for i in range(4, ft_max.bit_length() - 1)) + (ft_max,)
        kps = tuple(1 << i for i in range(11))
    else:
        # Each distinct constexpr is a compiled variant (10-20 s of compiling on first use):
        # few sizes, at some cost in padding (a longer sort, a half-empty tile).
        tiles_ft = tuple(t for t in (256, 1024, 4096, 8192) if t < ft_max) + (ft_max,)
        kps = (64, 1024)
    p.tile = config.get("tile", 8192 if coop else 4096)
    p.subtile = min(p.tile, config.get("subtile", 512))
    p.k_padded = _quantize(max(k, 1), kps)
    p.sort_in_kernel = sorted_ and not key64 and k <= SORT_MAX
    p.sort_after = sorted_ and not p.sort_in_kernel
    p.tie_capacity = max(k, 1)
    p.threshold_rank = p.samples_per_block = p.sample_blocks = p.tops_per_sample_block = 1
    p.programs_per_row = p.tiles_per_program = p.survivor_capacity = 1
    p.sampled_elements = 0
    p.mode = "direct"
    p.finish_tile = _quantize(N, tiles_ft)
    p.expected_survivors = N
    if N > ft_max:
        tiles = cdiv(N, p.tile)
        if config.get("one_program_per_row") or R >= sms:
            B = 1
        elif coop:
            B = max(1, min(tiles, sms // R))  # the whole grid resident: one program per SM
        else:
            B = max(1, min(tiles, cdiv(sms * config.get("programs_per_sm", 4), R)))
        p.tiles_per_program = cdiv(tiles, B)
        B = cdiv(tiles, p.tiles_per_program)
        # Each sampled element costs a 32-byte sector: at most 1/32 of the row, and beyond 64
        # blocks at most 1/256 of it (about 3% of the row's traffic).
        s_target = min(max(block, N // 32), max(64 * block, N // 256))
        sizes = tuple(t for t in (256, 1024) if t < block) + (block,)
        if B == 1:
            # One block of samples, at most 16 per thread of a 4-warp program.
            mode, samples_per_block, sample_blocks = "fused", _quantize(s_target, sizes), 1
        elif coop:
            mode, sample_blocks = "coop", B
            samples_per_block = _quantize(cdiv(s_target, B), sizes)
        else:
            mode, samples_per_block = "split", block
            sample_blocks = min(64, next_pow2(cdiv(s_target, block)))
        sampled = samples_per_block * sample_blocks
        f = sampled / N
        m = _margin((k - 1) * f)
        if mode == "fused":
            tops = 1
            fits = 2 * m <= samples_per_block
        else:
            tops = min(samples_per_block, max(BLOCK_TOPS, next_pow2(cdiv(2 * m, sample_blocks))))
            fits = 2 * m <= sample_blocks * tops <= UNION_MAX
        cap = math.ceil((m + SIGMAS * math.sqrt(m) + SIGMAS) / f) + 64
        if fits and cap < N // 2:
            p.mode, p.samples_per_block, p.sample_blocks = mode, samples_per_block, sample_blocks
            p.tops_per_sample_block, p.threshold_rank, p.programs_per_row = tops, m, B
            p.sampled_elements = sampled
            p.survivor_capacity = max(cap, k)
            p.expected_survivors = min(N, math.ceil(m / f))
            p.finish_tile = _quantize(p.survivor_capacity, tiles_ft)
            if mode == "fused":
                # One program per row, several per SM: small tiles and few warps, so that
                # one row's sampling and finishing overlap other rows' streaming.
                p.tile = config.get("fused_tile", 2048)
                p.subtile = min(p.tile, p.subtile)
                p.tiles_per_program = cdiv(N, p.tile)
        else:
            # k is a large part of the row: no threshold filters well; select from the rows.
            p.tiles_per_program = 1
            p.finish_tile = ft_max
    # The workspace (int64 elements): counters [R, 8], sample tops [R, sample_blocks *
    # tops_per_sample_block] keys, the survivor buffer [R, survivor_capacity + tie_capacity]
    # int64 and, for 64-bit keys, its indices as int32.
    slots = R * (p.survivor_capacity + p.tie_capacity)
    counters = int(COUNTERS) * R
    offs = {"lists": counters}
    lists = R * p.sample_blocks * p.tops_per_sample_block if p.mode in ("coop", "split") else 0
    off = counters + math.ceil(lists * (1 if key64 else 0.5))
    offs["sbuf"] = off
    off += slots
    offs["sidx"] = off
    off += math.ceil(slots / 2) if key64 else 0
    p.workspace_offsets = offs
    p.workspace_elements = 0 if p.mode == "direct" else off
    # At most 16 elements of a tile per thread (more spill); the coop finisher lives with the
    # filter's warps, so its tile shrinks to fit them (longer survivor lists loop over tiles).
    if p.mode == "coop":
        # One program per SM, 16 warps: a finisher tile of 16 keys a thread, whatever the
        # survivor count (a fixed size: one compiled variant fewer per shape).
        p.num_warps = config.get("num_warps", 16)
        p.finish_tile = min(ft_max, 512 * p.num_warps)
    elif p.mode == "direct":
        p.num_warps = 4 if p.finish_tile <= 2048 else (8 if p.finish_tile <= 4096 else 16)
    else:
        p.num_warps = max(4, min(16, max(p.tile, p.finish_tile) // 512))
        # As many warps as the finisher needs stream tiles of 16 elements a thread.
        p.tile = max(p.tile, 512 * p.num_warps)
        p.subtile = min(p.tile, max(p.subtile, 512))
        if p.mode == "fused":
            p.tiles_per_program = cdiv(N, p.tile)
        elif p.mode == "split":
            p.tiles_per_program = cdiv(cdiv(N, p.tile), p.programs_per_row)
            p.programs_per_row = cdiv(cdiv(N, p.tile), p.tiles_per_program)
    return RadixPlan(**vars(p))


class RadixBackend(_PlannedBackend):
    name = "radix"

    def supports(self, call: TopkCall) -> str | None:
        if call.N > MAX_ROW:
            return (f"rows of {call.N} elements; radix packs a 32-bit index beside the key "
                    f"(rows up to {MAX_ROW})")
        return None

    def configs(self, call: TopkCall) -> list[dict]:
        if call.info.interpreted:
            # The interpreter runs programs one after another (no program may wait for
            # another: split, not coop) and tl.sort element by element: small blocks keep CPU
            # tests fast and still take every path.
            small = {"coop": False, "samples_per_block_max": 128, "sm_count": 4,
                     "exact_sizes": True}
            return [{**small, "tile": 256, "programs_per_sm": 2, "finish_tile_max": 512},
                    {**small, "tile": 128, "one_program_per_row": True, "finish_tile_max": 256}]
        # Few configs: tuning compiles each of them (10-20 s apiece) for every new shape.
        if call.R >= call.info.sm_count:
            # One program per row whatever the config: vary its tile instead.
            return [{}, {"fused_tile": 4096}]
        out = [{"coop": True}] if COOP_ALLOWED else []
        out.append({"coop": False, "tile": 4096, "programs_per_sm": 4})
        if call.N <= (1 << 18):
            out.append({"coop": False, "one_program_per_row": True})  # one launch
        return out

    estimate = staticmethod(cost.radix)

    def make_plan(self, call: TopkCall, config: dict, sms: int) -> RadixPlan:
        return radix_plan(call.R, call.N, call.k, call.input.dtype, call.sorted, sms, config,
                          row_stride=_row_stride(call), largest=call.largest)

    def _prepared(self, p, call: TopkCall):
        """The prepared call (see Backend.bind) in the mode of the plan p: a function of the
        input, everything else worked out here once."""
        read = _reader(call, unit_col=True)[0]
        R, N, k, row_stride, flip = call.R, call.N, call.k, p.row_stride, p.flip
        device, index = call.input.device, call.info.index
        new_outputs, finish = _output_maker(call), _output_finisher(call, p.sort_after)
        o = p.workspace_offsets
        size = p.workspace_elements
        new_ws = allocator((size,), torch.int64, device)
        if p.mode == "direct":
            launch = _RADIX_DIRECT.bind(p, (R,), index)

            def direct(x: torch.Tensor):
                if read is not None:
                    x = read(x)
                values, indices = new_outputs()
                launch(x, values, indices, N, row_stride, k, flip)
                return finish(values, indices)

            return direct
        if p.mode == "fused":
            launch = _RADIX_ROWS.bind(p, (R,), index)
            buffers = (o["sbuf"], o["sidx"])
            ints = (N, row_stride, k, p.threshold_rank, p.survivor_capacity, p.tie_capacity,
                    flip)

            def fused(x: torch.Tensor):
                if read is not None:
                    x = read(x)
                values, indices = new_outputs()
                ws = new_ws()
                launch(x, ws, *buffers, values, indices, *ints)
                return finish(values, indices)

            return fused
        offsets = (o["lists"], o["sbuf"], o["sidx"])
        launch_filter = _RADIX_FILTER.bind(p, (R, p.programs_per_row), index)
        ints = (N, row_stride, k, p.threshold_rank, p.survivor_capacity, p.tie_capacity,
                p.tiles_per_program, p.programs_per_row, p.sample_blocks, flip)
        if p.mode == "coop":
            # The per-row counters start at zero (with the rest when that is small: one
            # memset instead of an allocation and a memset).
            zero_all, counters = size <= (1 << 20), int(COUNTERS) * R

            def coop(x: torch.Tensor):
                if read is not None:
                    x = read(x)
                values, indices = new_outputs()
                if zero_all:
                    ws = torch.zeros(size, dtype=torch.int64, device=device)
                else:
                    ws = new_ws()
                    ws[:counters].zero_()
                launch_filter(x, ws, *offsets, values, indices, *ints)
                return finish(values, indices)

            return coop
        launch_sample = _RADIX_SAMPLE.bind(p, (R, p.sample_blocks), index)
        sample_args = (o["lists"], N, row_stride, p.sample_blocks, flip)

        def split(x: torch.Tensor):
            if read is not None:
                x = read(x)
            values, indices = new_outputs()
            ws = new_ws()
            launch_sample(x, ws, *sample_args)
            launch_filter(x, ws, *offsets, values, indices, *ints)
            return finish(values, indices)

        return split
