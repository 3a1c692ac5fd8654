"""permute's front: the public functions ops.permute and ops.transpose, their torch.library ops for
compiled code, their one autograd.Function (for eager calls under autograd or function transforms
and as the library op's Autograd kernel) and enable()'s handlers of the copies of permuted views
(contiguous(), reshape()). The kernels and backends are in opselect/kernels/permute/."""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
import torch.autograd.forward_ad as _fwad
from torch.compiler import is_compiling as _compiling

from .. import routing_state as _state
from .. import transforms as _transforms
from .. import usage as _usage
from ..dispatch.op import ROUTES_MAX
from ..dispatch.tuning_mode import state as _tuning_state
from ..heuristics import permute as _cost
from ..kernels import permute as _permute
from ..kernels.permute.call import plain_key as _permute_key
from ..kernels.permute.call import strided_key as _strided_key
from ..library import (LIB, _BelowAutograd, _apply, _differentiated, _ops, _placed, _run,
                       _symbolic, _unrouted, _wrap)
from ..transforms import _bdim_first, batched
from ..usage import _ran
from ._base import (PASS, _PLAIN, _STRIDED, _TENSOR, _UNSEEN, _arg, _counted, _functorch_active,
                    _prepared, _route, _takes, _tracing, in_regime)


# ---------------------------------------------------------------------------------------------
# The public function (ops.permute)
# ---------------------------------------------------------------------------------------------
def permute(input: torch.Tensor, dims: Sequence[int], *, out: Optional[torch.Tensor] = None,
            backend: Optional[str] = None) -> torch.Tensor:
    """input.permute(dims).contiguous(): a new contiguous tensor (or `out`, written into), or,
    as torch's contiguous() gives, the permuted view itself when that is contiguous already (a
    permutation that moves only dims of size 1, or undoes the input's own; a forced Triton
    backend, autograd and torch.compile always give a new tensor).

    Backends: torch, naive, tiled, vectorized (see opselect.kernels.permute)."""
    if _compiling():
        return _compiled(input, dims, out, backend)
    if (_functorch_active() or _fwad._current_level >= 0) and _transforms.watched(input):
        return _transformed(input, dims, out, backend)
    if out is not None:
        # As torch's permute_copy(out=): never recorded by autograd, and refused while out
        # itself requires grad.
        if isinstance(out, torch.Tensor) and out.requires_grad and torch.is_grad_enabled():
            raise RuntimeError("permute: functions with out=... arguments don't support "
                               "automatic differentiation, but out requires grad (as torch's "
                               "permute_copy)")
        with torch.no_grad():
            return _permute.OP.run(_permute.prepare(input, dims, out=out), backend)
    if isinstance(input, torch.Tensor) and input.requires_grad and torch.is_grad_enabled():
        # Autograd through any backend (the kernels' own calls record none).
        return _transformed(input, dims, out, backend)
    key = _permute_key(input, dims)
    if backend is None or backend == "auto":
        route = _permute.OP.routes.get(key)
        if route is not None and (route[1] or not _tuning_state.active):
            prepared = route[0] if route[3] is None else in_regime(route)
            if prepared is None:
                return torch.permute_copy(input, dims)  # (one ATen call: kernels/permute/call.py)
            return prepared(input)
    elif key is not None:
        prepared = _permute.OP.forced_routes.get((backend, key), _UNSEEN)
        if prepared is not _UNSEEN:
            return torch.permute_copy(input, dims) if prepared is None else prepared(input)
    call = _permute.prepare_keyed(key, input, dims)
    if call.view_is_contiguous and (backend is None or backend == "auto" or backend == "torch"):
        # As torch's permute(dims).contiguous(): the view itself when it is contiguous already
        # (dims of size 1 moved, the input's own permutation undone). A forced Triton backend
        # runs its copy (or says why it cannot). Routed from now on: the key holds the whole
        # layout, so every input of it has a contiguous view (2.9 us over torch's 1.0 before,
        # on this workplace's CPU host, for the prepare memo's lookup on every call).
        if key is not None and (backend is None or backend == "auto"):
            routes = _permute.OP.routes
            if len(routes) >= ROUTES_MAX:
                routes.clear()
            routes[key] = (_view_route(call.dims), True, "torch", None)
        return _permute_view(input, call.dims)
    return _permute.OP.run(call, backend, key)


