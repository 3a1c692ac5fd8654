"""What several topk backends share: the order-keeping key of a value, the threshold search
(count, narrow, cut), the selection of winners from a tile, the row workspace, and the base
class of the planned backends."""

from __future__ import annotations


import torch
import triton
import triton.language as tl

from ...dispatch.backend import PlannedBackend
from ...dispatch.device import INTERPRETED
from ...errors import OpselectError
from ...switches import enabled
from .._common import Launcher, check_config, plan_launcher  # noqa: F401 (the backends import the last two from here)
from .._common import allocator, per_stream
from .call import PreparedRuns, TopkCall, _output_finisher, _output_maker, _reader


# The one-launch radix mode has the programs of a row wait for each other; it keeps the grid
# within one program per SM so they are all resident. Where fewer SMs than the device reports
# are available to this process (MPS limits, green contexts), set OPSELECT_TOPK_COOP=0.
COOP_ALLOWED = enabled("OPSELECT_TOPK_COOP")


# int64 counters per row in the radix workspace (see _radix_filter_kernel).
COUNTERS: tl.constexpr = tl.constexpr(8)


# How often a program of the one-launch mode polls for the rest of its row before giving up
# (about a quarter of a second; see _radix_filter_kernel).
SPIN_LIMIT: tl.constexpr = tl.constexpr(1 << 18)


# Rows longer than this do not fit the 32-bit index packed beside the key.
MAX_ROW = (1 << 32) - 1


# ---------------------------------------------------------------------------------------------
# Kernels: keys and helpers
# ---------------------------------------------------------------------------------------------
@triton.jit
def _order_key(x, is_float: tl.constexpr, flip, key64: tl.constexpr):
    """A signed integer key whose order is the order topk selects in: a larger key is taken
    first. Floats: flip the magnitude bits of negatives (sign-magnitude -> two's complement),
    one key for +-0.0 and one for every NaN, above +inf. flip: 0, or -1 for largest=False
    (a run-time value, so both directions share one compiled kernel)."""
    if is_float:
        if x.dtype == tl.float64:
            bits = x.to(tl.int64, bitcast=True)
            key = bits ^ ((bits >> 63) & 0x7FFFFFFFFFFFFFFF)
            nan_key = tl.full(bits.shape, 0x7FFFFFFFFFFFFFFF, tl.int64)
        elif x.dtype == tl.float32:
            bits = x.to(tl.int32, bitcast=True)
            key = bits ^ ((bits >> 31) & 0x7FFFFFFF)
            nan_key = tl.full(bits.shape, 0x7FFFFFFF, tl.int32)
        else:
            bits = x.to(tl.int16, bitcast=True)
            key = bits ^ ((bits >> 15) & 0x7FFF)
            nan_key = tl.full(bits.shape, 0x7FFF, tl.int16)
        key = tl.where(x == 0, tl.zeros_like(key), key)
        key = tl.where(x != x, nan_key, key)
    else:
        key = x
    if key64:
        key = key.to(tl.int64)
    else:
        key = key.to(tl.int32)
    return key ^ flip  # flip = -1 (largest=False) complements: the smallest key ranks first


# The interpreter's minimum propagates NaN (numpy's); the compiled one returns the other operand.
_INTERPRETED = tl.constexpr(INTERPRETED)


# Both combines return their operands' dtype: triton 3.6 takes the max / min of bfloat16 in
# float32 (3.9 keeps bfloat16 and packs two to an instruction), and a reduction's combine must
# give back what it takes. The value is one of the operands, so the cast back is exact.
@triton.jit
def _max_or_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL).to(a.dtype)


@triton.jit
def _min_past_nan(a, b):
    if _INTERPRETED:
        m = tl.where(a != a, b, tl.where(b != b, a, tl.minimum(a, b)))
    else:
        m = tl.minimum(a, b)  # PTX min: a NaN operand gives the other one
    return m.to(a.dtype)


