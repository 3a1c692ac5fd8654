"""topk: the k largest (or smallest) values along one dim and their indices, as torch.topk.

Six algorithms; a call is seen as R rows of N elements (the dim moved last) and k per row:

  torch    torch.topk (ATen: a radix select per slice, or a full sort for <= 10 long slices)
  radix    a radix select on order-preserving integer keys that reads the data once, with no
           host sync and, on the GPU, in one launch:
             sample     each row draws positions of a Weyl sequence (spread evenly over the row
                        for every period); each sample block keeps its top keys
             threshold  every program of the row derives the same T = the m-th largest sampled
                        key, with m = mu + 5 sqrt(mu) + 5 for mu = k S / N: at least k keys reach
                        T unless the sample is off by five standard deviations, yet only about
                        m N / S do (a few thousand for k <= 1024)
             filter     the programs stream their chunks of the row once: keys > T are appended
                        to the row's survivor buffer (one atomic per tile that has any, ranks by
                        cumsum), keys == T to a tie buffer of at most k
             finish     the last program of the row (a ticket) selects from the survivors: digit
                        by digit from the top, two bits a step (three counts per step, one
                        reduction), it finds the k-th key, takes every key above it and enough
                        ties, and sorts just those k in registers (key and index in one int64;
                        k <= 1024, larger k and 64-bit keys are sorted by torch.sort after)
           The same 4-ary search finds each sample block's top and the threshold, so the only
           sorting network compiled is the winners' (each constexpr is a compiled variant of a
           big kernel, 5-15 s of compiling: sizes are quantised to few values).
           The threshold stands in for the histogram of the top digit: Triton has no shared-
           memory atomics, and tl.histogram costs about a hundred instructions per element for
           256 bins (ballots, popcounts), several times a pass's memory time, so histograms are
           built only over survivors (as counts), never over the row. If the sample was off
           (fewer than k keys reach T, or more survivors than the buffer holds), the finisher
           selects from the whole row: always correct, only slow, and rare by construction.
           Launch shapes: `coop` (rows fewer than SMs): several programs per row in one launch,
           which wait for each other once, after sampling, so the grid is kept to one program per
           SM; `split`: the same in two launches (samples first) where programs may not wait
           (the interpreter, OPSELECT_TOPK_COOP=0); `fused` (as many rows as SMs or more): one
           program per row does everything; `direct` (rows of one tile): select from the row.
  tournament  per chunk, the maxima of groups of G elements cut the chunk to its 2k hot groups;
           the last program of a shared row merges the chunks' winners (small k)
  maxima   one cut for a whole row from supergroup maxima: launch 1 reads the row once (group
           and supergroup maxima, no search, no wait), launch 2 gathers the groups that reach
           the cut and the row's programs rank the ~1.2 k candidates into place together
           (long rows, k <= 1024; see _maxima_select_kernel)
  sort     torch.sort of each row, then the first k: wins when k is a large part of the row
  bitonic  rows of up to 16384 elements are loaded once; key and index are packed in one int64
           and tl.topk (a bitonic top-k network) or tl.sort runs in registers: many short rows

Semantics are torch's: NaN is larger than every number (every NaN gets one key above +inf),
-0.0 equals 0.0 (one key), ties may return any of the tied indices but values are exactly
torch's (they are read back from the input at the returned indices).
"""

from __future__ import annotations

import math
import operator

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ..dispatch.backend import Backend, Estimate, TorchBackend
from ..dispatch.device import device_info
from ..dispatch.op import Call, Op, register
from ..dispatch.signature import bucket
from ..errors import (ArgumentTypeError, DimError, InvalidArgument, OpselectError,
                      TorchOnlyCall)
from ..heuristics import topk as cost
from ..switches import enabled
from ._common import Launcher, cdiv, next_pow2

SUPPORTED_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                    torch.float16, torch.bfloat16, torch.float32, torch.float64)

# radix: samples per sample block (see radix_plan for how many blocks a row draws).
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
# The one-launch radix mode has the programs of a row wait for each other; it keeps the grid
# within one program per SM so they are all resident. Where fewer SMs than the device reports
# are available to this process (MPS limits, green contexts), set OPSELECT_TOPK_COOP=0.
COOP_ALLOWED = enabled("OPSELECT_TOPK_COOP")
# maxima's second launch is a programmatic dependent launch on Hopper and later (sm_90+): it is
# scheduled while the first one's last programs run and waits for them in the kernel, which
# hides the gap between the two launches. OPSELECT_TOPK_PDL=0 turns it off.
PDL_ALLOWED = enabled("OPSELECT_TOPK_PDL")
# int64 counters per row in the radix workspace (see _radix_filter_kernel).
COUNTERS: tl.constexpr = tl.constexpr(8)
# How often a program of the one-launch mode polls for the rest of its row before giving up
# (about a quarter of a second; see _radix_filter_kernel).
SPIN_LIMIT: tl.constexpr = tl.constexpr(1 << 18)
# Margins (in standard deviations, plus a constant) of the sample threshold.
SIGMAS = 5.0
# Rows longer than this do not fit the 32-bit index packed beside the key.
MAX_ROW = (1 << 32) - 1
BITONIC_MAX = 16384


# ---------------------------------------------------------------------------------------------
# Kernels: keys and helpers
# ---------------------------------------------------------------------------------------------
@triton.jit
def _order_key(x, IS_FLOAT: tl.constexpr, flip, KEY64: tl.constexpr):
    """A signed integer key whose order is the order topk selects in: a larger key is taken
    first. Floats: flip the magnitude bits of negatives (sign-magnitude -> two's complement),
    one key for +-0.0 and one for every NaN, above +inf. flip: 0, or -1 for largest=False
    (a run-time value, so both directions share one compiled kernel)."""
    if IS_FLOAT:
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
    if KEY64:
        key = key.to(tl.int64)
    else:
        key = key.to(tl.int32)
    return key ^ flip  # flip = -1 (largest=False) complements: the smallest key ranks first


@triton.jit
def _key_limits(KEY64: tl.constexpr):
    if KEY64:
        lowest = -9223372036854775807 - 1
        highest = 9223372036854775807
    else:
        lowest = -2147483647 - 1
        highest = 2147483647
    return lowest, highest


@triton.jit
def _typed(ws_ptr, offset, KEY: tl.constexpr, KEY64: tl.constexpr):
    """A pointer into the int64 workspace, retyped: KEY=True gives the key dtype, else int32."""
    p = ws_ptr + offset
    if KEY and KEY64:
        q = p
    else:
        q = p.to(tl.pointer_type(tl.int32))
    return q


@triton.jit
def _sample_keys(x_ptr, row_off, r, N, s, SS: tl.constexpr,
                 IS_FLOAT: tl.constexpr, flip, KEY64: tl.constexpr):
    """Keys of SS sample positions of row r (block s of its sample). A Weyl sequence
    frac(i / phi + c_r) is equidistributed modulo every period, so periodic rows are sampled
    fairly; positions may repeat, the margins of the threshold allow for it."""
    i = (s * SS + tl.arange(0, SS)).to(tl.int64)
    h = (i * 2654435769 + r.to(tl.int64) * 1640531527 + 12345) & 0xFFFFFFFF
    pos = ((h >> 1) * N) >> 31  # (h / 2^32) * N without overflowing int64
    x = tl.load(x_ptr + row_off + pos)
    return _order_key(x, IS_FLOAT, flip, KEY64)


