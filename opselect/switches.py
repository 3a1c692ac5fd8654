"""Environment switches that change what a backend runs, registered where they are read.

A switch such as OPSELECT_TOPK_PDL=0 changes the kernels a backend launches, so timings measured
with it on must not be trusted with it off. Reading a switch through `switch()` records its name,
value and the module that read it: every registered switch is part of the tune cache's
environment fingerprint, and a backend's source hash takes the switches read by the modules its
code lives in (see dispatch/source_hash.py). Read once at import: a switch is not meant to flip
inside a running process.
"""

from __future__ import annotations

import os
import sys

#: name -> (value as read, the modules that read it)
_READ: dict[str, tuple[str, set[str]]] = {}


def switch(name: str, default: str) -> str:
    """The value of environment variable `name` (or `default`), recorded for the cache keys."""
    value = os.environ.get(name, default)
    module = sys._getframe(1).f_globals.get("__name__", "?")
    _, readers = _READ.setdefault(name, (value, set()))
    readers.add(module)
    return value


def enabled(name: str, default: bool = True) -> bool:
    """A boolean switch: anything but "0" (or empty) turns it on."""
    module = sys._getframe(1).f_globals.get("__name__", "?")
    value = os.environ.get(name, "1" if default else "0")
    _, readers = _READ.setdefault(name, (value, set()))
    readers.add(module)
    return value not in ("", "0")


def all_switches() -> str:
    """Every switch read so far, as "NAME=value" joined by commas (stable order)."""
    return ",".join(f"{name}={value}" for name, (value, _) in sorted(_READ.items()))


def read_by(modules: set[str]) -> list[str]:
    """The switches (as "NAME=value") that any of `modules` read."""
    return [f"{name}={value}" for name, (value, readers) in sorted(_READ.items())
            if readers & modules]
