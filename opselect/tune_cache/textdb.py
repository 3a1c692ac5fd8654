"""The tune cache's file: a small key -> JSON-text store on stdlib sqlite3 that distrusts its file.

Why not diskcache (what this replaced): its Disk unpickles keys and values and deletes the files its
rows name, so a planted row ran code or deleted a file; and opening a diskcache rewrites its
Settings table through a loop that retries a locked database for 60 s whatever its timeout says,
so one process holding the write lock hung every other process's first call.

Here:
- one file, `tune.sqlite3` in the cache directory, one table `entries (key, op, value)`; a legacy
  diskcache `cache.db` next to it is never opened (one warning says it is ignored);
- only rows whose key and value are TEXT within length bounds are fetched, and SQLite checks that
  (typeof, length) before a byte reaches Python: a BLOB or an oversized row is skipped with one
  warning and never decoded;
- every wait is bounded, `wait_s` per access (50 ms on the call path). Connecting takes no lock
  (SQLite opens lazily, the pragmas set here are per connection); the table and WAL mode are made
  inside the first write, never by a read; a call-path statement still running at its deadline is
  interrupted;
- a write is a merge: read-modify-write in one BEGIN IMMEDIATE transaction. One that meets a lock is
  queued in memory (reads see it) and written at a later access, after a back-off, or at exit;
- the directory and the file are checked as ssh checks ~/.ssh (trust.py) before the first access,
  every parent and link on the way included, and SQLite is given the resolved path; the database
  and its -wal, -shm and -journal must be plain files (never a link); the file SQLite opened is
  compared with the one checked (its device and inode). A trusted directory that this user
  cannot write is opened read-only.
"""

from __future__ import annotations

import atexit
import logging
import os
import sqlite3
import threading
import time
import warnings
import weakref
from pathlib import Path
from typing import Callable, Iterator, Optional

from ..errors import CacheBusy, CacheError, CacheReadOnly, CacheUnusable, CacheWarning
from .notices import warn_once
from .trust import (TRUST_SHARED_ENV, Untrusted, check_file, create_private_file, open_descriptors,
                    trusted_directory)

_log = logging.getLogger("opselect")

FILE_NAME = "tune.sqlite3"
#: the files SQLite keeps next to the database (rollback journal, write-ahead log, its index)
COMPANIONS = ("-journal", "-wal", "-shm")
#: the diskcache file of opselect before this store: never opened (it can hold pickles)
LEGACY_FILE_NAME = "cache.db"
MAX_KEY_CHARS = 4096
#: a tune record of every backend is a few KB; a row far past that is not one of ours
MAX_VALUE_CHARS = 1 << 20
#: the most a call of an op waits on the cache per access
CALL_WAIT_S = 0.05
#: the most a command-line tool waits for another process's lock (it says so when it waits)
CLI_WAIT_S = 5.0
#: at exit, a process gives up on its queued results once the file has been locked this long with
#: no other process committing anything (a stuck or crashed holder) ...
EXIT_WAIT_S = 5.0
#: ... and waits at most this long while others do commit (many writers finishing together: the
#: lock is busy but moving, and SQLite's busy handler is not fair, so one writer can be passed over
#: for seconds on a loaded machine)
EXIT_WAIT_MAX_S = 60.0
#: after a write met a lock, later accesses retry only after this pause (doubling up to the max),
#: so a long-held lock costs each access nothing rather than a wait each
FLUSH_PAUSE_S = (0.1, 2.0)
_PAGE = 1000

_TEXT_ROW = (f"typeof(key) = 'text' AND length(key) <= {MAX_KEY_CHARS} AND "
             f"typeof(value) = 'text' AND length(value) <= {MAX_VALUE_CHARS}")
_SCHEMA = ("CREATE TABLE IF NOT EXISTS entries (key TEXT PRIMARY KEY, op TEXT, value TEXT)",
           "CREATE INDEX IF NOT EXISTS entries_by_op ON entries (op, key)")

#: a queued write: the new text of a row from its current text (None: no row)
Change = Callable[[Optional[str]], str]


