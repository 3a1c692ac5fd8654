"""An op: its backends, and the selection chain that picks one per call.

    forced backend? -> in-process memo -> tune cache -> cost model   (+ measuring, in tuning mode)

The memo hit is the hot path of every call: prepare the call (torch's argument rules), build its key
(a plain tuple), one dict lookup, launch. Everything else (the cache on disk, pydantic, the cost
model, measuring) happens once per key and process.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Sequence

import torch

from ..errors import BackendError, CacheWarning
from . import tuning_mode as _tuning
from .backend import Backend
# (Call, Choice, the margins and the registry are imported from here by the kernels and tests)
from .choices import (MEASURED_TORCH_MARGIN, TORCH_MARGIN, Call, Choice,  # noqa: F401
                      choose, fresh_decisions)
from .decision import GRAPH, Candidate, Decision
from .device import DeviceInfo
from .measuring import Measuring, _times_the_run_alone  # noqa: F401
from .registry import all_ops, get_op, register  # noqa: F401

AUTO = ("auto", None)
#: The device model's functions, model_for(info) and defaults_for(info), which
#: heuristics/device_model.py hands over when it is imported (opselect's __init__ imports it):
#: dispatch sits below the heuristics and never imports them.
_device_models: dict[str, Callable[[DeviceInfo], Any]] = {}


def use_device_models(model_for: Callable[[DeviceInfo], Any],
                      defaults_for: Callable[[DeviceInfo], Any]) -> None:
    _device_models.update(model_for=model_for, defaults_for=defaults_for)
#: Cold choices are kept per exact call; past this many the memo starts again.
COLD_MEMO_MAX = 1 << 16
#: Routes (Op.routes) kept per op; past this many they start again.
ROUTES_MAX = 4096


class Op(Measuring):
    """`prepare(*args, **kwargs) -> Call` applies torch's argument rules; `sample(shapes, dtype,
    options, device) -> (args, kwargs)` makes realistic inputs from a warm spec entry."""

    def __init__(self, name: str, prepare: Callable[..., Call], backends: Sequence[Backend],
                 sample: Callable[..., tuple[tuple, dict]] | None = None,
                 calibration: Sequence[tuple[list, Any, dict]] = (),
                 timed: Callable[[Call, Callable[[], Any]], Callable[[], Any]] | None = None,
                 replay: Callable[[Call], tuple[tuple, dict]] | None = None):
        self.name = name
        self.prepare = prepare
        self.sample = sample
        #: (args, kwargs) of the public function that prepare() turns into this call: tuning
        #: first runs unseen candidates on them in a separate process (dispatch/isolation.py)
        self.replay = replay
        #: the public function that answers this op's calls (ops.py sets it; dispatch sits
        #: below ops): tuning's stage 2 times each candidate through it (_pinned_public)
        self.public: Callable[..., Any] | None = None
        #: what tuning times for a call, given the function that runs one backend on it (an op
        #: under autograd times its backward too, since that is what the user's step pays)
        self.timed = timed
        #: (shapes, dtype, options) for sample(): the shapes `opselect calibrate` fits on
        self.calibration = list(calibration)
        self.backends: tuple[Backend, ...] = tuple(backends)
        if not self.backends or self.backends[0].name != "torch":
            raise ValueError(f"op {name!r}: the first backend must be 'torch' (the safe fallback)")
        self._by_name = {b.name: b for b in self.backends}
        self._torch = self.backends[0]
        #: Decided calls by the public function's plain arguments (ops.py builds the key:
        #: shapes, strides, dtypes, device, the scalar arguments) -> (prepared call, settled,
        #: backend name, regime). The prepared call is the chosen backend's bind() of the call,
        #: a function of its tensors, or None where the choice is torch's own op (ops.py calls
        #: it directly); settled is False for the cost model's choices, decided again in tuning
        #: mode. regime is None, or, where the choice under a CUDA graph differs, (that choice's
        #: prepared call or None, the call's DeviceInfo): fronts/_base.in_regime picks per call.
        #: ops.py (and routing.py) answer a call found here before preparing it: a repeat call
        #: is its key, one lookup and the launch. Derived from the two memos below and emptied
        #: by any change to them.
        self.routes: dict[tuple, tuple[Callable[..., Any] | None, bool, str, tuple | None]]
        #: settled choices (measured, cached, the only candidate, agreed across ranks) per key
        self._memo: dict[tuple, Choice]
        #: the cost model's (provisional) choices, per exact call (Call.exact)
        self._cold: dict[tuple, Choice]
        self.decisions = fresh_decisions()
        self._forced: dict[tuple, Choice] = {}
        #: (backend name, plain key) -> prepared call of a forced backend (None: torch's op)
        self.forced_routes: dict[tuple, Callable[..., Any] | None] = {}

    @property
    def decisions(self) -> tuple[dict, dict, dict]:
        """(routes, settled memo, cold memo): what this process has decided. Setting it swaps in
        another set (fresh_decisions()) in three attribute stores: tuning's stage 2 and
        bench_random time the public function under decisions of their own."""
        return self.routes, self._memo, self._cold

    @decisions.setter
    def decisions(self, sets: tuple[dict, dict, dict]) -> None:
        self.routes, self._memo, self._cold = sets

    # -- the call -------------------------------------------------------------------------------
    def __call__(self, *args: Any, backend: str | None = None, **kwargs: Any) -> Any:
        return self.run(self.prepare(*args, **kwargs), backend)

    def run(self, call: Call, backend: str | None = None, route: tuple | None = None) -> Any:
        """Dispatch a prepared call. The public functions in ops.py call prepare() themselves and
        then this, which saves repacking their keyword arguments on every call. `route`: the
        key of the public function's plain arguments, under which the choice is remembered with
        its prepared call (Op.routes, or forced_routes for a forced backend), so that later
        calls of that key skip preparing and dispatching."""
        if backend is None or backend == "auto":
            choice = self._memo.get(call.key)
            if choice is None:
                choice = self._cold.get(call.exact)
                if choice is None or _tuning.state.active:
                    choice = self._select(call)
            table, entry = self.routes, (not choice.provisional, choice.backend.name)
        else:
            choice = self._forced.get((backend, call.key)) or self._force(call, backend)
            table, entry, route = self.forced_routes, None, None if route is None else \
                (backend, route)
        if route is not None:
            routed = self._route(call, choice)
            if routed is not False:
                prepared, regime = routed
                if len(table) >= ROUTES_MAX:
                    table.clear()
                table[route] = prepared if entry is None else (prepared, *entry, regime)
                if regime is not None and _tuning.capturing(regime[1]):
                    prepared = regime[0]
                if prepared is not None:
                    return prepared(*call.inputs())
        if choice.graph is not None and _tuning.capturing(call.info):
            choice = choice.graph
        info = call.info
        if info.type == "cuda" and info.index != torch.cuda.current_device():
            # Triton launches on the current device, not the tensors': switch for this call.
            with torch.cuda.device(info.index):
                return choice.backend.run(call, choice.config)
        return choice.backend.run(call, choice.config)

    def _route(self, call: Call, choice: Choice) -> tuple | bool:
        """What a route of this call holds: (prepared, regime), prepared None for torch's own
        op or the chosen backend's prepared call; regime None, or where the choice under a CUDA
        graph differs (graph's prepared call or None, the call's DeviceInfo), which the public
        function asks about only for such routes (an eager call chosen torch for its host time
        stays one lookup from torch's op); False when the call cannot be prepared (no route)."""
        eager = self._prepared(call, choice)
        if eager is False:
            return False
        if choice.graph is None:
            return eager, None
        graph = self._prepared(call, choice.graph)
        if graph is False:
            return False
        return eager, (graph, call.info)

    def _prepared(self, call: Call, choice: Choice) -> Callable[..., Any] | None | bool:
        if choice.backend is self._torch:
            return None
        if call.empty:
            return False
        prepared = choice.backend.bind(call, choice.config)
        return False if prepared is None else prepared

    def chosen(self, call: Call, backend: str | None = None) -> Choice | None:
        """The choice a run of this call used, or would use from the memo (None: not decided
        yet in this process)."""
        if backend is None or backend == "auto":
            return self._memo.get(call.key) or self._cold.get(call.exact)
        return self._forced.get((backend, call.key))

    @property
    def backend_names(self) -> tuple[str, ...]:
        return tuple(self._by_name)

    def backend(self, name: str) -> Backend:
        try:
            return self._by_name[name]
        except KeyError:
            raise BackendError(
                f"{self.name}: unknown backend {name!r}; valid names: "
                f"{', '.join(['auto', *self._by_name])}") from None

    # -- selection ------------------------------------------------------------------------------
    def _force(self, call: Call, name: str) -> Choice:
        chosen = self.backend(name)
        if call.empty:
            reason = chosen.device_reason(call.info)
            if reason is None:
                # Any backend answers an empty call (Backend.run: call.empty_result()).
                return Choice(chosen, {}, "forced")
        else:
            reason = chosen.device_reason(call.info) or chosen.supports(call)
        if reason is not None:
            able = [c.name for c in self.plan(call) if c.supported]
            raise BackendError(
                f"{self.name}: backend {name!r} cannot take this call ({call.describe()}): {reason}. "
                f"Backends that can: {', '.join(able)}")
        choice = Choice(chosen, dict(chosen.configs(call)[0]), "forced")
        self._forced[(name, call.key)] = choice
        return choice

    def _select(self, call: Call) -> Choice:
        decision = self.decide(call)
        choice = self._remember(call, Choice.of(self, decision))
        from .. import observe  # (imports the dispatch package: not at module level)

        observe.decided(self, call, decision)
        return choice

    def plan(self, call: Call, model: Any = None, *, check_device: bool = True) -> list[Candidate]:
        """Every backend's verdict and the cost model's estimate for this call. With
        check_device=False the device is not asked (a what-if on a device one does not have)."""
        if model is None:
            model = _device_models["model_for"](call.info)
        candidates = []
        for b in self.backends:
            reason = b.device_reason(call.info) if check_device else None
            if reason is None:
                reason = b.supports(call)
            cand = Candidate(b.name, reason)
            if reason is None:
                est = b.cost(call, model)
                cand.predicted_s, cand.parts, cand.notes = est.seconds, est.parts, est.notes
            candidates.append(cand)
        return candidates

    def decide(self, call: Call, *, tune: bool | None = None) -> Decision:
        """Run the chain below the memo for this call: supports, cache, model, and (in tuning mode,
        or with tune=True) measuring whatever the cache lacks. Returns the whole record."""
        tune = (_tuning.state.active if tune is None else tune) and not _tuning.state.frozen
        if call.empty:
            candidates = [Candidate(b.name, None) for b in self.backends]
            return self._decision(call, candidates, candidates[0], "empty call", {})
        if tune and _tuning.capturing(call.info):
            # A CUDA graph is being captured: nothing may be measured (no syncs, no allocations
            # outside the graph's pool); the cache or the model decides, provisionally.
            tune = False
        candidates = self.plan(call)
        able = [c for c in candidates if c.supported]
        if len(able) == 1:
            only = able[0]
            return self._decision(call, candidates, only, "only candidate",
                                  dict(self._by_name[only.name].configs(call)[0]))

        from ..tune_cache import store

        cache = store()
        measured = cache.get_timings(self.name, call.info, call.key[1:],
                                     {c.name: self._by_name[c.name].source_hash for c in able})
        for c in able:
            if c.name in measured:
                seconds, config, host, device = measured[c.name]
                # A record's config is data from a file, another rank or a server: only one the
                # backend itself offers for this call is ever run (a planted one could ask a
                # kernel for any block size); another is measured again.
                if config in (dict(cfg) for cfg in self._by_name[c.name].configs(call)):
                    c.measured_s, c.config = seconds, config
                    c.measured_host_s, c.measured_device_s = host, device
                else:
                    _warn_foreign_config(self.name, c.name, config)
        missing = [c for c in able if c.measured_s is None]
        tuned = False
        if tune and missing:
            # Stage 1: the best configuration of each backend not measured yet.
            fresh = self._measure([self._by_name[c.name] for c in missing], call)
            for c in missing:
                c.measured_s, c.config = fresh[c.name]
            # Stage 2: every candidate (the model's choice and torch among them) with its best
            # configuration, timed against the others as the program will run them; the
            # choice follows these times, so a winner replaces the current choice only if it
            # wins here too. The cached ones are timed again: times taken in another process
            # (other clocks, other neighbours) do not compare with these.
            settled = self._settle(able, call)
            cache.put_timings(self.name, call.info, call.key[1:], {
                c.name: (_tuning.steady(settled[c.name]), c.config,
                         self._by_name[c.name].source_hash, *settled[c.name]) for c in able})
            for c in able:
                c.measured_host_s, c.measured_device_s = settled[c.name]
                c.measured_s = _tuning.steady(settled[c.name])
            tuned = True

        all_measured = all(c.measured_s is not None for c in able)
        margin = MEASURED_TORCH_MARGIN if all_measured else TORCH_MARGIN
        best = choose(able, Candidate.time, margin)
        # Under a CUDA graph only device time counts: a backend that loses an eager call on its
        # host time may win it there (the graph replays its kernels, not its Python).
        in_graph = choose(able, lambda c: c.time(GRAPH), margin, eager=False)
        if tuned:
            source = "tuning"
        elif all_measured:
            source = "cache"
        elif any(c.measured_s is not None for c in able):
            source = "cache+model"
        else:
            source = "model"
        decision = self._decision(call, candidates, best, source, self._config_of(best, call))
        if in_graph is not best:
            decision.graph_choice = in_graph.name
            decision.graph_config = self._config_of(in_graph, call)
        return decision

    def _config_of(self, c: Candidate, call: Call) -> dict[str, Any]:
        return dict(c.config) if c.config is not None else dict(
            self._by_name[c.name].configs(call)[0])

    def _decision(self, call: Call, candidates: list[Candidate], best: Candidate, source: str,
                  config: dict[str, Any]) -> Decision:
        return Decision(self.name, call.describe(), call.key, candidates, best.name, dict(config),
                        source)

    # -- explain --------------------------------------------------------------------------------
    def explain(self, *args: Any, backend: str | None = None, **kwargs: Any) -> Decision:
        call = self.prepare(*args, **kwargs)
        if backend not in AUTO:
            chosen = self._force(call, backend)
            decision = self.decide(call, tune=False)
            decision.choice, decision.config, decision.source = chosen.backend.name, chosen.config, "forced"
            return decision
        memo = self._memo.get(call.key) or self._cold.get(call.exact)
        decision = self.decide(call)
        if memo is not None and not (memo.provisional and _tuning.state.active):
            decision.choice, decision.config = memo.backend.name, memo.config
            decision.source, decision.detail = "memo", f"decided earlier by {memo.source}"
        else:
            self._remember(call, Choice.of(self, decision))
        return decision

    def _remember(self, call: Call, choice: Choice) -> Choice:
        if choice.provisional:
            if len(self._cold) >= COLD_MEMO_MAX:
                # A program of ever new shapes (a dynamic sequence length): the model decides
                # again (tens of microseconds), the memory stays bounded.
                self._cold.clear()
            self._cold[call.exact] = choice
        else:
            self._memo[call.key] = choice
            self._cold.pop(call.exact, None)
        return choice

    def what_if(self, call: Call, info: DeviceInfo) -> Decision:
        """The cost model's decision for this call on another device (its default constants):
        the same `choose` the dispatcher uses, no device asked, no cache read. `call` is usually
        prepared from meta tensors (shapes and dtypes only)."""
        call.info = info  # plans read the SM count, the L2 size ... of the device asked about
        candidates = self.plan(call, _device_models["defaults_for"](info), check_device=False)
        able = [c for c in candidates if c.supported]
        best = choose(able, lambda c: c.predicted_s)
        config = dict(self._by_name[best.name].configs(call)[0])
        return Decision(self.name, call.describe().replace("meta", info.name), call.key,
                        candidates, best.name, config,
                        f"the cost model for an {info.name} (default constants)")

    def forget(self) -> None:
        """Drop this process's memo (the tune cache on disk is untouched). Emptying the memos
        empties the routes derived from them (_Choices)."""
        self._memo.clear()
        self._cold.clear()
        self._forced.clear()
        self.forced_routes.clear()


_foreign_configs_told: set[tuple[str, str]] = set()


def _warn_foreign_config(op: str, backend: str, config: dict[str, Any]) -> None:
    if (op, backend) in _foreign_configs_told:
        return
    _foreign_configs_told.add((op, backend))
    text = repr(config)
    warnings.warn(f"opselect: ignoring a tune record's config of {op}/{backend} that the backend "
                  f"does not offer for the call ({text[:200]}{'...' if len(text) > 200 else ''});"
                  f" it is measured again when tuning", CacheWarning, stacklevel=4)