@triton.jit
def _group_max_keys(x, is_float: tl.constexpr, flip, key64: tl.constexpr):
    """The largest order key (see _order_key) of each row of a [groups, group] tile of values,
    every lane valid. Floats are reduced as floats and only the result is made a key: one max
    instruction an element instead of about 13 to make each key (the H200 ran tournament's
    pass over bfloat16 vocabulary rows at about half the memory's speed, issue-bound). The
    order agrees: NaN ranks above everything, so the max propagates it; -0.0 and +0.0 share a
    key, so either may come out. For the smallest (flip) the group's minimum past NaNs: a NaN
    comes out only from a group of NaNs, and its flipped key is then the lowest, as it is."""
    if is_float:
        v = x
        if _INTERPRETED:
            v = x.to(tl.float32)  # the interpreter holds 16-bit floats as raw bits
        if flip == 0:
            m = tl.reduce(v, 1, _max_or_nan)
        else:
            m = tl.reduce(v, 1, _min_past_nan)
        key = _order_key(m.to(x.dtype), is_float, flip, key64)  # exact: m is one of the x
    else:
        key = tl.max(_order_key(x, is_float, flip, key64), axis=1)
    return key


@triton.jit
def _masked_group_max_keys(x, valid, is_float: tl.constexpr, flip, key64: tl.constexpr):
    """The largest order key of each row of a [groups, group] tile, lanes not `valid` (past a
    chunk's end) taking the lowest key."""
    lowest, highest = _key_limits(key64)
    return tl.max(tl.where(valid, _order_key(x, is_float, flip, key64), lowest), axis=1)


@triton.jit
def _tile_group_max_keys(x, lane, n_valid, tile: tl.constexpr, float_maxima: tl.constexpr,
                         is_float: tl.constexpr, flip, key64: tl.constexpr):
    """The group maxima keys of a [groups, group] tile of `tile` values whose lanes [0, n_valid)
    hold data: a whole tile as floats where the plan allows (see float_maxima_allowed), else,
    and for a chunk's last, partial tile, as keys."""
    if float_maxima:
        if n_valid >= tile:
            gm = _group_max_keys(x, is_float, flip, key64)
        else:
            gm = _masked_group_max_keys(x, lane < n_valid, is_float, flip, key64)
    else:
        gm = _masked_group_max_keys(x, lane < n_valid, is_float, flip, key64)
    return gm


def float_maxima_allowed(dtype: torch.dtype, row_stride: int, chunk: int) -> bool:
    """Whether a pass over rows row_stride apart, in chunks of `chunk` elements, takes its whole
    tiles' group maxima as floats (_group_max_keys): floats whose rows and chunks start on 16
    bytes, so every tile loads in 16-byte vectors. Where they do not (GPT-2's 50257 columns in
    float16), the loads are single elements and the float reduction was 3.3x slower than the
    keys' (H100, probe_topk_vocab.py): those take the keys' maxima, as before."""
    size = dtype.itemsize
    return dtype.is_floating_point and (row_stride * size) % 16 == 0 and (chunk * size) % 16 == 0


@triton.jit
def _key_limits(key64: tl.constexpr):
    if key64:
        lowest = -9223372036854775807 - 1
        highest = 9223372036854775807
    else:
        lowest = -2147483647 - 1
        highest = 2147483647
    return lowest, highest


@triton.jit
def _typed(ws_ptr, offset, KEY: tl.constexpr, key64: tl.constexpr):
    """A pointer into the int64 workspace, retyped: KEY=True gives the key dtype, else int32."""
    p = ws_ptr + offset
    if KEY and key64:
        q = p
    else:
        q = p.to(tl.pointer_type(tl.int32))
    return q