# The store's own outcomes of one sqlite operation (never seen outside tune_cache/).
_Busy, _ReadOnly, _Unusable = CacheBusy, CacheReadOnly, CacheUnusable


def _failure(exc: sqlite3.Error) -> Exception:
    code = getattr(exc, "sqlite_errorcode", None)  # Python 3.11+
    primary = code & 0xFF if isinstance(code, int) else None
    text = str(exc)
    if primary == 9 or (primary is None and "interrupted" in text):
        return _Busy("it took longer than the wait allowed")
    # BUSY, LOCKED, FULL (a full disk may empty again)
    if primary in (5, 6, 13) or (primary is None and any(
            w in text for w in ("locked", "busy", "full"))):
        return _Busy(text)
    if primary == 8 or (primary is None and "readonly" in text):
        return _ReadOnly(text)
    if primary == 14:
        return _Unusable(text)
    return _Unusable(f"{type(exc).__name__}: {text}")


class TextStore:
    """Text rows keyed by text, in `directory`/tune.sqlite3, under the rules of this module.

    get/update never raise and never wait past `wait_s`; the bulk operations (rows, count, delete,
    replace_many) are for command-line tools and raise CacheError when they cannot do their job.
    With read_only=True (a read-only layer) nothing is ever created or written.
    """

    def __init__(self, directory: Path, *, read_only: bool = False):
        self.directory = Path(directory)
        self.path = self.directory / FILE_NAME
        self.read_only = read_only
        self.wait_s = CALL_WAIT_S
        #: told, once per access, that the access waits for a lock (command-line tools print it)
        self.announce: Callable[[str], None] | None = None
        self.readable = False
        self.writable = False
        #: why the file is not used, or not written (None when it is both read and written)
        self.problem: str | None = None
        self._opened = False
        #: the database's resolved path (what SQLite opens) and the (device, inode) checked there
        self._real: Path | None = None
        self._identity: tuple[int, int] | None = None
        self._con: sqlite3.Connection | None = None
        self._pid = 0
        self._schema_ready = False
        self._journal_checked = False
        self._immutable = False
        self._db_lock = threading.Lock()
        self._pending_lock = threading.Lock()
        #: writes not yet on disk, per key, in order: (op, change); all of them when not writable
        self._pending: dict[str, list[tuple[str | None, Change]]] = {}
        self._flush_after = 0.0
        self._flush_pause = FLUSH_PAUSE_S[0]
        self._told_queued = False
        _LIVE.add(self)

    # -- opening ----------------------------------------------------------------------------------
    def _open(self) -> None:
        """Decide once whether and how the file is used (no SQLite here: stat calls only)."""
        if self._opened:
            return
        self._opened = True
        try:
            self._inspect()
        except OSError as exc:
            self._give_up(f"{self.directory} cannot be opened ({exc.strerror or exc})")

    def _inspect(self) -> None:
        d = self.directory
        try:
            real = trusted_directory(d, create=not self.read_only)
            if real is None:
                self.problem = f"{d} does not exist"
                return
            if (real / LEGACY_FILE_NAME).exists():
                warn_once("legacy", f"ignoring {d / LEGACY_FILE_NAME}, the diskcache file of older "
                                    f"opselect versions: it is never opened (its rows can hold "
                                    f"pickled code); its results will be measured again. Delete "
                                    f"it to silence this warning")
            self._real = real / FILE_NAME
            for suffix in COMPANIONS:
                check_file(Path(f"{self._real}{suffix}"))
            info = check_file(self._real)
            if (not self.read_only and os.access(real, os.W_OK)
                    and (info is None or os.access(self._real, os.W_OK))):
                create_private_file(self._real)
                info = check_file(self._real)  # (again: what was created, or found in its place)
                self.readable = self.writable = True
            elif info is not None:
                self.readable = True
                self.problem = f"{self.path} is read-only"
            else:
                self.problem = f"{d} is not writable"
        except Untrusted as exc:
            return self._refuse(exc)
        if info is not None:
            self._identity = (info.st_dev, info.st_ino)

    def _refuse(self, exc: Untrusted) -> None:
        self.readable = self.writable = False
        self.problem = f"{exc.path} is not trusted ({exc.reason})"
        if exc.shareable:
            advice = (f"so someone else may plant or change its records. Make it yours and not "
                      f"writable by others (chown, chmod go-w), or set {TRUST_SHARED_ENV}=1 to "
                      f"accept that risk")
        else:
            advice = ("so the cache could write into a file or directory that is not its own. "
                      "Replace it with a directory or file of your own")
        warn_once("untrusted", f"not using {exc.path}: {exc.reason}, {advice}; tuning results "
                               f"are kept in memory for this process")

    def _give_up(self, message: str) -> None:
        self.readable = self.writable = False
        self.problem = message
        self._drop_connection()
        warn_once("open", f"{message}; tuning results are kept in memory only for this process")

    def _connection(self) -> sqlite3.Connection:
        if self._con is not None and self._pid == os.getpid():
            return self._con
        # The resolved path, never the given one: nothing on it can be swapped by someone else.
        # The file exists (made by _inspect), so SQLite is never asked to create one: mode=rw.
        # Read-only: a WAL file whose -shm cannot be created opens only as immutable.
        flags = "mode=rw" if self.writable else \
            "mode=ro&immutable=1" if self._immutable else "mode=ro"
        before = open_descriptors()
        con = sqlite3.connect(f"{self._real.as_uri()}?{flags}", uri=True, timeout=0,
                              isolation_level=None, check_same_thread=False)
        try:
            self._check_opened(before)
        except BaseException:
            con.close()
            raise
        # Per connection, so no lock is taken. A file we did not write may define views or
        # triggers: let them call no function that has side effects. Deleted records are no
        # secret: do not overwrite them (builds that default secure_delete on rewrite every
        # freed page, 290 MB to clear 200,000 records).
        con.execute("PRAGMA trusted_schema = OFF")
        con.execute("PRAGMA secure_delete = FAST")
        self._con, self._pid = con, os.getpid()
        self._schema_ready = self._journal_checked = False
        return con

    def _check_opened(self, before: dict[int, tuple[int, int]] | None) -> None:
        """The file SQLite just opened is the one _inspect checked: a file or link put in its
        place between the check and the open (possible only in a shared directory) is caught
        here, before any statement reads or writes it. Raises _Unusable."""
        try:
            for suffix in COMPANIONS:
                check_file(Path(f"{self._real}{suffix}"))
            info = check_file(self._real)
        except Untrusted as exc:
            self._refuse(exc)
            raise _Unusable(f"{exc.path} changed while it was opened ({exc.reason})") from None
        opened = None
        if before is not None:  # which file SQLite holds, by its descriptor
            after = open_descriptors() or {}
            opened = {ident for fd, ident in after.items() if before.get(fd) != ident}
        if info is None or (info.st_dev, info.st_ino) != self._identity or \
                (opened is not None and self._identity not in opened):
            raise _Unusable(f"{self._real} was replaced while it was opened")

    def _drop_connection(self) -> None:
        con, self._con = self._con, None
        if con is None:
            return
        if self._pid == os.getpid():
            con.close()
        else:
            _ORPHANS.append(con)  # the parent's: SQLite must not touch it in a forked child

    # -- running a statement under the wait bound -------------------------------------------------
    def _run(self, work: Callable[[sqlite3.Connection], object], deadline: float, what: str, *,
             interruptible: bool = True):
        """work(connection) within the deadline, retried with back-off while the file is locked;
        raises _Busy, _ReadOnly or _Unusable. An interruptible statement (the call path's) still
        running at the deadline is stopped: a file nobody else can write makes that unlikely, but
        its schema is not ours to trust."""
        announced = False
        pause = 0.002
        while True:
            con = None
            try:
                con = self._connection()
                left = max(0.0, deadline - time.monotonic())
                _set_busy_timeout(con, left if announced else min(left, CALL_WAIT_S))
                con.set_progress_handler(
                    (lambda: time.monotonic() > deadline) if interruptible else None, 1000)
                return work(con)
            except sqlite3.Error as exc:
                _rollback(con)
                failure = _failure(exc)
                if (not self.writable and not self._immutable and (
                        isinstance(failure, _ReadOnly)
                        or (isinstance(failure, _Unusable) and "open" in str(failure)))):
                    self._immutable = True
                    self._drop_connection()
                    continue
                left = deadline - time.monotonic()
                if not isinstance(failure, _Busy) or left <= 0.001:
                    raise failure from None
                if not announced:
                    announced = True
                    if self.announce is not None and left > CALL_WAIT_S:
                        self.announce(f"{self.path} is locked by another process; waiting up to "
                                      f"{left:.0f} s to {what}")
                time.sleep(min(pause, left))
                pause = min(2 * pause, 0.1)
            except BaseException:
                _rollback(con)
                raise

    def _acquire(self, deadline: float) -> bool:
        """This process's lock on the connection, within the deadline; opens on first use."""
        if not self._db_lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            return False
        self._open()
        return True

    def _has_table(self, con: sqlite3.Connection) -> bool:
        if self._schema_ready:
            return True
        row = con.execute("SELECT type FROM sqlite_master WHERE name = 'entries'").fetchone()
        if row is None:
            return False
        if row[0] != "table":
            raise _Unusable(f"not an opselect tune cache: its 'entries' is a {row[0]!r}")
        self._schema_ready = True
        return True

    def _select(self, con: sqlite3.Connection, key: str) -> str | None:
        row = con.execute(f"SELECT CASE WHEN {_TEXT_ROW} THEN value END, typeof(value), "
                          f"length(value) FROM entries WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        if row[0] is None:
            warn_once("rejected", f"ignoring a row of {self.path} whose value is "
                                  f"{_describe(row[1], row[2])}, not a JSON text record: it was "
                                  f"not decoded")
        return row[0]

    # -- the call path: get and update ------------------------------------------------------------
    def get(self, key: str) -> str | None:
        """The row's text with the queued writes laid over it; None when there is none (also
        when the file is locked or broken: that costs one warning)."""
        deadline = time.monotonic() + self.wait_s
        raw = None
        if self._acquire(deadline):
            try:
                self._flush_locked(deadline)
                if self.readable:
                    raw = self._read_locked(key, deadline)
            finally:
                self._db_lock.release()
        with self._pending_lock:
            changes = list(self._pending.get(key, ()))
        for _op, change in changes:
            raw = change(raw)
        return raw

    def _read_locked(self, key: str, deadline: float) -> str | None:
        try:
            return self._run(lambda con: self._select(con, key) if self._has_table(con) else None,
                             deadline, "read")
        except _Busy as exc:
            warn_once("busy-read", f"cannot read {self.path} now ({exc}); calls use the cost "
                                   f"model until it can be read")
        except (_Unusable, _ReadOnly) as exc:
            self._give_up(f"{self.path} cannot be opened ({exc})")
        return None

    def update(self, key: str, op: str | None, change: Change) -> None:
        """Queue change (the row's new text from its current one) and try to write the queue."""
        with self._pending_lock:
            self._pending.setdefault(key, []).append((op, change))
        deadline = time.monotonic() + self.wait_s
        if self._acquire(deadline):
            try:
                self._flush_locked(deadline, force=True)
            finally:
                self._db_lock.release()
        if self._opened and not self.readable:
            self._fold(key)
        elif self._pending and (self.writable or not self._opened):
            _UNFLUSHED.add(self)  # for the exit (kept alive until then)

    def _fold(self, key: str) -> None:
        """Without a file, a key's queue is its memory: keep it one constant, not every change."""
        with self._pending_lock:
            changes = self._pending.get(key)
            if changes and len(changes) > 1:
                text = None
                for _op, change in changes:
                    text = change(text)
                self._pending[key] = [(changes[-1][0], lambda _old, text=text: text)]

    def pending(self) -> int:
        with self._pending_lock:
            return sum(len(v) for v in self._pending.values())

    def _flush_locked(self, deadline: float, *, force: bool = False) -> None:
        if not self._pending:
            return
        if not self.writable:
            if self.readable:
                warn_once("read-only", f"{self.problem}, so tuning results are kept in memory "
                                       f"for this process")
            return
        if not force and time.monotonic() < self._flush_after:
            return
        with self._pending_lock:
            batch = [(key, list(changes)) for key, changes in self._pending.items()]
        try:
            self._run(lambda con: self._write(con, batch), deadline, "write")
        except _Busy as exc:
            self._flush_after = time.monotonic() + self._flush_pause
            self._flush_pause = min(2 * self._flush_pause, FLUSH_PAUSE_S[1])
            # Nothing is lost: reads see the queue, and it is written at a later access or at
            # exit (only a lock held past that warns). Many processes warming one cache meet
            # each other's locks all the time; a warning each would cry wolf.
            if not self._told_queued:
                self._told_queued = True
                _log.info("opselect tune cache: %s is locked by another process (%s); results "
                          "queued in memory, written later", self.path, exc)
            return
        except _ReadOnly as exc:
            self.writable = False
            self.problem = f"{self.path} cannot be written ({exc})"
            warn_once("read-only", f"{self.problem}, so tuning results are kept in memory for "
                                   f"this process")
            return
        except _Unusable as exc:
            self._give_up(f"{self.path} cannot be opened ({exc})")
            return
        with self._pending_lock:
            for key, done in batch:
                rest = self._pending.get(key, [])[len(done):]
                if rest:
                    self._pending[key] = rest
                else:
                    self._pending.pop(key, None)
            if not self._pending:
                _UNFLUSHED.discard(self)
        self._flush_after, self._flush_pause = 0.0, FLUSH_PAUSE_S[0]

    def _prepare_writes(self, con: sqlite3.Connection) -> None:
        """WAL (readers never wait for a writer) once per connection. The switch needs every other
        connection gone, so it is tried without waiting, and left to a later connection if busy."""
        if self._journal_checked:
            return
        # WAL stays consistent without a sync per commit; a cache may lose a power cut's last
        # writes. (Per connection: takes no lock.)
        con.execute("PRAGMA synchronous = NORMAL")
        self._has_table(con)  # reads the header, so that journal_mode below tells the truth
        waited = con.execute("PRAGMA busy_timeout").fetchone()[0]
        _set_busy_timeout(con, 0)
        try:
            if str(con.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
                con.execute("PRAGMA journal_mode = WAL").fetchone()
            self._journal_checked = True
        except sqlite3.OperationalError as exc:
            if not isinstance(_failure(exc), _Busy):
                raise
        finally:
            con.execute(f"PRAGMA busy_timeout = {int(waited)}")

    def _create_schema(self, con: sqlite3.Connection) -> None:
        """Inside a write transaction, so two processes creating the file cannot race."""
        if not self._has_table(con):
            for statement in _SCHEMA:
                con.execute(statement)
            self._schema_ready = True

    def _write(self, con: sqlite3.Connection, batch: list[tuple[str, list]]) -> None:
        self._prepare_writes(con)
        con.execute("BEGIN IMMEDIATE")
        self._create_schema(con)
        for key, changes in batch:
            text, op = self._select(con, key), None
            for op, change in changes:
                text = change(text)
            if len(text) > MAX_VALUE_CHARS:
                warn_once("too-large", f"not writing a {len(text)}-character record to "
                                       f"{self.path}: past the {MAX_VALUE_CHARS} limit")
                continue
            con.execute("INSERT OR REPLACE INTO entries (key, op, value) VALUES (?, ?, ?)",
                        (key, op, text))
        con.execute("COMMIT")

    # -- command-line operations ------------------------------------------------------------------
    def patient(self, wait_s: float | None = None,
                announce: Callable[[str], None] | None = None) -> "TextStore":
        """Wait up to wait_s (CLI_WAIT_S) for locks from now on, on every access (command-line
        tools), telling `announce` when an access starts to wait."""
        self.wait_s = CLI_WAIT_S if wait_s is None else wait_s
        self.announce = announce
        return self

    def _cli(self, work: Callable[[sqlite3.Connection], object], what: str):
        """Run work for a whole-cache operation (never on a call's path: it waits up to
        CLI_WAIT_S for a lock, and runs as long as it needs); CacheError when it cannot."""
        wait_s = max(self.wait_s, CLI_WAIT_S)
        deadline = time.monotonic() + wait_s
        if not self._acquire(deadline):
            raise CacheError(f"cannot {what} {self.path}: another thread of this process holds it")
        try:
            self._flush_locked(deadline, force=True)
            try:
                return self._run(work, deadline, what, interruptible=False)
            except _Busy as exc:
                raise CacheError(f"cannot {what} {self.path}: it stayed locked by another process "
                                 f"for {wait_s:g} s ({exc})") from None
            except _ReadOnly as exc:
                raise CacheError(f"cannot {what} {self.path}: {exc}") from None
            except _Unusable as exc:
                self._give_up(f"{self.path} cannot be opened ({exc})")
                raise CacheError(f"cannot {what} {self.path}: {exc}") from None
        finally:
            self._db_lock.release()

    def ready(self) -> bool:
        """Open (once; this checks and warns) and tell whether the file can be read."""
        deadline = time.monotonic() + self.wait_s
        if self._acquire(deadline):
            self._db_lock.release()
        return self.readable

    def rows(self, prefix: str, op: str | None = None,
             limit: int | None = None) -> Iterator[tuple[str, str]]:
        """(key, text) of the text rows whose key starts with prefix (and of op), in key order,
        with queued writes laid over them; page by page, so no lock is held between pages."""
        with self._pending_lock:
            pending = {k: list(v) for k, v in self._pending.items() if k.startswith(prefix)
                       and (op is None or v[-1][0] == op)}
        given = 0
        after = prefix
        end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        while self.ready() and (limit is None or given < limit):
            where = f"{_TEXT_ROW} AND key > ? AND key < ?" + (" AND op = ?" if op else "")
            args = (after, end) + ((op,) if op else ())
            page = self._cli(lambda con: con.execute(
                f"SELECT key, value FROM entries WHERE {where} ORDER BY key LIMIT {_PAGE}",
                args).fetchall() if self._has_table(con) else [], "read")
            for key, text in page:
                for _op, change in pending.pop(key, ()):
                    text = change(text)
                yield key, text
                given += 1
                if limit is not None and given >= limit:
                    return
            if len(page) < _PAGE:
                break
            after = page[-1][0]
        for key in sorted(pending):
            if limit is not None and given >= limit:
                return
            text = None
            for _op, change in pending[key]:
                text = change(text)
            yield key, text
            given += 1

    def count(self, prefix: str, op: str | None = None) -> int:
        """How many text rows rows(prefix, op) would give; warns once when the file holds rows
        that are not text records (whatever their key)."""
        end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        with self._pending_lock:
            queued = [k for k, v in self._pending.items()
                      if k.startswith(prefix) and (op is None or v[-1][0] == op)]
        if not self.ready():
            return len(queued)
        match = "key >= ? AND key < ?" + (" AND op = ?" if op else "")
        args = (prefix, end) + ((op,) if op else ())
        good, bad = self._cli(lambda con: con.execute(
            f"SELECT coalesce(sum(CASE WHEN {_TEXT_ROW} AND {match} THEN 1 ELSE 0 END), 0), "
            f"coalesce(sum(CASE WHEN {_TEXT_ROW} THEN 0 ELSE 1 END), 0) FROM entries",
            args).fetchone() if self._has_table(con) else (0, 0), "read")
        if bad:
            warn_once("rejected", f"ignoring {bad} row(s) of {self.path} whose key or value is "
                                  f"not text within {MAX_KEY_CHARS} / {MAX_VALUE_CHARS} "
                                  f"characters (a BLOB, say): they are never decoded")
        on_disk = set()
        if queued:
            on_disk = {k for k, in self._cli(lambda con: con.execute(
                f"SELECT key FROM entries WHERE {_TEXT_ROW} AND key IN "
                f"({','.join('?' * len(queued))})", queued).fetchall(), "read")}
        return good + sum(k not in on_disk for k in queued)

    def delete(self, op: str | None = None) -> int:
        """Delete every row (op None: also rows that are not text) or the rows of op; only rows
        are deleted, never a file. CacheError when the file cannot be written."""
        with self._pending_lock:
            for key in [k for k, v in self._pending.items() if op is None or v[-1][0] == op]:
                del self._pending[key]
        self.ready()
        if not self.writable:
            raise CacheError(f"cannot delete from the tune cache: {self.problem}")

        def work(con: sqlite3.Connection) -> int:
            if not self._has_table(con):
                return 0
            con.execute("BEGIN IMMEDIATE")
            n = con.execute("DELETE FROM entries" + (" WHERE op = ?" if op else ""),
                            (op,) if op else ()).rowcount
            con.execute("COMMIT")
            return n

        return int(self._cli(work, "delete from"))

    def replace_many(self, rows: list[tuple[str, str | None, str]]) -> None:
        """Write (key, op, text) rows in one transaction: all of them or, with CacheError, none."""
        self.ready()
        if not self.writable:
            raise CacheError(f"cannot write the tune cache: {self.problem or self.path}")

        def work(con: sqlite3.Connection) -> None:
            self._prepare_writes(con)
            con.execute("BEGIN IMMEDIATE")
            self._create_schema(con)
            con.executemany("INSERT OR REPLACE INTO entries (key, op, value) VALUES (?, ?, ?)",
                            rows)
            con.execute("COMMIT")

        self._cli(work, "write")

    # -- closing ----------------------------------------------------------------------------------
    def _last_commit(self) -> tuple:
        """What changes when any process commits: the WAL's (or, in rollback mode, the file's)
        size and time."""
        marks = []
        path = self._real or self.path
        for f in (Path(f"{path}-wal"), path):
            try:
                st = os.stat(f)
                marks.append((st.st_size, st.st_mtime_ns))
            except OSError:
                marks.append(None)
        return tuple(marks)

    def close(self) -> None:
        """Write what is queued (within wait_s) and close; what still cannot be written stays
        queued for the exit."""
        deadline = time.monotonic() + self.wait_s
        if self._acquire(deadline):
            try:
                self._flush_locked(deadline, force=True)
                self._drop_connection()
            finally:
                self._db_lock.release()

    def _flush_at_exit(self) -> None:
        if not self.writable:
            return  # what it holds is its memory; the warning was given when it stopped writing
        self.wait_s = max(self.wait_s, EXIT_WAIT_S)
        give_up = time.monotonic() + EXIT_WAIT_MAX_S
        while True:
            before = self._last_commit()
            self.close()
            if not (self.writable and self._pending) or time.monotonic() > give_up:
                break
            if self._last_commit() == before:
                break  # nobody committed while we waited: the holder is stuck, not busy
        if self.writable and self._pending:
            warnings.warn(f"opselect tune cache: {self.pending()} tuning result(s) were not "
                          f"written: {self.path} stayed locked for {self.wait_s:g} s at exit",
                          CacheWarning, stacklevel=2)


def _set_busy_timeout(con: sqlite3.Connection, seconds: float) -> None:
    con.execute(f"PRAGMA busy_timeout = {max(0, int(seconds * 1000))}")


def _rollback(con: sqlite3.Connection | None) -> None:
    try:
        if con is not None and con.in_transaction:
            con.execute("ROLLBACK")
    except sqlite3.Error:
        pass


def _describe(kind: object, length: object) -> str:
    return f"a {str(kind).upper()} of {length} bytes" if kind != "text" else \
        f"text of {length} characters (past the {MAX_VALUE_CHARS} limit)"


_LIVE: "weakref.WeakSet[TextStore]" = weakref.WeakSet()
_UNFLUSHED: set[TextStore] = set()  # held until written: a store replaced by another keeps them
_ORPHANS: list[sqlite3.Connection] = []


def flush_all_at_exit() -> None:
    """Write every store's queued results (atexit): waiting while other processes commit, up to
    EXIT_WAIT_MAX_S, and giving up after EXIT_WAIT_S of a lock that does not move."""
    for st in list(_UNFLUSHED):
        st._flush_at_exit()
    _UNFLUSHED.clear()


def _after_fork_in_child() -> None:
    for st in list(_LIVE):
        st._db_lock, st._pending_lock = threading.Lock(), threading.Lock()
        if st._con is not None:
            _ORPHANS.append(st._con)
            st._con = None
        if st.writable:
            st._pending.clear()  # the parent writes its own queue
    _UNFLUSHED.clear()


atexit.register(flush_all_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
