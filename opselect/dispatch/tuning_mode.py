"""Tuning mode: measure the candidates of an unseen shape bucket on the spot, then remember the winner.

On with OPSELECT_TUNE=1 in the environment, or inside `with opselect.tuning():`. The flag is a plain
module attribute because every dispatch reads it. Suspended while the current CUDA stream captures a
graph (capturing()): a key first seen then is decided from the cache or the model.

Measuring a call has two stages (Op.decide): measure_all ranks each backend's configurations by
device time (do_bench), then time_interleaved times every candidate's best configuration, the
current choice among them, as the program will run it; those are the seconds recorded (on a
GPU, the device time never below do_bench's of the same call, L2 flushed), and the choice
follows them, so a measured winner replaces the model's (or torch) only if it wins there.
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
    suspended then (measuring would synchronise and allocate outside the graph's pool), and a
    choice that differs per regime takes the graph's. (The C function itself: a route that
    asks on every call pays a Python frame less.)"""
    return info.type == "cuda" and _stream_capturing()


def _stream_capturing() -> bool:
    global _stream_capturing
    _stream_capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing",
                                torch.cuda.is_current_stream_capturing)
    return _stream_capturing()


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
#: agree (/3; /2 took one pass, which a disturbance right after the first compiles could skew),
#: host and device time measured apart in each block, the device kept busy while the host
#: queues it (/4; /3 took the wall clock of a block, which mixed the two), the device time no
#: less than the same call's with L2 flushed (/5; /4 counted back-to-back blocks only, where
#: operands that fit in L2 stay there from one call to the next), configurations ranked by their
#: prepared calls (/6; /5 ranked them by run(), host time included on short calls).
METHOD = "interleaved blocks through the public function, host and device apart, L2 both ways/6"

#: Calls of one block at most: the device queue must hold a whole block while the device sleeps
#: (a few thousand launches fit; a call launches up to a handful of kernels).
BLOCK_CALLS_MAX = 200
#: SM clock assumed when sizing the sleep in cycles (a slower clock only sleeps longer)
_SLEEP_CYCLES_PER_S = 2.0e9


