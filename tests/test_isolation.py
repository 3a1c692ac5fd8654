"""Tuning survives a candidate that crashes the process: its first run happens in a separate
process (opselect/dispatch/isolation.py), which dies instead of the user's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

import opselect
from opselect.cli import main
from opselect.dispatch import get_op, isolation

import isolation_ops  # noqa: F401  - registers the misbehaving op


@pytest.fixture(autouse=True)
def _fresh_helper():
    yield
    isolation.shutdown()


@pytest.mark.slow
def test_a_crashing_candidate_is_ranked_last_and_the_process_lives():
    op = get_op(isolation_ops.NAME)
    x = torch.randn(5, 3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with opselect.tuning():
            y = op(x)
    assert torch.equal(y, x * 2)
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    aborted = [m for m in messages if "/aborts" in m]
    raised = [m for m in messages if "/raises" in m]
    assert len(aborted) == 1 and "SIGABRT" in aborted[0], messages
    assert len(raised) == 1 and "always fails" in raised[0], messages
    decision = opselect.explain(isolation_ops.NAME, x, show=False)
    # torch, doubles and fussy's first config all double x in about the same time: which wins
    # is the machine's noise (fussy won once on a loaded CI host). Neither failing one may.
    assert decision.choice in ("torch", "doubles", "fussy")
    assert decision.candidate("raises").measured_s == float("inf")
    assert decision.candidate("aborts").measured_s == float("inf")
    # the next key reuses the helper process, which was started again after the crash
    with opselect.tuning():
        assert torch.equal(op(torch.ones(2)), torch.full((2,), 2.0))


@pytest.mark.slow
def test_warm_of_a_crashing_candidate_exits_normally(capsys):
    assert main(["warm", "--op", isolation_ops.NAME, "--shapes", "6"]) == 0
    out = capsys.readouterr()
    assert isolation_ops.NAME in out.out and "Traceback" not in out.err


@pytest.mark.slow
def test_every_config_gets_pristine_inputs_sent_once():
    """A call's configs share one copy of its inputs in the helper (sent once), yet each runs on
    fresh tensors, and a candidate flooding fd 1 does not corrupt or block the replies."""
    op = get_op(isolation_ops.NAME)
    call = op.prepare(torch.arange(4096.0))
    fussy = op.backend("fussy")
    runs = [("fussy", cfg) for cfg in fussy.configs(call)] + [("doubles", {})]
    assert isolation.first_runs(op, runs, call) == {}
    assert torch.equal(call.x, torch.arange(4096.0))  # the user's tensor was never touched
    # a later call's inputs replace the held ones
    other = op.prepare(torch.arange(7.0))
    assert isolation.first_runs(op, [("fussy", {"scribble": False})], other) == {}
    assert isolation.first_runs(op, [("aborts", {}), ("fussy", {"scribble": False})], other) \
        == {0: "crashed: killed by SIGABRT"}


def test_a_helper_that_stops_reading_does_not_block_the_caller(monkeypatch):
    """A helper stuck before reading (a hung driver call) with a request larger than the pipe
    holds: the write is given up after the timeout, the candidate is reported, nothing hangs."""
    import subprocess
    import sys

    monkeypatch.setattr(isolation, "TIMEOUT_S", 1.0)
    # it says it is ready (with the op), then never reads a request
    ready = ("import json, struct, sys, time; "
             f"d = json.dumps({{'ready': True, 'ops': [{isolation_ops.NAME!r}], 'blobs': []}})"
             ".encode(); sys.stdout.buffer.write(struct.pack('<Q', len(d)) + d); "
             "sys.stdout.flush(); time.sleep(60)")
    monkeypatch.setattr(isolation._Child, "_start", lambda self, modules: subprocess.Popen(
        [sys.executable, "-c", ready], stdin=subprocess.PIPE, stdout=subprocess.PIPE))
    op = get_op(isolation_ops.NAME)
    call = op.prepare(torch.zeros(1 << 20))  # 4 MB: far more than a pipe buffers
    assert isolation.first_runs(op, [("doubles", {})], call) == \
        {0: "timeout: it took no request within 1 s"}


def test_ctrl_c_right_after_the_watchdog_starts_leaves_no_timer_to_wait_for(monkeypatch):
    """A KeyboardInterrupt landing as the write's watchdog has just started: the watchdog is
    cancelled, and it is a daemon anyway, so the interpreter's exit never waits on it (a live
    300 s timer once held `opselect warm` past its Ctrl-C)."""
    import threading

    op = get_op(isolation_ops.NAME)
    call = op.prepare(torch.ones(3))
    assert isolation.first_runs(op, [("doubles", {})], call) == {}  # the helper is up
    started = []
    real_start = threading.Timer.start

    def start_then_interrupted(timer):
        real_start(timer)
        started.append(timer)
        raise KeyboardInterrupt

    monkeypatch.setattr(threading.Timer, "start", start_then_interrupted)
    with pytest.raises(KeyboardInterrupt):
        isolation.first_runs(op, [("doubles", {})], op.prepare(torch.ones(4)))
    monkeypatch.undo()
    (watchdog,) = started
    watchdog.join(5)
    assert watchdog.daemon and not watchdog.is_alive()


def test_isolation_off_runs_in_process(monkeypatch):
    """OPSELECT_TUNE_ISOLATE=0: nothing is sent to a helper process."""
    monkeypatch.setattr(isolation, "ENABLED", False)
    op = get_op(isolation_ops.NAME)
    assert isolation.first_runs(op, [("raises", {})], op.prepare(torch.ones(3))) == {}


def test_tensors_travel_as_they_are():
    """A strided view reaches the helper with its values (only the span it covers is sent)."""
    base = torch.arange(60.0).reshape(6, 10)
    view = base[1:5:2, ::3].t()
    enc = isolation._Encoder()
    spec = enc.encode(view)
    back = isolation._decode(spec, enc.blobs)
    assert torch.equal(back, view) and back.stride() == view.stride()
    assert len(enc.blobs[0]) < base.numel() * base.element_size()
    expanded = torch.tensor([1.0, 2.0]).expand(3, 2)
    enc = isolation._Encoder()
    assert torch.equal(isolation._decode(enc.encode(expanded), enc.blobs), expanded)


IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
OTHER_UID = 65534  # nobody


def _give_to_another_user(path: Path) -> None:
    """As root, make a planted tree another user's, as an attacker would have left it."""
    if IS_ROOT:
        for root, dirs, files in os.walk(path):
            for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
                os.chown(name, OTHER_UID, OTHER_UID)


