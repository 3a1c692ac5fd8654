"""The ops under torch's function transforms: forward-mode AD, torch.func (vmap, jvp, grad,
jacrev, ...) and reverse-mode autograd where the plain path does not record it (permute). This
module holds what the ops share (watched(), the batching helpers); each op's autograd.Function
is in its front, opselect/fronts/<op>.py.

The kernels read tensors' memory, which a dual tensor has but a functorch wrapper (the
TensorWrapper of torch.func.jvp / grad, the BatchedTensor of vmap) does not. So a call that a
transform is watching goes through the op's torch.autograd.Function, which gives torch the rules
it needs and runs the kernels on plain tensors only. It is one Function per op: the same class is
the Autograd kernel of the op's torch.library op (what compiled graphs run), where its forward
runs the library op below autograd instead (its `library` argument):

  forward   the dispatcher's choice (or the forced backend) on the unwrapped tensors; torch.func
            calls it one level down, where the tensors are plain (setup_context style)
  jvp       the tangent of the outputs, in torch ops (softmax: y * (t - sum(y * t));
            log_softmax: t - sum(exp(y) * t); topk: the tangent gathered at the indices; permute:
            the tangent permuted); isin has none (a bool output)
  backward  the same rules transposed, in torch ops (differentiable, so double backward and
            torch.func.grad of grad work); softmax's, where no graph of the backward is wanted
            and the gradient is a plain tensor, runs its fused kernels (opselect.softmax_backward)
  vmap      the batch dim becomes one more leading dim of the op's own input (a softmax dim, a
            topk dim and permute's dims shift by one); isin with a batched test set runs each
            batch's test set in turn (the test set is not an elementwise argument). One helper
            per op makes the Function's rule and the library op's (register_vmap), given what
            runs the batch: the Function again, or the library op

ops.* take this path only while a transform is active (`watched()`: a functorch level, or a
forward-AD dual level holding a dual input), or for a permute that records autograd; every
other call keeps the hot path (two global reads added).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.autograd.forward_ad as _fwad

from .errors import BackendError

_functorch_active = torch._C._are_functorch_transforms_active


def watched(*tensors: Any) -> bool:
    """Whether a transform watches this call: torch.func is running a transform, or a
    forward-AD dual level is open and an argument carries a tangent."""
    if _functorch_active():
        return True
    if _fwad._current_level < 0:
        return False
    for t in tensors:
        if isinstance(t, torch.Tensor) and _fwad.unpack_dual(t).tangent is not None:
            return True
    return False


def _bdim_first(x: torch.Tensor, bdim: Optional[int]) -> torch.Tensor:
    return x if bdim in (None, 0) else x.movedim(bdim, 0)


def batched(whole, one, batch: int):
    """whole(): the op on the batch as one call; where a forced backend cannot take that call
    (it takes a sample's layout, not the batch's), one(b) per sample (made contiguous),
    stacked."""
    try:
        return whole()
    except BackendError:
        if batch == 0:
            raise
    rows = [one(b) for b in range(batch)]
    if isinstance(rows[0], tuple):
        return tuple(torch.stack(parts) for parts in zip(*rows))
    return torch.stack(rows)
