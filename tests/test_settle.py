"""Choices that only get better (issue 16): the measured winner must also win timed in turns with
the current choice as the program runs it (host time included), and a cold choice depends on the
call alone, not on which call of its bucket came first."""

from __future__ import annotations

import math
import time

import pytest
import torch

import opselect
from opselect import ops
from opselect.dispatch import get_op, tuning
from opselect.dispatch import tuning_mode
from opselect.dispatch.device import device_info
from opselect.dispatch.op import _times_the_run_alone
from opselect.heuristics import device_model


def test_time_interleaved_counts_host_time_and_takes_turns():
    order = []

    def quick():
        order.append("quick")

    def slow_host():  # no device work at all: only the host's time, which device events miss
        order.append("slow")
        time.sleep(0.004)

    def broken():
        order.append("broken")
        raise RuntimeError("simulated failure")

    items = [("op/quick {}", quick), ("op/slow {}", slow_host), ("op/broken {}", broken)]
    with pytest.warns(RuntimeWarning, match="measuring op/broken .* failed") as caught:
        quick_s, slow_s, broken_s = tuning_mode.time_interleaved(items, torch.device("cpu"),
                                                                rounds=3)
    assert len(caught) == 1
    # (host, device): on the CPU a call runs to its end on the host, so both are its wall clock
    assert slow_s[0] >= 0.004 and quick_s[0] < 0.001 and math.isinf(broken_s[0])
    assert slow_s[0] == slow_s[1] and math.isinf(broken_s[1])
    # A warm-up call each (on a GPU a second one sizes the blocks), then rounds in rotating turns.
    timed = order[3:]
    assert timed == ["quick", "slow", "slow", "quick", "quick", "slow"], order


def test_time_interleaved_repeats_passes_until_the_times_settle():
    """A candidate slowed while the machine settles (its first calls) must not lose to one that
    is slower once settled: passes repeat until they agree, and each candidate keeps its lowest
    median. One pass alone ranks them the wrong way round."""
    calls = {"settling": 0}

    def settling():
        calls["settling"] += 1
        time.sleep(0.006 if calls["settling"] <= 3 else 0.001)

    def steady():
        time.sleep(0.003)

    items = [("op/settling {}", settling), ("op/steady {}", steady)]
    cpu = torch.device("cpu")
    (first_s, _), (steady_s, _) = tuning_mode.time_interleaved(items, cpu, rounds=3, passes=1)
    assert first_s > steady_s  # the warm-up call and 2 of 3 rounds ran slow
    calls["settling"] = 0
    (settled_s, _), (steady_s, _) = tuning_mode.time_interleaved(items, cpu, rounds=3, passes=4)
    assert settled_s < 0.002 < 0.003 <= steady_s
    assert calls["settling"] >= 1 + 3 * 2  # the warm-up, then at least two passes


def _h200_model_on_the_cpu(monkeypatch):
    """The cold model of an H200 for the interpreter's device: on the CPU's own constants the
    model picks torch for almost every call, and these tests need choices that differ."""
    info = device_info(torch.device("cpu"))
    monkeypatch.setitem(device_model._models, info.cache_key,
                        device_model.defaults_for(device_model.known_gpu("H200")))
    return info


@pytest.mark.slow
def test_cold_choice_depends_on_the_call_not_on_the_order(cpu_triton, monkeypatch):
    """Two isin calls in one shape bucket on which the model disagrees (8318 elements against
    test sets of 400 and 510: compare, then cuckoo, on an H200's constants): each gets its own
    choice, whichever of the two comes first."""
    op = get_op("isin")
    elements = torch.arange(8318, dtype=torch.int32)
    small, large = torch.arange(400, dtype=torch.int32), torch.arange(510, dtype=torch.int32)
    assert op.prepare(elements, small).key == op.prepare(elements, large).key  # one bucket
    seen = []
    for first, second in ((small, large), (large, small)):
        opselect.forget()  # (the models too)
        _h200_model_on_the_cpu(monkeypatch)
        for test in (first, second):
            assert torch.equal(ops.isin(elements, test), torch.isin(elements, test))
        seen.append({test.numel(): op.chosen(op.prepare(elements, test)).backend.name
                     for test in (first, second)})
    assert seen[0] == seen[1] == {400: "compare", 510: "cuckoo"}


