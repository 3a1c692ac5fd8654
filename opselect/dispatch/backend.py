"""The contract every backend of every op follows.

A backend is one algorithm for one op: it says whether it can take a call (`supports`), which tunable
configurations it has (`configs`, the first being its own heuristic default), how long the cost model
thinks it takes (`cost`), and runs (`run`). The `torch` backend of each op (the ATen op itself) takes
every call, so the dispatcher always has a safe choice.
"""

from __future__ import annotations

import hashlib
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
    """Base class; subclasses set `name` and implement run / cost and usually supports / configs."""

    name: str = "?"
    #: Triton JIT functions the backend launches: their source is hashed into the tune cache key, so
    #: editing a kernel re-measures that backend and only it.
    kernels: tuple[Any, ...] = ()
    #: Bump when the launcher changes in a way that affects timing but the kernels' text does not.
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
        raise NotImplementedError

    def cost(self, call: Any, model: Any) -> Estimate:
        raise NotImplementedError

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
        cached = self.__dict__.get("_source_hash")
        if cached is None:
            h = hashlib.sha256(f"{type(self).__qualname__}|{self.revision}".encode())
            for kernel in self.kernels:
                h.update(_kernel_source(kernel).encode())
            cached = self.__dict__["_source_hash"] = h.hexdigest()[:16]
        return cached

    def __repr__(self) -> str:
        return f"<backend {self.name}>"


def _kernel_source(kernel: Any) -> str:
    # triton.JITFunction (and the interpreter's wrapper) keep the source text in `.src`;
    # plain Python callables fall back to inspect.
    src = getattr(kernel, "src", None)
    if src is None:
        fn = getattr(kernel, "fn", kernel)
        import inspect

        src = inspect.getsource(fn)
    return src


class TorchBackend(Backend):
    """The ATen op itself: a candidate for every call, on every device."""

    name = "torch"
    uses_triton = False

    def __init__(self, fn: Callable[[Any], Any], cost: Callable[[Any, Any], Estimate]):
        self._fn = fn
        self._cost = cost

    def supports(self, call: Any) -> str | None:
        return None

    def run(self, call: Any, config: Config) -> Any:
        return self._fn(call)

    def cost(self, call: Any, model: Any) -> Estimate:
        return self._cost(call, model)
