"""The on-disk tune cache: diskcache (SQLite underneath, so safe for many processes at once).

Nothing here is on the hot path: the dispatcher asks once per (op, key) and process. Every failure
(a corrupt file, a locked database, a record that does not validate, one written by other software)
costs one warning and a fallback: a broken cache is never fatal and never trusted.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path
from typing import Any, Iterator

from ..dispatch.device import DeviceInfo
from ..errors import CacheWarning

#: How long to wait for another process's write lock before giving up on the cache for this access.
LOCK_TIMEOUT_S = 2.0

_warned: set[str] = set()


def warn_once(kind: str, message: str) -> None:
    """One warning per kind of trouble per process: a broken cache must not flood the user's log."""
    if kind in _warned:
        return
    _warned.add(kind)
    warnings.warn(f"opselect tune cache: {message}", CacheWarning, stacklevel=4)


def default_directory() -> Path:
    env = os.environ.get("OPSELECT_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "opselect"


def tune_key(op: str, device: str, key: str) -> str:
    return f"tune|{device}|{op}|{key}"


def calibration_key(device: str) -> str:
    return f"calibration|{device}"


class TuneStore:
    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self._cache: Any = None
        self._broken = False
        self._memory: dict[str, str] = {}  # stands in for the disk when the disk cannot be used

    # -- low level -------------------------------------------------------------------------------
    def _open(self) -> Any:
        if self._cache is None and not self._broken:
            try:
                import diskcache

                self.directory.mkdir(parents=True, exist_ok=True)
                self._cache = diskcache.Cache(str(self.directory), timeout=LOCK_TIMEOUT_S,
                                              size_limit=2**30)
            except Exception as exc:  # noqa: BLE001 - corrupt file, permissions, a full disk ...
                self._broken = True
                warn_once("open", f"cannot open {self.directory} ({type(exc).__name__}: {exc}); "
                                  "tuning results will be kept in memory only for this process")
        return self._cache

    def _get(self, key: str) -> str | None:
        cache = self._open()
        if cache is None:
            return self._memory.get(key)
        try:
            value = cache.get(key, default=None, retry=False)
            # what could not be written stays in memory for this process
            return value if value is not None else self._memory.get(key)
        except Exception as exc:  # noqa: BLE001 - locked or corrupted database
            warn_once("read", f"cannot read {self.directory} ({type(exc).__name__}: {exc}); "
                              "falling back to the cost model")
            return self._memory.get(key)

    def _update(self, key: str, change) -> None:
        """Read-modify-write one entry inside a transaction, so that two processes tuning different
        backends of the same key both keep their timings."""
        cache = self._open()
        if cache is None:
            self._memory[key] = change(self._memory.get(key))
            return
        try:
            with cache.transact(retry=False):
                cache.set(key, change(cache.get(key, default=None)))
        except Exception as exc:  # noqa: BLE001
            self._memory[key] = change(self._memory.get(key))
            warn_once("write", f"cannot write {self.directory} ({type(exc).__name__}: {exc}); "
                               "keeping this result in memory only")

    def _parse(self, raw: Any, model: Any, what: str) -> Any:
        from pydantic import ValidationError

        if raw is None:
            return None
        try:
            if not isinstance(raw, (str, bytes)):
                raise TypeError(f"expected JSON text, found {type(raw).__name__}")
            return model.model_validate_json(raw)
        except (ValidationError, TypeError, ValueError) as exc:
            warn_once("invalid", f"ignoring an invalid {what} record ({type(exc).__name__}: "
                                 f"{str(exc).splitlines()[0]}); it will be measured again")
            return None

    def _check_fingerprint(self, record: Any, info: DeviceInfo, what: str) -> bool:
        from .fingerprint import fingerprint_dict

        now = fingerprint_dict(info)
        then = record.fingerprint.model_dump()
        if then == now:
            return True
        changed = ", ".join(f"{k} {then.get(k)} -> {now[k]}" for k in now if then.get(k) != now[k])
        warn_once("stale", f"ignoring {what} records written under other software ({changed}); "
                           "they will be measured again")
        return False

    # -- timings ----------------------------------------------------------------------------------
    def get_timings(self, op: str, info: DeviceInfo, key: tuple,
                    hashes: dict[str, str]) -> dict[str, tuple[float, dict[str, Any]]]:
        """Valid, current timings of the given backends for this key: {name: (seconds, config)};
        a backend that failed when measured has seconds = inf."""
        from .records import TuneRecord

        record = self._parse(self._get(tune_key(op, info.cache_key, repr(key))), TuneRecord, op)
        if record is None or not self._check_fingerprint(record, info, op):
            return {}
        out = {}
        for name, timing in record.timings.items():
            if hashes.get(name) != timing.source_hash:
                continue  # that backend's kernels changed (or it is gone): measure it again
            seconds = math.inf if timing.seconds is None else timing.seconds
            out[name] = (seconds, dict(timing.config))
        return out

    def put_timings(self, op: str, info: DeviceInfo, key: tuple,
                    timings: dict[str, tuple[float, dict[str, Any], str]]) -> None:
        """Merge {name: (seconds, config, source_hash)} into the record of this key."""
        from .fingerprint import current
        from .records import Timing, TuneRecord

        fp = current(info)
        new = {n: Timing(seconds=None if math.isinf(t) else t, config=cfg, source_hash=h)
               for n, (t, cfg, h) in timings.items()}

        def change(raw: str | None) -> str:
            old = self._parse(raw, TuneRecord, op) if raw is not None else None
            if old is None or old.fingerprint != fp:
                old = TuneRecord(op=op, key=repr(key), fingerprint=fp)
            old.timings.update(new)
            return old.model_dump_json()

        self._update(tune_key(op, info.cache_key, repr(key)), change)

    # -- calibration ------------------------------------------------------------------------------
    def get_calibration(self, info: DeviceInfo) -> Any:
        from .records import Calibration

        record = self._parse(self._get(calibration_key(info.cache_key)), Calibration, "calibration")
        if record is None or not self._check_fingerprint(record, info, "calibration"):
            return None
        return record

    def put_calibration(self, info: DeviceInfo, constants: dict[str, float],
                        scales: dict[str, float]) -> None:
        from .fingerprint import current
        from .records import Calibration

        finite = lambda d: {k: float(v) for k, v in d.items() if math.isfinite(v)}  # noqa: E731
        record = Calibration(fingerprint=current(info), constants=finite(constants),
                             scales=finite(scales))
        self._update(calibration_key(info.cache_key), lambda _old: record.model_dump_json())

    # -- whole-cache operations (CLI) -------------------------------------------------------------
    def raw_items(self) -> Iterator[tuple[str, Any]]:
        cache = self._open()
        if cache is None:
            yield from list(self._memory.items())
            return
        try:
            keys = list(cache.iterkeys())
        except Exception as exc:  # noqa: BLE001
            warn_once("read", f"cannot list {self.directory} ({type(exc).__name__}: {exc})")
            return
        for k in keys:
            yield k, self._get(k)

    def records(self) -> Iterator[Any]:
        """Every valid tune record (any fingerprint), for `opselect show`."""
        from .records import TuneRecord

        for k, raw in self.raw_items():
            if isinstance(k, str) and k.startswith("tune|"):
                rec = self._parse(raw, TuneRecord, "tune")
                if rec is not None:
                    yield rec

    def calibrations(self) -> Iterator[Any]:
        from .records import Calibration

        for k, raw in self.raw_items():
            if isinstance(k, str) and k.startswith("calibration|"):
                rec = self._parse(raw, Calibration, "calibration")
                if rec is not None:
                    yield rec

    def clear(self, op: str | None = None) -> int:
        cache = self._open()
        n = 0
        for k, _ in list(self.raw_items()):
            if op is None or (isinstance(k, str) and k.startswith("tune|") and k.split("|")[-2] == op):
                n += 1
                if cache is None:
                    self._memory.pop(k, None)
                else:
                    cache.delete(k, retry=True)
        return n

    def export(self, path: Path) -> int:
        entries = []
        for k, raw in self.raw_items():
            if isinstance(k, str) and isinstance(raw, str):
                try:
                    entries.append({"key": k, "record": json.loads(raw)})
                except ValueError:
                    continue
        Path(path).write_text(json.dumps({"opselect_export": 1, "entries": entries}, indent=1))
        return len(entries)

    def import_(self, path: Path) -> tuple[int, int]:
        """Load an export file; returns (imported, skipped). Each record is validated first."""
        from .records import Calibration, ExportFile, TuneRecord

        data = ExportFile.model_validate_json(Path(path).read_text())
        ok = skipped = 0
        for entry in data.entries:
            key, record = entry.get("key"), entry.get("record")
            model = TuneRecord if str(key).startswith("tune|") else Calibration
            parsed = self._parse(json.dumps(record), model, "imported")
            if parsed is None or not isinstance(key, str):
                skipped += 1
                continue
            text = parsed.model_dump_json()
            self._update(key, lambda _old, text=text: text)
            ok += 1
        return ok, skipped

    def close(self) -> None:
        if self._cache is not None:
            self._cache.close()
            self._cache = None


_store: TuneStore | None = None


def store() -> TuneStore:
    """The store of $OPSELECT_CACHE_DIR (re-read each time: tests and tools may move it)."""
    global _store
    directory = default_directory()
    if _store is None or _store.directory != directory:
        if _store is not None:
            _store.close()
        _store = TuneStore(directory)
    return _store


def reset() -> None:
    """Forget the open store and the warnings already given (for tests and long-lived tools)."""
    global _store
    if _store is not None:
        _store.close()
    _store = None
    _warned.clear()
