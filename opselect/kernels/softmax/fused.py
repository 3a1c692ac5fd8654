"""softmax's fused backend: a row held in registers, one read and one write per element."""

from __future__ import annotations

from ...dispatch.backend import Estimate
from ...heuristics import softmax as cost
from .._common import next_pow2
from .autograd import ForwardBackend
from .call import SoftmaxCall
from .common import _rows_fwd, _rows_reason, _warps, rows_fwd_plan


# Longest row the fused backend holds in registers (16 warps x 32 threads x 64 values).
FUSED_MAX = 32768


FUSED_MAX_F64 = 16384


#: The keys of fused's configs.
CONFIG_KEYS = frozenset({"num_warps", "pipeline_stages"})


class FusedBackend(ForwardBackend):
    name = "fused"
    CONFIG_KEYS = CONFIG_KEYS

    @staticmethod
    def limit(call: SoftmaxCall) -> int:
        return FUSED_MAX_F64 if call.f64 else FUSED_MAX

    def supports(self, call: SoftmaxCall) -> str | None:
        reason = _rows_reason(call)
        if reason is None and call.n > self.limit(call):
            reason = (f"rows of {call.n} elements do not fit in registers (fused takes at most "
                      f"{self.limit(call)}); online takes longer rows")
        return reason

    def configs(self, call: SoftmaxCall) -> list[dict]:
        bn = next_pow2(call.n)
        w = _warps(bn)
        stages = 2 if bn * call.in_bytes <= 32 * 1024 else 1
        cfgs = [{"num_warps": w, "pipeline_stages": stages},
                {"num_warps": min(32, 2 * w), "pipeline_stages": stages},
                {"num_warps": max(1, w // 2), "pipeline_stages": stages},
                {"num_warps": w, "pipeline_stages": 3 - stages}]
        return [c for i, c in enumerate(cfgs) if c not in cfgs[:i]]

    @staticmethod
    def forward_plan(call: SoftmaxCall, config, sms: int):
        return rows_fwd_plan(call, 1, config["num_warps"], config["pipeline_stages"], sms)

    @staticmethod
    def _forward(plan, call: SoftmaxCall):
        return _rows_fwd(plan, call)

    def cost(self, call: SoftmaxCall, model) -> Estimate:
        return cost.fused(call, model, warps=self.configs(call)[0]["num_warps"])
