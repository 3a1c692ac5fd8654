"""isin's search backend: sort the test elements, then a branchless lower-bound search per element."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...dispatch.backend import Backend, Estimate
from ...heuristics import isin as cost
from .._common import Launcher, cdiv, flat, needs_int64
from .call import IsinCall, _finish, _output, _trivial
from .common import _value_key


# N is never specialised: with N == 1 folded in, triton 3.6's coalescing pass crashes on this kernel
# (an assertion in TritonGPUCoalesce; tools/compile_check.py --edges finds it).
@triton.jit(do_not_specialize=["N"])
def _search_kernel(x_ptr, sorted_ptr, out_ptr, M, N,
                   INVERT: tl.constexpr, BLOCK: tl.constexpr, I64: tl.constexpr):
    pid = tl.program_id(0)
    if I64:
        pid = pid.to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    ok = offs < M
    x, x_nan = _value_key(tl.load(x_ptr + offs, mask=ok))
    # Branchless lower bound: the window [base, base + n) halves each step for every lane alike,
    # so the loop has the same trip count (ceil(log2 N)) everywhere and no divergence; N is not a
    # compile-time constant, so one compiled kernel serves every size. The first steps read the
    # same few addresses from every lane, which stay in L1.
    base = tl.zeros([BLOCK], dtype=tl.int64 if I64 else tl.int32)
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
    tl.store(out_ptr + offs, found != INVERT, mask=ok)


_SEARCH = Launcher(_search_kernel)


class SearchBackend(Backend):
    name = "search"

    def configs(self, call: IsinCall) -> list[dict]:
        return [{"BLOCK": 1024, "num_warps": 4}, {"BLOCK": 512, "num_warps": 4},
                {"BLOCK": 2048, "num_warps": 8}]

    def run(self, call: IsinCall, config) -> torch.Tensor:
        done = _trivial(call)
        if done is not None:
            return done
        x = flat(call.elements)
        table = torch.sort(flat(call.test)).values  # NaN sorts last: below it nothing is skipped
        out = _output(call)
        block, warps = config["BLOCK"], config["num_warps"]
        m, n, invert = call.m, call.n, call.invert
        i64 = needs_int64(m, n)
        _SEARCH((x.dtype, m, invert, block, i64, warps), (cdiv(m, block),),
                (x, table, out, m, n),
                lambda: dict(INVERT=invert, BLOCK=block, I64=i64, num_warps=warps))
        return _finish(call, out)

    def cost(self, call: IsinCall, model) -> Estimate:
        return cost.search(call, model)
