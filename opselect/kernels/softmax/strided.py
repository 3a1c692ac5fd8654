"""softmax's strided backend: softmax over a non-innermost dim without a transpose copy."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ...dispatch.backend import Estimate
from ...heuristics import softmax as cost
from ...heuristics.device_model import model_for
from .._common import allocator, cdiv, needs_int64, next_pow2
from .autograd import ForwardBackend
from .call import SoftmaxCall
from .common import (TILE_MAX, _acc, _align, _cast_for, _finish, _merge, _one_launch,
                     _online_step, _read_dtype, _reader, _strided_plan, _warps, plan_launcher,
                     StridedPlan, single_warps, strided_launch_plan)


@triton.jit
def _output_columns(y_ptr, o, cols, N, inner, columns: tl.constexpr):
    """(y at the tile's columns of outer index o, y's step along the dim): y is contiguous as
    (outer, N, inner), or, for `columns` (the call's rows are x's columns), as (outer, inner, N),
    each column of the tile an output row and the stores running along axis 0."""
    if columns:
        base = y_ptr + o * N * inner + cols[None, :] * N
        step = 1
    else:
        base = y_ptr + o * N * inner + cols[None, :]
        step = inner
    return base, step


@triton.jit
def _load_rows(x_base, rr, N, cmask, sxn_q, align, f64: tl.constexpr):
    """The tile of rows rr (past N: -inf) of the program's columns, in the accumulation type,
    and its mask."""
    mask = (rr[:, None] < N) & cmask
    x = _acc(tl.load(x_base + (rr * sxn_q * align)[:, None], mask=mask, other=float("-inf")), f64)
    return x, mask


@triton.jit
def _write_rows(x_base, y_base, y_ptr, rr, N, cmask, sxn_q, align, y_step, big, total,
                log: tl.constexpr, f64: tl.constexpr):
    """Rows rr of the program's columns read again and written finished (max big, sum total)."""
    x, mask = _load_rows(x_base, rr, N, cmask, sxn_q, align, f64)
    tl.store(y_base + (rr * y_step)[:, None], _cast_for(_finish(x, big, total, log), y_ptr),
             mask=mask)


@triton.jit
def _strided_fwd_kernel(x_ptr, y_ptr, N, inner_q, n_iblocks, sxo_q, sxn_q,
                        align: tl.constexpr, log: tl.constexpr, f64: tl.constexpr,
                        dim_block: tl.constexpr, inner_block: tl.constexpr, single: tl.constexpr,
                        offsets_64bit: tl.constexpr, columns: tl.constexpr):
    """strided: x viewed as (outer, N, inner) with inner contiguous; the output is contiguous,
    as (outer, N, inner), or as (outer, inner, N) where the call's rows are x's columns
    (`columns`: softmax over the last dim of a transposed matrix, written as rows).

    A program owns inner_block consecutive inner columns of one outer index: every load is a row
    of inner_block contiguous elements (coalesced, vectorised), and the reduction runs along axis
    0 of the [dim_block x inner_block] tile, so no transpose copy is needed."""
    inner = inner_q * align
    pid = tl.program_id(0)
    o = pid // n_iblocks
    ib = pid % n_iblocks
    r = tl.arange(0, dim_block)
    cols = ib * inner_block + tl.arange(0, inner_block)
    if offsets_64bit:
        o = o.to(tl.int64)
        r = r.to(tl.int64)
        cols = cols.to(tl.int64)
    cmask = cols[None, :] < inner
    x_base = x_ptr + o * sxo_q * align + cols[None, :]
    y_base, y_step = _output_columns(y_ptr, o, cols, N, inner, columns)
    if single:
        x, mask = _load_rows(x_base, r, N, cmask, sxn_q, align, f64)
        big = tl.max(x, axis=0, keep_dims=True)
        z = x - big
        e = tl.exp(z)
        total = tl.sum(e, axis=0, keep_dims=True)
        if log:
            out = z - tl.log(total)
        else:
            out = e * (1.0 / total)
        tl.store(y_base + (r * y_step)[:, None], _cast_for(out, y_ptr), mask=mask)
    else:
        m = _acc(tl.full([dim_block, inner_block], float("-inf"), tl.float32), f64)
        s = _acc(tl.zeros([dim_block, inner_block], tl.float32), f64)
        for start in range(0, N, dim_block):
            x, _ = _load_rows(x_base, start + r, N, cmask, sxn_q, align, f64)
            m, s = _online_step(m, s, x)
        big, total = _merge(m, s, 0)
        n_chunks = tl.cdiv(N, dim_block)
        for i in range(0, n_chunks):
            _write_rows(x_base, y_base, y_ptr, (n_chunks - 1 - i) * dim_block + r, N, cmask,
                        sxn_q, align, y_step, big, total, log, f64)


