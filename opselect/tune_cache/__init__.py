"""The on-disk tune cache: pydantic records in a text-only sqlite3 file (textdb.py), with its
read-only and remote layers (layers.py)."""

from __future__ import annotations

import os
from typing import Any

from .layers import LayeredStore, read_only_layers, remote_layer
from .notices import forget_warnings
from .storage import TuneStore, default_directory

__all__ = ["TuneStore", "default_directory", "reset", "store"]

_store: Any = None
_store_where: tuple | None = None


def store() -> Any:
    """The store of $OPSELECT_CACHE_DIR with its layers ($OPSELECT_CACHE_PATH read-only layers,
    the $OPSELECT_CACHE_REMOTE remote; layers.py), re-read each time: tests and tools may move
    them. It has TuneStore's interface; the command line's operations act on the local cache."""
    global _store, _store_where
    where = (default_directory(), os.environ.get("OPSELECT_CACHE_PATH", ""),
             os.environ.get("OPSELECT_CACHE_REMOTE", ""))
    if _store is None or _store_where != where:
        if _store is not None:
            _store.close()
        _store = LayeredStore(TuneStore(where[0]), read_only_layers(where[1]),
                              remote_layer(where[2]))
        _store_where = where
    return _store


def reset() -> None:
    """Forget the open store and the warnings already given (for tests and long-lived tools)."""
    global _store, _store_where
    if _store is not None:
        _store.close()
    _store = _store_where = None
    forget_warnings()