def test_a_winner_by_device_time_that_loses_in_turns_is_not_chosen(cpu_triton, monkeypatch):
    """Stage 1 (device time, faked here) ranks hash far ahead; hash's calls, though, spend 20 ms
    of host time each (as a Python launcher can on a small call): timed in turns with the
    others it loses, so the choice does not move to it, and the record holds what was seen."""
    op = get_op("isin")
    hash_backend = op.backend("hash")
    real_bind = hash_backend.bind

    def host_heavy(call, config):  # (stage 2 runs the prepared call, as the program does)
        prepared = real_bind(call, config)
        return lambda *tensors: time.sleep(0.02) or prepared(*tensors)

    monkeypatch.setattr(hash_backend, "bind", host_heavy)
    monkeypatch.setattr(tuning_mode, "measure_safely",
                        lambda fn, device, what, **kw: 1e-9 if "/hash " in what else 1e-3)
    a, b = torch.arange(300) % 37, torch.tensor([1, 5, 7, 36])
    with tuning():
        assert torch.equal(ops.isin(a, b), torch.isin(a, b))
    decision = opselect.explain("isin", a, b, show=False)
    assert decision.choice != "hash"
    assert decision.candidate("hash").measured_s >= 0.02
    opselect.forget()  # a new process reads the record: the same verdict, nothing measured
    monkeypatch.setattr(tuning_mode, "time_interleaved",
                        lambda *a, **k: pytest.fail("a recorded call was measured again"))
    again = opselect.explain("isin", a, b, show=False)
    assert again.source == "cache" and again.choice == decision.choice


def test_the_cold_choice_keeps_its_first_config_unless_the_tuned_one_wins_in_turns(
        cpu_triton, monkeypatch):
    """Stage 1 (device time, faked here) ranks a later config of the cold model's backend first,
    but that config spends 0.2 s of host time a call (20x the interpreted kernel): timed in turns against the first config
    (the one the cold choice runs) it loses, so the record keeps the first config."""
    _h200_model_on_the_cpu(monkeypatch)
    op = get_op("isin")
    a, b = torch.arange(1024, device=cpu_triton) % 100, torch.arange(8, device=cpu_triton)
    call = op.prepare(a, b)
    cold = op.decide(call, tune=False)
    assert cold.source == "model" and cold.choice != "torch", cold.choice
    backend = op.backend(cold.choice)
    configs = [dict(c) for c in backend.configs(call)]
    assert len(configs) >= 2 and cold.config == configs[0]
    slow = configs[1]
    real_bind = backend.bind

    def host_heavy(call, config):  # (stage 2 runs the prepared call, as the program does)
        prepared = real_bind(call, config)
        if dict(config) != slow:
            return prepared
        return lambda *tensors: time.sleep(0.2) or prepared(*tensors)

    monkeypatch.setattr(backend, "bind", host_heavy)
    monkeypatch.setattr(tuning_mode, "measure_safely",
                        lambda fn, device, what, **kw: 1e-9 if what.endswith(f"/{cold.choice} "
                                                                               f"{slow}") else 1e-3)
    with tuning():
        assert torch.equal(ops.isin(a, b), torch.isin(a, b))
    # (The interpreter makes torch's op the choice; what matters is the backend's config.)
    settled = opselect.explain("isin", a, b, show=False).candidate(cold.choice)
    assert settled.config == configs[0] and settled.measured_s < 0.1, settled


def test_cold_memo_stays_bounded(cpu_triton, monkeypatch):
    """A program of ever new shapes does not grow the per-call memo without end."""
    from opselect.dispatch import op as op_module

    monkeypatch.setattr(op_module, "COLD_MEMO_MAX", 2)
    op = get_op("isin")
    test = torch.tensor([1, 5])
    for m in (3, 4, 5, 6, 7):
        elements = torch.arange(m)
        assert torch.equal(ops.isin(elements, test), torch.isin(elements, test))
        assert 1 <= len(op._cold) <= 2
        assert op.chosen(op.prepare(elements, test)) is not None


@pytest.mark.slow
def test_candidates_are_timed_through_the_public_function(cpu_triton):
    """Stage 2 times each candidate as the program will run it: the public function with the
    op's decisions pinned to that candidate (torch's op answered by the torch route, a Triton
    backend by the memo and the prepared call), then leaves the op's own decisions in place."""
    op = get_op("topk")
    x = torch.randn(6, 40, device=cpu_triton)
    call = op.prepare(x, 3)
    own = (op.routes, op._memo, op._cold)
    public = op._public_replay(call)
    assert public is not None
    for name in ("torch", "radix"):
        backend = op.backend(name)
        cfg = dict(backend.configs(call)[0])
        run = op._pinned_public(backend, cfg, call, *public)
        routes, memo, _ = run.decisions
        for _ in range(2):
            got = run()
            assert torch.equal(got.values, torch.topk(x, 3).values)
        assert memo[call.key].backend is backend and memo[call.key].config == cfg
        # after its first call the choice is answered by its route: torch's op (None) or the
        # backend's prepared call
        [(prepared, settled, chosen, _)] = routes.values()
        assert settled and chosen == name and (prepared is None) == (name == "torch")
        op.routes, op._memo, op._cold = own
    # _settle times these and puts the op's own decisions back
    able = [c for c in op.decide(call).candidates if c.supported and c.name in ("torch", "radix")]
    times = op._settle(able, call)
    assert set(times) == {"torch", "radix"} and all(min(t) > 0 for t in times.values())
    assert (op.routes, op._memo, op._cold) == own
    assert all(a is b for a, b in zip((op.routes, op._memo, op._cold), own))