@triton.jit
def _count3(key, ok, m1, m2, m3):
    """#{key >= m_i} for three thresholds in one reduction: three 21-bit fields of an int64
    (a tile holds fewer than 2^21 entries), so the step pays one reduction's latency, not three."""
    ge1 = (ok & (key >= m1.to(key.dtype))).to(tl.int64)
    ge2 = (ok & (key >= m2.to(key.dtype))).to(tl.int64)
    ge3 = (ok & (key >= m3.to(key.dtype))).to(tl.int64)
    packed = tl.sum(ge1 | (ge2 << 21) | (ge3 << 42), axis=0)
    return packed & 0x1FFFFF, (packed >> 21) & 0x1FFFFF, packed >> 42


@triton.jit
def _cavg(a, b):
    """ceil((a + b) / 2) without overflow (the key range may span all of int64)."""
    return (a >> 1) + (b >> 1) + ((a | b) & 1)


@triton.jit
def _narrow(lo, hi, c_lo, k, k_hi, c1, c2, c3, m1, m2, m3):
    """One 4-ary search step: counts c_i = #{key >= m_i}, lo < m1 <= m2 <= m3 <= hi, c_lo =
    #{key >= lo} (or any bound above it). The answer (the largest v with #{key >= v} >= k)
    stays in [lo, hi].

    The search ends early (hi = lo) once lo is reached by at most k_hi keys: any such cut
    serves a caller that wants at least k keys and room for k_hi. With k_hi = k that is a
    threshold reached by exactly k keys: the k keys >= it are the answer whether or not it is
    itself a key, and the callers' tie logic (take keys > lo, then up to k - #{key > lo} keys
    == lo) takes exactly them. On spread-out keys this stops once a threshold falls between
    the k-th and (k+1)-th key, well before the range narrows to one value."""
    new_lo = tl.where(c3 >= k, m3, tl.where(c2 >= k, m2, tl.where(c1 >= k, m1, lo)))
    new_c = tl.where(c3 >= k, c3, tl.where(c2 >= k, c2, tl.where(c1 >= k, c1, c_lo)))
    new_hi = tl.where(c1 < k, m1 - 1, tl.where(c2 < k, m2 - 1, tl.where(c3 < k, m3 - 1, hi)))
    new_hi = tl.where(new_c <= k_hi, new_lo, new_hi)
    return new_lo, new_hi, new_c


@triton.jit
def _cut(key, ok, k, k_hi, lo, hi):
    """A cut v of the valid keys of a 1-d register tile with k <= #{key >= v}, given lo <= the
    k-th largest key <= hi (int64 scalars, lo with at least k keys >= it): the first one found
    that at most k_hi keys reach, else the k-th largest key itself. A 4-ary search on the key
    value, three counts a step in one reduction: at most log4(hi - lo) steps (16 for 32-bit
    keys), usually fewer."""
    c_lo = tl.full([], 1 << 40, tl.int64)  # unknown: more than any tile holds
    while lo < hi:
        m2 = _cavg(lo, hi)
        m1 = _cavg(lo, m2)
        m3 = _cavg(m2, hi)
        c1, c2, c3 = _count3(key, ok, m1, m2, m3)
        lo, hi, c_lo = _narrow(lo, hi, c_lo, k, k_hi, c1, c2, c3, m1, m2, m3)
    return lo


@triton.jit
def _kth(key, ok, k, lo, hi):
    """A cut for the k largest valid keys of a register tile (see _cut): the k-th largest key
    itself, or a value that exactly k keys reach. Either way the k largest are the keys > cut
    plus the first k - #{key > cut} keys == cut."""
    return _cut(key, ok, k, k, lo, hi)


