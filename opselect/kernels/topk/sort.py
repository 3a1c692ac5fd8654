"""topk's sort backend: torch.sort of the rows, then the first k."""

from __future__ import annotations

import math

import torch

from ...dispatch.backend import Backend
from ...heuristics import topk as cost
from .call import TopkCall, _bind, _zero_dim


# ---------------------------------------------------------------------------------------------
# sort
# ---------------------------------------------------------------------------------------------
class SortBackend(Backend):
    name = "sort"
    estimate = staticmethod(cost.sort)
    uses_triton = False

    def supports(self, call: TopkCall) -> str | None:
        return None

    def _launch(self, plan, call: TopkCall):
        # torch.sort records autograd itself: no gather of the values again, unlike the
        # Triton backends' _launch (PreparedRuns).
        return _zero_dim(call) if call.nd == 0 else self._prepared(plan, call)(call.input)

    def bind(self, call: TopkCall, config):
        return _bind(self, call, config)

    @staticmethod
    def _prepared(plan, call: TopkCall):
        """The prepared call (see Backend.bind): a function of the input. (Sort has no plan:
        torch.sort takes the whole row, whatever the config.)"""
        dim, k, largest = call.dim, call.k, call.largest
        if call.input.dtype.is_floating_point:
            def topk_of_floats(x: torch.Tensor):
                # topk counts every NaN as the largest value; torch.sort on CUDA (a radix sort
                # of the bits) puts a NaN whose sign bit is set below every number. The sort
                # sees every NaN made the positive one; the values are read back from x at the
                # indices (the exact bits, and autograd's gather).
                keys = x.detach().nan_to_num(nan=math.nan, posinf=math.inf, neginf=-math.inf)
                indices = torch.sort(keys, dim=dim, descending=largest).indices
                indices = indices.narrow(dim, 0, k).contiguous()
                return torch.return_types.topk((x.gather(dim, indices), indices))

            return topk_of_floats

        def topk(x: torch.Tensor):
            values, indices = torch.sort(x, dim=dim, descending=largest)
            return torch.return_types.topk((values.narrow(dim, 0, k).contiguous(),
                                            indices.narrow(dim, 0, k).contiguous()))

        return topk
