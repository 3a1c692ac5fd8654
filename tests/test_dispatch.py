"""The selection chain: forced -> memo -> tune cache -> cost model, and tuning mode."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import opselect
from conftest import fake_timing
from opselect import ops
from opselect.dispatch import bucket, get_op, tuning
from opselect.dispatch import tuning_mode as tuning_mod
from opselect.dispatch.op import TORCH_MARGIN
from opselect.dispatch.signature import bucket_range
from opselect.errors import BackendError
from opselect.tune_cache import store


@pytest.fixture
def isin_op():
    return get_op("isin")


@pytest.fixture
def fake_times(monkeypatch):
    """Replace measuring with a table of made-up times per backend (and count the calls)."""
    table = {"torch": 5e-3, "compare": 4e-3, "search": 1e-3, "hash": 2e-3, "cuckoo": 2.2e-3,
             "bitmap": 3e-3}
    seen = []

    def fake_seconds(what):
        name = what.split("/")[1].split()[0]
        seen.append(name)
        return table[name]

    fake_timing(monkeypatch, fake_seconds)
    return table, seen


def inputs(m=500, n=40):
    gen = torch.Generator().manual_seed(m * 1000 + n)
    return (torch.randint(0, 100, (m,), generator=gen), torch.randint(0, 100, (n,), generator=gen))


def test_buckets():
    assert [bucket(n) for n in (0, 1, 17, 64)] == [0, 1, 17, 64]  # exact when small
    assert bucket(65) == 128 and bucket(1000) == 1024 and bucket(65536) == 65536
    assert bucket(65537) == 81920 and bucket(100_000) == 114_688  # quarter octaves above 2**16
    prev = 0
    for n in sorted(list(range(0, 3000)) + [2**k + d for k in range(12, 40) for d in (-1, 0, 1, 12345)]):
        b = bucket(n)
        assert b >= n and b >= prev, n  # covers n, never decreases
        lo, hi = bucket_range(n)
        assert lo <= n <= hi == b
        prev = b


def test_model_then_memo(cpu_triton, isin_op, monkeypatch):
    a, b = inputs()
    d = opselect.explain("isin", a, b, show=False)
    assert d.source == "model"
    assert all(c.predicted_s > 0 for c in d.candidates if c.supported)
    # The fastest predicted backend, unless torch is within the dispatcher's margin of it.
    fastest = min((c for c in d.candidates if c.supported), key=lambda c: c.predicted_s)
    torch_s = d.candidate("torch").predicted_s
    assert d.choice == ("torch" if fastest.predicted_s > TORCH_MARGIN * torch_s else fastest.name)
    # The second call hits the memo: nothing below it runs.
    with monkeypatch.context() as m:  # (monkeypatch.undo() would also undo the private cache dir)
        m.setattr(isin_op, "decide", lambda *a, **k: pytest.fail("memo missed"))
        assert torch.equal(ops.isin(a, b), torch.isin(a, b))
    assert opselect.explain("isin", a, b, show=False).source == "memo"


def test_tuning_measures_records_and_reuses(cpu_triton, isin_op, fake_times):
    table, seen = fake_times
    a, b = inputs()
    with tuning():
        assert torch.equal(ops.isin(a, b), torch.isin(a, b))
    assert set(seen) == set(table)  # every candidate measured (each config of each)
    d = opselect.explain("isin", a, b, show=False)
    assert d.choice == "search" and d.detail == "decided earlier by tuning"
    # A fresh process (here: a forgotten memo) reads the cache and measures nothing.
    opselect.forget()
    seen.clear()
    d = opselect.explain("isin", a, b, show=False)
    assert (d.source, d.choice, seen) == ("cache", "search", [])
    assert d.candidate("hash").measured_s == table["hash"]
    # Another shape in the same bucket shares the decision; another bucket does not.
    assert opselect.explain("isin", *inputs(501, 40), show=False).source == "memo"
    assert opselect.explain("isin", *inputs(5000, 40), show=False).source == "model"


def test_env_switch_turns_tuning_on(monkeypatch):
    monkeypatch.setenv("OPSELECT_TUNE", "1")
    assert tuning_mod._State().active
    monkeypatch.setenv("OPSELECT_TUNE", "0")
    assert not tuning_mod._State().active
    with tuning():
        assert tuning_mod.state.active
        with tuning(False):
            assert not tuning_mod.state.active
        assert tuning_mod.state.active


def test_provisional_choice_is_redecided_in_tuning_mode(cpu_triton, fake_times):
    table, seen = fake_times
    a, b = inputs()
    ops.isin(a, b)  # the model decides: provisional
    assert not seen
    with tuning():
        ops.isin(a, b)
    assert seen  # measured once tuning was on
    n = len(seen)
    with tuning():
        ops.isin(a, b)  # now decided by measurement: not again
    assert len(seen) == n


def test_changed_kernel_remeasures_only_that_backend(cpu_triton, isin_op, fake_times, monkeypatch):
    table, seen = fake_times
    a, b = inputs()
    with tuning():
        ops.isin(a, b)
    opselect.forget()
    seen.clear()
    hash_backend = isin_op.backend("hash")
    monkeypatch.setitem(hash_backend.__dict__, "_source_hash", "edited-kernel")
    in_turns = []

    def settle(items, device, **kw):
        names = [what.split("/")[1].split()[0] for what, _fn in items]
        in_turns.extend(names)
        return [(table[n],) * 2 for n in names]

    monkeypatch.setattr(tuning_mod, "time_interleaved", settle)
    with tuning():
        ops.isin(a, b)
    assert set(seen) == {"hash"}  # only its configurations are searched again ...
    assert sorted(in_turns) == sorted(table)  # ... then it is timed in turns with every other


def test_cache_and_model_mixed(cpu_triton, isin_op, fake_times, monkeypatch):
    """A backend added after tuning has no timing: the model's estimate stands in for it."""
    a, b = inputs()
    with tuning():
        ops.isin(a, b)
    opselect.forget()
    monkeypatch.setitem(isin_op.backend("bitmap").__dict__, "_source_hash", "new")
    d = opselect.explain("isin", a, b, show=False)
    assert d.source == "cache+model" and d.candidate("bitmap").measured_s is None