# (torch.permute, not Tensor.permute: the method's parser takes a tuple of dims 0.5 us slower)
_permute_view = torch.permute


def _view_route(dims: tuple):
    """The route of a layout whose permuted view is contiguous: that view of each input."""
    return lambda input: _permute_view(input, dims)


def transpose(input: torch.Tensor, dim0: int, dim1: int, *, out: Optional[torch.Tensor] = None,
              backend: Optional[str] = None) -> torch.Tensor:
    """input.transpose(dim0, dim1).contiguous(): permute() with two dims swapped."""
    return permute(input, _permute.transpose_dims(input, dim0, dim1), out=out, backend=backend)


_permute.OP.public = permute  # what tuning's stage 2 times (Op._pinned_public)


# ---------------------------------------------------------------------------------------------
# Autograd, forward-mode AD and vmap: one autograd.Function, which is both the library op's
# Autograd kernel (compiled graphs, torch.ops.opselect.permute) and what an eager call that
# records autograd or that a transform watches goes through (forward-mode AD, torch.func)
# ---------------------------------------------------------------------------------------------
def inverse(dims) -> list[int]:
    inverse = [0] * len(dims)
    for i, d in enumerate(dims):
        inverse[d] = i
    return inverse


class _Permute(torch.autograd.Function):
    """permute's rules for every path; `library` picks what forward runs (library._apply)."""

    op_name = "permute"  # (library._apply's error names the eager op)

    @staticmethod
    def forward(x, dims, backend, library: bool):
        if library:
            with _BelowAutograd():
                return _ops.permute(x, dims, backend)
        return _permute.OP.run(_permute.prepare(x, list(dims)), backend)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.dims = list(inputs[1])

    @staticmethod
    def jvp(ctx, t, *_):
        return t.permute(ctx.dims)

    @staticmethod
    def backward(ctx, g):
        return g.permute(inverse(ctx.dims)), None, None, None

    @staticmethod
    def vmap(info, in_dims, x, dims, backend, library):
        # (dims were checked by permute's own rules before the Function: _transformed)
        return _permute_batched(lambda v, d: _Permute.apply(v, d, backend, library), in_dims[0],
                                x, dims)


def _permute_batched(run, bdim: Optional[int], x, dims):
    """permute's vmap rule, the Function's and the library op's: the batch dim becomes one more
    leading dim of the call, kept first (the dims shift by one); run(x, dims) is _Permute.apply
    (the Function's rule: a transform below this one still sees the Function) or the library
    op."""
    if bdim is None:
        return run(x, dims), None
    x = _bdim_first(x, bdim)
    wrapped = [_wrap(d, x.dim() - 1, "permute") for d in dims]
    return batched(lambda: run(x, [0, *(d + 1 for d in wrapped)]),
                   lambda b: run(x[b].contiguous(), wrapped), x.shape[0]), 0


def _transformed(x, dims, out, backend):
    """A permute that a transform watches or that records autograd (out None). dims are
    checked (and wrapped) by permute's own rules first."""
    if not isinstance(x, torch.Tensor):
        _permute.prepare(x, dims)  # the argument error
    dims = _permute.wrap_dims(dims, x.dim())
    if out is not None:
        # Under a transform, out= is torch's to answer (vmap refuses it, as for torch's op).
        return torch.permute_copy(x, dims, out=out)
    return _Permute.apply(x, dims, backend, False)


# ---------------------------------------------------------------------------------------------
# Compiled calls: the torch.library ops, their fake, autograd and vmap rules, and the
# trace-time choice between opselect's op and the aten op (opselect/library.py has the rule)
# ---------------------------------------------------------------------------------------------
LIB.define("permute(Tensor input, int[] dims, str? backend=None) -> Tensor")
LIB.define("permute_or_aten(Tensor input, int[] dims, str? backend=None) -> Tensor")


def _permute_kernel(input, dims, backend=None):
    return _run(_permute.OP, _permute.prepare(input, list(dims)), backend)


@torch.library.register_fake("opselect::permute", lib=LIB)
def _permute_fake(input, dims, backend=None):
    return input.new_empty([input.shape[d] for d in dims])


def _permute_autograd(input, dims, backend=None):
    if _differentiated(input):
        return _apply(_Permute, input, dims, backend, True)
    with _BelowAutograd():
        return _ops.permute(input, dims, backend)


