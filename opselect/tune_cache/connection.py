"""The tune cache's SQLite file and this process's connection to it (textdb.py's lowest layer).

Whether and how the file is used is decided once, before the first access, with stat calls only:
- the directory and the file are checked as ssh checks ~/.ssh (trust.py), every parent and link on
  the way included, and SQLite is given the resolved path; the database and its -wal, -shm and
  -journal must be plain files (never a link); the file SQLite opened is compared with the one
  checked (its device and inode). A trusted directory that this user cannot write is opened
  read-only;
- a legacy diskcache `cache.db` next to it is never opened (one warning says it is ignored);
- a file that cannot be used costs one warning, and the store keeps its results in memory.

Every wait is bounded: connecting takes no lock (SQLite opens lazily, the pragmas set here are per
connection), and SqliteFile._run retries a locked file only until its deadline; a call-path
statement still running at its deadline is interrupted.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import threading
import time
from pathlib import Path
from typing import Callable

from ..errors import CacheBusy, CacheReadOnly, CacheUnusable
from .notices import warn_once
from .trust import (TRUST_SHARED_ENV, Untrusted, check_file, create_private_file, open_descriptors,
                    trusted_directory)

FILE_NAME = "tune.sqlite3"
#: the files SQLite keeps next to the database (rollback journal, write-ahead log, its index)
COMPANIONS = ("-journal", "-wal", "-shm")
#: the diskcache file of opselect before this store: never opened (it can hold pickles)
LEGACY_FILE_NAME = "cache.db"
#: the most a call of an op waits on the cache per access
CALL_WAIT_S = 0.05

# The store's own outcomes of one sqlite operation (never seen outside tune_cache/).
Busy, ReadOnly, Unusable = CacheBusy, CacheReadOnly, CacheUnusable


def failure(exc: sqlite3.Error) -> Exception:
    """The store's outcome (Busy, ReadOnly or Unusable) of an sqlite3 error."""
    code = getattr(exc, "sqlite_errorcode", None)  # Python 3.11+
    primary = code & 0xFF if isinstance(code, int) else None
    text = str(exc)
    if primary == 9 or (primary is None and "interrupted" in text):
        return Busy("it took longer than the wait allowed")
    # BUSY, LOCKED, FULL (a full disk may empty again)
    if primary in (5, 6, 13) or (primary is None and any(
            w in text for w in ("locked", "busy", "full"))):
        return Busy(text)
    if primary == 8 or (primary is None and "readonly" in text):
        return ReadOnly(text)
    if primary == 14:
        return Unusable(text)
    return Unusable(f"{type(exc).__name__}: {text}")


class HeldCtrlC:
    """SIGINT held while SQLite runs a statement of the main thread, and passed on after it.

    Python runs a signal's handler at the next bytecode, which during a statement is the first
    one of the progress handler; sqlite3 swallows an exception raised there and reports the
    statement as interrupted, which would look like a wait for the lock. So while a statement
    runs, SIGINT only sets `caught` (the progress handler then stops the statement), and the
    handler the program had is called as the signal would have called it."""

    __slots__ = ("caught", "_signal", "_previous")

    def __init__(self):
        self.caught = False
        self._signal = None
        self._previous = None
        if threading.current_thread() is not threading.main_thread():
            return  # signals are handled by the main thread only
        previous = signal.getsignal(signal.SIGINT)
        if callable(previous):  # (SIG_IGN, SIG_DFL and C handlers never run Python)
            self._previous = previous
            signal.signal(signal.SIGINT, self._catch)

    def _catch(self, signum, frame) -> None:
        self._signal = (signum, frame)
        self.caught = True

    def deliver(self) -> None:
        """The held signal to the program's handler, which may raise."""
        held, self._signal, self.caught = self._signal, None, False
        if held is not None and self._previous is not None:
            self._previous(*held)

    def release(self) -> None:
        if self._previous is None:
            return
        signal.signal(signal.SIGINT, self._previous)
        self.deliver()
        self._previous = None


def set_busy_timeout(con: sqlite3.Connection, seconds: float) -> None:
    con.execute(f"PRAGMA busy_timeout = {max(0, int(seconds * 1000))}")


def rollback(con: sqlite3.Connection | None) -> None:
    try:
        if con is not None and con.in_transaction:
            con.execute("ROLLBACK")
    except sqlite3.Error:
        pass


