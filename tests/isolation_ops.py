"""A test-only op whose backends misbehave, for tests/test_isolation.py (imported by the test and
by tuning's first-run process, which finds it through the op's prepare() module)."""

from __future__ import annotations

import os

import torch

from opselect.dispatch import Backend, Estimate, TorchBackend
from opselect.dispatch.device import device_info
from opselect.dispatch.op import Call, Op, register

NAME = "misbehaving_for_tests"


class DoubleCall(Call):
    __slots__ = ("x",)


def prepare(x: torch.Tensor) -> DoubleCall:
    call = DoubleCall()
    call.x, call.info = x, device_info(x.device)
    call.key = call.exact = (x.device, x.dtype, tuple(x.shape))
    return call


class _Cheap(Backend):
    uses_triton = False

    def cost(self, call, model) -> Estimate:
        return Estimate(1e-9)  # the model's favourite: only measuring can rank it


class Aborts(_Cheap):
    name = "aborts"

    def run(self, call, config):
        os.abort()


class Raises(_Cheap):
    name = "raises"

    def run(self, call, config):
        raise RuntimeError("this backend always fails")


class Doubles(Backend):
    name = "doubles"
    uses_triton = False

    def run(self, call, config):
        return call.x + call.x

    def cost(self, call, model) -> Estimate:
        return Estimate(1e-3)


class Fussy(Backend):
    """Its first config, in the helper process only, scribbles over its input and floods fd 1 (as
    a driver or compiler might); its later configs abort unless their input is the call's
    `arange`: each config must get pristine inputs and a reply channel of its own."""

    name = "fussy"
    uses_triton = False

    def configs(self, call):
        return [{"scribble": True}, {"scribble": False}, {"scribble": False}]

    def run(self, call, config):
        in_helper = os.environ.get("OPSELECT_TUNE") == "0"  # what the helper process is started with
        if in_helper and config["scribble"]:
            call.x.fill_(float("nan"))
            os.write(1, b"noise on fd 1 " * 20_000)
        elif in_helper and not torch.equal(call.x, torch.arange(call.x.numel(), dtype=call.x.dtype)):
            os.abort()
        return call.x + call.x

    def cost(self, call, model) -> Estimate:
        return Estimate(2e-3)


class Reports(_Cheap):
    """Writes what its process looks like (working directory, isolated mode, environment, import
    path) as JSON to $OPSELECT_TEST_REPORT, then answers: how the helper is started, seen from
    inside it."""

    name = "reports"

    def run(self, call, config):
        import json
        import sys

        path = os.environ.get("OPSELECT_TEST_REPORT")
        if path:
            with open(path, "w") as f:
                json.dump({"cwd": os.getcwd(), "isolated": sys.flags.isolated,
                           "env": sorted(os.environ), "path": sys.path}, f)
        return call.x + call.x


def sample(shapes, dtype, options, device):
    return (torch.randn(shapes[0], device=device).to(dtype),), {}


OP = register(Op(NAME, prepare, [
    TorchBackend(lambda call: call.x * 2, lambda call, model: Estimate(1e-3)),
    Aborts(), Raises(), Doubles(), Fussy(), Reports(),
], sample=sample, replay=lambda call: ((call.x,), {})))