def _permute_vmap(info, in_dims, input, dims, backend=None):
    return _permute_batched(lambda v, d: _ops.permute(v, d, backend), in_dims[0], input, dims)


def _permute_or_aten(input, dims, backend=None):
    if _placed(_permute.OP, backend, (input,),
               None if type(input) is not torch.Tensor else
               lambda: _permute.prepare(input, list(dims)), True):
        return _ops.permute(input, dims, backend)
    if list(dims) != list(range(input.dim())):
        input = input.permute(dims)
    return input.clone(memory_format=torch.contiguous_format)


def _compiled(input, dims, out, backend):
    """What permute() calls while torch.compile traces (Dynamo traces this Python)."""
    result = _ops.permute_or_aten(input, list(dims), backend)
    if out is not None:
        return out.copy_(result)
    return result


LIB.impl("permute", _unrouted(_permute_kernel), "CompositeExplicitAutograd")
LIB.impl("permute", _permute_autograd, "Autograd")
torch.library.register_vmap("opselect::permute", _permute_vmap, lib=LIB)
LIB.impl("permute_or_aten", _unrouted(_permute_or_aten), "CompositeImplicitAutograd")


# ---------------------------------------------------------------------------------------------
# opselect.enable(): the handler of the torch entry points this op takes over
# ---------------------------------------------------------------------------------------------
def _dense_permuted(x: torch.Tensor) -> bool:
    """x's elements fill its storage span with no gap and no overlap, in some order of its
    dims: a permuted view of a contiguous tensor (what permute's kernels copy)."""
    expect = 1
    for stride, size in sorted(zip(x.stride(), x.shape)):  # (C-level: no generator)
        if size != 1:
            if stride != expect:
                return False
            expect *= size
    return True


#: torch's own answer for a plain eager tensor (TensorImpl::is_non_overlapping_and_dense, a flag
#: kept with the strides): 0 (MemOverlap::No) is given for those tensors alone. One C call
#: against the walk's ~0.9 us; not for traced tensors (Dynamo would have to trace it).
_internal_overlap = getattr(torch, "_debug_has_internal_overlap", None)
_COPY_NUMEL, _COPY_DIMS = _cost.TORCH_COPY_NUMEL, _cost.TORCH_COPY_DIMS
_grad_enabled = torch.is_grad_enabled


def _dense_eager(x: torch.Tensor) -> bool:
    """_dense_permuted(x) for an eager plain tensor with elements (torch calls an empty tensor
    dense; the walk, and so the routing, does not)."""
    if _internal_overlap is None:
        return _dense_permuted(x)
    return _internal_overlap(x) == 0 and x.numel() != 0


def _copy_of_view(router: _state.Router, x: torch.Tensor) -> Any:
    """The contiguous copy of a strided view past _plain_view's checks, traced or eager."""
    if _tracing(x):
        return _compiled(x, _identity(x.dim()), None, router.backends.get("permute"))
    return _copy_eager(router, x)


def _already_contiguous(x: Any) -> bool:
    """The common call of a model's .contiguous() or .reshape(): an eager, plain, contiguous
    tensor. Answered first, in a few checks (the call passes to torch)."""
    return (type(x) in _PLAIN and x.layout is torch.strided and not _compiling()
            and x.is_contiguous())


def _plain_view(x: Any) -> bool:
    """x is a permuted view with no gaps (not itself contiguous) that opselect copies. The
    common case, an already contiguous tensor, is answered after two checks."""
    if not _takes(x) or x.layout != torch.strided:
        return False
    if _tracing(x) and _symbolic(x):
        return False  # a symbolic size: torch's op (guarding a layout would specialize it)
    return not x.is_contiguous() and _dense_permuted(x)


def _contiguous_handler(router: _state.Router, args: tuple, kwargs: dict) -> Any:
    x = args[0] if args else kwargs.get("self")
    if _already_contiguous(x):
        return PASS
    if type(x) is _TENSOR and not _compiling():
        return _contiguous_eager(router, x, args, kwargs) if x.layout is _STRIDED else PASS
    if _other_format(args, kwargs) or not _plain_view(x):
        return PASS
    return _copy_of_view(router, x)


