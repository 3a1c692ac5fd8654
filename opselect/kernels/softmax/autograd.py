"""softmax's autograd: one autograd.Function whose backward runs its own kernels whichever
forward backend ran (rows in registers, rows in two passes or split over programs, strided
tiles, strided tiles split over the dim)."""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ...dispatch.device import device_info
from ...heuristics import softmax as cost
from ...heuristics.device_model import model_for
from ...dispatch.backend import PlannedBackend
from .._common import allocator, cdiv, needs_int64, next_pow2
from . import lagged
from .call import SoftmaxCall, _collapse
from .common import (MULTIROW_MAX, TILE_MAX, _acc, _align, _cast_for, _grad, _resident,
                     _row_and_part, _strided_plan, _tiles_per_program, _warps, check_config,
                     plan_launcher, single_warps, strided_launch_plan)


# Backward rows kernel: rows up to this long are held in registers (two tensors: y and dy).
BWD_SINGLE_MAX = 16384


BWD_SINGLE_MAX_F64 = 8192


# ---------------------------------------------------------------------------------------------
# Kernels: backward. y and dx are contiguous; dy (g) has its own strides.
# ---------------------------------------------------------------------------------------------
@triton.jit
def _rows_bwd_kernel(y_ptr, g_ptr, dx_ptr, R, n_q, sg_q, tiles_per_program,
                     align: tl.constexpr, log: tl.constexpr, f64: tl.constexpr,
                     rows_per_tile: tl.constexpr, row_block: tl.constexpr, even_row: tl.constexpr,
                     single: tl.constexpr, pipeline_stages: tl.constexpr,
                     offsets_64bit: tl.constexpr):
    """Rows: single holds [rows_per_tile x N] of y and dy in registers (two reads, one write);
    else one row at a time in two passes over chunks (the sum, then dx, the second pass
    backwards)."""
    N = n_q * align
    pid = tl.program_id(0)
    cols = tl.arange(0, row_block)
    for i in tl.range(0, tiles_per_program, num_stages=pipeline_stages):
        tile = pid * tiles_per_program + i
        if offsets_64bit:
            tile = tile.to(tl.int64)
        rows = tile * rows_per_tile + tl.arange(0, rows_per_tile)
        rmask = rows[:, None] < R
        y_off = (rows * n_q * align)[:, None]
        g_off = (rows * sg_q * align)[:, None]
        if single:
            mask = rmask
            if not even_row:
                mask = mask & (cols[None, :] < N)
            y = _acc(tl.load(y_ptr + y_off + cols[None, :], mask=mask, other=0.0), f64)
            g = _acc(tl.load(g_ptr + g_off + cols[None, :], mask=mask, other=0.0), f64)
            if log:
                t = tl.sum(g, axis=1, keep_dims=True)
            else:
                t = tl.sum(g * y, axis=1, keep_dims=True)
            tl.store(dx_ptr + y_off + cols[None, :],
                     _cast_for(_grad(y, g, t, log), dx_ptr), mask=mask)
        else:
            part = _acc(tl.zeros([rows_per_tile, row_block], tl.float32), f64)
            for start in range(0, N, row_block):
                c = start + cols[None, :]
                mask = rmask & (c < N)
                g = _acc(tl.load(g_ptr + g_off + c, mask=mask, other=0.0), f64)
                if log:
                    part += g
                else:
                    part += g * _acc(tl.load(y_ptr + y_off + c, mask=mask, other=0.0), f64)
            t = tl.sum(part, axis=1, keep_dims=True)
            n_chunks = tl.cdiv(N, row_block)
            for j in range(0, n_chunks):
                c = (n_chunks - 1 - j) * row_block + cols[None, :]
                mask = rmask & (c < N)
                y = _acc(tl.load(y_ptr + y_off + c, mask=mask, other=0.0), f64)
                g = _acc(tl.load(g_ptr + g_off + c, mask=mask, other=0.0), f64)
                tl.store(dx_ptr + y_off + c, _cast_for(_grad(y, g, t, log), dx_ptr),
                         mask=mask)


