"""opselect.enable(): a program's own torch calls go through opselect, with no edits to it.

    opselect.enable()                          every op on by default, from here on (this thread)
    opselect.disable()
    with opselect.enabled(ops=["softmax", "topk"]):
        model.generate(...)
    opselect.enable(ops=["matmul"])            matmul and linear (off by default)
    opselect.stats()                           calls per op, and the backends that ran

Routed: torch.isin; torch.topk and Tensor.topk; torch.softmax, torch.nn.functional.softmax,
Tensor.softmax, torch.special.softmax and the same forms of log_softmax; F.cross_entropy (and
nn.CrossEntropyLoss) with class indices, as op log_softmax (its log_softmax through opselect,
then torch's nll_loss, as torch composes it; rows of logits that fill the GPU take the fused loss
of kernels/softmax/cross_entropy.py); and the copy of a permuted
view: x.permute(...).contiguous(), x.transpose(a, b).contiguous(), and x.reshape(...) (or
torch.reshape) of such a view where the reshape has to copy. Calls opselect does not take (a
tensor subclass, an out= argument, a named dim, an implicit softmax dim, a view with gaps, a
memory format other than contiguous) reach torch's own function untouched.

Off by default, routed only when named (ops=["matmul"] routes all five below, ops=["linear"]
the last two): torch.matmul, Tensor.matmul and Tensor.__matmul__ (a @ b; Tensor.__rmatmul__
calls torch.matmul) as op matmul; torch.nn.functional.linear (nn.Linear) and torch.addmm with
beta = alpha = 1 and a bias row (Hugging Face's Conv1D) as op linear. float16, bfloat16 and
float32 only: any other dtype, out=, other scales of addmm, a full addmm input matrix reach torch
untouched. Their entry points are installed only once some thread routes them (OFF_BY_DEFAULT):
a program that does not ask for them pays nothing on its products.

How: while some thread has routing on, those entry points (the attributes of torch,
torch.special, torch.nn.functional and torch.Tensor named above, 20 in all) are replaced by thin
wrappers that keep the original objects. A wrapper reads this thread's routing (a
threading.local), checks that the call is one opselect takes, and runs opselect's op; anything
else goes to the saved original. Every other torch call and tensor attribute is untouched and
costs nothing extra (a TorchFunctionMode, the first design, put a Python handler on every torch
call of the thread, and on every call that a compiled graph's wrapper code makes at run time).
Routing is per thread: other threads go through the wrappers to the originals (a few hundred
ns on those entry points only). Each op's handlers, and the entry points it takes over, are in
its front (opselect/fronts/<op>.py); this module installs them. The originals are put back, the exact objects, when the last
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
torch._dynamo.reset() after switching routing). Under the "auto" rule only x.topk and
x.matmul are affected: a method-form softmax, contiguous or reshape compiles to the aten op
either way. `a @ b` stays operator.matmul in Dynamo's graph: backend="eager" routes it at run
time, and AOTAutograd's trace (aot_eager, inductor) runs it as an FX Interpreter's
call_function whose target reaches the wrapper directly, which the routing takes as the
program's own call (fronts/_base.py's _graph_call), as it does torch.matmul, F.linear and
torch.addmm (what nn.Linear and Hugging Face's models call).

torch._dynamo is imported by the first enable() (about a second once, if the program has not
imported it yet): Dynamo builds its tables of torch's functions from torch's attribute names the
first time it is imported, and must see the originals there, not the wrappers. Under
torch.autocast a routed call follows torch's policy for its op (fronts/_base.py's
autocast_float32; matmul and linear under autocast are torch's). TorchScript (torch.jit.script)
of a function that calls a routed entry point fails while routing is on.
"""

from __future__ import annotations

import functools
import threading
import warnings
import weakref
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional

import torch
import torch.autograd.forward_ad as _fwad
from torch._subclasses.functional_tensor import FunctionalTensor
from torch.compiler import is_compiling as _compiling

from . import routing_state as _state
from .fronts import isin as _isin_front
from .fronts import matmul as _matmul_front
from .fronts import permute as _permute_front
from .fronts import softmax as _softmax_front
from .fronts import topk as _topk_front
from .fronts._base import _STRIDED, _TENSOR, PASS

OPS = ("isin", "topk", "permute", "softmax", "log_softmax", "matmul", "linear")
#: Routed only when named in enable(ops=...), until their kernels hold their targets (issue 36).
OFF_BY_DEFAULT = frozenset(("matmul", "linear"))
#: A name that routes several ops: matmul's products include linear's (nn.Linear, Conv1D).
_GROUPS = {"matmul": ("matmul", "linear")}

_thread = _state._local
_functorch_active = torch._C._are_functorch_transforms_active


