"""The tune cache against another local user: links planted on the cache's path, a link flipped
while the cache opens, SQLite's files linked to someone else's, `export` aimed at a device or a
FIFO, numbers no JSON record holds.

Where the test runs as root, the attacker is a real second user (uid 65534, `nobody`): its links
and files are made by processes running as that user, in a sticky world-writable directory as
/tmp is. Elsewhere the tests that need a second user skip, saying so.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import pytest
import torch

import opselect
from opselect import ops
from opselect.cli import main
from opselect.dispatch import device_info, tuning
from opselect.errors import CacheWarning
from opselect.tune_cache import TuneStore, reset, store
from opselect.tune_cache.keys import TUNE_PREFIX
from opselect.tune_cache.textdb import FILE_NAME, TextStore

IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
OTHER = 65534
needs_root = pytest.mark.skipif(not IS_ROOT, reason="acting as a second user needs root")


def isin_inputs():
    return torch.arange(300) % 37, torch.tensor([1, 5, 7, 36])


def cache_warnings(record) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, CacheWarning)]


def as_other_user(*argv: str, wait: bool = True):
    """Run a command as the other user (root only)."""
    kwargs = dict(user=OTHER, group=OTHER, extra_groups=[], cwd="/")
    if wait:
        subprocess.run(argv, check=True, timeout=60, **kwargs)
        return None
    return subprocess.Popen(argv, **kwargs)


@pytest.fixture
def shared_tmp():
    """A sticky directory everyone may write, as /tmp is (outside pytest's private tmp_path,
    which the other user cannot enter)."""
    path = Path(tempfile.mkdtemp(prefix="opselect-shared-"))
    os.chmod(path, 0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def private(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def tune_one_call() -> list[str]:
    """A tuned call through the default store; its cache warnings."""
    a, b = isin_inputs()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        with tuning():
            assert torch.equal(ops.isin(a, b), torch.isin(a, b))
    return cache_warnings(record)


# -- 2: a symbolic link on the cache's path ---------------------------------------------------------
@needs_root
def test_a_cache_directory_linked_by_another_user_is_refused(shared_tmp, tmp_path, monkeypatch,
                                                             cpu_triton, fake_measure):
    """Root's OPSELECT_CACHE_DIR names a link another user owns, pointing at one of root's
    directories: nothing is created or written there."""
    roots = private(tmp_path / "roots-directory")
    link = shared_tmp / "cache"
    as_other_user("ln", "-s", str(roots), str(link))
    monkeypatch.setenv("OPSELECT_CACHE_DIR", str(link))
    reset()
    messages = tune_one_call()
    assert len(messages) == 1, messages
    assert f"not using {link}: it is a symbolic link owned by uid {OTHER}" in messages[0]
    assert list(roots.iterdir()) == []
    opselect.forget()
    a, b = isin_inputs()
    assert opselect.explain("isin", a, b, show=False).source == "cache"  # kept in memory


def _planted_store(directory: Path, key: str, text: str) -> None:
    con = sqlite3.connect(directory / FILE_NAME)
    with con:
        con.execute("CREATE TABLE entries (key TEXT PRIMARY KEY, op TEXT, value TEXT)")
        con.execute("INSERT INTO entries VALUES (?, 'isin', ?)", (key, text))
    con.close()


@needs_root
@pytest.mark.slow
def test_a_link_flipped_while_the_cache_opens_is_never_followed(shared_tmp, tmp_path):
    """The other user flips its link between root's cache and a directory of planted rows, as
    fast as it can, while root opens the cache again and again for a bounded time: no open
    reads a planted row (the old check stat()ed the link, SQLite opened it again by name)."""
    good = private(tmp_path / "roots-cache")
    _planted_store(good, "probe", "root's own row")
    planted = shared_tmp / "planted"
    as_other_user("mkdir", "-m", "0755", str(planted))
    _planted_store(planted, "probe", "PLANTED")
    os.chown(planted / FILE_NAME, OTHER, OTHER)
    link = shared_tmp / "cache"
    as_other_user("ln", "-s", str(good), str(link))
    flip = (f"while :; do ln -sfn {good} {link}.t && mv -Tf {link}.t {link}; "
            f"ln -sfn {planted} {link}.t && mv -Tf {link}.t {link}; done")
    flipper = as_other_user("sh", "-c", flip, wait=False)
    seen: dict[str | None, int] = {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CacheWarning)
            deadline = time.monotonic() + 4.0
            while time.monotonic() < deadline:
                db = TextStore(link)
                got = db.get("probe")
                seen[got] = seen.get(got, 0) + 1
                db.close()
    finally:
        flipper.kill()
        flipper.wait()
    assert "PLANTED" not in seen, seen
    assert sum(seen.values()) > 50, seen  # it did open many times
    assert sorted(os.listdir(good)) == [FILE_NAME]  # nothing added to root's directory


def test_a_parent_others_can_write_is_refused(tmp_path, monkeypatch, cpu_triton, fake_measure):
    """A cache directory of your own inside a directory others may write (without the sticky
    bit): they can rename it away and put theirs in its place, so it is refused."""
    loose = tmp_path / "loose"
    loose.mkdir()
    os.chmod(loose, 0o777)
    cache = private(loose / "cache")
    monkeypatch.setenv("OPSELECT_CACHE_DIR", str(cache))
    reset()
    messages = tune_one_call()
    assert len(messages) == 1, messages
    assert f"not using {cache}: its parent {loose} is writable by group and others" in \
        messages[0]
    assert list(cache.iterdir()) == []


def test_a_sticky_parent_and_your_own_links_are_fine(tmp_path, monkeypatch, cpu_triton,
                                                     fake_measure):
    """/tmp/yours in a sticky /tmp, and links you own (a ~/.cache linked to a data disk): used,
    the file made where the links lead."""
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    target = private(sticky / "real-cache")
    hop = tmp_path / "hop"
    hop.symlink_to(sticky)
    link = tmp_path / "cache-link"
    link.symlink_to(Path("hop") / "real-cache")  # relative, through another link
    monkeypatch.setenv("OPSELECT_CACHE_DIR", str(link / "deeper"))
    reset()
    assert tune_one_call() == []
    assert (target / "deeper" / FILE_NAME).is_file()
    assert stat.S_IMODE(os.stat(target / "deeper").st_mode) == 0o700


# -- 3: SQLite's files linked elsewhere -------------------------------------------------------------
def _export_file(tmp_path: Path) -> Path:
    """A real export file of one tuned record, made through a private cache."""
    source = TuneStore(private(tmp_path / "source-cache"))
    source.put_timings("isin", device_info(torch.device("cpu")), ("exported",),
                       {"torch": (1e-3, {}, "h")})
    source.db.close()
    out = tmp_path / "tuned.json"
    assert source.export(out) == 1
    return out


@pytest.mark.parametrize("suffix", ["", "-wal", "-shm", "-journal"])
@pytest.mark.parametrize("trust_shared", [False, True])
def test_a_linked_database_file_is_refused_whatever_the_setting(
        tmp_path, shared_tmp, monkeypatch, capsys, suffix, trust_shared):
    """tune.sqlite3 (or a file SQLite keeps next to it) is a link to a file of root's: import
    fails with a reason and root's file is untouched, even with the shared-directory opt-out
    (the link is the other user's where the test runs as root)."""
    export = _export_file(tmp_path)
    roots_file = tmp_path / "roots-database"
    roots_file.write_bytes(b"")
    os.chmod(tmp_path, 0o755)  # (the other user's link must lead somewhere it can name)
    cache = shared_tmp / "cache"
    if IS_ROOT:
        as_other_user("mkdir", "-m", "0777", str(cache))
        as_other_user("ln", "-s", str(roots_file), str(cache / f"{FILE_NAME}{suffix}"))
    else:
        cache.mkdir()
        os.chmod(cache, 0o777)
        (cache / f"{FILE_NAME}{suffix}").symlink_to(roots_file)
    if trust_shared:
        monkeypatch.setenv("OPSELECT_CACHE_TRUST_SHARED", "1")
    monkeypatch.setenv("OPSELECT_CACHE_DIR", str(cache))
    reset()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert main(["import", str(export)]) == 1
    assert "nothing was imported" in capsys.readouterr().err
    assert roots_file.read_bytes() == b""
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("roots-database")) \
        == ["roots-database"]  # no -wal or -shm made beside it
    messages = cache_warnings(record)
    if trust_shared:  # (without it, the shared directory itself is refused first)
        assert any(f"{FILE_NAME}{suffix}: it is a symbolic link" in m for m in messages), messages


