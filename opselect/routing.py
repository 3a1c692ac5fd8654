"""opselect.enable(): a program's own torch calls go through opselect, with no edits to it.

    opselect.enable()                          every op, from here on (this thread)
    opselect.disable()
    with opselect.enabled(ops=["softmax", "topk"]):
        model.generate(...)
    opselect.stats()                           calls per op, and the backends that ran

Routed: torch.isin; torch.topk and Tensor.topk; torch.softmax, torch.nn.functional.softmax,
Tensor.softmax, torch.special.softmax and the same forms of log_softmax; and the copy of a permuted
view: x.permute(...).contiguous(), x.transpose(a, b).contiguous(), and x.reshape(...) (or
torch.reshape) of such a view where the reshape has to copy. Calls opselect does not take (a
tensor subclass, an out= argument, a named dim, an implicit softmax dim, a view with gaps, a
memory format other than contiguous) reach torch's own function untouched.

How: a TorchFunctionMode (torch.overrides). Its handler runs with the mode switched off, so the
`torch` backend's call of torch's own op reaches torch's kernel and never comes back here. Dynamo
traces the mode, so a compiled function that calls torch.softmax calls opselect's op in its
graph (or keeps the aten op where inductor's own kernel is as good; see opselect/library.py).
The mode sees every torch call of the thread: each one that is not routed pays about a
microsecond of Python on the way through (compiled graphs pay nothing: the mode is traced
away). Torch function modes are per thread, and so is enable().
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional

import torch
import torch.nn.functional as F
from torch.compiler import is_compiling as _compiling
from torch.overrides import TorchFunctionMode

from . import library as _library
from . import usage as _usage
from .dispatch.op import Op
from .kernels import isin as _isin
from .kernels import permute as _permute
from .kernels import softmax as _softmax
from .kernels import topk as _topk

OPS = ("isin", "topk", "permute", "softmax", "log_softmax")

#: What a handler returns for a call opselect does not take: the mode then calls torch.
PASS = NotImplemented
_PLAIN = (torch.Tensor, torch.nn.Parameter)
_FLOATS = frozenset((torch.float16, torch.bfloat16, torch.float32, torch.float64))


def _arg(args: tuple, kwargs: Mapping[str, Any], i: int, name: str, default: Any = None) -> Any:
    if len(args) > i:
        return args[i]
    return kwargs.get(name, default)


def _known(kwargs: Mapping[str, Any], names: frozenset) -> bool:
    for k in kwargs:
        if k not in names:
            return False
    return True


def _counted(op: Op, call, backend: Optional[str]):
    result = op.run(call, backend)
    _usage.record_run(op, call, backend)
    return result


# ---------------------------------------------------------------------------------------------
# Handlers: (router, args, kwargs) -> result, or PASS
# ---------------------------------------------------------------------------------------------
_ISIN_KW = frozenset(("elements", "test_elements", "assume_unique", "invert"))


def _isin_handler(router: "_Router", args: tuple, kwargs: dict) -> Any:
    elements = _arg(args, kwargs, 0, "elements")
    test = _arg(args, kwargs, 1, "test_elements")
    if (len(args) > 2 or not _known(kwargs, _ISIN_KW) or type(elements) not in _PLAIN
            or type(test) not in _PLAIN):
        return PASS
    assume_unique = bool(kwargs.get("assume_unique", False))
    invert = bool(kwargs.get("invert", False))
    if (elements.dtype not in _isin._SUPPORTED or test.dtype not in _isin._SUPPORTED
            or elements.device != test.device):
        return PASS
    backend = router.backends.get("isin")
    if _compiling():
        return _library.isin(elements, test, assume_unique, invert, None, backend)
    call = _isin.prepare(elements, test, assume_unique=assume_unique, invert=invert)
    return _counted(_isin.OP, call, backend)


_TOPK_KW = frozenset(("input", "k", "dim", "largest", "sorted"))
_TOPK_DTYPES = frozenset(_topk.SUPPORTED_DTYPES)


def _topk_handler(router: "_Router", args: tuple, kwargs: dict) -> Any:
    x = _arg(args, kwargs, 0, "input")
    k = _arg(args, kwargs, 1, "k")
    dim = _arg(args, kwargs, 2, "dim", -1)
    largest = _arg(args, kwargs, 3, "largest", True)
    sorted_ = _arg(args, kwargs, 4, "sorted", True)
    if (len(args) > 5 or not _known(kwargs, _TOPK_KW) or type(x) not in _PLAIN
            or x.dtype not in _TOPK_DTYPES or x.layout != torch.strided
            or type(dim) is not int or type(largest) is not bool or type(sorted_) is not bool
            or not isinstance(k, (int, torch.SymInt)) or isinstance(k, bool)):
        return PASS
    backend = router.backends.get("topk")
    if _compiling():
        return _library.topk(x, k, dim, largest, sorted_, backend)
    return _counted(_topk.OP, _topk.prepare(x, k, dim, largest, sorted_), backend)


_SOFTMAX_KW = frozenset(("input", "dim", "dtype", "_stacklevel"))


def _softmax_handler(log: bool, functional: bool) -> Callable[["_Router", tuple, dict], Any]:
    """torch.softmax(input, dim, dtype=None), Tensor.softmax(dim, dtype=None) and
    F.softmax(input, dim=None, _stacklevel=3, dtype=None) (functional: dtype is 4th)."""
    name = "log_softmax" if log else "softmax"
    op = _softmax.LOG_SOFTMAX_OP if log else _softmax.SOFTMAX_OP
    prepare = _softmax.prepare_log_softmax if log else _softmax.prepare_softmax
    compiled = _library.log_softmax if log else _library.softmax

    def handler(router: "_Router", args: tuple, kwargs: dict) -> Any:
        x = _arg(args, kwargs, 0, "input")
        dim = _arg(args, kwargs, 1, "dim")
        dtype = _arg(args, kwargs, 3 if functional else 2, "dtype")
        if (len(args) > (4 if functional else 3) or not _known(kwargs, _SOFTMAX_KW)
                or type(x) not in _PLAIN or type(dim) is not int or x.layout != torch.strided
                or (dtype if dtype is not None else x.dtype) not in _FLOATS):
            return PASS  # an implicit or named dim, an integer input, a subclass: torch's
        backend = router.backends.get(name)
        if _compiling():
            return compiled(x, dim, dtype, backend)
        return _counted(op, prepare(x, dim, dtype=dtype), backend)

    return handler


def _dense_permuted(x: torch.Tensor) -> bool:
    """x's elements fill its storage span with no gap and no overlap, in some order of its
    dims: a permuted view of a contiguous tensor (what permute's kernels copy)."""
    expect = 1
    for stride, size in sorted((st, n) for n, st in zip(x.shape, x.stride()) if n != 1):
        if stride != expect:
            return False
        expect *= size
    return True


def _copy_of_view(router: "_Router", x: torch.Tensor) -> Any:
    dims = list(range(x.dim()))
    backend = router.backends.get("permute")
    if _compiling():
        return _library.permute(x, dims, None, backend)
    return _counted(_permute.OP, _permute.prepare(x, dims), backend)


def _plain_view(x: Any) -> bool:
    return (type(x) in _PLAIN and x.layout == torch.strided and not _library._symbolic(x)
            and not x.is_contiguous() and _dense_permuted(x))


def _contiguous_handler(router: "_Router", args: tuple, kwargs: dict) -> Any:
    x = args[0] if args else kwargs.get("self")
    fmt = _arg(args, kwargs, 1, "memory_format", torch.contiguous_format)
    if fmt is not torch.contiguous_format or not _plain_view(x):
        return PASS
    return _copy_of_view(router, x)


def _reshape_handler(router: "_Router", args: tuple, kwargs: dict) -> Any:
    """Tensor.reshape(*shape) / Tensor.reshape(shape) / torch.reshape(input, shape)."""
    x = args[0] if args else kwargs.get("input", kwargs.get("self"))
    rest = args[1:]
    if len(rest) == 1 and isinstance(rest[0], (tuple, list, torch.Size)):
        shape = tuple(rest[0])
    elif rest:
        shape = tuple(rest)
    else:
        shape = kwargs.get("shape")
        if shape is None:
            return PASS
        shape = tuple(shape)
    if not _plain_view(x) or not all(type(s) is int for s in shape):
        return PASS
    target = _infer(shape, x.numel())
    if target is None or _view_strides(tuple(x.shape), x.stride(), target) is not None:
        return PASS  # a view does it (or the shape is wrong: torch says why)
    return _copy_of_view(router, x).view(target)


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


_HANDLERS: dict[str, list[tuple[Callable, Callable]]] = {
    "isin": [(torch.isin, _isin_handler)],
    "topk": [(torch.topk, _topk_handler), (torch.Tensor.topk, _topk_handler)],
    "softmax": [(torch.softmax, _softmax_handler(False, False)),
                (torch.special.softmax, _softmax_handler(False, False)),
                (torch.Tensor.softmax, _softmax_handler(False, False)),
                (F.softmax, _softmax_handler(False, True))],
    "log_softmax": [(torch.log_softmax, _softmax_handler(True, False)),
                    (torch.special.log_softmax, _softmax_handler(True, False)),
                    (torch.Tensor.log_softmax, _softmax_handler(True, False)),
                    (F.log_softmax, _softmax_handler(True, True))],
    "permute": [(torch.Tensor.contiguous, _contiguous_handler),
                (torch.Tensor.reshape, _reshape_handler), (torch.reshape, _reshape_handler)],
}


# ---------------------------------------------------------------------------------------------
# The mode
# ---------------------------------------------------------------------------------------------
class _Router(TorchFunctionMode):
    def __init__(self, ops: Iterable[str], backends: Mapping[str, str]):
        super().__init__()
        self.configure(ops, backends)

    def configure(self, ops: Iterable[str], backends: Mapping[str, str]) -> None:
        self.ops = tuple(ops)
        self.backends = dict(backends)
        self.routes = {func: handler for op in self.ops for func, handler in _HANDLERS[op]}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if kwargs is None:
            kwargs = {}
        route = self.routes.get(func)
        if route is not None:
            result = route(self, args, kwargs)
            if result is not PASS:
                return result
        return func(*args, **kwargs)


_local = threading.local()


def _router() -> Optional[_Router]:
    return getattr(_local, "router", None)


def _checked(ops: Optional[Iterable[str]], backends: Optional[Mapping[str, str]]):
    names = tuple(OPS if ops is None else ([ops] if isinstance(ops, str) else ops))
    for name in names:
        if name not in OPS:
            raise ValueError(f"opselect.enable: unknown op {name!r}; expected some of "
                             f"{', '.join(OPS)}")
    backends = dict(backends or {})
    from .dispatch import get_op

    for name, backend in backends.items():
        if name not in names:
            raise ValueError(f"opselect.enable: backends names {name!r}, which is not among the "
                             f"routed ops {names}")
        get_op(name).backend(backend)  # an unknown backend name fails now, listing the valid
    return names, backends


def enable(ops: Optional[Iterable[str]] = None,
           backends: Optional[Mapping[str, str]] = None) -> None:
    """Route this thread's torch calls of `ops` (default: all of isin, topk, permute, softmax,
    log_softmax) through opselect until disable(). `backends` forces a backend per op
    ({"softmax": "fused"}); otherwise the dispatcher chooses. Calling enable() again changes
    which ops are routed."""
    names, forced = _checked(ops, backends)
    router = _router()
    if router is not None:
        router.configure(names, forced)
        return
    router = _Router(names, forced)
    router.__enter__()
    _local.router = router


def disable() -> None:
    """Stop routing (a no-op when not enabled). Torch function modes entered after enable()
    must be exited first."""
    router = _router()
    if router is None:
        return
    stack = torch.overrides._get_current_function_mode_stack()
    if not stack or stack[-1] is not router:
        raise RuntimeError("opselect.disable(): another torch function mode was entered after "
                           "opselect.enable() and is still active; exit it first")
    router.__exit__(None, None, None)
    _local.router = None


def is_enabled() -> bool:
    return _router() is not None


@contextmanager
def enabled(ops: Optional[Iterable[str]] = None,
            backends: Optional[Mapping[str, str]] = None) -> Iterator[None]:
    """enable() for the block; what was routed before is restored after it."""
    names, forced = _checked(ops, backends)
    router = _router()
    if router is not None:
        before = (router.ops, router.backends)
        router.configure(names, forced)
        try:
            yield
        finally:
            router.configure(*before)
        return
    enable(names, forced)
    try:
        yield
    finally:
        disable()