#: (op, owner, attribute, handler, whether the original is Python that calls another entry point
#: (F.softmax calls Tensor.softmax, which must not route a call F.softmax passed on), whether it
#: copies a view (contiguous, reshape)): each op's handlers are in its front.
_ENTRY_POINTS: list[tuple[str, Any, str, Callable, bool, bool]] = [
    *_isin_front.ENTRY_POINTS, *_topk_front.ENTRY_POINTS, *_softmax_front.ENTRY_POINTS,
    *_permute_front.ENTRY_POINTS, *_matmul_front.ENTRY_POINTS]


def _entry(op: str, original: Callable, handler: Callable, calls_entries: bool,
           layout: bool = False) -> Callable:
    """The wrapper installed in place of `original`; `layout`: an entry that copies a view
    (Tensor.contiguous, reshape), which most calls reach with a contiguous tensor."""

    def routed(*args, **kwargs):
        router = getattr(_thread, "router", None)
        if router is None or op not in router.ops:
            return original(*args, **kwargs)
        if ((_functorch_active() or _fwad._current_level >= 0) and not _compiling()
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
        eager = handler.eager  # the front's handler of an eager plain view (no re-checks)

        def routed(*args, **kwargs):  # noqa: F811 (the layout entries' wrapper, around it)
            # A model calls .contiguous() and .reshape() many times a layer, mostly on
            # contiguous tensors, which torch's entry answers (the tensor itself, or a view)
            # whatever the routing: four checks, before anything else. An eager plain view
            # that is not contiguous goes straight to the front's eager handler, which skips
            # the general path's checks (in a model's forward, between other layers' work,
            # each step of Python costs 3-5 times its microbenchmark: caches are cold).
            if args:
                x = args[0]
                if type(x) is _TENSOR and x.layout is _STRIDED and not _compiling():
                    if x.is_contiguous():
                        return original(*args, **kwargs)
                    router = getattr(_thread, "router", None)
                    if (router is None or op not in router.ops or _functorch_active()
                            or _fwad._current_level >= 0):
                        return original(*args, **kwargs)
                    result = eager(router, x, args, kwargs)
                    return original(*args, **kwargs) if result is PASS else result
            return general(*args, **kwargs)

    functools.update_wrapper(routed, original)  # name, doc; __wrapped__ is the original
    return routed


# (owner, attribute, original, wrapper, whether owner's own __dict__ held the original)
_installed: list[tuple[Any, str, Callable, Callable, bool]] = []
#: the ops whose entry points are installed
_installed_ops: set[str] = set()
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


def _install(ops: Iterable[str]) -> None:
    """Install the entry points of `ops` not installed yet (all of them the first time, but
    for the ops off by default: those once some thread names them)."""
    global _user_cache_tag
    if not _installed:
        _prepare_dynamo()
        config = getattr(torch.compiler, "config", None)
        _user_cache_tag = getattr(config, "cache_key_tag", None)
    wanted = (set(OPS) - OFF_BY_DEFAULT) | set(ops)
    for op, owner, name, handler, calls_entries, layout in _ENTRY_POINTS:
        if op not in wanted or op in _installed_ops:
            continue
        own = name in vars(owner)
        original = getattr(owner, name)
        wrapper = _entry(op, original, handler, calls_entries, layout)
        setattr(owner, name, wrapper)
        _installed.append((owner, name, original, wrapper, own))
    _installed_ops.update(wanted)


def _uninstall() -> None:
    global _user_cache_tag
    if _user_cache_tag is not None:
        torch.compiler.config.cache_key_tag = _user_cache_tag
        _user_cache_tag = None
    replaced = []
    _installed_ops.clear()
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


def _acquire(ops: Iterable[str]) -> None:
    """This thread routes `ops` from now on: their entry points installed (the first thread's
    lease installs every op's but those off by default), a lease held."""
    global _leases
    with _install_lock:
        _install(ops)
        if getattr(_thread, "lease", None) is not None:
            return
        _leases += 1
    lease = _Lease()
    weakref.finalize(lease, _release)
    _thread.lease = lease


def _checked(ops: Optional[Iterable[str]], backends: Optional[Mapping[str, str]]):
    if ops is None:
        names = tuple(op for op in OPS if op not in OFF_BY_DEFAULT)
    else:
        names = []
        for name in ([ops] if isinstance(ops, str) else ops):
            if name not in OPS:
                raise ValueError(f"opselect.enable: unknown op {name!r}; expected some of "
                                 f"{', '.join(OPS)}")
            names.extend(n for n in _GROUPS.get(name, (name,)) if n not in names)
        names = tuple(names)
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
    """Route this thread's torch calls of `ops` (default: isin, topk, permute, softmax and
    log_softmax; matmul and linear only when named: "matmul" routes both) through opselect
    until disable(). `backends` forces a backend per op ({"softmax": "fused"}); otherwise the
    dispatcher chooses. Calling enable() again changes which ops are routed."""
    names, forced = _checked(ops, backends)
    _acquire(names)
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
    with _install_lock:
        _install(names)
    _set_router(_state.Router(names, forced))
    try:
        yield
    finally:
        _set_router(before)
