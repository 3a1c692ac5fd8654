"""Tuning mode: measure the candidates of an unseen shape bucket on the spot, then remember the winner.

On with OPSELECT_TUNE=1 in the environment, or inside `with opselect.tuning():`. The flag is a plain
module attribute because every dispatch reads it.
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
    __slots__ = ("active",)

    def __init__(self) -> None:
        self.active = os.environ.get("OPSELECT_TUNE", "0") not in ("", "0")


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


#: Bytes written between two timed runs on a GPU, so that no run finds its inputs in L2 (more than
#: any current GPU's L2, as triton's do_bench does).
FLUSH_BYTES = 256 << 20


def measure_all(items: list[tuple[str, Callable[[], Any]]], device: torch.device, *,
                budget_ms: float = 40.0) -> list[float]:
    """Median seconds of each (what, fn), with a failing fn reported once and ranked last.

    On a GPU the functions are timed in turns (a, b, c, a, b, c, ...) rather than one after the
    other: the clocks and the neighbours' load drift over a tuning session, and taking turns
    makes every candidate see the same drift, so that two close candidates are ranked by what
    they do, not by when they ran. Each run is preceded by an L2 flush and timed by device
    events. Elsewhere each is measured on its own (wall clock)."""
    if device.type != "cuda" or len(items) < 2:
        return [measure_safely(fn, device, what, budget_ms=budget_ms) for what, fn in items]
    live: list[int] = []
    for i, (what, fn) in enumerate(items):
        try:
            fn()  # compiles, allocates, and proves the candidate runs
            live.append(i)
        except Exception as exc:  # noqa: BLE001 - a failing candidate must not escape tuning
            _failed(what, exc)
    times = [math.inf] * len(items)
    if not live:
        return times
    try:
        flush = _flush_buffer(device)
        # One timed run each gives the round's length, which sets the number of rounds.
        first = _timed_round([items[i][1] for i in live], flush)
        round_s = sum(first) + len(live) * FLUSH_BYTES / 2e12
        rounds = int(min(200, max(5, budget_ms * len(live) / 1e3 / max(round_s, 1e-9))))
        samples: list[list[float]] = [[] for _ in live]
        for _ in range(rounds):
            for k, t in enumerate(_timed_round([items[i][1] for i in live], flush, sync=False)):
                samples[k].append(t)
        torch.cuda.synchronize()
        for k, i in enumerate(live):
            times[i] = statistics.median(e.elapsed_time(f) / 1e3 for e, f in samples[k])
    except Exception as exc:  # noqa: BLE001 - e.g. out of memory for the flush buffer
        warnings.warn(f"opselect: interleaved timing failed ({type(exc).__name__}: {exc}); "
                      "timing candidates one by one", RuntimeWarning, stacklevel=2)
        return [measure_safely(fn, device, what, budget_ms=budget_ms) for what, fn in items]
    return times


def _flush_buffer(device: torch.device) -> torch.Tensor:
    return torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device=device)


def _timed_round(fns: list[Callable[[], Any]], flush: torch.Tensor, *, sync: bool = True):
    """One run of each fn after a flush, between two events. With sync, the seconds of each;
    without, the (start, end) event pairs (read after one synchronisation at the end)."""
    pairs = []
    for fn in fns:
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        pairs.append((start, end))
    if not sync:
        return pairs
    torch.cuda.synchronize()
    return [s.elapsed_time(e) / 1e3 for s, e in pairs]


def _failed(what: str, exc: Exception) -> None:
    warnings.warn(f"opselect: measuring {what} failed ({type(exc).__name__}: {exc}); "
                  "it will not be chosen", RuntimeWarning, stacklevel=4)

