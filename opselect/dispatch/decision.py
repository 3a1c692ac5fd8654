"""The record of one selection, as explain() shows it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

#: Where a choice came from, in the order the chain asks.
SOURCES = ("forced", "memo", "cache", "tuning", "model", "only candidate", "empty call")


@dataclass
class Candidate:
    name: str
    verdict: str | None  # None: supported; else the reason it cannot take the call
    predicted_s: float | None = None
    parts: dict[str, float] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    measured_s: float | None = None
    config: dict[str, Any] | None = None

    @property
    def supported(self) -> bool:
        return self.verdict is None


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

    def candidate(self, name: str) -> Candidate:
        for c in self.candidates:
            if c.name == name:
                return c
        raise KeyError(name)

    def rows(self) -> list[tuple[str, ...]]:
        out = []
        for c in self.candidates:
            mark = "->" if c.name == self.choice else ""
            out.append((
                mark,
                c.name,
                "yes" if c.supported else f"no: {c.verdict}",
                _fmt_time(c.predicted_s),
                _fmt_time(c.measured_s),
                "; ".join(c.notes),
            ))
        return out

    HEADER = ("", "backend", "supports", "model", "measured", "notes")

    def __str__(self) -> str:
        rows = [self.HEADER, *self.rows()]
        widths = [max(len(r[i]) for r in rows) for i in range(len(self.HEADER))]
        lines = [f"{self.op}: {self.call}",
                 f"choice: {self.choice} {_fmt_config(self.config)} from {self.source}"
                 + (f" ({self.detail})" if self.detail else "")]
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
                      f"[bold]{self.source}[/bold]" + (f" ({self.detail})" if self.detail else ""))


def _fmt_time(s: float | None) -> str:
    if s is None:
        return "-"
    if math.isinf(s):
        return "failed"
    if s >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} us"


def _fmt_config(config: dict[str, Any] | None) -> str:
    if not config:
        return ""
    return "[" + ", ".join(f"{k}={v}" for k, v in config.items()) + "]"
