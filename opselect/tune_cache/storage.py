"""The tune cache's records: what the dispatcher, calibration and the command line ask of it.

The file underneath is textdb.TextStore (stdlib sqlite3, text rows only, bounded waits, queued
writes, ownership checks). Nothing here is on the hot path: the dispatcher asks once per (op, key)
and process. Every failure (a corrupt file, a locked database, a record that does not validate, one
written by other software) costs one warning and a fallback: a broken cache is never fatal and
never trusted.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Any, Iterator

from ..dispatch.device import DeviceInfo
from ..dispatch.tuning_mode import METHOD
from .notices import warn_once
from .textdb import TextStore

from .keys import CALIBRATION_PREFIX, TUNE_PREFIX, calibration_key, tune_key  # noqa: F401


def default_directory() -> Path:
    env = os.environ.get("OPSELECT_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "opselect"


class TuneStore:
    """Tune records and calibrations in one directory's TextStore (read_only: a layer that is
    only read, e.g. a cache shipped with an image)."""

    def __init__(self, directory: Path, *, read_only: bool = False):
        self.directory = Path(directory)
        self.db = TextStore(self.directory, read_only=read_only)

    def patient(self, wait_s: float | None = None) -> "TuneStore":
        """For command-line tools: wait up to wait_s for another process's lock, saying so."""
        self.db.patient(wait_s, lambda msg: print(f"opselect: {msg}", file=sys.stderr, flush=True))
        return self

    @property
    def path(self) -> Path:
        return self.db.path

    def state(self) -> str:
        """One line on how the file is used, for the command line."""
        self.db.ready()  # opens it (and warns about what it refuses)
        if self.db.readable and self.db.writable:
            return str(self.db.path)
        if self.db.readable:
            return f"{self.db.path} (read-only)"
        return f"memory only: {self.db.problem}"

    def _parse(self, raw: Any, model: Any, what: str) -> Any:
        from pydantic import ValidationError

        if raw is None:
            return None
        try:
            if not isinstance(raw, str):
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
    def get_timings(self, op: str, info: DeviceInfo, key: tuple, hashes: dict[str, str]
                    ) -> dict[str, tuple[float, dict[str, Any], float | None, float | None]]:
        """Valid, current timings of the given backends for this key: {name: (seconds, config,
        host seconds, device seconds)}; a backend that failed when measured has seconds = inf."""
        from .records import TuneRecord

        record = self._parse(self.db.get(tune_key(op, info.cache_key, repr(key))), TuneRecord, op)
        if record is not None and (record.op, record.key) != (op, repr(key)):
            warn_once("invalid", f"ignoring an invalid {op} record (it is filed under another "
                                 f"key); it will be measured again")
            record = None
        if record is None or not self._check_fingerprint(record, info, op):
            return {}
        out = {}
        for name, timing in record.timings.items():
            if hashes.get(name) != timing.source_hash:
                continue  # that backend's kernels changed (or it is gone): measure it again
            if timing.method != METHOD:
                continue  # measured another way: not comparable with today's timings
            seconds = math.inf if timing.seconds is None else timing.seconds
            out[name] = (seconds, dict(timing.config), timing.host_s, timing.device_s)
        return out

    def put_timings(self, op: str, info: DeviceInfo, key: tuple,
                    timings: dict[str, tuple]) -> None:
        """Merge {name: (seconds, config, source_hash[, host seconds, device seconds])} into the
        record of this key (inside one transaction with the read, so processes measuring other
        backends of it keep theirs)."""
        from .fingerprint import current
        from .records import Timing, TuneRecord

        fp = current(info)

        def finite(v: float | None) -> float | None:
            return v if v is not None and math.isfinite(v) else None

        new = {}
        for n, (t, cfg, h, *apart) in timings.items():
            host, device = apart if apart else (None, None)
            new[n] = Timing(seconds=None if math.isinf(t) else t, config=cfg, source_hash=h,
                            method=METHOD, host_s=finite(host), device_s=finite(device))

        def change(raw: str | None) -> str:
            old = self._parse(raw, TuneRecord, op) if raw is not None else None
            if old is None or old.fingerprint != fp or (old.op, old.key) != (op, repr(key)):
                old = TuneRecord(op=op, key=repr(key), fingerprint=fp)
            old.timings.update(new)
            return old.model_dump_json()

        self.db.update(tune_key(op, info.cache_key, repr(key)), op, change)

    # -- calibration ------------------------------------------------------------------------------
    def get_calibration(self, info: DeviceInfo) -> Any:
        from .records import Calibration

        record = self._parse(self.db.get(calibration_key(info.cache_key)), Calibration,
                             "calibration")
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
        text = record.model_dump_json()
        self.db.update(calibration_key(info.cache_key), None, lambda _old: text)

    # -- whole-cache operations (command line) ----------------------------------------------------
    def records(self, op: str | None = None, limit: int | None = None) -> Iterator[Any]:
        """Valid tune records (any fingerprint) in key order, of op if given, at most limit."""
        from .records import TuneRecord

        given = 0
        for _key, raw in self.db.rows(TUNE_PREFIX, op):
            rec = self._parse(raw, TuneRecord, "tune")
            if rec is not None and (op is None or rec.op == op):
                yield rec
                given += 1
                if limit is not None and given >= limit:
                    return

    def count_records(self, op: str | None = None) -> int:
        """Tune rows (of op) that records() reads: one SQL count, however many there are."""
        return self.db.count(TUNE_PREFIX, op)

    def calibrations(self) -> Iterator[Any]:
        from .records import Calibration

        for _key, raw in self.db.rows(CALIBRATION_PREFIX):
            rec = self._parse(raw, Calibration, "calibration")
            if rec is not None:
                yield rec

    def clear(self, op: str | None = None) -> int:
        """Delete every entry, or op's tune entries; returns how many. Deletes rows only, never a
        file; CacheError when the cache cannot be written."""
        return self.db.delete(op)

    def export(self, path: Path) -> int:
        from .transfer import export_file

        return export_file(self, Path(path))

    def import_(self, path: Path) -> tuple[int, int]:
        """Load an export file; returns (imported, skipped). Each record is validated first, and
        all are written in one transaction (UsageError for a bad file, CacheError when the cache
        cannot be written: then nothing was imported)."""
        from .transfer import import_file

        return import_file(self, Path(path))

    def close(self) -> None:
        self.db.close()
