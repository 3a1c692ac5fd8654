"""Tuning survives a candidate that crashes the process: its first run happens in a separate
process (opselect/dispatch/isolation.py), which dies instead of the user's."""

from __future__ import annotations

import warnings

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


def test_warm_of_a_crashing_candidate_exits_normally(capsys):
    assert main(["warm", "--op", isolation_ops.NAME, "--shapes", "6"]) == 0
    out = capsys.readouterr()
    assert isolation_ops.NAME in out.out and "Traceback" not in out.err


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
    monkeypatch.setattr(isolation._Child, "_start", lambda self: subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE))
    op = get_op(isolation_ops.NAME)
    call = op.prepare(torch.zeros(1 << 20))  # 4 MB: far more than a pipe buffers
    assert isolation.first_runs(op, [("doubles", {})], call) == \
        {0: "timeout: it took no request within 1 s"}


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
