"""softmax's multirow backend: a tile of many short rows per program."""

from __future__ import annotations

from ...dispatch.backend import Estimate
from ...heuristics import softmax as cost
from .._common import next_pow2
from .autograd import ForwardBackend
from .call import SoftmaxCall
from .common import MULTIROW_MAX, _rows_fwd, _rows_reason, rows_fwd_plan


#: The keys of multirow's configs.
CONFIG_KEYS = frozenset({"rows_per_tile", "num_warps", "pipeline_stages"})


class MultirowBackend(ForwardBackend):
    name = "multirow"
    CONFIG_KEYS = CONFIG_KEYS

    def supports(self, call: SoftmaxCall) -> str | None:
        reason = _rows_reason(call)
        if reason is None and call.n > MULTIROW_MAX:
            reason = f"rows of {call.n} elements; multirow packs rows of at most {MULTIROW_MAX}"
        return reason

    def configs(self, call: SoftmaxCall) -> list[dict]:
        bn = next_pow2(call.n)
        # ~4K elements per tile (16 KB of float32): enough bytes in flight per program.
        br = max(1, (2048 if call.f64 else 4096) // bn)
        return [{"rows_per_tile": br, "num_warps": 4, "pipeline_stages": 2},
                {"rows_per_tile": 2 * br, "num_warps": 8, "pipeline_stages": 2},
                {"rows_per_tile": max(1, br // 2), "num_warps": 4, "pipeline_stages": 2},
                {"rows_per_tile": br, "num_warps": 4, "pipeline_stages": 1}]

    @staticmethod
    def forward_plan(call: SoftmaxCall, config, sms: int):
        return rows_fwd_plan(call, config["rows_per_tile"], config["num_warps"],
                             config["pipeline_stages"], sms)

    @staticmethod
    def _forward(plan, call: SoftmaxCall):
        return _rows_fwd(plan, call)

    def cost(self, call: SoftmaxCall, model) -> Estimate:
        return cost.multirow(call, model)