@triton.jit
def _mth_largest(keys, ok, m, KEY64: tl.constexpr):
    """A threshold that at least m of the valid keys of a register tile reach (the m-th
    largest, or a value exactly m reach: see _kth): the same 4-ary search as the finisher's, so
    no sorting network is compiled for it. With fewer than m valid keys it returns their
    minimum (a lower threshold is always safe)."""
    lowest, highest = _key_limits(KEY64)
    lo = tl.min(tl.where(ok, keys, highest), axis=0).to(tl.int64)
    hi = tl.max(tl.where(ok, keys, lowest), axis=0).to(tl.int64)
    return _kth(keys, ok, m, lo, hi).to(keys.dtype)


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
              FT: tl.constexpr, IS_FLOAT: tl.constexpr, flip, KEY64: tl.constexpr):
    """FT entries of a selection source from `start`: the row itself (from_input), or a
    survivor buffer (key and index packed in an int64; 64-bit keys keep the index apart).
    from_input is a run-time flag, so the selection code is compiled once for both sources.
    Lanes use 32-bit offsets from a 64-bit scalar base; the index is returned as its low 32 bits
    (rows are shorter than 2^32). `unit` (1, unknown to the compiler) keeps one element per
    thread per access, the layout of the scattered winner stores (see _filter_chunk)."""
    unit = (C >= 0).to(tl.int32)
    lane = tl.arange(0, FT) * unit
    ok = lane < tl.maximum(tl.minimum(C - start, FT), 0).to(tl.int32)
    if from_input:
        x = tl.load(x_ptr + row_off + start + lane, mask=ok, other=0)
        key = _order_key(x, IS_FLOAT, flip, KEY64)
        idx = (start + tl.zeros([], tl.int64)).to(tl.int32) + lane  # low 32 bits
    else:
        # .cg: survivors written by other programs of this launch are read from L2, not L1.
        if KEY64:
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
            PACK: tl.constexpr, FT: tl.constexpr, IS_FLOAT: tl.constexpr, flip,
            KEY64: tl.constexpr):
    """Write the k largest keys of a source of C entries (k <= C) to out_row[0:k], unordered.

    K = the k-th largest key is found by a 4-ary search on the key value between lo (a key with
    at least k keys >= it; for the whole row, its minimum) and the source's maximum: three
    counts per step (one reduction), so about log4(range) steps. Then every key > K is taken and
    the first k - #{key > K} keys equal to K. A source that fits one tile stays in registers; a
    longer one is re-read tile by tile (the rare, slow path)."""
    if C <= FT:
        _select_tile(x_ptr, row_off, sbuf, sidx, C, k, lo, from_input, out_row, PACK, FT,
                     IS_FLOAT, flip, KEY64)
    else:
        # The slow path streams smaller tiles: a quarter of the code to compile, the same
        # bandwidth (it is bound by one program's loads anyway).
        _select_tiles(x_ptr, row_off, sbuf, sidx, C, k, lo, from_input, out_row, PACK,
                      max(FT // 4, 256), IS_FLOAT, flip, KEY64)


@triton.jit
def _select_tile(x_ptr, row_off, sbuf, sidx, C, k, lo, from_input, out_row,
                 PACK: tl.constexpr, FT: tl.constexpr, IS_FLOAT: tl.constexpr, flip,
                 KEY64: tl.constexpr):
    lowest, highest = _key_limits(KEY64)
    key, idx, ok = _src_tile(x_ptr, row_off, sbuf, sidx, 0, C, from_input, FT, IS_FLOAT, flip,
                             KEY64)
    lo = tl.where(from_input, tl.min(tl.where(ok, key, highest), axis=0).to(tl.int64), lo)
    _take_k(key, idx, ok, k, lo, out_row, PACK, KEY64)


@triton.jit
def _take_k(key, idx, ok, k, lo, out_row, PACK: tl.constexpr, KEY64: tl.constexpr):
    """Write the k largest valid keys of a 1-d register tile to out_row[0:k], unordered (lo: an
    int64 key with at least k valid keys >= it): every key above the cut, then enough ties."""
    lowest, highest = _key_limits(KEY64)
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
                  PACK: tl.constexpr, FT: tl.constexpr, IS_FLOAT: tl.constexpr, flip,
                  KEY64: tl.constexpr):
    lowest, highest = _key_limits(KEY64)
    hi = tl.full([], lowest, tl.int64)
    lo_in = tl.full([], highest, tl.int64)
    for start in range(0, C, FT):
        key, idx, ok = _src_tile(x_ptr, row_off, sbuf, sidx, start, C, from_input, FT,
                                 IS_FLOAT, flip, KEY64)
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
        for start in range(0, C, FT):
            key, idx, ok = _src_tile(x_ptr, row_off, sbuf, sidx, start, C, from_input, FT,
                                     IS_FLOAT, flip, KEY64)
            t1, t2, t3 = _count3(key, ok, m1, m2, m3)
            c1 += t1
            c2 += t2
            c3 += t3
        lo, hi, c_lo = _narrow(lo, hi, c_lo, k, k, c1, c2, c3, m1, m2, m3)
    n_above = tl.full([], 0, tl.int64)
    for start in range(0, C, FT):
        key, idx, ok = _src_tile(x_ptr, row_off, sbuf, sidx, start, C, from_input, FT,
                                 IS_FLOAT, flip, KEY64)
        n_above += tl.sum((ok & (key > lo.to(key.dtype))).to(tl.int32), axis=0)
    quota = k - n_above
    gt_base = tl.full([], 0, tl.int64)
    eq_base = tl.full([], 0, tl.int64)
    for start in range(0, C, FT):
        key, idx, ok = _src_tile(x_ptr, row_off, sbuf, sidx, start, C, from_input, FT,
                                 IS_FLOAT, flip, KEY64)
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
def _take_threshold(sbuf, sidx, n_gt, k, CAP, out_row,
                    PACK: tl.constexpr, FT: tl.constexpr, KEY64: tl.constexpr):
    """Fewer than k keys exceed the threshold T but at least k reach it: the k-th key is T.
    Take every survivor (slots [0, n_gt)) and the first k - n_gt ties (slots from CAP)."""
    for start in range(0, n_gt, FT):
        key, idx, ok = _src_tile(sbuf, 0, sbuf, sidx, start, n_gt, False, FT, False, 0, KEY64)
        _store_winners(out_row + start, tl.arange(0, FT), ok, key, idx, PACK)
    quota = k - n_gt
    for start in range(0, quota, FT):
        key, idx, ok = _src_tile(sbuf, 0, sbuf + CAP, sidx + CAP, start, quota, False, FT,
                                 False, 0, KEY64)
        _store_winners(out_row + n_gt + start, tl.arange(0, FT), ok, key, idx, PACK)


@triton.jit
def _write_out(x_ptr, row_off, idx_row, val_row, k,
               SORT: tl.constexpr, KP: tl.constexpr, FT: tl.constexpr):
    """out_row holds the k winners (packed key|index when SORT); sort them if asked, then read
    their values back from the input (exact values, whatever the key canonicalised)."""
    if SORT:
        j = tl.arange(0, KP)
        ok = j < k
        e = tl.load(idx_row + j, mask=ok, other=-9223372036854775807 - 1)
        e = tl.sort(e, descending=True)
        idx = e & 0xFFFFFFFF
        v = tl.load(x_ptr + row_off + idx, mask=ok)
        tl.debug_barrier()  # every packed entry is read before the first is overwritten
        tl.store(idx_row + j, idx, mask=ok)
        tl.store(val_row + j, v, mask=ok)
    else:
        for start in range(0, k, FT):
            j = start + tl.arange(0, FT)
            ok = j < k
            idx = tl.load(idx_row + j, mask=ok, other=0)
            v = tl.load(x_ptr + row_off + idx, mask=ok)
            tl.store(val_row + j, v, mask=ok)


@triton.jit
def _row_buffers(ws_ptr, off_sbuf, off_sidx, r64, CAP, EQ_CAP, KEY64: tl.constexpr):
    """The row's survivor buffer: int64 slots [0, CAP) for keys > T and [CAP, CAP + EQ_CAP) for
    keys == T (key << 32 | index), plus an int32 index array when keys are 64-bit."""
    row = r64 * (CAP + EQ_CAP)
    sbuf = ws_ptr + off_sbuf + row
    sidx = (ws_ptr + off_sidx).to(tl.pointer_type(tl.int32)) + row
    return sbuf, sidx


@triton.jit
def _finish_row(x_ptr, r, row_off, N, k, ws_ptr, off_sbuf, off_sidx, CAP, EQ_CAP,
                n_gt, n_eq, T, val_ptr, idx_ptr,
                FILTERED: tl.constexpr, SORT: tl.constexpr, KP: tl.constexpr,
                FT: tl.constexpr, IS_FLOAT: tl.constexpr, flip, KEY64: tl.constexpr):
    """Select row r's k winners (from its survivors, from the threshold's ties, or from the
    whole row), then write them out sorted or not."""
    r64 = r.to(tl.int64)
    out_off = r64 * k
    idx_row = idx_ptr + out_off
    sbuf, sidx = _row_buffers(ws_ptr, off_sbuf, off_sidx, r64, CAP, EQ_CAP, KEY64)
    if FILTERED:
        kept = n_gt <= CAP
        # Usually the k-th key is among the few thousand survivors above T. If the sample was
        # off (fewer than k keys reach T, or the buffer overflowed) the whole row is the source.
        use_buf = kept & (n_gt >= k)
        if kept & (n_gt < k) & (n_gt + n_eq >= k):
            _take_threshold(sbuf, sidx, n_gt, k, CAP, idx_row, SORT, FT, KEY64)
        else:
            _select(x_ptr, row_off, sbuf, sidx, tl.where(use_buf, n_gt, N), k,
                    T.to(tl.int64) + 1, ~use_buf, idx_row, SORT, FT, IS_FLOAT, flip, KEY64)
    else:
        _select(x_ptr, row_off, sbuf, sidx, N, k, tl.full([], 0, tl.int64), True, idx_row,
                SORT, FT, IS_FLOAT, flip, KEY64)
    tl.debug_barrier()  # the winners written by all threads are visible to all threads
    _write_out(x_ptr, row_off, idx_row, val_ptr + out_off, k, SORT, KP, FT)


@triton.jit
def _filter_tile(x, ok, tile_ptr, tile, valid, T, sbuf, sidx, cnt_ptr, n_gt, n_eq, CAP, EQ_CAP,
                 unit, ATOMIC: tl.constexpr, TILE: tl.constexpr, SUB: tl.constexpr,
                 IS_FLOAT: tl.constexpr, flip, KEY64: tl.constexpr):
    """One tile of the filter: keys > T to the survivor slots [0, CAP) of the row's buffer,
    keys == T to its tie slots [CAP, CAP + EQ_CAP). Both flags travel in one int32 (bits 0 and
    16): one reduction counts both kinds, one cumsum ranks both.

    A tile without survivors stops after that one count, so the loop holds only the tile and
    its keys. A tile with survivors (usually one or two: a row keeps a few thousand) marks its
    SUB-lane parts that have some in a bitmask (one small reduction); only those parts re-read
    their SUB elements (from L1) and rank and scatter them, one element per thread. So the
    scatter never needs the whole tile's registers nor a layout conversion of the tile, and a
    survivor costs about one part's reload, cumsum and store."""
    key = _order_key(x, IS_FLOAT, flip, KEY64)
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
        NSUB: tl.constexpr = TILE // SUB
        busy = tl.max(tl.reshape(code, [NSUB, SUB]), axis=1) > 0
        parts_mask = tl.sum(tl.where(busy, 1 << tl.arange(0, NSUB).to(tl.int64), 0), axis=0)
        lane = tl.arange(0, SUB) * unit
        room = tl.maximum(tl.minimum(CAP - base, TILE), 0).to(tl.int32)
        room_eq = tl.maximum(tl.minimum(EQ_CAP - base_eq, TILE), 0).to(tl.int32)
        prior = tl.full([], 0, tl.int32)  # packed ranks (bits 0 and 16) of earlier parts
        for j in range(NSUB):
            if ((parts_mask >> j) & 1) != 0:
                sub_ok = lane < valid - j * SUB
                ks = _order_key(tl.load(tile_ptr + j * SUB + lane, mask=sub_ok, other=0),
                                IS_FLOAT, flip, KEY64)
                gt = (ks > T) & sub_ok
                eq = (ks == T) & sub_ok
                sub_code = gt.to(tl.int32) | (eq.to(tl.int32) << 16)
                rank = prior + tl.cumsum(sub_code, axis=0)
                prior += tl.sum(sub_code, axis=0)
                pos = tl.where(gt, (rank & 0xFFFF) - 1, (rank >> 16) - 1)
                keep = tl.where(gt, pos < room, eq & (pos < room_eq))
                slot = tl.where(gt, base, CAP + base_eq) + pos
                idx = (tile + j * SUB).to(tl.int32) + lane  # the low 32 bits of the index
                if KEY64:
                    tl.store(sbuf + slot, ks, mask=keep)
                    tl.store(sidx + slot, idx, mask=keep)
                else:
                    tl.store(sbuf + slot,
                             (ks.to(tl.int64) << 32) | (idx.to(tl.int64) & 0xFFFFFFFF),
                             mask=keep)
    return n_gt + c_gt, n_eq + c_eq


@triton.jit
def _filter_chunk(x_ptr, row_off, N, start, ntiles, T, sbuf, sidx, cnt_ptr, CAP, EQ_CAP,
                  ATOMIC: tl.constexpr, TILE: tl.constexpr, SUB: tl.constexpr,
                  IS_FLOAT: tl.constexpr, flip, KEY64: tl.constexpr):
    """Stream ntiles tiles of a row from `start` through the filter (positions: one atomic
    per tile on the row's counters when several programs share the row, else running counts).
    The next tile is loaded before the current one is processed: two tiles per program in
    flight. Lanes are 32-bit offsets from a 64-bit scalar base."""
    # `unit` is 1 at run time but unknown to the compiler: the rare survivor parts then get one
    # element per thread per access (coalesced, 128 bytes per warp), the layout their
    # scattered stores need, so nothing goes through a layout conversion in shared memory.
    # The tiles themselves keep the vectorised layout of 16-byte loads.
    unit = (N >= 0).to(tl.int32)
    lane = tl.arange(0, TILE)
    n_gt = tl.full([], 0, tl.int64)
    n_eq = tl.full([], 0, tl.int64)
    row_ptr = x_ptr + row_off
    valid = tl.maximum(tl.minimum(N - start, TILE), 0).to(tl.int32)
    x = tl.load(row_ptr + start + lane, mask=lane < valid, other=0)
    for t in range(ntiles):
        tile = start + t * TILE
        valid = tl.maximum(tl.minimum(N - tile, TILE), 0).to(tl.int32)
        valid_next = tl.maximum(tl.minimum(N - tile - TILE, TILE), 0).to(tl.int32)
        valid_next = tl.where(t + 1 < ntiles, valid_next, 0)
        x_next = tl.load(row_ptr + tile + TILE + lane, mask=lane < valid_next, other=0)
        n_gt, n_eq = _filter_tile(x, lane < valid, row_ptr + tile, tile, valid, T, sbuf, sidx,
                                  cnt_ptr, n_gt, n_eq, CAP, EQ_CAP, unit, ATOMIC, TILE, SUB,
                                  IS_FLOAT, flip, KEY64)
        x = x_next
    return n_gt, n_eq


# ---------------------------------------------------------------------------------------------
# Kernels: the radix launches
# ---------------------------------------------------------------------------------------------
@triton.jit
def _sample_top(x_ptr, row_off, r, N, s, lists, SS: tl.constexpr, MS: tl.constexpr,
                IS_FLOAT: tl.constexpr, flip, KEY64: tl.constexpr):
    """Sample block s of row r: SS keys, of which the top MS (in no order) go to the row's list
    (the threshold needs only the top of each block): the MS-th largest by the same search
    as everywhere else, then the keys above it and enough of its ties, ranked by a cumsum."""
    keys = _sample_keys(x_ptr, row_off, r, N, s, SS, IS_FLOAT, flip, KEY64)
    every = keys == keys
    t = _mth_largest(keys, every, MS, KEY64)
    above = keys > t
    tied = keys == t
    rank = tl.where(above, tl.cumsum(above.to(tl.int32), axis=0),
                    tl.sum(above.to(tl.int32), axis=0) + tl.cumsum(tied.to(tl.int32), axis=0)) - 1
    tl.store(lists + s * MS + rank, keys, mask=(above | tied) & (rank < MS))


# Integer arguments that would otherwise be specialised (== 1, divisible by 16) into separate
# compiled variants: only the row length and stride matter to the code (16-byte loads).
_SIZES = ["k", "m", "CAP", "EQ_CAP", "TPP", "NB", "SB", "flip", "off_lists", "off_sbuf",
          "off_sidx", "R"]


@triton.jit(do_not_specialize=_SIZES[:-1] + ["N", "row_stride"])
def _radix_sample_kernel(x_ptr, ws_ptr, off_lists, N, row_stride, SB, flip,
                         SS: tl.constexpr, MS: tl.constexpr,
                         IS_FLOAT: tl.constexpr, KEY64: tl.constexpr):
    """The split mode's first launch: the sample blocks of every row."""
    r = tl.program_id(0)
    s = tl.program_id(1)
    r64 = r.to(tl.int64)
    if s == 0:
        # The row's counters start at zero before the filter launch adds to them.
        tl.store(ws_ptr + COUNTERS * r64 + tl.arange(0, COUNTERS),
                 tl.zeros([COUNTERS], tl.int64))
    lists = _typed(ws_ptr, off_lists, True, KEY64) + r64 * (SB * MS)
    _sample_top(x_ptr, r64 * row_stride, r, N, s, lists, SS, MS, IS_FLOAT, flip, KEY64)


@triton.jit(do_not_specialize=_SIZES[:-1])
def _radix_filter_kernel(x_ptr, ws_ptr, off_lists, off_sbuf, off_sidx, val_ptr, idx_ptr,
                         N, row_stride, k, m, CAP, EQ_CAP, TPP, NB, SB, flip,
                         COOP: tl.constexpr, SS: tl.constexpr, MS: tl.constexpr,
                         TILE: tl.constexpr,
                         SUB: tl.constexpr, SORT: tl.constexpr, KP: tl.constexpr,
                         FT: tl.constexpr, IS_FLOAT: tl.constexpr, KEY64: tl.constexpr):
    """NB programs share row r, SB sample blocks (of MS tops each) feed its threshold. Per row,
    int64 counters: survivors, ties, programs that sampled, programs that filtered, programs
    that gave up waiting.

    COOP (one launch, SB == NB): each program first draws sample block p of its row, then
    waits until all NB programs of the row have (a spin on the row's counter; the launcher keeps
    the whole grid within one program per SM, so every program is resident and the wait ends).
    Otherwise a previous launch drew the samples. Each program then derives the same threshold
    from the union of the sample tops, filters its chunk, and the last program of the row to
    finish (a ticket) selects the k winners from the survivors: no launch waits for the slowest
    row."""
    r = tl.program_id(0)
    p = tl.program_id(1)
    r64 = r.to(tl.int64)
    row_off = r64 * row_stride
    cnt = ws_ptr + COUNTERS * r64
    lists = _typed(ws_ptr, off_lists, True, KEY64) + r64 * (SB * MS)
    ready = True
    if COOP:
        _sample_top(x_ptr, row_off, r, N, p, lists, SS, MS, IS_FLOAT, flip, KEY64)
        tl.debug_barrier()  # every thread's list stores precede the release below
        tl.atomic_add(cnt + 2, 1, sem="release")
        arrived = tl.atomic_add(cnt + 2, 0, sem="acquire")
        polls = tl.full([], 0, tl.int32)
        while (arrived < NB) & (polls < SPIN_LIMIT):
            arrived = tl.atomic_add(cnt + 2, 0, sem="acquire")
            polls += 1
        ready = arrived >= NB
        if arrived < NB:
            # Programs of the row that never became resident (another stream's persistent
            # kernel holding SMs?): stop waiting, mark the row, and let the finisher select
            # from the whole row. Slow, but it cannot hang.
            tl.atomic_add(cnt + 4, 1, sem="relaxed")
    j = tl.arange(0, UNION)
    used = j < SB * MS
    tops = tl.load(lists + j, mask=used, other=0, cache_modifier=".cg")
    T = _mth_largest(tops, used, m, KEY64)
    sbuf, sidx = _row_buffers(ws_ptr, off_sbuf, off_sidx, r64, CAP, EQ_CAP, KEY64)
    if ready:
        _filter_chunk(x_ptr, row_off, N, p.to(tl.int64) * TPP * TILE, TPP, T, sbuf, sidx, cnt,
                      CAP, EQ_CAP, True, TILE, SUB, IS_FLOAT, flip, KEY64)
    tl.debug_barrier()  # every thread's survivor stores precede the release below
    ticket = tl.atomic_add(cnt + 3, 1, sem="acq_rel")
    if ticket == NB - 1:
        n_gt = tl.atomic_add(cnt, 0, sem="acquire")
        n_eq = tl.atomic_add(cnt + 1, 0, sem="acquire")
        if COOP:
            # A marked row reads as an overflowing buffer: the finisher takes the whole row.
            n_gt = tl.where(tl.atomic_add(cnt + 4, 0, sem="acquire") > 0, CAP + 1, n_gt)
        _finish_row(x_ptr, r, row_off, N, k, ws_ptr, off_sbuf, off_sidx, CAP, EQ_CAP,
                    n_gt, n_eq, T, val_ptr, idx_ptr,
                    True, SORT, KP, FT, IS_FLOAT, flip, KEY64)


@triton.jit(do_not_specialize=["N", "row_stride", "k", "flip"])
def _radix_direct_kernel(x_ptr, val_ptr, idx_ptr, N, row_stride, k, flip,
                         SORT: tl.constexpr, KP: tl.constexpr, FT: tl.constexpr,
                         IS_FLOAT: tl.constexpr, KEY64: tl.constexpr):
    """Rows short enough for one tile: one program per row selects from the row itself."""
    r = tl.program_id(0)
    r64 = r.to(tl.int64)
    zero = tl.full([], 0, tl.int64)
    if KEY64:
        T = zero
    else:
        T = zero.to(tl.int32)
    _finish_row(x_ptr, r, r64 * row_stride, N, k, idx_ptr, 0, 0, 0, 0, zero, zero, T,
                val_ptr, idx_ptr, False, SORT, KP, FT, IS_FLOAT, flip, KEY64)


@triton.jit(do_not_specialize=_SIZES[:-1])
def _radix_rows_kernel(x_ptr, ws_ptr, off_sbuf, off_sidx, val_ptr, idx_ptr,
                       N, row_stride, k, m, CAP, EQ_CAP, flip,
                       SS: tl.constexpr, TILE: tl.constexpr,
                       SUB: tl.constexpr, SORT: tl.constexpr, KP: tl.constexpr, FT: tl.constexpr,
                       IS_FLOAT: tl.constexpr, KEY64: tl.constexpr):
    """Sample, filter and finish one row in one program: many rows, one launch."""
    r = tl.program_id(0)
    r64 = r.to(tl.int64)
    row_off = r64 * row_stride
    keys = _sample_keys(x_ptr, row_off, r, N, 0, SS, IS_FLOAT, flip, KEY64)
    T = _mth_largest(keys, keys == keys, m, KEY64)
    sbuf, sidx = _row_buffers(ws_ptr, off_sbuf, off_sidx, r64, CAP, EQ_CAP, KEY64)
    n_gt, n_eq = _filter_chunk(x_ptr, row_off, N, tl.full([], 0, tl.int64),
                               tl.cdiv(N, TILE), T, sbuf, sidx, ws_ptr, CAP, EQ_CAP,
                               False, TILE, SUB, IS_FLOAT, flip, KEY64)
    tl.debug_barrier()  # the buffers written by all threads are read by all threads
    _finish_row(x_ptr, r, row_off, N, k, ws_ptr, off_sbuf, off_sidx, CAP, EQ_CAP,
                n_gt, n_eq, T, val_ptr, idx_ptr,
                True, SORT, KP, FT, IS_FLOAT, flip, KEY64)


# ---------------------------------------------------------------------------------------------
# Kernels: tournament
# ---------------------------------------------------------------------------------------------
# N, row_stride and CPP stay specialised: their divisibility by 16 gives the tiles 16-byte loads.
@triton.jit(do_not_specialize=["k", "NB", "flip", "off_max", "off_hot", "off_cand"])
def _tournament_kernel(x_ptr, ws_ptr, off_max, off_hot, off_cand, val_ptr, idx_ptr,
                       N, row_stride, k, CPP, NB, flip,
                       SHARED: tl.constexpr, G: tl.constexpr, TILE: tl.constexpr,
                       MAXP: tl.constexpr, HOT: tl.constexpr, FT: tl.constexpr,
                       SORT: tl.constexpr, KP: tl.constexpr, IS_FLOAT: tl.constexpr):
    """Program p of row r takes the chunk [p * CPP, (p + 1) * CPP) of the row and its share kc
    = min(k, chunk length) of k:

      1. stream the chunk once, keeping only the maximum key of each group of G elements;
      2. T = the kc-th largest group maximum. Then at least kc elements reach T (one per group),
         so the chunk's kc largest all reach T and lie in the kc groups whose maximum does
         ("hot" groups; more only where maxima tie at T);
      3. gather the hot groups (HOT * G elements, from L2) and select their kc largest.

    No sample, no margin, no wait: the cut is exact by construction. With several programs per
    row (SHARED) each writes its winners (key << 32 | index) to the row's candidate list and
    the last to finish (a ticket) selects the row's k from those NB * k. Too many hot groups
    (many maxima equal to T) send the chunk to the whole-chunk selection: slow, always exact.
    Keys of at most 32 bits, k <= HOT / 2."""
    r = tl.program_id(0)
    p = tl.program_id(1)
    r64 = r.to(tl.int64)
    row_off = r64 * row_stride
    start = p.to(tl.int64) * CPP
    n_here = tl.minimum(N - start, CPP).to(tl.int32)
    prog = r64 * NB + p
    lowest, highest = _key_limits(False)
    chunk_ptr = x_ptr + row_off + start
    # 1. group maxima, tile by tile (the next tile's load in flight), to the workspace.
    GT: tl.constexpr = TILE // G
    group = tl.arange(0, GT)
    cols = tl.arange(0, G)
    lane = group[:, None] * G + cols[None, :]
    maxima = (ws_ptr + off_max).to(tl.pointer_type(tl.int32)) + prog * MAXP
    ntiles = tl.cdiv(n_here, TILE)
    x = tl.load(chunk_ptr + lane, mask=lane < n_here, other=0)
    for t in range(ntiles):
        base = t * TILE
        ahead = tl.where(t + 1 < ntiles, n_here - base - TILE, 0)
        x_next = tl.load(chunk_ptr + base + TILE + lane, mask=lane < ahead, other=0)
        key = tl.where(lane < n_here - base, _order_key(x, IS_FLOAT, flip, False), lowest)
        tl.store(maxima + t * GT + group, tl.max(key, axis=1))
        x = x_next
    tl.debug_barrier()  # every thread's maxima are stored before any thread reads them
    # 2. the cut among the group maxima (all groups are hot when there are few).
    ngroups = tl.cdiv(n_here, G)
    kc = tl.minimum(k, n_here)
    j = tl.arange(0, MAXP)
    okm = j < ngroups
    mx = tl.load(maxima + j, mask=okm, other=lowest)
    T = tl.full([], lowest, tl.int32)
    if ngroups > HOT:
        lo = tl.min(tl.where(okm, mx, highest), axis=0).to(tl.int64)
        hi = tl.max(tl.where(okm, mx, lowest), axis=0).to(tl.int64)
        # Any cut that kc to HOT maxima reach will do: the search stops at the first.
        T = _cut(mx, okm, kc, HOT, lo, hi).to(tl.int32)
    hot = okm & (mx >= T)
    n_hot = tl.sum(hot.to(tl.int32), axis=0)
    if SHARED:
        dest = ws_ptr + off_cand + prog * k
    else:
        dest = idx_ptr + r64 * k
    C: tl.constexpr = HOT * G
    if n_hot <= HOT:
        # 3. the hot groups' elements (read again, from L2), and their kc largest.
        hots = (ws_ptr + off_hot).to(tl.pointer_type(tl.int32)) + prog * HOT
        tl.store(hots + tl.cumsum(hot.to(tl.int32), axis=0) - 1, j, mask=hot)
        tl.debug_barrier()
        h = tl.arange(0, HOT)
        gid = tl.load(hots + h, mask=h < n_hot, other=0)
        pos = gid[:, None] * G + cols[None, :]
        okc = (h < n_hot)[:, None] & (pos < n_here)
        key = _order_key(tl.load(chunk_ptr + pos, mask=okc, other=0), IS_FLOAT, flip, False)
        key = tl.reshape(key, [C])
        okc = tl.reshape(okc, [C])
        idx = tl.reshape(pos, [C]) + start.to(tl.int32)  # low 32 bits of the row index
        if SHARED:
            _take_k(key, idx, okc, kc, T.to(tl.int64), dest, True, False)
        else:
            _take_k(key, idx, okc, kc, T.to(tl.int64), dest, SORT, False)
    else:
        if SHARED:
            _select(chunk_ptr, 0, ws_ptr, ws_ptr, n_here, kc, tl.full([], 0, tl.int64), True,
                    dest, True, C, IS_FLOAT, flip, False)
            # The whole-chunk selection numbers elements from the chunk's start.
            tl.debug_barrier()
            for s0 in range(0, kc, C):
                e = s0 + tl.arange(0, C)
                v = tl.load(dest + e, mask=e < kc)
                tl.store(dest + e, v + start, mask=e < kc)
        else:
            _select(chunk_ptr, 0, ws_ptr, ws_ptr, n_here, kc, tl.full([], 0, tl.int64), True,
                    dest, SORT, C, IS_FLOAT, flip, False)
    tl.debug_barrier()  # the winners written by all threads are visible to all threads
    if SHARED:
        ticket = tl.atomic_add(ws_ptr.to(tl.pointer_type(tl.int32)) + r64, 1, sem="acq_rel")
        if ticket == NB - 1:
            # The row's last program: the k largest of the NB lists (list q holds
            # min(k, length of chunk q) winners; a chunk is CPP long but the last). The slots
            # past a list's count were never written: reading them took garbage for winners.
            c = tl.arange(0, FT)
            owner = c // k
            chunk_len = tl.minimum(N - owner.to(tl.int64) * CPP, CPP)
            ok = (owner < NB) & (c - owner * k < tl.minimum(chunk_len, k))
            v = tl.load(ws_ptr + off_cand + r64 * NB * k + c, mask=ok, other=0,
                        cache_modifier=".cg")
            key = (v >> 32).to(tl.int32)
            lo = tl.min(tl.where(ok, key, highest), axis=0).to(tl.int64)
            _take_k(key, v.to(tl.int32), ok, k, lo, idx_ptr + r64 * k, SORT, False)
            tl.debug_barrier()
            _write_out(x_ptr, row_off, idx_ptr + r64 * k, val_ptr + r64 * k, k, SORT, KP, FT)
    else:
        _write_out(x_ptr, row_off, idx_ptr + r64 * k, val_ptr + r64 * k, k, SORT, KP, KP)


# ---------------------------------------------------------------------------------------------
# Kernels: maxima (one cut for the whole row, from supergroup maxima)
# ---------------------------------------------------------------------------------------------
@triton.jit(do_not_specialize=["flip", "off_smax", "off_gmax", "NGR", "SR"])
def _maxima_pass_kernel(x_ptr, ws_ptr, off_smax, off_gmax, N, row_stride, NGR, SR, CPP, flip,
                        G: tl.constexpr, TILE: tl.constexpr, SG: tl.constexpr,
                        EVICT: tl.constexpr, IS_FLOAT: tl.constexpr, KEY64: tl.constexpr,
                        PDL: tl.constexpr):
    """Launch 1 of maxima: program p of row r streams the chunk [p * CPP, (p + 1) * CPP) once
    and writes the maximum key of each group of G elements and of each supergroup of SG
    elements, the next tile loading while the current one is reduced. No search and no
    waiting: it runs at the speed of reading the row. Program 0 of each row also clears the
    row's counters for launch 2 (no memset launch).

    One program a chunk, not persistent programs taking chunks in turn: the persistent loop
    (its next address computed in 64 bits every step) took 110 registers instead of 78, so
    two programs fit an SM instead of three, and measured slower on the H200 (16M elements
    22 -> 26 us, 130M 130 -> 165 us).

    PDL: launch 2 may be scheduled once every program here has started (it waits for this
    launch to finish before it reads anything)."""
    if PDL:
        gdc_launch_dependents()
    r = tl.program_id(0)
    p = tl.program_id(1)
    r64 = r.to(tl.int64)
    start = p.to(tl.int64) * CPP
    n_here = tl.minimum(N - start, CPP).to(tl.int32)
    lowest, highest = _key_limits(KEY64)
    if p == 0:
        tl.store(ws_ptr + COUNTERS * r64 + tl.arange(0, COUNTERS),
                 tl.zeros([COUNTERS], tl.int64))
    GT: tl.constexpr = TILE // G
    group = tl.arange(0, GT)
    cols = tl.arange(0, G)
    lane = group[:, None] * G + cols[None, :]
    chunk_ptr = x_ptr + r64 * row_stride + start
    gmax = _typed(ws_ptr, off_gmax, True, KEY64) + r64 * NGR + start // G
    smax = _typed(ws_ptr, off_smax, True, KEY64) + r64 * SR + start // SG
    ntiles = tl.cdiv(n_here, TILE)
    acc = tl.full([], lowest, gmax.dtype.element_ty)
    x = tl.load(chunk_ptr + lane, mask=lane < n_here, other=0, eviction_policy=EVICT)
    for t in range(ntiles):
        base = t * TILE
        ahead = tl.where(t + 1 < ntiles, n_here - base - TILE, 0)
        x_next = tl.load(chunk_ptr + base + TILE + lane, mask=lane < ahead, other=0,
                         eviction_policy=EVICT)
        key = tl.where(lane < n_here - base, _order_key(x, IS_FLOAT, flip, KEY64), lowest)
        gm = tl.max(key, axis=1)
        tl.store(gmax + t * GT + group, gm)
        if SG <= TILE:
            SPT: tl.constexpr = TILE // SG
            sm = tl.max(tl.reshape(gm, [SPT, SG // G]), axis=1)
            tl.store(smax + t * SPT + tl.arange(0, SPT), sm)
        else:
            acc = tl.maximum(acc, tl.max(gm, axis=0))
        x = x_next
    if SG > TILE:
        tl.store(smax, acc)  # the plan makes CPP == SG here: one supergroup per program


@triton.jit
def _append_survivors(key, idx, ok, T, sbuf, sidx, cnt_ptr, CAP, EQ_CAP, KEY64: tl.constexpr):
    """Keys > T of a 1-d tile to the row's survivor slots [0, CAP), keys == T to its tie slots
    [CAP, CAP + EQ_CAP): one atomic per kind reserves the tile's slots, one cumsum of both
    flags (bits 0 and 16 of an int32) ranks them. Counts go on past the capacities, so the
    finisher can tell an overflow."""
    gt = ok & (key > T)
    eq = ok & (key == T)
    code = gt.to(tl.int32) | (eq.to(tl.int32) << 16)
    total = tl.sum(code, axis=0)
    c_gt = total & 0xFFFF
    c_eq = total >> 16
    if total > 0:
        base = tl.atomic_add(cnt_ptr, c_gt.to(tl.int64), mask=c_gt > 0, sem="relaxed")
        base_eq = tl.atomic_add(cnt_ptr + 1, c_eq.to(tl.int64), mask=c_eq > 0, sem="relaxed")
        rank = tl.cumsum(code, axis=0)
        pos = tl.where(gt, base + (rank & 0xFFFF) - 1, base_eq + (rank >> 16) - 1)
        keep = tl.where(gt, pos < CAP, eq & (pos < EQ_CAP))
        slot = tl.where(gt, pos, CAP + pos)
        if KEY64:
            tl.store(sbuf + slot, key, mask=keep)
            tl.store(sidx + slot, idx, mask=keep)
        else:
            tl.store(sbuf + slot, (key.to(tl.int64) << 32) | (idx.to(tl.int64) & 0xFFFFFFFF),
                     mask=keep)


@triton.jit
def _candidate(sbuf, sidx, n_gt, CAP, u, ok, KEY64: tl.constexpr):
    """Entry u of a row's candidates: survivors [0, n_gt) first, then the ties from slot CAP.
    Returns (order, key, index): `order` sorts candidates in the output's order (the packed
    key << 32 | index for 32-bit keys, the key for 64-bit keys, whose ties are then broken by
    the index)."""
    slot = tl.where(u < n_gt, u, CAP + u - n_gt)
    if KEY64:
        key = tl.load(sbuf + slot, mask=ok, other=0, cache_modifier=".cg")
        idx = tl.load(sidx + slot, mask=ok, other=0, cache_modifier=".cg").to(tl.int64)
        idx = idx & 0xFFFFFFFF
        order = key
    else:
        order = tl.load(sbuf + slot, mask=ok, other=0, cache_modifier=".cg")
        key = order >> 32
        idx = order & 0xFFFFFFFF
    return order, key, idx


@triton.jit
def _rank_block(sbuf, sidx, n_gt, CAP, c, okc, ou, ku, iu, oku, KEY64: tl.constexpr):
    """The ranks of candidates c among the loaded ones (ou, ku, iu), and their indices."""
    oc, kc, ic = _candidate(sbuf, sidx, n_gt, CAP, c, okc, KEY64)
    before = oku[None, :] & (ou[None, :] > oc[:, None])
    if KEY64:
        before = before | (oku[None, :] & (ku[None, :] == kc[:, None]) & (iu[None, :] > ic[:, None]))
    return tl.sum(before.to(tl.int32), axis=1), ic


@triton.jit
def _rank_candidates(x_ptr, row_off, sbuf, sidx, n_gt, n_tie, CAP, k, c_lo, c_hi, val_row,
                     idx_row, CB: tl.constexpr, UB: tl.constexpr, KEY64: tl.constexpr):
    """Candidates [c_lo, c_hi) of a row's C = n_gt + n_tie: each one's rank is the number of
    candidates that come before it in the output (a larger key, or an equal key and a larger
    index), so ranks are distinct and ranks 0 .. k-1 are the k winners in order. Each winner is
    written straight to its place: no selection, no sort. Programs that rank disjoint slices
    of the same candidates together write every output once; any two rankings of the same
    candidates write the same values, so a program that ranks everything (the fallback) may
    overlap them. Up to UB candidates stay in registers while CB at a time are ranked; more
    are re-read UB at a time for every block."""
    C = n_gt + n_tie
    if C <= UB:
        u = tl.arange(0, UB)
        oku = u < C
        ou, ku, iu = _candidate(sbuf, sidx, n_gt, CAP, u, oku, KEY64)
        for c0 in range(c_lo, c_hi, CB):
            c = c0 + tl.arange(0, CB)
            okc = c < c_hi
            rank, ic = _rank_block(sbuf, sidx, n_gt, CAP, c, okc, ou, ku, iu, oku, KEY64)
            win = okc & (rank < k)
            tl.store(idx_row + rank, ic, mask=win)
            tl.store(val_row + rank, tl.load(x_ptr + row_off + ic, mask=win), mask=win)
    else:
        for c0 in range(c_lo, c_hi, CB):
            c = c0 + tl.arange(0, CB)
            okc = c < c_hi
            rank = tl.zeros([CB], tl.int32)
            ic = tl.zeros([CB], tl.int64)
            for u0 in range(0, C, UB):
                u = u0 + tl.arange(0, UB)
                oku = u < C
                ou, ku, iu = _candidate(sbuf, sidx, n_gt, CAP, u, oku, KEY64)
                part, ic = _rank_block(sbuf, sidx, n_gt, CAP, c, okc, ou, ku, iu, oku, KEY64)
                rank += part
            win = okc & (rank < k)
            tl.store(idx_row + rank, ic, mask=win)
            tl.store(val_row + rank, tl.load(x_ptr + row_off + ic, mask=win), mask=win)


@triton.jit(do_not_specialize=["flip", "off_smax", "off_gmax", "off_scr", "off_sbuf",
                               "off_sidx", "k", "k_hi", "NGR", "SR", "NG", "S", "GPP", "NB2",
                               "CAP", "EQ_CAP"])
def _maxima_select_kernel(x_ptr, ws_ptr, off_smax, off_gmax, off_scr, off_sbuf, off_sidx,
                          val_ptr, idx_ptr, N, row_stride, k, k_hi, NGR, SR, NG, S, GPP, NB2,
                          CAP, EQ_CAP, flip,
                          COOP: tl.constexpr, SP: tl.constexpr, G: tl.constexpr,
                          GT2: tl.constexpr, HG: tl.constexpr, CB: tl.constexpr,
                          UB: tl.constexpr, FT: tl.constexpr, IS_FLOAT: tl.constexpr,
                          KEY64: tl.constexpr, PDL: tl.constexpr):
    """Launch 2 of maxima: NB2 programs per row.

      1. T = a supergroup maximum that k to k_hi of the row's S supergroup maxima reach (the
         same 4-ary search in every program: the same T). At least k elements reach T (each
         of those maxima is one), so the row's k largest all do, and each lies in a group
         whose maximum reaches T: a "hot" group.
      2. Program j scans the group maxima of its share of the row (from L2), gathers the
         elements of its hot groups (G each, usually a handful) and appends keys > T to the
         row's survivors, keys == T to its ties.
      3. COOP: the row's programs (all resident: the launcher keeps the grid within one
         program per SM) wait for each other once, then each ranks a slice of the candidates
         (about 1.2 k survivors for random data, plus ties where fewer than k exceed T) and
         writes the winners it finds to their sorted places. A program that waits too long
         (programs never resident: another stream's persistent kernel?) gives up, and the
         row's last program (a ticket) ranks all of them itself. Without COOP the last program
         always does. A survivor list past its capacity (rows whose large values cluster,
         sorted rows for one) sends the last program to select from the whole row: slow,
         always exact."""
    if PDL:
        gdc_wait()  # launched early (programmatic dependent launch): launch 1's writes first
    r = tl.program_id(0)
    j = tl.program_id(1)
    r64 = r.to(tl.int64)
    row_off = r64 * row_stride
    lowest, highest = _key_limits(KEY64)
    # The first tile of this program's group maxima: it does not depend on the cut, so its
    # load is under way during the search.
    g_lo = j * GPP
    g_hi = tl.minimum(g_lo + GPP, NG)
    gmax = _typed(ws_ptr, off_gmax, True, KEY64) + r64 * NGR
    g_first = g_lo + tl.arange(0, GT2)
    gm_first = tl.load(gmax + g_first, mask=g_first < g_hi, other=lowest)
    # 1. The cut.
    s = tl.arange(0, SP)
    oks = s < S
    sm = tl.load(_typed(ws_ptr, off_smax, True, KEY64) + r64 * SR + s, mask=oks, other=lowest)
    hi = tl.max(tl.where(oks, sm, lowest), axis=0)
    if k > 1:
        lo = tl.min(tl.where(oks, sm, highest), axis=0).to(tl.int64)
        T = _cut(sm, oks, k, k_hi, lo, hi.to(tl.int64)).to(sm.dtype)
    else:
        T = hi  # one winner: the cut is the largest maximum, no search
    # 2. The hot groups of this program's share.
    cnt = ws_ptr + COUNTERS * r64
    sbuf, sidx = _row_buffers(ws_ptr, off_sbuf, off_sidx, r64, CAP, EQ_CAP, KEY64)
    scratch = (ws_ptr + off_scr).to(tl.pointer_type(tl.int32)) + (r64 * NB2 + j) * GT2
    cols = tl.arange(0, G)
    slot = tl.arange(0, HG)
    for g0 in range(g_lo, g_hi, GT2):
        g = g0 + tl.arange(0, GT2)
        okg = g < g_hi
        if g0 == g_lo:
            gm = gm_first
        else:
            gm = tl.load(gmax + g, mask=okg, other=lowest)
        hot = okg & (gm >= T)
        n_hot = tl.sum(hot.to(tl.int32), axis=0)
        if n_hot > 0:
            tl.store(scratch + tl.cumsum(hot.to(tl.int32), axis=0) - 1, g, mask=hot)
            tl.debug_barrier()  # the hot list, stored by all threads, is read by all
            for h0 in range(0, n_hot, HG):
                okh = h0 + slot < n_hot
                gid = tl.load(scratch + h0 + slot, mask=okh, other=0)
                pos = gid.to(tl.int64)[:, None] * G + cols[None, :]
                okp = okh[:, None] & (pos < N)
                x = tl.load(x_ptr + row_off + pos, mask=okp, other=0)
                key = _order_key(x, IS_FLOAT, flip, KEY64)
                _append_survivors(tl.reshape(key, [HG * G]),
                                  tl.reshape(pos.to(tl.int32), [HG * G]),  # low 32 bits
                                  tl.reshape(okp, [HG * G]), T, sbuf, sidx, cnt, CAP, EQ_CAP,
                                  KEY64)
            tl.debug_barrier()  # the hot list is read before the next tile overwrites it
    tl.debug_barrier()  # every thread's survivor stores precede the release below
    out = r64 * k
    # 3. Rank the candidates together, or leave it to the last program.
    if COOP:
        tl.atomic_add(cnt + 2, 1, sem="release")
        arrived = tl.atomic_add(cnt + 2, 0, sem="acquire")
        polls = tl.full([], 0, tl.int32)
        while (arrived < NB2) & (polls < SPIN_LIMIT):
            arrived = tl.atomic_add(cnt + 2, 0, sem="acquire")
            polls += 1
        if arrived < NB2:
            tl.atomic_add(cnt + 4, 1, sem="relaxed")  # gave up: the last program ranks all
        else:
            n_gt = tl.atomic_add(cnt, 0, sem="acquire")
            n_eq = tl.atomic_add(cnt + 1, 0, sem="acquire")
            if n_gt <= CAP:
                n_tie = tl.where(n_gt < k, tl.minimum(n_eq, EQ_CAP), 0)
                share = tl.cdiv(n_gt + n_tie, NB2)
                _rank_candidates(x_ptr, row_off, sbuf, sidx, n_gt, n_tie, CAP, k, j * share,
                                 tl.minimum((j + 1) * share, n_gt + n_tie), val_ptr + out,
                                 idx_ptr + out, CB, UB, KEY64)
        tl.debug_barrier()
    ticket = tl.atomic_add(cnt + 3, 1, sem="acq_rel")
    if ticket == NB2 - 1:
        n_gt = tl.atomic_add(cnt, 0, sem="acquire")
        n_eq = tl.atomic_add(cnt + 1, 0, sem="acquire")
        if n_gt > CAP:
            # The whole row, one program (survivors overflowed: clustered large values).
            if KEY64:
                _select(x_ptr, row_off, sbuf, sidx, N, k, tl.full([], 0, tl.int64), True,
                        idx_ptr + out, False, FT, IS_FLOAT, flip, KEY64)
                tl.debug_barrier()
                _write_out(x_ptr, row_off, idx_ptr + out, val_ptr + out, k, False, FT, FT)
            else:
                # The winners (packed) to the spent survivor buffer, then ranked into place.
                _select(x_ptr, row_off, sbuf, sidx, N, k, tl.full([], 0, tl.int64), True,
                        sbuf, True, FT, IS_FLOAT, flip, KEY64)
                tl.debug_barrier()
                _rank_candidates(x_ptr, row_off, sbuf, sidx, k, 0, CAP, k, 0, k,
                                 val_ptr + out, idx_ptr + out, CB, UB, KEY64)
        else:
            gave_up = True
            if COOP:
                gave_up = tl.atomic_add(cnt + 4, 0, sem="acquire") > 0
            if gave_up:
                n_tie = tl.where(n_gt < k, tl.minimum(n_eq, EQ_CAP), 0)
                _rank_candidates(x_ptr, row_off, sbuf, sidx, n_gt, n_tie, CAP, k, 0,
                                 n_gt + n_tie, val_ptr + out, idx_ptr + out, CB, UB, KEY64)


# ---------------------------------------------------------------------------------------------
# Kernels: bitonic
# ---------------------------------------------------------------------------------------------
@triton.jit(do_not_specialize=["R", "k", "flip"])
def _bitonic_kernel(x_ptr, val_ptr, idx_ptr, R, N, k, row_stride, col_stride, flip,
                    ROWS: tl.constexpr, NP: tl.constexpr, KP: tl.constexpr,
                    IS_FLOAT: tl.constexpr):
    """ROWS rows of up to NP elements, loaded once (strided rows too: a column-major tile is
    read along its contiguous axis). Key and column are packed in one int64 so that one
    bitonic network orders both; padding is the smallest int64 and never outranks a real
    element (a real element packed equal to it decodes to the same key and index 0)."""
    pid = tl.program_id(0)
    rows = pid.to(tl.int64) * ROWS + tl.arange(0, ROWS).to(tl.int64)
    cols = tl.arange(0, NP)
    row_ok = rows < R
    col_ok = cols < N
    ptrs = x_ptr + rows[:, None] * row_stride + cols[None, :].to(tl.int64) * col_stride
    x = tl.load(ptrs, mask=row_ok[:, None] & col_ok[None, :], other=0)
    key = _order_key(x, IS_FLOAT, flip, False)
    packed = (key.to(tl.int64) << 32) | cols[None, :].to(tl.int64)
    packed = tl.where(col_ok[None, :], packed, -9223372036854775807 - 1)
    if KP == 1:
        # (triton 3.6's tl.topk reduces one row of k = 1 to a scalar and fails to compile)
        top = tl.max(packed, axis=1)[:, None]
    elif KP < NP:
        top = tl.topk(packed, KP, dim=1)  # a bitonic top-k: log2(KP) merge stages, then halvings
    else:
        top = tl.sort(packed, dim=1, descending=True)
    idx = top & 0xFFFFFFFF
    kc = tl.arange(0, KP)
    om = row_ok[:, None] & (kc[None, :] < k)
    v = tl.load(x_ptr + rows[:, None] * row_stride + idx * col_stride, mask=om)
    out = rows[:, None] * k + kc[None, :]
    tl.store(val_ptr + out, v, mask=om)
    tl.store(idx_ptr + out, idx, mask=om)


# Each kernel's launches: Triton binds the arguments once per plan, later calls go straight to
# the compiled kernel (see Launcher: a call's host time is part of what a user waits for).
_RADIX_SAMPLE = Launcher(_radix_sample_kernel)
_RADIX_FILTER = Launcher(_radix_filter_kernel)
_RADIX_DIRECT = Launcher(_radix_direct_kernel)
_RADIX_ROWS = Launcher(_radix_rows_kernel)
_TOURNAMENT = Launcher(_tournament_kernel)
_MAXIMA_PASS = Launcher(_maxima_pass_kernel)
_MAXIMA_SELECT = Launcher(_maxima_select_kernel)
_BITONIC = Launcher(_bitonic_kernel)


# ---------------------------------------------------------------------------------------------
# The call: torch.topk's argument rules
# ---------------------------------------------------------------------------------------------
class TopkCall(Call):
    __slots__ = ("input", "k", "dim", "largest", "sorted", "nd", "R", "N", "lead",
                 "row_stride", "col_stride", "viewable")

    def for_input(self, input) -> "TopkCall":
        """This call's facts for another tensor of the same shape, strides, dtype and device."""
        c = TopkCall.__new__(TopkCall)
        c.info, c.key, c.input, c.k, c.dim, c.largest, c.sorted, c.nd = (
            self.info, self.key, input, self.k, self.dim, self.largest, self.sorted, self.nd)
        c.R, c.N, c.lead, c.row_stride, c.col_stride, c.viewable = (
            self.R, self.N, self.lead, self.row_stride, self.col_stride, self.viewable)
        return c

    @property
    def empty(self) -> bool:
        return self.k == 0 or self.R == 0

    def describe(self) -> str:
        x = self.input
        return (f"input {tuple(x.shape)} {str(x.dtype)[6:]}, k={self.k}, dim={self.dim}"
                f"{'' if self.largest else ', smallest'}{'' if self.sorted else ', unsorted'}"
                f" on {x.device}")


def _int_arg(value, name: str) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise ArgumentTypeError(f"topk: {name} must be an int, got {type(value).__name__}")
    return operator.index(value)


def _bool_arg(value, name: str) -> bool:
    if not isinstance(value, bool):
        raise ArgumentTypeError(f"topk: {name} must be a bool, got {type(value).__name__}")
    return value


def _layout(shape: tuple, strides: tuple, d: int) -> tuple[int, int, bool]:
    """(row_stride, col_stride, viewable): whether the rows (every dim but d, in order) collapse
    into one dim of a single stride, so kernels can read the input in place."""
    lead = [(shape[i], strides[i]) for i in range(len(shape)) if i != d and shape[i] != 1]
    for (s0, st0), (s1, st1) in zip(lead, lead[1:]):
        if st0 != st1 * s1:
            return 0, 0, False
    row_stride = lead[-1][1] if lead else 0
    return row_stride, (strides[d] if shape else 1), True


#: prepare()'s results by (shape, strides, dtype, device, k, dim, largest, sorted), without
#: their tensors: a call like an earlier one skips the argument checks and the layout work
#: (several microseconds of Python, a fair part of a call that launches in a few more).
_PREPARED: dict[tuple, TopkCall] = {}


def prepare(input, k, dim=-1, largest=True, sorted=True) -> TopkCall:
    # Exact ints and bools only: anything else (a bool k, a numpy integer, a wrong type) takes
    # the checks every time, so every error still comes from them.
    if (type(k) is int and type(dim) is int and type(largest) is bool
            and type(sorted) is bool and isinstance(input, torch.Tensor)):
        memo_key = (input.shape, input.stride(), input.dtype, input.device, k, dim, largest,
                    sorted)
        known = _PREPARED.get(memo_key)
        if known is not None:
            return known.for_input(input)
        call = _prepare(input, k, dim, largest, sorted)
        if len(_PREPARED) >= 4096:
            _PREPARED.clear()
        _PREPARED[memo_key] = call.for_input(None)  # the memo must not keep tensors alive
        return call
    return _prepare(input, k, dim, largest, sorted)


def _prepare(input, k, dim, largest, sorted) -> TopkCall:
    """torch.topk's argument rules, and the facts every backend needs about the call."""
    if not isinstance(input, torch.Tensor):
        raise ArgumentTypeError(f"topk: input must be a Tensor, got {type(input).__name__}")
    k = _int_arg(k, "k")
    dim = _int_arg(dim, "dim")
    largest = _bool_arg(largest, "largest")
    sorted = _bool_arg(sorted, "sorted")
    dtype = input.dtype
    if dtype not in SUPPORTED_DTYPES:
        # Quantized, bool, complex, uint16-64, float8: torch's op answers (some on some devices
        # only) or raises its own error.
        raise TorchOnlyCall(f"topk: input has dtype {dtype}; opselect's kernels take "
                            f"{', '.join(str(d)[6:] for d in SUPPORTED_DTYPES)}")
    shape = tuple(input.shape)
    nd = len(shape)
    span = max(nd, 1)
    if not -span <= dim < span:
        raise DimError(f"topk: dim {dim} is out of range for a {nd}-d input (expected to be in "
                       f"range of [{-span}, {span - 1}], but got {dim})")
    d = dim % span
    n = shape[d] if nd else 1
    if k < 0 or k > n:
        raise InvalidArgument(f"topk: selected index k out of range: k={k} but dim {dim} has "
                              f"size {n} (expected 0 <= k <= {n})")
    call = TopkCall()
    call.input, call.k, call.dim, call.largest, call.sorted, call.nd = (
        input, k, d, largest, sorted, nd)
    call.N = n
    call.R = input.numel() // n if n else math.prod(shape[:d] + shape[d + 1:])
    call.lead = shape[:d] + shape[d + 1:]
    call.row_stride, call.col_stride, call.viewable = _layout(shape, input.stride(), d)
    dev = input.device
    call.info = device_info(dev)
    inner = call.viewable and (call.col_stride == 1 or n <= 1)
    call.key = (dev.index if dev.type == "cuda" else dev.type, dtype, bucket(call.R),
                bucket(n), bucket(k), largest, sorted, "rows" if inner else
                ("strided" if call.viewable else "gather"))
    return call


# ---------------------------------------------------------------------------------------------
# Shared host helpers
# ---------------------------------------------------------------------------------------------
def _rows(call: TopkCall, unit_col: bool) -> tuple[torch.Tensor, int, int]:
    """(tensor, row_stride, col_stride) for kernels reading R rows of N: the input itself when
    its rows are one strided dim (and, if unit_col, elements are adjacent), else a copy."""
    if call.viewable and (not unit_col or call.col_stride == 1 or call.N <= 1):
        return call.input, call.row_stride, (call.col_stride if call.N > 1 else 1)
    xt = call.input.movedim(call.dim, -1).contiguous()
    return xt, call.N, 1


def _outputs(call: TopkCall) -> tuple[torch.Tensor, torch.Tensor]:
    """Values and indices as the kernels write them: R rows of k, contiguous, shaped with the
    input's other dims first (already torch's layout when dim is the last one)."""
    shape = call.lead + (call.k,)
    dev = call.input.device
    return (torch.empty(shape, dtype=call.input.dtype, device=dev),
            torch.empty(shape, dtype=torch.int64, device=dev))


def _shape_out(call: TopkCall, values: torch.Tensor, indices: torch.Tensor):
    """Results from _outputs() -> torch.topk's layout: k at `dim`, contiguous. Under autograd
    the values are gathered again from the input (k per row), which gives them torch's
    gradient (a scatter into the selected positions)."""
    if call.dim != max(call.nd, 1) - 1:
        values = values.movedim(-1, call.dim).contiguous()
        indices = indices.movedim(-1, call.dim).contiguous()
    if call.input.requires_grad and torch.is_grad_enabled():
        values = torch.gather(call.input, call.dim, indices)
    return torch.return_types.topk((values, indices))


def _trivial(call: TopkCall):
    """0-d inputs and empty results: no kernel to launch."""
    if call.nd == 0:
        return torch.topk(call.input, call.k, -1, call.largest, call.sorted)
    if call.k == 0 or call.R == 0:
        return _shape_out(call, *_outputs(call))
    return None


def _key64(dtype: torch.dtype) -> bool:
    return dtype.itemsize == 8


def _torch_topk(call: TopkCall):
    return torch.topk(call.input, call.k, call.dim, call.largest, call.sorted)


# ---------------------------------------------------------------------------------------------
# radix
# ---------------------------------------------------------------------------------------------
class RadixPlan:
    """Launch parameters of the radix backend for one (R, N, k, dtype, config).

    mode: direct (rows of one tile: one program per row selects from the row), fused (one
    program per row samples, filters and finishes), coop (several programs per row, one launch,
    a per-row wait after sampling) or split (the same in two launches: samples, then filter)."""

    __slots__ = ("mode", "SS", "SB", "MS", "m", "B", "TPP", "TILE", "SUB", "CAP",
                 "EQ_CAP", "FT", "KP", "sort_in_kernel", "sort_after", "offsets", "ws_elems",
                 "warps", "expected_survivors", "sample")

    def __repr__(self) -> str:
        return (f"{type(self).__name__}("
                + ", ".join(f"{s}={getattr(self, s)!r}" for s in self.__slots__) + ")")


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
               config: dict) -> RadixPlan:
    key64 = _key64(dtype)
    p = RadixPlan()
    R, N, k = max(R, 1), max(N, 1), max(k, 1)  # empty calls never launch; the plan must exist
    sms = config.get("SMS", sms)
    ft_max = config.get("FT_MAX", FINISH_TILE_MAX)
    block = config.get("SS", SAMPLE_BLOCK)
    coop = config.get("COOP", True)
    if config.get("EXACT"):
        # Sizes to the next power of two (the interpreter: no compiling, small networks).
        tiles_ft = tuple(1 << i for i in range(4, ft_max.bit_length() - 1)) + (ft_max,)
        kps = tuple(1 << i for i in range(11))
    else:
        # Each distinct constexpr is a compiled variant (10-20 s of compiling on first use):
        # few sizes, at some cost in padding (a longer sort, a half-empty tile).
        tiles_ft = tuple(t for t in (256, 1024, 4096, 8192) if t < ft_max) + (ft_max,)
        kps = (64, 1024)
    p.TILE = config.get("TILE", 8192 if coop else 4096)
    p.SUB = min(p.TILE, config.get("SUB", 512))
    p.KP = _quantize(max(k, 1), kps)
    p.sort_in_kernel = sorted_ and not key64 and k <= SORT_MAX
    p.sort_after = sorted_ and not p.sort_in_kernel
    p.EQ_CAP = max(k, 1)
    p.m = p.SS = p.SB = p.MS = p.B = p.TPP = p.CAP = 1
    p.sample = 0
    p.mode = "direct"
    p.FT = _quantize(N, tiles_ft)
    p.expected_survivors = N
    if N > ft_max:
        tiles = cdiv(N, p.TILE)
        if config.get("SPLIT") == 1 or R >= sms:
            B = 1
        elif coop:
            B = max(1, min(tiles, sms // R))  # the whole grid resident: one program per SM
        else:
            B = max(1, min(tiles, cdiv(sms * config.get("PPS", 4), R)))
        p.TPP = cdiv(tiles, B)
        B = cdiv(tiles, p.TPP)
        # Each sampled element costs a 32-byte sector: at most 1/32 of the row, and beyond 64
        # blocks at most 1/256 of it (about 3% of the row's traffic).
        s_target = min(max(block, N // 32), max(64 * block, N // 256))
        sizes = tuple(t for t in (256, 1024) if t < block) + (block,)
        if B == 1:
            # One block of samples, at most 16 per thread of a 4-warp program.
            mode, SS, SB = "fused", _quantize(s_target, sizes), 1
        elif coop:
            mode, SB = "coop", B
            SS = _quantize(cdiv(s_target, B), sizes)
        else:
            mode, SS = "split", block
            SB = min(64, next_pow2(cdiv(s_target, block)))
        f = SS * SB / N
        m = _margin((k - 1) * f)
        if mode == "fused":
            MS = 1
            fits = 2 * m <= SS
        else:
            MS = min(SS, max(BLOCK_TOPS, next_pow2(cdiv(2 * m, SB))))
            fits = 2 * m <= SB * MS <= UNION_MAX
        cap = math.ceil((m + SIGMAS * math.sqrt(m) + SIGMAS) / f) + 64
        if fits and cap < N // 2:
            p.mode, p.SS, p.SB, p.MS, p.m, p.B = mode, SS, SB, MS, m, B
            p.sample = SS * SB
            p.CAP = max(cap, k)
            p.expected_survivors = min(N, math.ceil(m / f))
            p.FT = _quantize(p.CAP, tiles_ft)
            if mode == "fused":
                # One program per row, several per SM: small tiles and few warps, so that
                # one row's sampling and finishing overlap other rows' streaming.
                p.TILE = config.get("FUSED_TILE", 2048)
                p.SUB = min(p.TILE, p.SUB)
                p.TPP = cdiv(N, p.TILE)
        else:
            # k is a large part of the row: no threshold filters well; select from the rows.
            p.TPP = 1
            p.FT = ft_max
    # The workspace (int64 elements): counters [R, 8], sample tops [R, SB * MS] keys, the
    # survivor buffer [R, CAP + EQ_CAP] int64 and, for 64-bit keys, its indices as int32.
    slots = R * (p.CAP + p.EQ_CAP)
    counters = int(COUNTERS) * R
    offs = {"lists": counters}
    lists = R * p.SB * p.MS if p.mode in ("coop", "split") else 0
    off = counters + math.ceil(lists * (1 if key64 else 0.5))
    offs["sbuf"] = off
    off += slots
    offs["sidx"] = off
    off += math.ceil(slots / 2) if key64 else 0
    p.offsets = offs
    p.ws_elems = 0 if p.mode == "direct" else off
    # At most 16 elements of a tile per thread (more spill); the coop finisher lives with the
    # filter's warps, so its tile shrinks to fit them (longer survivor lists loop over tiles).
    if p.mode == "coop":
        # One program per SM, 16 warps: a finisher tile of 16 keys a thread, whatever the
        # survivor count (a fixed size: one compiled variant fewer per shape).
        p.warps = config.get("WARPS", 16)
        p.FT = min(ft_max, 512 * p.warps)
    elif p.mode == "direct":
        p.warps = 4 if p.FT <= 2048 else (8 if p.FT <= 4096 else 16)
    else:
        p.warps = max(4, min(16, max(p.TILE, p.FT) // 512))
        # As many warps as the finisher needs stream tiles of 16 elements a thread.
        p.TILE = max(p.TILE, 512 * p.warps)
        p.SUB = min(p.TILE, max(p.SUB, 512))
        if p.mode == "fused":
            p.TPP = cdiv(N, p.TILE)
        elif p.mode == "split":
            p.TPP = cdiv(cdiv(N, p.TILE), p.B)
            p.B = cdiv(cdiv(N, p.TILE), p.TPP)
    return p


_PLANS: dict[tuple, object] = {}  # every planned backend's plans, keyed by its name first


class _PlannedBackend(Backend):
    """A backend whose launches follow a plan: launch parameters made by _make_plan from the
    call's sizes, dtype, order flag and SM count and a config. Plans are memoized in _PLANS: a
    call's key repeats far more often than it changes (the memo is simply cleared if it ever
    grows large), and the plan object is also the Launchers' spec."""

    #: the heuristics' cost of a plan: (call, model, plan) -> Estimate
    _cost = None

    def _make_plan(self, call: TopkCall, config: dict, sms: int):
        raise NotImplementedError

    def _plan(self, call: TopkCall, config: dict):
        # The config's own order: equal configs built in another order only cost a second plan.
        key = (self.name, call.R, call.N, call.k, call.input.dtype, call.sorted,
               call.info.sm_count, tuple(config.items()))
        plan = _PLANS.get(key)
        if plan is None:
            if len(_PLANS) > 4096:
                _PLANS.clear()
            plan = _PLANS[key] = self._make_plan(call, dict(config), call.info.sm_count)
        return plan

    def plan(self, call: TopkCall, config: dict | None = None):
        return self._plan(call, dict(config or self.configs(call)[0]))

    def _setup(self, call: TopkCall, config: dict):
        """(plan, rows, row stride, values, indices, workspace) of a call the plan takes; a
        plan that refuses the call raises with its reason."""
        p = self._plan(call, config)
        if getattr(p, "reason", None):
            raise OpselectError(f"topk {self.name}: {p.reason}")
        x, row_stride, _ = _rows(call, unit_col=True)
        values, indices = _outputs(call)
        ws = torch.empty(p.ws_elems, dtype=torch.int64, device=x.device)
        return p, x, row_stride, values, indices, ws

    def _finish(self, call: TopkCall, p, values: torch.Tensor, indices: torch.Tensor):
        """torch's layout of the results; winners the kernels left unordered (64-bit keys, k
        past the in-register sort) are sorted here first."""
        if p.sort_after:
            values, order = torch.sort(values, dim=-1, descending=call.largest)
            indices = indices.gather(-1, order)
        return _shape_out(call, values, indices)

    def cost(self, call: TopkCall, model) -> Estimate:
        # The model's SM count, not the call's device: explain() may ask about another GPU.
        plan = self._make_plan(call, dict(self.configs(call)[0]), max(1, model.sm_count))
        return self._cost(call, model, plan)


class RadixBackend(_PlannedBackend):
    name = "radix"
    kernels = (_order_key, _sample_keys, _mth_largest, _count3, _narrow, _cut, _kth, _src_tile,
               _select, _select_tile, _select_tiles, _take_threshold, _write_out, _row_buffers,
               _finish_row, _filter_tile, _filter_chunk, _sample_top, _radix_sample_kernel,
               _radix_filter_kernel, _radix_direct_kernel, _radix_rows_kernel)

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
            return [{"COOP": False, "TILE": 256, "PPS": 2, "SS": 128, "FT_MAX": 512, "SMS": 4,
                     "EXACT": True},
                    {"COOP": False, "TILE": 128, "SPLIT": 1, "SS": 128, "FT_MAX": 256, "SMS": 4,
                     "EXACT": True}]
        # Few configs: tuning compiles each of them (10-20 s apiece) for every new shape.
        if call.R >= call.info.sm_count:
            # One program per row whatever the config: vary its tile instead.
            return [{}, {"FUSED_TILE": 4096}]
        out = [{"COOP": True}] if COOP_ALLOWED else []
        out.append({"COOP": False, "TILE": 4096, "PPS": 4})
        if call.N <= (1 << 18):
            out.append({"COOP": False, "SPLIT": 1})  # one program per row, one launch
        return out

    _cost = staticmethod(cost.radix)

    def _make_plan(self, call: TopkCall, config: dict, sms: int) -> RadixPlan:
        return radix_plan(call.R, call.N, call.k, call.input.dtype, call.sorted, sms, config)

    def run(self, call: TopkCall, config):
        done = _trivial(call)
        if done is not None:
            return done
        p = self._plan(call, config)
        x, row_stride, _ = _rows(call, unit_col=True)
        R, N, k, dtype = call.R, call.N, call.k, call.input.dtype
        dev = x.device
        values, indices = _outputs(call)
        flip = 0 if call.largest else -1
        spec = (p, row_stride, flip)  # the plan fixes every other integer and constexpr
        o = p.offsets

        def flags():
            return dict(IS_FLOAT=dtype.is_floating_point, KEY64=_key64(dtype), num_warps=p.warps)

        if p.mode == "direct":
            _RADIX_DIRECT(spec, (R,), (x, values, indices, N, row_stride, k, flip),
                          lambda: dict(SORT=p.sort_in_kernel, KP=p.KP, FT=p.FT, **flags()))
        elif p.mode == "fused":
            ws = torch.empty(p.ws_elems, dtype=torch.int64, device=dev)
            _RADIX_ROWS(spec, (R,),
                        (x, ws, o["sbuf"], o["sidx"], values, indices, N, row_stride, k, p.m,
                         p.CAP, p.EQ_CAP, flip),
                        lambda: dict(SS=p.SS, TILE=p.TILE, SUB=p.SUB, SORT=p.sort_in_kernel,
                                     KP=p.KP, FT=p.FT, **flags()))
        else:
            coop = p.mode == "coop"
            if coop:
                # The per-row counters start at zero (with the rest when that is small: one
                # memset instead of an allocation and a memset).
                if p.ws_elems <= (1 << 20):
                    ws = torch.zeros(p.ws_elems, dtype=torch.int64, device=dev)
                else:
                    ws = torch.empty(p.ws_elems, dtype=torch.int64, device=dev)
                    ws[:int(COUNTERS) * R].zero_()
            else:
                ws = torch.empty(p.ws_elems, dtype=torch.int64, device=dev)
                _RADIX_SAMPLE(spec, (R, p.SB), (x, ws, o["lists"], N, row_stride, p.SB, flip),
                              lambda: dict(SS=p.SS, MS=p.MS, IS_FLOAT=dtype.is_floating_point,
                                           KEY64=_key64(dtype), num_warps=4))
            _RADIX_FILTER(spec, (R, p.B),
                          (x, ws, o["lists"], o["sbuf"], o["sidx"], values, indices, N,
                           row_stride, k, p.m, p.CAP, p.EQ_CAP, p.TPP, p.B, p.SB, flip),
                          lambda: dict(COOP=coop, SS=p.SS, MS=p.MS, TILE=p.TILE, SUB=p.SUB,
                                       SORT=p.sort_in_kernel, KP=p.KP, FT=p.FT, **flags()))
        return self._finish(call, p, values, indices)


# ---------------------------------------------------------------------------------------------
# tournament
# ---------------------------------------------------------------------------------------------
# k up to this: the hot groups (2k of them, each G elements) and the NB * k candidates of a
# shared row are register tiles.
TOURNAMENT_K_MAX = 256
# The last program of a shared row selects from at most this many candidates (one tile).
TOURNAMENT_FINISH_MAX = 8192


class TournamentPlan:
    """Launch parameters of the tournament backend: NB programs per row, each taking a chunk
    of CPP elements (whole TILEs) whose group maxima (groups of G) fit MAXP slots; HOT hot
    groups at most; the last program of a shared row selects from FT candidates."""

    __slots__ = ("NB", "CPP", "G", "TILE", "MAXP", "HOT", "FT", "KP", "warps", "offsets",
                 "ws_elems", "reason")

    __repr__ = RadixPlan.__repr__


def tournament_plan(R: int, N: int, k: int, sms: int, config: dict) -> TournamentPlan:
    p = TournamentPlan()
    p.reason = None
    R, N = max(R, 1), max(N, 1)  # empty calls never launch; their plan only has to exist
    tile_max = config.get("TILE", 8192)
    groups_max = config.get("MAXP", 4096)
    finish_max = config.get("FINISH", TOURNAMENT_FINISH_MAX)
    kk = max(k, 1)
    # Room for twice k hot groups (maxima may tie at the cut); candidates HOT * G <= CANDIDATES.
    p.HOT = max(16, next_pow2(2 * kk))
    p.G = max(2, min(64, config.get("CANDIDATES", 2048) // p.HOT))
    # Programs per row: several per SM in all (nothing waits, so nothing must be resident),
    # chunks of at least CHUNK_MIN elements, and each chunk's group maxima within one tile.
    if R >= 2 * sms:
        nb = 1
    else:
        nb = max(1, min(cdiv(sms * config.get("PPS", 4), R), cdiv(N, config.get("CHUNK_MIN", 16384))))
    nb = min(nb, max(1, finish_max // kk))
    # Long rows need more programs for their maxima to fit; twice the maxima per program
    # (a longer search) before more programs than the finishing tile can take.
    need = cdiv(N, groups_max * p.G)
    if nb < need and need * kk > finish_max:
        groups_max *= 2
        need = cdiv(N, groups_max * p.G)
    nb = max(nb, need)
    chunk = cdiv(N, nb)
    # Short chunks: smaller groups, so that the cut leaves few hot groups among many (with
    # HOT groups or fewer in all, every element is a candidate).
    while p.G > 2 and chunk < 4 * kk * p.G:
        p.G //= 2
    p.TILE = max(p.G, min(tile_max, next_pow2(chunk)))
    p.CPP = cdiv(chunk, p.TILE) * p.TILE
    p.NB = cdiv(N, p.CPP) if N else 1
    p.MAXP = max(16, next_pow2(cdiv(p.CPP, p.G)))
    p.KP = max(16, next_pow2(kk))
    p.FT = max(p.KP, next_pow2(p.NB * kk)) if p.NB > 1 else p.KP
    if p.NB > 1 and p.NB * kk > finish_max:
        p.reason = (f"a row of {N} needs {p.NB} programs, whose {p.NB * kk} candidates exceed "
                    f"the finishing tile ({finish_max})")
    # Measured on an H100: 4 warps where programs are many (several share an SM, one's
    # searches overlap another's loads), 8 where about one program runs per SM.
    p.warps = config.get("num_warps", 4 if R * p.NB >= 2 * sms else 8)
    # The workspace, int64 elements: per-row tickets (int32), group maxima (int32), hot group
    # ids (int32), candidate lists (int64, shared rows only).
    progs = R * p.NB
    off_max = cdiv(R, 2)
    off_hot = off_max + cdiv(progs * p.MAXP, 2)
    off_cand = off_hot + cdiv(progs * p.HOT, 2)
    p.offsets = (off_max, off_hot, off_cand)
    p.ws_elems = off_cand + (progs * kk if p.NB > 1 else 0)
    return p


class TournamentBackend(_PlannedBackend):
    """Group maxima cut each chunk to its 2k hot groups (see _tournament_kernel): one read of
    the data, no sampling; small k (sampling from vocabularies, argmax-like selections)."""

    name = "tournament"
    kernels = (_order_key, _count3, _narrow, _cut, _kth, _src_tile, _store_winners, _select,
               _select_tile, _select_tiles, _take_k, _write_out, _tournament_kernel)

    def supports(self, call: TopkCall) -> str | None:
        if call.input.dtype.itemsize > 4:
            return ("tournament packs a 32-bit key with the index in one int64; "
                    f"{str(call.input.dtype)[6:]} keys are 64 bits (radix and sort take them)")
        if call.k > TOURNAMENT_K_MAX:
            return f"k={call.k}; tournament keeps 2k groups per chunk (k up to {TOURNAMENT_K_MAX})"
        if call.N > MAX_ROW:
            return f"rows of {call.N} elements; indices are packed in 32 bits (rows up to {MAX_ROW})"
        return self._plan(call, self.configs(call)[0]).reason

    def configs(self, call: TopkCall) -> list[dict]:
        if call.info.interpreted:
            # Small tiles, groups and chunks: CPU tests take every path on rows of a few
            # hundred elements.
            out = [{"TILE": 64, "CANDIDATES": 512, "CHUNK_MIN": 128, "MAXP": 128, "PPS": 2,
                    "FINISH": 1024},
                   {"TILE": 32, "CANDIDATES": 64, "CHUNK_MIN": 1 << 30, "MAXP": 1 << 20}]
        else:
            # Measured on an H100: tiles of 8192 and 2048 candidates were faster on most shapes
            # than 4096 and 4096.
            other = 12 - self._plan(call, {}).warps  # the warp count the default does not pick
            out = [{}, {"TILE": 4096, "CANDIDATES": 4096}, {"num_warps": other}]
        # The first is the default (supports() asks it); others only where their plan holds.
        return out[:1] + [c for c in out[1:] if self._plan(call, c).reason is None]

    _cost = staticmethod(cost.tournament)

    def _make_plan(self, call: TopkCall, config: dict, sms: int) -> TournamentPlan:
        return tournament_plan(call.R, call.N, call.k, sms, config)

    def run(self, call: TopkCall, config):
        done = _trivial(call)
        if done is not None:
            return done
        p, x, row_stride, values, indices, ws = self._setup(call, config)
        R, N, k, dtype = call.R, call.N, call.k, call.input.dtype
        if p.NB > 1:
            ws[:p.offsets[0]].zero_()  # the per-row tickets
        flip = 0 if call.largest else -1
        _TOURNAMENT((p, row_stride, flip, call.sorted), (R, p.NB),
                    (x, ws, *p.offsets, values, indices, N, row_stride, k, p.CPP, p.NB, flip),
                    lambda: dict(SHARED=p.NB > 1, G=p.G, TILE=p.TILE, MAXP=p.MAXP, HOT=p.HOT,
                                 FT=p.FT, SORT=call.sorted, KP=p.KP,
                                 IS_FLOAT=dtype.is_floating_point, num_warps=p.warps))
        return _shape_out(call, values, indices)


# ---------------------------------------------------------------------------------------------
# maxima
# ---------------------------------------------------------------------------------------------
# k up to this: the cut needs at least RHO_MIN * k supergroups, and their maxima are one
# register tile of at most MAXIMA_S_MAX; ranking holds about 1.5 k candidates in registers
# (k = 2048 spilled: 16 x 1M took 580 us).
MAXIMA_K_MAX = 1024
MAXIMA_S_MAX = 8192
# The cut is searched among at least RHO * k supergroup maxima where the row allows, and never
# fewer than RHO_MIN * k: with rho maxima per winner the survivors of a random row number
# about rho * ln(rho / (rho - 1)) * k (1.15 k at rho = 4, 1.39 k at 2, 2 k at 1.25).
RHO = 3
RHO_MIN = 1.25


class MaximaPlan:
    """Launch parameters of the maxima backend. Launch 1: NB programs per row, a chunk of CPP
    elements (whole TILEs) each, writing maxima of groups of G and
    supergroups of SG elements (S supergroups, NG groups; row strides SR, NGR in the
    workspace). Launch 2: NB2 programs per row (coop: they wait for each other once), GPP
    groups each (scanned GT2 at a time, hot ones gathered HG at a time); the cut stops once k
    to k_hi supergroup maxima reach it; candidates (CAP survivors at most, EQ_CAP ties) are
    ranked CB at a time against UB at a time."""

    __slots__ = ("G", "TILE", "CPP", "NB", "evict", "SG", "S", "SR", "NG", "NGR", "SP",
                 "NB2", "coop", "pdl", "GPP", "GT2", "HG", "k_hi", "CAP", "EQ_CAP", "FT", "CB",
                 "UB", "sort_after", "warps1", "warps2", "offsets", "ws_elems", "reason")

    __repr__ = RadixPlan.__repr__


def maxima_plan(R: int, N: int, k: int, dtype: torch.dtype, sorted_: bool, sms: int,
                config: dict) -> MaximaPlan:
    p = MaximaPlan()
    p.reason = None
    R, N, kk = max(R, 1), max(N, 1), max(k, 1)  # empty calls never launch
    sms = config.get("SMS", sms)
    key64 = _key64(dtype)
    s_max = config.get("S_MAX", MAXIMA_S_MAX)
    g_min = config.get("G_MIN", 8)
    # Groups: at least 4 k of them, so that hot groups are few among many; about 256K at most
    # per row, so that launch 2 scans their maxima quickly (a hot group costs G loads).
    p.G = config.get("G", max(64, min(512, next_pow2(cdiv(N, 1 << 18)))))
    while p.G > g_min and cdiv(N, p.G) < 4 * kk:
        p.G //= 2
    # Tiles: two programs per SM at least, where the rows allow.
    p.TILE = config.get("TILE", 8192)
    while p.TILE > max(p.G * 16, 1024) and R * cdiv(N, p.TILE) < 2 * sms:
        p.TILE //= 2
    p.TILE = max(p.TILE, p.G)
    # Supergroups: the largest size that leaves RHO * k of them (a tight cut), no smaller than a
    # group, and no larger than a tile unless the row has more than s_max tiles.
    rho = config.get("RHO", RHO)
    SG = p.G
    while SG * 2 <= p.TILE and cdiv(N, SG * 2) >= rho * kk:
        SG *= 2
    while cdiv(N, SG) > s_max:
        SG *= 2
    p.SG = SG
    p.S = cdiv(N, SG)
    if p.S < RHO_MIN * kk:
        p.reason = (f"k={k} is too large a part of a row of {N}: the cut needs {RHO_MIN:g} k "
                    f"supergroups of at least {p.G} elements")
    # A chunk is TPP tiles (their loads overlap), or exactly one supergroup where supergroups
    # are longer than a tile (the pass kernel then keeps one running maximum per chunk).
    p.CPP = SG if SG > p.TILE else p.TILE * config.get("TPP", 1)
    p.NB = cdiv(N, p.CPP)
    p.NG = cdiv(N, p.G)
    p.NGR = p.NB * (p.CPP // p.G)
    p.SR = p.NB * (p.CPP // SG)
    p.SP = max(16, next_pow2(p.S))
    # The search stops at the first cut that k to k_hi supergroup maxima reach: a wide window
    # ends it sooner, at the price of a few more candidates.
    p.k_hi = max(kk, int(kk * config.get("K_HI", 1.5)))
    # Launch 2: enough programs to spread the group scans and gathers over the chip; where
    # they wait for each other (coop), one per SM at most, so that all are resident.
    p.coop = config.get("COOP", True) and COOP_ALLOWED
    p.pdl = config.get("PDL", True) and PDL_ALLOWED
    per_sm = 1 if p.coop else config.get("PPS2", 2)
    p.NB2 = max(1, min(sms * per_sm // R, cdiv(p.NG, 256)))
    p.GPP = cdiv(p.NG, p.NB2)
    p.GT2 = max(16, min(next_pow2(p.GPP), config.get("GT2_MAX", 2048)))
    p.HG = max(1, config.get("GATHER", max(1024, 4 * p.G)) // p.G)
    # Candidates: about 1.2 k survivors for random data; room for several times that before
    # the last program gives up on them and selects from the row (tiles of FT). Ranking
    # compares CB candidates with UB others at a time. The ranks put the output in order, but
    # the whole-row path leaves 64-bit keys unordered: torch.sort orders those afterwards.
    p.CAP = config.get("CAP", 8 * kk + 1024)
    p.EQ_CAP = kk
    p.FT = config.get("FT", 1024)
    p.CB = config.get("CB", 16)
    p.UB = config.get("UB", max(128, min(2048, next_pow2(kk * 3 // 2 + 64))))
    p.sort_after = sorted_ and key64
    p.warps1 = config.get("WARPS1", 8 if p.TILE >= 8192 else 4)
    # The rows are read once: evict them first, so the maxima written beside them stay in L2
    # for launch 2 (measured on the H200: the 16M-element pass 22.3 -> 20.4 us).
    p.evict = config.get("EVICT", "evict_first")
    p.warps2 = config.get("WARPS2", 8 if p.SP >= 2048 else 4)
    # The workspace (int64 elements): counters [R, 8]; supergroup and group maxima (keys);
    # each launch-2 program's hot list (int32); the survivor buffer (int64) and, for 64-bit
    # keys, its indices (int32).
    unit = 1 if key64 else 0.5
    off = int(COUNTERS) * R
    off_smax = off
    off += math.ceil(R * p.SR * unit)
    off_gmax = off
    off += math.ceil(R * p.NGR * unit)
    off_scr = off
    off += cdiv(R * p.NB2 * p.GT2, 2)
    off_sbuf = off
    slots = R * (p.CAP + p.EQ_CAP)
    off += slots
    off_sidx = off
    off += cdiv(slots, 2) if key64 else 0
    p.offsets = (off_smax, off_gmax, off_scr, off_sbuf, off_sidx)
    p.ws_elems = off
    return p


class MaximaBackend(_PlannedBackend):
    """Supergroup maxima give one cut for a whole row, so a long row is read once by the whole
    chip, with no sampling and no waiting (see _maxima_select_kernel): long rows with k up to a
    few thousand."""

    name = "maxima"
    kernels = (_order_key, _key_limits, _typed, _count3, _cavg, _narrow, _cut, _kth, _src_tile,
               _store_winners, _select, _select_tile, _select_tiles, _take_k, _write_out,
               _row_buffers, _maxima_pass_kernel, _append_survivors, _candidate, _rank_block,
               _rank_candidates, _maxima_select_kernel)

    def supports(self, call: TopkCall) -> str | None:
        if call.k == 0 or call.R == 0 or call.nd == 0:
            return None  # nothing to select: run() returns without a launch
        if call.k > MAXIMA_K_MAX:
            return f"k={call.k}; maxima selects from a register tile (k up to {MAXIMA_K_MAX})"
        if call.N > MAX_ROW:
            return (f"rows of {call.N} elements; indices are packed in 32 bits "
                    f"(rows up to {MAX_ROW})")
        return self._plan(call, self.configs(call)[0]).reason

    def configs(self, call: TopkCall) -> list[dict]:
        if call.info.interpreted:
            # Small tiles, groups and register tiles: CPU tests take every path on rows of a
            # few thousand elements.
            # The interpreter runs programs one after another: none may wait for a later one
            # (no coop; the last program ranks the candidates).
            return [{"G": 8, "G_MIN": 2, "TILE": 64, "S_MAX": 256, "GT2_MAX": 64, "GATHER": 32,
                     "FT": 256, "PPS2": 1, "COOP": False, "UB": 64, "TPP": 2},
                    {"G": 4, "G_MIN": 2, "TILE": 32, "S_MAX": 1024, "GT2_MAX": 16, "GATHER": 8,
                     "FT": 128, "RHO": 8, "PPS2": 2, "COOP": False, "CB": 8,
                     "UB": 32}]
        out = [{}, {"RHO": 2, "G": 128}, {"TILE": 4096}]
        return out[:1] + [c for c in out[1:] if self._plan(call, c).reason is None]

    _cost = staticmethod(cost.maxima)

    def _make_plan(self, call: TopkCall, config: dict, sms: int) -> MaximaPlan:
        return maxima_plan(call.R, call.N, call.k, call.input.dtype, call.sorted, sms, config)

    def run(self, call: TopkCall, config):
        done = _trivial(call)
        if done is not None:
            return done
        p, x, row_stride, values, indices, ws = self._setup(call, config)
        R, N, k, dtype = call.R, call.N, call.k, call.input.dtype
        off_smax, off_gmax, off_scr, off_sbuf, off_sidx = p.offsets
        flip = 0 if call.largest else -1
        # griddepcontrol needs sm_90; the interpreter has no such instruction.
        pdl = p.pdl and not call.info.interpreted and (call.info.capability or (0, 0)) >= (9, 0)
        spec = (p, row_stride, flip, pdl)  # the plan fixes every other integer and constexpr

        def flags():
            return dict(IS_FLOAT=dtype.is_floating_point, KEY64=_key64(dtype), PDL=pdl)

        _MAXIMA_PASS(spec, (R, p.NB),
                     (x, ws, off_smax, off_gmax, N, row_stride, p.NGR, p.SR, p.CPP, flip),
                     lambda: dict(G=p.G, TILE=p.TILE, SG=p.SG, EVICT=p.evict,
                                  num_warps=p.warps1, **flags()))
        _MAXIMA_SELECT(spec, (R, p.NB2),
                       (x, ws, off_smax, off_gmax, off_scr, off_sbuf, off_sidx, values, indices,
                        N, row_stride, k, p.k_hi, p.NGR, p.SR, p.NG, p.S, p.GPP, p.NB2, p.CAP,
                        p.EQ_CAP, flip),
                       lambda: dict(COOP=p.coop, SP=p.SP, G=p.G, GT2=p.GT2, HG=p.HG, CB=p.CB,
                                    UB=p.UB, FT=p.FT, num_warps=p.warps2, launch_pdl=pdl,
                                    **flags()))
        return self._finish(call, p, values, indices)


# ---------------------------------------------------------------------------------------------
# sort
# ---------------------------------------------------------------------------------------------
def _sort_topk(call: TopkCall):
    done = _trivial(call)
    if done is not None:
        return done
    # torch.sort orders NaN above every number, as topk does (first when descending).
    values, indices = torch.sort(call.input, dim=call.dim, descending=call.largest)
    values = values.narrow(call.dim, 0, call.k).contiguous()
    indices = indices.narrow(call.dim, 0, call.k).contiguous()
    return torch.return_types.topk((values, indices))


class SortBackend(Backend):
    name = "sort"
    uses_triton = False

    def supports(self, call: TopkCall) -> str | None:
        return None

    def run(self, call: TopkCall, config):
        return _sort_topk(call)

    def cost(self, call: TopkCall, model) -> Estimate:
        return cost.sort(call, model)


# ---------------------------------------------------------------------------------------------
# bitonic
# ---------------------------------------------------------------------------------------------
class BitonicBackend(Backend):
    name = "bitonic"
    kernels = (_order_key, _bitonic_kernel)
    MAX_N = BITONIC_MAX

    def supports(self, call: TopkCall) -> str | None:
        if call.input.dtype.itemsize > 4:
            return ("bitonic packs a 32-bit key with the index in one int64; "
                    f"{str(call.input.dtype)[6:]} keys are 64 bits (radix and sort take them)")
        if call.N > self.MAX_N:
            return (f"rows of {call.N} elements; bitonic holds a row in registers "
                    f"(at most {self.MAX_N})")
        return None

    def configs(self, call: TopkCall) -> list[dict]:
        npow = max(1, next_pow2(call.N))
        out = []
        for per_prog in (2048, 8192):
            rows = max(1, min(next_pow2(max(call.R, 1)), per_prog // npow))
            elems = rows * npow
            warps = 4 if elems <= 2048 else (8 if elems <= 4096 else 16)
            cfg = {"ROWS": rows, "num_warps": warps}
            if cfg not in out:
                out.append(cfg)
        return out

    def run(self, call: TopkCall, config):
        done = _trivial(call)
        if done is not None:
            return done
        x, row_stride, col_stride = _rows(call, unit_col=False)
        R, N, k = call.R, call.N, call.k
        values, indices = _outputs(call)
        rows, warps = config["ROWS"], config["num_warps"]
        flip = 0 if call.largest else -1
        dtype = call.input.dtype
        _BITONIC((R, N, k, row_stride, col_stride, flip, rows, warps, dtype), (cdiv(R, rows),),
                 (x, values, indices, R, N, k, row_stride, col_stride, flip),
                 lambda: dict(ROWS=rows, NP=max(1, next_pow2(N)), KP=next_pow2(k),
                              IS_FLOAT=dtype.is_floating_point, num_warps=warps))
        return _shape_out(call, values, indices)

    def cost(self, call: TopkCall, model) -> Estimate:
        return cost.bitonic(call, model)


# ---------------------------------------------------------------------------------------------
# Warm-spec inputs
# ---------------------------------------------------------------------------------------------
def sample(shapes, dtype: torch.dtype, options: dict, device: torch.device):
    """Inputs for warming and benchmarks: one shape; options: k (required), dim, largest,
    sorted, values = "randn" (default), "uniform" (in [0, 1)) or "ties" (a few distinct
    values, so the k-th value is shared by many elements)."""
    if len(shapes) != 1:
        raise InvalidArgument(f"topk sample: expected one shape (the input), got {shapes}")
    options = dict(options)
    if "k" not in options:
        raise InvalidArgument("topk sample: options must give k")
    k = options.pop("k")
    values = options.pop("values", "randn")
    shape = tuple(shapes[0])
    n = math.prod(shape)
    if values == "randn":
        x = torch.randn(n, device=device)
    elif values == "uniform":
        x = torch.rand(n, device=device)
    elif values == "ties":
        x = torch.randint(0, 16, (n,), device=device).float()
    else:
        raise InvalidArgument(f"topk sample: values must be 'randn', 'uniform' or 'ties', "
                              f"got {values!r}")
    if dtype.is_floating_point:
        x = x.to(dtype)
    else:
        info = torch.iinfo(dtype)
        if values == "ties":
            x = x.to(dtype)
        else:
            x = torch.randint(info.min, info.max, (n,), device=device, dtype=dtype)
    return (x.reshape(shape), k), options


def replay(call: TopkCall) -> tuple[tuple, dict]:
    """The public call a prepared one came from (tuning's first runs)."""
    return (call.input, call.k, call.dim, call.largest, call.sorted), {}


OP = register(Op("topk", prepare, [
    TorchBackend(_torch_topk, cost.torch_),
    RadixBackend(),
    TournamentBackend(),
    MaximaBackend(),
    SortBackend(),
    BitonicBackend(),
], sample=sample, replay=replay, calibration=[
    ([[1 << 24]], torch.float32, {"k": 1024}),
    ([[64, 128000]], torch.float32, {"k": 50}),
    ([[4096, 32000]], torch.bfloat16, {"k": 50}),
    ([[4096, 256]], torch.float32, {"k": 8}),
    ([[16, 1 << 20]], torch.float32, {"k": 2048}),
    ([[1 << 20]], torch.float32, {"k": 1 << 17}),
]))