def time_interleaved(items: list[tuple[str, Callable[[], Any]]], device: torch.device, *,
                     rounds: int | None = None, block_s: float = 1e-3, passes: int | None = None,
                     settled: float = 0.05) -> list[tuple[float, float]]:
    """(host seconds, device seconds) per call of each (what, fn), measured apart, as a user's
    program runs them: blocks of back-to-back calls between two synchronisations, the
    candidates taking turns (the order rotates every round), the median of each one's blocks.

    Host time is the wall clock of issuing a block (no sync inside it): Python, argument
    handling, allocations, launches, what a Python autograd.Function adds. Device time is read
    from CUDA events around the block while the device was kept busy (a sleep kernel) until the
    host had queued all of it, so it is the kernels back to back, without the host's gaps: what
    a captured CUDA graph replays. An eager call costs the larger of the two; under a graph, the
    device time alone. (A wall clock of whole blocks, the method before, saw only the larger:
    softmax 2 x 151936 float32 ranked online, 11 us of device time, by its 34 us of host time.)

    This is the measurement that settles a choice. do_bench (measure_all) flushes L2 between
    runs: right for ranking configurations of one kernel; these blocks run as the program does,
    every candidate in the same conditions (clocks, temperature, what the others left in L2).
    (On a GPU the caller, Measuring._settle, floors each device time by do_bench's of the same
    call: operands that fit in L2 stay there between these back-to-back calls.)
    A failing fn gets (inf, inf).

    The rounds are repeated (up to `passes` times, 4 on a GPU) until a pass gives every
    candidate's medians within `settled` of the pass before, and each candidate gets its lowest
    medians. Right after a process's first compiles the H200 ran every candidate of a 20 us call
    about 1.6x slower for a while, unevenly (benchmarks/NOTES.md). A disturbance only adds time,
    so the lowest of settled passes is the program's.

    On the CPU (Triton's interpreter) a call runs to its end on the host: both times are the
    wall clock of one call.
    """
    cuda = device.type == "cuda"
    rounds = rounds if rounds is not None else (7 if cuda else 2)
    passes = max(1, passes if passes is not None else (4 if cuda else 1))

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    calls_per_block: list[int] = []
    sleep_cycles: list[int] = []
    for what, fn in items:
        try:
            fn()  # warm-up (caches, lazy plans)
            if not cuda:  # (interpreted kernels: one call a block, each already a long one)
                calls_per_block.append(1)
                sleep_cycles.append(0)
                continue
            sync()  # one timed call sizes the blocks
            start = time.perf_counter()
            fn()
            sync()
            once = time.perf_counter() - start
        except Exception as exc:  # noqa: BLE001 - a failing candidate is ranked last
            _failed(what, exc)
            calls_per_block.append(0)
            sleep_cycles.append(0)
            continue
        reps = max(1, min(BLOCK_CALLS_MAX, int(block_s / max(once, 1e-7))))
        calls_per_block.append(reps)
        # Long enough for the host to queue the block (`once` bounds a call's host time), and
        # no longer than needed: the sleep is device time spent on nothing.
        sleep_cycles.append(int(min(0.05, 2 * reps * once + 20e-6) * _SLEEP_CYCLES_PER_S))

    def one_block(fn: Callable[[], Any], reps: int, cycles: int) -> tuple[float, float]:
        if not cuda:
            start = time.perf_counter()
            for _ in range(reps):
                fn()
            spent = (time.perf_counter() - start) / reps
            return spent, spent
        sync()
        torch.cuda._sleep(cycles)
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        host = (time.perf_counter() - start) / reps
        end.record()
        end.synchronize()
        return host, begin.elapsed_time(end) / 1e3 / reps

    def one_pass() -> list[tuple[float, float]]:
        samples: list[list[tuple[float, float]]] = [[] for _ in items]
        live = [i for i, reps in enumerate(calls_per_block) if reps]
        for r in range(rounds if live else 0):
            shift = r % len(live)
            for i in live[shift:] + live[:shift]:
                what, fn = items[i]
                if not calls_per_block[i]:
                    continue  # failed in an earlier turn
                try:
                    samples[i].append(one_block(fn, calls_per_block[i], sleep_cycles[i]))
                except Exception as exc:  # noqa: BLE001
                    _failed(what, exc)
                    calls_per_block[i] = 0
        return [(statistics.median(h for h, _ in s), statistics.median(d for _, d in s))
                if s else (math.inf, math.inf) for s in samples]

    def agree(a: tuple[float, float], b: tuple[float, float]) -> bool:
        return all(not (math.isfinite(x) and math.isfinite(y)) or abs(x - y) <= settled * min(x, y)
                   for x, y in zip(a, b))

    lowest = [(math.inf, math.inf)] * len(items)
    previous: list[tuple[float, float]] | None = None
    for _ in range(passes):
        medians = one_pass()
        lowest = [(min(lo[0], m[0]), min(lo[1], m[1])) for lo, m in zip(lowest, medians)]
        if previous is not None and all(map(agree, medians, previous)):
            break
        previous = medians
    return [low if calls_per_block[i] else (math.inf, math.inf) for i, low in enumerate(lowest)]


#: Whether stage 2 floors a device time by do_bench's (L2 flushed) on CPU devices too: there is
#: no L2 to flush under the interpreter, so only tests turn it on (to run that path).
FLUSHED_FLOOR_ON_CPU = False


def flushed_floor(device: torch.device) -> bool:
    """Whether stage 2 counts a candidate's time with L2 flushed as a floor of its device time
    (Measuring._settle)."""
    return device.type == "cuda" or FLUSHED_FLOOR_ON_CPU


def steady(host_device: tuple[float, float]) -> float:
    """The steady-state seconds of an eager call: the host queues calls while the device runs
    earlier ones, so it waits on the slower of the two."""
    return max(host_device)


def _failed(what: str, exc: Exception) -> None:
    warnings.warn(f"opselect: measuring {what} failed ({type(exc).__name__}: {exc}); "
                  "it will not be chosen", RuntimeWarning, stacklevel=4)