@triton.jit
def _src_tile(x_ptr, row_off, sbuf, sidx, start, C, from_input,
              finish_tile: tl.constexpr, is_float: tl.constexpr, flip, key64: tl.constexpr):
    """finish_tile entries of a selection source from `start`: the row itself (from_input), or a
    survivor buffer (key and index packed in an int64; 64-bit keys keep the index apart).
    from_input is a run-time flag, so the selection code is compiled once for both sources.
    Lanes use 32-bit offsets from a 64-bit scalar base; the index is returned as its low 32 bits
    (rows are shorter than 2^32). `unit` (1, unknown to the compiler) keeps one element per
    thread per access, the layout of the scattered winner stores (see _filter_chunk)."""
    unit = (C >= 0).to(tl.int32)
    lane = tl.arange(0, finish_tile) * unit
    ok = lane < tl.maximum(tl.minimum(C - start, finish_tile), 0).to(tl.int32)
    if from_input:
        x = tl.load(x_ptr + row_off + start + lane, mask=ok, other=0)
        key = _order_key(x, is_float, flip, key64)
        idx = (start + tl.zeros([], tl.int64)).to(tl.int32) + lane  # low 32 bits
    else:
        # .cg: survivors written by other programs of this launch are read from L2, not L1.
        if key64:
            key = tl.load(sbuf + start + lane, mask=ok, other=0, cache_modifier=".cg")
            idx = tl.load(sidx + start + lane, mask=ok, other=0, cache_modifier=".cg")
        else:
            v = tl.load(sbuf + start + lane, mask=ok, other=0, cache_modifier=".cg")
            key = (v >> 32).to(tl.int32)
            idx = v.to(tl.int32)
    return key, idx, ok


@triton.jit
def _store_winners(out_row, slot, take, key, idx, PACK: tl.constexpr):
    # PACK: key in the high half, index in the low half, so one int64 sort orders both.
    idx64 = idx.to(tl.int64) & 0xFFFFFFFF
    if PACK:
        val = (key.to(tl.int64) << 32) | idx64
    else:
        val = idx64
    tl.store(out_row + slot, val, mask=take)


