"""The plug-in API: add an op, or a backend to an existing op, from a package of your own.

Everything a user's op needs is re-exported here (and from `opselect` itself), so a plug-in
never imports opselect's private modules:

    Op, Call, Backend, PlannedBackend, TorchBackend, Estimate   the dispatcher's contract
    Launcher, plan_launcher, allocator, cdiv                     the prepared launch path
    bucket, device_info                                          a Call's key and device facts
    register_op, unregister_op, add_backend, remove_backend      the registry

docs/EXTENDING.md walks through examples/vector_add.py (a new op) and a backend added to isin.
What this module exports is the stable surface; anything imported from elsewhere in opselect
may change without notice.
"""

from __future__ import annotations

import re

from .dispatch.backend import Backend, Config, Estimate, PlannedBackend, TorchBackend
from .dispatch.choices import Call
from .dispatch.device import DeviceInfo, device_info
from .dispatch.op import Op
from .dispatch.registry import _registry, get_op
from .dispatch.signature import bucket
from .errors import BackendError, InvalidArgument, UnsupportedDType
from .heuristics.device_model import ALLOCATION, BOUND_LAUNCH, DeviceModel
from .kernels._common import Launcher, allocator, cdiv, check_config, plan_launcher

__all__ = ["ALLOCATION", "BOUND_LAUNCH", "Backend", "Call", "Config", "DeviceInfo", "DeviceModel",
           "Estimate", "InvalidArgument", "Launcher", "Op", "PlannedBackend", "TorchBackend",
           "UnsupportedDType", "add_backend", "allocator", "bucket", "cdiv", "check_config",
           "device_info", "plan_launcher", "register_op", "remove_backend", "unregister_op"]

#: Op and backend names go into tune-cache keys ("<device>|<op>|<key>") and calibration scales
#: ("<op>/<backend>"): a name is a plain identifier, so no name can reach into another's key.
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: Backend names the dispatcher itself gives a meaning (backend="auto" is auto selection).
_RESERVED = frozenset({"auto"})


def register_op(op: Op) -> Op:
    """Register a new op so that `opselect.get_op(name)`, `opselect.explain(name, ...)`, tuning
    and the tune cache know it, and return it. The op object is the op's function:
    `op(*args, backend=None, **kwargs)` prepares the call and runs the chosen (or the named)
    backend.

    Refused with BackendError: a name another op has (opselect's own included), a name that is
    not a plain identifier, a first backend that is not torch's, two backends of one name.
    Where the op has no public function of its own, the op itself becomes it (`op.public`):
    tuning then times each candidate through the call as the program makes it."""
    if not isinstance(op, Op):
        raise BackendError(f"register_op takes an opselect.Op, got {type(op).__name__}")
    _check_name("op", op.name)
    if op.name in _registry:
        raise BackendError(f"an op named {op.name!r} is registered already "
                           f"({_where(_registry[op.name])}); pick another name")
    seen: set[str] = set()
    for backend in op.backends:
        _check_backend(op.name, backend, seen)
    if op.public is None:
        op.public = op
    _registry[op.name] = op
    return op


def unregister_op(name: str) -> Op:
    """Remove the op registered under `name` and return it (a plug-in unloading itself, a test
    cleaning up). opselect's own ops cannot be removed. The tune cache keeps the op's records:
    registering it again finds them."""
    op = get_op(name)
    if _is_builtin(op):
        raise BackendError(f"{name!r} is one of opselect's own ops; it cannot be unregistered")
    del _registry[name]
    op.forget()
    return op


def add_backend(op: str | Op, backend: Backend) -> Backend:
    """Add a backend to a registered op (opselect's own, such as "isin", or a plug-in's), after
    its existing backends. From then on it is a candidate of auto selection (the cost model and
    tuning rank it with the others), `backend="<its name>"` forces it, `explain` lists it and
    the tune cache keeps its timings under its own source hash. Every choice this process made
    for the op is dropped, so calls are decided again with the new candidate.

    Refused with BackendError: a name one of the op's backends has, "auto", or a name that is not
    a plain identifier."""
    target = get_op(op) if isinstance(op, str) else op
    _check_backend(target.name, backend, set(target.backend_names))
    target.backends = (*target.backends, backend)
    target._by_name[backend.name] = backend
    target.forget()
    return backend


def remove_backend(op: str | Op, name: str) -> Backend:
    """Remove a backend that add_backend added (or any but torch from a plug-in's op) and return
    it; the op's choices are decided again. opselect's own backends of its own ops stay."""
    target = get_op(op) if isinstance(op, str) else op
    backend = target.backend(name)  # an unknown name: BackendError listing the valid ones
    if backend is target.backends[0] or (_is_builtin(target) and _is_builtin(backend)):
        raise BackendError(f"{target.name}: backend {name!r} is not one a plug-in added; "
                           "it cannot be removed")
    target.backends = tuple(b for b in target.backends if b is not backend)
    del target._by_name[name]
    target.forget()
    return backend


def _check_name(what: str, name: object) -> None:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise BackendError(f"{what} name {name!r}: expected a plain identifier (letters, digits "
                           "and '_'; it is part of the tune cache's keys)")


def _check_backend(op: str, backend: object, taken: set[str]) -> None:
    if not isinstance(backend, Backend):
        raise BackendError(f"{op}: a backend must be an opselect.Backend, "
                           f"got {type(backend).__name__}")
    name = backend.name
    _check_name(f"{op}: backend", name)
    if name in _RESERVED:
        raise BackendError(f"{op}: backend name {name!r} is reserved (backend='auto' asks for "
                           "auto selection)")
    if name in taken:
        raise BackendError(f"{op}: a backend named {name!r} exists already; pick another name")
    taken.add(name)


def _is_builtin(thing: object) -> bool:
    """Whether an op (by its prepare function) or a backend (by its class) is opselect's own."""
    source = thing.prepare if isinstance(thing, Op) else type(thing)
    module = getattr(source, "__module__", "") or ""
    return module == "opselect" or module.startswith("opselect.")


def _where(op: Op) -> str:
    return "one of opselect's own ops" if _is_builtin(op) else \
        f"by {getattr(op.prepare, '__module__', '?')}"
