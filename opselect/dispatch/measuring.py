"""Tuning's measurements of an Op's candidates: stage 1 (every configuration of the backends the
cache lacks, each first run in the isolation helper) and stage 2 (every candidate in turns with
the others, through the public function where the op can replay its call). A mixin of Op."""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from . import isolation as _isolation
from . import tuning_mode as _tuning
from .backend import Backend
from .choices import Call, Choice, choose, fresh_decisions
from .decision import Candidate
from .registry import all_ops


#: A time with L2 flushed this many times the back-to-back one is measured a second time.
FLUSHED_SECOND_LOOK = 1.25


def _times_the_run_alone(fn: Callable[[], Any]) -> bool:
    """Whether _timed_run's function times the backend's run and nothing else (an op's `timed`
    hands it back unchanged when the call needs no backward)."""
    return getattr(fn, "runs_alone", False)


def _prepared_or_none(backend: Backend, cfg: dict, call: Call) -> tuple | None:
    """(the prepared call, its tensors) of backend/cfg for this call, or None where the backend
    prepares none (bind gives None) or the op's calls name no tensors (a plug-in's Call may
    leave inputs() out)."""
    try:
        inputs = call.inputs()
    except NotImplementedError:
        return None
    fast = backend.bind(call, cfg)
    return None if fast is None else (fast, inputs)


def _device_of(call: Call) -> Any:
    info = call.info
    return torch.device(info.type, info.index) if info.index is not None else torch.device(info.type)


