"""The tune cache's one table, `entries (key, op, value)`: its schema, and the statements that read
a row and merge rows into it (textdb.py's second layer, over connection.SqliteFile).

- only rows whose key and value are TEXT within length bounds are fetched, and SQLite checks that
  (typeof, length) before a byte reaches Python: a BLOB or an oversized row is skipped with one
  warning and never decoded;
- the table and WAL mode are made inside the first write, never by a read;
- a write is a merge: read-modify-write in one BEGIN IMMEDIATE transaction;
- only rows are deleted, never a file.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from .connection import Busy, SqliteFile, Unusable, failure, set_busy_timeout
from .notices import warn_once

MAX_KEY_CHARS = 4096
#: a tune record of every backend is a few KB; a row far past that is not one of ours
MAX_VALUE_CHARS = 1 << 20

#: rows a command-line read fetches per statement (no lock is held between pages)
PAGE = 1000

#: the SQL condition of a row that is read at all
TEXT_ROW = (f"typeof(key) = 'text' AND length(key) <= {MAX_KEY_CHARS} AND "
            f"typeof(value) = 'text' AND length(value) <= {MAX_VALUE_CHARS}")
_SCHEMA = ("CREATE TABLE IF NOT EXISTS entries (key TEXT PRIMARY KEY, op TEXT, value TEXT)",
           "CREATE INDEX IF NOT EXISTS entries_by_op ON entries (op, key)")


def _describe(kind: object, length: object) -> str:
    return f"a {str(kind).upper()} of {length} bytes" if kind != "text" else \
        f"text of {length} characters (past the {MAX_VALUE_CHARS} limit)"


class EntriesTable(SqliteFile):
    """The entries table of an SqliteFile: checked once per connection, made by the first write."""

    def __init__(self, directory: Path, *, read_only: bool = False):
        super().__init__(directory, read_only=read_only)
        #: per connection: the table is known to exist, the journal mode was checked
        self._schema_ready = False
        self._journal_checked = False

    def _connected(self) -> None:
        self._schema_ready = self._journal_checked = False

    def _has_table(self, con: sqlite3.Connection) -> bool:
        if self._schema_ready:
            return True
        row = con.execute("SELECT type FROM sqlite_master WHERE name = 'entries'").fetchone()
        if row is None:
            return False
        if row[0] != "table":
            raise Unusable(f"not an opselect tune cache: its 'entries' is a {row[0]!r}")
        self._schema_ready = True
        return True

    def _select(self, con: sqlite3.Connection, key: str) -> str | None:
        row = con.execute(f"SELECT CASE WHEN {TEXT_ROW} THEN value END, typeof(value), "
                          f"length(value) FROM entries WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        if row[0] is None:
            warn_once("rejected", f"ignoring a row of {self.path} whose value is "
                                  f"{_describe(row[1], row[2])}, not a JSON text record: it was "
                                  f"not decoded")
        return row[0]

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
        set_busy_timeout(con, 0)
        try:
            if str(con.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
                con.execute("PRAGMA journal_mode = WAL").fetchone()
            self._journal_checked = True
        except sqlite3.OperationalError as exc:
            if not isinstance(failure(exc), Busy):
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
        """Merge a batch of queued writes, [(key, [(op, change), ...])], in one transaction."""
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

    def _write_rows(self, con: sqlite3.Connection, rows: list[tuple[str, str | None, str]]
                    ) -> None:
        """Write (key, op, text) rows as they are, in one transaction."""
        self._prepare_writes(con)
        con.execute("BEGIN IMMEDIATE")
        self._create_schema(con)
        con.executemany("INSERT OR REPLACE INTO entries (key, op, value) VALUES (?, ?, ?)", rows)
        con.execute("COMMIT")

    def _page(self, con: sqlite3.Connection, after: str, end: str,
              op: str | None) -> list[tuple[str, str]]:
        """Up to PAGE (key, text) text rows with after < key < end (and of op), in key order."""
        if not self._has_table(con):
            return []
        where = f"{TEXT_ROW} AND key > ? AND key < ?" + (" AND op = ?" if op else "")
        args = (after, end) + ((op,) if op else ())
        return con.execute(f"SELECT key, value FROM entries WHERE {where} ORDER BY key "
                           f"LIMIT {PAGE}", args).fetchall()

    def _count(self, con: sqlite3.Connection, prefix: str, end: str,
               op: str | None) -> tuple[int, int]:
        """(text rows with prefix <= key < end (and of op), rows of any key that are not text)."""
        if not self._has_table(con):
            return 0, 0
        match = "key >= ? AND key < ?" + (" AND op = ?" if op else "")
        args = (prefix, end) + ((op,) if op else ())
        return con.execute(
            f"SELECT coalesce(sum(CASE WHEN {TEXT_ROW} AND {match} THEN 1 ELSE 0 END), 0), "
            f"coalesce(sum(CASE WHEN {TEXT_ROW} THEN 0 ELSE 1 END), 0) FROM entries",
            args).fetchone()

    def _text_keys(self, con: sqlite3.Connection, keys: list[str]) -> set[str]:
        """Which of keys have a text row."""
        return {k for k, in con.execute(f"SELECT key FROM entries WHERE {TEXT_ROW} AND key IN "
                                        f"({','.join('?' * len(keys))})", keys).fetchall()}

    def _delete_rows(self, con: sqlite3.Connection, op: str | None) -> int:
        """Delete every row (op None: also rows that are not text) or the rows of op."""
        if not self._has_table(con):
            return 0
        con.execute("BEGIN IMMEDIATE")
        n = con.execute("DELETE FROM entries" + (" WHERE op = ?" if op else ""),
                        (op,) if op else ()).rowcount
        con.execute("COMMIT")
        return n
