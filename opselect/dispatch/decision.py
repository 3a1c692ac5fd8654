"""The record of one selection, as explain() shows it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

#: Where a choice came from, in the order the chain asks.
SOURCES = ("forced", "memo", "cache", "tuning", "model", "only candidate", "empty call")


#: The two regimes a call runs in. eager: the host issues every call as the program runs, so a
#: call costs the longer of its host time (Python, argument handling, launches) and its device
#: time. graph: the call was captured in a CUDA graph (torch.cuda.graph, or torch.compile's
#: reduce-overhead mode), whose replays run no Python: only the device time counts.
EAGER, GRAPH = "eager", "graph"


@dataclass
class Candidate:
    name: str
    verdict: str | None  # None: supported; else the reason it cannot take the call
    #: the cost model's steady-state eager time: max(host, device) of its parts
    predicted_s: float | None = None
    parts: dict[str, float] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    #: measured steady-state eager time (max of the two below, when they were measured)
    measured_s: float | None = None
    config: dict[str, Any] | None = None
    #: measured host and device seconds per call (tuning's stage 2), each on its own
    measured_host_s: float | None = None
    measured_device_s: float | None = None

    @property
    def supported(self) -> bool:
        return self.verdict is None

    @property
    def predicted_host_s(self) -> float | None:
        """The model's host seconds (its `launch` part: Python, launches, allocations)."""
        if self.predicted_s is None:
            return None
        return self.parts.get("launch", 0.0)

    @property
    def predicted_device_s(self) -> float | None:
        """The model's device seconds (every part but the host's)."""
        if self.predicted_s is None:
            return None
        if "launch" not in self.parts:
            return self.predicted_s
        return sum(v for k, v in self.parts.items() if k != "launch")

    def time(self, regime: str = EAGER) -> float:
        """The seconds this candidate costs in `regime`: measured where it was, else the
        model's. Eager: the steady-state time, max(host, device); graph: the device time."""
        if regime == GRAPH:
            if self.measured_device_s is not None:
                return self.measured_device_s
            if self.measured_s is not None:
                return self.measured_s  # (an older record: device time not kept apart)
            return self.predicted_device_s
        return self.measured_s if self.measured_s is not None else self.predicted_s


@dataclass
class Decision:
    op: str
    call: str  # a one-line description of the call (shapes, dtypes, flags)
    key: tuple
    candidates: list[Candidate]
    choice: str
    config: dict[str, Any]
    source: str
    detail: str = ""  # e.g. "memo (decided by the tune cache)"
    #: the choice (and its config) where only device time counts (a CUDA graph), when it
    #: differs from `choice`, the eager one
    graph_choice: str | None = None
    graph_config: dict[str, Any] | None = None
    #: which regime this explanation answers for (the choice shown is that regime's)
    regime: str = EAGER

    def candidate(self, name: str) -> Candidate:
        for c in self.candidates:
            if c.name == name:
                return c
        raise KeyError(name)

    def rows(self) -> list[tuple[str, ...]]:
        out = []
        for c in self.candidates:
            mark = ("->" if c.name == self.choice else "") + (
                "G" if c.name == self.graph_choice else "")
            out.append((
                mark,
                c.name,
                "yes" if c.supported else f"no: {c.verdict}",
                # (an infinite prediction: a backend without a cost model, not a failure)
                "unknown" if c.predicted_s == math.inf else
                _fmt_split(c.predicted_s, c.predicted_host_s, c.predicted_device_s),
                _fmt_split(c.measured_s, c.measured_host_s, c.measured_device_s),
                "; ".join(c.notes),
            ))
        return out

    #: model: the cost model's time, measured: tuning's; each the steady-state time of an eager
    #: call, max(host, device), with its host (h) and device (d) parts: the eager time decides
    #: `choice` (->), the device time alone the choice under a CUDA graph (G) where it differs
    HEADER = ("", "backend", "supports", "model", "measured", "notes")

    @property
    def decided_by(self) -> str:
        """Which time decided: "eager: max(host, device)" or "graph: device"."""
        return "graph: device time" if self.regime == GRAPH else \
            "eager: max(host, device) time"

    def __str__(self) -> str:
        rows = [self.HEADER, *self.rows()]
        widths = [max(len(r[i]) for r in rows) for i in range(len(self.HEADER))]
        lines = [f"{self.op}: {self.call}",
                 f"choice: {self.choice} {_fmt_config(self.config)} from {self.source}"
                 + (f" ({self.detail})" if self.detail else "") + f", by {self.decided_by}"]
        if self.graph_choice:
            lines.append(f"under a CUDA graph (device time only): {self.graph_choice} "
                         f"{_fmt_config(self.graph_config)}")
        for r in rows:
            lines.append("  " + "  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip())
        return "\n".join(lines)

    def print(self) -> None:
        try:
            from rich.console import Console
            from rich.table import Table
        except ImportError:  # rich is a dependency, but explain() must never fail for want of it
            print(self)
            return
        table = Table(title=f"{self.op}: {self.call}", title_justify="left")
        for h in self.HEADER:
            table.add_column(h, overflow="fold")
        for r in self.rows():
            table.add_row(*r, style="bold green" if r[0] else None)
        console = Console()
        console.print(table)
        console.print(f"choice: [bold]{self.choice}[/bold] {_fmt_config(self.config)} from "
                      f"[bold]{self.source}[/bold]" + (f" ({self.detail})" if self.detail else "")
                      + f", by {self.decided_by}")
        if self.graph_choice:
            console.print(f"under a CUDA graph (device time only): [bold]{self.graph_choice}"
                          f"[/bold] {_fmt_config(self.graph_config)}")


def _fmt_time(s: float | None) -> str:
    if s is None:
        return "-"
    if math.isinf(s):
        return "failed"
    if s >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} us"


def _fmt_split(total: float | None, host: float | None, device: float | None) -> str:
    if total is None or host is None or device is None or math.isinf(total):
        return _fmt_time(total)
    return f"{_fmt_time(total)} (h {_fmt_time(host)}, d {_fmt_time(device)})"


def _fmt_config(config: dict[str, Any] | None) -> str:
    if not config:
        return ""
    return "[" + ", ".join(f"{k}={v}" for k, v in config.items()) + "]"