class Measuring:
    """Op's measuring methods (Op holds the backends, the decisions and the public function)."""

    def _measure(self, backends: list[Backend], call: Call) -> dict[str, tuple[float, dict]]:
        """Time every configuration of these backends on this call (tuning_mode.measure_all);
        return each backend's best (seconds, config)."""
        device = _device_of(call)
        runs = []
        for backend in backends:
            for cfg in backend.configs(call):
                runs.append((backend, dict(cfg), self._timed_run(backend, cfg, call)))
        # A candidate's first run on this machine happens in a separate process, so that one
        # that crashes (a segfault is no exception) is ranked last instead of ending the
        # user's process. torch's own op is not a candidate for that.
        crashed = _isolation.first_runs(
            self, [(b.name, cfg) for b, cfg, _ in runs if b.name != "torch"], call, all_ops())
        if crashed:
            others = [r for r in runs if r[0].name != "torch"]
            for i, why in crashed.items():
                b, cfg, _ = others[i]
                _isolation.warn_failed(f"{self.name}/{b.name} {cfg}", why)
            bad = {id(others[i]) for i in crashed}
            runs = [r for r in runs if id(r) not in bad]
        times = _tuning.measure_all(
            [(f"{self.name}/{b.name} {cfg}", fn) for b, cfg, fn in runs], device)
        best: dict[str, tuple[float, dict]] = {
            b.name: (math.inf, dict(b.configs(call)[0])) for b in backends}
        for (backend, cfg, _), t in zip(runs, times):
            if t < best[backend.name][0]:
                best[backend.name] = (t, cfg)
        return best

    def _timed_run(self, backend: Backend, cfg: dict, call: Call) -> Callable[[], Any]:
        """What measuring times for one backend and config: its prepared call (Backend.bind,
        made on the first timed call: after the isolation helper's first run), else its run;
        under autograd the backward too (self.timed).

        Not run() where a prepared call exists: run() plans and binds its launches on every
        call, and do_bench counts that host time on calls of 20-50 us (H200, isin 1e6 in 1,024
        int32: hash's run 44-46 us a config, its prepared call 22; bitmap's 98-104 against 33),
        which ranked configurations, and once backends, by the host."""
        prepared: list = []

        def fn() -> Any:
            if not prepared:
                prepared.append(_prepared_or_none(backend, cfg, call))
            if prepared[0] is None:
                return backend.run(call, cfg)
            fast, inputs = prepared[0]
            return fast(*inputs)

        fn.runs_alone = True  # type: ignore[attr-defined]  (see _times_the_run_alone)
        return fn if self.timed is None else self.timed(call, fn)

    def _settle(self, able: list[Candidate], call: Call) -> dict[str, tuple[float, float]]:
        """Stage 2 of measuring (tuning_mode.time_interleaved): (host, device) seconds per call
        of each candidate's configuration in turns with the others; inf for one that failed
        before. The cold model's choice is timed with its first configuration too, and a
        candidate keeps whichever of its configurations won the steady-state eager time (its
        `config` is set to it).

        Each candidate is timed through the public function with the op's decisions pinned to
        it (_pinned_public), where the op can replay its call: a choice of torch's op is then
        answered by the torch route, a Triton backend by the memo, the prepared call and the
        launch, as the program will pay them. Timing the backends' run() alone left out that
        difference (H200, bench_random medians: 2-3 us on topk and softmax calls, 9 on
        permute's), so on calls of 20 us a Triton backend that won by 3% then lost by 15%.

        On a GPU (tuning_mode.flushed_floor), a candidate's device time is the larger of its
        time here (back to back: what one call leaves in L2 the next one reads) and do_bench's
        time of the same function (L2 flushed before each run). Which of the two a program sees
        depends on what ran before the call, which a library cannot know; a choice made on the
        larger one holds in both. (H200, matmul 1000 x 3000 @ 3000 x 777 fp16, operands that
        fit in L2: splitk won back to back, and was chosen, but took 79 us flushed against
        cuBLAS's 60.) Not stage 1's times: those time a backend's run(), which binds its
        launches on every call, and on calls of 20-50 us do_bench then counts that host time
        too (isin 1e6 in 1,024 int32: hash's run 44 us, its prepared call 22)."""
        items, entries = [], []
        public = self._public_replay(call)
        cold = choose(able, lambda c: c.predicted_s)  # the choice tuning must not make worse
        saved = self.decisions
        try:
            for c in able:
                if c.measured_s is not None and math.isinf(c.measured_s):
                    continue  # failed in stage 1 (or when it was recorded): never chosen
                backend = self._by_name[c.name]
                configs = [dict(c.config or {})]
                if c is cold:
                    # The cold choice runs the backend's first configuration; stage 1's winner
                    # by device time replaces it only if it also wins here (H200: a strided
                    # softmax's tuned config ran 5% slower back to back than its first one).
                    first = dict(backend.configs(call)[0])
                    if first not in configs:
                        configs.append(first)
                for cfg in configs:
                    fn = self._timed_run(backend, cfg, call)
                    if public is not None and _times_the_run_alone(fn):
                        fn = self._pinned_public(backend, cfg, call, *public)
                    items.append((f"{self.name}/{c.name} {cfg}", fn))
                    entries.append((c, cfg))
            device = _device_of(call)
            times = _tuning.time_interleaved(items, device)
            if _tuning.flushed_floor(device):
                for i, (what, fn) in enumerate(items):
                    host, back_to_back = times[i]
                    if not math.isfinite(back_to_back):
                        continue
                    flushed = _tuning.measure_safely(fn, device, what)
                    if flushed > FLUSHED_SECOND_LOOK * back_to_back:
                        # A disturbance only adds time, and one measurement decides here: a
                        # second look keeps a disturbed one from it (H200: cuBLAS's 10.8 us
                        # batched product once measured 52.5 and lost to a 13.7 us kernel).
                        flushed = min(flushed, _tuning.measure_safely(fn, device, what))
                    times[i] = (host, max(back_to_back, flushed))
        finally:
            self.decisions = saved
        best: dict[str, tuple[float, float]] = {c.name: (math.inf, math.inf) for c in able}
        for (c, cfg), t in zip(entries, times):
            if _tuning.steady(t) < _tuning.steady(best[c.name]):
                best[c.name] = t
                c.config = cfg
        return best

    def _public_replay(self, call: Call) -> tuple[Callable[..., Any], tuple, dict] | None:
        """(public function, args, kwargs) that answer this call as the program does; None
        where the op cannot rebuild it (no public function or replay, or a replay whose key
        differs: a pinned choice would miss, and the public call decide afresh)."""
        if self.public is None or self.replay is None:
            return None
        try:
            args, kwargs = self.replay(call)
            same = self.prepare(*args, **kwargs).key == call.key
        except Exception:  # noqa: BLE001 - a call replay cannot rebuild is timed as before
            return None
        return (self.public, args, kwargs) if same else None

    def _pinned_public(self, backend: Backend, cfg: dict, call: Call,
                       public: Callable[..., Any], args: tuple,
                       kwargs: dict) -> Callable[[], Any]:
        """The public function on this call with the op's decisions pinned to backend/cfg (a
        settled choice in a fresh set of decisions, put in place before each call). Only for a
        run timed alone: an op under autograd times its backward too, which the public
        function does not run. _settle restores the op's own decisions afterwards."""
        decisions = fresh_decisions()
        decisions[1][call.key] = Choice(backend, dict(cfg), "tuning")

        def run_as_the_program_would() -> Any:
            self.decisions = decisions
            return public(*args, **kwargs)

        run_as_the_program_would.decisions = decisions  # type: ignore[attr-defined]
        return run_as_the_program_would
