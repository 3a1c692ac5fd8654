"""Tuning mode: measure the candidates of an unseen shape bucket on the spot, then remember the winner.

On with OPSELECT_TUNE=1 in the environment, or inside `with opselect.tuning():`. The flag is a plain
module attribute because every dispatch reads it. Suspended while the current CUDA stream captures a
graph (capturing()): a key first seen then is decided from the cache or the model.

Measuring a call has two stages (Op.decide): measure_all ranks each backend's configurations by
device time (do_bench), then time_interleaved times every candidate's best configuration, the
current choice among them, as the program will run it; those are the seconds recorded, and the
choice follows them, so a measured winner replaces the model's (or torch) only if it wins there.
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
    measurement from deciding. (Timing single calls in turns, a, b, a, b, ..., by events was
    tried: a candidate heavy in host time drains the launch queue, and its neighbours' events
    then include host time; see benchmarks/NOTES.md. time_interleaved takes turns in blocks
    between synchronisations instead, by the wall clock.)"""
    times = [measure_safely(fn, device, what, budget_ms=budget_ms) for what, fn in items]
    finite = [t for t in times if math.isfinite(t)]
    if len(finite) < 2:
        return times
    bar = close * min(finite)
    for i, (what, fn) in enumerate(items):
        if times[i] <= bar:
            times[i] = min(times[i], measure_safely(fn, device, what, budget_ms=budget_ms))
    return times


#: How the recorded seconds of a tune record were measured (stored with each timing; timings
#: measured another way are measured again): each backend's best configuration, found by
#: measure_all, then timed by time_interleaved against every other candidate of the call, each
#: through the public function with the op's choice pinned to it (/2; /1 timed the backends'
#: run() alone, without the host time of the path that reaches them), in passes until they
#: agree (/3; /2 took one pass, which a disturbance right after the first compiles could skew).
METHOD = "interleaved wall clock, back-to-back calls through the public function/3"


def time_interleaved(items: list[tuple[str, Callable[[], Any]]], device: torch.device, *,
                     rounds: int | None = None, block_s: float = 1e-3, passes: int | None = None,
                     settled: float = 0.05) -> list[float]:
    """Seconds per call of each (what, fn), timed as a user's program runs them: a block of
    back-to-back calls between two synchronisations, by the wall clock, the candidates taking
    turns (the order rotates every round), the median of each one's blocks.

    This is the measurement that settles a choice. do_bench (measure_all) flushes L2 between
    runs and reads device events, which hide host time while the device is the busier of the
    two: right for ranking configurations of one kernel, wrong for a call whose cost is its
    host time (a small call pays the launch, the allocations and, for a Python autograd.Function,
    its overhead, which torch's C++ op does not). Back-to-back blocks include that time exactly
    when it is what the program waits for; turns within each round put every candidate in the
    same conditions (clocks, temperature, what the others left in L2). A failing fn gets inf.

    The rounds are repeated (up to `passes` times, 4 on a GPU) until a pass gives every
    candidate's median within `settled` of the one before, and each candidate gets its lowest
    median. Right after a process's first compiles the H200 ran every candidate of a 20 us call
    about 1.6x slower for a while, unevenly: one pass then ranked torch's route (33 us, 20 in the
    program) behind a backend that lost to it by 1.33x in use (benchmarks/NOTES.md). A
    disturbance only adds time, so the lowest of settled passes is the program's.
    """
    cuda = device.type == "cuda"
    rounds = rounds if rounds is not None else (7 if cuda else 2)
    passes = max(1, passes if passes is not None else (4 if cuda else 1))

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    calls_per_block: list[int] = []
    for what, fn in items:
        try:
            fn()  # warm-up (caches, lazy plans)
            if not cuda:  # (interpreted kernels: one call a block, each already a long one)
                calls_per_block.append(1)
                continue
            sync()  # one timed call sizes the blocks
            start = time.perf_counter()
            fn()
            sync()
            once = time.perf_counter() - start
        except Exception as exc:  # noqa: BLE001 - a failing candidate is ranked last
            _failed(what, exc)
            calls_per_block.append(0)
            continue
        calls_per_block.append(max(1, min(1000, int(block_s / max(once, 1e-7)))))

    def one_pass() -> list[float]:
        samples: list[list[float]] = [[] for _ in items]
        live = [i for i, reps in enumerate(calls_per_block) if reps]
        for r in range(rounds if live else 0):
            shift = r % len(live)
            for i in live[shift:] + live[:shift]:
                what, fn = items[i]
                reps = calls_per_block[i]
                if not reps:
                    continue  # failed in an earlier turn
                try:
                    sync()
                    start = time.perf_counter()
                    for _ in range(reps):
                        fn()
                    sync()
                except Exception as exc:  # noqa: BLE001
                    _failed(what, exc)
                    calls_per_block[i] = 0
                    continue
                samples[i].append((time.perf_counter() - start) / reps)
        return [statistics.median(s) if s else math.inf for s in samples]

    def agree(a: float, b: float) -> bool:
        return not (math.isfinite(a) and math.isfinite(b)) or abs(a - b) <= settled * min(a, b)

    lowest = [math.inf] * len(items)
    previous: list[float] | None = None
    for _ in range(passes):
        medians = one_pass()
        lowest = [min(low, m) for low, m in zip(lowest, medians)]
        if previous is not None and all(map(agree, medians, previous)):
            break
        previous = medians
    return [low if calls_per_block[i] else math.inf for i, low in enumerate(lowest)]


def _failed(what: str, exc: Exception) -> None:
    warnings.warn(f"opselect: measuring {what} failed ({type(exc).__name__}: {exc}); "
                  "it will not be chosen", RuntimeWarning, stacklevel=4)
