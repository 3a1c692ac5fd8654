"""The tune cache as a hostile neighbour and a busy server would meet it: planted rows, foreign or
loose permissions, a process holding the lock, many writers at once, hostile import files.

Real components throughout: real sqlite files planted with the stdlib, real processes (forked
writers, a lock holder, a caller that imports opselect afresh), the real command line.
"""

from __future__ import annotations

import io
import json
import multiprocessing
import os
import pickle
import selectors
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path

import pytest
import torch

import opselect
from opselect import ops
from opselect.cli import main
from opselect.dispatch import device_info, get_op, tuning
from opselect.dispatch.device import INTERPRETED
from opselect.errors import CacheWarning
from opselect.tune_cache import TuneStore, reset, store
from opselect.tune_cache import textdb, transfer
from opselect.tune_cache.storage import tune_key
from opselect.tune_cache.textdb import FILE_NAME, MAX_VALUE_CHARS

ROOT = Path(__file__).resolve().parent.parent
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
#: how long the lock holder holds at least; the call under test must return within CALL_BOUND_S
HOLD_S = 6.0
CALL_BOUND_S = 1.0


def isin_inputs(n: int = 300, device: str = "cpu"):
    return torch.arange(n, device=device) % 37, torch.tensor([1, 5, 7, 36], device=device)


@pytest.fixture
def call_device() -> str:
    """Where the plain calls under test run: the GPU where there is one, else the CPU through
    Triton's interpreter (so that Triton backends are candidates and the cache is asked)."""
    if torch.cuda.is_available():
        return "cuda"
    if not INTERPRETED:
        pytest.skip("needs a GPU or Triton's interpreter")
    return "cpu"


def cache_warnings(record) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, CacheWarning)]