@pytest.mark.slow
def test_a_package_planted_in_the_working_directory_never_runs(tmp_path, monkeypatch):
    """Another user plants opselect/, torch/, sitecustomize.py ... in a directory; a program that
    tunes is run from there (as root, where the test runs as root): nothing planted runs, and
    the first runs still happen in the helper."""
    planted = tmp_path / "their-directory"
    marker = tmp_path / "planted-code-ran"
    code = f"open({str(marker)!r}, 'a').write('ran as uid %d\\n' % __import__('os').getuid())\n"
    for package in ("opselect", "torch", "numpy", "triton", "json"):
        (planted / package).mkdir(parents=True)
        (planted / package / "__init__.py").write_text(code)
    for module in ("sitecustomize", "usercustomize", "struct", "isolation_ops"):
        (planted / f"{module}.py").write_text(code)
    _give_to_another_user(planted)
    monkeypatch.chdir(planted)
    monkeypatch.setenv("PYTHONPATH", str(planted))
    monkeypatch.setenv("PYTHONSTARTUP", str(planted / "sitecustomize.py"))
    isolation.shutdown()
    op = get_op(isolation_ops.NAME)
    call = op.prepare(torch.arange(8.0))
    assert isolation.first_runs(op, [("doubles", {}), ("raises", {})], call) == \
        {1: "error: RuntimeError: this backend always fails"}
    assert not marker.exists(), marker.read_text()


@pytest.mark.slow
def test_the_helper_runs_isolated_in_a_private_directory(tmp_path, monkeypatch):
    report = tmp_path / "report.json"
    monkeypatch.setenv("OPSELECT_TEST_REPORT", str(report))
    monkeypatch.setenv("SOME_SECRET_TOKEN", "not for the helper")
    monkeypatch.chdir(tmp_path)
    isolation.shutdown()
    op = get_op(isolation_ops.NAME)
    assert isolation.first_runs(op, [("reports", {})], op.prepare(torch.ones(3))) == {}
    seen = json.loads(report.read_text())
    assert seen["isolated"] == 1
    assert "SOME_SECRET_TOKEN" not in seen["env"] and "PYTHONPATH" not in seen["env"]
    assert "OPSELECT_TEST_REPORT" in seen["env"]  # opselect's own switches travel
    assert Path(seen["cwd"]).name.startswith("opselect-helper-")
    assert os.stat(seen["cwd"]).st_mode & 0o777 == 0o700
    assert str(tmp_path) not in seen["path"] and "" not in seen["path"]
    isolation.shutdown()
    assert not os.path.exists(seen["cwd"])  # removed with the helper


@pytest.mark.slow
def test_a_request_names_an_op_never_a_module(monkeypatch):
    """The helper imports the modules it was started with; a request for an op it does not have
    is refused there (and such an op's first runs happen in the caller's process)."""
    isolation.shutdown()
    op = get_op(isolation_ops.NAME)
    call = op.prepare(torch.ones(3))
    assert isolation.first_runs(op, [("doubles", {})], call) == {}
    request = {"module": "os", "op": "no_such_op", "backend": "torch", "config": {}, "args": [],
               "kwargs": {}}
    status, detail = isolation._child.run(request, [], -1)
    assert status == "unavailable" and "does not have the op 'no_such_op'" in detail


@pytest.mark.slow  # (make test-all: make test stays under its 5 minutes on 2 cores)
def test_the_helper_leaves_no_file_open(tmp_path):
    """Starting, using and stopping the helper under -X dev (ResourceWarning shown): nothing
    unclosed."""
    script = textwrap.dedent(f"""
        import os, warnings
        os.environ.setdefault("TRITON_INTERPRET", "1")
        import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})
        import torch, isolation_ops
        from opselect.dispatch import get_op, isolation
        op = get_op(isolation_ops.NAME)
        assert isolation.first_runs(op, [("aborts", {{}}), ("doubles", {{}})],
                                    op.prepare(torch.ones(3))) == {{0: "crashed: killed by SIGABRT"}}
        isolation.shutdown()
        """)
    result = subprocess.run([sys.executable, "-X", "dev", "-W", "always::ResourceWarning", "-c",
                             script], capture_output=True, text=True, timeout=600,
                            env={**os.environ, "OPSELECT_CACHE_DIR": str(tmp_path / "cache")})
    assert result.returncode == 0, result.stderr
    assert "ResourceWarning" not in result.stderr, result.stderr