#: connections of a parent process, left open in a forked child: SQLite must not touch them there
ORPHANS: list[sqlite3.Connection] = []


class SqliteFile:
    """`directory`/tune.sqlite3: the checks before its first use, the connection (per process) and
    a statement run under the wait bound. readable, writable and problem tell what was decided."""

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
        self._immutable = False
        self._db_lock = threading.Lock()

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
        self._connected()
        return con

    def _connected(self) -> None:
        """Called with each new connection: what a subclass knows of the last one starts over."""

    def _check_opened(self, before: dict[int, tuple[int, int]] | None) -> None:
        """The file SQLite just opened is the one _inspect checked: a file or link put in its
        place between the check and the open (possible only in a shared directory) is caught
        here, before any statement reads or writes it. Raises Unusable."""
        try:
            for suffix in COMPANIONS:
                check_file(Path(f"{self._real}{suffix}"))
            info = check_file(self._real)
        except Untrusted as exc:
            self._refuse(exc)
            raise Unusable(f"{exc.path} changed while it was opened ({exc.reason})") from None
        opened = None
        if before is not None:  # which file SQLite holds, by its descriptor
            after = open_descriptors() or {}
            opened = {ident for fd, ident in after.items() if before.get(fd) != ident}
        if info is None or (info.st_dev, info.st_ino) != self._identity or \
                (opened is not None and self._identity not in opened):
            raise Unusable(f"{self._real} was replaced while it was opened")

    def _drop_connection(self) -> None:
        con, self._con = self._con, None
        if con is None:
            return
        if self._pid == os.getpid():
            con.close()
        else:
            ORPHANS.append(con)  # the parent's: SQLite must not touch it in a forked child

    def _after_fork(self) -> None:
        """In a forked child: a fresh lock, and the parent's connection is never used."""
        self._db_lock = threading.Lock()
        if self._con is not None:
            ORPHANS.append(self._con)
            self._con = None

    # -- running a statement under the wait bound -------------------------------------------------
    def _run(self, work: Callable[[sqlite3.Connection], object], deadline: float, what: str, *,
             interruptible: bool = True):
        """work(connection) within the deadline, retried with back-off while the file is locked;
        raises Busy, ReadOnly or Unusable. An interruptible statement (the call path's) still
        running at the deadline is stopped: a file nobody else can write makes that unlikely, but
        its schema is not ours to trust."""
        if not interruptible:  # no Python runs during its statements: a signal waits for the end
            return self._retry(work, deadline, what, None)
        ctrl_c = HeldCtrlC()
        try:
            return self._retry(work, deadline, what, ctrl_c)
        finally:
            ctrl_c.release()

    def _retry(self, work, deadline: float, what: str, ctrl_c: HeldCtrlC | None):
        announced = False
        pause = 0.002
        while True:
            con = None
            try:
                con = self._connection()
                left = max(0.0, deadline - time.monotonic())
                set_busy_timeout(con, left if announced else min(left, CALL_WAIT_S))
                con.set_progress_handler(
                    None if ctrl_c is None else
                    (lambda: ctrl_c.caught or time.monotonic() > deadline), 1000)
                return work(con)
            except sqlite3.Error as exc:
                rollback(con)
                if ctrl_c is not None and ctrl_c.caught:
                    ctrl_c.deliver()  # the program's handler (KeyboardInterrupt by default)
                    continue  # it chose to go on: the statement was stopped, run it again
                outcome = failure(exc)
                if (not self.writable and not self._immutable and (
                        isinstance(outcome, ReadOnly)
                        or (isinstance(outcome, Unusable) and "open" in str(outcome)))):
                    self._immutable = True
                    self._drop_connection()
                    continue
                left = deadline - time.monotonic()
                if not isinstance(outcome, Busy) or left <= 0.001:
                    raise outcome from None
                if not announced:
                    announced = True
                    if self.announce is not None and left > CALL_WAIT_S:
                        self.announce(f"{self.path} is locked by another process; waiting up to "
                                      f"{left:.0f} s to {what}")
                time.sleep(min(pause, left))
                pause = min(2 * pause, 0.1)
            except BaseException:
                rollback(con)
                raise

    def _acquire(self, deadline: float) -> bool:
        """This process's lock on the connection, within the deadline; opens on first use."""
        if not self._db_lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            return False
        self._open()
        return True
