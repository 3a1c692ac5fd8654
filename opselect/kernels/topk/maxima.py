"""topk's maxima backend: a pass of group maxima bounds the k-th value, then one selection over the
survivors (a programmatic dependent launch on Hopper)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ...heuristics import topk as cost
from ...switches import enabled
from .._common import allocator, cdiv, next_pow2
from .call import TopkCall, _output_maker, _output_finisher, _reader
from .common import (COOP_ALLOWED, COUNTERS, MAX_ROW, SPIN_LIMIT, _PlannedBackend, _cut, _key64,
                     _key_limits, _masked_group_max_keys, _order_key, _row_buffers,
                     _row_stride, _select, _tile_group_max_keys, _typed, _write_out,
                     check_config, float_maxima_allowed, plan_launcher)


# maxima's second launch is a programmatic dependent launch on Hopper and later (sm_90+): it is
# scheduled while the first one's last programs run and waits for them in the kernel, which
# hides the gap between the two launches. OPSELECT_TOPK_PDL=0 turns it off.
PDL_ALLOWED = enabled("OPSELECT_TOPK_PDL")


# ---------------------------------------------------------------------------------------------
# Kernels: maxima (one cut for the whole row, from supergroup maxima)
# ---------------------------------------------------------------------------------------------
@triton.jit
def _vector_origin(row_off, vector: tl.constexpr):
    """Where a row's groups start (its first element's vector, a multiple of `vector` the
    compiler knows), and its first element's place from there; the row itself where vector is
    0 (rows on the grid)."""
    if vector > 0:
        origin = row_off // vector * vector
    else:
        origin = row_off
    return origin, row_off - origin


@triton.jit(do_not_specialize=["flip", "off_smax", "off_gmax", "group_row_stride",
                               "supergroup_row_stride"])
def _maxima_pass_kernel(x_ptr, ws_ptr, off_smax, off_gmax, N, row_stride, group_row_stride,
                        supergroup_row_stride, chunk, flip, group: tl.constexpr,
                        tile: tl.constexpr, supergroup: tl.constexpr, evict: tl.constexpr,
                        is_float: tl.constexpr, key64: tl.constexpr, pdl: tl.constexpr,
                        float_maxima: tl.constexpr, vector: tl.constexpr):
    """Launch 1 of maxima: program p of row r streams the chunk [p * chunk, (p + 1) * chunk)
    once and writes the maximum key of each group (`group` elements) and of each supergroup
    (`supergroup` elements), the next tile loading while the current one is reduced. No search
    and no waiting: it runs at the speed of reading the row. Program 0 of each row also clears
    the row's counters for launch 2 (no memset launch).

    One program a chunk, not persistent programs taking chunks in turn: the persistent loop
    (its next address computed in 64 bits every step) took 110 registers instead of 78, so
    two programs fit an SM instead of three, and it was slower (see
    benchmarks/results/h200/fits/topk.md#maxima).

    pdl: launch 2 may be scheduled once every program here has started (it waits for this
    launch to finish before it reads anything).

    vector > 0: rows off the 16-byte grid (GPT-2's 50257 in 16-bit floats), read in vectors of
    `vector` elements: the row's groups and chunks count from the vector its first element is in
    (_vector_origin), the elements of the neighbouring rows in the first and last vector masked
    out of the maxima."""
    if pdl:
        gdc_launch_dependents()
    r = tl.program_id(0)
    p = tl.program_id(1)
    r64 = r.to(tl.int64)
    start = p.to(tl.int64) * chunk
    origin, lead = _vector_origin(r64 * row_stride, vector)
    n_here = tl.minimum(N + lead - start, chunk).to(tl.int32)
    lowest, highest = _key_limits(key64)
    if p == 0:
        tl.store(ws_ptr + COUNTERS * r64 + tl.arange(0, COUNTERS),
                 tl.zeros([COUNTERS], tl.int64))
    GT: tl.constexpr = tile // group
    group_ids = tl.arange(0, GT)
    cols = tl.arange(0, group)
    lane = group_ids[:, None] * group + cols[None, :]
    chunk_ptr = x_ptr + origin + start
    gmax = _typed(ws_ptr, off_gmax, True, key64) + r64 * group_row_stride + start // group
    smax = _typed(ws_ptr, off_smax, True, key64) + r64 * supergroup_row_stride + start // supergroup
    if vector > 0:
        # Loads up to the end of the vector holding the row's last element (a bound the
        # compiler knows as a multiple of `vector`: whole-vector masks)
        n_load = (n_here + (vector - 1)) // vector * vector
        # Every slot launch 2 reads is written: the plan's groups and supergroups cover the
        # row's largest shift (vector - 1 elements), so a row with less has slots past its data,
        # up to a whole program's (a row of 127 int32 elements: 2 programs, the second with
        # nothing to read). Unwritten, they held the workspace's old contents, which launch 2
        # took for maxima (a wrong answer). Tiles past the data store the lowest key.
        n_slots = tl.minimum(N + (vector - 1) - start, chunk).to(tl.int32)
    else:
        n_load = n_here
        n_slots = n_here
    ntiles = tl.cdiv(n_slots, tile)
    acc = tl.full([], lowest, gmax.dtype.element_ty)
    x = tl.load(chunk_ptr + lane, mask=lane < n_load, other=0, eviction_policy=evict)
    for t in range(ntiles):
        base = t * tile
        ahead = tl.where(t + 1 < ntiles, n_load - base - tile, 0)
        x_next = tl.load(chunk_ptr + base + tile + lane, mask=lane < ahead, other=0,
                         eviction_policy=evict)
        if vector > 0 and not float_maxima:
            # (the previous row's elements before `lead`, the next row's past N + lead; rows
            # on the grid, float_maxima's, have none before)
            inside = (lane < n_here - base) & (lane >= lead - start - base)
            gm = _masked_group_max_keys(x, inside, is_float, flip, key64)
        else:
            gm = _tile_group_max_keys(x, lane, n_here - base, tile, float_maxima, is_float,
                                      flip, key64)
        tl.store(gmax + t * GT + group_ids, gm)
        if supergroup <= tile:
            SPT: tl.constexpr = tile // supergroup
            sm = tl.max(tl.reshape(gm, [SPT, supergroup // group]), axis=1)
            tl.store(smax + t * SPT + tl.arange(0, SPT), sm)
        else:
            acc = tl.maximum(acc, tl.max(gm, axis=0))
        x = x_next
    if supergroup > tile:
        tl.store(smax, acc)  # the plan makes chunk == supergroup here: one per program


@triton.jit
def _append_survivors(key, idx, ok, T, sbuf, sidx, cnt_ptr, survivor_capacity, tie_capacity,
                      key64: tl.constexpr):
    """Keys > T of a 1-d tile to the row's survivor slots [0, survivor_capacity), keys == T to
    its tie slots from survivor_capacity (tie_capacity of them): one atomic per kind reserves
    the tile's slots, one cumsum of both flags (bits 0 and 16 of an int32) ranks them. Counts
    go on past the capacities, so the finisher can tell an overflow."""
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
        keep = tl.where(gt, pos < survivor_capacity, eq & (pos < tie_capacity))
        slot = tl.where(gt, pos, survivor_capacity + pos)
        if key64:
            tl.store(sbuf + slot, key, mask=keep)
            tl.store(sidx + slot, idx, mask=keep)
        else:
            tl.store(sbuf + slot, (key.to(tl.int64) << 32) | (idx.to(tl.int64) & 0xFFFFFFFF),
                     mask=keep)


@triton.jit
def _candidate(sbuf, sidx, n_gt, survivor_capacity, u, ok, key64: tl.constexpr):
    """Entry u of a row's candidates: survivors [0, n_gt) first, then the ties from slot
    survivor_capacity.
    Returns (order, key, index): `order` sorts candidates in the output's order (the packed
    key << 32 | index for 32-bit keys, the key for 64-bit keys, whose ties are then broken by
    the index)."""
    slot = tl.where(u < n_gt, u, survivor_capacity + u - n_gt)
    if key64:
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
def _rank_block(sbuf, sidx, n_gt, survivor_capacity, c, okc, ou, ku, iu, oku,
                key64: tl.constexpr):
    """The ranks of candidates c among the loaded ones (ou, ku, iu), and their indices."""
    oc, kc, ic = _candidate(sbuf, sidx, n_gt, survivor_capacity, c, okc, key64)
    before = oku[None, :] & (ou[None, :] > oc[:, None])
    if key64:
        before = before | (oku[None, :] & (ku[None, :] == kc[:, None]) & (iu[None, :] > ic[:, None]))
    return tl.sum(before.to(tl.int32), axis=1), ic


@triton.jit
def _rank_candidates(x_ptr, row_off, sbuf, sidx, n_gt, n_tie, survivor_capacity, k, c_lo, c_hi,
                     val_row, idx_row, candidates_per_step: tl.constexpr,
                     rivals_per_step: tl.constexpr, key64: tl.constexpr):
    """Candidates [c_lo, c_hi) of a row's C = n_gt + n_tie: each one's rank is the number of
    candidates that come before it in the output (a larger key, or an equal key and a larger
    index), so ranks are distinct and ranks 0 .. k-1 are the k winners in order. Each winner is
    written straight to its place: no selection, no sort. Programs that rank disjoint slices
    of the same candidates together write every output once; any two rankings of the same
    candidates write the same values, so a program that ranks everything (the fallback) may
    overlap them. Up to rivals_per_step candidates stay in registers while candidates_per_step
    at a time are ranked; more are re-read rivals_per_step at a time for every block."""
    C = n_gt + n_tie
    if C <= rivals_per_step:
        u = tl.arange(0, rivals_per_step)
        oku = u < C
        ou, ku, iu = _candidate(sbuf, sidx, n_gt, survivor_capacity, u, oku, key64)
        for c0 in range(c_lo, c_hi, candidates_per_step):
            c = c0 + tl.arange(0, candidates_per_step)
            okc = c < c_hi
            rank, ic = _rank_block(sbuf, sidx, n_gt, survivor_capacity, c, okc, ou, ku, iu, oku,
                                   key64)
            win = okc & (rank < k)
            tl.store(idx_row + rank, ic, mask=win)
            tl.store(val_row + rank, tl.load(x_ptr + row_off + ic, mask=win), mask=win)
    else:
        for c0 in range(c_lo, c_hi, candidates_per_step):
            c = c0 + tl.arange(0, candidates_per_step)
            okc = c < c_hi
            rank = tl.zeros([candidates_per_step], tl.int32)
            ic = tl.zeros([candidates_per_step], tl.int64)
            for u0 in range(0, C, rivals_per_step):
                u = u0 + tl.arange(0, rivals_per_step)
                oku = u < C
                ou, ku, iu = _candidate(sbuf, sidx, n_gt, survivor_capacity, u, oku, key64)
                part, ic = _rank_block(sbuf, sidx, n_gt, survivor_capacity, c, okc, ou, ku, iu,
                                       oku, key64)
                rank += part
            win = okc & (rank < k)
            tl.store(idx_row + rank, ic, mask=win)
            tl.store(val_row + rank, tl.load(x_ptr + row_off + ic, mask=win), mask=win)


@triton.jit(do_not_specialize=["flip", "off_smax", "off_gmax", "off_scr", "off_sbuf",
                               "off_sidx", "k", "k_hi", "group_row_stride",
                               "supergroup_row_stride", "groups", "supergroups",
                               "groups_per_program", "select_programs_per_row",
                               "survivor_capacity", "tie_capacity"])
def _maxima_select_kernel(x_ptr, ws_ptr, off_smax, off_gmax, off_scr, off_sbuf, off_sidx,
                          val_ptr, idx_ptr, N, row_stride, k, k_hi, group_row_stride,
                          supergroup_row_stride, groups, supergroups, groups_per_program,
                          select_programs_per_row, survivor_capacity, tie_capacity, flip,
                          coop: tl.constexpr, supergroups_padded: tl.constexpr,
                          group: tl.constexpr, groups_per_scan: tl.constexpr,
                          hot_groups_per_gather: tl.constexpr,
                          candidates_per_step: tl.constexpr, rivals_per_step: tl.constexpr,
                          finish_tile: tl.constexpr, is_float: tl.constexpr,
                          key64: tl.constexpr, pdl: tl.constexpr, vector: tl.constexpr):
    """Launch 2 of maxima: select_programs_per_row programs per row.

      1. T = a supergroup maximum that k to k_hi of the row's supergroup maxima reach (the
         same 4-ary search in every program: the same T). At least k elements reach T (each
         of those maxima is one), so the row's k largest all do, and each lies in a group
         whose maximum reaches T: a "hot" group.
      2. Program j scans the group maxima of its share of the row (from L2), gathers the
         elements of its hot groups (`group` each, usually a handful; of the groups whose maximum
         equals T, the first k) and appends keys > T to the row's survivors, keys == T to its
         ties.
      3. coop: the row's programs (all resident: the launcher keeps the grid within one
         program per SM) wait for each other once, then each ranks a slice of the candidates
         (about 1.2 k survivors for random data, plus ties where fewer than k exceed T) and
         writes the winners it finds to their sorted places. A program that waits too long
         (programs never resident: another stream's persistent kernel?) gives up, and the
         row's last program (a ticket) ranks all of them itself. Without coop the last program
         always does. A survivor list past its capacity (rows whose large values cluster,
         sorted rows for one) sends the last program to select from the whole row: slow,
         always exact.

    vector > 0: groups count from the row's first vector, as launch 1 made them
    (_vector_origin): a gathered group's elements outside the row are masked, and each index is
    its place in the row."""
    if pdl:
        gdc_wait()  # launched early (programmatic dependent launch): launch 1's writes first
    r = tl.program_id(0)
    j = tl.program_id(1)
    r64 = r.to(tl.int64)
    row_off = r64 * row_stride
    origin, lead = _vector_origin(row_off, vector)
    lowest, highest = _key_limits(key64)
    # The first tile of this program's group maxima: it does not depend on the cut, so its
    # load is under way during the search.
    g_lo = j * groups_per_program
    g_hi = tl.minimum(g_lo + groups_per_program, groups)
    gmax = _typed(ws_ptr, off_gmax, True, key64) + r64 * group_row_stride
    g_first = g_lo + tl.arange(0, groups_per_scan)
    gm_first = tl.load(gmax + g_first, mask=g_first < g_hi, other=lowest)
    # 1. The cut.
    s = tl.arange(0, supergroups_padded)
    oks = s < supergroups
    sm = tl.load(_typed(ws_ptr, off_smax, True, key64) + r64 * supergroup_row_stride + s,
                 mask=oks, other=lowest)
    hi = tl.max(tl.where(oks, sm, lowest), axis=0)
    if k > 1:
        lo = tl.min(tl.where(oks, sm, highest), axis=0).to(tl.int64)
        T = _cut(sm, oks, k, k_hi, lo, hi.to(tl.int64)).to(sm.dtype)
    else:
        T = hi  # one winner: the cut is the largest maximum, no search
    # 2. The hot groups of this program's share.
    cnt = ws_ptr + COUNTERS * r64
    sbuf, sidx = _row_buffers(ws_ptr, off_sbuf, off_sidx, r64, survivor_capacity, tie_capacity,
                              key64)
    scratch = ((ws_ptr + off_scr).to(tl.pointer_type(tl.int32))
               + (r64 * select_programs_per_row + j) * groups_per_scan)
    cols = tl.arange(0, group)
    slot = tl.arange(0, hot_groups_per_gather)
    # Groups whose maximum equals T: the first k of this share are enough. The row's k largest
    # are the keys above T (all in groups whose maximum exceeds T, every one gathered) and
    # ties at T; each tied group holds one tie at least, so k tied groups of one share hold as
    # many as k needs, and a share with fewer gives all of its own. Without the bound, rows of
    # a few distinct values made every group hot: each program re-read its whole share.
    tied_before = tl.full([], 0, tl.int32)
    for g0 in range(g_lo, g_hi, groups_per_scan):
        g = g0 + tl.arange(0, groups_per_scan)
        okg = g < g_hi
        if g0 == g_lo:
            gm = gm_first
        else:
            gm = tl.load(gmax + g, mask=okg, other=lowest)
        tied = okg & (gm == T)
        tied_rank = tied_before + tl.cumsum(tied.to(tl.int32), axis=0)
        tied_before += tl.sum(tied.to(tl.int32), axis=0)
        hot = (okg & (gm > T)) | (tied & (tied_rank <= k))
        n_hot = tl.sum(hot.to(tl.int32), axis=0)
        if n_hot > 0:
            tl.store(scratch + tl.cumsum(hot.to(tl.int32), axis=0) - 1, g, mask=hot)
            tl.debug_barrier()  # the hot list, stored by all threads, is read by all
            for h0 in range(0, n_hot, hot_groups_per_gather):
                okh = h0 + slot < n_hot
                gid = tl.load(scratch + h0 + slot, mask=okh, other=0)
                pos = gid.to(tl.int64)[:, None] * group + cols[None, :]  # from origin
                if vector > 0:
                    okp = okh[:, None] & (pos < N + lead) & (pos >= lead)
                else:
                    okp = okh[:, None] & (pos < N)
                x = tl.load(x_ptr + origin + pos, mask=okp, other=0)
                key = _order_key(x, is_float, flip, key64)
                _append_survivors(tl.reshape(key, [hot_groups_per_gather * group]),
                                  # the index in the row, its low 32 bits
                                  tl.reshape((pos - lead).to(tl.int32),
                                             [hot_groups_per_gather * group]),
                                  tl.reshape(okp, [hot_groups_per_gather * group]), T, sbuf,
                                  sidx, cnt, survivor_capacity, tie_capacity, key64)
            tl.debug_barrier()  # the hot list is read before the next tile overwrites it
    tl.debug_barrier()  # every thread's survivor stores precede the release below
    out = r64 * k
    # 3. Rank the candidates together, or leave it to the last program.
    if coop:
        tl.atomic_add(cnt + 2, 1, sem="release")
        arrived = tl.atomic_add(cnt + 2, 0, sem="acquire")
        polls = tl.full([], 0, tl.int32)
        while (arrived < select_programs_per_row) & (polls < SPIN_LIMIT):
            arrived = tl.atomic_add(cnt + 2, 0, sem="acquire")
            polls += 1
        if arrived < select_programs_per_row:
            tl.atomic_add(cnt + 4, 1, sem="relaxed")  # gave up: the last program ranks all
        else:
            n_gt = tl.atomic_add(cnt, 0, sem="acquire")
            n_eq = tl.atomic_add(cnt + 1, 0, sem="acquire")
            if n_gt <= survivor_capacity:
                n_tie = tl.where(n_gt < k, tl.minimum(n_eq, tie_capacity), 0)
                share = tl.cdiv(n_gt + n_tie, select_programs_per_row)
                _rank_candidates(x_ptr, row_off, sbuf, sidx, n_gt, n_tie, survivor_capacity, k,
                                 j * share,
                                 tl.minimum((j + 1) * share, n_gt + n_tie), val_ptr + out,
                                 idx_ptr + out, candidates_per_step, rivals_per_step, key64)
        tl.debug_barrier()
    ticket = tl.atomic_add(cnt + 3, 1, sem="acq_rel")
    if ticket == select_programs_per_row - 1:
        n_gt = tl.atomic_add(cnt, 0, sem="acquire")
        n_eq = tl.atomic_add(cnt + 1, 0, sem="acquire")
        if n_gt > survivor_capacity:
            # The whole row, one program (survivors overflowed: clustered large values).
            if key64:
                _select(x_ptr, row_off, sbuf, sidx, N, k, tl.full([], 0, tl.int64), True,
                        idx_ptr + out, False, finish_tile, is_float, flip, key64)
                tl.debug_barrier()
                _write_out(x_ptr, row_off, idx_ptr + out, val_ptr + out, k, False, finish_tile,
                           finish_tile)
            else:
                # The winners (packed) to the spent survivor buffer, then ranked into place.
                _select(x_ptr, row_off, sbuf, sidx, N, k, tl.full([], 0, tl.int64), True,
                        sbuf, True, finish_tile, is_float, flip, key64)
                tl.debug_barrier()
                _rank_candidates(x_ptr, row_off, sbuf, sidx, k, 0, survivor_capacity, k, 0, k,
                                 val_ptr + out, idx_ptr + out, candidates_per_step,
                                 rivals_per_step, key64)
        else:
            gave_up = True
            if coop:
                gave_up = tl.atomic_add(cnt + 4, 0, sem="acquire") > 0
            if gave_up:
                n_tie = tl.where(n_gt < k, tl.minimum(n_eq, tie_capacity), 0)
                _rank_candidates(x_ptr, row_off, sbuf, sidx, n_gt, n_tie, survivor_capacity, k, 0,
                                 n_gt + n_tie, val_ptr + out, idx_ptr + out,
                                 candidates_per_step, rivals_per_step, key64)


# Each Launcher's spec is the plan (made per call's sizes, dtype, layout, direction and
# device's griddepcontrol): it fixes every integer argument Triton specialises on, every
# constexpr (each the plan's field of its name), the warps and launch 2's PDL.
_MAXIMA_PASS = plan_launcher(_maxima_pass_kernel, num_warps="pass_warps")


_MAXIMA_SELECT = plan_launcher(_maxima_select_kernel, num_warps="select_warps",
                               launch_pdl="pdl")


# ---------------------------------------------------------------------------------------------
# maxima
# ---------------------------------------------------------------------------------------------
# k up to this: the cut needs at least RHO_MIN * k supergroups, and their maxima are one
# register tile of at most MAXIMA_S_MAX; ranking holds about 1.5 k candidates in registers,
# which spill beyond it (see benchmarks/results/h200/fits/topk.md#maxima).
MAXIMA_K_MAX = 1024


MAXIMA_S_MAX = 8192


# The cut is searched among at least RHO * k supergroup maxima where the row allows, and never
# fewer than RHO_MIN * k: with rho maxima per winner the survivors of a random row number
# about rho * ln(rho / (rho - 1)) * k (1.15 k at rho = 4, 1.39 k at 2, 2 k at 1.25).
RHO = 3


RHO_MIN = 1.25


@dataclass(frozen=True, eq=False)
class MaximaPlan:
    """Launch parameters of the maxima backend. Launch 1: `programs_per_row` programs per row,
    a `chunk` of whole tiles each, writing the maximum of every group and of every supergroup.
    Launch 2: `select_programs_per_row` programs per row (coop: they wait for each other once)
    scan the maxima; the cut stops once k to k_hi supergroup maxima reach it; the candidates
    above it are ranked against each other (see _maxima_select_kernel)."""

    group: int = 0  # elements per group (launch 1 writes each group's maximum)
    tile: int = 0  # elements launch 1 loads at once
    chunk: int = 0  # elements each launch-1 program takes (whole tiles)
    programs_per_row: int = 0  # launch-1 programs per row
    evict: str = ""  # launch 1's load eviction policy
    float_maxima: bool = False  # launch 1 takes whole tiles' maxima as floats (see common.py)
    vector: int = 0  # elements per 16-byte vector where rows start off the grid (0: on it)
    supergroup: int = 0  # elements per supergroup (maxima of supergroups bound the cut)
    supergroups: int = 0  # supergroups per row
    supergroup_row_stride: int = 0  # workspace elements between rows of supergroup maxima
    groups: int = 0  # groups per row
    group_row_stride: int = 0  # workspace elements between rows of group maxima
    supergroups_padded: int = 0  # supergroups rounded up to a power of two (at least 16)
    select_programs_per_row: int = 0  # launch-2 programs per row
    coop: bool = False  # launch-2 programs of a row wait for each other once (one grid resident)
    # launch 2 is a programmatic dependent launch (asked, allowed, and the device is sm_90+)
    pdl: bool = False
    groups_per_program: int = 0  # groups each launch-2 program scans
    groups_per_scan: int = 0  # groups scanned at once
    hot_groups_per_gather: int = 0  # hot groups gathered at once
    k_hi: int = 0  # the cut stops once k to k_hi supergroup maxima reach it
    survivor_capacity: int = 0  # candidates (keys above the cut) a row's buffer holds
    tie_capacity: int = 0  # keys equal to the cut a row's buffer holds
    finish_tile: int = 0  # candidates the finisher holds in registers at once
    candidates_per_step: int = 0  # candidates ranked at once
    rivals_per_step: int = 0  # rivals each candidate is compared with at once
    sort_after: bool = False  # torch.sort orders the winners afterwards
    pass_warps: int = 0  # warps of launch 1
    select_warps: int = 0  # warps of launch 2
    workspace_offsets: tuple = ()  # int64 offsets of the workspace's parts
    workspace_elements: int = 0  # int64 elements of the workspace
    is_float: bool = False  # floating-point keys (their bits are reordered to compare as integers)
    key64: bool = False  # 64-bit keys (indices kept apart from them)
    row_stride: int = 0  # elements between the rows the kernels read
    flip: int = 0  # 0, or -1 for the smallest k (complements every key: see _order_key)
    reason: str | None = None  # why the plan cannot take the call (None: it can)


#: The config keys maxima_plan reads (any other is refused: see check_config).
CONFIG_KEYS = frozenset({
    "group", "group_min", "tile", "tiles_per_program", "supergroups_max", "supergroups_per_k",
    "k_hi_factor", "coop", "pdl", "select_programs_per_sm", "groups_per_scan_max",
    "elements_per_gather", "survivor_capacity", "finish_tile", "candidates_per_step",
    "rivals_per_step", "pass_warps", "select_warps", "evict", "sm_count"})


def maxima_plan(R: int, N: int, k: int, dtype: torch.dtype, sorted_: bool, sms: int,
                config: dict, *, row_stride: int | None = None, largest: bool = True,
                pdl_device: bool = False) -> MaximaPlan:
    """The plan of R rows of N (row_stride apart: N by default), k of each, largest or not;
    pdl_device: the device has griddepcontrol (sm_90+, not the interpreter)."""
    check_config("topk maxima", config, CONFIG_KEYS)
    p = SimpleNamespace()  # filled below, frozen at the end
    p.reason = None
    p.row_stride, p.flip = N if row_stride is None else row_stride, 0 if largest else -1
    R, N, kk = max(R, 1), max(N, 1), max(k, 1)  # empty calls never launch
    sms = config.get("sm_count", sms)
    key64 = _key64(dtype)
    p.is_float, p.key64 = dtype.is_floating_point, key64
    s_max = config.get("supergroups_max", MAXIMA_S_MAX)
    g_min = config.get("group_min", 8)
    # Groups: at least 4 k of them, so that hot groups are few among many; about 256K at most
    # per row, so that launch 2 scans their maxima quickly (a hot group costs `group` loads).
    p.group = config.get("group", max(64, min(512, next_pow2(cdiv(N, 1 << 18)))))
    while p.group > g_min and cdiv(N, p.group) < 4 * kk:
        p.group //= 2
    # Tiles: two programs per SM at least, where the rows allow.
    p.tile = config.get("tile", 8192)
    while p.tile > max(p.group * 16, 1024) and R * cdiv(N, p.tile) < 2 * sms:
        p.tile //= 2
    p.tile = max(p.tile, p.group)
    # Supergroups: the largest size that leaves supergroups_per_k * k of them (a tight cut), no
    # smaller than a group, and no larger than a tile unless the row has more than s_max tiles.
    rho = config.get("supergroups_per_k", RHO)
    supergroup = p.group
    while supergroup * 2 <= p.tile and cdiv(N, supergroup * 2) >= rho * kk:
        supergroup *= 2
    # Rows off the 16-byte grid are read from their first element's vector on (up to
    # vector - 1 elements of the row before): their groups, chunks and supergroups cover that
    # much more.
    p.vector = row_vector(dtype, N, p.row_stride, R, p.group)
    reach = N + max(p.vector - 1, 0)
    while cdiv(reach, supergroup) > s_max:
        supergroup *= 2
    p.supergroup = supergroup
    if cdiv(N, supergroup) < RHO_MIN * kk:
        p.reason = (f"k={k} is too large a part of a row of {N}: the cut needs {RHO_MIN:g} k "
                    f"supergroups of at least {p.group} elements")
    # A chunk is tiles_per_program tiles (their loads overlap), or exactly one supergroup where
    # supergroups are longer than a tile (the pass kernel then keeps one running maximum).
    p.chunk = supergroup if supergroup > p.tile else p.tile * config.get("tiles_per_program", 1)
    p.supergroups = cdiv(reach, supergroup)
    p.programs_per_row = cdiv(reach, p.chunk)
    p.groups = cdiv(reach, p.group)
    p.group_row_stride = p.programs_per_row * (p.chunk // p.group)
    p.supergroup_row_stride = p.programs_per_row * (p.chunk // supergroup)
    p.supergroups_padded = max(16, next_pow2(p.supergroups))
    # The search stops at the first cut that k to k_hi supergroup maxima reach: a wide window
    # ends it sooner, at the price of a few more candidates.
    p.k_hi = max(kk, int(kk * config.get("k_hi_factor", 1.5)))
    # Launch 2: enough programs to spread the group scans and gathers over the chip; where
    # they wait for each other (coop), one per SM at most, so that all are resident.
    p.coop = config.get("coop", True) and COOP_ALLOWED
    p.pdl = config.get("pdl", True) and PDL_ALLOWED and pdl_device
    per_sm = 1 if p.coop else config.get("select_programs_per_sm", 2)
    p.select_programs_per_row = max(1, min(sms * per_sm // R, cdiv(p.groups, 256)))
    p.groups_per_program = cdiv(p.groups, p.select_programs_per_row)
    p.groups_per_scan = max(16, min(next_pow2(p.groups_per_program),
                                    config.get("groups_per_scan_max", 2048)))
    gather = config.get("elements_per_gather", max(1024, 4 * p.group))
    p.hot_groups_per_gather = max(1, gather // p.group)
    # Candidates: about 1.2 k survivors for random data; room for several times that before
    # the last program gives up on them and selects from the row (tiles of finish_tile).
    # Ranking compares candidates_per_step candidates with rivals_per_step others at a time.
    # The ranks put the output in order, but the whole-row path leaves 64-bit keys unordered:
    # torch.sort orders those afterwards.
    p.survivor_capacity = config.get("survivor_capacity", 8 * kk + 1024)
    p.tie_capacity = kk
    p.finish_tile = config.get("finish_tile", 1024)
    p.candidates_per_step = config.get("candidates_per_step", 16)
    p.rivals_per_step = config.get("rivals_per_step",
                                   max(128, min(2048, next_pow2(kk * 3 // 2 + 64))))
    p.sort_after = sorted_ and key64
    p.pass_warps = config.get("pass_warps", 8 if p.tile >= 8192 else 4)
    # The rows are read once: evict them first, so the maxima written beside them stay in L2
    # for launch 2 (see benchmarks/results/h200/fits/topk.md#maxima).
    p.evict = config.get("evict", "evict_first")
    p.float_maxima = float_maxima_allowed(dtype, p.row_stride, p.chunk)
    p.select_warps = config.get("select_warps", 8 if p.supergroups_padded >= 2048 else 4)
    # The workspace (int64 elements): counters [R, 8]; supergroup and group maxima (keys);
    # each launch-2 program's hot list (int32); the survivor buffer (int64) and, for 64-bit
    # keys, its indices (int32).
    unit = 1 if key64 else 0.5
    off = int(COUNTERS) * R
    off_smax = off
    off += math.ceil(R * p.supergroup_row_stride * unit)
    off_gmax = off
    off += math.ceil(R * p.group_row_stride * unit)
    off_scr = off
    off += cdiv(R * p.select_programs_per_row * p.groups_per_scan, 2)
    off_sbuf = off
    slots = R * (p.survivor_capacity + p.tie_capacity)
    off += slots
    off_sidx = off
    off += cdiv(slots, 2) if key64 else 0
    p.workspace_offsets = (off_smax, off_gmax, off_scr, off_sbuf, off_sidx)
    p.workspace_elements = off
    return MaximaPlan(**vars(p))


def row_vector(dtype: torch.dtype, N: int, row_stride: int, R: int, group: int) -> int:
    """Elements per 16-byte vector where the compiler cannot see that rows start and end on
    the 16-byte grid (Triton tells it that an integer argument divides by 16, nothing less): the
    pass then reads each row from its first element's vector to its last element's, a bound it
    knows as a multiple of the vector (a mask at element grain makes every load a single
    element). 0 where it can see it, or groups (and so tiles and chunks, powers of two times
    them) are not whole vectors. On the H200
    the pass over 1024 x 50257 float16 took 114 us element by element, 2.6x a read of the input
    (fits/topk.md, "maxima: rows off the 16-byte grid")."""
    per_vector = 16 // dtype.itemsize
    if (R <= 1 or row_stride % 16 == 0) and N % 16 == 0:
        return 0
    return per_vector if group % per_vector == 0 else 0


def _pdl_device(call: TopkCall) -> bool:
    """Whether the call's device has griddepcontrol (sm_90+; the interpreter has no such
    instruction)."""
    return not call.info.interpreted and (call.info.capability or (0, 0)) >= (9, 0)


class MaximaBackend(_PlannedBackend):
    """Supergroup maxima give one cut for a whole row, so a long row is read once by the whole
    chip, with no sampling and no waiting (see _maxima_select_kernel): long rows with k up to a
    few thousand."""

    name = "maxima"

    def supports(self, call: TopkCall) -> str | None:
        if call.k == 0 or call.R == 0 or call.nd == 0:
            return None  # nothing to select: run() returns without a launch
        if call.k > MAXIMA_K_MAX:
            return f"k={call.k}; maxima selects from a register tile (k up to {MAXIMA_K_MAX})"
        if call.N > MAX_ROW:
            return (f"rows of {call.N} elements; indices are packed in 32 bits "
                    f"(rows up to {MAX_ROW})")
        return self.plan(call, self.configs(call)[0]).reason

    def configs(self, call: TopkCall) -> list[dict]:
        if call.info.interpreted:
            # Small tiles, groups and register tiles: CPU tests take every path on rows of a
            # few thousand elements.
            # The interpreter runs programs one after another: none may wait for a later one
            # (no coop; the last program ranks the candidates).
            return [{"group": 8, "group_min": 2, "tile": 64, "supergroups_max": 256,
                     "groups_per_scan_max": 64, "elements_per_gather": 32, "finish_tile": 256,
                     "select_programs_per_sm": 1, "coop": False, "rivals_per_step": 64,
                     "tiles_per_program": 2},
                    {"group": 4, "group_min": 2, "tile": 32, "supergroups_max": 1024,
                     "groups_per_scan_max": 16, "elements_per_gather": 8, "finish_tile": 128,
                     "supergroups_per_k": 8, "select_programs_per_sm": 2, "coop": False,
                     "candidates_per_step": 8, "rivals_per_step": 32}]
        # Where rows are many (two or more an SM), tiles of 4096 first: tuning chose them for
        # nearly all such calls, and 8192 made the cold pick up to 1.3x slower. Fewer rows
        # keep 8192, faster on long rows (tuning of few-row calls was split between the two).
        # See benchmarks/results/h200/fits/topk.md#maxima-configs.
        out = [{}, {"supergroups_per_k": 2, "group": 128}, {"tile": 4096}]
        if call.R >= 2 * call.info.sm_count and self.plan(call, out[2]).reason is None:
            out.insert(0, out.pop(2))
        return out[:1] + [c for c in out[1:] if self.plan(call, c).reason is None]

    estimate = staticmethod(cost.maxima)

    def make_plan(self, call: TopkCall, config: dict, sms: int) -> MaximaPlan:
        return maxima_plan(call.R, call.N, call.k, call.input.dtype, call.sorted, sms, config,
                           row_stride=_row_stride(call), largest=call.largest,
                           pdl_device=_pdl_device(call))

    def plan_facts(self, call: TopkCall) -> tuple:
        return super().plan_facts(call) + (_pdl_device(call),)

    def _prepared(self, p, call: TopkCall):
        """The prepared call (see Backend.bind) under the plan p: a function of the input,
        everything else worked out here once."""
        self._refuse(p)
        read = _reader(call, unit_col=True)[0]
        R, N, k, row_stride, flip = call.R, call.N, call.k, p.row_stride, p.flip
        device, index = call.input.device, call.info.index
        new_outputs, finish = _output_maker(call), _output_finisher(call, p.sort_after)
        launch_pass = _MAXIMA_PASS.bind(p, (R, p.programs_per_row), index)
        launch_select = _MAXIMA_SELECT.bind(p, (R, p.select_programs_per_row), index)
        offsets, size = p.workspace_offsets, p.workspace_elements
        new_ws = allocator((size,), torch.int64, device)
        pass_args = (offsets[0], offsets[1], N, row_stride, p.group_row_stride,
                     p.supergroup_row_stride, p.chunk, flip)
        select_ints = (N, row_stride, k, p.k_hi, p.group_row_stride, p.supergroup_row_stride,
                       p.groups, p.supergroups, p.groups_per_program, p.select_programs_per_row,
                       p.survivor_capacity, p.tie_capacity, flip)

        def topk(x: torch.Tensor):
            if read is not None:
                x = read(x)
            values, indices = new_outputs()
            ws = new_ws()
            launch_pass(x, ws, *pass_args)
            launch_select(x, ws, *offsets, values, indices, *select_ints)
            return finish(values, indices)

        return topk