def _other_format(args: tuple, kwargs: dict) -> bool:
    """contiguous(memory_format=...) asks for a layout other than the contiguous one."""
    return bool(len(args) > 1 or kwargs) and _arg(
        args, kwargs, 1, "memory_format", torch.contiguous_format) is not torch.contiguous_format


def _contiguous_eager(router: _state.Router, x: torch.Tensor, args: tuple, kwargs: dict) -> Any:
    """Tensor.contiguous() of an eager plain tensor that is not contiguous (the layout wrapper
    checked that much)."""
    if (kwargs or len(args) > 1) and _other_format(args, kwargs):
        return PASS
    return _copy_eager(router, x)


def _copy_eager(router: _state.Router, x: torch.Tensor) -> Any:
    """The contiguous copy of an eager plain strided tensor that is not contiguous, or PASS. A
    layout decided before: its route answers, before the density check (the key holds the
    whole layout, and a route is made only for a call that passed it, or for ops.permute's own
    copy of that layout, which is as right)."""
    if _small_copy(router, x):
        return PASS
    backend = router.backends.get("permute")
    dims = _identity(x.dim())
    if x.requires_grad and _grad_enabled():
        return _recorded_copy(x, dims, backend) if _dense_eager(x) else PASS
    key = _strided_key(x, dims)
    route = _route(_permute.OP, key, backend)
    if route is not None:
        return route if route is PASS else _prepared(route, x)
    if key is None or not _dense_eager(x):
        return PASS
    return _counted(_permute.OP, _permute.prepare_keyed, backend, key, key, x, dims)


def _small_copy(router: _state.Router, x: torch.Tensor) -> bool:
    """A copy the cost model leaves to torch on every GPU it knows (see
    heuristics.permute.TORCH_COPY_NUMEL), counted as torch's: the caller passes it to torch's
    own with no key (in a model's layer the key and the lookup were most of a routed copy's
    host time)."""
    if (x.is_cuda and x.numel() <= _COPY_NUMEL and x.dim() <= _COPY_DIMS
            and "permute" not in router.backends and not _tuning_state.active):
        _ran["permute"]["torch"] += 1
        return True
    return False


def _recorded_copy(x: torch.Tensor, dims: tuple, backend: Optional[str]) -> torch.Tensor:
    """The copy of a view that autograd records (as ops.permute makes it). A route never answers
    such a call: routes are keyed by layout alone, and a prepared kernel records no autograd
    (a Triton route made by a call under no_grad once gave a training step's copy no grad_fn,
    so no gradient reached the input)."""
    token = _state.suspend()
    try:
        copy = _transformed(x, dims, None, backend)
        with torch.no_grad():  # (the call as its forward ran it, for stats())
            _usage.record_run(_permute.OP, _permute.prepare(x, dims), backend)
    finally:
        _state.resume(token)
    return copy


_contiguous_handler.eager = _contiguous_eager


#: The identity permutation of each rank up to 16: the dims of the copy contiguous() makes.
_IDENTITY = tuple(tuple(range(n)) for n in range(17))


def _identity(rank: int) -> tuple:
    return _IDENTITY[rank] if rank < 17 else tuple(range(rank))


def _reshape_handler(router: _state.Router, args: tuple, kwargs: dict) -> Any:
    """Tensor.reshape(*shape) / Tensor.reshape(shape) / torch.reshape(input, shape)."""
    x = args[0] if args else kwargs.get("input", kwargs.get("self"))
    if _already_contiguous(x) or not _plain_view(x):
        return PASS
    return _reshape_view(router, x, args, kwargs)


#: (shape, strides, the reshape's shape argument) -> the shape a copy is viewed as, or None where
#: the reshape is a view, or copies what no permute copies (PASS): the eager path's memo of
#: _reshape_target, whose Python walks over the dims (_infer, _view_strides) cost more than the
#: rest of the call. Bounded: cleared when full.
_RESHAPE_TARGETS: dict[tuple, Optional[tuple]] = {}
_RESHAPE_TARGETS_MAX = 4096


