"""topk's tournament backend: per-block maxima narrow the candidates to a few blocks, then a
selection over them (small k)."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import torch
import triton
import triton.language as tl

from ...heuristics import topk as cost
from .._common import Launcher, allocator, cdiv, next_pow2
from .call import TopkCall, _output_maker, _output_finisher, _reader
from .common import (MAX_ROW, _PlannedBackend, _cut, _key_limits, _order_key, _select, _take_k,
                     _write_out)


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
    if n_hot > HOT:
        # Many maxima tie at T (a few distinct values in the row); T is then the kc-th largest
        # maximum, so fewer than kc groups lie above it. Those, plus enough of the tied groups
        # to make kc, hold the chunk's kc largest: every element above T, and at least one
        # element equal to T per tied group (which of the equal values is taken is free, as in
        # torch). Before, the chunk went to the whole-chunk selection, 6-12x slower.
        above = okm & (mx > T)
        tied = okm & (mx == T)
        room = HOT - tl.sum(above.to(tl.int32), axis=0)
        hot = above | (tied & (tl.cumsum(tied.to(tl.int32), axis=0) <= room))
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


# The spec is (plan, row stride, flip): the plan fixes every other integer argument and every
# constexpr, and is made per dtype and order flag.
_TOURNAMENT = Launcher(_tournament_kernel, lambda spec: dict(
    SHARED=spec[0].programs_per_row > 1, G=spec[0].group, TILE=spec[0].tile,
    MAXP=spec[0].group_maxima_slots, HOT=spec[0].hot_groups, FT=spec[0].finish_tile,
    SORT=spec[0].sort, KP=spec[0].k_padded, IS_FLOAT=spec[0].is_float,
    num_warps=spec[0].warps))


# ---------------------------------------------------------------------------------------------
# tournament
# ---------------------------------------------------------------------------------------------
# k up to this: the hot groups (2k of them, each G elements) and the NB * k candidates of a
# shared row are register tiles.
TOURNAMENT_K_MAX = 256


# The last program of a shared row selects from at most this many candidates (one tile).
TOURNAMENT_FINISH_MAX = 8192


@dataclass(frozen=True, eq=False)
class TournamentPlan:
    """Launch parameters of the tournament backend: NB programs per row, each taking a chunk
    of CPP elements (whole TILEs) whose group maxima (groups of G) fit MAXP slots; HOT hot
    groups at most; the last program of a shared row selects from FT candidates."""

    programs_per_row: int = 0  # programs per row
    chunk: int = 0  # elements each program takes (whole tiles)
    group: int = 0  # elements per group whose maximum the tournament keeps
    tile: int = 0  # elements a program loads at once
    group_maxima_slots: int = 0  # group maxima a program holds (a power of two)
    hot_groups: int = 0  # groups at most that can hold a winner, gathered for the selection
    finish_tile: int = 0  # candidates the last program of a shared row selects from
    k_padded: int = 0  # k rounded up to a compiled sorting-network size
    warps: int = 0  # warps per program
    workspace_offsets: tuple = ()  # int64 offsets of the workspace's parts
    workspace_elements: int = 0  # int64 elements of the workspace
    sort: bool = False  # the winners are written in order
    is_float: bool = False  # floating-point keys (their bits are reordered to compare as integers)
    reason: str | None = None  # why the plan cannot take the call (None: it can)


def tournament_plan(R: int, N: int, k: int, dtype: torch.dtype, sorted_: bool, sms: int,
                    config: dict) -> TournamentPlan:
    p = SimpleNamespace()  # filled below, frozen at the end
    p.reason = None
    p.sort, p.is_float = sorted_, dtype.is_floating_point
    R, N = max(R, 1), max(N, 1)  # empty calls never launch; their plan only has to exist
    tile_max = config.get("TILE", 8192)
    groups_max = config.get("MAXP", 4096)
    finish_max = config.get("FINISH", TOURNAMENT_FINISH_MAX)
    kk = max(k, 1)
    # Room for twice k hot groups (maxima may tie at the cut); candidates HOT * G <= CANDIDATES.
    p.hot_groups = max(16, next_pow2(2 * kk))
    p.group = max(2, min(64, config.get("CANDIDATES", 2048) // p.hot_groups))
    # Programs per row: several per SM in all (nothing waits, so nothing must be resident),
    # chunks of at least CHUNK_MIN elements, and each chunk's group maxima within one tile.
    if R >= 2 * sms:
        nb = 1
    else:
        nb = max(1, min(cdiv(sms * config.get("PPS", 4), R), cdiv(N, config.get("CHUNK_MIN", 16384))))
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
    # HOT groups or fewer in all, every element is a candidate).
    while p.group > 2 and chunk < 4 * kk * p.group:
        p.group //= 2
    p.tile = max(p.group, min(tile_max, next_pow2(chunk)))
    p.chunk = cdiv(chunk, p.tile) * p.tile
    p.programs_per_row = cdiv(N, p.chunk) if N else 1
    p.group_maxima_slots = max(16, next_pow2(cdiv(p.chunk, p.group)))
    p.k_padded = max(16, next_pow2(kk))
    p.finish_tile = (max(p.k_padded, next_pow2(p.programs_per_row * kk))
                     if p.programs_per_row > 1 else p.k_padded)
    if p.programs_per_row > 1 and p.programs_per_row * kk > finish_max:
        p.reason = (f"a row of {N} needs {p.programs_per_row} programs, whose "
                    f"{p.programs_per_row * kk} candidates exceed "
                    f"the finishing tile ({finish_max})")
    # Measured on an H100: 4 warps where programs are many (several share an SM, one's
    # searches overlap another's loads), 8 where about one program runs per SM.
    p.warps = config.get("num_warps", 4 if R * p.programs_per_row >= 2 * sms else 8)
    # The workspace, int64 elements: per-row tickets (int32), group maxima (int32), hot group
    # ids (int32), candidate lists (int64, shared rows only).
    progs = R * p.programs_per_row
    off_max = cdiv(R, 2)
    off_hot = off_max + cdiv(progs * p.group_maxima_slots, 2)
    off_cand = off_hot + cdiv(progs * p.hot_groups, 2)
    p.workspace_offsets = (off_max, off_hot, off_cand)
    p.workspace_elements = off_cand + (progs * kk if p.programs_per_row > 1 else 0)
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
            return f"rows of {call.N} elements; indices are packed in 32 bits (rows up to {MAX_ROW})"
        return self.plan(call, self.configs(call)[0]).reason

    def configs(self, call: TopkCall) -> list[dict]:
        if call.info.interpreted:
            # Small tiles, groups and chunks: CPU tests take every path on rows of a few
            # hundred elements.
            out = [{"TILE": 64, "CANDIDATES": 512, "CHUNK_MIN": 128, "MAXP": 128, "PPS": 2,
                    "FINISH": 1024},
                   {"TILE": 32, "CANDIDATES": 64, "CHUNK_MIN": 1 << 30, "MAXP": 1 << 20}]
        else:
            # Tiles of 8192 and 2048 candidates first: faster on most of an H100's suite shapes
            # (few, long rows), and on the H200's 4096 x 32000 bfloat16, k = 50 (0.226 ms
            # against 0.295 for 4096 x 4096). Where rows are many, the H200's tuning of random
            # calls chose 4096 x 4096 on 30 of 53, the others on 23: too split to move it.
            other = 12 - self.plan(call, {}).warps  # the warp count the default does not pick
            out = [{}, {"TILE": 4096, "CANDIDATES": 4096}, {"num_warps": other}]
        # The first is the default (supports() asks it); others only where their plan holds.
        return out[:1] + [c for c in out[1:] if self.plan(call, c).reason is None]

    estimate = staticmethod(cost.tournament)

    def make_plan(self, call: TopkCall, config: dict, sms: int) -> TournamentPlan:
        return tournament_plan(call.R, call.N, call.k, call.input.dtype, call.sorted, sms, config)

    def _prepared(self, call: TopkCall, config):
        """The prepared call (see Backend.bind): a function of the input, everything else
        worked out here once."""
        p = self._checked_plan(call, config)
        read, row_stride, _ = _reader(call, unit_col=True)
        device = call.input.device
        new_outputs, finish = _output_maker(call), _output_finisher(call)
        flip = 0 if call.largest else -1
        launch = _TOURNAMENT.bind((p, row_stride, flip), (call.R, p.programs_per_row),
                                  call.info.index)
        offsets, size = p.workspace_offsets, p.workspace_elements
        new_ws = allocator((size,), torch.int64, device)
        # The per-row tickets of shared rows start at zero.
        tickets = offsets[0] if p.programs_per_row > 1 else 0
        ints = (call.N, row_stride, call.k, p.chunk, p.programs_per_row, flip)

        def topk(x: torch.Tensor):
            if read is not None:
                x = read(x)
            values, indices = new_outputs()
            ws = new_ws()
            if tickets:
                ws[:tickets].zero_()
            launch(x, ws, *offsets, values, indices, *ints)
            return finish(values, indices)

        return topk
