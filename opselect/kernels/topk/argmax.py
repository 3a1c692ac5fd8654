"""topk's argmax backend: k = 1 in one read of the rows (greedy decoding's pick, argmax and argmin
with torch.topk's values and semantics)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ...heuristics import topk as cost
from .._common import cdiv, next_pow2
from .call import TopkCall
from .common import (MAX_ROW, _PlannedBackend, _key_limits, _order_key, _row_stride,
                     check_config, plan_launcher, ticketed_call)
from .maxima import _vector_origin


# A row is split over at most this many programs (their partial answers are merged by the row's
# last program in one register tile).
PARTS_MAX = 1024

# The largest int32: a position no real one reaches (min() over positions ignores it).
_NO_POSITION: tl.constexpr = tl.constexpr(2147483647)
_INF: tl.constexpr = tl.constexpr(float("inf"))


# ---------------------------------------------------------------------------------------------
# Kernel
# ---------------------------------------------------------------------------------------------
@triton.jit
def _nan_like(x):
    """A quiet NaN in x's shape and float dtype (built from its bits: inf - inf warns on the
    interpreter)."""
    if x.dtype == tl.float64:
        bits = tl.full(x.shape, 0x7FF8000000000000, tl.int64)
    elif x.dtype == tl.float32:
        bits = tl.full(x.shape, 0x7FC00000, tl.int32)
    elif x.dtype == tl.bfloat16:
        bits = tl.full(x.shape, 0x7FC0, tl.int16)
    else:
        bits = tl.full(x.shape, 0x7E00, tl.int16)
    return bits.to(x.dtype, bitcast=True)


@triton.jit(do_not_specialize=["R", "flip"])
def _argmax_kernel(x_ptr, ws_ptr, off_key, off_pos, val_ptr, idx_ptr, R, N, row_stride, chunk,
                   flip, programs_per_row: tl.constexpr, block_rows: tl.constexpr,
                   tile: tl.constexpr, parts_padded: tl.constexpr, vector: tl.constexpr,
                   is_float: tl.constexpr, key64: tl.constexpr, largest: tl.constexpr,
                   int_worst: tl.constexpr, upcast: tl.constexpr, evict: tl.constexpr):
    """Program (b, p) streams columns [p * chunk, (p + 1) * chunk) of rows [b * block_rows,
    (b + 1) * block_rows) once, each lane keeping the best value it has seen and where (the
    first place: a strict compare), the next tile's load in flight while one is compared. The
    lanes then agree on the best order key (_order_key: NaN above +inf, one key for +-0.0) and
    its first place. A row of one program writes its value (read back from the input, torch's
    own bits) and index; a row of several writes its part to the workspace and the last to
    finish (a ticket) merges the parts.

    Lanes compare values, not keys (a key costs about ten instructions an element, which made
    16-bit rows compute-bound): `worst` is a value no element beats (-inf or the smallest
    integer for the largest; for the smallest, NaN, which every number beats, and the largest
    integer). A lane that never takes an element points at the chunk's first one: where every
    lane is untaken, every element equals the worst, so that one is an answer.

    vector > 0 (one row a program): rows off the 16-byte grid are read from the vector their
    first element is in (_vector_origin) with whole-vector masks; the neighbours' elements in
    the first and last vector are set to the worst value."""
    b = tl.program_id(0)
    p = tl.program_id(1)
    lowest, highest = _key_limits(key64)
    r0 = b.to(tl.int64) * block_rows
    rows = r0 + tl.arange(0, block_rows)
    row_ok = rows < R
    start = p.to(tl.int64) * chunk
    lane = tl.arange(0, tile)
    if vector > 0:
        origin, lead = _vector_origin(r0 * row_stride, vector)
        base = x_ptr + origin + start + lane[None, :]
    else:
        lead = 0
        base = x_ptr + (rows * row_stride)[:, None] + start + lane[None, :]
    # Columns of this chunk, counted from its first loaded element: valid ones in [first, n_here)
    n_here = tl.minimum(N + lead - start, chunk).to(tl.int32)
    first = tl.maximum(lead - start, 0).to(tl.int32)
    if vector > 0:
        n_load = (n_here + (vector - 1)) // vector * vector
    else:
        n_load = n_here
    ntiles = tl.cdiv(n_here, tile)
    shape: tl.constexpr = [block_rows, tile]
    kind = tl.float32 if upcast else x_ptr.dtype.element_ty
    if is_float:
        if largest:
            worst = tl.full(shape, -_INF, kind)
        else:
            worst = _nan_like(tl.zeros(shape, kind))
    else:
        worst = tl.full(shape, int_worst, kind)
    best = worst
    best_t = tl.full(shape, -1, tl.int32)  # the tile of each lane's best, -1 where none
    x = tl.load(base, mask=row_ok[:, None] & (lane < n_load)[None, :], other=worst,
                eviction_policy=evict).to(kind)
    for t in range(ntiles):
        ahead = tl.where(t + 1 < ntiles, n_load - t * tile - tile, 0)
        x_next = tl.load(base + (t + 1) * tile, mask=row_ok[:, None] & (lane < ahead)[None, :],
                         other=worst, eviction_policy=evict).to(kind)
        if vector > 0:
            # Only the first and last tiles hold neighbours' elements
            if (t == 0) | (t == ntiles - 1):
                at = t * tile + lane[None, :]
                x = tl.where((at >= first) & (at < n_here), x, worst)
        if is_float:
            if largest:  # a number above the best, or the first NaN
                better = ~(x <= best) & (best == best)
            else:  # a number below the best (a NaN best: none yet)
                better = ~(x >= best) & (x == x)
        elif largest:
            better = x > best
        else:
            better = x < best
        best = tl.where(better, x, best)
        best_t = tl.where(better, t, best_t)
        x = x_next
    best_at = tl.where(best_t < 0, first, best_t * tile + lane[None, :])
    best = _order_key(best, is_float, flip, key64)
    top = tl.max(best, axis=1)
    top_at = tl.min(tl.where(best == top[:, None], best_at, _NO_POSITION), axis=1)
    row_pos = start + top_at - lead  # the answer's place in its row
    if programs_per_row == 1:
        v = tl.load(x_ptr + rows * row_stride + row_pos, mask=row_ok)
        tl.store(val_ptr + rows, v, mask=row_ok)
        tl.store(idx_ptr + rows, row_pos, mask=row_ok)
    else:
        # (the plan gives shared rows one row a program)
        slot = r0 * programs_per_row + p + tl.arange(0, block_rows)
        tl.store(ws_ptr + off_key + slot, top.to(tl.int64))
        tl.store(ws_ptr + off_pos + slot, row_pos)
        tl.debug_barrier()  # every thread's stores are made before the ticket releases them
        tickets = ws_ptr.to(tl.pointer_type(tl.int32))
        ticket = tl.atomic_add(tickets + r0, 1, sem="acq_rel")
        if ticket == programs_per_row - 1:
            # The row's last program: the largest part, at its first place. Parts past the row's
            # end (a chunk with no element of it) hold the lowest key at a place past every real
            # one.
            q = tl.arange(0, parts_padded)
            ok = q < programs_per_row
            first_slot = r0 * programs_per_row
            part = tl.load(ws_ptr + off_key + first_slot + q, mask=ok, other=lowest,
                           cache_modifier=".cg")
            part_pos = tl.load(ws_ptr + off_pos + first_slot + q, mask=ok, other=N,
                               cache_modifier=".cg")
            row_top = tl.max(part, axis=0)
            pos = tl.min(tl.where(ok & (part == row_top), part_pos, N), axis=0)
            tl.store(val_ptr + r0, tl.load(x_ptr + r0 * row_stride + pos))
            tl.store(idx_ptr + r0, pos)
            # Every program of the row has taken its ticket: back to zero for the next launch
            # (the workspace is the stream's, kept between calls).
            tl.atomic_xchg(tickets + r0, 0, sem="relaxed")


@dataclass(frozen=True, eq=False)
class ArgmaxPlan:
    """Launch parameters of the argmax backend (see _argmax_kernel)."""

    block_rows: int = 1  # rows a program reads (short rows); 1 where rows are long
    programs_per_row: int = 1  # programs sharing a row (rows fewer than the chip's SMs)
    chunk: int = 0  # columns a program reads (a multiple of tile)
    tile: int = 0  # columns a program loads at once
    parts_padded: int = 1  # programs_per_row rounded up to a power of two
    vector: int = 0  # elements of a 16-byte vector for rows off the 16-byte grid, else 0
    is_float: bool = False  # floating-point keys (their bits reordered to compare as integers)
    key64: bool = False  # 64-bit keys (int64, float64)
    largest: bool = True  # the largest (else the smallest)
    int_worst: int = 0  # integers: a value no element beats (the smallest or the largest)
    upcast: bool = False  # values compared as float32 (see argmax_plan)
    evict: str = ""  # the loads' eviction policy: the rows are read once
    num_warps: int = 4
    row_stride: int = 0  # elements between rows
    flip: int = 0  # 0, or -1 for the smallest (complements every key: see _order_key)
    workspace_offsets: tuple = (0, 0)  # int64 elements: tickets (int32), part keys, part places
    workspace_elements: int = 0


_ARGMAX = plan_launcher(_argmax_kernel)

#: The config keys of argmax's plan (any other is refused: see check_config).
CONFIG_KEYS = frozenset({"tile_bytes", "num_warps", "programs_per_sm", "chunk_min"})


def row_vector(dtype: torch.dtype, N: int, row_stride: int, R: int) -> int:
    """Elements per 16-byte vector where the compiler cannot see that a row starts and ends on
    the 16-byte grid (see maxima.row_vector: Triton only tells it that an integer argument
    divides by 16), else 0."""
    if (R <= 1 or row_stride % 16 == 0) and N % 16 == 0:
        return 0
    return 16 // dtype.itemsize


def _int_worst(dtype: torch.dtype, largest: bool) -> int:
    if dtype.is_floating_point:
        return 0
    info = torch.iinfo(dtype)
    return int(info.min if largest else info.max)


def argmax_plan(R: int, N: int, dtype: torch.dtype, sms: int, config: dict, row_stride: int,
                largest: bool, interpreted: bool = False) -> ArgmaxPlan:
    check_config("topk argmax", config, CONFIG_KEYS)
    R, N = max(R, 1), max(N, 1)  # empty calls never launch; their plan only has to exist
    s = dtype.itemsize
    num_warps = config.get("num_warps", 4)
    # Keys are 32 bits at least, whatever the element: 32 elements a thread keep a program
    # near 125 registers (more spilled on 1-byte rows under sm_90's compiler).
    tile = max(16, min(next_pow2(config.get("tile_bytes", 4096) // s), 1024 * num_warps))
    block_rows = 1
    if N <= tile // 2:
        # Short rows: several a program, each padded to a power of two; half a long row's tile
        # (2-d tiles of rows off the 16-byte grid load element by element, more registers)
        width = max(1, next_pow2(N))
        block_rows = max(1, min(next_pow2(R), tile // 2 // width))
        tile = width
    vector = row_vector(dtype, N, row_stride, R) if block_rows == 1 else 0
    reach = N + max(vector - 1, 0)  # a row's columns from its first element's vector on
    programs_per_row = 1
    per_sm = config.get("programs_per_sm", 4)
    if block_rows == 1 and R < 2 * sms:
        # Few rows: split each over several programs so that the whole chip reads
        programs_per_row = max(1, min(cdiv(sms * per_sm, R), PARTS_MAX,
                                      cdiv(reach, config.get("chunk_min", 4 * tile))))
    chunk = cdiv(cdiv(reach, programs_per_row), tile) * tile
    programs_per_row = cdiv(reach, chunk)
    tile = min(tile, chunk) if block_rows == 1 else tile
    off_key = cdiv(R, 2)
    off_pos = off_key + (R * programs_per_row if programs_per_row > 1 else 0)
    return ArgmaxPlan(
        block_rows=block_rows, programs_per_row=programs_per_row, chunk=chunk, tile=tile,
        parts_padded=next_pow2(programs_per_row), vector=vector,
        is_float=dtype.is_floating_point, key64=s == 8, largest=largest,
        int_worst=_int_worst(dtype, largest),
        # bfloat16 compared as float32: as fast on the H200 (fits/topk.md#argmax), and the
        # interpreter, which holds bfloat16 as the integers of their bits, compares it right.
        upcast=dtype == torch.bfloat16,
        evict="" if interpreted else "evict_first", num_warps=num_warps,
        row_stride=row_stride, flip=0 if largest else -1,
        workspace_offsets=(off_key, off_pos),
        workspace_elements=off_pos + (R * programs_per_row if programs_per_row > 1 else 0))


class ArgmaxBackend(_PlannedBackend):
    """k = 1: every lane keeps the best key it has seen and where, over one read of the rows (no
    group maxima written, no second pass); rows fewer than the SMs are split over programs whose
    parts the row's last program merges."""

    name = "argmax"
    estimate = staticmethod(cost.argmax)

    def supports(self, call: TopkCall) -> str | None:
        if call.k != 1 and not (call.k == 0 or call.R == 0 or call.nd == 0):
            return f"k={call.k}; argmax selects one value a row (k = 1)"
        if call.N > MAX_ROW:
            return f"rows of {call.N} elements; places are 32-bit (rows up to {MAX_ROW})"
        return None

    def configs(self, call: TopkCall) -> list[dict]:
        if call.info.interpreted:
            # Tiles of a few elements: CPU tests take shared rows, several tiles a program and
            # several rows a program on rows of a few hundred.
            return [{"tile_bytes": 256, "programs_per_sm": 2, "chunk_min": 64},
                    {"tile_bytes": 64, "programs_per_sm": 1, "chunk_min": 1 << 30,
                     "num_warps": 1}]
        # Tiles of 4 KB first: a few percent ahead of 8 KB on most vocabulary rows on the H200
        # (fits/topk.md#argmax).
        return [{}, {"tile_bytes": 8192}, {"tile_bytes": 16384, "num_warps": 8},
                {"programs_per_sm": 8}]

    def make_plan(self, call: TopkCall, config: dict, sms: int) -> ArgmaxPlan:
        return argmax_plan(call.R, call.N, call.input.dtype, sms, config, _row_stride(call),
                           call.largest, call.info.interpreted)

    def _prepared(self, p, call: TopkCall):
        """The prepared call (see Backend.bind) under the plan p: a function of the input,
        everything else worked out here once."""
        launch = _ARGMAX.bind(p, (cdiv(call.R, p.block_rows), p.programs_per_row),
                              call.info.index)
        ints = (call.R, call.N, p.row_stride, p.chunk, p.flip)
        return ticketed_call(call, launch, p.workspace_offsets, p.workspace_elements, ints)
