"""The on-disk tune cache: persistence across processes, and every way it can be broken."""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

import opselect
from opselect import ops
from opselect.dispatch import device_info, get_op, tuning, tuning_mode
from opselect.errors import CacheWarning
from opselect.tune_cache import reset, store
from opselect.tune_cache.storage import tune_key
from opselect.tune_cache.textdb import FILE_NAME

ROOT = Path(__file__).resolve().parent.parent


def small():
    return torch.arange(300) % 37, torch.tensor([1, 5, 7, 36])


def key_of(a, b):
    return get_op("isin").prepare(a, b).key


def tuned_cache(fake_measure_unused=None):
    a, b = small()
    with tuning():
        ops.isin(a, b)
    return a, b


def _record_key(a, b):
    k = key_of(a, b)
    return tune_key("isin", device_info(k[0]).cache_key, repr(k[1:]))


def _db_file() -> Path:
    return Path(os.environ["OPSELECT_CACHE_DIR"]) / FILE_NAME


def _raw_get(key: str):
    con = sqlite3.connect(_db_file())
    try:
        return con.execute("SELECT value FROM entries WHERE key = ?", (key,)).fetchone()[0]
    finally:
        con.close()


def _raw_set(value, key: str | None = None) -> None:
    """Overwrite the stored value of key (of every row when None), as another program could."""
    con = sqlite3.connect(_db_file())
    try:
        with con:
            if key is None:
                con.execute("UPDATE entries SET value = ?", (value,))
            else:
                assert con.execute("UPDATE entries SET value = ? WHERE key = ?",
                                   (value, key)).rowcount == 1
    finally:
        con.close()


# ------------------------------------------------------------------------------------------------
@pytest.mark.slow  # (make test-all; see the Makefile)
def test_two_processes_share_the_cache(isolated_cache):
    """Process 1 tunes a shape; process 2 decides it from the cache without measuring."""
    script = textwrap.dedent("""
        import os, sys, torch
        import opselect
        from opselect import ops
        a, b = torch.arange(300) % 37, torch.tensor([1, 5, 7, 36])
        if sys.argv[1] == "tune":
            with opselect.tuning():
                ops.isin(a, b)
        d = opselect.explain("isin", a, b, show=False)
        print("RESULT", d.source, d.choice)
    """)
    env = {**os.environ, "OPSELECT_CACHE_DIR": str(isolated_cache), "TRITON_INTERPRET": "1",
           "PYTHONPATH": str(ROOT)}
    first = subprocess.run([sys.executable, "-c", script, "tune"], env=env, capture_output=True,
                           text=True, timeout=600)
    assert first.returncode == 0, first.stderr
    second = subprocess.run([sys.executable, "-c", script, "read"], env=env, capture_output=True,
                            text=True, timeout=600)
    assert second.returncode == 0, second.stderr
    chosen_first = first.stdout.split("RESULT")[1].split()
    chosen_second = second.stdout.split("RESULT")[1].split()
    assert chosen_first[0] == "memo" and chosen_second[0] == "cache"
    assert chosen_first[1] == chosen_second[1]


@pytest.mark.slow
def test_corrupt_cache_file_warns_once_and_falls_back(isolated_cache, cpu_triton, fake_measure):
    isolated_cache.mkdir(parents=True, exist_ok=True)
    (isolated_cache / FILE_NAME).write_bytes(b"this is not a sqlite database" * 100)
    reset()
    a, b = small()
    with pytest.warns(CacheWarning, match="tune.sqlite3 cannot be opened") as record:
        with tuning():
            got = ops.isin(a, b)
        got2 = ops.isin(*small()[::-1])
    assert torch.equal(got, torch.isin(a, b)) and got2.dtype == torch.bool
    assert sum(issubclass(w.category, CacheWarning) for w in record) == 1
    # The measurements were kept in memory for this process.
    opselect.forget()
    assert opselect.explain("isin", a, b, show=False).source == "cache"


@pytest.mark.slow
def test_invalid_record_is_ignored_and_remeasured(cpu_triton, fake_measure):
    a, b = tuned_cache()
    key = _record_key(a, b)
    reset()
    _raw_set('{"schema_version": 1, "op": "isin", "timings": "not a dict"}', key)
    opselect.forget()
    with pytest.warns(CacheWarning, match="invalid"):
        d = opselect.explain("isin", a, b, show=False)
    assert d.source == "model"
    _raw_set(b"\x00\x01 binary garbage", key)  # a BLOB: rejected before it is decoded
    opselect.forget()
    reset()
    with pytest.warns(CacheWarning, match="a BLOB of 17 bytes, not a JSON text record"):
        with tuning():
            assert torch.equal(ops.isin(a, b), torch.isin(a, b))
    opselect.forget()
    assert opselect.explain("isin", a, b, show=False).source == "cache"  # re-measured, rewritten


