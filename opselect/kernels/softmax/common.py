"""What several softmax backends share: accumulation and casts (jit helpers), the rows kernel
that fused and multirow both launch, and the host arithmetic of warps, residency and grids."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .._jit import ROUND_BF16_BY_HAND, bf16_nearest_even
from .._common import Launcher, allocator, cdiv, check_config, needs_int64, next_pow2, plan_launcher  # noqa: F401 (the backends import the last two from here)
from ...heuristics.softmax import single_warps, strided_plan, vector_shift  # noqa: F401
from .call import SoftmaxCall


# Widest row the multirow backend packs into tiles.
MULTIROW_MAX = 256


# Most elements a program of the strided / backward kernels holds in registers at once.
TILE_MAX = 16384


# Programs take several tiles only when there are at least WAVES times more tiles than programs
# that can run at once: the GPU schedules programs as slots free up, so the time lost at the end
# (at most one program's duration) stays a small fraction even if the occupancy guess is off.
WAVES = 16


# ---------------------------------------------------------------------------------------------
# Kernels: helpers
# ---------------------------------------------------------------------------------------------
@triton.jit
def _acc(v, f64: tl.constexpr):
    """The accumulation type: float64 for float64 outputs, else float32 (as torch's accscalar_t)."""
    if f64:
        r = v.to(tl.float64)
    else:
        r = v.to(tl.float32)
    return r


@triton.jit
def _online_step(m, s, x):
    """Fold x into the per-lane running max m and sum s (of exp(. - m)), with one exp per element:
    exactly one of exp(m_old - m_new) and exp(x - m_new) differs from 1, and both are
    exp(-|x - m|)."""
    m_new = tl.maximum(m, x)
    bigger = x > m
    e = tl.exp(tl.where(bigger, m - x, x - m))
    # x = -inf adds exactly nothing (and -inf - -inf would be NaN). A lane still at m = -inf has
    # s = 0, and s * exp(-inf) + 1 = 1. NaN must still reach the sum: the max ignores NaN (maxnum
    # on the GPU), but x - m is NaN. +inf makes the lane's max +inf, and the merge's
    # exp(inf - inf) makes the sum NaN. So a row with NaN or +inf comes out NaN, as in torch.
    s = tl.where(x == float("-inf"), s, tl.where(bigger, s * e + 1.0, s + e))
    return m_new, s


@triton.jit
def _row_stats(x_row, N, block: tl.constexpr, f64: tl.constexpr):
    """A row's (max, sum of exp(x - max)), each of shape [1], read from the row itself in blocks:
    what a program that stopped waiting for the row's other chunks falls back on."""
    cols = tl.arange(0, block)
    m = _acc(tl.full([block], float("-inf"), tl.float32), f64)
    s = _acc(tl.zeros([block], tl.float32), f64)
    for start in range(0, N, block):
        o = start + cols
        m, s = _online_step(m, s, _acc(tl.load(x_row + o, mask=o < N, other=float("-inf")), f64))
    return _merge(m, s, 0)


@triton.jit
def _merge(m, s, AXIS: tl.constexpr):
    """Combine per-lane (max, sum) pairs along AXIS into the row's (max, sum), dims kept."""
    big = tl.max(m, axis=AXIS, keep_dims=True)
    # Lanes with s == 0 saw only -inf (their m - big may be NaN); NaN sums stay NaN.
    part = tl.where(s == 0.0, 0.0, s * tl.exp(m - big))
    return big, tl.sum(part, axis=AXIS, keep_dims=True)


@triton.jit
def _grad(y, g, t, log: tl.constexpr):
    """dx of softmax (log: log_softmax) from its output y, the upstream gradient g and the row's
    sum t (of g * y; log_softmax's, of g)."""
    if log:
        dx = g - tl.exp(y) * t
    else:
        dx = y * (g - t)
    return dx


@triton.jit
def _cast_for(v, ptr):
    """v in the dtype `ptr` points to. float64 reaches bfloat16 through float32, as torch
    converts (c10's BFloat16 is built from a float), and as Triton's interpreter needs (its
    direct float64 -> bfloat16 conversion gives garbage: softmax(bf16 x, dtype=float64)'s
    gradient was off by 0.25)."""
    if v.dtype == tl.float64:
        if ptr.dtype.element_ty == tl.bfloat16:
            v = v.to(tl.float32)
    if ROUND_BF16_BY_HAND:
        # (log_softmax of OpInfo's bfloat16 samples came out one unit in the last place from
        # torch's under the interpreter's truncating conversion: kernels/_jit.py)
        if ptr.dtype.element_ty == tl.bfloat16:
            if v.dtype == tl.float32:
                return bf16_nearest_even(v)
    return v.to(ptr.dtype.element_ty)


@triton.jit
def _finish(x, big, total, log: tl.constexpr):
    """softmax = exp(x - max) / sum, log_softmax = (x - max) - log(sum). A row of -inf has
    max = -inf, so x - max is NaN there, as in torch."""
    z = x - big
    if log:
        out = z - tl.log(total)
    else:
        out = tl.exp(z) * (1.0 / total)
    return out


@triton.jit
def _row_and_part(index, split, offsets_64bit: tl.constexpr):
    """The row and the part of it that program `index` takes when rows are split in `split`."""
    row = index // split
    part = index % split
    if offsets_64bit:
        row = row.to(tl.int64)
        part = part.to(tl.int64)
    return row, part


# ---------------------------------------------------------------------------------------------
# Kernels: forward
# ---------------------------------------------------------------------------------------------
@triton.jit
def _vector_window(start, N, vector: tl.constexpr):
    """A row of N elements at `start` (of x and y alike), cut where 16-byte vectors (of `vector`
    elements) cut it: its first whole vector `lo`, the end of the vector holding its last element
    `hi` (loads up to there touch only vectors that hold some of the row, so never a page past the
    tensor), and the end `cut` of its last whole vector (vector stores stop there). Known to the
    compiler as multiples of vector."""
    end = start + N
    lo = (start + (vector - 1)) // vector * vector
    hi = (end + (vector - 1)) // vector * vector
    cut = end // vector * vector
    return lo, end, hi, cut


@triton.jit
def _shifted_rows(x_ptr, y_ptr, start, live, N, cols, log: tl.constexpr, f64: tl.constexpr,
                  vector: tl.constexpr):
    """softmax of whole rows starting off the 16-byte grid (start: the rows' first elements,
    live: which rows exist), with 16-byte vectors: the row from its first whole vector on is
    one window of row_block columns, loaded a vector at a time (elements past the row masked
    afterwards) and stored a vector at a time up to its last whole vector; the fewer than
    `vector` elements before the first (the head) and after the last (the tail) go through short
    element-wise accesses. The row needs N >= 2 vector (head, window and tail do not overlap)."""
    lo, end, hi, cut = _vector_window(start, N, vector)
    o = lo[:, None] + cols[None, :]
    live = live[:, None]
    x = _acc(tl.load(x_ptr + o, mask=live & (o < hi[:, None]), other=float("-inf")), f64)
    x = tl.where(o < end[:, None], x, float("-inf"))
    j = tl.arange(0, vector)[None, :]
    head = start[:, None] + j
    in_head = live & (head < lo[:, None])
    h = _acc(tl.load(x_ptr + head, mask=in_head, other=float("-inf")), f64)
    big = tl.maximum(tl.max(x, axis=1, keep_dims=True), tl.max(h, axis=1, keep_dims=True))
    z = x - big
    e = tl.exp(z)
    total = tl.sum(e, axis=1, keep_dims=True) + tl.sum(tl.exp(h - big), axis=1, keep_dims=True)
    if log:
        out = z - tl.log(total)
    else:
        out = e * (1.0 / total)
    tl.store(y_ptr + o, _cast_for(out, y_ptr), mask=live & (o < cut[:, None]))
    tl.store(y_ptr + head, _cast_for(_finish(h, big, total, log), y_ptr), mask=in_head)
    # The tail is in the window's registers, but past its last vector store: read again (from
    # L1/L2) and written element-wise.
    tail = cut[:, None] + j
    in_tail = live & (tail < end[:, None])
    t = _acc(tl.load(x_ptr + tail, mask=in_tail, other=0.0), f64)
    tl.store(y_ptr + tail, _cast_for(_finish(t, big, total, log), y_ptr), mask=in_tail)


@triton.jit
def _rows_fwd_kernel(x_ptr, y_ptr, R, n_q, sx_q, sy_q, tiles_per_program,
                     align: tl.constexpr, log: tl.constexpr, f64: tl.constexpr,
                     rows_per_tile: tl.constexpr, row_block: tl.constexpr, even_row: tl.constexpr,
                     pipeline_stages: tl.constexpr, offsets_64bit: tl.constexpr,
                     vector: tl.constexpr):
    """fused (rows_per_tile = 1) and multirow: whole rows in registers, one read and one write.

    N and the row strides arrive divided by align, their common power-of-two factor (<= 16), and are
    multiplied back here: the compiler then knows every row starts align-aligned and that the column
    mask is constant over align-wide groups, so it emits 16-byte vector accesses even when N is not
    a multiple of 16 (Triton only assumes divisibility by 16 of integer arguments).

    vector > 0 (multirow's tiles): packed rows whose starts are off the 16-byte grid (x and y
    share the row stride), read and written through 16-byte vectors all the same
    (_shifted_rows)."""
    N = n_q * align
    pid = tl.program_id(0)
    cols = tl.arange(0, row_block)
    # The loop over this program's tiles is software-pipelined: the next tile's load is issued
    # before the current tile's reductions.
    for i in tl.range(0, tiles_per_program, num_stages=pipeline_stages):
        tile = pid * tiles_per_program + i
        if offsets_64bit:
            tile = tile.to(tl.int64)
        rows = tile * rows_per_tile + tl.arange(0, rows_per_tile)
        if vector > 0:
            _shifted_rows(x_ptr, y_ptr, rows * sx_q * align, rows < R, N, cols, log, f64, vector)
        else:
            mask = rows[:, None] < R
            if not even_row:
                mask = mask & (cols[None, :] < N)
            x = tl.load(x_ptr + (rows * sx_q * align)[:, None] + cols[None, :], mask=mask,
                        other=float("-inf"))
            x = _acc(x, f64)
            big = tl.max(x, axis=1, keep_dims=True)
            z = x - big
            e = tl.exp(z)
            total = tl.sum(e, axis=1, keep_dims=True)
            if log:
                out = z - tl.log(total)
            else:
                out = e * (1.0 / total)
            tl.store(y_ptr + (rows * sy_q * align)[:, None] + cols[None, :],
                     _cast_for(out, y_ptr), mask=mask)


# ---------------------------------------------------------------------------------------------
# Launch helpers
# ---------------------------------------------------------------------------------------------
# Bound launches (kernels/_common.py): Triton binds a kernel's arguments once per plan, later
# calls go straight to the compiled kernel. A plan (the spec) holds the input and output dtypes
# (the scratch tensors' follow from f64), every integer argument, the constexprs and the warps;
# a launcher reads each constexpr from the plan field of the parameter's name (plan_launcher).
# LAUNCHERS names them by kernel, for tests that watch the launches.


@dataclass(frozen=True, eq=False)
class RowsPlan:
    """One launch of the rows kernel (fused: a row per tile; multirow: many rows per tile): the
    Launcher's spec and constexpr source. Built by rows_plan, one object per distinct launch."""

    in_dtype: torch.dtype  # of the tensor read (the input, or its torch cast)
    out_dtype: torch.dtype  # of the output
    ints: tuple  # every integer argument: rows, N / align, the two row strides / align, tiles per program
    align: int  # the power of two (<= 16) dividing N and the strides: 16-byte vectors
    log: bool  # log_softmax
    f64: bool  # accumulate in float64
    rows_per_tile: int
    row_block: int  # the row padded to a power of two
    pipeline_stages: int  # software pipelining of a program's tiles
    offsets_64bit: bool  # offsets past 2**31 elements
    num_warps: int
    vector: int = 0  # elements per 16-byte vector of rows off the grid (heuristics' vector_shift)

    @property
    def even_row(self) -> bool:
        """The row is its padded block (no column mask)."""
        return self.row_block == self.ints[1] * self.align

    @property
    def grid(self) -> tuple[int]:
        """A program per tiles_per_program tiles (the last integer argument) of rows_per_tile
        rows (the first)."""
        return (cdiv(cdiv(self.ints[0], self.rows_per_tile), self.ints[4]),)


@functools.lru_cache(maxsize=4096)
def rows_plan(in_dtype, out_dtype, ints, align, log, f64, rows_per_tile, row_block,
              pipeline_stages, offsets_64bit, num_warps, vector=0) -> RowsPlan:
    return RowsPlan(in_dtype, out_dtype, ints, align, log, f64, rows_per_tile, row_block,
                    pipeline_stages, offsets_64bit, num_warps, vector)


_ROWS_FWD = plan_launcher(_rows_fwd_kernel)


@dataclass(frozen=True, eq=False)
class StridedPlan:
    """One launch of a strided kernel (softmax over a non-last dim, forward or backward: a tile of
    [dim x inner_block inner columns] per program): the Launcher's spec and constexpr source."""

    in_dtype: torch.dtype  # of the tensor read (forward: x; backward: y)
    out_dtype: torch.dtype  # of the tensor written (forward: y; backward: dx)
    grad_dtype: torch.dtype | None  # backward: of the upstream gradient (None: forward)
    ints: tuple  # every integer argument: the dim, inner / align, inner blocks, strides / align
    align: int  # the power of two (<= 16) dividing inner and the strides
    log: bool  # log_softmax
    f64: bool  # accumulate in float64
    dim_block: int  # the dim padded to a power of two, or a chunk of it
    inner_block: int  # inner columns per program
    single: bool  # the whole dim in registers (one read) or two passes
    offsets_64bit: bool  # offsets past 2**31 elements
    num_warps: int
    columns: bool = False  # forward: the call's rows are x's columns, written as rows


strided_launch_plan = functools.lru_cache(maxsize=4096)(StridedPlan)



def _align(*values: int) -> int:
    """The largest power of two (<= 16) dividing every value."""
    a = 16
    for v in values:
        while a > 1 and v % a:
            a //= 2
    return a


def _warps(elements: int) -> int:
    """About 16 elements per thread (loads in flight without spilling registers): one warp for
    512 elements, 16 from 8192 up."""
    return max(1, min(16, next_pow2(elements) // 512))


def programs_per_sm(warps: int, registers: int) -> int:
    """Programs of `warps` warps and `registers` a thread that an SM holds at once: limited by
    its warps (64) and registers (64K); at least 1, counted up to 16."""
    return max(1, min(64 // warps, 65536 // (registers * 32 * warps), 16))


def _resident(sm_count: int, warps: int, elements: int, f64: bool) -> int:
    """A guess at how many programs run at once (programs_per_sm). Registers per thread ~ 24 +
    1.25 per 32-bit value held (fitted to ptxas's counts for these kernels on sm_90)."""
    per_thread = elements / (warps * 32) * (2 if f64 else 1)
    regs = min(255, 8 * math.ceil((24 + 1.25 * per_thread) / 8))
    return sm_count * programs_per_sm(warps, regs)


def _tiles_per_program(tiles: int, resident: int) -> int:
    return max(1, min(64, tiles // max(1, WAVES * resident)))


def _reader(call: SoftmaxCall):
    """(read, outer stride, dim stride): read(x) is the tensor the kernels read for input x
    (None: x itself, whose layout they take in place), with those strides (inner stride 1): a
    contiguous copy where the layout needs one, the torch cast first where it rounds."""
    if call.cast_first:
        dtype = call.out_dtype
        return (lambda x: x.to(dtype, memory_format=torch.contiguous_format),
                call.n * call.inner, call.inner)
    if call.fast:
        return None, call.so, call.sn
    return torch.Tensor.contiguous, call.n * call.inner, call.inner


def _read_dtype(call: SoftmaxCall) -> torch.dtype:
    return call.out_dtype if call.cast_first else call.x.dtype


def _new(shape, dtype: torch.dtype, device) -> torch.Tensor:
    """A tensor the kernels write, outside a prepared call (which makes its allocator once);
    both start as _common.POISON where tests set it."""
    return allocator(shape, dtype, device)()


def rows_fwd_plan(call: SoftmaxCall, block_r: int, warps: int, stages: int, sms: int
                  ) -> RowsPlan:
    """The launch of fused (block_r = 1) and multirow for a call: tiles of block_r rows (fewer
    where the rows are few or long), several per program where the tiles are many."""
    _, sx, _ = _reader(call)
    n, rows = call.n, call.outer
    bn = next_pow2(n)
    block_r = max(1, min(block_r, TILE_MAX // bn, next_pow2(rows)))
    tiles = cdiv(rows, block_r)
    resident = _resident(sms, warps, block_r * bn, call.f64)
    per = _tiles_per_program(tiles, resident)
    a = _align(n, sx)
    ints = (rows, n // a, sx // a, n // a, per)
    stages = stages if per > 1 else 1
    i64 = needs_int64(call.numel + block_r * bn, rows * sx + n)
    # Shifted vectors for tiles of rows only: one row a program (fused) ran as fast element by
    # element on the H200 (1001 fp16, 1395 fp32) or faster (16384 x 4099 bf16: 166 us against
    # 243 shifted; fits/softmax.md, "Rows off the 16-byte grid").
    vector = vector_shift(call) if block_r > 1 else 0
    return rows_plan(_read_dtype(call), call.out_dtype, ints, a, call.log, call.f64, block_r, bn,
                     stages, i64, warps, vector)


def _rows_fwd(plan: RowsPlan, call: SoftmaxCall):
    """The prepared forward of fused and multirow under its plan: a function x -> y of the
    call's input, everything else worked out here once."""
    launch = _ROWS_FWD.bind(plan, plan.grid, call.info.index)
    return _one_launch(_reader(call)[0], launch, plan.ints, tuple(call.x.shape), call.out_dtype,
                       call.x.device)


def _one_launch(read, launch, ints: tuple, shape: tuple, out_dtype: torch.dtype, device):
    """The prepared forward of a one-kernel path: x -> y, the kernel reading read(x) (or x)
    and writing a new y."""
    new = allocator(shape, out_dtype, device)

    def forward(x: torch.Tensor) -> torch.Tensor:
        if read is not None:
            x = read(x)
        y = new()
        launch(x, y, *ints)
        return y

    return forward


#: The strided plans' rule (inner_block, dim_block, single): the cost model's own.
_strided_plan = strided_plan


def _rows_reason(call: SoftmaxCall) -> str | None:
    if call.inner != 1:
        return (f"the softmax dim is not the innermost ({call.inner} elements follow it); "
                "strided takes that layout")
    return None