@pytest.mark.slow
def test_failing_backend_is_reported_and_never_chosen(cpu_triton, isin_op, monkeypatch):
    hash_backend = isin_op.backend("hash")

    def broken(*args):
        raise RuntimeError("simulated launch failure")

    # (the launch fails whichever way it is reached: run(), or the prepared call that tuning
    # times and a route calls)
    monkeypatch.setattr(hash_backend, "run", broken)
    monkeypatch.setattr(hash_backend, "bind", lambda call, config: broken)
    monkeypatch.setattr(tuning_mod, "measure", lambda fn, device, **kw: (fn(), 1e-3)[1])
    a, b = inputs()
    with pytest.warns(RuntimeWarning, match="measuring isin/hash .* failed"):
        with tuning():
            ops.isin(a, b)
    d = opselect.explain("isin", a, b, show=False)
    assert d.choice != "hash" and math.isinf(d.candidate("hash").measured_s)
    opselect.forget()  # the failure is recorded in the cache too
    assert math.isinf(opselect.explain("isin", a, b, show=False).candidate("hash").measured_s)


def test_forced_backend_skips_selection(cpu_triton, isin_op, monkeypatch):
    a, b = inputs()
    monkeypatch.setattr(isin_op, "decide", lambda *a, **k: pytest.fail("forced must not select"))
    for name in ("torch", "compare", "search", "hash", "bitmap"):
        assert torch.equal(ops.isin(a, b, backend=name), torch.isin(a, b))
    assert not isin_op._memo


def test_explain_forced_and_printing(cpu_triton, capsys):
    a, b = inputs()
    d = opselect.explain("isin", a, b, backend="search")
    assert d.source == "forced" and d.choice == "search"
    out = capsys.readouterr().out
    for word in ("backend", "supports", "model", "measured", "search", "forced"):
        assert word in out
    text = str(d)
    assert "choice: search" in text and "from forced" in text
    with pytest.raises(BackendError, match="unknown op 'nope'; known ops: .*isin"):
        opselect.explain("nope", a, b)