def test_timings_measured_another_way_are_measured_again(cpu_triton, fake_measure):
    """Each timing says how it was measured; timings taken another way (older records: device
    time only, no method) are not compared with today's: the call is measured again."""
    a, b = tuned_cache()
    key = _record_key(a, b)
    reset()
    record = json.loads(_raw_get(key))
    assert {t["method"] for t in record["timings"].values()} == {tuning_mode.METHOD}
    for timing in record["timings"].values():
        del timing["method"]
    _raw_set(json.dumps(record), key)
    opselect.forget()
    assert opselect.explain("isin", a, b, show=False).source == "model"
    with tuning():
        ops.isin(a, b)
    opselect.forget()
    assert opselect.explain("isin", a, b, show=False).source == "cache"
    assert json.loads(_raw_get(key))["timings"]["torch"]["method"] == tuning_mode.METHOD


def test_stale_fingerprint_is_ignored(cpu_triton, fake_measure):
    a, b = tuned_cache()
    key = _record_key(a, b)
    reset()
    record = json.loads(_raw_get(key))
    record["fingerprint"]["torch"] = "1.0.0"
    record["timings"]["torch"]["seconds"] = 1e-9  # would win, if it were trusted
    _raw_set(json.dumps(record), key)
    opselect.forget()
    with pytest.warns(CacheWarning, match=r"other software \(torch 1.0.0 ->"):
        d = opselect.explain("isin", a, b, show=False)
    assert d.source == "model" and d.candidate("torch").measured_s is None


@pytest.mark.slow
def test_locked_database_warns_and_falls_back(cpu_triton, fake_measure, caplog):
    caplog.set_level(logging.INFO, logger="opselect")
    a, b = tuned_cache()
    reset()
    opselect.forget()
    lock = sqlite3.connect(_db_file(), timeout=0.05, isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")
    try:
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            # SQLite's write-ahead log lets readers in while another process writes ...
            d = opselect.explain("isin", a, b, show=False)
            # ... but a new measurement cannot be written: it is kept in memory, with a warning.
            other = torch.arange(5000) % 99
            with tuning():
                got = ops.isin(other, b)
            with tuning():
                ops.isin(torch.arange(50000) % 7, b)
        assert d.source == "cache" and torch.equal(got, torch.isin(other, b))
        # a write that meets the lock is queued, logged once, and not warned about
        assert [w for w in record if issubclass(w.category, CacheWarning)] == []
        assert sum("queued in memory, written later" in r.getMessage()
                   for r in caplog.records) == 1
        opselect.forget()
        assert opselect.explain("isin", other, b, show=False).source == "cache"  # from memory
    finally:
        lock.rollback()
        lock.close()


def test_warnings_once_per_kind(cpu_triton, fake_measure):
    a, b = tuned_cache()
    reset()
    _raw_set("garbage")
    opselect.forget()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for n in (3, 300, 3000):
            opselect.explain("isin", torch.arange(n), b, show=False)
            opselect.explain("isin", a, b, show=False)
    assert sum(issubclass(w.category, CacheWarning) for w in record) == 1


def test_export_import_roundtrip(tmp_path, cpu_triton, fake_measure, monkeypatch):
    a, b = tuned_cache()
    path = tmp_path / "tuned.json"
    assert store().export(path) >= 1
    data = json.loads(path.read_text())
    assert data["opselect_export"] == 1 and data["entries"][0]["record"]["op"] == "isin"
    monkeypatch.setenv("OPSELECT_CACHE_DIR", str(tmp_path / "other"))
    opselect.forget()
    assert opselect.explain("isin", a, b, show=False).source == "model"
    data["entries"].append({"key": "tune|x|isin|()", "record": {"op": "isin"}})  # invalid
    path.write_text(json.dumps(data))
    with pytest.warns(CacheWarning, match="invalid"):
        ok, skipped = store().import_(path)
    assert (ok, skipped) == (len(data["entries"]) - 1, 1)
    opselect.forget()
    assert opselect.explain("isin", a, b, show=False).source == "cache"


@pytest.mark.slow
def test_concurrent_writers_keep_both_timings(isolated_cache):
    """Two processes measuring different backends of one key: the record keeps both."""
    script = textwrap.dedent("""
        import sys, torch
        from opselect.dispatch import device_info
        from opselect.tune_cache import store
        info = device_info(torch.device("cpu"))
        name = sys.argv[1]
        for i in range(40):
            store().put_timings("isin", info, (torch.int32, i), {name: (1e-3, {"B": 1}, "h")})
    """)
    env = {**os.environ, "OPSELECT_CACHE_DIR": str(isolated_cache), "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", script, name], env=env,
                              stderr=subprocess.PIPE, text=True) for name in ("search", "hash")]
    for p in procs:
        assert p.wait(timeout=300) == 0, p.stderr.read()
    reset()
    info = device_info(torch.device("cpu"))
    for i in range(40):
        got = store().get_timings("isin", info, (torch.int32, i), {"search": "h", "hash": "h"})
        assert set(got) == {"search", "hash"}, i


def test_clear(cpu_triton, fake_measure):
    tuned_cache()
    assert store().clear("topk") == 0
    assert store().clear("isin") >= 1
    assert list(store().records()) == []
