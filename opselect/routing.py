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

How: while some thread has routing on, those entry points (the attributes of torch,
torch.special, torch.nn.functional and torch.Tensor named above, 14 in all) are replaced by thin
wrappers that keep the original objects. A wrapper reads this thread's routing (a
threading.local), checks that the call is one opselect takes, and runs opselect's op; anything
else goes to the saved original. Every other torch call and tensor attribute is untouched and
costs nothing extra (a TorchFunctionMode, the first design, put a Python handler on every torch
call of the thread, and on every call that a compiled graph's wrapper code makes at run time).
Routing is per thread: other threads go through the wrappers to the originals (a few hundred
ns on those 14 entry points only). The originals are put back, the exact objects, when the last
thread disables routing (or exits). opselect's own op implementations switch routing off while
they run (routing_state.suspend()), so the `torch` backend's call of torch's op reaches torch's
kernel and never recurses.

Compiled code (torch.compile): Dynamo traces the function wrappers (torch.softmax, F.softmax,
torch.topk, torch.isin, torch.reshape, ...), guards on the patched objects and on this thread's
routing, and calls opselect's library op in its graph (or keeps the aten op where inductor's own
kernel is as good; see opselect/library.py). Dynamo never looks at torch.Tensor's attributes for
a plain tensor's method call (x.topk(k), x.softmax(d), x.contiguous(), x.reshape(...)), so those
stay method calls in Dynamo's graph and are routed when AOTAutograd traces that graph (the
wrappers see its FunctionalTensors; backend="eager" runs the graph's method calls through the
wrappers at run time). Dynamo's guards cannot see that: a function whose only routed calls are
Tensor methods keeps what was decided when it was compiled; compile it after enable() (or call
torch._dynamo.reset() after switching routing). Under the "auto" rule only x.topk is affected:
a method-form softmax, contiguous or reshape compiles to the aten op either way.

