"""topk's front: the public function ops.topk, its one autograd.Function (for eager calls under
function transforms and as its library op's Autograd kernel), its torch.library ops for compiled
code and its enable() handler. The kernels and backends are in opselect/kernels/topk/."""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.autograd.forward_ad as _fwad
from torch.compiler import is_compiling as _compiling

from .. import routing_state as _state
from .. import transforms as _transforms
from ..dispatch.tuning_mode import state as _tuning_state
from ..errors import TorchOnlyCall
from ..kernels import topk as _topk
from ..kernels.topk.call import plain_key as _topk_key
from ..kernels.topk.call import prepare_keyed as _prepare_topk
from ..library import (LIB, _BelowAutograd, _apply, _differentiated, _ops, _placed, _run,
                       _unrouted, _wrap)
from ..transforms import _bdim_first, batched
from ._base import (PASS, _STRIDED, _TENSOR, _UNSEEN, _VF, _counted, _functorch_active,
                    _prepared, _route, _takes, _torch_answers, _tracing, in_regime)

_TORCH_TOPK = _VF.topk


# ---------------------------------------------------------------------------------------------
# The public function (ops.topk)
# ---------------------------------------------------------------------------------------------
def topk(input: torch.Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True,
         *, backend: Optional[str] = None):
    """torch.topk: the k largest (or smallest) values along `dim` and their indices, as
    torch.return_types.topk(values, indices). NaN counts as larger than every number.

    Backends: torch, radix, tournament, maxima, sort, bitonic (see opselect.kernels.topk)."""
    if _compiling():
        return _compiled(input, k, dim, largest, sorted, backend)
    if (_functorch_active() or _fwad._current_level >= 0) and _transforms.watched(input):
        return _transformed(input, k, dim, largest, sorted, backend)
    key = _topk_key(input, k, dim, largest, sorted)
    if backend is None or backend == "auto":
        route = _topk.OP.routes.get(key)
        if route is not None and (route[1] or not _tuning_state.active):
            prepared = route[0] if route[3] is None else in_regime(route)
            if prepared is None:
                return torch.topk(input, k, dim, largest, sorted)
            return prepared(input)
    elif key is not None:
        prepared = _topk.OP.forced_routes.get((backend, key), _UNSEEN)
        if prepared is not _UNSEEN:
            return torch.topk(input, k, dim, largest, sorted) if prepared is None else \
                prepared(input)
    try:
        call = _prepare_topk(key, input, k, dim, largest, sorted)
    except TorchOnlyCall as why:
        return _torch_answers(_topk.OP, backend, why,
                              lambda: torch.topk(input, k, dim, largest, sorted))
    return _topk.OP.run(call, backend, key)


_topk.OP.public = topk  # what tuning's stage 2 times (Op._pinned_public)


# ---------------------------------------------------------------------------------------------
# Autograd, forward-mode AD and vmap: one autograd.Function, which is both the library op's
# Autograd kernel (compiled graphs, torch.ops.opselect.topk) and what an eager call that a
# transform watches goes through (forward-mode AD, torch.func)
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
    """topk's rules for every path; `library` picks what forward runs (library._apply)."""

    op_name = "topk"  # (library._apply's error names the eager op)

    @staticmethod
    def forward(x, k: int, dim: int, largest: bool, sorted_: bool, backend, library: bool):
        if library:
            with _BelowAutograd():
                return _ops.topk(x, k, dim, largest, sorted_, backend)
        values, indices = _topk.OP.run(_topk.prepare(x, k, dim, largest, sorted_), backend)
        return values, indices

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, dim = inputs[0], inputs[2]
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
        dx = topk_vjp(g_values, indices, ctx.shape, ctx.dim)
        return dx, None, None, None, None, None, None

    @staticmethod
    def vmap(info, in_dims, x, k, dim, largest, sorted_, backend, library):
        if in_dims[0] is not None:
            # The logical call's argument errors, as the plain path gives them (the batch's
            # call would name its shifted dim).
            shape = list(x.shape)
            del shape[in_dims[0]]
            _topk.prepare(torch.empty(shape, device="meta"), k, dim, largest, sorted_)
        return _topk_batched(lambda v, d: _Topk.apply(v, k, d, largest, sorted_, backend, library),
                             in_dims[0], x, dim)


def _topk_batched(run, bdim: Optional[int], x, dim: int):
    """topk's vmap rule, the Function's and the library op's: the batch dim becomes one more
    leading dim of the call (topk's dim shifts by one); run(x, dim) is _Topk.apply (the
    Function's rule: a transform below this one still sees the Function) or the library op."""
    if bdim is None:
        return run(x, dim), (None, None)
    x = _bdim_first(x, bdim)
    rank = x.dim() - 1
    d = _wrap(dim, rank, "topk")
    if rank == 0:
        # A 0-d input per batch: each answered as torch answers a 0-d topk (every backend takes
        # that; not every one takes rows of one element).
        rows = [run(x[b], dim) for b in range(x.shape[0])]
        if not rows:
            return (x.clone(), torch.zeros(x.shape, dtype=torch.int64, device=x.device)), (0, 0)
        return (torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows])), (0, 0)
    return batched(lambda: run(x, d + 1), lambda b: run(x[b].contiguous(), d), x.shape[0]), (0, 0)


def _transformed(x, k, dim, largest, sorted_, backend):
    if not isinstance(x, torch.Tensor) or type(k) is not int:
        _topk.prepare(x, k, dim, largest, sorted_)  # the argument errors
        k = int(k)
    values, indices = _Topk.apply(x, k, dim, largest, sorted_, backend, False)
    return torch.return_types.topk((values, indices))