@triton.jit
def _split_bwd_sum_kernel(y_ptr, g_ptr, t_ptr, n_q, sg_q, chunk, split,
                          align: tl.constexpr, log: tl.constexpr, f64: tl.constexpr,
                          block: tl.constexpr, offsets_64bit: tl.constexpr):
    """Few long rows, step 1: the partial sum (of dy, or dy * y) of one chunk of one row."""
    N = n_q * align
    pid = tl.program_id(0)
    row, part = _row_and_part(pid, split, offsets_64bit)
    first = part * chunk
    cols = tl.arange(0, block)
    acc = _acc(tl.zeros([block], tl.float32), f64)
    for start in range(0, chunk, block):
        offs = first + start + cols
        mask = offs < N
        g = _acc(tl.load(g_ptr + row * sg_q * align + offs, mask=mask, other=0.0), f64)
        if log:
            acc += g
        else:
            acc += g * _acc(tl.load(y_ptr + row * n_q * align + offs, mask=mask, other=0.0), f64)
    tl.store(t_ptr + pid + tl.arange(0, 1), tl.sum(acc, axis=0, keep_dims=True))


@triton.jit
def _split_bwd_apply_kernel(y_ptr, g_ptr, dx_ptr, t_ptr, n_q, sg_q, chunk, split,
                            align: tl.constexpr, log: tl.constexpr, f64: tl.constexpr,
                            split_padded: tl.constexpr, block: tl.constexpr,
                            offsets_64bit: tl.constexpr):
    """Few long rows, step 2 (reverse order, for L2 hits): dx of one chunk."""
    N = n_q * align
    pid = tl.num_programs(0) - 1 - tl.program_id(0)
    row, part = _row_and_part(pid, split, offsets_64bit)
    k = tl.arange(0, split_padded)
    t = tl.sum(tl.load(t_ptr + row * split + k, mask=k < split, other=0.0), axis=0, keep_dims=True)
    cols = tl.arange(0, block)
    last = part * chunk + chunk - block
    for start in range(0, chunk, block):
        offs = last - start + cols
        mask = offs < N
        y = _acc(tl.load(y_ptr + row * n_q * align + offs, mask=mask, other=0.0), f64)
        g = _acc(tl.load(g_ptr + row * sg_q * align + offs, mask=mask, other=0.0), f64)
        tl.store(dx_ptr + row * n_q * align + offs, _cast_for(_grad(y, g, t, log), dx_ptr),
                 mask=mask)


@triton.jit
def _bwd_columns(y_ptr, g_ptr, dx_ptr, o, ib, N, inner, sgo_q, align,
                 inner_block: tl.constexpr):
    """A strided backward program's columns: their mask and the column bases of y, dx and dy."""
    cols = ib * inner_block + tl.arange(0, inner_block)
    y_base = y_ptr + o * N * inner + cols[None, :]
    dx_base = dx_ptr + o * N * inner + cols[None, :]
    g_base = g_ptr + o * sgo_q * align + cols[None, :]
    return cols, cols[None, :] < inner, y_base, dx_base, g_base


@triton.jit
def _bwd_tile_sum(y_base, g_base, rr, N, cmask, inner, sgn_q, align, log: tl.constexpr,
                  f64: tl.constexpr):
    """A tile's terms of the columns' sums (rows rr of the dim): dy, or dy * y for softmax."""
    mask = (rr[:, None] < N) & cmask
    g = _acc(tl.load(g_base + (rr * sgn_q * align)[:, None], mask=mask, other=0.0), f64)
    if log:
        return g
    return g * _acc(tl.load(y_base + (rr * inner)[:, None], mask=mask, other=0.0), f64)