class Planted:
    """A pickle that creates `marker` when unpickled: harmless, and proof that it ran."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def live_payload(tmp_path: Path, marker: Path) -> bytes:
    """The payload for marker, after checking on another marker that unpickling it does run it
    (so the tests below would see an unpickle)."""
    probe = tmp_path / "probe-marker"
    pickle.loads(pickle.dumps(Planted(probe))).close()
    assert probe.exists()
    return pickle.dumps(Planted(marker))


def private_dir(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def plant(directory: Path, rows: list[tuple]) -> None:
    """Write rows (key, op, value) into the cache file as another program could, creating the
    table the store makes."""
    con = sqlite3.connect(directory / FILE_NAME)
    try:
        with con:
            con.execute("CREATE TABLE IF NOT EXISTS entries (key TEXT PRIMARY KEY, op TEXT, "
                        "value TEXT)")
            con.executemany("INSERT OR REPLACE INTO entries VALUES (?, ?, ?)", rows)
    finally:
        con.close()


def topk_key(x: torch.Tensor, k: int) -> str:
    call = get_op("topk").prepare(x, k)
    return tune_key("topk", call.info.cache_key, repr(call.key[1:]))


def assert_right_topk(got, x: torch.Tensor, k: int) -> None:
    want = torch.topk(x, k)
    assert torch.equal(got.values, want.values) and torch.equal(got.indices, want.indices)


# -- planted rows -----------------------------------------------------------------------------------
def test_pickled_value_under_a_looked_up_key_is_never_unpickled(isolated_cache, tmp_path,
                                                                call_device):
    marker = tmp_path / "value-marker"
    x = torch.randn(4, 256, device=call_device)
    key = topk_key(x, 8)
    plant(private_dir(isolated_cache), [(key, "topk", live_payload(tmp_path, marker))])
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        got = ops.topk(x, 8)  # a plain call: no tuning, no command line
    assert_right_topk(got, x, 8)
    assert not marker.exists()
    messages = cache_warnings(record)
    assert len(messages) == 1 and "BLOB" in messages[0] and "not decoded" in messages[0]


def test_pickled_key_is_never_unpickled(isolated_cache, tmp_path, capsys, cpu_triton):
    marker = tmp_path / "key-marker"
    payload = live_payload(tmp_path, marker)
    plant(private_dir(isolated_cache), [(payload, "topk", '{"op": "topk"}'),
                                        (f"tune|{payload!r}", payload, payload)])
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert main(["show"]) == 0
        shown = capsys.readouterr().out
        assert main(["export", str(tmp_path / "out.json")]) == 0
        assert main(["clear", "-y"]) == 0
        cleared = capsys.readouterr().out
    assert not marker.exists()
    assert "0 tune record(s)" in shown and "deleted 2 entries" in cleared
    messages = cache_warnings(record)
    assert len(messages) == 1 and "2 row(s)" in messages[0] and "never decoded" in messages[0]
    assert json.loads((tmp_path / "out.json").read_text())["entries"] == []
    con = sqlite3.connect(isolated_cache / FILE_NAME)
    assert con.execute("SELECT count(*) FROM entries").fetchone() == (0,)  # clear took them too
    con.close()


def _legacy_diskcache(directory: Path, victim: Path, pickled: bytes) -> None:
    """A diskcache 5.x cache.db as another user could plant it: a file-mode row (mode 2, binary)
    naming a file outside the cache, and a pickle-mode row (mode 4) whose key is a pickle too."""
    con = sqlite3.connect(directory / "cache.db")
    with con:
        con.execute("CREATE TABLE Settings (key TEXT NOT NULL UNIQUE, value)")
        con.executemany("INSERT INTO Settings VALUES (?, ?)", [
            ("count", 2), ("size", 0), ("hits", 0), ("misses", 0), ("statistics", 0),
            ("tag_index", 0), ("eviction_policy", "least-recently-stored"),
            ("size_limit", 2 ** 30), ("cull_limit", 10), ("sqlite_auto_vacuum", 1),
            ("sqlite_cache_size", 8192), ("sqlite_journal_mode", "wal"),
            ("sqlite_mmap_size", 2 ** 26), ("sqlite_synchronous", 1),
            ("disk_min_file_size", 2 ** 15),
            ("disk_pickle_protocol", pickle.HIGHEST_PROTOCOL)])
        con.execute("CREATE TABLE Cache (rowid INTEGER PRIMARY KEY, key BLOB, raw INTEGER, "
                    "store_time REAL, expire_time REAL, access_time REAL, "
                    "access_count INTEGER DEFAULT 0, tag BLOB, size INTEGER DEFAULT 0, "
                    "mode INTEGER DEFAULT 0, filename TEXT, value BLOB)")
        con.execute("CREATE UNIQUE INDEX Cache_key_raw ON Cache(key, raw)")
        now = time.time()
        con.execute("INSERT INTO Cache (key, raw, store_time, expire_time, access_time, size, "
                    "mode, filename, value) VALUES (?, 1, ?, NULL, ?, 1, 2, ?, NULL)",
                    ("tune|planted", now, now, str(victim)))
        con.execute("INSERT INTO Cache (key, raw, store_time, expire_time, access_time, size, "
                    "mode, filename, value) VALUES (?, 0, ?, NULL, ?, 0, 4, NULL, ?)",
                    (pickled, now, now, pickled))
    con.close()


def test_legacy_diskcache_file_is_never_opened(isolated_cache, tmp_path, capsys, call_device):
    marker = tmp_path / "legacy-marker"
    victim = tmp_path / "victim.txt"
    victim.write_text("the victim's own file")
    _legacy_diskcache(private_dir(isolated_cache), victim, live_payload(tmp_path, marker))
    legacy = (isolated_cache / "cache.db").read_bytes()
    try:  # the planted rows are live: diskcache itself deletes a file they name
        import diskcache
    except ImportError:
        pass
    else:
        copy, bait = private_dir(tmp_path / "copy"), tmp_path / "bait.txt"
        bait.write_text("x")
        _legacy_diskcache(copy, bait, pickle.dumps(None))
        with diskcache.Cache(str(copy)) as planted:
            planted.clear()
        assert not bait.exists()
    for argv in (["clear", "-y"], ["show"]):
        reset()
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            assert main(argv) == 0
        messages = cache_warnings(record)
        assert len(messages) == 1 and "cache.db" in messages[0] and "never opened" in messages[0]
    x = torch.randn(4, 256, device=call_device)
    assert_right_topk(ops.topk(x, 8), x, 8)
    assert "0 tune record(s)" in capsys.readouterr().out
    assert victim.read_text() == "the victim's own file" and not marker.exists()
    assert (isolated_cache / "cache.db").read_bytes() == legacy


def test_oversized_text_row_is_skipped_before_decoding(isolated_cache, call_device):
    x = torch.randn(4, 256, device=call_device)
    plant(private_dir(isolated_cache), [(topk_key(x, 8), "topk", " " * (MAX_VALUE_CHARS + 1))])
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        got = ops.topk(x, 8)
    assert_right_topk(got, x, 8)
    messages = cache_warnings(record)
    assert len(messages) == 1 and "past the" in messages[0]


# -- ownership and permissions ----------------------------------------------------------------------
@pytest.mark.parametrize("mode, who", [(0o777, "group and others"), (0o770, "group"),
                                       (0o707, "others")])
def test_directory_others_can_write_is_refused(isolated_cache, cpu_triton, fake_measure, mode,
                                               who):
    isolated_cache.mkdir()
    os.chmod(isolated_cache, mode)
    a, b = isin_inputs()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        with tuning():
            assert torch.equal(ops.isin(a, b), torch.isin(a, b))
        opselect.forget()
        assert opselect.explain("isin", a, b, show=False).source == "cache"  # kept in memory
    messages = cache_warnings(record)
    assert len(messages) == 1
    assert f"not using {isolated_cache}: it is writable by {who} (mode {mode:04o})" in messages[0]
    assert "OPSELECT_CACHE_TRUST_SHARED=1" in messages[0]
    assert list(isolated_cache.iterdir()) == []  # nothing written there


def test_cache_file_others_can_write_is_refused(isolated_cache, cpu_triton, fake_measure):
    private_dir(isolated_cache)
    plant(isolated_cache, [])
    os.chmod(isolated_cache / FILE_NAME, 0o666)
    with pytest.warns(CacheWarning, match=f"not using {isolated_cache / FILE_NAME}: it is "
                                          "writable by group and others"):
        with tuning():
            ops.isin(*isin_inputs())
    con = sqlite3.connect(isolated_cache / FILE_NAME)
    assert con.execute("SELECT count(*) FROM entries").fetchone() == (0,)
    con.close()


@pytest.mark.skipif(not IS_ROOT, reason="giving a directory to another user needs root")
def test_directory_of_another_user_is_refused(isolated_cache, cpu_triton, fake_measure):
    private_dir(isolated_cache)
    os.chown(isolated_cache, 65534, 65534)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        with tuning():
            ops.isin(*isin_inputs())
    messages = cache_warnings(record)
    assert len(messages) == 1 and "owned by uid 65534, not by you (uid 0)" in messages[0]
    assert list(isolated_cache.iterdir()) == []


def test_trust_shared_accepts_a_shared_directory(isolated_cache, cpu_triton, fake_measure,
                                                 monkeypatch):
    isolated_cache.mkdir()
    os.chmod(isolated_cache, 0o777)
    monkeypatch.setenv("OPSELECT_CACHE_TRUST_SHARED", "1")
    a, b = isin_inputs()
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        with tuning():
            ops.isin(a, b)
        reset()
        opselect.forget()
        assert opselect.explain("isin", a, b, show=False).source == "cache"  # from the file
    assert (isolated_cache / FILE_NAME).exists()


def test_a_new_cache_directory_is_private(tmp_path, monkeypatch, cpu_triton, fake_measure):
    directory = tmp_path / "deeper" / "still" / "cache"
    monkeypatch.setenv("OPSELECT_CACHE_DIR", str(directory))
    reset()
    old = os.umask(0o022)
    try:
        with tuning():
            ops.isin(*isin_inputs())
    finally:
        os.umask(old)
    assert directory.stat().st_mode & 0o777 == 0o700
    for f in directory.iterdir():  # the database and SQLite's -wal and -shm
        assert f.stat().st_mode & 0o777 == 0o600, f


def test_read_only_layer_reads_and_never_writes(isolated_cache, cpu_triton, fake_measure):
    a, b = isin_inputs()
    with tuning():
        ops.isin(a, b)
    reset()
    db = isolated_cache / FILE_NAME
    before = db.read_bytes()
    layer = TuneStore(isolated_cache, read_only=True)
    call = get_op("isin").prepare(a, b)
    hashes = {bk.name: bk.source_hash for bk in get_op("isin").backends}
    assert set(layer.get_timings("isin", call.info, call.key[1:], hashes)) == set(hashes)
    with pytest.warns(CacheWarning, match="tune.sqlite3 is read-only"):
        layer.put_timings("isin", call.info, ("new",), {"torch": (1e-3, {}, "h")})
    assert layer.get_timings("isin", call.info, ("new",), {"torch": "h"})  # from memory
    layer.close()
    assert db.read_bytes() == before
    # a WAL reader's shared-memory index may appear next to it, but nothing is written
    assert {p.name for p in isolated_cache.iterdir()} <= {FILE_NAME, f"{FILE_NAME}-wal",
                                                          f"{FILE_NAME}-shm"}
    wal = isolated_cache / f"{FILE_NAME}-wal"
    assert not wal.exists() or wal.stat().st_size == 0
    assert TuneStore(isolated_cache).get_timings("isin", call.info, ("new",), {"torch": "h"}) == {}


READ_ONLY_CHILD = textwrap.dedent("""
    import json, os, sys, warnings
    import torch, opselect
    from opselect import ops
    from opselect.tune_cache import reset, store
    a, b = torch.arange(300) % 37, torch.tensor([1, 5, 7, 36])
    os.environ["OPSELECT_CACHE_DIR"] = sys.argv[2]   # warm every lazy import elsewhere first
    opselect.explain("isin", a, b, show=False)
    info = opselect.dispatch.device_info(a.device)
    store().put_timings("isin", info, ("x",), {"torch": (1, {}, "h")})
    reset(); opselect.forget()
    if int(sys.argv[3]):  # root: become the directory's owner, who cannot write it
        os.setgid(int(sys.argv[3])); os.setuid(int(sys.argv[3]))
    os.environ["OPSELECT_CACHE_DIR"] = sys.argv[1]
    warnings.simplefilter("always")
    with warnings.catch_warnings(record=True) as caught:
        source = opselect.explain("isin", a, b, show=False).source
        with opselect.tuning():
            ops.isin(torch.arange(3000) % 37, b)
    print("RESULT", json.dumps({"source": source, "uid": os.getuid(),
                                "warnings": [str(w.message) for w in caught]}))