def test_an_op_under_autograd_times_its_backward_not_the_public_forward(cpu_triton):
    """softmax under autograd: tuning times the forward and the backward (Op.timed), which the
    public function alone does not run: no pinned public path there."""
    op = get_op("softmax")
    x = torch.randn(4, 33, device=cpu_triton, requires_grad=True)
    call = op.prepare(x, -1)
    backend = op.backend("fused")
    cfg = dict(backend.configs(call)[0])
    assert not _times_the_run_alone(op._timed_run(backend, cfg, call))
    plain = op.prepare(x.detach(), -1)
    assert _times_the_run_alone(op._timed_run(backend, cfg, plain))
    assert op._public_replay(plain) is not None


def test_a_winner_back_to_back_that_loses_with_l2_flushed_is_not_chosen(cpu_triton, monkeypatch):
    """Stage 2's back-to-back blocks leave a call's operands in L2 for the next call; stage 1
    flushes L2 before each run. A candidate's device time is the larger of the two, so one that
    only wins with its operands cached is not chosen (faked here: do_bench gives hash 10 s)."""
    monkeypatch.setattr(tuning_mode, "FLUSHED_FLOOR_ON_CPU", True)  # (a GPU's rule)
    monkeypatch.setattr(tuning_mode, "measure_safely",
                        lambda fn, device, what, **kw: 10.0 if "/hash " in what else 1e-9)
    a, b = torch.arange(300) % 37, torch.tensor([1, 5, 7, 36])
    with tuning():
        assert torch.equal(ops.isin(a, b), torch.isin(a, b))
    decision = opselect.explain("isin", a, b, show=False)
    hashed = decision.candidate("hash")
    assert decision.choice != "hash"
    assert hashed.measured_device_s >= 10.0 and hashed.measured_s >= 10.0
    others = [c for c in decision.candidates if c.measured_s is not None and c.name != "hash"]
    assert others and all(c.measured_device_s < 1.0 for c in others)


@pytest.mark.slow
def test_settle_floors_device_time_by_the_same_call_flushed(cpu_triton, monkeypatch):
    """Stage 2 times each candidate's call with L2 flushed itself (the public path it times in
    turns, not stage 1's run(), whose binding on every call do_bench would count): every
    settled device time is at least that measurement, the host time is the blocks'. Off on
    the CPU unless switched on (no L2 to flush under the interpreter)."""
    op = get_op("topk")
    x = torch.randn(6, 40, device=cpu_triton)
    call = op.prepare(x, 3)
    able = [c for c in op.decide(call).candidates if c.supported and c.name in ("torch", "radix")]
    flushed_runs = []
    monkeypatch.setattr(tuning_mode, "measure_safely",
                        lambda fn, device, what, **kw: flushed_runs.append(fn) or 7.0)
    times = op._settle(able, call)
    assert not flushed_runs and all(d < 7.0 for _, d in times.values())  # off on the CPU
    monkeypatch.setattr(tuning_mode, "FLUSHED_FLOOR_ON_CPU", True)
    times = op._settle(able, call)
    assert set(times) == {"torch", "radix"}
    assert all(device >= 7.0 and host < 7.0 for host, device in times.values())
    # what was timed flushed is the pinned public path, which decides as it was pinned; a
    # flushed time far above the back-to-back one gets a second look (here: always 7 s)
    assert len(flushed_runs) == 4 and all(hasattr(fn, "decisions") for fn in flushed_runs)
    # a disturbed first look (100 s, then 7 s) does not decide
    looks = iter([100.0, 7.0, 100.0, 7.0])
    monkeypatch.setattr(tuning_mode, "measure_safely", lambda fn, device, what, **kw: next(looks))
    times = op._settle(able, call)
    assert all(7.0 <= device < 100.0 for _, device in times.values())


def test_stage_1_times_the_prepared_call(cpu_triton, monkeypatch):
    """Stage 1 times each configuration's prepared call, made once (on the first timed call),
    not run(), which plans and binds the launches on every call: host time that do_bench counts
    on short calls and that no repeated call of the program pays."""
    op = get_op("isin")
    backend = op.backend("hash")
    made = []
    real_prepared = backend._prepared

    def counting(plan, call):
        made.append(plan)
        return real_prepared(plan, call)

    monkeypatch.setattr(backend, "_prepared", counting)
    a, b = torch.arange(300) % 37, torch.tensor([1, 5, 7, 36])
    call = op.prepare(a, b)
    configs = backend.configs(call)
    timed = []

    def three_calls(fn, device, what, **kw):  # as do_bench would: the same function, repeatedly
        if "/hash " in what:
            for _ in range(3):
                got = fn()
                assert torch.equal(got, torch.isin(a, b))
            timed.append(what)
        return 1e-3

    monkeypatch.setattr(tuning_mode, "measure_safely", three_calls)
    best = op._measure([backend], call)
    assert set(best) == {"hash"} and len(timed) >= len(configs) > 1
    assert len(made) == len(configs)  # once a configuration, not once a call
