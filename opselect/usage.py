"""Counts of the calls that went through opselect from a program's own torch calls
(`opselect.enable()`) or from compiled graphs (the torch.library ops), per op and per backend that
ran; and, per op, the trace-time decisions of compiled graphs (opselect's op or the aten op).

Direct calls of `opselect.ops.*` are not counted: their path is kept to a few microseconds. Nor
are replays of a captured CUDA graph (no Python runs then).
"""

from __future__ import annotations

from collections import defaultdict

_ran: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
_traced: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))


def record_run(op, call, backend) -> None:
    """Count the backend that just ran `call` of the dispatcher's Op `op`."""
    choice = op.chosen(call, backend)
    _ran[op.name][choice.backend.name if choice is not None else "torch"] += 1


def count(op: str, backend: str) -> None:
    """Count a routed call answered by its route (the backend the route names)."""
    _ran[op][backend] += 1


def record_trace(op: str, placed: str) -> None:
    """A compiled graph's call of `op` was given to `placed` ("opselect" or "aten") at trace time."""
    _traced[op][placed] += 1


def stats() -> dict[str, dict]:
    """{op: {"calls": n, "backends": {backend: n}, "traced": {"opselect": n, "aten": n}}} for
    every op seen since the last reset_stats()."""
    out: dict[str, dict] = {}
    for op in sorted(set(_ran) | set(_traced)):
        backends = dict(_ran.get(op, {}))
        out[op] = {"calls": sum(backends.values()), "backends": backends,
                   "traced": dict(_traced.get(op, {}))}
    return out


def reset_stats() -> None:
    _ran.clear()
    _traced.clear()
