"""`opselect export` / `import`: a tuned cache as one JSON file, read as untrusted input.

An import file is bounded before it is parsed: its size (MAX_IMPORT_BYTES), its nesting depth
(MAX_DEPTH, found by a linear scan: Python's json recurses once per level and would end in a
RecursionError), and its number of entries (MAX_ENTRIES). Entries are parsed one at a time (a
large file costs about three times its size in memory at the peak, not ten), each record is
validated by its pydantic model and filed under the key derived from it, and all are written in one
transaction.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

from pydantic import ValidationError

from ..errors import CacheError, UsageError
from .notices import warn_once
from .bounded_json import DECODER, NumberRefused
from .records import Calibration, TuneRecord
from .keys import CALIBRATION_PREFIX, TUNE_PREFIX, calibration_key, tune_key
from .textdb import MAX_KEY_CHARS, MAX_VALUE_CHARS

#: about 250,000 tune records of six backends each, as `export` writes them
MAX_IMPORT_BYTES = 256 << 20
#: an export nests 6 deep (file, entries, entry, record, timings, timing's config)
MAX_DEPTH = 32
MAX_ENTRIES = 1_000_000
FORMAT = 1

_ALL_BUT_STRUCTURE = bytes(b for b in range(256) if b not in b'"[]{}')
_SPACE = re.compile(r"[ \t\n\r]*")


# -- export ---------------------------------------------------------------------------------------
def export_file(st: Any, path: Path) -> int:  # st: a storage.TuneStore
    """Write every valid record, one entry per line, to path: a regular file, replaced atomically
    (a temporary file in the same directory, then a rename), or standard output for "-".
    UsageError when path names something else (a device, a FIFO, a link, a directory): renaming
    over it would replace it. CacheError when path cannot be written."""
    if str(path) == "-":
        return _write_export(st, sys.stdout)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        info = None
    except OSError as exc:
        raise CacheError(f"cannot write {path}: {exc.strerror or exc}") from None
    if info is not None and not stat.S_ISREG(info.st_mode):
        raise UsageError(f"{path} is {_kind(info.st_mode)}, not a regular file; export writes a "
                         f"regular file (or - for standard output); nothing was written")
    directory = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise CacheError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            n = _write_export(st, out)
        os.replace(tmp, path)
    except OSError as exc:
        _remove(tmp)
        raise CacheError(f"cannot write {path}: {exc.strerror or exc}") from None
    except BaseException:
        _remove(tmp)
        raise
    return n


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _write_export(st: Any, out: Any) -> int:
    n = 0
    out.write(f'{{"opselect_export": {FORMAT}, "entries": [')
    for prefix, model, what in ((TUNE_PREFIX, TuneRecord, "tune"),
                                (CALIBRATION_PREFIX, Calibration, "calibration")):
        for key, raw in st.db.rows(prefix):
            record = st._parse(raw, model, what)
            if record is None:
                continue
            entry = f'{{"key": {json.dumps(key)}, "record": {record.model_dump_json()}}}'
            out.write(("\n" if n == 0 else ",\n") + entry)
            n += 1
    out.write("\n]}\n")
    out.flush()
    return n


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


# -- import ---------------------------------------------------------------------------------------
def import_file(st: Any, path: Path) -> tuple[int, int]:  # st: a storage.TuneStore
    rows, skipped = read_export(path)
    try:
        st.db.replace_many(rows)
    except CacheError as exc:
        raise CacheError(f"{exc}; nothing was imported from {path}") from None
    return len(rows), skipped


def read_export(path: Path) -> tuple[list[tuple[str, str | None, str]], int]:
    """The valid entries of an export file as (key, op, JSON text) rows, and how many were not
    valid (skipped with one warning). UsageError when the file cannot be read or is malformed."""
    data = _read_bounded(path)
    depth = json_depth(data)
    if depth > MAX_DEPTH:
        raise UsageError(f"{path}: JSON nested {depth} levels deep, past the limit of {MAX_DEPTH} "
                         f"(an export nests 6 deep); not imported")
    text = _decode(data, path)
    del data
    rows: list[tuple[str, str | None, str]] = []
    skipped = 0

    def take(entry: Any) -> None:
        nonlocal skipped
        if len(rows) + skipped >= MAX_ENTRIES:
            raise UsageError(f"{path}: more than {MAX_ENTRIES} entries, past the limit; "
                             f"not imported")
        row = _entry_row(entry)
        if row is None:
            skipped += 1
        else:
            rows.append(row)

    try:
        version = _parse_export(text, path, take)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path}: malformed JSON at line {exc.lineno} column {exc.colno}: "
                         f"{exc.msg}") from None
    except NumberRefused as exc:
        raise UsageError(f"{path}: {exc}; not an opselect export file, not imported") from None
    except RecursionError:  # the depth scan makes this unreachable; never a traceback though
        raise UsageError(f"{path}: JSON nested too deep (limit {MAX_DEPTH})") from None
    if version != FORMAT:
        raise UsageError(f"{path}: not an opselect export file (expected \"opselect_export\": "
                         f"{FORMAT}, found {version!r})")
    if skipped:
        warn_once("invalid", f"ignoring {skipped} invalid record(s) in {path}")
    return rows, skipped


def _read_bounded(path: Path) -> bytes:
    try:
        # Non-blocking, then checked on the descriptor: a FIFO put where a layer's file was
        # would otherwise hang the first call that asks the cache.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with open(fd, "rb") as f:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise UsageError(f"{path}: not a regular file; not imported")
            if info.st_size > MAX_IMPORT_BYTES:
                raise UsageError(f"{path}: {info.st_size} bytes, past the import limit of "
                                 f"{MAX_IMPORT_BYTES >> 20} MiB; not imported")
            data = f.read(MAX_IMPORT_BYTES + 1)  # a growing file: still bounded
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_IMPORT_BYTES:
        raise UsageError(f"{path}: past the import limit of {MAX_IMPORT_BYTES >> 20} MiB; "
                         f"not imported")
    return data


def _decode(data: bytes, path: Path) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path}: not UTF-8 text (byte {exc.start}); not imported") from None


def json_depth(data: bytes) -> int:
    """The deepest nesting of [ and { in JSON, strings skipped: a few linear passes in C and numpy
    that never recurse. For malformed JSON it counts at least as deep as a parser gets before it
    fails (up to the first error both read the same strings)."""
    import numpy as np

    # Escaped backslashes, then escaped quotes, go first: every quote left delimits a string.
    data = data.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _ALL_BUT_STRUCTURE)
    codes = np.frombuffer(data, dtype=np.uint8)
    if codes.size == 0:
        return 0
    quote = codes == ord('"')
    brackets = codes[~(quote | np.logical_xor.accumulate(quote))]  # those outside strings
    steps = ((brackets == ord("[")).view(np.int8) + (brackets == ord("{")).view(np.int8)
             - (brackets == ord("]")).view(np.int8) - (brackets == ord("}")).view(np.int8))
    return int(np.cumsum(steps, dtype=np.int32).max(initial=0))


def _parse_export(text: str, path: Path, on_entry: Callable[[Any], None]) -> Any:
    """Parse {"opselect_export": 1, "entries": [...]} handing each entry to on_entry as soon as
    it is parsed (one entry's objects at a time); returns the "opselect_export" value."""
    decoder = DECODER
    found: dict[str, Any] = {}

    def skip(i: int) -> int:
        return _SPACE.match(text, i).end()

    def expect(i: int, char: str, what: str) -> int:
        i = skip(i)
        if text[i:i + 1] != char:
            raise json.JSONDecodeError(f"expected {what}", text, i)
        return i + 1

    def sequence(i: int, close: str, item: Callable[[int], int]) -> int:
        """The items of a ',' separated sequence that `close` ends, each parsed by item."""
        if text[skip(i):skip(i) + 1] == close:
            return skip(i) + 1
        while True:
            i = skip(item(skip(i)))
            if text[i:i + 1] != ",":
                return expect(i, close, f"',' or '{close}'")
            i += 1

    def entry(i: int) -> int:
        value, i = decoder.raw_decode(text, i)
        on_entry(value)
        return i

    def field(i: int) -> int:
        name, i = decoder.raw_decode(text, i)
        if not isinstance(name, str):
            raise json.JSONDecodeError("expected a name", text, i)
        i = expect(i, ":", "':'")
        if name == "entries":
            return sequence(expect(i, "[", "a list of entries"), "]", entry)
        if name == "opselect_export":
            found[name], i = decoder.raw_decode(text, skip(i))
            return i
        raise UsageError(f"{path}: not an opselect export file (unknown field {name!r})")

    i = sequence(expect(0, "{", "an object ({\"opselect_export\": 1, \"entries\": [...]})"),
                 "}", field)
    if skip(i) != len(text):
        raise json.JSONDecodeError("extra data after the export", text, skip(i))
    return found.get("opselect_export")


def _entry_row(entry: Any) -> tuple[str, str | None, str] | None:
    """(key, op, text) of a valid entry, filed under the key its record implies (an entry whose
    key says otherwise is not valid); None when not valid."""
    if not isinstance(entry, dict) or not isinstance(entry.get("record"), dict):
        return None
    if set(entry) - {"key", "record"}:
        return None
    record, given = entry["record"], entry.get("key")
    is_tune = isinstance(given, str) and given.startswith(TUNE_PREFIX) if given is not None \
        else "op" in record
    try:
        if is_tune:
            rec = TuneRecord.model_validate(record)
            key, op = tune_key(rec.op, rec.fingerprint.device, rec.key), rec.op
        else:
            rec = Calibration.model_validate(record)
            key, op = calibration_key(rec.fingerprint.device), None
    except ValidationError:
        return None
    text = rec.model_dump_json()
    if (given is not None and given != key) or len(key) > MAX_KEY_CHARS \
            or len(text) > MAX_VALUE_CHARS:
        return None
    return key, op, text
