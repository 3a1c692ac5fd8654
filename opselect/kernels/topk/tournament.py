"""topk's tournament backend: per-block maxima narrow the candidates to a few blocks, then a
selection over them (small k)."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import torch
import triton
import triton.language as tl

from ...heuristics import topk as cost
from .._common import cdiv, next_pow2
from .call import TopkCall
from .common import (MAX_ROW, _PlannedBackend, _cavg, _count3, _cut, _group_max_keys,
                     _key_limits, _masked_group_max_keys, _narrow, _order_key, _row_stride,
                     _select, _store_winners, _take_k, _write_out, check_config,
                     float_maxima_allowed, plan_launcher, ticketed_call)


# ---------------------------------------------------------------------------------------------
# Kernels: tournament
# ---------------------------------------------------------------------------------------------
# N, row_stride and chunk stay specialised: divisible by 16, they give the tiles 16-byte loads.
# The three kernels take the same arguments (a plan's launches share one argument list): the
# fused kernel does everything in one program; the pass and the selection split it in two
# launches (see TournamentPlan.apart).
_RUNTIME = ["k", "programs_per_row", "flip", "off_max", "off_hot", "off_cand", "off_cmp",
            "off_state"]


@triton.jit
def _chunk_of_program(x_ptr, N, row_stride, chunk, programs_per_row):
    """Program (r, p)'s row r, its 64-bit offset, the chunk's start and length, the program's
    number among all and the chunk's first element."""
    r64 = tl.program_id(0).to(tl.int64)
    p = tl.program_id(1)
    row_off = r64 * row_stride
    start = p.to(tl.int64) * chunk
    n_here = tl.minimum(N - start, chunk).to(tl.int32)
    prog = r64 * programs_per_row + p
    return r64, row_off, start, n_here, prog, x_ptr + row_off + start


