"""A backend added to one of opselect's ops from outside opselect: isin by broadcast compare.

Every element is compared with every test element at once (a block of elements against the
whole test set, held in registers): for test sets of up to 64 integers. docs/EXTENDING.md
walks through it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

import opselect

MAX_TEST = 64


@triton.jit
def _broadcast_isin(x_ptr, test_ptr, out_ptr, m, n,
                    invert: tl.constexpr, block_size: tl.constexpr, test_size: tl.constexpr):
    offsets = tl.program_id(0) * block_size + tl.arange(0, block_size)
    x = tl.load(x_ptr + offsets, mask=offsets < m)
    lanes = tl.arange(0, test_size)
    test = tl.load(test_ptr + lanes, mask=lanes < n)
    hits = (x[:, None] == test[None, :]) & (lanes < n)[None, :]  # (padding lanes never match)
    found = tl.max(hits.to(tl.int32), axis=1) > 0
    tl.store(out_ptr + offsets, found != invert, mask=offsets < m)


@dataclass(frozen=True, eq=False)
class BroadcastPlan:
    dtype: torch.dtype
    m: int  # elements (runtime arguments Triton specialises on: part of the launch's spec)
    n: int  # test elements
    invert: bool
    block_size: int
    test_size: int  # the test set padded to a power of two
    num_warps: int


_LAUNCH = opselect.plan_launcher(_broadcast_isin)


class Broadcast(opselect.PlannedBackend):
    """isin's call (kernels/isin/call.py) gives elements, test, invert, m, n and out."""

    name = "broadcast"

    def supports(self, call) -> str | None:
        if call.elements.dtype not in (torch.int32, torch.int64):
            return "int32 and int64 only"
        if call.n > MAX_TEST or call.out is not None:
            return f"more than {MAX_TEST} test elements" if call.out is None else "out="
        return None

    def configs(self, call):
        return [{"block_size": 256, "num_warps": 4}, {"block_size": 128, "num_warps": 4}]

    def plan_facts(self, call) -> tuple:
        return call.elements.dtype, call.m, call.n, call.invert

    def make_plan(self, call, config, sms: int) -> BroadcastPlan:
        return BroadcastPlan(call.elements.dtype, call.m, call.n, call.invert,
                             config["block_size"], max(16, triton.next_power_of_2(call.n)),
                             config["num_warps"])

    def _launch(self, plan: BroadcastPlan, call) -> torch.Tensor:
        out = opselect.allocator(call.elements.shape, torch.bool, call.elements.device)()
        grid = (opselect.cdiv(plan.m, plan.block_size),)
        _LAUNCH(plan, grid, (call.elements.contiguous(), call.test.reshape(-1).contiguous(),
                             out, plan.m, plan.n))
        return out

    def estimate(call, model, plan) -> opselect.Estimate:  # (made a staticmethod below)
        size = call.elements.element_size()
        return model.estimate("isin", "broadcast", triton=True,
                              launch=model.launch + opselect.ALLOCATION,
                              memory=model.stream(call.m * (size + 1)),
                              compares=call.m * plan.test_size * model.compare)

    estimate = staticmethod(estimate)


BROADCAST = opselect.add_backend("isin", Broadcast())
