"""Charts of the harness's results: one PNG per <op>.json, beside its .md.

    python benchmarks/plots.py benchmarks/results/h200    # redraw every PNG of that folder

One group of horizontal bars per case, one bar per provider (torch, each backend, auto-cold,
auto-warm, peers such as flag_gems), each the provider's percent of the measured copy bandwidth:
the `pct_copy_bw` the harness derived for the row (harness._derive), so a chart never disagrees
with the table. A provider without a time (not run, wrong or failed) has no bar.

A result may name another per-provider number of its rows to draw instead (its "chart" entry,
from the suite: matmul draws each provider's percent of the case's roofline, since a large product
is bound by the tensor cores, not by memory); then that number's bars, axis label, 100% line and
target lines are drawn, and the same-size copy's mark is left out.

matplotlib is imported only when a chart is drawn: benchmarks run where it is missing (the harness
then skips the PNG).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

# Fixed colours for the providers every op has, so that torch or auto-warm looks the same in every
# chart; backends take BACKEND_COLOURS by their place in the op's registry (stable across runs).
FIXED = {"torch": "tab:gray", "auto-cold": "#98df8a", "auto-warm": "tab:green",
         "flag_gems": "tab:purple"}
BACKEND_COLOURS = ["tab:blue", "tab:orange", "tab:red", "tab:brown", "tab:pink", "tab:cyan",
                   "tab:olive", "#aec7e8", "#ffbb78", "#ff9896"]
AUTO = ("auto-cold", "auto-warm")
# Not a provider: the harness's copy of the case's traffic (what memory gives at this size) is a
# mark on each group, not a bar.
SAME_SIZE_COPY = "copy"
# The suites name their bandwidth targets in the summary ("target_85pct_copy_bw_...",
# targets_met's "30pct_bw"): the charts read them there, so old results get their lines too.
TARGET = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)pct_(?:copy_)?bw")

WIDTH_IN = 8.0      # at DPI: about GitHub's README width, so the text is not scaled down
DPI = 100
BAR_IN = 0.08       # height of one bar
GAP_IN = 0.22       # between two cases' groups


def plottable(result: object) -> bool:
    """Whether this is a harness result (rows with the derived percent of copy bandwidth)."""
    rows = result.get("rows") if isinstance(result, dict) else None
    return bool(rows) and isinstance(rows, list) and all(
        isinstance(r, dict) and "case" in r and isinstance(r.get("pct_copy_bw"), dict)
        for r in rows)


def metric(result: dict) -> str:
    """The per-provider dict of each row that the bars draw: the chart's metric, else the
    percent of copy bandwidth."""
    return (result.get("chart") or {}).get("metric", "pct_copy_bw")


def _registry_backends(op: str) -> list[str] | None:
    """The op's backends in registry order (what the harness calls a backend), or None where the
    op is not one of opselect's (a synthetic result) or opselect cannot be imported."""
    try:
        import importlib

        from opselect.dispatch import get_op

        # "softmax (forward + backward)" is softmax's
        name = op.split()[0]
        try:
            found = get_op(name)
        except Exception:  # noqa: BLE001 - an op whose package opselect.ops does not import
            if not name.isidentifier():
                raise
            importlib.import_module(f"opselect.kernels.{name}")  # (registers it, as matmul)
            found = get_op(name)
        return [b.name for b in found.backends[1:]]
    except Exception:  # noqa: BLE001 - only the colours' order depends on it
        return None


def providers(result: dict) -> tuple[list[str], dict[str, str]]:
    """The bars of each group, in order, and their colours. Per-config columns (backend#i) are
    left out; so is a provider no case has a percent for."""
    key = metric(result)
    columns: list[str] = []
    for row in result["rows"]:
        for name in list(row.get("ms", {})) + list(row.get(key, {})):
            if name not in columns and "#" not in name and name != SAME_SIZE_COPY:
                columns.append(name)
    measured = {n for row in result["rows"] for n in row.get(key, {})}
    registry = _registry_backends(str(result.get("op", "")))
    if registry is None:  # unknown op: whatever is not torch, auto or a known peer is a backend
        registry = [n for n in columns if n != "torch" and n not in AUTO and n not in FIXED]
    backends = [n for n in registry if n in columns]
    peers = [n for n in columns if n not in backends and n != "torch" and n not in AUTO]
    order = [n for n in ["torch", *backends, *AUTO, *peers] if n in columns and n in measured]
    colours = {n: FIXED.get(n) or BACKEND_COLOURS[registry.index(n) % len(BACKEND_COLOURS)]
               for n in order if n in FIXED or n in registry}
    spare = iter(BACKEND_COLOURS[::-1])  # a peer other than flag_gems
    for n in order:
        colours.setdefault(n, next(spare, "black"))
    return order, colours