@triton.jit
def _bwd_tile_write(y_base, g_base, dx_base, dx_ptr, rr, N, cmask, inner, sgn_q, align, t,
                    log: tl.constexpr, f64: tl.constexpr):
    """dx of a tile (rows rr of the dim) from the columns' sums t."""
    mask = (rr[:, None] < N) & cmask
    y = _acc(tl.load(y_base + (rr * inner)[:, None], mask=mask, other=0.0), f64)
    g = _acc(tl.load(g_base + (rr * sgn_q * align)[:, None], mask=mask, other=0.0), f64)
    tl.store(dx_base + (rr * inner)[:, None], _cast_for(_grad(y, g, t, log), dx_ptr), mask=mask)


@triton.jit
def _strided_bwd_kernel(y_ptr, g_ptr, dx_ptr, N, inner_q, n_iblocks, sgo_q, sgn_q,
                        align: tl.constexpr, log: tl.constexpr, f64: tl.constexpr,
                        dim_block: tl.constexpr, inner_block: tl.constexpr, single: tl.constexpr,
                        offsets_64bit: tl.constexpr):
    """Backward of strided: [dim_block x inner_block] tiles reduced along axis 0."""
    inner = inner_q * align
    pid = tl.program_id(0)
    o = pid // n_iblocks
    ib = pid % n_iblocks
    r = tl.arange(0, dim_block)
    if offsets_64bit:
        o = o.to(tl.int64)
        r = r.to(tl.int64)
    cols, cmask, y_base, dx_base, g_base = _bwd_columns(y_ptr, g_ptr, dx_ptr, o, ib, N, inner,
                                                        sgo_q, align, inner_block)
    if single:
        mask = (r[:, None] < N) & cmask
        y = _acc(tl.load(y_base + (r * inner)[:, None], mask=mask, other=0.0), f64)
        g = _acc(tl.load(g_base + (r * sgn_q * align)[:, None], mask=mask, other=0.0), f64)
        if log:
            t = tl.sum(g, axis=0, keep_dims=True)
        else:
            t = tl.sum(g * y, axis=0, keep_dims=True)
        tl.store(dx_base + (r * inner)[:, None], _cast_for(_grad(y, g, t, log), dx_ptr),
                 mask=mask)
    else:
        part = _acc(tl.zeros([dim_block, inner_block], tl.float32), f64)
        for start in range(0, N, dim_block):
            part += _bwd_tile_sum(y_base, g_base, start + r, N, cmask, inner, sgn_q, align, log,
                                  f64)
        t = tl.sum(part, axis=0, keep_dims=True)
        n_chunks = tl.cdiv(N, dim_block)
        for i in range(0, n_chunks):
            _bwd_tile_write(y_base, g_base, dx_base, dx_ptr, (n_chunks - 1 - i) * dim_block + r,
                            N, cmask, inner, sgn_q, align, t, log, f64)


@triton.jit
def _strided_split_bwd_kernel(y_ptr, g_ptr, dx_ptr, t_ptr, N, inner_q, n_iblocks, sgo_q, sgn_q,
                              chunk, splits,
                              align: tl.constexpr, log: tl.constexpr, f64: tl.constexpr,
                              dim_block: tl.constexpr, inner_block: tl.constexpr,
                              splits_block: tl.constexpr, offsets_64bit: tl.constexpr,
                              phase: tl.constexpr):
    """Backward of strided with the dim in `splits` chunks of programs of their own (few long
    columns), two launches (`phase`): 0, each chunk's partial sum (of dy, or dy * y) per column
    to t (slot (o, chunk, column)); 1, the columns' partials added and the chunk's dx written."""
    inner = inner_q * align
    pid = tl.program_id(0)
    sp = pid % splits
    rest = pid // splits
    r = tl.arange(0, dim_block)
    o = rest // n_iblocks
    start = sp * chunk
    if offsets_64bit:
        o = o.to(tl.int64)
        r = r.to(tl.int64)
        start = start.to(tl.int64)
    cols, cmask, y_base, dx_base, g_base = _bwd_columns(
        y_ptr, g_ptr, dx_ptr, o, rest % n_iblocks, N, inner, sgo_q, align, inner_block)
    if phase == 0:
        part = _acc(tl.zeros([dim_block, inner_block], tl.float32), f64)
        for step in range(0, chunk, dim_block):  # (chunk is a multiple of dim_block)
            part += _bwd_tile_sum(y_base, g_base, start + step + r, N, cmask, inner, sgn_q,
                                  align, log, f64)
        tl.store(t_ptr + (o * splits + sp) * inner + cols, tl.sum(part, axis=0),
                 mask=cols < inner)
    else:
        j = tl.arange(0, splits_block)
        slots = t_ptr + ((o * splits + j) * inner)[:, None] + cols[None, :]
        t = tl.sum(tl.load(slots, mask=(j < splits)[:, None] & cmask, other=0.0), axis=0,
                   keep_dims=True)
        for step in range(0, chunk, dim_block):
            _bwd_tile_write(y_base, g_base, dx_base, dx_ptr, start + step + r, N, cmask, inner,
                            sgn_q, align, t, log, f64)


