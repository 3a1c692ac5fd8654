"""A new op from outside opselect: vector_add(a, b) = a + b, by torch, `plain` (a block of
elements per program) or `persistent` (a program or two per SM, looping over wider blocks).
Run it: `python examples/vector_add.py` (on a CPU: `TRITON_INTERPRET=1 python ...`);
docs/EXTENDING.md walks through it."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

import opselect
from opselect.errors import InvalidArgument, UnsupportedDType

NAME = "vector_add"
FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class AddCall(opselect.Call):
    """One call, prepared: the two inputs and what selection keys on."""
    __slots__ = ("a", "b", "n")

    @property
    def empty(self) -> bool:
        return self.n == 0

    def empty_result(self) -> torch.Tensor:
        return torch.empty_like(self.a, memory_format=torch.contiguous_format)

    def describe(self) -> str:  # (explain's title)
        return f"{tuple(self.a.shape)} {self.a.dtype} on {self.a.device}"


def prepare(a: torch.Tensor, b: torch.Tensor) -> AddCall:
    """torch's rules, minus broadcasting and promotion (this op takes neither)."""
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor) or t.dtype not in FLOATS:
            raise UnsupportedDType(f"{NAME}: {name} must be a floating-point tensor, got "
                                   f"{getattr(t, 'dtype', type(t).__name__)}")
    if b.shape != a.shape or b.dtype != a.dtype or b.device != a.device:
        raise InvalidArgument(f"{NAME}: b is {tuple(b.shape)} {b.dtype} on {b.device}, but a is "
                              f"{tuple(a.shape)} {a.dtype} on {a.device}; they must match")
    call = AddCall()
    # The kernels read flat memory: a non-contiguous input is copied once, here.
    call.a, call.b, call.n = a.contiguous(), b.contiguous(), a.numel()
    call.info = opselect.device_info(a.device)
    call.key = (a.device, a.dtype, opselect.bucket(call.n))  # one decision per size bucket
    call.exact = (a.device, a.dtype, call.n)
    return call


@triton.jit
def _sum(a, b):
    # 16-bit floats add in float32 and round once, as torch does (the interpreter cannot add
    # bfloat16 at all). The branch is on a compile-time dtype: one kernel per dtype.
    if a.dtype == tl.float64:
        total = a + b
    else:
        total = (a.to(tl.float32) + b.to(tl.float32)).to(a.dtype)
    return total


@triton.jit
def _add_block(a_ptr, b_ptr, out_ptr, n, block_size: tl.constexpr):
    offsets = tl.program_id(0) * block_size + tl.arange(0, block_size)
    mask = offsets < n
    tl.store(out_ptr + offsets, _sum(tl.load(a_ptr + offsets, mask=mask),
                                     tl.load(b_ptr + offsets, mask=mask)), mask=mask)


@triton.jit
def _add_persistent(a_ptr, b_ptr, out_ptr, n, blocks_per_program, block_size: tl.constexpr):
    # Grid-stride: neighbouring programs take neighbouring blocks, so each step reads one
    # contiguous span across the whole grid.
    programs = tl.num_programs(0)
    for i in range(blocks_per_program):
        offsets = (tl.program_id(0) + i * programs) * block_size + tl.arange(0, block_size)
        mask = offsets < n
        tl.store(out_ptr + offsets, _sum(tl.load(a_ptr + offsets, mask=mask),
                                         tl.load(b_ptr + offsets, mask=mask)), mask=mask)


@dataclass(frozen=True, eq=False)  # (a launch's spec; memoised, so hashed by identity)
class AddPlan:
    dtype: torch.dtype  # of a, b and the output (each dtype compiles its own kernel)
    n: int  # elements: a runtime argument Triton specialises on, so part of the launch's spec
    block_size: int  # elements per program and step
    num_warps: int
    programs: int  # the grid
    blocks_per_program: int  # the persistent kernel's steps (1 for plain)


_PLAIN = opselect.plan_launcher(_add_block)
_PERSISTENT = opselect.plan_launcher(_add_persistent)


class _AddBackend(opselect.PlannedBackend):
    def supports(self, call: AddCall) -> str | None:  # None, or why not (explain shows it)
        return "more than 2**31 elements (32-bit offsets)" if call.n >= 2**31 - 2**20 else None

    def plan_facts(self, call: AddCall) -> tuple:  # what the plan depends on (plans are memoised)
        return call.a.dtype, call.n

    def _launch(self, plan: AddPlan, call: AddCall) -> torch.Tensor:
        out = opselect.allocator(call.a.shape, call.a.dtype, call.a.device)()
        self.add(plan, call.a, call.b, out)
        return out

    def cost(self, call: AddCall, model) -> opselect.Estimate:
        # a, b and out stream through memory once; the host launches a kernel and allocates out.
        return model.estimate(NAME, self.name, triton=True,
                              launch=model.launch + opselect.ALLOCATION,
                              memory=model.stream(3 * call.n * call.a.element_size()))


class Plain(_AddBackend):
    name = "plain"

    def configs(self, call):  # the first is the default; tuning tries them all
        return [{"block_size": 1024, "num_warps": 4}, {"block_size": 2048, "num_warps": 8}]

    def make_plan(self, call: AddCall, config, sms: int) -> AddPlan:
        return AddPlan(call.a.dtype, call.n, config["block_size"], config["num_warps"],
                       opselect.cdiv(call.n, config["block_size"]), 1)

    def add(self, plan: AddPlan, a, b, out) -> None:
        _PLAIN(plan, (plan.programs,), (a, b, out, plan.n))


class Persistent(_AddBackend):
    name = "persistent"

    def configs(self, call):
        return [{"block_size": 4096, "num_warps": 8, "programs_per_sm": 2},
                {"block_size": 8192, "num_warps": 8, "programs_per_sm": 1}]

    def make_plan(self, call: AddCall, config, sms: int) -> AddPlan:
        blocks = opselect.cdiv(call.n, config["block_size"])
        programs = max(1, min(blocks, sms * config["programs_per_sm"]))
        return AddPlan(call.a.dtype, call.n, config["block_size"], config["num_warps"],
                       programs, opselect.cdiv(blocks, programs))

    def add(self, plan: AddPlan, a, b, out) -> None:
        _PERSISTENT(plan, (plan.programs,), (a, b, out, plan.n, plan.blocks_per_program))


def _torch_cost(call: AddCall, model) -> opselect.Estimate:
    return model.estimate(NAME, "torch", triton=False, launch=model.torch_launch,
                          memory=model.stream(3 * call.n * call.a.element_size()))


VECTOR_ADD = opselect.register_op(opselect.Op(NAME, prepare, [
    opselect.TorchBackend(lambda call: torch.add(call.a, call.b), _torch_cost),
    Plain(), Persistent(),
], replay=lambda call: ((call.a, call.b), {})))  # (tuning replays a call in a helper process)


def vector_add(a: torch.Tensor, b: torch.Tensor, *, backend: str | None = None) -> torch.Tensor:
    """a + b for two float tensors of one shape, dtype and device, by the fastest backend."""
    return VECTOR_ADD(a, b, backend=backend)


if __name__ == "__main__":
    device = "cuda" if torch.cuda.is_available() else "cpu"
    a, b = (torch.randn(10_000, device=device) for _ in range(2))
    assert torch.equal(vector_add(a, b), a + b)  # auto selection
    assert torch.equal(vector_add(a, b, backend="persistent"), a + b)  # forced
    opselect.explain(NAME, a, b)  # every candidate, its predicted time, the choice
