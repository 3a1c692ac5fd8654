"""The ops under torch's function transforms: forward-mode AD, torch.func (vmap, jvp, grad,
jacrev, ...) and reverse-mode autograd where the plain path does not record it (permute).

The kernels read tensors' memory, which a dual tensor has but a functorch wrapper (the
TensorWrapper of torch.func.jvp / grad, the BatchedTensor of vmap) does not. So a call that a
transform is watching goes through one torch.autograd.Function per op, which gives torch the rules
it needs and runs the kernels on plain tensors only:

  forward   the dispatcher's choice (or the forced backend) on the unwrapped tensors; torch.func
            calls it one level down, where the tensors are plain (setup_context style)
  jvp       the tangent of the outputs, in torch ops (softmax: y * (t - sum(y * t));
            log_softmax: t - sum(exp(y) * t); topk: the tangent gathered at the indices; permute:
            the tangent permuted); isin has none (a bool output)
  backward  the same rules transposed, in torch ops (differentiable, so double backward and
            torch.func.grad of grad work)
  vmap      the batch dim becomes one more leading dim of the op's own input (a softmax dim, a
            topk dim and permute's dims shift by one); isin with a batched test set runs each
            batch's test set in turn (the test set is not an elementwise argument)

ops.* take this path only while a transform is active (`watched()`: a functorch level, or a
forward-AD dual level holding a dual input), or for a permute that records autograd; every
other call keeps the hot path (two global reads added).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.autograd.forward_ad as _fwad

from .errors import BackendError
from .kernels import isin as _isin
from .kernels import permute as _permute
from .kernels import softmax as _softmax
from .kernels import topk as _topk

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


# ---------------------------------------------------------------------------------------------
# softmax / log_softmax
# ---------------------------------------------------------------------------------------------
def softmax_tangent(y: torch.Tensor, t: torch.Tensor, dim: int, log: bool) -> torch.Tensor:
    """d softmax(x)[t] (log=False) or d log_softmax(x)[t] from the output y, along dim (0-d:
    the only element is its own row, whose softmax is constant)."""
    if y.dim() == 0:
        return torch.zeros_like(y)
    if log:
        return t - (torch.exp(y) * t).sum(dim, keepdim=True)
    return y * (t - (y * t).sum(dim, keepdim=True))


def softmax_vjp(y: torch.Tensor, g: torch.Tensor, dim: int, log: bool) -> torch.Tensor:
    """The gradient of the input from the output y and its gradient g (the transposed tangent;
    softmax's Jacobian is symmetric, log_softmax's is not)."""
    if y.dim() == 0:
        return torch.zeros_like(g)
    if log:
        return g - torch.exp(y) * g.sum(dim, keepdim=True)
    return y * (g - (g * y).sum(dim, keepdim=True))


class _Softmax(torch.autograd.Function):
    @staticmethod
    def forward(x, dim: int, log: bool, dtype, backend):
        op = _softmax.LOG_SOFTMAX_OP if log else _softmax.SOFTMAX_OP
        prepare = _softmax.prepare_log_softmax if log else _softmax.prepare_softmax
        return op.run(prepare(x, dim, dtype=dtype), backend)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, dim, log, _, _ = inputs
        ctx.dim = dim % max(x.dim(), 1)
        ctx.log = log
        ctx.in_dtype = x.dtype
        ctx.save_for_backward(output)
        ctx.save_for_forward(output)

    @staticmethod
    def jvp(ctx, t, *_):
        (y,) = ctx.saved_tensors
        return softmax_tangent(y, t.to(y.dtype), ctx.dim, ctx.log)

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        dx = softmax_vjp(y, g.to(y.dtype), ctx.dim, ctx.log)
        return dx.to(ctx.in_dtype), None, None, None, None

    @staticmethod
    def vmap(info, in_dims, x, dim, log, dtype, backend):
        x = _bdim_first(x, in_dims[0])
        if in_dims[0] is None:
            return _Softmax.apply(x, dim, log, dtype, backend), None
        rank = x.dim() - 1
        if rank == 0:  # each element its own row
            y = _Softmax.apply(x.unsqueeze(1), 1, log, dtype, backend).squeeze(1)
        else:
            _softmax_dim_check(dim, rank, log)
            y = batched(lambda: _Softmax.apply(x, dim % rank + 1, log, dtype, backend),
                        lambda b: _Softmax.apply(x[b].contiguous(), dim, log, dtype, backend), x.shape[0])
        return y, 0


def _softmax_dim_check(dim: int, rank: int, log: bool) -> None:
    # The logical call's dim rule (prepare would check the shifted dim on the physical tensor).
    prepare = _softmax.prepare_log_softmax if log else _softmax.prepare_softmax
    prepare(torch.empty((1,) * rank, device="meta"), dim)


def softmax(x, dim, log: bool, dtype, backend):
    if not isinstance(x, torch.Tensor):
        # The argument errors as the plain path gives them.
        prepare = _softmax.prepare_log_softmax if log else _softmax.prepare_softmax
        prepare(x, dim, dtype=dtype)
    return _Softmax.apply(x, dim, log, dtype, backend)


# ---------------------------------------------------------------------------------------------
# topk
# ---------------------------------------------------------------------------------------------
def topk_tangent(t: torch.Tensor, indices: torch.Tensor, dim: int) -> torch.Tensor:
    """The values' tangent: the input's tangent at the selected indices."""
    if t.dim() == 0:
        return t.reshape(indices.shape).clone()
    return t.gather(dim, indices)


def topk_vjp(g: torch.Tensor, indices: torch.Tensor, shape, dim: int) -> torch.Tensor:
    """The input's gradient: each selected position gets its value's gradient (one row's
    indices are distinct), every other position 0."""
    if not shape:
        return g.reshape(()).clone()
    return g.new_zeros(shape).scatter(dim, indices, g)


class _Topk(torch.autograd.Function):
    @staticmethod
    def forward(x, k: int, dim: int, largest: bool, sorted_: bool, backend):
        values, indices = _topk.OP.run(_topk.prepare(x, k, dim, largest, sorted_), backend)
        return values, indices

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, _, dim = inputs[0], inputs[1], inputs[2]
        ctx.shape, ctx.dim = x.shape, dim % max(x.dim(), 1)
        ctx.mark_non_differentiable(output[1])
        ctx.save_for_backward(output[1])
        ctx.save_for_forward(output[1])

    @staticmethod
    def jvp(ctx, t, *_):
        (indices,) = ctx.saved_tensors
        return topk_tangent(t, indices, ctx.dim), None

    @staticmethod
    def backward(ctx, g_values, _g_indices):
        (indices,) = ctx.saved_tensors
        return topk_vjp(g_values, indices, ctx.shape, ctx.dim), None, None, None, None, None

    @staticmethod
    def vmap(info, in_dims, x, k, dim, largest, sorted_, backend):
        if in_dims[0] is None:
            return _Topk.apply(x, k, dim, largest, sorted_, backend), (None, None)
        x = _bdim_first(x, in_dims[0])
        rank = x.dim() - 1
        if rank == 0:
            # A 0-d input per batch: each answered as torch answers a 0-d topk (every backend
            # takes that; not every one takes rows of one element).
            rows = [_Topk.apply(x[b], k, dim, largest, sorted_, backend)
                    for b in range(x.shape[0])]
            if not rows:
                _topk.prepare(torch.empty((), device="meta"), k, dim, largest, sorted_)
                return (x.clone(), torch.zeros(x.shape, dtype=torch.int64, device=x.device)), \
                    (0, 0)
            return (torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows])), (0, 0)
        _topk.prepare(torch.empty(x.shape[1:], device="meta"), k, dim, largest, sorted_)
        return batched(lambda: _Topk.apply(x, k, dim % rank + 1, largest, sorted_, backend),
                       lambda b: _Topk.apply(x[b].contiguous(), k, dim, largest, sorted_, backend),
                       x.shape[0]), (0, 0)


def topk(x, k, dim, largest, sorted_, backend):
    if not isinstance(x, torch.Tensor) or type(k) is not int:
        _topk.prepare(x, k, dim, largest, sorted_)  # the argument errors
        k = int(k)
    values, indices = _Topk.apply(x, k, dim, largest, sorted_, backend)
    return torch.return_types.topk((values, indices))


# ---------------------------------------------------------------------------------------------
# permute
# ---------------------------------------------------------------------------------------------
def inverse(dims) -> list[int]:
    inverse = [0] * len(dims)
    for i, d in enumerate(dims):
        inverse[d] = i
    return inverse


class _Permute(torch.autograd.Function):
    @staticmethod
    def forward(x, dims: tuple, backend):
        return _permute.OP.run(_permute.prepare(x, list(dims)), backend)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.dims = inputs[1]

    @staticmethod
    def jvp(ctx, t, *_):
        return t.permute(ctx.dims)

    @staticmethod
    def backward(ctx, g):
        return g.permute(inverse(ctx.dims)), None, None

    @staticmethod
    def vmap(info, in_dims, x, dims, backend):
        if in_dims[0] is None:
            return _Permute.apply(x, dims, backend), None
        x = _bdim_first(x, in_dims[0])
        return batched(lambda: _Permute.apply(x, (0, *(d + 1 for d in dims)), backend),
                       lambda b: _Permute.apply(x[b].contiguous(), dims, backend), x.shape[0]), 0


def permute(x, dims, out, backend):
    """A permute that a transform watches or that records autograd (out None). dims are
    checked (and wrapped) by permute's own rules first."""
    if not isinstance(x, torch.Tensor):
        _permute.prepare(x, dims)  # the argument error
    dims = _permute.wrap_dims(dims, x.dim())
    if out is not None:
        # Under a transform, out= is torch's to answer (vmap refuses it, as for torch's op).
        return torch.permute_copy(x, dims, out=out)
    return _Permute.apply(x, dims, backend)


