"""isin's search backend: sort the test elements, then a branchless lower-bound search per element."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ...heuristics import isin as cost
from .._common import cdiv, flat, needs_int64
from .call import IsinCall, _prepared_call
from .common import TritonBackend, _value_key, check_config, plan_launcher


# N is never specialised: with N == 1 folded in, triton 3.6's coalescing pass crashes on this kernel
# (an assertion in TritonGPUCoalesce; tools/compile_check.py --edges finds it).
@triton.jit(do_not_specialize=["N"])
def _search_kernel(x_ptr, sorted_ptr, out_ptr, M, N,
                   invert: tl.constexpr, block_size: tl.constexpr, offsets_64bit: tl.constexpr):
    pid = tl.program_id(0)
    if offsets_64bit:
        pid = pid.to(tl.int64)
    offs = pid * block_size + tl.arange(0, block_size)
    ok = offs < M
    x, x_nan = _value_key(tl.load(x_ptr + offs, mask=ok))
    # Branchless lower bound: the window [base, base + n) halves each step for every lane alike,
    # so the loop has the same trip count (ceil(log2 N)) everywhere and no divergence; N is not a
    # compile-time constant, so one compiled kernel serves every size. The first steps read the
    # same few addresses from every lane, which stay in L1.
    base = tl.zeros([block_size], dtype=tl.int64 if offsets_64bit else tl.int32)
    n = N
    while n > 1:
        half = n // 2
        probe = _value_key(tl.load(sorted_ptr + base + half))[0]
        base = tl.where(probe < x, base + half, base)
        n = n - half
    first = _value_key(tl.load(sorted_ptr + base))[0]
    # lower_bound is base + (first < x); it is a hit if in range and equal (NaN never is).
    after = base + 1
    second = _value_key(tl.load(sorted_ptr + after, mask=(first < x) & (after < N)))[0]
    found = ((first == x) | ((first < x) & (after < N) & (second == x))) & ~x_nan
    tl.store(out_ptr + offs, found != invert, mask=ok)


@dataclass(frozen=True, eq=False)
class SearchPlan:
    """One search launch: the Launcher's spec and the cost model's input."""

    dtype: torch.dtype  # of elements and the sorted test set
    elements: int  # M, a runtime argument Triton specialises
    invert: bool  # isin(..., invert=True)
    block_size: int  # elements per program
    offsets_64bit: bool  # offsets past 2**31 elements
    num_warps: int


_SEARCH = plan_launcher(_search_kernel)

#: The keys of a search config (the plan's fields of those names).
CONFIG_KEYS = frozenset({"block_size", "num_warps"})


class SearchBackend(TritonBackend):
    name = "search"
    estimate = staticmethod(cost.search)

    def configs(self, call: IsinCall) -> list[dict]:
        return [{"block_size": 1024, "num_warps": 4}, {"block_size": 512, "num_warps": 4},
                {"block_size": 2048, "num_warps": 8}]

    def _prepared(self, plan, call: IsinCall):
        """The prepared call (call._prepared_call): sort the test set, then one launch."""
        m, n = call.m, call.n
        launch = _SEARCH.bind(plan, (cdiv(m, plan.block_size),), call.info.index)
        # torch.sort sorts along the last dim: the test set goes to it as one flat dim.
        test = call.test
        read_test = None if test.dim() == 1 and test.is_contiguous() else flat

        floating = test.dtype.is_floating_point

        def launches(x: torch.Tensor, t: torch.Tensor, out: torch.Tensor) -> None:
            if floating:
                # The search needs every NaN last, and torch.sort on CUDA (a radix sort of the
                # bits) puts a NaN whose sign bit is set first: elements equal to the smallest
                # test value were then missed (torch's own float -> bfloat16 copy makes such
                # NaNs). Every NaN made the positive one first (infinities stay as they are).
                t = t.nan_to_num(nan=math.nan, posinf=math.inf, neginf=-math.inf)
            table = torch.sort(t).values
            # N (the binary search's length) is not specialised: the kernel says
            # do_not_specialize.
            launch(x, table, out, m, n)

        return _prepared_call(call, read_test, launches)

    def plan_facts(self, call: IsinCall) -> tuple:
        return call.elements.dtype, call.m, call.invert, needs_int64(call.m, call.n)

    def make_plan(self, call: IsinCall, config, sms: int) -> SearchPlan:
        check_config(f"isin {self.name}", config, CONFIG_KEYS)
        return SearchPlan(call.elements.dtype, call.m, call.invert, config["block_size"],
                          needs_int64(call.m, call.n), config["num_warps"])