def test_a_hard_linked_database_file_is_refused(tmp_path, monkeypatch, capsys):
    export = _export_file(tmp_path)
    elsewhere = tmp_path / "another-database"
    elsewhere.write_bytes(b"")
    cache = private(tmp_path / "cache")
    os.link(elsewhere, cache / FILE_NAME)
    monkeypatch.setenv("OPSELECT_CACHE_DIR", str(cache))
    reset()
    with pytest.warns(CacheWarning, match="it has 2 hard links"):
        assert main(["import", str(export)]) == 1
    assert elsewhere.read_bytes() == b""


# -- 4: export onto whatever the path is ------------------------------------------------------------
def _special_files(tmp_path: Path) -> dict[str, Path]:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    out = {"a FIFO": fifo}
    link_target = tmp_path / "target.json"
    link_target.write_text("kept")
    (tmp_path / "link.json").symlink_to(link_target)
    out["a symbolic link"] = tmp_path / "link.json"
    (tmp_path / "a-directory").mkdir()
    out["a directory"] = tmp_path / "a-directory"
    if IS_ROOT:
        try:  # a character device with /dev/full's numbers
            os.mknod(tmp_path / "full", stat.S_IFCHR | 0o666, os.makedev(1, 7))
            out["a character device"] = tmp_path / "full"
        except PermissionError:  # a container without CAP_MKNOD
            pass
    return out


