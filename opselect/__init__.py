"""opselect: GPU tensor ops in Triton with several algorithms each, and a dispatcher that picks
the fastest for every call from its shape, dtype and device.

    from opselect import ops
    ops.isin(a, b)                       # chosen automatically
    ops.isin(a, b, backend="hash")       # forced
    opselect.explain("isin", a, b)       # why that choice
    with opselect.tuning(): ...          # measure unseen shapes on the spot
    opselect.freeze()                    # never measure: the cache and the model only
    opselect.on_decision(print)          # see each new decision (also: logger "opselect")
    opselect.enable()                    # a program's own torch calls through opselect
    opselect.enable(ops=["matmul"])      # matmul, nn.Linear, addmm too (off by default)
    torch.compile(fn)                    # ops.* and routed calls stay in the graph (library.py)
    opselect.distributed.sync()          # the same choices on every rank (imported on first use)
    opselect.register_op(opselect.Op(...))   # a plug-in's own op (docs/EXTENDING.md)
    opselect.add_backend("isin", Mine())     # a plug-in's backend of an existing op
"""

from __future__ import annotations

import importlib
from typing import Any

from . import ops
from .heuristics import device_model as _device_model  # noqa: F401  (dispatch's cost-model source)
from ._version import __version__
from .dispatch import Decision, get_op, tuning
# The plug-in API (opselect/extend.py): what a user's op or backend needs, from one place.
from .extend import (ALLOCATION, BOUND_LAUNCH, Backend, Call, DeviceModel, Estimate, Launcher, Op,
                     PlannedBackend, TorchBackend, add_backend, allocator, bucket, cdiv,
                     device_info, plan_launcher, register_op, remove_backend, unregister_op)
from .observe import freeze, frozen, on_decision, record, stop_recording
from .routing import disable, enable, enabled, is_enabled
from .usage import reset_stats, stats


def explain(op: str, *args: Any, backend: str | None = None, show: bool = True,
            **kwargs: Any) -> Decision:
    """The decision the dispatcher takes for this call: every candidate with its supports()
    verdict, predicted and measured time, the choice and where it came from. Printed unless
    show=False; returned either way."""
    decision = get_op(op).explain(*args, backend=backend, **kwargs)
    if show:
        decision.print()
    return decision


def forget() -> None:
    """Drop every op's in-process memo (the on-disk tune cache is untouched)."""
    from .dispatch import all_ops
    from .heuristics.device_model import forget_models

    for op in all_ops():
        op.forget()
    forget_models()


#: public submodules that `import opselect` does not import (distributed needs torch.distributed,
#: cli the command line's parser and the cache tools): opselect.<name> imports one on first access
_LAZY_SUBMODULES = ("cli", "distributed")


def __getattr__(name: str) -> Any:
    """opselect.distributed and opselect.cli without an import of their own (PEP 562). Importing
    the submodule sets it as this package's attribute, so this runs once per submodule."""
    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY_SUBMODULES))


__all__ = ["ALLOCATION", "BOUND_LAUNCH", "Backend", "Call", "Decision", "DeviceModel", "Estimate",
           "Launcher", "Op", "PlannedBackend", "TorchBackend", "__version__", "add_backend",
           "allocator", "bucket", "cdiv", "device_info", "disable", "enable", "enabled",
           "explain", "forget", "freeze", "frozen", "get_op", "is_enabled", "on_decision", "ops",
           "plan_launcher", "record", "register_op", "remove_backend", "reset_stats", "stats",
           "stop_recording", "tuning", "unregister_op"]