@dataclass(frozen=True, eq=False)
class RowsBackwardPlan:
    """One launch of the rows backward kernel: the Launcher's spec and constexpr source."""

    y_dtype: torch.dtype  # of the forward's output
    grad_dtype: torch.dtype  # of the upstream gradient
    dx_dtype: torch.dtype  # of the gradient written
    ints: tuple  # every integer argument: rows, N / align, dy's row stride / align, tiles each
    align: int  # the power of two (<= 16) dividing N and the strides
    log: bool  # log_softmax
    f64: bool  # accumulate in float64
    rows_per_tile: int
    row_block: int  # the row padded to a power of two, or a chunk of it
    single: bool  # the row in registers (one read of y and dy) or two passes over chunks
    pipeline_stages: int  # software pipelining of a program's tiles
    offsets_64bit: bool  # offsets past 2**31 elements
    num_warps: int

    @property
    def even_row(self) -> bool:
        """The row is its padded block (no column mask)."""
        return self.row_block == self.ints[1] * self.align


@dataclass(frozen=True, eq=False)
class SplitBackwardPlan:
    """The two launches of a row split over programs (partial sums, then dx)."""

    y_dtype: torch.dtype
    grad_dtype: torch.dtype
    dx_dtype: torch.dtype
    ints: tuple  # N / align, dy's row stride / align, chunk, programs per row
    align: int
    log: bool
    f64: bool
    block: int  # elements per step of a chunk
    offsets_64bit: bool
    num_warps: int = 8

    @property
    def split_padded(self) -> int:
        """The programs per row (the last integer argument) padded to a power of two."""
        return next_pow2(self.ints[3])


@dataclass(frozen=True, eq=False)
class StridedSplitBackwardPlan:
    """The two launches of the strided backward split over the dim (one object per launch)."""

    y_dtype: torch.dtype
    grad_dtype: torch.dtype
    dx_dtype: torch.dtype
    ints: tuple  # dim, inner / align, inner blocks, dy's strides / align, chunk, splits
    align: int
    log: bool
    f64: bool
    dim_block: int  # rows of a tile within a chunk
    inner_block: int
    splits_block: int  # splits padded to a power of two (the merge's tile)
    offsets_64bit: bool
    num_warps: int
    phase: int = 0  # 0: the chunks' partial sums; 1: their merge and dx

    @property
    def second(self) -> "StridedSplitBackwardPlan":
        fields = dataclasses.fields(self)
        return strided_split_backward_plan(*(getattr(self, f.name) for f in fields[:-1]), 1)


rows_backward_plan = functools.lru_cache(maxsize=4096)(RowsBackwardPlan)
split_backward_plan = functools.lru_cache(maxsize=4096)(SplitBackwardPlan)
strided_split_backward_plan = functools.lru_cache(maxsize=4096)(StridedSplitBackwardPlan)

_ROWS_BWD = plan_launcher(_rows_bwd_kernel)
_SPLIT_BWD_SUM = plan_launcher(_split_bwd_sum_kernel)
_SPLIT_BWD_APPLY = plan_launcher(_split_bwd_apply_kernel)
_STRIDED_BWD = plan_launcher(_strided_bwd_kernel)
_STRIDED_SPLIT_BWD = plan_launcher(_strided_split_bwd_kernel)