@pytest.mark.parametrize("kind", ["a FIFO", "a symbolic link", "a directory",
                                  "a character device"])
def test_export_never_replaces_what_is_not_a_regular_file(tmp_path, capsys, kind):
    target = _special_files(tmp_path).get(kind)
    if target is None:
        pytest.skip("making a character device needs root with CAP_MKNOD")
    before = os.lstat(target)
    assert main(["export", str(target)]) == 2
    err = capsys.readouterr().err
    assert f"{target} is {kind}, not a regular file" in err and "nothing was written" in err
    after = os.lstat(target)
    assert (after.st_ino, stat.S_IFMT(after.st_mode)) == (before.st_ino,
                                                          stat.S_IFMT(before.st_mode))
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_export_to_standard_output_and_over_a_regular_file(tmp_path, capsys):
    st = store()
    st.put_timings("isin", device_info(torch.device("cpu")), ("k",), {"torch": (1e-3, {}, "h")})
    assert main(["export", "-"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["opselect_export"] == 1 and len(json.loads(out.out)["entries"]) == 1
    assert "exported 1 entries to standard output" in out.err
    existing = tmp_path / "old.json"
    existing.write_text("old")
    assert main(["export", str(existing)]) == 0
    assert json.loads(existing.read_text())["entries"]


# -- 5: numbers no record holds -----------------------------------------------------------------
def _record_text(**change) -> str:
    """The text of a real export file with one record, a field replaced by raw JSON text."""
    st = store()
    st.put_timings("topk", device_info(torch.device("cpu")), ("k",), {"torch": (1e-3, {}, "h")})
    rows = list(st.db.rows(TUNE_PREFIX))
    assert len(rows) == 1
    text = json.dumps({"opselect_export": 1, "entries": [
        {"key": key, "record": json.loads(raw)} for key, raw in rows]})
    for field, raw in change.items():
        assert f'"{field}": 0.001' in text
        text = text.replace(f'"{field}": 0.001', f'"{field}": {raw}')
    return text


@pytest.mark.parametrize("number, what", [("9" * 5000, "an integer of 5000 digits"),
                                          ("-" + "1" * 41, "an integer of 41 digits"),
                                          ("1e400", "out of a float's range"),
                                          ("NaN", "NaN, which is not a JSON number"),
                                          ("-Infinity", "-Infinity, which is not a JSON number"),
                                          ("0." + "1" * 70, "written in 72 characters")])
def test_a_number_out_of_bounds_is_refused_before_it_is_converted(tmp_path, capsys, monkeypatch,
                                                                 cpu_triton, number, what):
    big = tmp_path / "big.json"
    big.write_text(_record_text(seconds=number))
    assert number in big.read_text()
    reset()
    # import: exit 2 with the reason
    assert main(["import", str(big)]) == 2
    err = capsys.readouterr().err
    assert what in err and "not imported" in err and "internal error" not in err
    # a read-only layer: a plain call answers, with one warning naming the layer
    monkeypatch.setenv("OPSELECT_CACHE_PATH", str(big))
    reset()
    opselect.forget()
    x = torch.randn(4, 256)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        got = ops.topk(x, 8)
    assert torch.equal(got.values, torch.topk(x, 8).values)
    messages = cache_warnings(record)
    assert len(messages) == 1 and f"ignoring the read-only layer {big}" in messages[0]
    assert what in messages[0]


@pytest.mark.timeout(120)
def test_a_layer_that_is_a_fifo_does_not_hang_a_call(tmp_path, monkeypatch, cpu_triton):
    fifo = tmp_path / "layer.json"
    os.mkfifo(fifo)
    monkeypatch.setenv("OPSELECT_CACHE_PATH", str(fifo))
    reset()
    x = torch.randn(4, 256)
    with pytest.warns(CacheWarning, match="not a regular file"):
        ops.topk(x, 8)


# -- a record's config is data: only one the backend offers runs -----------------------------------
def test_a_config_the_backend_does_not_offer_is_never_run(isolated_cache, cpu_triton,
                                                          fake_measure):
    """A record (planted, or from another rank or server) names a block size no kernel of the
    backend offers for the call: it is ignored with one warning, never launched."""
    from opselect.dispatch import get_op
    from opselect.tune_cache.storage import tune_key

    a, b = isin_inputs()
    with tuning():
        ops.isin(a, b)
    call = get_op("isin").prepare(a, b)
    key = tune_key("isin", call.info.cache_key, repr(call.key[1:]))
    con = sqlite3.connect(isolated_cache / FILE_NAME)
    record = json.loads(con.execute("SELECT value FROM entries WHERE key = ?", (key,)).fetchone()[0])
    record["timings"]["search"]["config"] = {"BLOCK": 1 << 40, "num_warps": 4}
    with con:
        con.execute("UPDATE entries SET value = ? WHERE key = ?", (json.dumps(record), key))
    con.close()
    reset()
    opselect.forget()
    with pytest.warns(CacheWarning, match=r"config of isin/search that the backend does not "
                                          r"offer for the call \({'BLOCK': 1099511627776"):
        decision = opselect.explain("isin", a, b, show=False)
    assert decision.candidate("search").measured_s is None  # (the model's estimate instead)
    assert decision.config.get("BLOCK") != 1 << 40
    assert torch.equal(ops.isin(a, b), torch.isin(a, b))


@pytest.mark.slow
def test_command_line_warnings_are_one_line(tmp_path):
    """A warning at the command line is its text on one line, not Python's source line too."""
    loose = tmp_path / "loose-cache"
    loose.mkdir()
    os.chmod(loose, 0o777)
    result = subprocess.run([sys.executable, "-m", "opselect.cli", "show"], capture_output=True,
                            text=True, timeout=300,
                            env={**os.environ, "OPSELECT_CACHE_DIR": str(loose)})
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"warning: opselect tune cache: not using {loose}: it is writable")