torch._dynamo is imported by the first enable() (about a second once, if the program has not
imported it yet): Dynamo builds its tables of torch's functions from torch's attribute names the
first time it is imported, and must see the originals there, not the wrappers. TorchScript
(torch.jit.script) of a function that calls a routed entry point fails while routing is on.
"""

from __future__ import annotations

import functools
import sys
import threading
import warnings
import weakref
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional

import torch
import torch.nn.functional as F
from torch._subclasses.functional_tensor import FunctionalTensor
import torch.autograd.forward_ad as _fwad
from torch.compiler import is_compiling as _compiling

from . import library as _library
from . import routing_state as _state
from . import usage as _usage
from .dispatch.op import Op
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
from .dispatch.tuning_mode import state as _tuning_state

OPS = ("isin", "topk", "permute", "softmax", "log_softmax")

#: What a handler returns for a call opselect does not take: the wrapper then calls torch.
PASS = NotImplemented
# torch's own ops, never the wrappers installed over torch.softmax & co: a handler whose call's
# route is torch's op answers with these at once (positional arguments: quicker to parse), where
# passing the call on to the original entry point would run F.softmax's Python and re-enter the
# Tensor.softmax wrapper, with routing suspended around it.
_VF = torch._C._VariableFunctions
_TORCH_SOFTMAX, _TORCH_LOG_SOFTMAX, _TORCH_TOPK, _TORCH_ISIN = (
    _VF.softmax, _VF.log_softmax, _VF.topk, _VF.isin)
_PLAIN = (torch.Tensor, torch.nn.Parameter)
_TENSOR, _STRIDED = torch.Tensor, torch.strided
_FLOATS = frozenset((torch.float16, torch.bfloat16, torch.float32, torch.float64))
_thread = _state._local
_functorch_active = torch._C._are_functorch_transforms_active
_HERE = __file__


def _takes(x: Any) -> bool:
    """A tensor opselect takes: a plain one (also what Dynamo's traced code sees), or, while
    AOTAutograd traces a graph, the functional tensor of a call that the graph itself makes (a
    Tensor method call that Dynamo left in its graph), not one made by torch's own
    decompositions (torch._decomp's matmul reshapes its operands, for instance)."""
    kind = type(x)
    return kind in _PLAIN or (kind is FunctionalTensor and _graph_call())


def _tracing(x: Any) -> bool:
    """A traced call: Dynamo is tracing, or AOTAutograd is (x is one of its functional tensors;
    torch 2.11's torch.compiler.is_compiling() is False there, 2.13's True)."""
    return _compiling() or type(x) is FunctionalTensor


def _graph_call() -> bool:
    """The routed call comes from an FX graph's code or from an FX Interpreter running a
    graph's call_method node."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename == _HERE:
        frame = frame.f_back
    if frame is None:
        return False
    code = frame.f_code
    return code.co_filename.startswith("<eval_with_key>") or (
        code.co_name == "call_method"
        and code.co_filename.replace("\\", "/").endswith("torch/fx/interpreter.py"))


def _arg(args: tuple, kwargs: Mapping[str, Any], i: int, name: str, default: Any = None) -> Any:
    if len(args) > i:
        return args[i]
    return kwargs.get(name, default)


def _known(kwargs: Mapping[str, Any], names: frozenset) -> bool:
    for k in kwargs:
        if k not in names:
            return False
    return True


#: forced_routes' answer for a call not seen yet (None there means torch's op)
_UNSEEN = object()


def _route(op: Op, key: Optional[tuple], backend: Optional[str]) -> Any:
    """The route of an eager call decided before (Op.routes, keyed as ops.py keys them): PASS
    where it is torch's op (the wrapper then calls the original entry point: nothing of
    opselect's runs in between), the chosen backend's prepared call, or None for a call not
    decided yet (or whose route waits while tuning is on). The call is counted (stats())."""
    if key is None:
        return None
    if backend is None:
        route = op.routes.get(key)
        if route is None or not (route[1] or not _tuning_state.active):
            return None
        _usage.count(op.name, route[2])
        return PASS if route[0] is None else route[0]
    prepared = op.forced_routes.get((backend, key), _UNSEEN)
    if prepared is _UNSEEN:
        return None
    _usage.count(op.name, backend)
    return PASS if prepared is None else prepared


def _prepared(prepared: Callable, *tensors) -> Any:
    """A backend's prepared call, with routing off meanwhile (a tensor method it calls, such as
    contiguous(), must reach torch's own)."""
    token = _state.suspend()
    try:
        return prepared(*tensors)
    finally:
        _state.resume(token)


def _counted(op: Op, prepare: Callable, backend: Optional[str], key: Optional[tuple], *args,
             **kwargs):
    """An eager routed call seen for the first time: prepare(*args, **kwargs) and run it, which
    installs its route under `key`, with routing off meanwhile (the `torch` backend calls
    torch's own op, which must not come back here)."""
    token = _state.suspend()
    try:
        call = prepare(*args, **kwargs)
        result = op.run(call, backend, key)
    finally:
        _state.resume(token)
    _usage.record_run(op, call, backend)
    return result


# ---------------------------------------------------------------------------------------------
# Handlers: (router, args, kwargs) -> result, or PASS
# ---------------------------------------------------------------------------------------------
_ISIN_KW = frozenset(("elements", "test_elements", "assume_unique", "invert"))


def _isin_handler(router: _state.Router, args: tuple, kwargs: dict) -> Any:
    elements = _arg(args, kwargs, 0, "elements")
    test = _arg(args, kwargs, 1, "test_elements")
    if (len(args) > 2 or not _known(kwargs, _ISIN_KW) or not _takes(elements)
            or not _takes(test)):
        return PASS
    assume_unique = bool(kwargs.get("assume_unique", False))
    invert = bool(kwargs.get("invert", False))
    if (elements.dtype not in _isin._SUPPORTED or test.dtype not in _isin._SUPPORTED
            or elements.device != test.device):
        return PASS
    backend = router.backends.get("isin")
    if _tracing(elements):
        return _library.isin(elements, test, assume_unique, invert, None, backend)
    key = _isin_key(elements, test, assume_unique, invert)
    route = _route(_isin.OP, key, backend)
    if route is not None:
        if route is PASS:
            return _TORCH_ISIN(elements, test, assume_unique=assume_unique, invert=invert)
        return _prepared(route, elements, test)
    return _counted(_isin.OP, _isin.prepare, backend, key, elements, test,
                    assume_unique=assume_unique, invert=invert)


_TOPK_KW = frozenset(("input", "k", "dim", "largest", "sorted"))
_TOPK_DTYPES = frozenset(_topk.SUPPORTED_DTYPES)


def _topk_handler(router: _state.Router, args: tuple, kwargs: dict) -> Any:
    n = len(args)
    if n > 5 or (kwargs and not _known(kwargs, _TOPK_KW)):
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
        return _library.topk(x, k, dim, largest, sorted_, backend)
    key = _topk_key(x, k, dim, largest, sorted_)
    route = _route(_topk.OP, key, backend)
    if route is not None:
        return _TORCH_TOPK(x, k, dim, largest, sorted_) if route is PASS else \
            _prepared(route, x)
    return _counted(_topk.OP, _prepare_topk, backend, key, key, x, k, dim, largest, sorted_)


_SOFTMAX_KW = frozenset(("input", "dim", "dtype", "_stacklevel"))


def _softmax_handler(log: bool, functional: bool) -> Callable[[_state.Router, tuple, dict], Any]:
    """torch.softmax(input, dim, dtype=None), Tensor.softmax(dim, dtype=None) and
    F.softmax(input, dim=None, _stacklevel=3, dtype=None) (functional: dtype is 4th)."""
    name = "log_softmax" if log else "softmax"
    op = _softmax.LOG_SOFTMAX_OP if log else _softmax.SOFTMAX_OP
    compiled = _library.log_softmax if log else _library.softmax
    torch_op = _TORCH_LOG_SOFTMAX if log else _TORCH_SOFTMAX

    dtype_at, most = (3, 4) if functional else (2, 3)

    def handler(router: _state.Router, args: tuple, kwargs: dict) -> Any:
        n = len(args)
        if n > most or (kwargs and not _known(kwargs, _SOFTMAX_KW)):
            return PASS
        if kwargs:
            x = args[0] if n else kwargs.get("input")
            dim = args[1] if n > 1 else kwargs.get("dim")
            dtype = args[dtype_at] if n > dtype_at else kwargs.get("dtype")
        else:
            x = args[0] if n else None
            dim = args[1] if n > 1 else None
            dtype = args[dtype_at] if n > dtype_at else None
        if type(x) is _TENSOR and type(dim) is int and x.layout is _STRIDED and \
                not _compiling():
            # An eager plain call decided before: its route, before the checks below (the
            # route's key holds what they read, and a route is made only past them).
            route = _route(op, _softmax_key(log, x, dim, dtype), router.backends.get(name))
            if route is not None:
                return torch_op(x, dim, dtype) if route is PASS else _prepared(route, x)
        if (not _takes(x) or type(dim) is not int or x.layout != torch.strided
                or (dtype if dtype is not None else x.dtype) not in _FLOATS):
            return PASS  # an implicit or named dim, an integer input, a subclass: torch's
        backend = router.backends.get(name)
        if _tracing(x):
            return compiled(x, dim, dtype, backend)
        key = _softmax_key(log, x, dim, dtype)
        route = _route(op, key, backend)
        if route is not None:
            return torch_op(x, dim, dtype) if route is PASS else _prepared(route, x)
        return _counted(op, _prepare_softmax, backend, key, name, log, key, x, dim, dtype)

    return handler


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


def _copy_of_view(router: _state.Router, x: torch.Tensor) -> Any:
    dims = _identity(x.dim())
    backend = router.backends.get("permute")
    if _tracing(x):
        return _library.permute(x, dims, None, backend)
    key = _permute_key(x, dims)
    route = _route(_permute.OP, key, backend)
    if route is not None:
        return route if route is PASS else _prepared(route, x)
    return _counted(_permute.OP, _permute.prepare_keyed, backend, key, key, x, dims)


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
    if _tracing(x) and _library._symbolic(x):
        return False  # a symbolic size: torch's op (guarding a layout would specialize it)
    return not x.is_contiguous() and _dense_permuted(x)


def _contiguous_handler(router: _state.Router, args: tuple, kwargs: dict) -> Any:
    x = args[0] if args else kwargs.get("self")
    if _already_contiguous(x):
        return PASS
    if (len(args) > 1 or kwargs) and _arg(args, kwargs, 1, "memory_format",
                                          torch.contiguous_format) is not torch.contiguous_format:
        return PASS
    if type(x) is _TENSOR and not _compiling():
        # A layout decided before: its route answers, without _plain_view's checks again (the
        # key holds the whole layout, and a route is made only for a call that passed them,
        # or for ops.permute's own copy of that layout, which is as right).
        route = _route(_permute.OP, _permute_key(x, _identity(x.dim())),
                       router.backends.get("permute"))
        if route is not None:
            return route if route is PASS else _prepared(route, x)
    if not _plain_view(x):
        return PASS
    return _copy_of_view(router, x)


#: The identity permutation of each rank up to 16: the dims of the copy contiguous() makes.
_IDENTITY = tuple(tuple(range(n)) for n in range(17))


def _identity(rank: int) -> tuple:
    return _IDENTITY[rank] if rank < 17 else tuple(range(rank))


def _reshape_handler(router: _state.Router, args: tuple, kwargs: dict) -> Any:
    """Tensor.reshape(*shape) / Tensor.reshape(shape) / torch.reshape(input, shape)."""
    x = args[0] if args else kwargs.get("input", kwargs.get("self"))
    if _already_contiguous(x) or not _plain_view(x):
        return PASS
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
    if not all(type(s) is int for s in shape):
        return PASS
    target = _infer(shape, x.numel())
    if target is None or _view_strides(tuple(x.shape), x.stride(), target) is not None:
        return PASS  # a view does it (or the shape is wrong: torch says why)
    copy = _copy_of_view(router, x)
    return copy if copy is PASS else copy.view(target)  # (PASS: torch's reshape copies)


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


_ENTRY_POINTS: list[tuple[str, Any, str, Callable, bool]] = [
    # (op, owner, attribute, handler, whether the original is Python that calls another entry
    # point: F.softmax calls Tensor.softmax, which must not route a call F.softmax passed on)
    ("isin", torch, "isin", _isin_handler, False),
    ("topk", torch, "topk", _topk_handler, False),
    ("topk", torch.Tensor, "topk", _topk_handler, False),
    ("softmax", torch, "softmax", _softmax_handler(False, False), False),
    ("softmax", torch.special, "softmax", _softmax_handler(False, False), False),
    ("softmax", torch.Tensor, "softmax", _softmax_handler(False, False), False),
    ("softmax", F, "softmax", _softmax_handler(False, True), True),
    ("log_softmax", torch, "log_softmax", _softmax_handler(True, False), False),
    ("log_softmax", torch.special, "log_softmax", _softmax_handler(True, False), False),
    ("log_softmax", torch.Tensor, "log_softmax", _softmax_handler(True, False), False),
    ("log_softmax", F, "log_softmax", _softmax_handler(True, True), True),
    ("permute", torch.Tensor, "contiguous", _contiguous_handler, False),
    ("permute", torch.Tensor, "reshape", _reshape_handler, False),
    ("permute", torch, "reshape", _reshape_handler, False),
]


def _entry(op: str, original: Callable, handler: Callable, calls_entries: bool,
           layout: bool = False) -> Callable:
    """The wrapper installed in place of `original`; `layout`: an entry that copies a view
    (Tensor.contiguous, reshape), which most calls reach with a contiguous tensor."""

    def routed(*args, **kwargs):
        router = getattr(_thread, "router", None)
        if router is None or op not in router.ops:
            return original(*args, **kwargs)
        if (not _compiling() and (_functorch_active() or _fwad._current_level >= 0)
                and not (args and type(args[0]) is FunctionalTensor)):
            # A function transform (forward-mode AD, torch.func) is watching: torch's op takes
            # the call with every rule the transform needs.
            return original(*args, **kwargs)
        result = handler(router, args, kwargs)
        if result is not PASS:
            return result
        if calls_entries and not _compiling():
            if len(args) < 3 and "_stacklevel" not in kwargs:
                kwargs["_stacklevel"] = 4  # F.softmax's warning names the caller, not this frame
            token = _state.suspend()
            try:
                return original(*args, **kwargs)
            finally:
                _state.resume(token)
        return original(*args, **kwargs)

    if layout:
        general = routed

        def routed(*args, **kwargs):  # noqa: F811 (the layout entries' wrapper, around it)
            # The common call of a model's .contiguous() or .reshape(): an eager, plain,
            # contiguous tensor, which torch's entry answers (the tensor itself, or a view)
            # whatever the routing. Four checks, before anything else.
            if args:
                x = args[0]
                if (type(x) is _TENSOR and x.layout is _STRIDED and not _compiling()
                        and x.is_contiguous()):
                    return original(*args, **kwargs)
            return general(*args, **kwargs)

    functools.update_wrapper(routed, original)  # name, doc; __wrapped__ is the original
    return routed


# (owner, attribute, original, wrapper, whether owner's own __dict__ held the original)
_installed: list[tuple[Any, str, Callable, Callable, bool]] = []
_install_lock = threading.Lock()
_leases = 0
_user_cache_tag: Optional[str] = None


def _tag_compile_caches(router: Optional[_state.Router]) -> None:
    """Put the routing in torch.compile's cache keys (torch.compiler.config.cache_key_tag, part
    of the AOTAutograd and FX graph cache keys): a graph whose Tensor-method calls were routed
    when AOTAutograd traced it is never loaded from the on-disk cache by a program that routes
    differently, or not at all (those keys are taken from Dynamo's graph, which is the same).
    The tag follows the last change of any thread's routing; the program's own tag is kept in
    front and restored when routing ends."""
    config = getattr(torch.compiler, "config", None)
    if config is None or not hasattr(config, "cache_key_tag") or _user_cache_tag is None:
        return
    mark = "off" if router is None else (
        f"{','.join(sorted(router.ops))};"
        + ",".join(f"{op}={name}" for op, name in sorted(router.backends.items())))
    config.cache_key_tag = f"{_user_cache_tag}|opselect routing {mark}"


def _set_router(router: Optional[_state.Router]) -> None:
    _state.set_current(router)
    _tag_compile_caches(router)


def _prepare_dynamo() -> None:
    """Dynamo's tables of torch's functions are built from torch's attribute names (on import,
    and Tensor's methods on first use): build them now, while the attributes are torch's own."""
    import torch._dynamo  # noqa: F401
    from torch._dynamo import trace_rules

    for table in ("get_torch_obj_rule_map", "get_tensor_method"):
        if hasattr(trace_rules, table):
            getattr(trace_rules, table)()


def _install() -> None:
    global _user_cache_tag
    _prepare_dynamo()
    config = getattr(torch.compiler, "config", None)
    _user_cache_tag = getattr(config, "cache_key_tag", None)
    for op, owner, name, handler, calls_entries in _ENTRY_POINTS:
        own = name in vars(owner)
        original = getattr(owner, name)
        wrapper = _entry(op, original, handler, calls_entries,
                         layout=handler in (_contiguous_handler, _reshape_handler))
        setattr(owner, name, wrapper)
        _installed.append((owner, name, original, wrapper, own))


def _uninstall() -> None:
    global _user_cache_tag
    if _user_cache_tag is not None:
        torch.compiler.config.cache_key_tag = _user_cache_tag
        _user_cache_tag = None
    replaced = []
    while _installed:
        owner, name, original, wrapper, own = _installed.pop()
        if vars(owner).get(name) is not wrapper:
            replaced.append(f"{getattr(owner, '__name__', owner)}.{name}")
            continue  # someone patched over ours: theirs stays (ours passes calls through)
        if own:
            setattr(owner, name, original)
        else:
            delattr(owner, name)
    if replaced:
        warnings.warn("opselect.disable(): left in place what replaced opselect's wrappers of "
                      + ", ".join(replaced), RuntimeWarning, stacklevel=3)


def _release() -> None:
    global _leases
    with _install_lock:
        _leases -= 1
        if _leases == 0:
            _uninstall()


class _Lease:
    """Held by each thread with routing on (in its threading.local): when the thread disables
    routing or ends, the lease goes and its finalizer releases the entry points."""

    __slots__ = ("__weakref__",)


def _acquire() -> None:
    global _leases
    with _install_lock:
        if _leases == 0 and not _installed:
            _install()
        _leases += 1
    lease = _Lease()
    weakref.finalize(lease, _release)
    _thread.lease = lease


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
    if getattr(_thread, "lease", None) is None:
        _acquire()
    _set_router(_state.Router(names, forced))


def disable() -> None:
    """Stop routing this thread's calls (a no-op when not enabled). The original entry points
    are restored when no thread routes any more."""
    if getattr(_thread, "lease", None) is None:
        return
    _set_router(None)
    _thread.lease = None  # its finalizer releases the entry points


def is_enabled() -> bool:
    return getattr(_thread, "lease", None) is not None


@contextmanager
def enabled(ops: Optional[Iterable[str]] = None,
            backends: Optional[Mapping[str, str]] = None) -> Iterator[None]:
    """enable() for the block; what was routed before is restored after it."""
    names, forced = _checked(ops, backends)
    if not is_enabled():
        enable(names, forced)
        try:
            yield
        finally:
            disable()
        return
    before = _state.current()
    _set_router(_state.Router(names, forced))
    try:
        yield
    finally:
        _set_router(before)