""")


@pytest.mark.slow
def test_a_directory_one_cannot_write_is_read_only(tmp_path, cpu_triton, fake_measure,
                                                   monkeypatch):
    """A trusted directory this user cannot write: its records are served, nothing is written
    (the database is in WAL mode without its -shm file, which a reader cannot create there)."""
    import tempfile

    a, b = isin_inputs()
    base = Path(tempfile.mkdtemp(prefix="opselect-ro-"))  # outside root's private pytest dir
    try:
        directory = base / "cache"
        monkeypatch.setenv("OPSELECT_CACHE_DIR", str(directory))
        reset()
        with tuning():
            ops.isin(a, b)
        reset()
        assert sorted(p.name for p in directory.iterdir()) == [FILE_NAME]
        owner = 65534 if IS_ROOT else 0
        os.chmod(base, 0o755)
        if IS_ROOT:
            for p in (base, directory, directory / FILE_NAME):
                os.chown(p, owner, owner)
            os.chown(tmp_path, owner, owner)  # the child's scratch cache
        os.chmod(directory, 0o500)
        before = (directory / FILE_NAME).read_bytes()
        # (tuning's first-run process is not what this test is about; as uid 65534 it could
        # not even start this venv's Python)
        env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT),
               "HOME": str(tmp_path), "TRITON_CACHE_DIR": str(tmp_path / "triton"),
               "OPSELECT_TUNE_ISOLATE": "0"}
        out = subprocess.run([sys.executable, "-c", READ_ONLY_CHILD, str(directory),
                              str(tmp_path / "scratch"), str(owner)],
                             env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        result = json.loads(out.stdout.split("RESULT", 1)[1])
        assert result["uid"] == (owner if IS_ROOT else os.getuid())
        assert result["source"] == "cache", result
        assert len(result["warnings"]) == 1 and "read-only" in result["warnings"][0]
        assert sorted(p.name for p in directory.iterdir()) == [FILE_NAME]
        assert (directory / FILE_NAME).read_bytes() == before
    finally:
        os.chmod(base / "cache", 0o700)
        import shutil

        shutil.rmtree(base)


# -- a process holding the lock ---------------------------------------------------------------------
HOLDER = textwrap.dedent("""
    import sqlite3, sys
    con = sqlite3.connect(sys.argv[1], isolation_level=None)
    con.execute("BEGIN " + sys.argv[2])
    con.execute("CREATE TABLE IF NOT EXISTS held (x)")  # a write: the lock is a writer's
    print("held", flush=True)
    sys.stdin.readline()  # until the test says so (or ends, closing stdin)
    con.execute("ROLLBACK")