def targets(result: dict) -> list[float]:
    """The suite's bandwidth targets (percent of copy bandwidth), from its summary's names; a
    chart of another metric names its own."""
    chart = result.get("chart") or {}
    if "metric" in chart:
        return sorted(float(t) for t in chart.get("targets", ()))
    summary = result.get("summary") or {}
    names = list(summary) + list(summary.get("targets_met") or {})
    return sorted({float(m.group(1)) for n in names for m in [TARGET.search(n)] if m})


def plot(result: dict, path: Path | str) -> Path:
    """Draw result (the dict of <op>.json) into path. Raises ImportError without matplotlib."""
    import matplotlib

    matplotlib.use("Agg")  # no display on the GPU machine or in CI
    import matplotlib.pyplot as plt

    rows = result["rows"]
    key, chart = metric(result), result.get("chart") or {}
    names, colours = providers(result)
    n = max(1, len(names))
    group_in = n * BAR_IN + GAP_IN
    height = 1.6 + len(rows) * group_in  # title, legend and axis labels take the 1.6
    fig, ax = plt.subplots(figsize=(WIDTH_IN, height), dpi=DPI, layout="constrained")
    bar = BAR_IN / group_in  # in y units: one case per unit
    for j, name in enumerate(names):
        ys, xs = [], []
        for i, row in enumerate(rows):
            pct = row.get(key, {}).get(name)
            if pct is not None:
                ys.append(i + (j - (n - 1) / 2) * bar)
                xs.append(pct)
        ax.barh(ys, xs, height=bar, color=colours[name], label=name)
    marks = [(row[key][SAME_SIZE_COPY], i) for i, row in enumerate(rows)
             if key == "pct_copy_bw" and row[key].get(SAME_SIZE_COPY) is not None]
    if marks:  # as tall as the group; the legend gets a mark of text size (an empty line)
        ax.scatter(*zip(*marks), marker="|", s=(72 * n * BAR_IN) ** 2, color="black",
                   linewidths=1.5, zorder=3)
        ax.plot([], [], marker="|", linestyle="none", color="black", markersize=10,
                markeredgewidth=1.5, label="same-size copy")
    ax.axvline(100, color="black", linewidth=1, label=chart.get("line", "copy (100%)"))
    for t in targets(result):
        ax.axvline(t, color="black", linewidth=1, linestyle="--",
                   label=chart.get("target_label", "target {t:g}%").format(t=t))
    top = max([pct for row in rows for pct in row.get(key, {}).values()] + [100])
    ax.set_xlim(0, top * 1.05)
    ax.set_ylim(len(rows) - 0.5, -0.5)  # the first case on top, as in the table
    ax.set_yticks(range(len(rows)), [row["case"] for row in rows], fontsize=8)
    ax.tick_params(axis="x", labelsize=8)
    ax.grid(axis="x", color="0.9", linewidth=0.6)
    ax.set_axisbelow(True)
    ax.set_xlabel(chart.get("label", "% of copy bandwidth (read + write)"), fontsize=9)
    gpu = result.get("device") or result.get("gpu", "?")
    # Above the axes, centred on the figure, where it hides no bar whatever the number of cases;
    # the title is the legend's own, so the two cannot overlap. Two rows, read row by row.
    handles, labels = ax.get_legend_handles_labels()
    bars = [i for i, label in enumerate(labels) if label in names]  # then the lines
    keep = bars + [i for i in range(len(labels)) if i not in bars]
    handles, labels = [handles[i] for i in keep], [labels[i] for i in keep]
    ncol = -(-len(handles) // 2)
    order = [i for j in range(ncol) for i in range(j, len(handles), ncol)]
    fig.legend([handles[i] for i in order], [labels[i] for i in order],
               loc="outside upper center", ncol=ncol, fontsize=8, frameon=False,
               title=f"{result.get('op', '?')} on {gpu}", title_fontsize=11,
               columnspacing=1.2, handlelength=1.5)
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


def redraw(folder: Path) -> list[Path]:
    """Draw <name>.png beside every harness-format <name>.json of folder; say what is skipped."""
    drawn = []
    for src in sorted(folder.glob("*.json")):
        try:
            result = json.loads(src.read_text())
        except ValueError as exc:
            print(f"skip {src.name}: not JSON ({exc})")
            continue
        if not plottable(result):
            print(f"skip {src.name}: not a harness result (no per-case pct_copy_bw)")
            continue
        drawn.append(plot(result, src.with_suffix(".png")))
        print(f"wrote {drawn[-1]}")
    return drawn


if __name__ == "__main__":
    if len(sys.argv) != 2 or not Path(sys.argv[1]).is_dir():
        sys.exit("usage: python benchmarks/plots.py benchmarks/results/<gpu>")
    redraw(Path(sys.argv[1]))
