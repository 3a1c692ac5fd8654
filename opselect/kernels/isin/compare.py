"""isin's compare backend: every element against every test element in one fused kernel."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ...heuristics import isin as cost
from .._common import cdiv, needs_int64, next_pow2
from .call import IsinCall, _prepared_call, _reader
from .common import TritonBackend, _value_key, check_config, plan_launcher


@triton.jit
def _compare_kernel(x_ptr, t_ptr, out_ptr, M, N, invert: tl.constexpr, block_size: tl.constexpr,
                    test_tile: tl.constexpr, unrolled_length: tl.constexpr,
                    offsets_64bit: tl.constexpr):
    pid = tl.program_id(0)
    if offsets_64bit:
        pid = pid.to(tl.int64)
    offs = pid * block_size + tl.arange(0, block_size)
    ok = offs < M
    x, x_nan = _value_key(tl.load(x_ptr + offs, mask=ok))
    # Keys are equal exactly when the values are (-0.0 matches 0.0); NaN lanes are dropped last.
    if test_tile == 1 and unrolled_length > 0:
        # A tiny test set (N <= unrolled_length): the loop is unrolled, so its scalar loads are
        # independent straight-line code the compiler issues together, and a program waits for
        # memory once instead of once per test element. Indices past N re-read the last test
        # element, which changes no answer and needs no mask.
        found = tl.zeros([block_size], dtype=tl.int1)
        last = N - 1
        for j in tl.static_range(unrolled_length):
            found = found | (x == _value_key(tl.load(t_ptr + tl.minimum(last, j)))[0])
    elif test_tile == 1:
        # Many elements: each test element is one scalar load, the same address for every lane
        # (a broadcast from L1), then one compare and one or per element.
        found = tl.zeros([block_size], dtype=tl.int1)
        for j in range(0, N):
            found = found | (x == _value_key(tl.load(t_ptr + j))[0])
    else:
        # Few elements (few programs): a [block_size, test_tile] tile of comparisons per step, so
        # each program walks the test set test_tile elements at a time instead of one.
        hit = tl.zeros([block_size, test_tile], dtype=tl.int1)
        for start in range(0, N, test_tile):
            cols = start + tl.arange(0, test_tile)
            t = _value_key(tl.load(t_ptr + cols, mask=cols < N))[0]
            hit = hit | ((x[:, None] == t[None, :]) & (cols < N)[None, :])
        found = tl.max(hit.to(tl.int8), axis=1) > 0
    found = found & ~x_nan
    tl.store(out_ptr + offs, found != invert, mask=ok)


@dataclass(frozen=True, eq=False)
class ComparePlan:
    """One compare launch: the Launcher's spec (every value the kernel is specialised on) and the
    cost model's input."""

    dtype: torch.dtype  # of elements and test_elements (one compiled kernel per dtype)
    elements: int  # M, a runtime argument Triton specialises (divisible by 16? one?)
    test_elements: int  # N, likewise
    invert: bool  # isin(..., invert=True)
    block_size: int  # elements per program
    test_tile: int  # test elements compared at once: 1 streams the set, more tile it
    unrolled_length: int  # the test set padded to a power of two for the unrolled loop (0: a loop)
    offsets_64bit: bool  # offsets past 2**31 elements
    num_warps: int


# Bound launches (kernels/_common.py): Triton binds a kernel's arguments once per plan, later
# calls go straight to the compiled kernel.
_COMPARE = plan_launcher(_compare_kernel)

#: The keys of a compare config (the plan's fields of those names).
CONFIG_KEYS = frozenset({"block_size", "test_tile", "num_warps"})


class CompareBackend(TritonBackend):
    name = "compare"
    estimate = staticmethod(cost.compare)
    MAX_N = 4096  # beyond this the O(M * N) work is never competitive; keep tuning short
    # Test sets up to this size are walked by an unrolled loop (one compiled variant per power of
    # two, so at most 7).
    MAX_UNROLL = 64

    def supports(self, call: IsinCall) -> str | None:
        if call.n > self.MAX_N:
            return f"test_elements has {call.n} elements; compare is for at most {self.MAX_N}"
        return None

    def configs(self, call: IsinCall) -> list[dict]:
        streaming = [{"block_size": 2048, "test_tile": 1, "num_warps": 8},
                     {"block_size": 1024, "test_tile": 1, "num_warps": 4}]
        tiled = [{"block_size": 64, "test_tile": 64, "num_warps": 4},
                 {"block_size": 128, "test_tile": 32, "num_warps": 4}]
        # Too few blocks of 1024 to fill the GPU, and a test set worth splitting: tiles first.
        # From about one block of 1024 per SM streaming measured faster whatever the test set
        # (benchmarks/results/h200/fits/isin.md, "compare: tiles or streaming first").
        if cdiv(call.m, 1024) < call.info.sm_count and call.n > 32:
            return tiled + streaming
        return streaming + tiled

    def _prepared(self, plan, call: IsinCall):
        """The prepared call (call._prepared_call): one launch over the flat inputs."""
        m, n = call.m, call.n
        launch = _COMPARE.bind(plan, (cdiv(m, plan.block_size),), call.info.index)

        def launches(x: torch.Tensor, t: torch.Tensor, out: torch.Tensor) -> None:
            launch(x, t, out, m, n)

        return _prepared_call(call, _reader(call.test), launches)

    def make_plan(self, call: IsinCall, config, sms: int) -> ComparePlan:
        check_config(f"isin {self.name}", config, CONFIG_KEYS)
        n = call.n
        return ComparePlan(call.elements.dtype, call.m, n, call.invert, config["block_size"],
                           config["test_tile"], next_pow2(n) if n <= self.MAX_UNROLL else 0,
                           needs_int64(call.m), config["num_warps"])
