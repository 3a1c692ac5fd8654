"""The in-process side of a decision: a prepared call (Call), the choice made for it (Choice),
the memos that keep choices (their every change drops the routes derived from them), and the
rule that picks the fastest candidate without losing to torch (choose)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from .backend import Backend
from .decision import GRAPH, Candidate, Decision
from .device import DeviceInfo

#: Another backend is chosen over torch only if it is at least this much faster (time ratio) by
#: the cost model's estimates (their error is larger than that) ...
TORCH_MARGIN = 0.93
#: ... or by this much when every candidate was timed in turns with the others (stage 2 of
#: measuring): a wider margin there would keep torch over a measured 5% gain, a tuned choice
#: slower than the cold one it replaced.
MEASURED_TORCH_MARGIN = 0.97
#: ... or by this much where the candidate is slower than torch on the device and wins only by
#: its host time: host times on a shared machine move by tens of percent between runs (H200
#: host, issue 36: back-to-back F.linear calls took 25-48 us per call within one minute, `x +
#: 1` 13-25 us), device times by a few. A 512 x 4096 x 4096 product whose Triton kernel ran
#: 40 us on the device against cuBLAS's 25 was tuned onto the kernel by an 18% host "win".
HOST_WIN_MARGIN = 0.8
#: The same bar for the cost model's eager choice where torch's modelled time is its host time
#: (the call is launch-bound): the model's host terms are fitted to calls back to back, and in
#: a program, between other work, a Triton call's host time grows more than torch's own op's.
#: On the H200's host, in a Llama decode loop (benchmarks/host_routed_in_model.py,
#: results/h200/host_routed_in_model_variants.json): a 4-d transposed copy modelled 13.5 us on
#: Triton against torch's 14.7 took 47-78 us routed to tiled, naive or vectorized against 32-38
#: routed to torch; a small softmax 25-29 against 19-22. Only a clear modelled host win counts.


def choose(able: Sequence[Candidate], time_of: Callable[[Candidate], float],
           margin: float = TORCH_MARGIN, *, eager: bool = True) -> Candidate:
    """The fastest of the supported candidates by time_of, unless torch (the first, when it can
    take the call) is within `margin` of it, or (`eager`: time_of is an eager time) wins only
    by a modelled host time less than clearly. Equal times (host-bound calls of backends whose
    host parts are the same) go to the shorter device time: the GPU is free sooner."""
    best = min(able, key=lambda c: (time_of(c), c.time(GRAPH)))
    safe = able[0] if able[0].name == "torch" else None
    if safe is not None and best is not safe:
        if time_of(best) > margin * time_of(safe):
            # Within the noise of a measurement (or the error of the model), stay with torch:
            # never losing to it matters more than a few percent.
            best = safe
        elif (best.measured_device_s is not None and safe.measured_device_s is not None
              and best.measured_device_s > safe.measured_device_s
              and time_of(best) > HOST_WIN_MARGIN * time_of(safe)):
            # Slower on the device, ahead only by the host's time: only a clear host win is
            # trusted (see HOST_WIN_MARGIN).
            best = safe
        elif eager and _modelled_host_win(best, safe, time_of):
            best = safe
    return best


def _modelled_host_win(best: Candidate, safe: Candidate,
                       time_of: Callable[[Candidate], float]) -> bool:
    """`best` beats torch (`safe`) on the cost model's word alone, where torch's modelled time
    is its host time, by less than HOST_WIN_MARGIN (see it)."""
    if best.measured_s is not None or safe.measured_s is not None:
        return False  # a measured time: the rules above
    host, device = safe.predicted_host_s, safe.predicted_device_s
    if host is None or device is None or device >= host:
        return False  # torch is device-bound: the win is on the device
    return time_of(best) > HOST_WIN_MARGIN * time_of(safe)


class Call:
    """A prepared call: arguments normalised as torch does, plus what selection needs.

    `key` identifies the decision: (torch.device, dtypes..., shape buckets..., flags...). Its
    first element names the device in this process only; the tune cache stores key[1:] under the
    device's hardware identity instead.

    `exact` identifies the call itself (the key with exact sizes, and whatever else the cost
    model reads): the cost model's choices are memoised under it, so that they depend on the
    call alone, not on which call of its bucket came first.
    """

    __slots__ = ("info", "key", "exact")

    info: DeviceInfo
    key: tuple
    exact: tuple

    def inputs(self) -> tuple:
        """The tensors a prepared call (Backend.bind) takes: the public function's tensor
        arguments, in order."""
        raise NotImplementedError

    @property
    def empty(self) -> bool:
        """Nothing to compute (an empty dim, k = 0): every backend answers as torch does without
        launching a kernel, so there is nothing to choose, and no plan or cost to work out (their
        arithmetic may divide by a size that is 0)."""
        return False

    def empty_result(self) -> Any:
        """The answer to an empty call, as torch gives it: the op's outputs of the right shapes
        and dtypes (the caller's out= where the call has one), made without a launch. Every
        backend's run() answers an empty call with it (Backend.run), so a Call that can be
        empty says here what its op returns."""
        raise NotImplementedError(f"{type(self).__name__} can be empty but has no empty_result()")

    def describe(self) -> str:
        return repr(self.key[1:])


class _Choices(dict):
    """A memo of choices whose every change empties the op's routes, which are derived from it
    (distributed.sync writes the memo directly; this catches that too). Reads stay dict's own.
    With per_call, a choice for a call not seen before keeps the routes: the memo is keyed by
    exact calls (Op._cold), so a new entry decides that call alone, which has no route yet (a
    program of ever new shapes keeps the routes of the shapes it repeats)."""

    __slots__ = ("_routes", "_per_call")

    def __init__(self, routes: dict, per_call: bool = False) -> None:
        super().__init__()
        self._routes = routes
        self._per_call = per_call

    def __setitem__(self, key, value) -> None:
        if not self._per_call or key in self:
            self._routes.clear()
        super().__setitem__(key, value)

    def __delitem__(self, key) -> None:
        self._routes.clear()
        super().__delitem__(key)

    def pop(self, *args):
        self._routes.clear()
        return super().pop(*args)

    def popitem(self):
        self._routes.clear()
        return super().popitem()

    def clear(self) -> None:
        self._routes.clear()
        super().clear()

    def update(self, *args, **kwargs) -> None:
        self._routes.clear()
        super().update(*args, **kwargs)

    def setdefault(self, key, default=None):
        self._routes.clear()
        return super().setdefault(key, default)


@dataclass(frozen=True)
class Choice:
    backend: Backend
    config: dict[str, Any]
    source: str
    #: A choice the cost model made (fully or in part) is re-decided once in tuning mode.
    provisional: bool = False
    #: The choice while a CUDA graph captures the call (only device time counts there), where
    #: it differs from this one; None: the same.
    graph: "Choice | None" = None

    @classmethod
    def of(cls, op: Any, decision: Decision) -> "Choice":
        """The memo's entry for a decision of op (an Op)."""
        provisional = decision.source in ("model", "cache+model")
        graph = None
        if decision.graph_choice is not None:
            graph = cls(op.backend(decision.graph_choice), dict(decision.graph_config or {}),
                        decision.source, provisional)
        return cls(op.backend(decision.choice), decision.config, decision.source,
                   provisional=provisional, graph=graph)


def fresh_decisions() -> tuple[dict, dict, dict]:
    """An empty set of an Op's in-process decisions (its routes, settled memo, cold memo), tied
    together as an Op's own are: a change to either memo empties the routes."""
    routes: dict = {}
    return routes, _Choices(routes), _Choices(routes, per_call=True)
