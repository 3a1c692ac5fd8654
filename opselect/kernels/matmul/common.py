"""What matmul's Triton backends share: the jit pieces every kernel is built from (the tile
order, the product of one tile over a range of k, the epilogue), the plan fields they share, and
the backend base (supports, plan facts, the launch and the prepared call)."""

from __future__ import annotations

from typing import Callable

import torch
import triton
import triton.language as tl

from ...dispatch.backend import PlannedBackend
from ...dispatch.device import INTERPRETED
from .._common import allocator, check_config, needs_int64
from .._jit import ROUND_BF16_BY_HAND, bf16_nearest_even
from .call import MatmulCall

#: Triton's interpreter's dot of bfloat16 tiles is wrong (garbage sums): under it the tiles go
#: to float32 before the dot (and the output is rounded by hand: kernels/_jit.py). Compiled
#: kernels keep the hardware's paths.
_INTERPRETED = tl.constexpr(INTERPRETED)

# ---------------------------------------------------------------------------------------------
# The jit pieces
# ---------------------------------------------------------------------------------------------
@triton.jit
def tile_of(tile, grid_m, grid_n, group_m: tl.constexpr):
    """(row block, column block) of the tile-th output tile. Tiles go column by column within
    groups of group_m row blocks, so the programs running at once share group_m row blocks of A
    and a few column blocks of B: both stay in L2 while they are read again."""
    per_group = group_m * grid_n
    group = tile // per_group
    first = group * group_m
    rows = tl.minimum(grid_m - first, group_m)
    within = tile % per_group
    return first + within % rows, within // rows


@triton.jit
def tile_product(a, b, rm, rn, k_lo, k_len, M, N, sam, sak, sbk, sbn,
                 block_m: tl.constexpr, block_n: tl.constexpr, block_k: tl.constexpr,
                 even_k: tl.constexpr, tf32: tl.constexpr):
    """sum over k in [k_lo, k_lo + k_len) of A[rm, k] * B[k, rn], in float32. Rows past M and
    columns past N read nothing (their sums are never stored); k past the range reads zeros
    unless every step is whole (even_k)."""
    rk = tl.arange(0, block_k)
    a_ptrs = a + rm[:, None] * sam + (k_lo + rk)[None, :] * sak
    b_ptrs = b + (k_lo + rk)[:, None] * sbk + rn[None, :] * sbn
    rows_in = rm[:, None] < M
    cols_in = rn[None, :] < N
    acc = tl.zeros((block_m, block_n), dtype=tl.float32)
    for k in range(0, k_len, block_k):
        if even_k:
            x = tl.load(a_ptrs, mask=rows_in, other=0.0)
            y = tl.load(b_ptrs, mask=cols_in, other=0.0)
        else:
            k_in = rk < k_len - k
            x = tl.load(a_ptrs, mask=rows_in & k_in[None, :], other=0.0)
            y = tl.load(b_ptrs, mask=k_in[:, None] & cols_in, other=0.0)
        if _INTERPRETED:
            x = x.to(tl.float32)
            y = y.to(tl.float32)
        if tf32:
            acc = tl.dot(x, y, acc, input_precision="tf32")
        elif x.dtype == tl.float32:
            # Full float32 products run on the FMA units, one k after another: a sum of k
            # same-signed terms loses about k/6 ulps that way (the H200 fuzz: 1000 equal
            # products 157 ulps off, cuBLAS's tree 2). Each step's block_k products are summed
            # apart and then added, which leaves block_k + k / block_k roundings in a row.
            # The select keeps Triton's combine pass from folding `acc + dot(x, y, 0)` back
            # into dot(x, y, acc), one chain again (the H200 measured no change without it);
            # k_len > 0 holds in every step, the compiler just cannot know it.
            acc += tl.where(k_len > 0, tl.dot(x, y, input_precision="ieee"), 0.0)
        else:
            acc = tl.dot(x, y, acc, input_precision="ieee")
        a_ptrs += block_k * sak
        b_ptrs += block_k * sbk
    return acc