# ---------------------------------------------------------------------------------------------
# isin
# ---------------------------------------------------------------------------------------------
class _Isin(torch.autograd.Function):
    @staticmethod
    def forward(elements, test_elements, assume_unique: bool, invert: bool, backend):
        call = _isin.prepare(elements, test_elements, assume_unique=assume_unique,
                             invert=invert)
        return _isin.OP.run(call, backend)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.mark_non_differentiable(output)

    @staticmethod
    def jvp(ctx, *_):
        return None

    @staticmethod
    def backward(ctx, _g):
        return None, None, None, None, None

    @staticmethod
    def vmap(info, in_dims, elements, test, assume_unique, invert, backend):
        e_dim, t_dim = in_dims[0], in_dims[1]
        if t_dim is None:
            if e_dim is None:
                return _Isin.apply(elements, test, assume_unique, invert, backend), None
            elements = _bdim_first(elements, e_dim)
            return _Isin.apply(elements, test, assume_unique, invert, backend), 0
        # A test set per batch: each batch's elements against its own test set.
        test = _bdim_first(test, t_dim)
        if isinstance(elements, torch.Tensor):
            if e_dim is None:
                elements = elements.expand(test.shape[0], *elements.shape)
            else:
                elements = _bdim_first(elements, e_dim)
            rows = [_Isin.apply(elements[b], test[b], assume_unique, invert, backend)
                    for b in range(test.shape[0])]
        else:
            rows = [_Isin.apply(elements, test[b], assume_unique, invert, backend)
                    for b in range(test.shape[0])]
        if not rows:
            shape = (0, *(elements.shape[1:] if isinstance(elements, torch.Tensor) else ()))
            return torch.empty(shape, dtype=torch.bool, device=test.device), 0
        return torch.stack(rows), 0


def isin(elements, test_elements, assume_unique: bool, invert: bool, backend):
    return _Isin.apply(elements, test_elements, assume_unique, invert, backend)
