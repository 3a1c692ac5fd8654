"""The public ops. Each is a thin function over an Op of the dispatcher (see dispatch/op.py):

    ops.isin(a, b)                    automatic choice of backend
    ops.isin(a, b, backend="hash")    force one ("auto" or None: choose)

Every op accepts what its torch namesake accepts and returns what it returns. A call decided
before, with plain arguments, is answered from its route (Op.routes: a dict lookup by the
arguments' shapes, strides, dtypes, device and scalars) by the chosen backend's prepared call, or
by torch's op; other calls go through the op's prepare() and Op.run(). While
torch.compile traces a function (torch.compiler.is_compiling()), they call the torch.library ops
instead (opselect/library.py), which the graph keeps. While a function transform watches a call
(forward-mode AD, torch.func's vmap / jvp / grad), they go through opselect/transforms.py. A call
whose dtype opselect's kernels do not take (quantized, uint16-64, float8, ...) goes to torch's own
op untouched.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.autograd.forward_ad as _fwad
from torch.compiler import is_compiling as _compiling

from . import library as _library
from . import transforms as _transforms
from .dispatch.op import Op
from .dispatch.tuning_mode import state as _tuning_state
from .errors import BackendError, TorchOnlyCall
from .kernels import isin as _isin
from .kernels import permute as _permute
from .kernels import softmax as _softmax
from .kernels import topk as _topk
from .kernels.isin.call import plain_key as _isin_key
from .kernels.permute.call import plain_key as _permute_key
from .kernels.softmax.call import plain_key as _softmax_key
from .kernels.softmax.call import prepare_keyed as _prepare_softmax
from .kernels.topk.call import plain_key as _topk_key
from .kernels.topk.call import prepare_keyed as _prepare_topk


_functorch_active = torch._C._are_functorch_transforms_active


#: forced_routes' answer for a call not seen yet (None there means torch's op)
_UNSEEN = object()


def _torch_answers(op: Op, backend: Optional[str], why: TorchOnlyCall, answer):
    """A call only torch's op takes: torch's answer (or torch's own error). A forced Triton
    backend is refused, naming why."""
    if backend is not None and backend != "auto" and op.backend(backend).name != "torch":
        raise BackendError(f"{op.name}: backend {backend!r} cannot take this call ({why}); "
                           "only the torch backend can") from None
    return answer()


def isin(elements, test_elements, *, assume_unique: bool = False, invert: bool = False,
         out: Optional[torch.Tensor] = None, backend: Optional[str] = None) -> torch.Tensor:
    """torch.isin: a bool tensor shaped like `elements`, True where the element is in
    `test_elements` (False with invert=True). Either argument may be a Python number; dtypes are
    promoted as torch does; NaN is never a member and -0.0 equals 0.0.

    Backends: torch, compare, search, hash, bitmap (see opselect.kernels.isin)."""
    if _compiling():
        return _library.isin(elements, test_elements, assume_unique, invert, out, backend)
    if (_functorch_active() or _fwad._current_level >= 0) and out is None and \
            _transforms.watched(elements, test_elements):
        return _transforms.isin(elements, test_elements, assume_unique, invert, backend)
    key = None if out is not None else _isin_key(elements, test_elements, assume_unique, invert)
    # A call decided before: its route (see Op.routes), before any preparing.
    if backend is None or backend == "auto":
        route = _isin.OP.routes.get(key)
        if route is not None and (route[1] or not _tuning_state.active):
            if route[0] is None:
                if assume_unique or invert:
                    return torch.isin(elements, test_elements, assume_unique=assume_unique,
                                      invert=invert)
                return torch.isin(elements, test_elements)  # (keywords cost the parser time)
            return route[0](elements, test_elements)
    elif key is not None:
        prepared = _isin.OP.forced_routes.get((backend, key), _UNSEEN)
        if prepared is not _UNSEEN:
            if prepared is None:
                return torch.isin(elements, test_elements, assume_unique=assume_unique,
                                  invert=invert)
            return prepared(elements, test_elements)
    try:
        call = _isin.prepare(elements, test_elements, assume_unique=assume_unique, invert=invert,
                             out=out)
    except TorchOnlyCall as why:
        return _torch_answers(_isin.OP, backend, why, lambda: torch.isin(
            elements, test_elements, assume_unique=assume_unique, invert=invert,
            **({} if out is None else {"out": out})))
    return _isin.OP.run(call, backend, key)


def topk(input: torch.Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True,
         *, backend: Optional[str] = None):
    """torch.topk: the k largest (or smallest) values along `dim` and their indices, as
    torch.return_types.topk(values, indices). NaN counts as larger than every number.

    Backends: torch, radix, tournament, maxima, sort, bitonic (see opselect.kernels.topk)."""
    if _compiling():
        return _library.topk(input, k, dim, largest, sorted, backend)
    if (_functorch_active() or _fwad._current_level >= 0) and _transforms.watched(input):
        return _transforms.topk(input, k, dim, largest, sorted, backend)
    key = _topk_key(input, k, dim, largest, sorted)
    if backend is None or backend == "auto":
        route = _topk.OP.routes.get(key)
        if route is not None and (route[1] or not _tuning_state.active):
            if route[0] is None:
                return torch.topk(input, k, dim, largest, sorted)
            return route[0](input)
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


def permute(input: torch.Tensor, dims: Sequence[int], *, out: Optional[torch.Tensor] = None,
            backend: Optional[str] = None) -> torch.Tensor:
    """input.permute(dims).contiguous(): a new contiguous tensor (or `out`, written into), or,
    as torch's contiguous() gives, the permuted view itself when that is contiguous already (a
    permutation that moves only dims of size 1, or undoes the input's own; a forced Triton
    backend, autograd and torch.compile always give a new tensor).

    Backends: torch, naive, tiled, vectorized (see opselect.kernels.permute)."""
    if _compiling():
        return _library.permute(input, dims, out, backend)
    if (_functorch_active() or _fwad._current_level >= 0) and _transforms.watched(input):
        return _transforms.permute(input, dims, out, backend)
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
        return _transforms.permute(input, dims, out, backend)
    key = _permute_key(input, dims)
    if backend is None or backend == "auto":
        route = _permute.OP.routes.get(key)
        if route is not None and (route[1] or not _tuning_state.active):
            if route[0] is None:
                return torch.permute_copy(input, dims)  # (one ATen call: kernels/permute/call.py)
            return route[0](input)
    elif key is not None:
        prepared = _permute.OP.forced_routes.get((backend, key), _UNSEEN)
        if prepared is not _UNSEEN:
            return torch.permute_copy(input, dims) if prepared is None else prepared(input)
    call = _permute.prepare_keyed(key, input, dims)
    if call.view_is_contiguous and (backend is None or backend == "auto" or backend == "torch"):
        # As torch's permute(dims).contiguous(): the view itself when it is contiguous already
        # (dims of size 1 moved, the input's own permutation undone). A forced Triton backend
        # runs its copy (or says why it cannot).
        return input.permute(call.dims)
    return _permute.OP.run(call, backend, key)


def transpose(input: torch.Tensor, dim0: int, dim1: int, *, out: Optional[torch.Tensor] = None,
              backend: Optional[str] = None) -> torch.Tensor:
    """input.transpose(dim0, dim1).contiguous(): permute() with two dims swapped."""
    return permute(input, _permute.transpose_dims(input, dim0, dim1), out=out, backend=backend)


def softmax(input: torch.Tensor, dim: int = -1, *, dtype: Optional[torch.dtype] = None,
            backend: Optional[str] = None) -> torch.Tensor:
    """torch.softmax along `dim` (accumulating in float32, float64 stays float64); works under
    autograd. Backends: torch, fused, online, multirow, strided (see opselect.kernels.softmax)."""
    if _compiling():
        return _library.softmax(input, dim, dtype, backend)
    if (_functorch_active() or _fwad._current_level >= 0) and _transforms.watched(input):
        return _transforms.softmax(input, dim, False, dtype, backend)
    key = _softmax_key(False, input, dim, dtype)
    if backend is None or backend == "auto":
        route = _softmax.SOFTMAX_OP.routes.get(key)
        if route is not None and (route[1] or not _tuning_state.active):
            if route[0] is None:
                return torch.softmax(input, dim, dtype)  # (positional: quicker to parse)
            return route[0](input)
    elif key is not None:
        prepared = _softmax.SOFTMAX_OP.forced_routes.get((backend, key), _UNSEEN)
        if prepared is not _UNSEEN:
            return torch.softmax(input, dim, dtype=dtype) if prepared is None else prepared(input)
    try:
        call = _prepare_softmax("softmax", False, key, input, dim, dtype)
    except TorchOnlyCall as why:
        return _torch_answers(_softmax.SOFTMAX_OP, backend, why,
                              lambda: torch.softmax(input, dim, dtype=dtype))
    return _softmax.SOFTMAX_OP.run(call, backend, key)


def log_softmax(input: torch.Tensor, dim: int = -1, *, dtype: Optional[torch.dtype] = None,
                backend: Optional[str] = None) -> torch.Tensor:
    """torch.log_softmax, with the same backends and rules as softmax()."""
    if _compiling():
        return _library.log_softmax(input, dim, dtype, backend)
    if (_functorch_active() or _fwad._current_level >= 0) and _transforms.watched(input):
        return _transforms.softmax(input, dim, True, dtype, backend)
    key = _softmax_key(True, input, dim, dtype)
    if backend is None or backend == "auto":
        route = _softmax.LOG_SOFTMAX_OP.routes.get(key)
        if route is not None and (route[1] or not _tuning_state.active):
            if route[0] is None:
                return torch.log_softmax(input, dim, dtype)
            return route[0](input)
    elif key is not None:
        prepared = _softmax.LOG_SOFTMAX_OP.forced_routes.get((backend, key), _UNSEEN)
        if prepared is not _UNSEEN:
            return torch.log_softmax(input, dim, dtype=dtype) if prepared is None else prepared(input)
    try:
        call = _prepare_softmax("log_softmax", True, key, input, dim, dtype)
    except TorchOnlyCall as why:
        return _torch_answers(_softmax.LOG_SOFTMAX_OP, backend, why,
                              lambda: torch.log_softmax(input, dim, dtype=dtype))
    return _softmax.LOG_SOFTMAX_OP.run(call, backend, key)


__all__ = ["isin", "log_softmax", "permute", "softmax", "topk", "transpose"]


# Tuning times each candidate through the public function that answers the op's calls
# (Op._pinned_public): the host time of its path is part of what the program pays.
for _op, _public in ((_isin.OP, isin), (_topk.OP, topk), (_permute.OP, permute),
                     (_softmax.SOFTMAX_OP, softmax), (_softmax.LOG_SOFTMAX_OP, log_softmax)):
    _op.public = _public
del _op, _public