_STRIDED_FWD = plan_launcher(_strided_fwd_kernel)


# ---------------------------------------------------------------------------------------------
# Split: the dim in `splits` chunks of programs of their own, for calls of too few column
# blocks to fill the GPU (a few long columns: a transposed 64 x 32000 is 4 blocks of 16). Two
# launches over the same programs: each chunk's (max, sum) per column to a workspace, then each
# program merges its columns' partials and writes its chunk. The input is read twice.
# ---------------------------------------------------------------------------------------------
@triton.jit
def _split_program(x_ptr, y_ptr, N, inner, n_iblocks, sxo_q, chunk, splits, align,
                   inner_block: tl.constexpr, offsets_64bit: tl.constexpr,
                   columns: tl.constexpr):
    """Program (outer o, column block ib, chunk sp): its columns, their mask, the column
    bases of x and y, the output's step along the dim, its chunk's first row and o, sp."""
    pid = tl.program_id(0)
    sp = pid % splits
    rest = pid // splits
    o = rest // n_iblocks
    ib = rest % n_iblocks
    cols = ib * inner_block + tl.arange(0, inner_block)
    start = sp * chunk
    if offsets_64bit:
        o = o.to(tl.int64)
        cols = cols.to(tl.int64)
        start = start.to(tl.int64)
    x_base = x_ptr + o * sxo_q * align + cols[None, :]
    y_base, y_step = _output_columns(y_ptr, o, cols, N, inner, columns)
    return cols, cols[None, :] < inner, x_base, y_base, y_step, start, o, sp


@triton.jit
def _strided_split_kernel(x_ptr, y_ptr, ws_ptr, N, inner_q, n_iblocks, sxo_q, sxn_q, chunk,
                          splits, plane,
                          align: tl.constexpr, log: tl.constexpr, f64: tl.constexpr,
                          dim_block: tl.constexpr, inner_block: tl.constexpr,
                          splits_block: tl.constexpr, offsets_64bit: tl.constexpr,
                          columns: tl.constexpr, phase: tl.constexpr):
    """A split's two launches (`phase`): 0, the (max, sum) of each column over the program's
    chunk to the workspace (plane 0 the maxima, plane 1 the sums; slot (o, sp, column)); 1, the
    columns' partials merged and the program's chunk written."""
    inner = inner_q * align
    cols, cmask, x_base, y_base, y_step, start, o, sp = _split_program(
        x_ptr, y_ptr, N, inner, n_iblocks, sxo_q, chunk, splits, align, inner_block,
        offsets_64bit, columns)
    r = tl.arange(0, dim_block)
    if phase == 0:
        m = _acc(tl.full([dim_block, inner_block], float("-inf"), tl.float32), f64)
        s = _acc(tl.zeros([dim_block, inner_block], tl.float32), f64)
        for t in range(0, chunk, dim_block):  # (chunk is a multiple of dim_block)
            x, _ = _load_rows(x_base, start + t + r, N, cmask, sxn_q, align, f64)
            m, s = _online_step(m, s, x)
        big, total = _merge(m, s, 0)
        slot = ws_ptr + (o * splits + sp) * inner + cols
        tl.store(slot, tl.reshape(big, [inner_block]), mask=cols < inner)
        tl.store(slot + plane, tl.reshape(total, [inner_block]), mask=cols < inner)
    else:
        j = tl.arange(0, splits_block)
        slots = ws_ptr + ((o * splits + j) * inner)[:, None] + cols[None, :]
        ok = (j < splits)[:, None] & cmask
        big, total = _merge(tl.load(slots, mask=ok, other=float("-inf")),
                            tl.load(slots + plane, mask=ok, other=0.0), 0)
        for t in range(0, chunk, dim_block):
            _write_rows(x_base, y_base, y_ptr, start + t + r, N, cmask, sxn_q, align, y_step,
                        big, total, log, f64)


