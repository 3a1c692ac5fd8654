"""The registry of ops by name. Every op is registered by the time anyone can ask: importing any
module of opselect first runs the package's __init__, which imports ops.py and so every
kernels/<op> package (dispatch never imports the ops: they sit above it)."""

from __future__ import annotations

from typing import Any, Iterable

from ..errors import BackendError

_registry: dict[str, Any] = {}


def register(op: Any) -> Any:
    _registry[op.name] = op
    return op


def get_op(name: str) -> Any:
    try:
        return _registry[name]
    except KeyError:
        raise BackendError(f"unknown op {name!r}; known ops: {', '.join(sorted(_registry))}") from None


def all_ops() -> Iterable[Any]:
    return list(_registry.values())
