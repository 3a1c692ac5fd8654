"""The tune cache's writes not yet on disk (textdb.py's third layer, over table.EntriesTable).

A write that meets a lock is queued in memory (reads see it) and written at a later access, after a
back-off, or at exit; a store whose file cannot be written keeps its queue as its memory. At exit
(atexit) every store's queue is written, waiting while other processes commit; a forked child
drops its parent's connection and leaves the parent's queue to the parent.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import warnings
import weakref
from pathlib import Path
from typing import Callable, Optional

from ..errors import CacheWarning
from .connection import Busy, ReadOnly, Unusable
from .notices import warn_once
from .table import EntriesTable

_log = logging.getLogger("opselect")

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

#: a queued write: the new text of a row from its current text (None: no row)
Change = Callable[[Optional[str]], str]


class WriteQueue(EntriesTable):
    """The queue of writes of an EntriesTable: update() queues, _flush_locked() writes."""

    def __init__(self, directory: Path, *, read_only: bool = False):
        super().__init__(directory, read_only=read_only)
        self._pending_lock = threading.Lock()
        #: writes not yet on disk, per key, in order: (op, change); all of them when not writable
        self._pending: dict[str, list[tuple[str | None, Change]]] = {}
        self._flush_after = 0.0
        self._flush_pause = FLUSH_PAUSE_S[0]
        self._told_queued = False
        _LIVE.add(self)

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

    def _queued(self, key: str) -> list[tuple[str | None, Change]]:
        """key's queued writes, in order (a copy)."""
        with self._pending_lock:
            return list(self._pending.get(key, ()))

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
        except Busy as exc:
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
        except ReadOnly as exc:
            self.writable = False
            self.problem = f"{self.path} cannot be written ({exc})"
            warn_once("read-only", f"{self.problem}, so tuning results are kept in memory for "
                                   f"this process")
            return
        except Unusable as exc:
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

    def _after_fork(self) -> None:
        super()._after_fork()
        self._pending_lock = threading.Lock()
        if self.writable:
            self._pending.clear()  # the parent writes its own queue


_LIVE: "weakref.WeakSet[WriteQueue]" = weakref.WeakSet()
_UNFLUSHED: set[WriteQueue] = set()  # held until written: a store replaced by another keeps them


def flush_all_at_exit() -> None:
    """Write every store's queued results (atexit): waiting while other processes commit, up to
    EXIT_WAIT_MAX_S, and giving up after EXIT_WAIT_S of a lock that does not move."""
    for st in list(_UNFLUSHED):
        st._flush_at_exit()
    _UNFLUSHED.clear()


def _after_fork_in_child() -> None:
    for st in list(_LIVE):
        st._after_fork()
    _UNFLUSHED.clear()


atexit.register(flush_all_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