@triton.jit
def _select(x_ptr, row_off, sbuf, sidx, C, k, lo, from_input, out_row,
            PACK: tl.constexpr, finish_tile: tl.constexpr, is_float: tl.constexpr, flip,
            key64: tl.constexpr):
    """Write the k largest keys of a source of C entries (k <= C) to out_row[0:k], unordered.

    K = the k-th largest key is found by a 4-ary search on the key value between lo (a key with
    at least k keys >= it; for the whole row, its minimum) and the source's maximum: three
    counts per step (one reduction), so about log4(range) steps. Then every key > K is taken and
    the first k - #{key > K} keys equal to K. A source that fits one tile stays in registers; a
    longer one is re-read tile by tile (the rare, slow path)."""
    if C <= finish_tile:
        _select_tile(x_ptr, row_off, sbuf, sidx, C, k, lo, from_input, out_row, PACK, finish_tile,
                     is_float, flip, key64)
    else:
        # The slow path streams smaller tiles: a quarter of the code to compile, the same
        # bandwidth (it is bound by one program's loads anyway).
        _select_tiles(x_ptr, row_off, sbuf, sidx, C, k, lo, from_input, out_row, PACK,
                      max(finish_tile // 4, 256), is_float, flip, key64)


@triton.jit
def _select_tile(x_ptr, row_off, sbuf, sidx, C, k, lo, from_input, out_row,
                 PACK: tl.constexpr, finish_tile: tl.constexpr, is_float: tl.constexpr, flip,
                 key64: tl.constexpr):
    lowest, highest = _key_limits(key64)
    key, idx, ok = _src_tile(x_ptr, row_off, sbuf, sidx, 0, C, from_input, finish_tile, is_float,
                             flip, key64)
    lo = tl.where(from_input, tl.min(tl.where(ok, key, highest), axis=0).to(tl.int64), lo)
    _take_k(key, idx, ok, k, lo, out_row, PACK, key64)


@triton.jit
def _take_k(key, idx, ok, k, lo, out_row, PACK: tl.constexpr, key64: tl.constexpr):
    """Write the k largest valid keys of a 1-d register tile to out_row[0:k], unordered (lo: an
    int64 key with at least k valid keys >= it): every key above the cut, then enough ties."""
    lowest, highest = _key_limits(key64)
    hi = tl.max(tl.where(ok, key, lowest), axis=0).to(tl.int64)
    cut = _kth(key, ok, k, lo, hi).to(key.dtype)
    gt = ok & (key > cut)
    eq = ok & (key == cut)
    n_above = tl.sum(gt.to(tl.int32), axis=0)
    eq_rank = tl.cumsum(eq.to(tl.int32), axis=0) - 1
    take = gt | (eq & (eq_rank < k - n_above))
    slot = tl.cumsum(take.to(tl.int32), axis=0) - 1
    _store_winners(out_row, slot, take, key, idx, PACK)


@triton.jit
def _select_tiles(x_ptr, row_off, sbuf, sidx, C, k, lo, from_input, out_row,
                  PACK: tl.constexpr, finish_tile: tl.constexpr, is_float: tl.constexpr, flip,
                  key64: tl.constexpr):
    lowest, highest = _key_limits(key64)
    hi = tl.full([], lowest, tl.int64)
    lo_in = tl.full([], highest, tl.int64)
    for start in range(0, C, finish_tile):
        key, idx, ok = _src_tile(x_ptr, row_off, sbuf, sidx, start, C, from_input, finish_tile,
                                 is_float, flip, key64)
        hi = tl.maximum(hi, tl.max(tl.where(ok, key, lowest), axis=0).to(tl.int64))
        lo_in = tl.minimum(lo_in, tl.min(tl.where(ok, key, highest), axis=0).to(tl.int64))
    lo = tl.where(from_input, lo_in, lo)
    c_lo = tl.full([], 1 << 40, tl.int64)
    while lo < hi:
        m2 = _cavg(lo, hi)
        m1 = _cavg(lo, m2)
        m3 = _cavg(m2, hi)
        c1 = tl.full([], 0, tl.int64)
        c2 = tl.full([], 0, tl.int64)
        c3 = tl.full([], 0, tl.int64)
        for start in range(0, C, finish_tile):
            key, idx, ok = _src_tile(x_ptr, row_off, sbuf, sidx, start, C, from_input, finish_tile,
                                     is_float, flip, key64)
            t1, t2, t3 = _count3(key, ok, m1, m2, m3)
            c1 += t1
            c2 += t2
            c3 += t3
        lo, hi, c_lo = _narrow(lo, hi, c_lo, k, k, c1, c2, c3, m1, m2, m3)
    n_above = tl.full([], 0, tl.int64)
    for start in range(0, C, finish_tile):
        key, idx, ok = _src_tile(x_ptr, row_off, sbuf, sidx, start, C, from_input, finish_tile,
                                 is_float, flip, key64)
        n_above += tl.sum((ok & (key > lo.to(key.dtype))).to(tl.int32), axis=0)
    quota = k - n_above
    gt_base = tl.full([], 0, tl.int64)
    eq_base = tl.full([], 0, tl.int64)
    for start in range(0, C, finish_tile):
        key, idx, ok = _src_tile(x_ptr, row_off, sbuf, sidx, start, C, from_input, finish_tile,
                                 is_float, flip, key64)
        kth = lo.to(key.dtype)
        gt = ok & (key > kth)
        eq = ok & (key == kth)
        eq_rank = eq_base + tl.cumsum(eq.to(tl.int32), axis=0) - 1
        take_eq = eq & (eq_rank < quota)
        gt_slot = gt_base + tl.cumsum(gt.to(tl.int32), axis=0) - 1
        _store_winners(out_row, gt_slot, gt, key, idx, PACK)
        _store_winners(out_row, n_above + eq_rank, take_eq, key, idx, PACK)
        gt_base += tl.sum(gt.to(tl.int32), axis=0)
        eq_base += tl.sum(eq.to(tl.int32), axis=0)


@triton.jit
def _write_out(x_ptr, row_off, idx_row, val_row, k,
               sort: tl.constexpr, k_padded: tl.constexpr, finish_tile: tl.constexpr):
    """out_row holds the k winners (packed key|index when sort); sort them if asked, then read
    their values back from the input (exact values, whatever the key canonicalised)."""
    if sort:
        j = tl.arange(0, k_padded)
        ok = j < k
        e = tl.load(idx_row + j, mask=ok, other=-9223372036854775807 - 1)
        e = tl.sort(e, descending=True)
        idx = e & 0xFFFFFFFF
        v = tl.load(x_ptr + row_off + idx, mask=ok)
        tl.debug_barrier()  # every packed entry is read before the first is overwritten
        tl.store(idx_row + j, idx, mask=ok)
        tl.store(val_row + j, v, mask=ok)
    else:
        for start in range(0, k, finish_tile):
            j = start + tl.arange(0, finish_tile)
            ok = j < k
            idx = tl.load(idx_row + j, mask=ok, other=0)
            v = tl.load(x_ptr + row_off + idx, mask=ok)
            tl.store(val_row + j, v, mask=ok)


@triton.jit
def _row_buffers(ws_ptr, off_sbuf, off_sidx, r64, survivor_capacity, tie_capacity,
                 key64: tl.constexpr):
    """The row's survivor buffer: int64 slots [0, survivor_capacity) for keys > T and
    [survivor_capacity, survivor_capacity + tie_capacity) for keys == T (key << 32 | index),
    plus an int32 index array when keys are 64-bit."""
    row = r64 * (survivor_capacity + tie_capacity)
    sbuf = ws_ptr + off_sbuf + row
    sidx = (ws_ptr + off_sidx).to(tl.pointer_type(tl.int32)) + row
    return sbuf, sidx


def _key64(dtype: torch.dtype) -> bool:
    return dtype.itemsize == 8


def _row_stride(call: TopkCall) -> int:
    """The stride between the rows the kernels of adjacent elements read (the input's own, or
    that of the contiguous copy _reader makes)."""
    return _reader(call, unit_col=True)[1]


class _PlannedBackend(PreparedRuns, PlannedBackend):
    """A topk backend whose launches follow a plan made from the call's rows, row length, k,
    dtype, order flags and row stride, the SM count and a config (memoised:
    dispatch.backend.PlannedBackend); the plan object is the Launchers' whole spec and the cost
    model's input."""

    def plan_facts(self, call: TopkCall) -> tuple:
        return (call.R, call.N, call.k, call.input.dtype, call.sorted, call.largest,
                _row_stride(call))

    def _refuse(self, p) -> None:
        """Raise with the plan's reason where it refuses the call (a config the call does not
        suit: the dispatcher only runs configs whose plan holds)."""
        if getattr(p, "reason", None):
            raise OpselectError(f"topk {self.name}: {p.reason}")


def ticketed_call(call: TopkCall, launch, offsets: tuple, size: int, ints: tuple):
    """The prepared call (x -> torch.topk's result) of a backend of one launch whose shared
    rows' programs take tickets: launch(x, workspace, *offsets, values, indices, *ints). The
    workspace is the stream's, kept between calls: its first offsets[0] int64 elements (the
    tickets) are zeroed when it is made and again by each shared row's last program, and every
    other part is written before it is read within a launch."""
    read = _reader(call, unit_col=True)[0]
    device = call.input.device
    new_outputs, finish = _output_maker(call), _output_finisher(call)
    new_ws = allocator((max(size, 1),), torch.int64, device)

    def make_workspace():
        ws = new_ws()
        ws[:offsets[0]].zero_()
        return (ws,)

    workspace = per_stream(device, make_workspace)

    def topk(x: torch.Tensor):
        if read is not None:
            x = read(x)
        values, indices = new_outputs()
        launch(x, workspace()[0], *offsets, values, indices, *ints)
        return finish(values, indices)

    return topk
