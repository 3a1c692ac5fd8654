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

The store is four layers, each a module of this package and a class the next one extends:
connection.py (SqliteFile: the checks, the connection, a statement under the wait bound),
table.py (EntriesTable: the schema and the SQL of reading, merging and deleting rows),
write_queue.py (WriteQueue: queued writes, their back-off, exit and fork) and this module
(TextStore: the call path's get, and the command line's whole-cache operations).
"""

from __future__ import annotations

import sqlite3
import time
from typing import Callable, Iterator

from ..errors import CacheError
from .connection import (CALL_WAIT_S, COMPANIONS, FILE_NAME, LEGACY_FILE_NAME, Busy, ReadOnly,
                         Unusable)
from .notices import warn_once
from .table import MAX_KEY_CHARS, MAX_VALUE_CHARS, PAGE
from .write_queue import (EXIT_WAIT_MAX_S, EXIT_WAIT_S, FLUSH_PAUSE_S, Change, WriteQueue,
                          flush_all_at_exit)

# What other modules and tests take from here (defined in the layers below, except CLI_WAIT_S).
__all__ = ["CALL_WAIT_S", "CLI_WAIT_S", "COMPANIONS", "Change", "EXIT_WAIT_MAX_S", "EXIT_WAIT_S",
           "FILE_NAME", "FLUSH_PAUSE_S", "LEGACY_FILE_NAME", "MAX_KEY_CHARS", "MAX_VALUE_CHARS",
           "TextStore", "flush_all_at_exit"]

#: the most a command-line tool waits for another process's lock (it says so when it waits)
CLI_WAIT_S = 5.0


class TextStore(WriteQueue):
    """Text rows keyed by text, in `directory`/tune.sqlite3, under the rules of this module.

    get/update never raise and never wait past `wait_s`; the bulk operations (rows, count, delete,
    replace_many) are for command-line tools and raise CacheError when they cannot do their job.
    With read_only=True (a read-only layer) nothing is ever created or written.
    """

    # -- the call path: get (and WriteQueue.update) -----------------------------------------------
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
        for _op, change in self._queued(key):
            raw = change(raw)
        return raw

    def _read_locked(self, key: str, deadline: float) -> str | None:
        try:
            return self._run(lambda con: self._select(con, key) if self._has_table(con) else None,
                             deadline, "read")
        except Busy as exc:
            warn_once("busy-read", f"cannot read {self.path} now ({exc}); calls use the cost "
                                   f"model until it can be read")
        except (Unusable, ReadOnly) as exc:
            self._give_up(f"{self.path} cannot be opened ({exc})")
        return None

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
            except Busy as exc:
                raise CacheError(f"cannot {what} {self.path}: it stayed locked by another process "
                                 f"for {wait_s:g} s ({exc})") from None
            except ReadOnly as exc:
                raise CacheError(f"cannot {what} {self.path}: {exc}") from None
            except Unusable as exc:
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
            page = self._cli(lambda con: self._page(con, after, end, op), "read")
            for key, text in page:
                for _op, change in pending.pop(key, ()):
                    text = change(text)
                yield key, text
                given += 1
                if limit is not None and given >= limit:
                    return
            if len(page) < PAGE:
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
        good, bad = self._cli(lambda con: self._count(con, prefix, end, op), "read")
        if bad:
            warn_once("rejected", f"ignoring {bad} row(s) of {self.path} whose key or value is "
                                  f"not text within {MAX_KEY_CHARS} / {MAX_VALUE_CHARS} "
                                  f"characters (a BLOB, say): they are never decoded")
        on_disk = set()
        if queued:
            on_disk = self._cli(lambda con: self._text_keys(con, queued), "read")
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
        return int(self._cli(lambda con: self._delete_rows(con, op), "delete from"))

    def replace_many(self, rows: list[tuple[str, str | None, str]]) -> None:
        """Write (key, op, text) rows in one transaction: all of them or, with CacheError, none."""
        self.ready()
        if not self.writable:
            raise CacheError(f"cannot write the tune cache: {self.problem or self.path}")
        self._cli(lambda con: self._write_rows(con, rows), "write")
