"""topk's sort backend: torch.sort of the rows, then the first k."""

from __future__ import annotations

import math

import torch

from ...dispatch.backend import Backend
from ...heuristics import topk as cost
from .call import TopkCall, _bind, _trivial


# ---------------------------------------------------------------------------------------------
# sort
# ---------------------------------------------------------------------------------------------
class SortBackend(Backend):
    name = "sort"
    estimate = staticmethod(cost.sort)
    uses_triton = False

    def supports(self, call: TopkCall) -> str | None:
        return None

    def run(self, call: TopkCall, config):
        # torch.sort records autograd itself: no gather of the values again, unlike _run.
        done = _trivial(call)
        return self._prepared(call, config)(call.input) if done is None else done

    def bind(self, call: TopkCall, config):
        return _bind(call, self._prepared, config)

    @staticmethod
    def _prepared(call: TopkCall, config):
        """The prepared call (see Backend.bind): a function of the input."""
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