_STRIDED_SPLIT = plan_launcher(_strided_split_kernel)


@dataclass(frozen=True, eq=False)
class StridedSplitPlan:
    """The two launches of a split (one object per distinct launch: strided_split_plan)."""

    in_dtype: torch.dtype
    out_dtype: torch.dtype
    ints: tuple  # dim, inner / align, inner blocks, strides / align, chunk, splits, plane
    align: int
    log: bool
    f64: bool
    dim_block: int  # rows of a tile within a chunk
    inner_block: int
    splits_block: int  # splits, padded to a power of two (the merge's tile)
    offsets_64bit: bool
    num_warps: int
    columns: bool
    phase: int = 0  # the launch: 0 the chunks' (max, sum), 1 the merge and the writes

    @property
    def programs_per_outer(self) -> int:
        return self.ints[2] * self.ints[6]

    @property
    def second(self) -> "StridedSplitPlan":
        """The plan of the second launch: the same object for every call of this plan (the
        Launcher keeps what it binds by plan)."""
        fields = dataclasses.fields(self)
        return strided_split_plan(*(getattr(self, f.name) for f in fields[:-1]), 1)


strided_split_plan = functools.lru_cache(maxsize=4096)(StridedSplitPlan)


def strided_split_fwd_plan(call: SoftmaxCall, block_i: int, tile: int, warp_scale: int,
                           splits: int) -> StridedSplitPlan:
    _, outer, n, inner, so, sn = strided_view(call)
    bi = max(1, min(block_i, next_pow2(inner)))
    bn = max(1, min(next_pow2(cdiv(n, splits)), tile // (4 * bi)))
    chunk = cdiv(cdiv(n, splits), bn) * bn
    splits = cdiv(n, chunk)  # (no empty chunk)
    n_ib = cdiv(inner, bi)
    a = _align(inner, so, sn)
    plane = outer * splits * inner
    ints = (n, inner // a, n_ib, so // a, sn // a, chunk, splits, plane)
    i64 = needs_int64(call.numel + bn * bi, outer * so + n * sn + inner, 2 * plane)
    return strided_split_plan(_read_dtype(call), call.out_dtype, ints, a, call.log, call.f64, bn,
                              bi, next_pow2(splits), i64, min(32, _warps(bi * bn) * warp_scale),
                              call.columns is not None)


def _strided_split_fwd(plan: StridedSplitPlan, call: SoftmaxCall):
    read, outer = strided_view(call)[:2]
    grid = (outer * plan.programs_per_outer,)
    stats = _STRIDED_SPLIT.bind(plan, grid, call.info.index)
    write = _STRIDED_SPLIT.bind(plan.second, grid, call.info.index)
    new_y = allocator(tuple(call.x.shape), call.out_dtype, call.x.device)
    new_ws = allocator((2 * plan.ints[7],), torch.float64 if plan.f64 else torch.float32,
                       call.x.device)
    ints = plan.ints

    def forward(x: torch.Tensor) -> torch.Tensor:
        if read is not None:
            x = read(x)
        y, ws = new_y(), new_ws()
        stats(x, y, ws, *ints)
        write(x, y, ws, *ints)
        return y

    return forward


def strided_view(call: SoftmaxCall) -> tuple:
    """(read, outer, n, inner, outer stride, dim stride) of the (outer, n, inner) view strided
    reads, inner contiguous: the call's own (read: _reader's copy or cast, or None), or, for rows
    whose elements lie apart (call.columns), x in place with the dims before the softmax dim as
    inner."""
    if call.columns is not None:
        outer, inner, so = call.columns
        return None, outer, call.n, inner, so, call.sn
    read, so, sn = _reader(call)
    return read, call.outer, call.n, call.inner, so, sn


def strided_fwd_plan(call: SoftmaxCall, block_i: int, tile: int, warp_scale: int, sms: int
                     ) -> StridedPlan:
    """The launch of the forward over a non-last dim (_strided_plan's tile)."""
    _, outer, n, inner, so, sn = strided_view(call)
    bi, bn, single = _strided_plan(n, inner, outer, call.in_bytes, sms, block_i, tile)
    a = _align(inner, so, sn)
    if single and bn <= cost.SHORT_DIM_MAX and call.columns is None:
        warps = single_warps(bi * bn, a * call.in_bytes >= 16, 64)
    else:
        warps = _warps(bi * bn)
    warps = min(32, warps * warp_scale)
    n_ib = cdiv(inner, bi)
    ints = (n, inner // a, n_ib, so // a, sn // a)
    i64 = needs_int64(call.numel + bn * bi, outer * so + n * sn + inner)
    return strided_launch_plan(_read_dtype(call), call.out_dtype, None, ints, a, call.log,
                               call.f64, bn, bi, single, i64, warps, call.columns is not None)


def _strided_fwd(plan: StridedPlan, call: SoftmaxCall):
    """The prepared forward over a non-last dim under its plan: a function x -> y of the call's
    input. A program per block of inner columns (the plan's third integer) of each outer
    index."""
    read, outer = strided_view(call)[:2]
    launch = _STRIDED_FWD.bind(plan, (outer * plan.ints[2],), call.info.index)
    return _one_launch(read, launch, plan.ints, tuple(call.x.shape), call.out_dtype,
                       call.x.device)


#: The keys of strided's configs (and of its split configs).
CONFIG_KEYS = frozenset({"inner_block", "tile", "warp_scale"})
SPLIT_KEYS = CONFIG_KEYS | {"splits"}


class StridedBackend(ForwardBackend):
    name = "strided"
    CONFIG_KEYS = CONFIG_KEYS

    def supports(self, call: SoftmaxCall) -> str | None:
        if call.inner == 1 and call.columns is None:
            return "the softmax dim is the innermost; fused, multirow or online take rows"
        return None

    @staticmethod
    def _blocks(call: SoftmaxCall, sms: int) -> tuple[int, int, int]:
        """(tile, the default inner_block, the first config's): columns written as rows take
        half as many columns a program first where the dim takes two passes or the default's
        blocks are fewer than SMs: more programs to hide the loop's latency (H200: 1.1-1.6x on
        8 of 8 such calls; where the whole dim fits in registers and blocks are plenty, half
        lost 1.1-1.3x; fits/softmax.md, "Rows of a transposed matrix")."""
        tile = TILE_MAX // 2 if call.f64 else TILE_MAX
        _, outer, n, inner, _, _ = strided_view(call)
        bi, _, single = _strided_plan(n, inner, outer, call.in_bytes, sms, None, tile,
                                      short=call.columns is None,
                                      short_most=cost.SHORT_FWD_COLUMNS_MAX)
        few = outer * cdiv(inner, bi) < sms
        halve = call.columns is not None and bi > 1 and (not single or few)
        return tile, bi, (bi // 2 if halve else bi)

    @staticmethod
    def _splits(call: SoftmaxCall, sms: int) -> tuple[int, int]:
        """(splits, inner_block) of the first config; splits 0: none. Column blocks whose long
        walks, not the memory, set the time are split over programs (cost.strided_walk_bound: few
        blocks, or too few to keep the memory busy a step at a time; cost.strided_splits); a dim
        of x's own layout
        (not columns written as rows) then takes segments twice the default's where that still
        leaves two programs an SM (fits/softmax.md, "Few long columns: the split")."""
        tile, bi, first = StridedBackend._blocks(call, sms)
        _, outer, n, inner, _, _ = strided_view(call)
        _, first_n, single = _strided_plan(n, inner, outer, call.in_bytes, sms, first, tile)
        # Against the first config unsplit: its walk, and what its blocks move a step.
        if single or not cost.strided_walk_bound(
                outer * cdiv(inner, first), first * first_n, 2 * cdiv(n, first_n), sms,
                model_for(call.info).bandwidth,
                cost.forward_pass_bytes(call.in_bytes, call.out_dtype.itemsize)):
            return 0, bi
        wide = min(2 * bi, next_pow2(inner))
        if call.columns is None and outer * cdiv(inner, wide) * cdiv(n, cost.SPLIT_ROWS) >= 2 * sms:
            bi = wide  # (columns written as rows lost 4-5% with them)
        return cost.strided_splits(n, outer * cdiv(inner, bi), sms, forward=True), bi

    def configs(self, call: SoftmaxCall) -> list[dict]:
        tile, bi, first = self._blocks(call, call.info.sm_count)
        _, outer, n, inner, _, _ = strided_view(call)
        # num_warps follows the tile actually used (~16 elements per thread), times warp_scale.
        cfgs = [{"inner_block": bi, "tile": tile, "warp_scale": 1},
                {"inner_block": bi, "tile": tile, "warp_scale": 2}]
        if bi > 1:
            cfgs.insert(0 if first < bi else 2, {"inner_block": bi // 2, "tile": tile,
                                                 "warp_scale": 1})
        if bi < next_pow2(inner):
            cfgs.append({"inner_block": 2 * bi, "tile": tile, "warp_scale": 1})
        splits, split_block = self._splits(call, call.info.sm_count)
        if splits:
            # Few long columns: the dim split over programs too, first; then half the columns
            # a program (more programs) and twice the splits, for tuning.
            base = {"inner_block": split_block, "tile": tile, "warp_scale": 1}
            more = [{**base, "splits": splits}]
            if split_block > 1:
                more.append({**base, "inner_block": split_block // 2, "splits": splits})
            if 2 * splits <= min(cost.SPLITS_MAX, cdiv(n, cost.SPLIT_ROWS_MIN)):
                more.append({**base, "splits": 2 * splits})
            cfgs = more + cfgs
        return cfgs

    def config_keys(self, config) -> frozenset:
        return SPLIT_KEYS if "splits" in config else CONFIG_KEYS

    @staticmethod
    def forward_plan(call: SoftmaxCall, config, sms: int):
        if "splits" in config:
            return strided_split_fwd_plan(call, config["inner_block"], config["tile"],
                                          config["warp_scale"], config["splits"])
        return strided_fwd_plan(call, config["inner_block"], config["tile"],
                                config["warp_scale"], sms)

    @staticmethod
    def _forward(plan, call: SoftmaxCall):
        if isinstance(plan, StridedSplitPlan):
            return _strided_split_fwd(plan, call)
        return _strided_fwd(plan, call)

    def cost(self, call: SoftmaxCall, model) -> Estimate:
        """The estimate of the first config's plan (a split's two launches, or one)."""
        plan = self.plan(call, self.configs(call)[0], sms=max(1, int(model.sm_count)))
        _, outer, n, inner, so, sn = strided_view(call)
        view = (outer, inner, _align(inner, so, sn))
        if isinstance(plan, StridedSplitPlan):
            chunk, splits = plan.ints[5], plan.ints[6]
            return cost.strided(call, model, block_i=plan.inner_block, single=False, view=view,
                                steps=2 * cdiv(chunk, plan.dim_block), splits=splits,
                                warps=plan.num_warps, block_n=plan.dim_block)
        return cost.strided(call, model, block_i=plan.inner_block, single=plan.single,
                            view=view, steps=0 if plan.single else 2 * cdiv(n, plan.dim_block),
                            warps=plan.num_warps, block_n=plan.dim_block)