@triton.jit
def store_tile(c, bias, acc, rm, rn, M, N, sbias, has_bias: tl.constexpr):
    """C[rm, rn] = acc (+ bias[rn]), the bias added in float32 and the sum rounded once, as
    cuBLAS's bias epilogue does; c points at this batch entry's (M, N) output."""
    if has_bias:
        acc += tl.load(bias + rn * sbias, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    ptrs = c + rm[:, None] * N + rn[None, :]
    if ROUND_BF16_BY_HAND:
        if c.dtype.element_ty == tl.bfloat16:
            tl.store(ptrs, bf16_nearest_even(acc), mask=mask)
            return
    tl.store(ptrs, acc.to(c.dtype.element_ty), mask=mask)


@triton.jit
def block_index(i, block: tl.constexpr, wide: tl.constexpr):
    """i * block + arange(block), in 64 bits where offsets pass 2**31 (wide)."""
    if wide:
        i = i.to(tl.int64)
    return i * block + tl.arange(0, block)


# ---------------------------------------------------------------------------------------------
# The backend base
# ---------------------------------------------------------------------------------------------
def ints_of(call: MatmulCall) -> tuple:
    """The integer arguments every kernel takes after its pointers: sizes, then A's, B's and the
    bias's strides (part of each plan: a Launcher's spec fixes every integer argument)."""
    return (call.m, call.n, call.k, *call.sa, *call.sb, call.bias_stride or 0)


def wide_offsets(call: MatmulCall) -> bool:
    """Some offset passes 2**31 elements: A's, B's or C's span, or the batch's."""
    span_a = (call.batch - 1) * abs(call.sa[0]) + (call.m - 1) * abs(call.sa[1]) + \
        (call.k - 1) * abs(call.sa[2]) + 1
    span_b = (call.batch - 1) * abs(call.sb[0]) + (call.k - 1) * abs(call.sb[1]) + \
        (call.n - 1) * abs(call.sb[2]) + 1
    return needs_int64(span_a, span_b, call.batch * call.m * call.n)


class MatmulBackend(PlannedBackend):
    """A Triton backend of matmul: make_plan() gives a frozen plan (the Launchers' spec and the
    cost model's input), launch(plan, call, a, b, bias, c) runs it on the call's sources."""

    CONFIG_KEYS: frozenset = frozenset()

    # supports(): a backend's verdict must be the same for every call of one key (the
    # dispatcher remembers a forced or tuned choice per key), so limits are drawn on the
    # edges of the key's size buckets (dispatch/signature.py).

    def plan_facts(self, call: MatmulCall) -> tuple:
        return call.exact

    def check(self, config) -> None:
        check_config(f"matmul {self.name}", config, self.CONFIG_KEYS, complete=True)

    def launch(self, plan, call: MatmulCall, a, b, bias, c) -> None:
        raise NotImplementedError

    def _launch(self, plan, call: MatmulCall) -> torch.Tensor:
        c = call.output()
        # (the bias's own pointer and stride: a (n,), (1, n) or one-value bias alike)
        self.launch(plan, call, call.a_src, call.b_src,
                    c if call.bias is None else call.bias, c)
        return c.view(call.out_shape)

    def bind(self, call: MatmulCall, config) -> Callable[..., torch.Tensor] | None:
        """The prepared product of a plain call: per call the output's allocation and the
        launch (the sources are the call's own tensors: no copy was needed)."""
        if call.copied or self.supports(call) is not None:
            return None
        launch = self.bound(self.plan(call, config), call)
        new_out = allocator((call.batch, call.m, call.n), call.dtype, call.a.device)
        shape = call.out_shape

        def product(a, b, bias=None):
            c = new_out()
            launch(a, b, c if bias is None else bias, c)
            return c.view(shape)

        return product

    def bound(self, plan, call: MatmulCall) -> Callable[..., None]:
        """launch(a, b, bias, c) of this plan with everything else bound (BoundLaunch)."""
        raise NotImplementedError