def test_hot_path_touches_no_disk(cpu_triton, monkeypatch):
    """After the first call, neither the cache nor the cost model is consulted."""
    a, b = inputs()
    ops.isin(a, b)
    st = store()
    monkeypatch.setattr(st, "get_timings", lambda *a, **k: pytest.fail("cache read on hot path"))
    import opselect.heuristics.device_model as dm

    monkeypatch.setattr(dm, "model_for", lambda *a, **k: pytest.fail("model on hot path"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            ops.isin(a, b)



def test_close_contenders_are_measured_twice(monkeypatch):
    """A second look at every candidate within 1.5x of the fastest, keeping the better median: a
    measurement spoiled by a clock change (here: b's first, 3x too slow) does not decide."""
    results = {"a": [1.0, 1.2], "b": [3.0, 0.9], "c": [1.4, 1.3], "d": [9.0], "bad": [math.inf]}
    asked = []

    def fake(fn, device, what, **kw):
        asked.append(what)
        return results[what].pop(0)

    monkeypatch.setattr(tuning_mod, "measure_safely", fake)
    items = [(name, None) for name in ("a", "b", "c", "d", "bad")]
    assert tuning_mod.measure_all(items, torch.device("cpu")) == [1.0, 3.0, 1.3, 9.0, math.inf]
    assert asked == ["a", "b", "c", "d", "bad", "a", "c"]
    results.update(a=[1.0, 1.1], b=[1.45, 0.9])
    asked.clear()
    assert tuning_mod.measure_all(items[:2], torch.device("cpu")) == [1.0, 0.9]


def test_a_host_only_win_over_torch_must_be_clear():
    """A candidate slower than torch on the device that wins the eager time by its host time
    alone is chosen only past HOST_WIN_MARGIN (host times on a shared machine are the noisy
    ones); one that is as fast or faster on the device keeps the usual margin."""
    from opselect.dispatch.choices import HOST_WIN_MARGIN, MEASURED_TORCH_MARGIN, choose
    from opselect.dispatch.decision import Candidate

    def measured(name, host, device):
        return Candidate(name, None, measured_s=max(host, device), measured_host_s=host,
                         measured_device_s=device)

    # cuBLAS 25 us on the device behind 48 us of host; the kernel 40 us of device: an 18% host win.
    torch_ = measured("torch", 48e-6, 25e-6)
    kernel = measured("tiled", 33e-6, 40e-6)
    assert kernel.measured_s < MEASURED_TORCH_MARGIN * torch_.measured_s
    assert choose([torch_, kernel], Candidate.time, MEASURED_TORCH_MARGIN) is torch_
    # The same kernel far ahead on the host (past the margin) is taken.
    slow_host = measured("torch", 60e-6, 25e-6)
    assert kernel.measured_s < HOST_WIN_MARGIN * slow_host.measured_s
    assert choose([slow_host, kernel], Candidate.time, MEASURED_TORCH_MARGIN) is kernel
    # Ahead on the device too: the usual margin (a 10% win is taken).
    device_win = measured("splitk", 33e-6, 43e-6)
    torch_close = measured("torch", 48e-6, 45e-6)
    assert choose([torch_close, device_win], Candidate.time, MEASURED_TORCH_MARGIN) is device_win


def test_a_modelled_host_win_over_a_launch_bound_torch_must_be_clear():
    """Where torch's modelled eager time is its host time, a Triton candidate ahead by the
    model's host terms alone (fitted back to back; in a program a Triton call's host time grows
    more than torch's) is chosen only past HOST_WIN_MARGIN, and only in the eager regime; a
    device-bound torch keeps the usual margin."""
    from opselect.dispatch.choices import HOST_WIN_MARGIN, TORCH_MARGIN, choose
    from opselect.dispatch.decision import GRAPH, Candidate

    def modelled(name, host, device):
        return Candidate(name, None, predicted_s=max(host, device),
                         parts={"launch": host, "memory": device})

    # The tiny transposed copy of the H200's model: 13.5 us against torch's 14.7, both launch-bound.
    torch_ = modelled("torch", 14.7e-6, 0.007e-6)
    tiled = modelled("tiled", 13.5e-6, 0.004e-6)
    assert tiled.predicted_s < TORCH_MARGIN * torch_.predicted_s  # the old rule took tiled
    assert choose([torch_, tiled], Candidate.time) is torch_
    assert choose([torch_, tiled], lambda c: c.predicted_s) is torch_
    # Under a CUDA graph only device time counts: the rule is the eager regime's.
    assert choose([torch_, tiled], lambda c: c.time(GRAPH), eager=False) is tiled
    # A clear host win (torch's several launches against one) is taken.
    many_launches = modelled("torch", 40e-6, 3e-6)
    assert tiled.predicted_s < HOST_WIN_MARGIN * many_launches.predicted_s
    assert choose([many_launches, tiled], Candidate.time) is tiled
    # torch device-bound: a device win under the usual margin is taken.
    big_torch = modelled("torch", 14.7e-6, 16e-6)
    vectorized = modelled("vectorized", 13.5e-6, 7.2e-6)
    assert choose([big_torch, vectorized], Candidate.time) is vectorized
    # A measured torch: the measured rules decide, not this one.
    measured_torch = Candidate("torch", None, measured_s=14.7e-6, measured_host_s=14.7e-6,
                               measured_device_s=0.01e-6)
    assert choose([measured_torch, tiled], Candidate.time) is tiled


def test_the_h200_model_leaves_a_tiny_transposed_copy_to_torch():
    """The call a transformer layer makes (the heads' merge of a small batch): on the H200's
    model the Triton backends win it by host terms alone, which a program does not see (see
    HOST_WIN_MARGIN); torch is the eager choice."""
    from opselect.heuristics.device_model import what_if
    from opselect.kernels.permute import OP

    decision = what_if(OP, [[2, 4, 16, 8]], torch.float32, {"dims": [0, 2, 1, 3]}, "H200")
    assert decision.choice == "torch"
