"""softmax's strided backend: softmax over a non-innermost dim without a transpose copy."""

from __future__ import annotations

import triton
import triton.language as tl

from ...dispatch.backend import Estimate
from ...heuristics import softmax as cost
from .._common import cdiv, needs_int64, next_pow2
from .autograd import ForwardBackend
from .call import SoftmaxCall
from .common import (TILE_MAX, _acc, _align, _cast_for, _finish, _merge, _one_launch,
                     _online_step, _read_dtype, _reader, _strided_plan, _warps, plan_launcher,
                     StridedPlan, strided_launch_plan)


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
    if columns:
        # Each column of the tile is an output row: the stores run along axis 0.
        y_base = y_ptr + o * N * inner + cols[None, :] * N
        y_step = 1
    else:
        y_base = y_ptr + o * N * inner + cols[None, :]
        y_step = inner
    if single:
        mask = (r[:, None] < N) & cmask
        x = _acc(tl.load(x_base + (r * sxn_q * align)[:, None], mask=mask, other=float("-inf")),
                 f64)
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
            rr = start + r
            mask = (rr[:, None] < N) & cmask
            x = _acc(tl.load(x_base + (rr * sxn_q * align)[:, None], mask=mask,
                             other=float("-inf")), f64)
            m, s = _online_step(m, s, x)
        big, total = _merge(m, s, 0)
        n_chunks = tl.cdiv(N, dim_block)
        for i in range(0, n_chunks):
            rr = (n_chunks - 1 - i) * dim_block + r
            mask = (rr[:, None] < N) & cmask
            x = _acc(tl.load(x_base + (rr * sxn_q * align)[:, None], mask=mask,
                             other=float("-inf")), f64)
            tl.store(y_base + (rr * y_step)[:, None],
                     _cast_for(_finish(x, big, total, log), y_ptr), mask=mask)


_STRIDED_FWD = plan_launcher(_strided_fwd_kernel)


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
    warps = min(32, _warps(bi * bn) * warp_scale)
    n_ib = cdiv(inner, bi)
    a = _align(inner, so, sn)
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


#: The keys of strided's configs.
CONFIG_KEYS = frozenset({"inner_block", "tile", "warp_scale"})


class StridedBackend(ForwardBackend):
    name = "strided"
    CONFIG_KEYS = CONFIG_KEYS

    def supports(self, call: SoftmaxCall) -> str | None:
        if call.inner == 1 and call.columns is None:
            return "the softmax dim is the innermost; fused, multirow or online take rows"
        return None

    def configs(self, call: SoftmaxCall) -> list[dict]:
        tile = TILE_MAX // 2 if call.f64 else TILE_MAX
        _, outer, n, inner, _, _ = strided_view(call)
        bi, bn, _ = _strided_plan(n, inner, outer, call.in_bytes, call.info.sm_count, None, tile)
        # num_warps follows the tile actually used (~16 elements per thread), times warp_scale.
        cfgs = [{"inner_block": bi, "tile": tile, "warp_scale": 1},
                {"inner_block": bi, "tile": tile, "warp_scale": 2}]
        if bi > 1:
            cfgs.append({"inner_block": bi // 2, "tile": tile, "warp_scale": 1})
            if call.columns is not None:
                # Columns written as rows: half as many columns a program went first in tuning
                # on every such call the H200 tuned where the two differed (7 of 7 in
                # bench_random, 1.1-1.55x; fits/softmax.md, "Rows of a transposed matrix").
                cfgs.insert(0, cfgs.pop())
        if bi < next_pow2(inner):
            cfgs.append({"inner_block": 2 * bi, "tile": tile, "warp_scale": 1})
        return cfgs

    @staticmethod
    def forward_plan(call: SoftmaxCall, config, sms: int) -> StridedPlan:
        return strided_fwd_plan(call, config["inner_block"], config["tile"],
                                config["warp_scale"], sms)

    @staticmethod
    def _forward(plan, call: SoftmaxCall):
        return _strided_fwd(plan, call)

    def cost(self, call: SoftmaxCall, model) -> Estimate:
        tile = TILE_MAX // 2 if call.f64 else TILE_MAX
        _, outer, n, inner, so, sn = strided_view(call)
        bi, bn, single = _strided_plan(n, inner, outer, call.in_bytes, model.sm_count, None, tile)
        if call.columns is not None and bi > 1:  # (the first config's block: configs())
            bi, bn, single = _strided_plan(n, inner, outer, call.in_bytes, model.sm_count,
                                           bi // 2, tile)
        return cost.strided(call, model, block_i=bi, single=single,
                            view=(outer, inner, _align(inner, so, sn)))