""")

CALLER = textwrap.dedent("""
    import json, sys, time, warnings
    import torch
    import opselect
    from opselect import ops
    from opselect.dispatch import device_info, get_op
    from opselect.errors import BackendError
    from opselect.tune_cache import store
    warnings.simplefilter("always")

    def report(**what):
        print("REPORT", json.dumps(what), flush=True)

    device = sys.argv[1]
    with warnings.catch_warnings(record=True) as caught:
        x = torch.randn(4, 256, device=device)
        if device == "cuda":  # compile every kernel first (a forced call never asks the cache):
            for backend in get_op("topk").backends:  # the bound is the cache's, not the JIT's
                try:
                    ops.topk(x, 8, backend=backend.name)
                except BackendError:
                    pass
            torch.cuda.synchronize()
        start = time.perf_counter()
        got = ops.topk(x, 8)  # a plain call on a key the cache does not hold
        call_s = time.perf_counter() - start
        want = torch.topk(x, 8)
        right = torch.equal(got.values, want.values) and torch.equal(got.indices, want.indices)
        held_source = opselect.explain("isin", torch.arange(3000, device=device) % 37,
                                       torch.tensor([1, 5, 7, 36], device=device),
                                       show=False).source
        start = time.perf_counter()
        store().put_timings("isin", device_info(x.device), ("queued",),
                            {"torch": (1e-3, {}, "h")})
        put_s = time.perf_counter() - start
        report(call_s=call_s, right=right, put_s=put_s, queued=store().db.pending(),
               held_source=held_source, opened=store().db.readable,
               warnings=[str(w.message) for w in caught])
    sys.stdin.readline()  # the lock is released now
    source = opselect.explain("isin", torch.arange(300, device=device) % 37,
                              torch.tensor([1, 5, 7, 36], device=device), show=False).source
    report(source=source)
    sys.stdin.readline()  # exit: the queued write is flushed at exit
