"""topk's sort backend: torch.sort of the rows, then the first k."""

from __future__ import annotations

import torch

from ...dispatch.backend import Backend
from ...heuristics import topk as cost
from .call import TopkCall, _trivial


# ---------------------------------------------------------------------------------------------
# sort
# ---------------------------------------------------------------------------------------------
def _sort_topk(call: TopkCall):
    done = _trivial(call)
    if done is not None:
        return done
    # torch.sort orders NaN above every number, as topk does (first when descending).
    values, indices = torch.sort(call.input, dim=call.dim, descending=call.largest)
    values = values.narrow(call.dim, 0, call.k).contiguous()
    indices = indices.narrow(call.dim, 0, call.k).contiguous()
    return torch.return_types.topk((values, indices))


class SortBackend(Backend):
    name = "sort"
    estimate = staticmethod(cost.sort)
    uses_triton = False

    def supports(self, call: TopkCall) -> str | None:
        return None

    def run(self, call: TopkCall, config):
        return _sort_topk(call)
