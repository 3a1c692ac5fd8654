"""One warning per kind of trouble per process: a broken cache must not flood the user's log."""

from __future__ import annotations

import warnings

from ..errors import CacheWarning

_warned: set[str] = set()


def warn_once(kind: str, message: str) -> None:
    if kind in _warned:
        return
    _warned.add(kind)
    warnings.warn(f"opselect tune cache: {message}", CacheWarning, stacklevel=4)


def forget_warnings() -> None:
    _warned.clear()
