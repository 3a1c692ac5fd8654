"""The contract every backend of every op follows.

A backend is one algorithm for one op: it says whether it can take a call (`supports`), which tunable
configurations it has (`configs`, the first being its own heuristic default), how long the cost model
thinks it takes (`cost`), and runs (`run`: the call's plan under a config, then the backend's
`_launch(plan, call)`). The `torch` backend of each op (the ATen op itself) takes every call, so the
dispatcher always has a safe choice.
"""

from __future__ import annotations

import hashlib
import inspect
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from .device import DeviceInfo

Config = Mapping[str, Any]


@dataclass
class Estimate:
    """The cost model's predicted time of one backend on one call, in seconds, with its parts.

    `parts` names what the time is made of (memory traffic, launches, a host sync, ...) so explain()
    can say why a backend is predicted slow; `notes` carries remarks such as "syncs with the host".
    """

    seconds: float
    parts: dict[str, float] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    @classmethod
    def of(cls, notes: tuple[str, ...] = (), **parts: float) -> "Estimate":
        return cls(sum(parts.values()), parts, notes)


class Backend:
    """Base class; subclasses set `name` and implement _launch / cost and usually plan /
    supports / configs / bind."""

    name: str = "?"
    #: Extra jit functions the backend launches that its module neither defines nor holds a
    #: Launcher of (rarely needed: see dispatch/source_hash.py for how the hash finds the code).
    kernels: tuple[Any, ...] = ()
    #: Bump to re-measure a backend whose code is unchanged (e.g. after a Triton fix).
    revision: int = 1
    #: False for backends that only call torch (they run on any device).
    uses_triton: bool = True

    # -- what subclasses implement -------------------------------------------------------------
    def supports(self, call: Any) -> str | None:
        """None when the backend can take the call, else the reason it cannot (shown to users).
        The device (Triton needs CUDA or the interpreter) is checked by the dispatcher first, via
        device_reason(), so this only judges the call's shapes, dtypes and flags."""
        return None

    def configs(self, call: Any) -> list[dict[str, Any]]:
        """Tunable configurations; the first is the backend's heuristic pick for this call."""
        return [{}]

    def run(self, call: Any, config: Config) -> Any:
        """The call answered under `config`: the one template of every backend. A call with
        nothing to compute (Call.empty: an empty dim, k = 0) is answered by the call itself
        (Call.empty_result, the op's outputs of the right shapes), before any plan, whose
        arithmetic may divide by a size of 0, and any launch: no backend's _launch ever sees
        one. Any other call is its plan, then _launch(plan, call), which does all the backend
        does (several launches, autograd, out=) from those two alone."""
        if call.empty:
            return call.empty_result()
        return self._launch(self.plan(call, config), call)

    def _launch(self, plan: Any, call: Any) -> Any:
        """Answer a non-empty call by its plan (self.plan(call, config): a backend without a
        plan gets None): everything the config decides is in the plan."""
        raise NotImplementedError

    def bind(self, call: Any, config: Config) -> Callable[..., Any] | None:
        """The prepared call: a function of the call's tensors (`call.inputs()`) that does what
        run(call, config) does, for this call and any later one of the same plain key (shapes,
        strides, dtypes, device, the scalar arguments). Everything that depends on those alone
        (the plan, the grid, the output's shape and dtype, the bound launches) is worked out
        here, once; a later call is the output's allocation and the launches. The dispatcher
        keeps it per plain key (Op.routes); None: this call is not prepared (autograd, out=, an
        empty call ...) and goes through run() every time."""
        return None

    #: The backend's cost model, a function of heuristics/<op>.py with the one signature every
    #: backend shares: (call, model, plan) -> Estimate. Set as staticmethod(cost.<name>).
    estimate: Callable[[Any, Any, Any], Estimate] | None = None

    def plan(self, call: Any, config: Config | None = None, *, sms: int | None = None) -> Any:
        """The frozen launch plan of a call under a config (None: the backend has no plan)."""
        return None

    def cost(self, call: Any, model: Any) -> Estimate:
        """The cost model's estimate of this backend on the call: `estimate(call, model, plan)`
        with the plan of the first config. A backend without one (a plug-in's that set no
        `estimate` and did not override cost) is unknown to the model (infinite seconds): the
        cold choice stays with the others, and tuning, which measures it, decides."""
        if self.estimate is None:
            return Estimate(math.inf, notes=("no cost model: ranked by tuning only",))
        # The model's SM count, not the call's device: explain() may ask about another GPU.
        plan = self.plan(call, self.configs(call)[0], sms=max(1, int(model.sm_count)))
        return self.estimate(call, model, plan)

    # -- shared helpers ------------------------------------------------------------------------
    def device_reason(self, info: DeviceInfo) -> str | None:
        if self.uses_triton and not info.runs_triton:
            return (
                f"Triton kernels need a CUDA tensor; got a {info.type} tensor "
                "(set TRITON_INTERPRET=1 before importing triton to run them on the CPU, slowly)"
            )
        return None

    @property
    def source_hash(self) -> str:
        """Hash of the code this backend runs (its kernels' jit closure, constants, host module
        and switches); timings in the tune cache are trusted only under the same hash."""
        cached = self.__dict__.get("_source_hash")
        if cached is None:
            if self.uses_triton:
                from .source_hash import backend_hash

                cached = backend_hash(self)
            else:
                cached = hashlib.sha256(
                    f"{type(self).__qualname__}|{self.revision}".encode()).hexdigest()[:16]
            self.__dict__["_source_hash"] = cached
        return cached

    def __repr__(self) -> str:
        return f"<backend {self.name}>"


