"""What a program decided, and what it may decide: log, hooks, record, freeze.

* Logging: the stdlib logger `opselect` logs one INFO line per new decision (op, key, choice,
  source, predicted and measured time). `logging.getLogger("opselect").setLevel(logging.INFO)`
  (or any handler at INFO) shows them.
* `on_decision(fn)`: fn(event) for every new decision (an `Event`); returns a function that
  removes the hook. A hook that raises gets one warning and is removed (a decision is never
  lost to a hook's bug).
* `record(path)` / OPSELECT_RECORD=path: every distinct call key the program decides is written
  to path as a warm spec (JSON, which `opselect warm` reads like YAML), rewritten atomically at
  each new key: run the program once, then `opselect warm path` on the machine it will run on.
* `freeze()` / OPSELECT_FREEZE=1: the cache and the model only; tuning is off (nothing is
  measured, so nothing is written), whatever `tuning()` or OPSELECT_TUNE say.

A new decision is one per (op, key) and process: the memo's misses, off the hot path.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from .dispatch import tuning_mode as _tuning

logger = logging.getLogger("opselect")


@dataclass(frozen=True)
class Event:
    op: str
    key: tuple
    call: str  # the call's one-line description
    choice: str
    source: str  # cache, tuning, model, cache+model, only candidate, empty call
    predicted_s: float | None
    measured_s: float | None


_hooks: list[Callable[[Event], None]] = []
_lock = threading.Lock()


def on_decision(fn: Callable[[Event], None]) -> Callable[[], None]:
    """Call fn(event) on every new decision; returns the function that removes the hook."""
    if not callable(fn):
        raise TypeError(f"on_decision: expected a callable, got {type(fn).__name__}")
    with _lock:
        _hooks.append(fn)

    def remove() -> None:
        with _lock:
            if fn in _hooks:
                _hooks.remove(fn)

    return remove


# ---------------------------------------------------------------------------------------------
# freeze
# ---------------------------------------------------------------------------------------------
def freeze(enabled: bool = True) -> None:
    """Decide from the cache and the model only (True), or allow tuning again (False)."""
    _tuning.state.frozen = bool(enabled)


@contextmanager
def frozen(enabled: bool = True) -> Iterator[None]:
    previous = _tuning.state.frozen
    _tuning.state.frozen = bool(enabled)
    try:
        yield
    finally:
        _tuning.state.frozen = previous


# ---------------------------------------------------------------------------------------------
# record
# ---------------------------------------------------------------------------------------------
class _Recorder:
    def __init__(self, path: Path):
        self.path = path
        self.entries: list[dict[str, Any]] = []
        self.seen: set[str] = set()

    def add(self, entry: dict[str, Any] | None) -> None:
        if entry is None:
            return
        text = json.dumps(entry, sort_keys=True)
        if text in self.seen:
            return
        self.seen.add(text)
        self.entries.append(entry)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(self.entries, indent=1) + "\n")
            os.replace(tmp, self.path)
        except OSError as exc:
            warnings.warn(f"opselect: cannot write the recorded spec {self.path} ({exc}); "
                          "recording stopped", RuntimeWarning, stacklevel=2)
            stop_recording()


_recorder: _Recorder | None = None


def record(path: str | os.PathLike) -> None:
    """Write every distinct call key decided from now on to path, as a warm spec."""
    global _recorder
    _recorder = _Recorder(Path(path))


def stop_recording() -> None:
    global _recorder
    _recorder = None


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def spec_entry(op: str, call: Any) -> dict[str, Any] | None:
    """The warm spec entry that reproduces this call's key (None: an op warm cannot sample)."""
    if op == "isin":
        return {"op": "isin", "shapes": [list(call.elements.shape), list(call.test.shape)],
                "dtypes": [_dtype_name(call.elements.dtype)],
                "options": {"invert": bool(call.invert),
                            "assume_unique": bool(call.assume_unique)}}
    if op == "topk":
        return {"op": "topk", "shapes": [list(call.input.shape)],
                "dtypes": [_dtype_name(call.input.dtype)],
                "options": {"k": int(call.k), "dim": int(call.dim),
                            "largest": bool(call.largest), "sorted": bool(call.sorted)}}
    if op in ("softmax", "log_softmax"):
        options: dict[str, Any] = {"dim": int(call.dim)}
        if call.dtype_arg is not None:
            options["out_dtype"] = _dtype_name(call.dtype_arg)
        return {"op": op, "shapes": [list(call.x.shape)], "dtypes": [_dtype_name(call.x.dtype)],
                "options": options}
    if op == "permute":
        return {"op": "permute", "shapes": [list(call.input.shape)],
                "dtypes": [_dtype_name(call.input.dtype)],
                "options": {"dims": [int(d) for d in call.dims]}}
    if op == "matmul":
        # (the samples' layouts: a transposed operand is the transpose of a contiguous one)
        return {"op": "matmul", "shapes": [list(call.a.shape), list(call.b.shape)],
                "dtypes": [_dtype_name(call.dtype)],
                "options": {"transpose_a": not call.layout[0], "transpose_b": call.layout[1]}}
    if op == "linear" and call.form == "linear":
        # (an addmm call's weight is (k, n), which no linear sample reproduces)
        return {"op": "linear", "shapes": [list(call.a.shape), list(call.b.shape)],
                "dtypes": [_dtype_name(call.dtype)], "options": {"bias": call.bias is not None}}
    return None


# ---------------------------------------------------------------------------------------------
# The dispatcher's report
# ---------------------------------------------------------------------------------------------
def decided(op: Any, call: Any, decision: Any) -> None:
    """Op._select calls this once per new (op, key)."""
    if not (_hooks or _recorder is not None or logger.isEnabledFor(logging.INFO)):
        return
    best = decision.candidate(decision.choice)
    event = Event(op.name, call.key, decision.call, decision.choice, decision.source,
                  best.predicted_s if best is not None else None,
                  best.measured_s if best is not None else None)
    if logger.isEnabledFor(logging.INFO):
        logger.info("%s %s -> %s (%s; predicted %s, measured %s)", event.op, event.call,
                    event.choice, event.source, _us(event.predicted_s), _us(event.measured_s))
    if _recorder is not None and op.name not in ("misbehaving_for_tests",):
        try:
            _recorder.add(spec_entry(op.name, call))
        except AttributeError:
            pass  # an op of someone else's: nothing to sample it from
    for fn in list(_hooks):
        try:
            fn(event)
        except Exception as exc:  # noqa: BLE001 - a hook's bug must not fail the call
            warnings.warn(f"opselect: the on_decision hook {fn!r} raised {exc!r}; removed",
                          RuntimeWarning, stacklevel=2)
            with _lock:
                if fn in _hooks:
                    _hooks.remove(fn)


def _us(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e6:.1f} us"


if os.environ.get("OPSELECT_RECORD"):
    record(os.environ["OPSELECT_RECORD"])