# ---------------------------------------------------------------------------------------------
# Autograd
# ---------------------------------------------------------------------------------------------
_functorch_active = torch._C._are_functorch_transforms_active


_wrapped = torch._C._functorch.is_functorch_wrapped_tensor


_legacy_batched = torch._C._functorch.is_legacy_batchedtensor


def kernels_cannot_read(g: torch.Tensor) -> bool:
    """g is batched or wrapped by a function transform (torch.func's vmap, or the legacy vmap
    that gradcheck's batched checks use): it has no memory a kernel could read."""
    return _functorch_active() or _wrapped(g) or _legacy_batched(g)


class _SoftmaxFunction(torch.autograd.Function):
    """Forward: the chosen backend's kernels. Backward: backward()'s kernels (or, when a graph of
    the backward is wanted for double backward, the same formula in differentiable torch ops).
    apply(x, spec, forward): forward(x) -> y is the backend's prepared forward; spec is (log,
    dim, memo), memo a route's BackwardMemo (None outside a route: the backward is planned per
    call)."""

    @staticmethod
    def forward(ctx, x, spec, forward):
        y = forward(x)
        ctx.save_for_backward(y)
        ctx.spec = spec
        ctx.in_dtype = x.dtype
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        log, dim, memo = ctx.spec
        if torch.is_grad_enabled() or kernels_cannot_read(g):
            # create_graph=True: build the backward from differentiable ops (double backward);
            # under vmap (batched gradients) g is a BatchedTensor, whose memory the kernels
            # cannot read, and torch's ops batch it.
            d = dim if y.dim() else None
            if log:
                dx = g - torch.exp(y) * (g.sum(d, keepdim=True) if d is not None else g)
            else:
                dx = y * (g - ((g * y).sum(d, keepdim=True) if d is not None else g * y))
            return dx.to(ctx.in_dtype), None, None
        if memo is not None:
            # A route's: its bound launches switch to y's device themselves.
            return memo.backward(y, g, dim, log, ctx.in_dtype), None, None
        if y.is_cuda and y.device.index != torch.cuda.current_device():
            with torch.cuda.device(y.device):
                return backward(y, g, dim, log, ctx.in_dtype), None, None
        return backward(y, g, dim, log, ctx.in_dtype), None, None


def backward(y: torch.Tensor, g: torch.Tensor, dim: int, log: bool,
             dx_dtype: torch.dtype) -> torch.Tensor:
    """dx of softmax (log=False) or log_softmax over dim (>= 0), given the contiguous output y and
    the gradient g of y (any strides). dx is contiguous, of dx_dtype."""
    return prepare_backward(y, g, dim, log, dx_dtype, bound=False)(y, g)


#: Prepared backwards a route keeps (BackwardMemo), at most this many upstream layouts each.
BACKWARDS_PER_ROUTE = 8


class BackwardMemo(dict):
    """The prepared backwards of one route's forward, by the upstream gradient's strides and
    dtype (y's shape, dtype and device are the route's). Emptied with the route (Op.forget):
    a plan made under other SM counts or limits never outlives it."""

    __slots__ = ()

    def backward(self, y: torch.Tensor, g: torch.Tensor, dim: int, log: bool,
                 dx_dtype: torch.dtype) -> torch.Tensor:
        key = (g.stride(), g.dtype)
        prepared = self.get(key)
        if prepared is None:
            if len(self) >= BACKWARDS_PER_ROUTE:
                self.clear()
            prepared = self[key] = prepare_backward(y, g, dim, log, dx_dtype)
        return prepared(y, g)