class TorchBackend(Backend):
    """The ATen op itself: a candidate for every call, on every device."""

    name = "torch"
    uses_triton = False

    def __init__(self, fn: Callable[[Any], Any], estimate: Callable[[Any, Any, Any], Estimate],
                 prepared: Callable[[Any], Callable[..., Any]] | None = None):
        self._fn = fn
        self.estimate = _with_plan_argument(estimate)  # torch's op has no plan: it gets None
        #: call -> torch's op as a function of the call's tensors (its scalars bound)
        self._prepared = prepared

    def supports(self, call: Any) -> str | None:
        return None

    def run(self, call: Any, config: Config) -> Any:
        # torch's op answers every call itself, empty ones too: it is what the empty results
        # of the other backends (Call.empty_result) follow, and the dispatcher's choice for
        # every empty call.
        return self._fn(call)

    def bind(self, call: Any, config: Config) -> Callable[..., Any] | None:
        """torch's op on other tensors of the call's plain key: the op's own `prepared(call)`
        (torch's function with the call's scalars bound), else through the call's for_input.
        Routes of torch's op are answered by ops.py directly, so this serves the prepared calls
        that choose per regime (Op._route), on the eager side of which it is the whole call."""
        if self._prepared is not None:
            return self._prepared(call)
        remake = getattr(call, "for_input", None)
        if remake is None:
            return None
        fn = self._fn
        return lambda *tensors: fn(remake(*tensors))


def _with_plan_argument(estimate: Callable[..., Estimate]) -> Callable[[Any, Any, Any], Estimate]:
    """Accept an estimate written as (call, model), the form before plans existed, as well as
    (call, model, plan): a user's own op keeps working."""
    try:
        inspect.signature(estimate).bind(None, None, None)
    except TypeError:
        return lambda call, model, plan: estimate(call, model)
    except ValueError:  # a builtin without a signature: assume the current form
        pass
    return estimate


class PlannedBackend(Backend):
    """A backend whose launches follow a plan: a frozen dataclass of every launch parameter,
    made by `make_plan` from the call's facts (`plan_facts`), the SM count and a config. The
    plan is the Launchers' spec, the source of each kernel's constexprs and the cost model's
    input, and all that `_launch(plan, call)` and a prepared call get of the config. Plans are
    memoised per backend: a call's facts repeat far more often than they change (the memo is
    simply cleared if it ever grows large)."""

    PLANS_MAX = 4096

    def plan_facts(self, call: Any) -> tuple:
        """The hashable facts of a call that its plan depends on (sizes, dtype, flags)."""
        raise NotImplementedError

    def make_plan(self, call: Any, config: Config, sms: int) -> Any:
        raise NotImplementedError

    def plan(self, call: Any, config: Config | None = None, *, sms: int | None = None) -> Any:
        if config is None:
            config = self.configs(call)[0]
        if sms is None:
            sms = call.info.sm_count
        # The config's own order: equal configs built in another order only cost a second plan.
        key = (self.plan_facts(call), sms, tuple(config.items()))
        plans = self.__dict__.get("_plans")
        if plans is None:
            plans = self.__dict__["_plans"] = {}
        found = plans.get(key)
        if found is None:
            if len(plans) >= self.PLANS_MAX:
                plans.clear()
            found = plans[key] = self.make_plan(call, dict(config), sms)
        return found

    def forget_plans(self) -> None:
        """Drop the memoised plans (after a change to what plans are made from: tests, tools)."""
        self.__dict__.pop("_plans", None)