@triton.jit
def _tournament_cut(chunk_ptr, ws_ptr, off_max, off_hot, n_here, k, prog, flip,
                    group: tl.constexpr, tile: tl.constexpr, group_maxima_slots: tl.constexpr,
                    hot_groups: tl.constexpr, cut_sets: tl.constexpr,
                    float_maxima: tl.constexpr, is_float: tl.constexpr):
    """Stages 1 and 2 of the tournament (see _tournament_kernel): the chunk's group maxima, the
    cut T and the hot groups. Writes the hot groups' numbers to the program's hot list (where
    there are at most hot_groups of them); returns (T, number of hot groups)."""
    lowest, highest = _key_limits(False)
    # 1. group maxima, tile by tile (the next tile's load in flight), to the workspace. The
    # whole tiles in the loop, the chunk's partial last tile after it: a partial tile's masked
    # keys (an int32 an element) inside the loop held registers beside the tile in flight
    # (162 for 8192-element tiles of 4 warps: 3 programs an SM).
    GT: tl.constexpr = tile // group
    group_ids = tl.arange(0, GT)
    cols = tl.arange(0, group)
    lane = group_ids[:, None] * group + cols[None, :]
    maxima = (ws_ptr + off_max).to(tl.pointer_type(tl.int32)) + prog * group_maxima_slots
    # (Keys' maxima mask every tile anyway: all their tiles stay in the loop.)
    if float_maxima:
        whole = n_here // tile
    else:
        whole = tl.cdiv(n_here, tile)
    x = tl.load(chunk_ptr + lane, mask=lane < n_here, other=0)
    for t in range(whole):
        base = t * tile
        x_next = tl.load(chunk_ptr + base + tile + lane, mask=lane < n_here - base - tile,
                         other=0)
        if float_maxima:
            gm = _group_max_keys(x, is_float, flip, False)
        else:
            gm = _masked_group_max_keys(x, lane < n_here - base, is_float, flip, False)
        tl.store(maxima + t * GT + group_ids, gm)
        x = x_next
    if float_maxima and whole * tile < n_here:
        gm = _masked_group_max_keys(x, lane < n_here - whole * tile, is_float, flip, False)
        tl.store(maxima + whole * GT + group_ids, gm)
    tl.debug_barrier()  # every thread's maxima are stored before any thread reads them
    # 2. the cut among the group maxima (all groups are hot when there are few).
    ngroups = tl.cdiv(n_here, group)
    kc = tl.minimum(k, n_here)
    j = tl.arange(0, group_maxima_slots)
    okm = j < ngroups
    mx = tl.load(maxima + j, mask=okm, other=lowest)
    T = tl.full([], lowest, tl.int32)
    if ngroups > hot_groups:
        lo = tl.min(tl.where(okm, mx, highest), axis=0).to(tl.int64)
        hi = tl.max(tl.where(okm, mx, lowest), axis=0).to(tl.int64)
        # A cut with no search: the least of cut_sets column maxima (column c holds the maxima
        # of groups c, c + cut_sets, c + 2 cut_sets, ...: strided, so a sorted row spreads
        # over every column) is reached by at least cut_sets >= kc maxima. On random rows
        # about cut_sets * ln(cut_sets) reach it: k = 1 needs no search at all, a larger k
        # searches up from it, over a narrower range. (A column of slots past the chunk's
        # end has the lowest key for maximum, and the bound is then just the minimum.)
        columns = tl.max(tl.reshape(mx, [group_maxima_slots // cut_sets, cut_sets]), axis=0)
        least = tl.min(columns, axis=0).to(tl.int64)
        lo = tl.where(kc <= cut_sets, tl.maximum(lo, least), lo)
        if tl.sum((okm & (mx >= lo)).to(tl.int32), axis=0) <= hot_groups:
            T = lo.to(tl.int32)
        else:
            # Any cut that kc to hot_groups maxima reach will do: the search stops at the first.
            T = _cut(mx, okm, kc, hot_groups, lo, hi).to(tl.int32)
    hot = okm & (mx >= T)
    n_hot = tl.sum(hot.to(tl.int32), axis=0)
    if n_hot > hot_groups:
        # Many maxima tie at T (a few distinct values in the row); T is then the kc-th largest
        # maximum, so fewer than kc groups lie above it. Those, plus enough of the tied groups
        # to make kc, hold the chunk's kc largest: every element above T, and at least one
        # element equal to T per tied group (which of the equal values is taken is free, as in
        # torch). Before, the chunk went to the whole-chunk selection, 6-12x slower.
        above = okm & (mx > T)
        tied = okm & (mx == T)
        room = hot_groups - tl.sum(above.to(tl.int32), axis=0)
        hot = above | (tied & (tl.cumsum(tied.to(tl.int32), axis=0) <= room))
        n_hot = tl.sum(hot.to(tl.int32), axis=0)
    if n_hot <= hot_groups:
        hots = (ws_ptr + off_hot).to(tl.pointer_type(tl.int32)) + prog * hot_groups
        tl.store(hots + tl.cumsum(hot.to(tl.int32), axis=0) - 1, j, mask=hot)
    return T, n_hot


@triton.jit
def _hot_piece(chunk_ptr, hots, n_hot, n_here, start, q, flip, group: tl.constexpr,
               piece_groups: tl.constexpr, is_float: tl.constexpr):
    """Piece q of a chunk's hot groups (piece_groups of them, read again): their elements' keys,
    row indices (low 32 bits) and validity, as 1-d tiles."""
    h = q * piece_groups + tl.arange(0, piece_groups)
    gid = tl.load(hots + h, mask=h < n_hot, other=0)
    pos = gid[:, None] * group + tl.arange(0, group)[None, :]
    ok = (h < n_hot)[:, None] & (pos < n_here)
    key = _order_key(tl.load(chunk_ptr + pos, mask=ok, other=0), is_float, flip, False)
    n: tl.constexpr = piece_groups * group
    return (tl.reshape(key, [n]), tl.reshape(pos, [n]) + start.to(tl.int32),
            tl.reshape(ok, [n]))


@triton.jit
def _pack_hot(packed, chunk_ptr, hots, n_hot, n_here, start, flip, lo, hi, cap, base,
              group: tl.constexpr, piece_groups: tl.constexpr, is_float: tl.constexpr):
    """Append the hot groups' keys in [lo, hi] (key << 32 | index) to packed[base:], the first
    cap of them at most; returns (how many there are in all, the largest)."""
    lowest, highest = _key_limits(False)
    n = tl.full([], 0, tl.int32)
    top = tl.full([], lowest, tl.int32)
    for q in range(tl.cdiv(n_hot, piece_groups)):
        key, idx, ok = _hot_piece(chunk_ptr, hots, n_hot, n_here, start, q, flip, group,
                                  piece_groups, is_float)
        take = ok & (key >= lo) & (key <= hi)
        rank = n + tl.cumsum(take.to(tl.int32), axis=0) - 1
        _store_winners(packed, base + rank, take & (rank < cap), key, idx, True)
        n += tl.sum(take.to(tl.int32), axis=0)
        top = tl.maximum(top, tl.max(tl.where(take, key, lowest), axis=0))
    return n, top


@triton.jit
def _tournament_select(x_ptr, ws_ptr, off_hot, off_cand, off_cmp, val_ptr, idx_ptr, N, k,
                       chunk, programs_per_row, flip, r64, row_off, start, n_here, prog,
                       chunk_ptr, T, n_hot, shared: tl.constexpr, group: tl.constexpr,
                       hot_groups: tl.constexpr, piece_groups: tl.constexpr,
                       compact: tl.constexpr, finish_tile: tl.constexpr, sort: tl.constexpr,
                       k_padded: tl.constexpr, is_float: tl.constexpr):
    """Stage 3 of the tournament and the row's outputs (see _tournament_kernel), given the cut
    T and the number of hot groups of the program's chunk (their numbers in its hot list)."""
    lowest, highest = _key_limits(False)
    kc = tl.minimum(k, n_here)
    if shared:
        dest = ws_ptr + off_cand + prog * k
    else:
        dest = idx_ptr + r64 * k
    # A shared row's winners carry their keys (key << 32 | index) for the row's merge; a row of
    # its own packs them only to sort them.
    PACK: tl.constexpr = shared or sort
    PIECE: tl.constexpr = piece_groups * group
    if n_hot <= hot_groups:
        # 3. the hot groups' elements (read again, piece by piece), the keys that reach T
        # packed into `compact` slots (key << 32 | index), and their kc largest. On most rows a
        # hot group holds one or two keys that reach T. Pieces, not one tile of every hot
        # group, keep the stage's registers near the pass's, so that more programs share an
        # SM (H200, 4096 x 32000 bf16, k = 50: one tile of 2048 keys took 167 registers, 3
        # programs an SM, and this stage 60 of 173 us).
        hots = (ws_ptr + off_hot).to(tl.pointer_type(tl.int32)) + prog * hot_groups
        packed = (ws_ptr + off_cmp) + prog * compact
        tl.debug_barrier()  # the hot list written by every thread is read by every thread
        n_reach, top = _pack_hot(packed, chunk_ptr, hots, n_hot, n_here, start, flip, T,
                                 highest, compact, 0, group, piece_groups, is_float)
        cut = T.to(tl.int64)
        if n_reach > compact:
            # More keys reach T than the slots hold (rows in order, few distinct values): a
            # higher cut, searched piece by piece, that kc to `compact` keys reach, or else
            # the kc-th largest key. Then the keys above it, and as many equal to it as kc
            # still needs (which of equal keys is taken is free, as in torch).
            hi = top.to(tl.int64)
            c_lo = n_reach.to(tl.int64)
            while cut < hi:
                m2 = _cavg(cut, hi)
                m1 = _cavg(cut, m2)
                m3 = _cavg(m2, hi)
                c1 = tl.full([], 0, tl.int64)
                c2 = tl.full([], 0, tl.int64)
                c3 = tl.full([], 0, tl.int64)
                for q in range(tl.cdiv(n_hot, piece_groups)):
                    key, idx, ok = _hot_piece(chunk_ptr, hots, n_hot, n_here, start, q, flip,
                                              group, piece_groups, is_float)
                    t1, t2, t3 = _count3(key, ok, m1, m2, m3)
                    c1 += t1
                    c2 += t2
                    c3 += t3
                cut, hi, c_lo = _narrow(cut, hi, c_lo, kc, compact, c1, c2, c3, m1, m2, m3)
            n_above, top = _pack_hot(packed, chunk_ptr, hots, n_hot, n_here, start, flip,
                                     cut + 1, highest, compact, 0, group, piece_groups,
                                     is_float)
            room = tl.maximum(tl.minimum(kc - n_above, compact - n_above), 0)
            n_tied, top = _pack_hot(packed, chunk_ptr, hots, n_hot, n_here, start, flip, cut,
                                    cut, room, n_above, group, piece_groups, is_float)
            n_reach = n_above + tl.minimum(n_tied, room)
        tl.debug_barrier()  # every thread's candidates are stored before any are read
        s = tl.arange(0, compact)
        oks = s < n_reach
        v = tl.load(packed + s, mask=oks, other=0)
        _take_k((v >> 32).to(tl.int32), v.to(tl.int32), oks, kc, cut, dest, PACK, False)
    else:
        # (Not reached: stage 2 leaves at most hot_groups hot groups. Kept exact all the same:
        # the whole chunk's selection, streamed in pieces.)
        if shared:
            _select(chunk_ptr, 0, ws_ptr, ws_ptr, n_here, kc, tl.full([], 0, tl.int64), True,
                    dest, True, PIECE, is_float, flip, False)
            # The whole-chunk selection numbers elements from the chunk's start.
            tl.debug_barrier()
            for s0 in range(0, kc, PIECE):
                e = s0 + tl.arange(0, PIECE)
                v = tl.load(dest + e, mask=e < kc)
                tl.store(dest + e, v + start, mask=e < kc)
        else:
            _select(chunk_ptr, 0, ws_ptr, ws_ptr, n_here, kc, tl.full([], 0, tl.int64), True,
                    dest, sort, PIECE, is_float, flip, False)
    tl.debug_barrier()  # the winners written by all threads are visible to all threads
    if shared:
        ticket = tl.atomic_add(ws_ptr.to(tl.pointer_type(tl.int32)) + r64, 1, sem="acq_rel")
        if ticket == programs_per_row - 1:
            # The row's last program: the k largest of the programs_per_row lists (list q holds
            # min(k, length of chunk q) winners; every chunk but the last is `chunk` long). The
            # slots past a list's count were never written: reading them took garbage for
            # winners.
            c = tl.arange(0, finish_tile)
            owner = c // k
            chunk_len = tl.minimum(N - owner.to(tl.int64) * chunk, chunk)
            ok = (owner < programs_per_row) & (c - owner * k < tl.minimum(chunk_len, k))
            v = tl.load(ws_ptr + off_cand + r64 * programs_per_row * k + c, mask=ok, other=0,
                        cache_modifier=".cg")
            key = (v >> 32).to(tl.int32)
            lo = tl.min(tl.where(ok, key, highest), axis=0).to(tl.int64)
            _take_k(key, v.to(tl.int32), ok, k, lo, idx_ptr + r64 * k, sort, False)
            tl.debug_barrier()
            _write_out(x_ptr, row_off, idx_ptr + r64 * k, val_ptr + r64 * k, k, sort, k_padded,
                       finish_tile)
            # Every program of the row has taken its ticket: back to zero for the next launch
            # (the workspace is the stream's, kept between calls).
            tl.atomic_xchg(ws_ptr.to(tl.pointer_type(tl.int32)) + r64, 0, sem="relaxed")
    else:
        _write_out(x_ptr, row_off, idx_ptr + r64 * k, val_ptr + r64 * k, k, sort, k_padded,
                   k_padded)


@triton.jit(do_not_specialize=_RUNTIME)
def _tournament_kernel(x_ptr, ws_ptr, off_max, off_hot, off_cand, off_cmp, off_state, val_ptr,
                       idx_ptr, N, row_stride, k, chunk, programs_per_row, flip,
                       shared: tl.constexpr, group: tl.constexpr, tile: tl.constexpr,
                       group_maxima_slots: tl.constexpr, hot_groups: tl.constexpr,
                       piece_groups: tl.constexpr, compact: tl.constexpr,
                       cut_sets: tl.constexpr, float_maxima: tl.constexpr,
                       finish_tile: tl.constexpr, sort: tl.constexpr, k_padded: tl.constexpr,
                       is_float: tl.constexpr):
    """Program p of row r takes the chunk [p * chunk, (p + 1) * chunk) of the row and its share kc
    = min(k, chunk length) of k:

      1. stream the chunk once, keeping only the maximum key of each group (`group` elements);
      2. T = the kc-th largest group maximum. Then at least kc elements reach T (one per group),
         so the chunk's kc largest all reach T and lie in the kc groups whose maximum does
         ("hot" groups; more only where maxima tie at T);
      3. read the hot groups again (from L2, piece_groups groups at a time), pack the keys
         that reach T into `compact` slots (where more reach it, a higher cut is searched
         first), select their kc largest.

    No sample, no margin, no wait: the cut is exact by construction. With several programs per
    row (shared) each writes its winners (key << 32 | index) to the row's candidate list and
    the last to finish (a ticket) selects the row's k from those programs_per_row * k. Too many
    hot groups (many maxima equal to T) send the chunk to the whole-chunk selection: slow,
    always exact.
    Keys of at most 32 bits, k <= hot_groups / 2."""
    r64, row_off, start, n_here, prog, chunk_ptr = _chunk_of_program(x_ptr, N, row_stride, chunk,
                                                                      programs_per_row)
    T, n_hot = _tournament_cut(chunk_ptr, ws_ptr, off_max, off_hot, n_here, k, prog, flip, group,
                               tile, group_maxima_slots, hot_groups, cut_sets, float_maxima,
                               is_float)
    _tournament_select(x_ptr, ws_ptr, off_hot, off_cand, off_cmp, val_ptr, idx_ptr, N, k, chunk,
                       programs_per_row, flip, r64, row_off, start, n_here, prog, chunk_ptr, T,
                       n_hot, shared, group, hot_groups, piece_groups, compact, finish_tile,
                       sort, k_padded, is_float)


@triton.jit(do_not_specialize=_RUNTIME)
def _tournament_pass_kernel(x_ptr, ws_ptr, off_max, off_hot, off_cand, off_cmp, off_state,
                            val_ptr, idx_ptr, N, row_stride, k, chunk, programs_per_row, flip,
                            group: tl.constexpr, tile: tl.constexpr,
                            group_maxima_slots: tl.constexpr, hot_groups: tl.constexpr,
                            cut_sets: tl.constexpr, float_maxima: tl.constexpr,
                            is_float: tl.constexpr):
    """The fused kernel's stages 1 and 2 alone: each program leaves its cut and hot-group count
    in its state slots (two int32) for the selection launch. Without stage 3's registers and
    latency the pass keeps more programs an SM streaming."""
    r64, row_off, start, n_here, prog, chunk_ptr = _chunk_of_program(x_ptr, N, row_stride, chunk,
                                                                      programs_per_row)
    T, n_hot = _tournament_cut(chunk_ptr, ws_ptr, off_max, off_hot, n_here, k, prog, flip, group,
                               tile, group_maxima_slots, hot_groups, cut_sets, float_maxima,
                               is_float)
    state = (ws_ptr + off_state).to(tl.pointer_type(tl.int32)) + 2 * prog
    tl.store(state, T)
    tl.store(state + 1, n_hot)


@triton.jit(do_not_specialize=_RUNTIME)
def _tournament_select_kernel(x_ptr, ws_ptr, off_max, off_hot, off_cand, off_cmp, off_state,
                              val_ptr, idx_ptr, N, row_stride, k, chunk, programs_per_row, flip,
                              shared: tl.constexpr, group: tl.constexpr,
                              hot_groups: tl.constexpr, piece_groups: tl.constexpr,
                              compact: tl.constexpr,
                              finish_tile: tl.constexpr, sort: tl.constexpr,
                              k_padded: tl.constexpr, is_float: tl.constexpr):
    """The fused kernel's stage 3 and outputs, from the pass launch's cut, hot-group count and
    hot list: its hot groups are read again from memory (a few percent of the data)."""
    r64, row_off, start, n_here, prog, chunk_ptr = _chunk_of_program(x_ptr, N, row_stride, chunk,
                                                                      programs_per_row)
    state = (ws_ptr + off_state).to(tl.pointer_type(tl.int32)) + 2 * prog
    T = tl.load(state)
    n_hot = tl.load(state + 1)
    _tournament_select(x_ptr, ws_ptr, off_hot, off_cand, off_cmp, val_ptr, idx_ptr, N, k, chunk,
                       programs_per_row, flip, r64, row_off, start, n_here, prog, chunk_ptr, T,
                       n_hot, shared, group, hot_groups, piece_groups, compact, finish_tile,
                       sort, k_padded, is_float)


# The spec is the plan (made per call's sizes, dtype, flags and layout): it fixes every integer
# argument Triton specialises on, every constexpr (each the plan's field of its name) and the
# warps.
_TOURNAMENT = plan_launcher(_tournament_kernel)
_TOURNAMENT_PASS = plan_launcher(_tournament_pass_kernel)
_TOURNAMENT_SELECT = plan_launcher(_tournament_select_kernel, num_warps="select_warps")


# ---------------------------------------------------------------------------------------------
# tournament
# ---------------------------------------------------------------------------------------------
# k up to this: the hot groups (2k of them, each `group` elements) and the programs_per_row * k
# candidates of a shared row are register tiles.
TOURNAMENT_K_MAX = 256


# The last program of a shared row selects from at most this many candidates (one tile).
TOURNAMENT_FINISH_MAX = 8192


@dataclass(frozen=True, eq=False)
class TournamentPlan:
    """Launch parameters of the tournament backend: programs_per_row programs per row, each
    taking a chunk of whole tiles whose group maxima fit group_maxima_slots; hot_groups hot
    groups at most; the last program of a shared row selects from finish_tile candidates.
    The Launcher's whole spec."""

    programs_per_row: int = 0  # programs per row
    chunk: int = 0  # elements each program takes (whole tiles)
    group: int = 0  # elements per group whose maximum the tournament keeps
    tile: int = 0  # elements a program loads at once
    group_maxima_slots: int = 0  # group maxima a program holds (a power of two)
    hot_groups: int = 0  # groups at most that can hold a winner, gathered for the selection
    piece_groups: int = 0  # hot groups gathered at once (a power of two)
    compact: int = 0  # the gathered keys that reach the cut, packed for the selection (at most)
    cut_sets: int = 0  # columns of group maxima whose least maximum bounds the cut from below
    float_maxima: bool = False  # whole tiles' group maxima taken as floats (float_maxima_allowed)
    finish_tile: int = 0  # candidates the last program of a shared row selects from
    k_padded: int = 0  # k rounded up to a compiled sorting-network size
    num_warps: int = 0  # warps per program (of the pass, where the selection is apart)
    apart: bool = False  # the selection is a second launch (see _tournament_pass_kernel)
    select_warps: int = 0  # warps per program of that second launch
    workspace_offsets: tuple = ()  # int64 offsets of the workspace's parts
    workspace_elements: int = 0  # int64 elements of the workspace
    sort: bool = False  # the winners are written in order
    is_float: bool = False  # floating-point keys (their bits are reordered to compare as integers)
    row_stride: int = 0  # elements between the rows the kernel reads
    flip: int = 0  # 0, or -1 for the smallest k (complements every key: see _order_key)
    reason: str | None = None  # why the plan cannot take the call (None: it can)

    @property
    def shared(self) -> bool:
        """Several programs share a row: the last one merges their winners."""
        return self.programs_per_row > 1


#: The config keys tournament_plan reads (any other is refused: see check_config).
CONFIG_KEYS = frozenset({
    "tile_max",  # the largest tile (a chunk's next power of two, if smaller)
    "group_maxima_slots_max",  # group maxima a program keeps (doubled once for long rows)
    "finish_tile_max",  # candidates the last program of a shared row may select from
    "candidates_max",  # hot_groups * group, the elements gathered for the selection
    "programs_per_sm",  # programs per SM in all, where rows are fewer than two an SM
    "chunk_min",  # the shortest chunk a program takes
    "num_warps",  # warps per program
    "piece_max",  # hot groups' elements gathered at once
    "apart",  # the selection in a second launch
    "select_warps",  # warps per program of that second launch
})


def tournament_plan(R: int, N: int, k: int, dtype: torch.dtype, sorted_: bool, sms: int,
                    config: dict, *, row_stride: int | None = None,
                    largest: bool = True) -> TournamentPlan:
    """The plan of R rows of N (row_stride apart: N by default), k of each, largest or not."""
    check_config("topk tournament", config, CONFIG_KEYS)
    p = SimpleNamespace()  # filled below, frozen at the end
    p.reason = None
    p.sort, p.is_float = sorted_, dtype.is_floating_point
    p.row_stride, p.flip = N if row_stride is None else row_stride, 0 if largest else -1
    R, N = max(R, 1), max(N, 1)  # empty calls never launch; their plan only has to exist
    tile_max = config.get("tile_max", 8192)
    groups_max = config.get("group_maxima_slots_max", 4096)
    finish_max = config.get("finish_tile_max", TOURNAMENT_FINISH_MAX)
    kk = max(k, 1)
    # Room for twice k hot groups (maxima may tie at the cut); hot_groups * group candidates
    # at most candidates_max.
    p.hot_groups = max(16, next_pow2(2 * kk))
    p.group = max(2, min(64, config.get("candidates_max", 2048) // p.hot_groups))
    # Programs per row: several per SM in all (nothing waits, so nothing must be resident),
    # chunks of at least chunk_min elements, and each chunk's group maxima within one tile.
    if R >= 2 * sms:
        nb = 1
    else:
        nb = max(1, min(cdiv(sms * config.get("programs_per_sm", 4), R),
                        cdiv(N, config.get("chunk_min", 16384))))
    nb = min(nb, max(1, finish_max // kk))
    # Long rows need more programs for their maxima to fit; twice the maxima per program
    # (a longer search) before more programs than the finishing tile can take.
    need = cdiv(N, groups_max * p.group)
    if nb < need and need * kk > finish_max:
        groups_max *= 2
        need = cdiv(N, groups_max * p.group)
    nb = max(nb, need)
    chunk = cdiv(N, nb)
    # Short chunks: smaller groups, so that the cut leaves few hot groups among many (with
    # hot_groups groups or fewer in all, every element is a candidate).
    while p.group > 2 and chunk < 4 * kk * p.group:
        p.group //= 2
    p.tile = max(p.group, min(tile_max, next_pow2(chunk)))
    p.chunk = cdiv(chunk, p.tile) * p.tile
    p.programs_per_row = cdiv(N, p.chunk) if N else 1
    p.group_maxima_slots = max(16, next_pow2(cdiv(p.chunk, p.group)))
    p.cut_sets = min(next_pow2(kk), p.group_maxima_slots)
    # Hot groups hold one or two keys that reach the cut each on most rows (their maxima do).
    p.compact = min(p.hot_groups * p.group, 2 * p.hot_groups)
    # Hot groups gathered 512 elements at a time: 96 registers for 4 warps (5 programs an SM),
    # where one tile of all 2048 took 167 (fits/topk.md#tournament-pieces).
    p.piece_groups = max(1, min(p.hot_groups, config.get("piece_max", 512) // p.group))
    p.float_maxima = float_maxima_allowed(dtype, p.row_stride, p.chunk)
    p.k_padded = max(16, next_pow2(kk))
    p.finish_tile = (max(p.k_padded, next_pow2(p.programs_per_row * kk))
                     if p.programs_per_row > 1 else p.k_padded)
    if p.programs_per_row > 1 and p.programs_per_row * kk > finish_max:
        p.reason = (f"a row of {N} needs {p.programs_per_row} programs, whose "
                    f"{p.programs_per_row * kk} candidates exceed "
                    f"the finishing tile ({finish_max})")
    # 4 warps where programs are many (several share an SM, one's searches overlap another's
    # loads), 8 where about one program runs per SM (its warps alone keep the loads in
    # flight). See benchmarks/results/h200/fits/topk.md#tournament.
    p.num_warps = config.get("num_warps", 4 if R * p.programs_per_row >= 2 * sms else 8)
    p.apart = bool(config.get("apart", False))
    p.select_warps = config.get("select_warps", 4)
    # The workspace, int64 elements: per-row tickets (int32), group maxima (int32), hot group
    # ids (int32), candidate lists (int64, shared rows only), packed candidates (int64), and
    # each program's cut and hot-group count (int32 pairs) where the selection is apart.
    progs = R * p.programs_per_row
    off_max = cdiv(R, 2)
    off_hot = off_max + cdiv(progs * p.group_maxima_slots, 2)
    off_cand = off_hot + cdiv(progs * p.hot_groups, 2)
    off_cmp = off_cand + (progs * kk if p.programs_per_row > 1 else 0)
    off_state = off_cmp + progs * p.compact
    p.workspace_offsets = (off_max, off_hot, off_cand, off_cmp, off_state)
    p.workspace_elements = off_state + (progs if p.apart else 0)
    return TournamentPlan(**vars(p))


class TournamentBackend(_PlannedBackend):
    """Group maxima cut each chunk to its 2k hot groups (see _tournament_kernel): one read of
    the data, no sampling; small k (sampling from vocabularies, argmax-like selections)."""

    name = "tournament"

    def supports(self, call: TopkCall) -> str | None:
        if call.input.dtype.itemsize > 4:
            return ("tournament packs a 32-bit key with the index in one int64; "
                    f"{str(call.input.dtype)[6:]} keys are 64 bits (radix and sort take them)")
        if call.k > TOURNAMENT_K_MAX:
            return f"k={call.k}; tournament keeps 2k groups per chunk (k up to {TOURNAMENT_K_MAX})"
        if call.N > MAX_ROW:
            return (f"rows of {call.N} elements; indices are packed in 32 bits "
                    f"(rows up to {MAX_ROW})")
        return self.plan(call, self.configs(call)[0]).reason

    def configs(self, call: TopkCall) -> list[dict]:
        if call.info.interpreted:
            # Small tiles, groups and chunks: CPU tests take every path on rows of a few
            # hundred elements.
            # Hot groups gathered in several pieces; the second takes the selection apart (two
            # launches).
            out = [{"tile_max": 64, "candidates_max": 512, "chunk_min": 128,
                    "group_maxima_slots_max": 128, "programs_per_sm": 2, "finish_tile_max": 1024,
                    "piece_max": 64},
                   {"tile_max": 32, "candidates_max": 64, "chunk_min": 1 << 30,
                    "group_maxima_slots_max": 1 << 20, "apart": True, "piece_max": 16}]
        else:
            # Tiles of 8192 and 2048 candidates first: faster on the suite's few, long rows and
            # on many rows of a vocabulary; where rows are many, tuning was split between it
            # and 4096 x 4096, so the default stays (see
            # benchmarks/results/h200/fits/topk.md#tournament-configs).
            default = self.plan(call, {})
            other = 12 - default.num_warps  # the warp count the default does not pick
            out = [{}, {"tile_max": 4096, "candidates_max": 4096}, {"num_warps": other}]
            if not default.shared:
                # Rows of one program each: the selection as a second launch of 2-warp
                # programs (H200, 4096 x 32000 bf16, k = 50: 150.5 us against 159.3 fused; it
                # lost on rows split over programs: fits/topk.md#tournament-pieces).
                out.append({"apart": True, "select_warps": 2})
            if default.shared:
                # Few rows split over programs: 2048-element tiles (H200, 64 x 128000 float32,
                # k = 50: 28.2 us against the default's 32.3; on 4096 rows of 32000 they lost,
                # 214 against 172). See benchmarks/results/h200/fits/topk.md#tournament-configs.
                out.append({"tile_max": 2048})
        # The first is the default (supports() asks it); others only where their plan holds.
        return out[:1] + [c for c in out[1:] if self.plan(call, c).reason is None]

    estimate = staticmethod(cost.tournament)

    def make_plan(self, call: TopkCall, config: dict, sms: int) -> TournamentPlan:
        return tournament_plan(call.R, call.N, call.k, call.input.dtype, call.sorted, sms,
                               config, row_stride=_row_stride(call), largest=call.largest)

    def _prepared(self, p, call: TopkCall):
        """The prepared call (see Backend.bind) under the plan p: a function of the input,
        everything else worked out here once."""
        self._refuse(p)
        grid = (call.R, p.programs_per_row)
        if p.apart:
            passes = _TOURNAMENT_PASS.bind(p, grid, call.info.index)
            selects = _TOURNAMENT_SELECT.bind(p, grid, call.info.index)

            def launch(*args):
                passes(*args)
                selects(*args)
        else:
            launch = _TOURNAMENT.bind(p, grid, call.info.index)
        ints = (call.N, p.row_stride, call.k, p.chunk, p.programs_per_row, p.flip)
        return ticketed_call(call, launch, p.workspace_offsets, p.workspace_elements, ints)
