"""softmax's multirow backend: a tile of many short rows per program."""

from __future__ import annotations

import torch

from ...dispatch.backend import Backend, Estimate
from ...heuristics import softmax as cost
from .._common import next_pow2
from .autograd import _run
from .call import SoftmaxCall
from .common import MULTIROW_MAX, _rows_fwd, _rows_reason


class MultirowBackend(Backend):
    name = "multirow"

    def supports(self, call: SoftmaxCall) -> str | None:
        reason = _rows_reason(call)
        if reason is None and call.n > MULTIROW_MAX:
            reason = f"rows of {call.n} elements; multirow packs rows of at most {MULTIROW_MAX}"
        return reason

    def configs(self, call: SoftmaxCall) -> list[dict]:
        bn = next_pow2(call.n)
        # ~4K elements per tile (16 KB of float32): enough bytes in flight per program.
        br = max(1, (2048 if call.f64 else 4096) // bn)
        return [{"BLOCK_R": br, "num_warps": 4, "NUM_STAGES": 2},
                {"BLOCK_R": 2 * br, "num_warps": 8, "NUM_STAGES": 2},
                {"BLOCK_R": max(1, br // 2), "num_warps": 4, "NUM_STAGES": 2},
                {"BLOCK_R": br, "num_warps": 4, "NUM_STAGES": 1}]

    def run(self, call: SoftmaxCall, config) -> torch.Tensor:
        return _run(call, lambda c: self._forward(c, config)(c.x))

    def bind(self, call: SoftmaxCall, config):
        return None if call.grad or call.numel == 0 else self._forward(call, config)

    @staticmethod
    def _forward(call: SoftmaxCall, config):
        return _rows_fwd(call, config["BLOCK_R"], config["num_warps"], config["NUM_STAGES"])

    def cost(self, call: SoftmaxCall, model) -> Estimate:
        return cost.multirow(call, model)
