"""The tune cache's layers: where the dispatcher's records come from and go to.

    reads:  local cache -> read-only layers ($OPSELECT_CACHE_PATH) -> remote ($OPSELECT_CACHE_REMOTE)
    writes: local cache (and the remote, when one is configured)

* The local cache is $OPSELECT_CACHE_DIR's TextStore. A directory this process cannot write
  still serves its records (TextStore opens it read-only): a cache warmed elsewhere and shipped
  read-only (a container image, a shared mount) is used, not ignored.
* $OPSELECT_CACHE_PATH lists read-only layers, separated by os.pathsep: cache directories (opened
  read-only, with the same ownership checks as the local cache) and export files (`opselect
  export`; read once, bounded and validated exactly as `opselect import` validates them). A layer
  that cannot be read costs one warning and is skipped.
* $OPSELECT_CACHE_REMOTE=redis://host:port/db adds a shared remote layer (remote.py): the same
  validated JSON records, short timeouts, and a connection error turns it off with one warning.

A key's timings are merged over the layers: a backend the local cache has no timing of (with its
current kernel source hash) is taken from the first layer that has one. Every record read from
any layer goes through TuneStore's validation and fingerprint check.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Iterator

from ..errors import OpselectError
from .notices import warn_once
from .storage import TuneStore


class _RowsDB:
    """A read-only TextStore stand-in over rows already validated (an export file's)."""

    readable, writable, problem = True, False, None

    def __init__(self, rows: dict[str, str]):
        self._rows = rows

    def get(self, key: str) -> str | None:
        return self._rows.get(key)

    def update(self, key: str, op: str | None, change: Callable[[str | None], str]) -> None:
        pass  # a read-only layer takes no writes

    def rows(self, prefix: str, op: str | None = None) -> Iterator[tuple[str, str]]:
        for key in sorted(self._rows):
            if key.startswith(prefix):
                yield key, self._rows[key]

    def ready(self) -> bool:
        return True

    def close(self) -> None:
        pass


class _RemoteDB:
    """A TextStore stand-in over the remote layer (remote.RedisLayer)."""

    readable = writable = True
    problem = None

    def __init__(self, remote: Any):
        self.remote = remote

    def get(self, key: str) -> str | None:
        return self.remote.get(key) if self.remote.enabled else None

    def update(self, key: str, op: str | None, change: Callable[[str | None], str]) -> None:
        if self.remote.enabled:
            self.remote.update(key, change)

    def ready(self) -> bool:
        return self.remote.enabled

    def close(self) -> None:
        self.remote.close()


def _store_over(db: Any, label: str) -> TuneStore:
    st = TuneStore.__new__(TuneStore)
    st.directory = Path(label)
    st.db = db
    return st


def export_layer(path: Path) -> TuneStore | None:
    """A read-only layer over an export file, validated as `opselect import` validates it."""
    from .transfer import read_export

    try:
        rows, _skipped = read_export(path)
    except (OpselectError, OSError) as exc:
        warn_once(f"layer {path}", f"ignoring the read-only layer {path}: {exc}")
        return None
    return _store_over(_RowsDB({key: text for key, _op, text in rows}), str(path))


def read_only_layers(spec: str | None = None) -> list[TuneStore]:
    """The layers $OPSELECT_CACHE_PATH (or spec) names, in order."""
    spec = os.environ.get("OPSELECT_CACHE_PATH", "") if spec is None else spec
    layers = []
    for part in spec.split(os.pathsep):
        if not part.strip():
            continue
        path = Path(part).expanduser()
        if path.is_dir():
            layers.append(TuneStore(path, read_only=True))
        elif path.exists():  # (export_layer refuses anything but a regular file)
            layer = export_layer(path)
            if layer is not None:
                layers.append(layer)
        else:
            warn_once(f"layer {path}",
                      f"ignoring the read-only layer {path}: no such file or directory")
    return layers


def remote_layer(url: str | None = None) -> TuneStore | None:
    url = os.environ.get("OPSELECT_CACHE_REMOTE", "") if url is None else url
    if not url:
        return None
    from .remote import RedisLayer

    remote = RedisLayer.from_url(url)
    return None if remote is None else _store_over(_RemoteDB(remote), url)


class LayeredStore:
    """The local store plus its read-only and remote layers, with the local store's interface
    (the command line's operations act on the local cache alone)."""

    def __init__(self, local: TuneStore, layers: list[TuneStore], remote: TuneStore | None):
        self.local = local
        self.layers = layers
        self.remote = remote
        self.directory = local.directory

    def __getattr__(self, name: str) -> Any:
        return getattr(self.local, name)

    def _readers(self) -> list[TuneStore]:
        return [self.local, *self.layers, *([self.remote] if self.remote is not None else [])]

    def get_timings(self, op: str, info: Any, key: tuple, hashes: dict[str, str]) -> dict:
        found: dict[str, tuple] = {}
        for layer in self._readers():
            if len(found) == len(hashes):
                break
            for name, timing in layer.get_timings(op, info, key, hashes).items():
                found.setdefault(name, timing)
        return found

    def put_timings(self, op: str, info: Any, key: tuple, timings: dict[str, tuple]) -> None:
        self.local.put_timings(op, info, key, timings)
        if self.remote is not None:
            self.remote.put_timings(op, info, key, timings)

    def get_calibration(self, info: Any) -> Any:
        for layer in self._readers():
            record = layer.get_calibration(info)
            if record is not None:
                return record
        return None

    def put_calibration(self, info: Any, constants: dict[str, float],
                        scales: dict[str, float]) -> None:
        self.local.put_calibration(info, constants, scales)
        if self.remote is not None:
            self.remote.put_calibration(info, constants, scales)

    def close(self) -> None:
        for layer in self._readers():
            layer.close()