""")


def _read_line(proc: subprocess.Popen, timeout: float, err: Path) -> str:
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if sel.select(timeout=deadline - time.monotonic()):
                line = proc.stdout.readline()
                if not line:
                    break
                if line.startswith(("REPORT", "held")):
                    return line
    proc.kill()
    raise AssertionError(f"no answer from the child; its stderr:\n{err.read_text()[-3000:]}")


def _tell(proc: subprocess.Popen) -> None:
    proc.stdin.write("\n")
    proc.stdin.flush()


@pytest.mark.slow  # (make test-all; see the Makefile)
@pytest.mark.parametrize("journal, lock", [("wal", "IMMEDIATE"), ("wal", "EXCLUSIVE"),
                                           ("delete", "EXCLUSIVE")])
def test_a_call_returns_while_another_process_holds_the_lock(isolated_cache, tmp_path,
                                                             call_device, fake_measure,
                                                             journal, lock):
    """A writer holds the lock for seconds (HOLD_S, and until the test is done with the caller);
    the caller's plain call on a new key returns the right answer within CALL_BOUND_S, its write
    is queued and written at exit, and a key read after the lock is gone comes from the cache.
    With a rollback journal an EXCLUSIVE lock blocks even readers: the call uses the model."""
    for n in (300, 3000):  # two keys in the cache: one read under the lock, one after
        with tuning():
            ops.isin(*isin_inputs(n, call_device))
    reset()
    db = isolated_cache / FILE_NAME
    if journal != "wal":
        con = sqlite3.connect(db)
        assert con.execute("PRAGMA journal_mode = DELETE").fetchone() == ("delete",)
        con.close()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OPSELECT_CACHE_DIR": str(isolated_cache)}
    if call_device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    err = tmp_path / "stderr.txt"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(db), lock], env=env, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err.open("w"))
    caller = None
    try:
        assert _read_line(holder, 60, err).strip() == "held"
        held_at = time.monotonic()
        caller = subprocess.Popen([sys.executable, "-c", CALLER, call_device], env=env, text=True,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=err.open("w"))
        first = json.loads(_read_line(caller, 300, err).split(" ", 1)[1])
        assert holder.poll() is None  # still holding
        assert first["right"] and first["opened"]
        assert first["call_s"] < CALL_BOUND_S and first["put_s"] < CALL_BOUND_S
        assert first["queued"] == 1
        # a write that meets the lock is queued without a warning (nothing is lost)
        expected = [] if journal == "wal" else ["cannot read"]
        assert [m.split(f"{db} now")[0].split(": ")[-1].strip() for m in first["warnings"]] \
            == expected, first["warnings"]
        assert first["held_source"] == ("cache" if journal == "wal" else "model")
        time.sleep(max(0.0, HOLD_S - (time.monotonic() - held_at)))
        assert holder.poll() is None
        _tell(holder)
        assert holder.wait(timeout=60) == 0
        _tell(caller)
        assert json.loads(_read_line(caller, 120, err).split(" ", 1)[1])["source"] == "cache"
        _tell(caller)
        assert caller.wait(timeout=120) == 0, err.read_text()[-3000:]
    finally:
        for proc in (holder, caller):
            if proc is not None and proc.poll() is None:
                proc.kill()
    info = device_info(torch.device(call_device))
    assert TuneStore(isolated_cache).get_timings("isin", info, ("queued",), {"torch": "h"})


# -- many writers -----------------------------------------------------------------------------------
WRITERS, WRITES = 8, 200


def _writer(directory: str, p: int, queued) -> None:
    """One of the writers (a forked process): WRITES timings into the shared key's record and
    WRITES into its own, one write at a time, then what is queued at exit."""
    os.environ["OPSELECT_CACHE_DIR"] = directory
    reset()
    info = device_info(torch.device("cpu"))
    st = store()
    warnings.simplefilter("error", CacheWarning)  # a queued write is no reason to warn
    for i in range(WRITES):
        st.put_timings("isin", info, ("shared",), {f"w{p}-{i}": (1e-3 + i, {"B": i}, "h")})
        st.put_timings("isin", info, ("own", p), {f"b{i}": (1e-3, {}, "h")})
        if st.db.pending():
            with queued.get_lock():
                queued.value += 1
    textdb.flush_all_at_exit()  # what atexit runs (a forked child leaves by os._exit)
    os._exit(0 if st.db.pending() == 0 else 3)


@pytest.mark.slow  # (make test-all; see the Makefile)
def test_many_writers_lose_nothing(isolated_cache):
    """WRITERS processes x 2 * WRITES merges into one shared record and their own, while another
    connection takes the write lock now and then (so some writes meet it and are queued)."""
    st = store()
    st.put_timings("isin", device_info(torch.device("cpu")), ("shared",), {"x": (1, {}, "h")})
    reset()
    ctx = multiprocessing.get_context("fork")
    queued = ctx.Value("i", 0)
    procs = [ctx.Process(target=_writer, args=(str(isolated_cache), p, queued))
             for p in range(WRITERS)]
    for proc in procs:
        proc.start()
    done = threading.Event()

    def take_the_lock_now_and_then():
        con = sqlite3.connect(isolated_cache / FILE_NAME, isolation_level=None, timeout=30)
        while not done.is_set():
            con.execute("BEGIN IMMEDIATE")
            time.sleep(0.2)
            con.execute("COMMIT")
            time.sleep(0.3)
        con.close()

    blocker = threading.Thread(target=take_the_lock_now_and_then)
    blocker.start()
    try:
        for proc in procs:
            proc.join(timeout=600)
    finally:
        done.set()
        blocker.join()
    assert [proc.exitcode for proc in procs] == [0] * WRITERS
    assert queued.value > 0  # some writes met the lock: the queue was used, and written later
    reset()
    info = device_info(torch.device("cpu"))
    names = {f"w{p}-{i}" for p in range(WRITERS) for i in range(WRITES)} | {"x"}
    shared = store().get_timings("isin", info, ("shared",), dict.fromkeys(names, "h"))
    assert set(shared) == names
    for p in range(WRITERS):
        own = store().get_timings("isin", info, ("own", p),
                                  {f"b{i}": "h" for i in range(WRITES)})
        assert len(own) == WRITES, p


# -- command line: hostile import files, writes that did not happen ---------------------------------
def one_line_error(capsys, argv: list[str], code: int) -> str:
    assert main(argv) == code
    out = capsys.readouterr()
    lines = [line for line in (out.out + out.err).splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in out.err, lines
    return lines[0]


def test_import_of_deeply_nested_json_is_a_clear_error(tmp_path, capsys):
    path = tmp_path / "deep.json"
    path.write_text('{"opselect_export": 1, "entries": [{"key": "tune|x", "record": '
                    + "[" * 100_000 + "]" * 100_000 + "}]}")
    line = one_line_error(capsys, ["import", str(path)], 2)
    assert str(path) in line and "100003 levels" in line and "limit of 32" in line


@pytest.mark.parametrize("content, expected", [
    (None, "No such file or directory"),
    ('{"opselect_export": 1, "entries": [{"key": ', "malformed JSON at line 1 column 44"),
    ('[1, 2]', "expected an object"),
    ('{"opselect_export": 2, "entries": []}', "not an opselect export file"),
    ('{"opselect_export": 1, "entries": [], "x": 1}', "unknown field 'x'"),
    (b'{"opselect_export": 1, "entries": ["\xff"]}', "not UTF-8"),
])
def test_import_of_a_bad_file_is_one_line_and_exit_2(tmp_path, capsys, content, expected):
    path = tmp_path / "bad.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    line = one_line_error(capsys, ["import", str(path)], 2)
    assert str(path) in line and expected in line


def test_import_bounds_size_and_entries(tmp_path, capsys, monkeypatch):
    huge = tmp_path / "huge.json"
    with open(huge, "wb") as f:  # sparse: costs no disk
        f.truncate(transfer.MAX_IMPORT_BYTES + 1)
    assert "past the import limit of 256 MiB" in one_line_error(capsys, ["import", str(huge)], 2)
    many = tmp_path / "many.json"
    many.write_text(json.dumps({"opselect_export": 1, "entries": [{}] * 11}))
    monkeypatch.setattr(transfer, "MAX_ENTRIES", 10)
    assert "more than 10 entries" in one_line_error(capsys, ["import", str(many)], 2)


def _export_with(tmp_path: Path, n: int) -> Path:
    """An export file of n valid tune records (made the way `export` writes them)."""
    from opselect.tune_cache.fingerprint import current
    from opselect.tune_cache.records import Timing, TuneRecord

    fp = current(device_info(torch.device("cpu")))
    timing = {"torch": Timing(seconds=1e-3, source_hash="h"),
              "search": Timing(seconds=5e-4, config={"BLOCK": 256}, source_hash="h")}
    ops_ = ("isin", "topk")
    entries = []
    for i in range(n):
        rec = TuneRecord(op=ops_[i % 2], key=repr((i,)), fingerprint=fp, timings=timing)
        entries.append({"key": tune_key(rec.op, fp.device, rec.key),
                        "record": json.loads(rec.model_dump_json())})
    path = tmp_path / f"export-{n}.json"
    path.write_text(json.dumps({"opselect_export": 1, "entries": entries}))
    return path


def test_import_show_and_export_of_many_records(tmp_path, capsys):
    path = _export_with(tmp_path, 3000)
    assert main(["import", str(path)]) == 0
    assert "imported 3000 entries" in capsys.readouterr().out
    assert main(["show", "--limit", "5"]) == 0
    out = capsys.readouterr().out
    assert "5 of 3000 tune record(s) shown (--limit 0 shows all)" in out
    assert main(["show", "--op", "topk", "--limit", "0"]) == 0
    out = capsys.readouterr().out
    assert "1500 tune record(s) of topk" in out and "isin" not in out.split("tune cache")[1]
    assert sum(line.startswith("topk\t") for line in out.splitlines()) == 1500  # streamed
    again = tmp_path / "again.json"
    assert main(["export", str(again)]) == 0
    assert "exported 3000 entries" in capsys.readouterr().out
    assert len(json.loads(again.read_text())["entries"]) == 3000
    assert one_line_error(capsys, ["show", "--limit", "-1"], 2).endswith("got -1")


def test_import_into_a_cache_that_cannot_be_written_fails(isolated_cache, tmp_path, capsys,
                                                          monkeypatch):
    path = _export_with(tmp_path, 6)
    isolated_cache.mkdir()
    os.chmod(isolated_cache, 0o777)  # refused: the cache is not used
    with pytest.warns(CacheWarning, match="not using"):
        line = one_line_error(capsys, ["import", str(path)], 1)
    assert "nothing was imported" in line and "imported 6" not in line
    os.chmod(isolated_cache, 0o700)
    reset()
    # locked by another process for longer than the command line waits
    monkeypatch.setattr(textdb, "CLI_WAIT_S", 0.3)
    plant(isolated_cache, [])
    lock = sqlite3.connect(isolated_cache / FILE_NAME, isolation_level=None)
    lock.execute("BEGIN IMMEDIATE")
    try:
        assert main(["import", str(path)]) == 1
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    out = capsys.readouterr()
    assert "waiting up to" in out.err and "stayed locked" in out.err
    assert "nothing was imported" in out.err and "imported 6" not in out.out
    assert main(["import", str(path)]) == 0 and "imported 6" in capsys.readouterr().out


def test_export_to_a_path_that_cannot_be_written_fails(tmp_path, capsys):
    for target, code in ((tmp_path / "missing-dir" / "x.json", 1), (tmp_path, 2)):
        line = one_line_error(capsys, ["export", str(target)], code)  # (a directory: a usage error)
        assert str(target) in line
    assert not [p for p in tmp_path.iterdir() if p.is_file()]  # no stray temporary file


def test_clear_with_stdin_closed_deletes_nothing(capsys, monkeypatch, cpu_triton, fake_measure):
    with tuning():
        ops.isin(*isin_inputs())
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    assert main(["clear"]) == 1
    out = capsys.readouterr()
    assert "nothing deleted" in out.out and "Traceback" not in out.err
    assert store().count_records() == 1


def _depth(value) -> int:
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    return 0


@pytest.mark.slow
def test_depth_scan_agrees_with_the_parser():
    """The scan that bounds an import's nesting, on JSON whose strings hold brackets, quotes and
    backslashes (escaped every way json.dumps does), against the depth of the parsed value."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    tricky = st.text(alphabet='[]{}"\\/ab\n\u00e9\u4e2d', max_size=12)
    values = st.recursive(st.none() | st.booleans() | st.integers() | tricky,
                          lambda inner: st.lists(inner, max_size=4)
                          | st.dictionaries(tricky, inner, max_size=4), max_leaves=40)

    @settings(max_examples=400, deadline=None)
    @given(values, st.booleans())
    def check(value, ascii_only):
        text = json.dumps(value, ensure_ascii=ascii_only)
        assert transfer.json_depth(text.encode()) == _depth(value), text

    check()
    assert transfer.json_depth(b'["\\\\", ["\\"]"]]') == 2
    assert transfer.json_depth(b"[[[ unterminated") == 3  # malformed: no less deep than a parser
    assert transfer.json_depth(b'["[[[[ unterminated') == 1