# ---------------------------------------------------------------------------------------------
# Compiled calls: the torch.library ops, their fake, autograd and vmap rules, and the
# trace-time choice between opselect's op and the aten op (opselect/library.py has the rule)
# ---------------------------------------------------------------------------------------------
LIB.define("topk(Tensor input, SymInt k, int dim=-1, bool largest=True, bool sorted=True, "
           "str? backend=None) -> (Tensor values, Tensor indices)")
LIB.define("topk_or_aten(Tensor input, SymInt k, int dim=-1, bool largest=True, "
           "bool sorted=True, str? backend=None) -> (Tensor values, Tensor indices)")


def _topk_kernel(input, k, dim=-1, largest=True, sorted=True, backend=None):
    try:
        call = _topk.prepare(input, int(k), dim, largest, sorted)
    except TorchOnlyCall:  # (placed with dynamic shapes; a dtype only torch's op takes)
        values, indices = torch.topk(input, int(k), dim, largest, sorted)
        return values, indices
    # Each output a tensor of its own (the schema's outputs alias nothing).
    values, indices = _run(_topk.OP, call, backend)
    return values, indices


@torch.library.register_fake("opselect::topk", lib=LIB)
def _topk_fake(input, k, dim=-1, largest=True, sorted=True, backend=None):
    d = _wrap(dim, input.dim(), "topk")
    shape = list(input.shape)
    if shape:
        shape[d] = k
    return input.new_empty(shape), input.new_empty(shape, dtype=torch.int64)


def _topk_autograd(input, k, dim=-1, largest=True, sorted=True, backend=None):
    if _differentiated(input):
        return _apply(_Topk, input, k, dim, largest, sorted, backend, True)
    with _BelowAutograd():
        return _ops.topk(input, k, dim, largest, sorted, backend)


def _topk_vmap(info, in_dims, input, k, dim=-1, largest=True, sorted=True, backend=None):
    return _topk_batched(lambda v, d: _ops.topk(v, k, d, largest, sorted, backend), in_dims[0],
                         input, dim)


def _topk_or_aten(input, k, dim=-1, largest=True, sorted=True, backend=None):
    if _placed(_topk.OP, backend, (input, k),
               lambda: _topk.prepare(input, k, dim, largest, sorted)):
        return _ops.topk(input, k, dim, largest, sorted, backend)
    values, indices = torch.topk(input, k, dim, largest, sorted)
    return values, indices


def _compiled(input, k, dim, largest, sorted, backend):
    """What topk() calls while torch.compile traces (Dynamo traces this Python)."""
    values, indices = _ops.topk_or_aten(input, k, dim, largest, sorted, backend)
    return torch.return_types.topk((values, indices))


LIB.impl("topk", _unrouted(_topk_kernel), "CompositeExplicitAutograd")
LIB.impl("topk", _topk_autograd, "Autograd")
torch.library.register_vmap("opselect::topk", _topk_vmap, lib=LIB)
LIB.impl("topk_or_aten", _unrouted(_topk_or_aten), "CompositeImplicitAutograd")


# ---------------------------------------------------------------------------------------------
# opselect.enable(): the handler of the torch entry points this op takes over
# ---------------------------------------------------------------------------------------------
_TOPK_KW = frozenset(("input", "k", "dim", "largest", "sorted"))


_TOPK_DTYPES = frozenset(_topk.SUPPORTED_DTYPES)


def _topk_handler(router: _state.Router, args: tuple, kwargs: dict) -> Any:
    n = len(args)
    if n > 5 or not kwargs.keys() <= _TOPK_KW:
        return PASS
    get = kwargs.get
    x = args[0] if n else get("input")
    k = args[1] if n > 1 else get("k")
    dim = args[2] if n > 2 else get("dim", -1)
    largest = args[3] if n > 3 else get("largest", True)
    sorted_ = args[4] if n > 4 else get("sorted", True)
    if type(x) is _TENSOR and x.layout is _STRIDED and not _compiling():
        # An eager plain call decided before: its route, before the checks below (as softmax).
        route = _route(_topk.OP, _topk_key(x, k, dim, largest, sorted_),
                       router.backends.get("topk"))
        if route is not None:
            return _TORCH_TOPK(x, k, dim, largest, sorted_) if route is PASS else \
                _prepared(route, x)
    if (not _takes(x)
            or x.dtype not in _TOPK_DTYPES or x.layout != torch.strided
            or type(dim) is not int or type(largest) is not bool or type(sorted_) is not bool
            or not isinstance(k, (int, torch.SymInt)) or isinstance(k, bool)):
        return PASS
    backend = router.backends.get("topk")
    if _tracing(x):
        return _compiled(x, k, dim, largest, sorted_, backend)
    key = _topk_key(x, k, dim, largest, sorted_)
    route = _route(_topk.OP, key, backend)
    if route is not None:
        return _TORCH_TOPK(x, k, dim, largest, sorted_) if route is PASS else \
            _prepared(route, x)
    return _counted(_topk.OP, _prepare_topk, backend, key, key, x, k, dim, largest, sorted_)


ENTRY_POINTS = [
    # (op, owner, attribute, handler, whether the original is Python that calls another entry
    # point, whether it copies a view (the layout entries: contiguous, reshape))
    ("topk", torch, "topk", _topk_handler, False, False),
    ("topk", torch.Tensor, "topk", _topk_handler, False, False),
]
