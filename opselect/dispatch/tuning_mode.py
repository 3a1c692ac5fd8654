"""Tuning mode: measure the candidates of an unseen shape bucket on the spot, then remember the winner.

On with OPSELECT_TUNE=1 in the environment, or inside `with opselect.tuning():`. The flag is a plain
module attribute because every dispatch reads it. Suspended while the current CUDA stream captures a
graph (capturing()): a key first seen then is decided from the cache or the model.
"""

from __future__ import annotations

import math
import os
import statistics
import time
import warnings
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch


class _State:
    __slots__ = ("active", "frozen")

    def __init__(self) -> None:
        self.active = os.environ.get("OPSELECT_TUNE", "0") not in ("", "0")
        #: opselect.freeze() / OPSELECT_FREEZE=1: never measure (the cache and the model only)
        self.frozen = os.environ.get("OPSELECT_FREEZE", "0") not in ("", "0")


state = _State()


@contextmanager
def tuning(enabled: bool = True) -> Iterator[None]:
    """Within the block, an unseen (op, shape bucket, dtype) is measured, recorded and then used.

    `tuning(False)` switches measuring off inside a block that has it on.
    """
    previous = state.active
    state.active = enabled
    try:
        yield
    finally:
        state.active = previous


def capturing(info: Any) -> bool:
    """True while the current CUDA stream of a CUDA device is capturing a graph: tuning is
    suspended then (measuring would synchronise and allocate outside the graph's pool)."""
    return info.type == "cuda" and torch.cuda.is_current_stream_capturing()


def measure(fn: Callable[[], Any], device: torch.device, *, budget_ms: float = 40.0) -> float:
    """Median seconds of fn() on its device. CUDA: triton's do_bench (device events, L2 flushed
    between runs); CPU: wall clock, a few runs, since interpreted kernels are slow."""
    if device.type == "cuda":
        from triton.testing import do_bench

        ms = do_bench(fn, warmup=max(budget_ms / 4, 1.0), rep=budget_ms, return_mode="median")
        return float(ms) / 1e3
    fn()  # warm-up: compiles / traces, fills caches
    times = []
    deadline = time.perf_counter() + budget_ms / 1e3
    for _ in range(5):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
        if time.perf_counter() > deadline:
            break
    return statistics.median(times)


def measure_safely(fn: Callable[[], Any], device: torch.device, what: str, **kw: Any) -> float:
    """measure(), but a backend that fails while being measured is reported once and ranked last
    instead of breaking the user's call."""
    try:
        return measure(fn, device, **kw)
    except Exception as exc:  # noqa: BLE001 - any failure of a candidate must not escape tuning
        _failed(what, exc)
        return math.inf


def measure_all(items: list[tuple[str, Callable[[], Any]]], device: torch.device, *,
                budget_ms: float = 40.0, close: float = 1.5) -> list[float]:
    """measure_safely() of each (what, fn), one after the other; then the close contenders
    (within `close` times the fastest) once more, keeping each one's better median.

    Each is timed as the benchmarks time it (do_bench: L2 flushed, device events, host time
    hidden while the device is busier than the host), so tuning ranks candidates as the
    benchmarks do. A median can still be off when the GPU's clocks change mid-measurement (seen
    on the H200 as 2x for a 40 us kernel); the second look at the contenders keeps such a
    measurement from deciding. (Timing the candidates in turns, a, b, a, b, ..., was tried: a
    candidate heavy in host time drains the launch queue, and its neighbours' events then
    include host time; see benchmarks/NOTES.md.)"""
    times = [measure_safely(fn, device, what, budget_ms=budget_ms) for what, fn in items]
    finite = [t for t in times if math.isfinite(t)]
    if len(finite) < 2:
        return times
    bar = close * min(finite)
    for i, (what, fn) in enumerate(items):
        if times[i] <= bar:
            times[i] = min(times[i], measure_safely(fn, device, what, budget_ms=budget_ms))
    return times


def _failed(what: str, exc: Exception) -> None:
    warnings.warn(f"opselect: measuring {what} failed ({type(exc).__name__}: {exc}); "
                  "it will not be chosen", RuntimeWarning, stacklevel=4)