def test_ctrl_c_during_a_statement_is_not_taken_for_a_wait():
    """SIGINT while a cache statement runs: sqlite3 swallows the KeyboardInterrupt raised in the
    progress handler and reports the statement as interrupted. _run must not retry that as a
    wait (warm would run on to the end, exit 0): it reaches the caller as KeyboardInterrupt."""
    import os
    import signal
    import threading
    import time

    from opselect.tune_cache import store

    db = store().db
    count = ("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 300000000) "
             "SELECT count(*) FROM c")
    # Python's own handler, as a program has it: a test worker may have been started with SIGINT
    # ignored (a CI run failed so once, in a pytest-xdist worker), and an ignored SIGINT is no
    # Ctrl-C to hold.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    assert db._acquire(time.monotonic() + 10)  # (opens the file)
    timer = threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            db._run(lambda con: con.execute(count).fetchone(), time.monotonic() + 3, "count")
    finally:
        timer.cancel()
        db._db_lock.release()
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    assert time.monotonic() - started < 2  # not retried until the deadline


def test_a_programs_own_ctrl_c_handler_is_called_once_and_restored():
    """A program that handles SIGINT itself (and goes on) gets the signal once, the statement
    the signal stopped runs again to its end, and the program's handler is in place after."""
    import os
    import signal
    import threading
    import time

    from opselect.tune_cache import store

    seen = []

    def programs_handler(signum, frame):
        seen.append(signum)

    db = store().db
    count = ("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 3000000) "
             "SELECT count(*) FROM c")
    before = signal.signal(signal.SIGINT, programs_handler)
    assert db._acquire(time.monotonic() + 10)
    timer = threading.Timer(0.05, lambda: os.kill(os.getpid(), signal.SIGINT))
    try:
        timer.start()
        runs = []

        def work(con):
            runs.append(time.monotonic())
            return con.execute(count).fetchone()

        result = db._run(work, time.monotonic() + 60, "count")
        timer.join()
        assert result == (3000000,)
        assert seen == [signal.SIGINT]
        assert len(runs) == 2  # stopped by the signal (it takes longer than 0.05 s), then again
        assert signal.getsignal(signal.SIGINT) is programs_handler
    finally:
        timer.cancel()
        db._db_lock.release()
        signal.signal(signal.SIGINT, before)
