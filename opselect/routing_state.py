"""Which thread routes its torch calls through opselect (opselect.enable()), shared by routing.py
(the patched entry points read it) and library.py (whose op implementations switch it off while
they run, so that torch's own op, called by the `torch` backend or by a trace-time fallback,
reaches torch's kernel instead of coming back through a patched entry point).

Per thread: a threading.local. Dynamo traces the read in a compiled function and guards on it,
so a function compiled while routing is on recompiles when it is called with routing off.
"""

from __future__ import annotations

import threading
from typing import Any, Optional

_local = threading.local()


class Router:
    """One thread's routing: the ops routed and the backends forced. Immutable: enable() with
    other ops makes a new one, so a compiled function's guard on it sees the change."""

    __slots__ = ("ops", "backends")

    def __init__(self, ops, backends) -> None:
        self.ops = frozenset(ops)
        self.backends = dict(backends)

    def __repr__(self) -> str:
        return f"Router(ops={sorted(self.ops)}, backends={self.backends})"


def current() -> Optional[Router]:
    return getattr(_local, "router", None)


def set_current(router: Optional[Router]) -> None:
    _local.router = router


def suspend() -> Any:
    """Switch this thread's routing off; returns what resume() needs to switch it back on."""
    router = getattr(_local, "router", None)
    if router is not None:
        _local.router = None
    return router


def resume(token: Any) -> None:
    if token is not None:
        _local.router = token