def _reshape_eager(router: _state.Router, x: torch.Tensor, args: tuple, kwargs: dict) -> Any:
    """_reshape_handler for an eager plain tensor that is not contiguous (the layout wrapper
    checked that much): a repeat_kv's expanded view, or the merge of attention heads."""
    if _internal_overlap is not None and _internal_overlap(x) != 0:
        # An expanded view (repeat_kv's, twice a layer in grouped-query attention) is never
        # dense: one C call answers it, before the memo's key (its shape, strides and hash
        # cost several times as much in a model's layer, where caches are cold).
        return PASS
    shape = _shape_argument(args, kwargs)
    if shape is None:
        return PASS
    memo = (x.shape, x.stride(), shape)
    target = _RESHAPE_TARGETS.get(memo, _UNSEEN)
    if target is _UNSEEN:
        target = _reshape_target(x, shape) if _dense_eager(x) else None
        if len(_RESHAPE_TARGETS) >= _RESHAPE_TARGETS_MAX:
            _RESHAPE_TARGETS.clear()
        _RESHAPE_TARGETS[memo] = target
    if target is None:
        return PASS
    copy = _copy_eager(router, x)
    return copy if copy is PASS else copy.view(target)  # (PASS: torch's reshape copies)


def _reshape_view(router: _state.Router, x: torch.Tensor, args: tuple, kwargs: dict) -> Any:
    shape = _shape_argument(args, kwargs)
    target = None if shape is None else _reshape_target(x, shape)
    if target is None:
        return PASS
    copy = _copy_of_view(router, x)
    return copy if copy is PASS else copy.view(target)  # (PASS: torch's reshape copies)


def _shape_argument(args: tuple, kwargs: dict) -> Optional[tuple]:
    """reshape's shape, as a tuple of ints (None: not given, or not all ints)."""
    rest = args[1:]
    if len(rest) == 1 and isinstance(rest[0], (tuple, list, torch.Size)):
        shape = tuple(rest[0])
    elif rest:
        shape = rest
    else:
        shape = kwargs.get("shape")
        if shape is None:
            return None
        shape = tuple(shape)
    for size in shape:
        if type(size) is not int:
            return None
    return shape


def _reshape_target(x: torch.Tensor, shape: tuple) -> Optional[tuple]:
    """The shape that x's contiguous copy is viewed as, or None where the reshape is a view of
    x (or the shape is wrong: torch's reshape says why)."""
    target = _infer(shape, x.numel())
    if target is None or _view_strides(tuple(x.shape), x.stride(), target) is not None:
        return None
    return target


_reshape_handler.eager = _reshape_eager


def _infer(shape: tuple, numel: int) -> Optional[tuple]:
    """shape with its -1 filled in, or None when it does not fit numel."""
    known = 1
    free = -1
    for i, s in enumerate(shape):
        if s == -1:
            if free >= 0:
                return None
            free = i
        elif s < 0:
            return None
        else:
            known *= s
    if free >= 0:
        if known == 0 or numel % known:
            return None
        shape = shape[:free] + (numel // known,) + shape[free + 1:]
    elif known != numel:
        return None
    return shape


def _view_strides(old_shape: tuple, old_strides: tuple, new_shape: tuple) -> Optional[list]:
    """The strides of x.view(new_shape), or None when no view can have that shape (ATen's
    computeStride: each run of dims that is contiguous within itself must map onto whole
    dims of the new shape)."""
    if not old_shape:
        return [1] * len(new_shape)
    new_strides = [0] * len(new_shape)
    view_d = len(new_shape) - 1
    base = old_strides[-1]
    tensor_numel = view_numel = 1
    for d in range(len(old_shape) - 1, -1, -1):
        tensor_numel *= old_shape[d]
        if d == 0 or (old_shape[d - 1] != 1 and old_strides[d - 1] != tensor_numel * base):
            while view_d >= 0 and (view_numel < tensor_numel or new_shape[view_d] == 1):
                new_strides[view_d] = view_numel * base
                view_numel *= new_shape[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if d > 0:
                base = old_strides[d - 1]
                tensor_numel = view_numel = 1
    return new_strides if view_d == -1 else None


ENTRY_POINTS = [
    # (op, owner, attribute, handler, whether the original is Python that calls another entry
    # point, whether it copies a view (the layout entries: contiguous, reshape))
    ("permute", torch.Tensor, "contiguous", _contiguous_handler, False, True),
    ("permute", torch.Tensor, "reshape", _reshape_handler, False, True),
    ("permute", torch, "reshape", _reshape_handler, False, True),
]