def prepare_backward(y: torch.Tensor, g: torch.Tensor, dim: int, log: bool,
                     dx_dtype: torch.dtype, *, bound: bool = True):
    """The prepared backward (y, g) -> dx of every later call with y's shape, dtype and device
    and g's strides and dtype: the layout arithmetic, the plan and the bound launches worked out
    here once (a backward planned per call cost host time that the forward's route no longer
    does). bound=False, for a backward used once: the launchers' own path, nothing bound."""
    new_dx = allocator(y.shape, dx_dtype, y.device)
    device = y.device.index if y.is_cuda else None

    def launch_of(launcher, plan, grid: tuple):
        if bound:
            return launcher.bind(plan, grid, device)
        return lambda *args: launcher(plan, grid, args)
    shape, strides = g.shape, g.stride()
    rank = len(shape)
    if rank == 0:
        outer = n = inner = 1
    else:
        outer, n, inner = math.prod(shape[:dim]), shape[dim], math.prod(shape[dim + 1:])
    numel = outer * n * inner
    if numel == 0:
        return lambda y, g: new_dx()
    f64 = y.dtype == torch.float64
    info = device_info(y.device)
    sm_count = info.sm_count
    if rank == 0:
        sgo, sgn, ok = 1, 1, True
    else:
        sgo = _collapse(shape, strides, 0, dim)
        sgn = strides[dim] if n > 1 else 1
        if inner == 1:
            ok = sgo is not None and sgn == 1
        else:
            ok = sgo is not None and _collapse(shape, strides, dim + 1, rank) == 1
    read = None if ok else torch.Tensor.contiguous
    if not ok:
        sgo, sgn = n * inner, inner
    i64 = needs_int64(numel + TILE_MAX, outer * sgo + n * sgn + inner)
    if inner > 1:
        bi, bn, single = _strided_plan(n, inner, outer, y.dtype.itemsize, sm_count,
                                       tile=TILE_MAX // 2)  # two tensors in registers
        n_ib = cdiv(inner, bi)
        a = _align(inner, sgo, sgn)
        if single and bn <= cost.SHORT_DIM_MAX:
            warps = single_warps(bn * bi, a * y.dtype.itemsize >= 16, 32)
        else:
            warps = _warps(bn * bi)
        splits = 0
        if not single and cost.strided_walk_bound(
                outer * n_ib, bi * bn, 2 * cdiv(n, bn), sm_count, model_for(info).bandwidth,
                cost.backward_pass_bytes(log, y.dtype.itemsize, g.dtype.itemsize,
                                         dx_dtype.itemsize)):
            splits = cost.strided_splits(n, outer * n_ib, sm_count, forward=False)
        if splits:
            return _strided_split_backward(launch_of, y, g, dx_dtype, log, f64, (outer, n, inner),
                                           (sgo, sgn, a), (bi, bn, splits, warps), read, new_dx)
        ints = (n, inner // a, n_ib, sgo // a, sgn // a)
        plan = strided_launch_plan(y.dtype, dx_dtype, g.dtype, ints, a, log, f64, bn, bi, single,
                                   i64, warps)
        return _one_backward(launch_of(_STRIDED_BWD, plan, (outer * n_ib,)), ints, read, new_dx)
    a = _align(n, sgo)
    bn = next_pow2(n)
    single_max = BWD_SINGLE_MAX_F64 if f64 else BWD_SINGLE_MAX
    if n > single_max and not f64:
        # Many long rows: one launch, a row's sum gathered while later rows are read (lagged).
        rows_lagged = lagged.lagged_backward(launch_of, y, sgo, g.dtype, dx_dtype, log, a,
                                             new_dx, info.interpreted)
        if rows_lagged is not None:
            return rows_lagged if read is None else lambda y, g: rows_lagged(y, read(g))
    if n > single_max and outer < sm_count:
        # Few long rows: split each over several programs (partial sums, then dx in reverse).
        block = 2048
        split = max(1, min(cdiv(2 * sm_count, outer), cdiv(n, block)))
        chunk = cdiv(cdiv(n, split), block) * block
        split = cdiv(n, chunk)
        new_t = allocator((outer * split,), torch.float64 if f64 else torch.float32, y.device)
        ints = (n // a, sgo // a, chunk, split)
        plan = split_backward_plan(y.dtype, g.dtype, dx_dtype, ints, a, log, f64, block, i64)
        sums = launch_of(_SPLIT_BWD_SUM, plan, (outer * split,))
        apply = launch_of(_SPLIT_BWD_APPLY, plan, (outer * split,))

        def split_rows(y: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
            if read is not None:
                g = read(g)
            dx, t = new_dx(), new_t()
            sums(y, g, t, *ints)
            apply(y, g, dx, t, *ints)
            return dx

        return split_rows
    single = n <= single_max
    if single:
        block_r = 1
        if n <= MULTIROW_MAX:  # short rows: a tile of many rows per program
            block_r = max(1, min((2048 if f64 else 4096) // bn, next_pow2(outer)))
        block_n = bn
    else:
        block_r, block_n = 1, 4096 if not f64 else 2048
    tiles = cdiv(outer, block_r)
    warps = _warps(block_r * block_n)
    per = _tiles_per_program(tiles, _resident(sm_count, warps, 2 * block_r * block_n, f64))
    ints = (outer, n // a, sgo // a, per)
    stages = 2 if per > 1 and single and block_r * block_n <= 8192 else 1
    plan = rows_backward_plan(y.dtype, g.dtype, dx_dtype, ints, a, log, f64, block_r, block_n,
                              single, stages, i64, warps)
    return _one_backward(launch_of(_ROWS_BWD, plan, (cdiv(tiles, per),)), ints, read, new_dx)


def _strided_split_backward(launch_of, y, g, dx_dtype, log, f64, geometry, strides, blocks,
                            read, new_dx):
    """The strided backward split over the dim (few long columns: cost.strided_splits): the
    chunks' partial sums per column, then their merge and dx, two launches. geometry: (outer,
    n, inner); strides: dy's (outer, dim) strides and their alignment; blocks: (inner_block,
    dim_block, splits, num_warps)."""
    (outer, n, inner), (sgo, sgn, a), (bi, bn, splits, warps) = geometry, strides, blocks
    chunk = cdiv(cdiv(n, splits), bn) * bn
    splits = cdiv(n, chunk)  # (no empty chunk)
    n_ib = cdiv(inner, bi)
    ints = (n, inner // a, n_ib, sgo // a, sgn // a, chunk, splits)
    numel = outer * n * inner
    i64 = needs_int64(numel + bn * bi, outer * sgo + n * sgn + inner)
    plan = strided_split_backward_plan(y.dtype, g.dtype, dx_dtype, ints, a, log, f64, bn, bi,
                                       next_pow2(splits), i64, warps)
    grid = (outer * n_ib * splits,)
    sums = launch_of(_STRIDED_SPLIT_BWD, plan, grid)
    apply = launch_of(_STRIDED_SPLIT_BWD, plan.second, grid)
    new_t = allocator((outer * splits * inner,), torch.float64 if f64 else torch.float32,
                      y.device)

    def split_columns(y: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        if read is not None:
            g = read(g)
        dx, t = new_dx(), new_t()
        sums(y, g, dx, t, *ints)
        apply(y, g, dx, t, *ints)
        return dx

    return split_columns


def _one_backward(launch, ints: tuple, read, new_dx):
    """The prepared backward of one kernel: (y, g) -> dx, g read through read(g) (or as it is)."""

    def one_kernel(y: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        if read is not None:
            g = read(g)
        dx = new_dx()
        launch(y, g, dx, *ints)
        return dx

    return one_kernel


class ForwardBackend(PlannedBackend):
    """A softmax backend of this package's kernels: its plan is its forward's launches
    (forward_plan, under a config whose keys are checked first: CONFIG_KEYS, or
    config_keys(config) where a backend has two kinds of config), and _forward(plan, call) the
    prepared forward x -> y that a run (_launch: the torch cast, autograd and the current
    device around it) and a route (bind) both call."""

    CONFIG_KEYS: frozenset = frozenset()

    def config_keys(self, config) -> frozenset:
        return self.CONFIG_KEYS

    def plan_facts(self, call: SoftmaxCall) -> tuple:
        # The exact call (sizes, dtypes, layout, autograd) and the strides the kernels read in
        # place, which a strided view of the same layout has its own of.
        return call.exact, call.so, call.sn, call.log

    def make_plan(self, call: SoftmaxCall, config, sms: int):
        check_config(f"softmax {self.name}", config, self.config_keys(config), complete=True)
        return self.forward_plan(call, config, sms)

    def forward_plan(self, call: SoftmaxCall, config, sms: int):
        raise NotImplementedError

    def _forward(self, plan, call: SoftmaxCall):
        raise NotImplementedError

    def _launch(self, plan, call: SoftmaxCall) -> torch.Tensor:
        # The plan serves the call a torch cast makes under autograd too (_call_on): the same
        # sizes, the dtype and the contiguous strides the cast input is read with anyway.
        return _run(call, lambda c: self._forward(plan, c)(c.x))

    def bind(self, call: SoftmaxCall, config):
        if call.numel == 0:
            return None  # (the dispatcher binds no empty call: Backend.run answers it)
        plan = self.plan(call, config)  # (which refuses a config of other keys)
        forward = self._forward(plan, call)
        if not call.grad:
            return forward
        if call.cast_first:
            return None  # a narrowing cast first, recorded by autograd: run() does it
        # Under autograd: the same forward inside the autograd.Function, and a memo of the
        # prepared backwards that lives as long as the route. Unbound, every call planned its
        # forward and backward again (H200 host, 4096 x 1024 float32: 310 us a fused forward
        # + backward against torch's 101).
        spec = (call.log, call.dim, BackwardMemo())
        apply = _SoftmaxFunction.apply

        def forward_with_grad(x: torch.Tensor) -> torch.Tensor:
            return apply(x, spec, forward)

        forward_with_grad.backwards = spec[2]  # (what tests and profiles look at)
        return forward_with_grad


def _run(call: SoftmaxCall, launch) -> torch.Tensor:
    """Shared by the Triton backends: the torch cast, autograd, and the current device (Triton
    launches on the current CUDA device, which may not be the tensor's)."""
    info = call.info
    if info.type == "cuda" and info.index != torch.cuda.current_device():
        with torch.cuda.device(info.index):
            return _run_here(call, launch)
    return _run_here(call, launch)


def _run_here(call: SoftmaxCall, launch) -> torch.Tensor:
    if call.grad:
        if call.cast_first:
            # A narrowing cast (it rounds): torch's .to() records it for autograd; the kernels
            # then read the cast tensor.
            x = call.x.to(call.out_dtype, memory_format=torch.contiguous_format)
            inner = _call_on(call, x)
            return _SoftmaxFunction.apply(x, (call.log, call.dim, None), lambda _: launch(inner))
        return _SoftmaxFunction.apply(call.x, (call.log, call.dim, None), lambda _: launch(call))
    return launch(call)


def _call_on(call: SoftmaxCall, x: torch.Tensor) -> SoftmaxCall:
    """The same call on the already cast input x (so the kernels need no cast)."""
    c = SoftmaxCall()
    c.x, c.dim, c.log, c.dtype_arg, c.out_dtype = x, call.dim, call.log, None, call.out_dtype
    c.cast_first, c.outer, c.n, c.inner = False, call.outer, call.n, call.inner
    c.so, c.sn, c.fast, c.columns, c.grad = call.n * call.inner, call.inner, True, None, call.grad
    c.info, c.key, c.exact = call.info, call.key, call.exact
    return c


def _with_backward(call: SoftmaxCall, run):
    """Under autograd, tuning times the forward and the backward: a backend that wins the forward
    alone can lose the step (the Python autograd.Function costs host time torch's does not)."""
    if not call.grad:
        return run
    upstream = []

    def forward_backward():
        y = run()
        if not upstream:
            upstream.append(torch.randn_like(y))
        return torch.autograd.grad(y, call.x, upstream[0])

    return forward_backward
