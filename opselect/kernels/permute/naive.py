"""permute's naive backend: one thread per output element, its source offset computed from the
index (divmods over the simplified dims)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ...heuristics import permute as cost
from .._common import cdiv, needs_int64
from .call import MAX_DIMS, PermuteCall
from .common import (UNIT_DTYPES, _offset, _padded, _prepared_copy, _TritonBackend, plan_launcher,
                     check_config)


@triton.jit
def _naive_kernel(src, dst, numel,
                  n0, t0, n1, t1, n2, t2, n3, t3, n4, t4, n5, t5, n6, t6, n7, t7,
                  dims: tl.constexpr, unit_width: tl.constexpr, block: tl.constexpr,
                  offsets_64bit: tl.constexpr):
    pid = tl.program_id(0)
    if offsets_64bit:
        pid = pid.to(tl.int64)
    o = pid * block + tl.arange(0, block)
    ok = o < numel
    s = _offset(o, n0, t0, n1, t1, n2, t2, n3, t3, n4, t4, n5, t5, n6, t6, n7, t7, dims)
    if unit_width == 1:
        tl.store(dst + o, tl.load(src + s, mask=ok), mask=ok)
    else:
        # A 16-byte element is 2 int64 units: the pair is contiguous and starts at an even unit,
        # which the [block, unit_width] shape and the factor make visible: one 16-byte access.
        w = tl.arange(0, unit_width)
        v = tl.load(src + (s * unit_width)[:, None] + w[None, :], mask=ok[:, None])
        tl.store(dst + (o * unit_width)[:, None] + w[None, :], v, mask=ok[:, None])


# Bound launches (kernels/_common.py): Triton binds a kernel's arguments once per spec, later calls
# go straight to the compiled kernel. A spec is the unit dtype (which fixes both pointers'), every
# integer argument, the constexprs and the warps.
@dataclass(frozen=True, eq=False)
class NaivePlan:
    """One naive launch: the Launcher's spec and constexpr source (naive_plan: one object per
    distinct launch)."""

    dtype: torch.dtype  # of the units moved (the elements, or wider words)
    ints: tuple  # every integer argument: units, then (size, stride) of each dim, padded
    dims: int  # dims left after simplification
    unit_width: int  # units per element
    block: int  # units per program
    offsets_64bit: bool  # offsets past 2**31
    num_warps: int

    @property
    def grid(self) -> tuple[int]:
        return (cdiv(self.ints[0], self.block),)  # a program per block of units


naive_plan = functools.lru_cache(maxsize=4096)(NaivePlan)

_NAIVE = plan_launcher(_naive_kernel)

#: The keys of a naive config (the plan's fields of those names).
CONFIG_KEYS = frozenset({"block", "num_warps"})


class NaiveBackend(_TritonBackend):
    name = "naive"
    estimate = staticmethod(cost.naive)

    def configs(self, call: PermuteCall) -> list[dict]:
        return [{"block": 1024, "num_warps": 4}, {"block": 2048, "num_warps": 8},
                {"block": 512, "num_warps": 4}]

    def make_plan(self, call: PermuteCall, config, sms: int) -> NaivePlan:
        check_config(f"permute {self.name}", config, CONFIG_KEYS)
        w = call.W
        sizes, strides = call.sizes or [1], call.strides or [1]
        n = call.numel * call.input.element_size() // call.esize
        ints = (n, *_padded(list(zip(reversed(sizes), reversed(strides))), MAX_DIMS))
        nd, i64, warps = len(sizes), needs_int64(n * w, call.span * w), config["num_warps"]
        return naive_plan(UNIT_DTYPES[call.unit], ints, nd, w, config["block"], i64, warps)

    def _prepared(self, plan: NaivePlan, call: PermuteCall):
        return _prepared_copy(call, _NAIVE.bind(plan, plan.grid, call.info.index), plan.ints)
