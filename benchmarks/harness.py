"""The benchmark harness shared by every bench_<op>.py.

For each case it times, with the median of triton.testing.do_bench (which flushes L2 between runs):
  torch        the plain torch op
  <backend>    each backend of the op, forced (skipped where it does not support the case)
  auto-cold    ops.<op>(...) with an empty tune cache: the cost model's choice
  auto-warm    ops.<op>(...) after the case was tuned (what `opselect warm` does)
  <peer>       peers such as flag_gems, where importable
Every provider's output is checked against torch's first; a wrong one is reported, not timed.

Each row gets ms per provider, GB/s of the case's minimum traffic, percent of the measured copy
bandwidth, ratio to torch and the regret of auto (its time over the best backend's). Results go to
benchmarks/results/<gpu>/<op>.{json,md,png} and, when $OUT is set, there too (the PNG, drawn by
plots.py, where matplotlib is installed).

On a machine without a GPU, --smoke runs tiny cases through the interpreter with wall-clock timing,
to prove the script works (CI does this); its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"

Args = tuple[tuple, dict]


@dataclass
class Case:
    """One benchmark point. `make(device)` returns (args, kwargs) for ops.<op>; `nbytes` is the
    least traffic the op must move (inputs read once, outputs written once). `op`: the op of
    this case where it is not the suite's (matmul's suite times linear calls too)."""

    name: str
    make: Callable[[torch.device], Args]
    nbytes: int
    tags: dict[str, Any] = field(default_factory=dict)
    op: str | None = None


@dataclass
class Suite:
    op: str
    cases: list[Case]
    torch_fn: Callable[..., Any]  # the plain torch op, same signature as ops.<op>
    check: Callable[[Any, Any, Args], str | None]  # (result, reference, inputs) -> error or None
    peers: dict[str, Callable[..., Any]] = field(default_factory=dict)
    #: extra derived metrics / target checks: (rows, summary) -> dict added to the summary
    targets: Callable[[list[dict], dict], dict] | None = None
    #: more per-row numbers, after the harness's own: (row, copy bandwidth in bytes/s) -> None
    derive: Callable[[dict, float], None] | None = None
    #: more cells of each row in the markdown table: (header, row -> text)
    columns: list[tuple[str, Callable[[dict], str]]] = field(default_factory=list)
    #: more markdown after the summary (the .md's and the printed output's last lines)
    report: Callable[[dict], str] | None = None
    #: what the chart draws where not the percent of copy bandwidth: {"metric": a per-provider
    #: dict of each row, "label": the axis, "line": the 100% line's name, "targets": [percent],
    #: "target_label": their name, "{t}" the percent} (plots.py)
    chart: dict | None = None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="tiny cases, any device: checks the script")
    p.add_argument("--filter", default="",
                   help="only cases whose name contains this text (several: a|b|c; one "
                        "ending in $ is the whole name)")
    p.add_argument("--rep-ms", type=float, default=60.0, help="do_bench rep time per provider")
    p.add_argument("--repeat", type=int, default=2,
                   help="report the best of this many do_bench medians per provider")
    p.add_argument("--no-save", action="store_true", help="do not write benchmarks/results/")
    p.add_argument("--providers", default="", help="comma list: only these providers")
    p.add_argument("--configs", action="store_true",
                   help="also time every config of every backend (providers named backend#i)")
    p.add_argument("--part", default="",
                   help="i/n: only every n-th case from the i-th (1-based), to split a suite "
                        "over several runs; combine them with --merge")
    p.add_argument("--deadline-s", type=float, default=0.0,
                   help="start no case after this many seconds (0: no limit): a run that "
                        "must end in time saves what it measured; the cases it left are "
                        "listed, to run later with --filter and --merge")
    p.add_argument("--merge-rows", default="",
                   help="no run: fold the rows a killed run left ($OUT/<op>.rows.json, copied "
                        "here) into the saved results of --gpu, as --merge does")
    p.add_argument("--gpu", default="", help="with --merge-rows: the results folder (h200, ...)")
    p.add_argument("--merge", action="store_true",
                   help="fold this run into the saved results: its providers replace theirs in "
                        "the cases it ran, everything else is kept, the summary is redone")
    return p.parse_args(argv)


def gpu_slug(device: torch.device) -> str:
    if device.type != "cuda":
        return "cpu-interpreter"
    name = torch.cuda.get_device_name(device)
    m = re.search(r"(H200|H100|A100|B200|L40S|L4|A10G?|V100|RTX ?\d+)", name, re.I)
    return (m.group(1) if m else name).lower().replace(" ", "")


def timer(device: torch.device, rep_ms: float,
          repeat: int = 1) -> Callable[[Callable[[], Any]], float]:
    """Median milliseconds of fn(); on a GPU the best of `repeat` do_bench medians (a median
    taken while the clocks changed can be 2x off on the H200 for a 40 us kernel)."""
    if device.type == "cuda":
        from triton.testing import do_bench

        return lambda fn: min(float(do_bench(fn, warmup=max(5.0, rep_ms / 4), rep=rep_ms,
                                             return_mode="median")) for _ in range(repeat))

    def wall(fn: Callable[[], Any]) -> float:
        fn()
        times = []
        for _ in range(3):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return statistics.median(times) * 1e3

    return wall


def copy_bandwidth(device: torch.device, time_ms: Callable) -> float:
    """Bytes/s of a large device-to-device copy, counting read + write (the 100% mark)."""
    n = (1 << 30) if device.type == "cuda" else (1 << 22)
    src = torch.empty(n, dtype=torch.uint8, device=device).random_(0, 255)
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src))
    del src, dst
    return 2 * n / (ms / 1e3)


def _fresh_cache(tag: str) -> str:
    """A new, empty tune cache directory, entered (enter_cache)."""
    d = tempfile.mkdtemp(prefix=f"opselect-bench-{tag}-")
    enter_cache(d)
    return d


def merge_rows(suite: Suite, args: argparse.Namespace) -> dict:
    """--merge-rows: the saved results of args.gpu with the given rows laid over them, on any
    machine (the copy bandwidth is the saved run's)."""
    path = RESULTS / args.gpu / f"{suite.op}.json"
    result = json.loads(path.read_text())
    bw = result["copy_bandwidth_GBps"] * 1e9
    rows = _merged(path, json.loads(Path(args.merge_rows).read_text()), suite, bw)
    result["date"] = max(r["measured"] for r in rows)
    result["summary"] = _summarise(rows, bw)
    if suite.targets:
        result["summary"].update(suite.targets(rows, result["summary"]))
    result["rows"] = rows
    md = markdown(result, suite)
    path.write_text(json.dumps(result, indent=1, default=_json_default))
    path.with_suffix(".md").write_text(md)
    write_png(result, path.with_suffix(".png"))
    print(md)
    return result


def run(suite: Suite, argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.merge_rows:
        return merge_rows(suite, args)
    import opselect

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    time_ms = timer(device, args.rep_ms, args.repeat)
    time_once = timer(device, args.rep_ms, 1)  # one median a round: the rounds take turns
    bw = copy_bandwidth(device, time_ms)
    only = {p for p in args.providers.split(",") if p}
    wanted = lambda p: not only or p in only  # noqa: E731
    slug = gpu_slug(device)
    print(f"# {suite.op} on {slug}: copy bandwidth {bw / 1e9:.0f} GB/s", flush=True)

    part, parts = (int(v) for v in args.part.split("/")) if args.part else (1, 1)
    rows = []
    started = time.monotonic()
    left: list[str] = []
    for index, case in enumerate(suite.cases):
        if not selected(args, case.name):
            continue
        if index % parts != part - 1:
            continue
        if args.deadline_s and time.monotonic() - started > args.deadline_s:
            left.append(case.name)
            continue
        op, public = _op_and_public(case.op or suite.op)
        torch.manual_seed(0)
        inputs = case.make(device)
        a, kw = inputs
        ref = suite.torch_fn(*a, **kw)
        row: dict[str, Any] = {"case": case.name, **case.tags, "bytes": case.nbytes, "ms": {},
                               "measured": time.strftime("%Y-%m-%d"),
                               "errors": {}}
        providers: dict[str, Callable[[], Any]] = {}
        if wanted("torch"):
            providers["torch"] = lambda: suite.torch_fn(*a, **kw)
        call = op.prepare(*a, **kw)
        for b in op.backends[1:]:
            if wanted(b.name) and b.supports(call) is None:
                providers[b.name] = (lambda name: lambda: public(*a, backend=name, **kw))(b.name)
                if args.configs:
                    for i, cfg in enumerate(b.configs(call)):
                        providers[f"{b.name}#{i}"] = (lambda b, cfg: lambda: b.run(call, cfg))(b, cfg)
                    row.setdefault("configs", {})[b.name] = b.configs(call)
        for peer, fn in suite.peers.items():
            if wanted(peer):
                providers[peer] = (lambda f: lambda: f(*a, **kw))(fn)
        from opselect.warm import warm_call

        measure(row, providers, lambda: public(*a, **kw), ref=ref, inputs=inputs,
                check=suite.check, wanted=wanted, explain=lambda: op.explain(*a, **kw).choice,
                warm=lambda: warm_call(op.name, a, kw), time_once=time_once,
                rounds=args.repeat, copy_bytes=case.nbytes, device=device)
        _derive(row, op, bw, suite)
        rows.append(row)
        print(_line(row), flush=True)
        if os.environ.get("OUT"):  # what a run killed for time leaves (see --merge-rows)
            Path(os.environ["OUT"], f"{suite.op}.rows.json").write_text(
                json.dumps(rows, indent=1, default=_json_default))
        del inputs, a, kw, ref, providers
        if device.type == "cuda":
            torch.cuda.empty_cache()

    if left:
        print(f"# past the deadline, not run: {'|'.join(left)}", flush=True)
    if args.merge:
        rows = _merged(RESULTS / slug / f"{suite.op}.json", rows, suite, bw)
    summary = _summarise(rows, bw)
    if suite.targets:
        summary.update(suite.targets(rows, summary))
    result = {"op": suite.op, "device": torch.cuda.get_device_name(device) if device.type == "cuda"
              else "cpu (interpreter)", "gpu": slug, "copy_bandwidth_GBps": bw / 1e9,
              "torch": torch.__version__, "triton": _triton_version(), "python": platform.python_version(),
              "opselect": opselect.__version__, "date": time.strftime("%Y-%m-%d"),
              "smoke": args.smoke, "repeat": args.repeat, "summary": summary, "rows": rows}
    if suite.chart:
        result["chart"] = suite.chart
    md = markdown(result, suite)
    save_result(suite.op, result, md, slug, not args.no_save and not args.smoke)
    print(md)
    return result


def _op_and_public(name: str):
    """The dispatcher's op of this name and the function that answers its calls: ops.<name>,
    or, for an op registered without a public function yet, the Op itself (same arguments,
    backend= included)."""
    import opselect
    from opselect.dispatch import get_op

    op = get_op(name)
    return op, getattr(opselect.ops, name, None) or op


def checked(name: str, fn: Callable[[], Any], ref: Any, inputs: Any,
            check: Callable[[Any, Any, Any], str | None], row: dict) -> bool:
    """Run fn once and check it against ref. A wrong or failing provider is recorded in
    row["errors"] and printed, and its time in row["ms"] is None."""
    try:
        err = check(fn(), ref, inputs)
    except Exception as exc:  # noqa: BLE001 - a failing provider is reported, the suite goes on
        err = f"{type(exc).__name__}: {str(exc)[:300]}"
        print(f"  !! {row['case']}: {name} failed: {err}", flush=True)
    else:
        if err:
            print(f"  !! {row['case']}: {name} is WRONG: {err}", flush=True)
    if err:
        row["errors"][name] = err
        row["ms"][name] = None
    return not err


def time_checked(name: str, fn: Callable[[], Any], ref: Any, inputs: Any,
                 check: Callable[[Any, Any, Any], str | None], time_ms, row: dict) -> float | None:
    """checked(), then fn's time if right (None if not)."""
    return time_ms(fn) if checked(name, fn, ref, inputs, check, row) else None


def measure(row: dict, providers: dict[str, Callable[[], Any]], auto: Callable[[], Any], *,
            ref: Any, inputs: Any, check, wanted, explain: Callable[[], str],
            warm: Callable[[], None], time_once, rounds: int, copy_bytes: int = 0,
            device: torch.device | None = None) -> None:
    """row["ms"] of a case: every provider checked first, then all timed in turns (each once a
    round, the best of `rounds`), with a copy of copy_bytes of traffic and auto (cold: a fresh
    tune cache; warm: one that warm() filled) among them where wanted. Timed one after another,
    a host's clock drift over a case's seconds read as a difference between them (H200: the
    same cuBLAS kernel of 8192^3 measured 0.88x and 1.11x of itself as torch and as auto's
    pick, one run each). explain() gives auto's choice, recorded in the row."""
    import opselect

    timed: dict[str, tuple[Callable[[], Any], str | None]] = {}
    for name, fn in providers.items():
        if checked(name, fn, ref, inputs, check, row):
            timed[name] = (fn, None)
    src = None
    if wanted("copy") and copy_bytes >= 2:
        # A copy of the same traffic (half read, half written): what memory gives at this size,
        # launch and ramp included. Small cases stay well under the copy bandwidth measured on
        # 256 MB, whatever the kernel.
        src = torch.empty(copy_bytes // 2, dtype=torch.uint8, device=device)
        timed["copy"] = (src.clone, None)
    for tag in ("cold", "warm"):
        if not wanted(f"auto-{tag}"):
            continue
        cache_dir = _fresh_cache(tag)
        if tag == "warm":
            warm()
            opselect.forget()
        row[f"auto_{tag}_choice"] = explain()
        if checked(f"auto-{tag}", auto, ref, inputs, check, row):
            timed[f"auto-{tag}"] = (auto, cache_dir)
    row["ms"].update(time_in_turns(timed, time_once, rounds))
    del src


def enter_cache(cache_dir: str) -> None:
    """Make cache_dir the tune cache (one _fresh_cache made) and forget the decisions taken
    under another: auto's next call decides as that cache says."""
    import opselect
    from opselect.tune_cache import reset

    os.environ["OPSELECT_CACHE_DIR"] = cache_dir
    reset()
    opselect.forget()


def time_in_turns(timed: dict[str, tuple[Callable[[], Any], str | None]], time_once,
                  rounds: int) -> dict[str, float]:
    """{name: ms}: each of timed's functions timed once a round, in turns (A B C A B C ...),
    the best of `rounds` rounds. A function paired with a cache directory runs with that tune
    cache (enter_cache before its turn): auto cold and auto warm take turns with the rest."""
    best: dict[str, float] = {}
    for _ in range(max(1, rounds)):
        for name, (fn, cache_dir) in timed.items():
            if cache_dir is not None:
                enter_cache(cache_dir)
            best[name] = min(time_once(fn), best.get(name, float("inf")))
    return best


def do_bench_in_turns(fns: dict[str, Callable[[], Any]], rounds: int) -> dict[str, list[float]]:
    """{name: [us]}: do_bench's median (L2 flushed) of each function once a round, in turns,
    the order reversed every other round (A B C, C B A, ...), so that a drift of the host or
    the clocks falls on every function alike. CUDA only."""
    from triton.testing import do_bench

    samples: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(rounds):
        for k in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            samples[k].append(do_bench(fns[k], return_mode="median") * 1e3)
    return samples


def selected(args: argparse.Namespace, name: str) -> bool:
    """Whether --filter takes the case `name` (a|b|c: any part; a part ending in $: the whole
    name)."""
    return not args.filter or any(name == part[:-1] if part.endswith("$") else part in name
                                  for part in args.filter.split("|"))


def fold_by_case(saved: list[dict], rows: list[dict]) -> list[dict]:
    """A table with no Suite (softmax's backward) merged: each saved row this run measured
    again replaced by the new one, in the saved order; the run's new cases after them."""
    ran = {r["case"]: r for r in rows}
    return [ran.pop(r["case"], r) for r in saved] + list(ran.values())


def _merged(path: Path, rows: list[dict], suite: Suite, bw: float) -> list[dict]:
    """The saved rows with this run's providers laid over them (case by case), in the suite's
    order; each merged row's derived numbers are computed again."""
    from opselect.dispatch import get_op

    doc = json.loads(path.read_text()) if path.exists() else {"rows": []}
    saved = {r["case"]: r for r in doc["rows"]}
    for r in saved.values():  # (rows saved before rows carried their date: the file's)
        r.setdefault("measured", doc.get("date"))
    op_of = {c.name: c.op or suite.op for c in suite.cases}
    for row in rows:
        # (rows a killed run left before rows carried their date: merged on the day they came)
        row.setdefault("measured", time.strftime("%Y-%m-%d"))
        old = saved.get(row["case"])
        if old is not None:
            for key in ("ms", "errors"):
                row[key] = {**old.get(key, {}), **row[key]}
            for key in ("auto_cold_choice", "auto_warm_choice", "configs"):
                if key not in row and key in old:
                    row[key] = old[key]
        _derive(row, get_op(op_of.get(row["case"], suite.op)), bw, suite)
        saved[row["case"]] = row
    return [saved[c.name] for c in suite.cases if c.name in saved]


def _derive(row: dict, op, bw: float, suite: Suite | None = None) -> None:
    ms = row["ms"]
    backends = {b.name for b in op.backends}
    done = {k: v for k, v in ms.items() if v is not None}
    best = min((v, k) for k, v in done.items() if k in backends) if any(
        k in backends for k in done) else (None, None)
    row["best_backend"], row["best_ms"] = best[1], best[0]
    row["GBps"] = {k: row["bytes"] / (v / 1e3) / 1e9 for k, v in done.items()}
    row["pct_copy_bw"] = {k: 100 * row["bytes"] / (v / 1e3) / bw for k, v in done.items()}
    copy = done.get("copy")
    row["pct_same_size_copy"] = {k: 100 * copy / v for k, v in done.items()} if copy else {}
    t = done.get("torch")
    row["speedup_vs_torch"] = {k: t / v for k, v in done.items()} if t else {}
    if best[0]:
        row["regret"] = {k: done[k] / best[0] for k in ("auto-cold", "auto-warm") if k in done}
    if suite is not None and suite.derive:
        suite.derive(row, bw)


def at_least(x: float | None, bound: float) -> bool | None:
    """A target check: None when the value was not measured."""
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else bool(x >= bound)


def at_most(x: float | None, bound: float) -> bool | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else bool(x <= bound)


def _geomean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x and x > 0 and math.isfinite(x)]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def _pct(xs: list[float], q: float) -> float | None:
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    return xs[min(len(xs) - 1, int(math.ceil(q * len(xs))) - 1)]


def _summarise(rows: list[dict], bw: float) -> dict:
    s: dict[str, Any] = {"cases": len(rows)}
    for auto in ("auto-warm", "auto-cold"):
        sp = [r["speedup_vs_torch"].get(auto) for r in rows if r["speedup_vs_torch"]]
        s[f"{auto}_geomean_speedup_vs_torch"] = _geomean(sp)
        s[f"{auto}_worst_vs_torch"] = min((x for x in sp if x), default=None)
        reg = [r.get("regret", {}).get(auto) for r in rows]
        s[f"{auto}_regret_geomean"] = _geomean(reg)
        s[f"{auto}_regret_p90"] = _pct(reg, 0.9)
    for peer in ("flag_gems",):
        ratios = [r["ms"][peer] / r["ms"]["auto-warm"] for r in rows
                  if r["ms"].get(peer) and r["ms"].get("auto-warm")]
        s[f"auto-warm_geomean_speedup_vs_{peer}"] = _geomean(ratios)
    s["wrong_or_failed"] = {r["case"]: r["errors"] for r in rows if r["errors"]}
    return s


def _line(row: dict) -> str:
    ms = row["ms"]
    parts = [f"{k}={v:.4g}" for k, v in ms.items() if v is not None]
    return f"{row['case']:<40} " + " ".join(parts)


def _measured_on(result: dict) -> str:
    """The day the rows were measured, or, for a table merged from several runs, each day with
    its number of rows (newest first): a reader can tell old rows from new."""
    days = collections.Counter(r.get("measured") or result["date"] for r in result["rows"])
    if len(days) <= 1:
        return result["date"]
    return "rows measured " + ", ".join(f"{d} ({n})" for d, n in sorted(days.items(),
                                                                      reverse=True))


def markdown(result: dict, suite: Suite | None = None) -> str:
    rows = result["rows"]
    extra = suite.columns if suite is not None else []
    names: list[str] = []
    for r in rows:
        for k in r["ms"]:
            if k not in names:
                names.append(k)
    out = [f"# {result['op']} on {result['device']}",
           "",
           f"torch {result['torch']}, triton {result['triton']}, opselect {result['opselect']}, "
           f"{_measured_on(result)}. Copy bandwidth {result['copy_bandwidth_GBps']:.0f} GB/s (read + "
           "write). Median ms of do_bench (best of the run's --repeat medians); `%bw` is the case's minimum traffic over the copy "
           "bandwidth; `%copy` is the `copy` column's time (a copy of the same traffic) over "
           "auto-warm's; `xtorch` is torch's time over auto-warm's.",
           "",
           "| case | " + " | ".join(names) +
           " | best | cold pick | warm pick | auto %bw | auto %copy | xtorch |" +
           "".join(f" {header} |" for header, _ in extra),
           "|---" * (len(names) + 7 + len(extra)) + "|"]
    for r in rows:
        cells = [("-" if r["ms"].get(n) is None else f"{r['ms'][n]:.4g}") for n in names]
        pct = r["pct_copy_bw"].get("auto-warm")
        at_size = r.get("pct_same_size_copy", {}).get("auto-warm")
        sp = r["speedup_vs_torch"].get("auto-warm")
        out.append(f"| {r['case']} | " + " | ".join(cells) +
                   f" | {r.get('best_backend') or '-'} | {r.get('auto_cold_choice', '-')} | "
                   f"{r.get('auto_warm_choice', '-')} | {'-' if pct is None else f'{pct:.1f}'} | "
                   f"{'-' if at_size is None else f'{at_size:.0f}'} | "
                   f"{'-' if sp is None else f'{sp:.2f}'} |" +
                   "".join(f" {cell(r)} |" for _, cell in extra))
    out += ["", "## Summary", ""]
    for k, v in result["summary"].items():
        if isinstance(v, float):
            v = f"{v:.3f}"
        out.append(f"- {k}: {v}")
    if suite is not None and suite.report:
        out += ["", suite.report(result).rstrip("\n")]
    return "\n".join(out) + "\n"


def _triton_version() -> str:
    import triton

    return triton.__version__


def _json_default(o: Any) -> Any:
    if isinstance(o, torch.dtype):
        return str(o)
    return repr(o)


def save_result(stem: str, result: dict, md: str, gpu: str, save: bool) -> None:
    """Write <stem>.json and <stem>.md under benchmarks/results/<gpu>/ (when save) and $OUT, and
    <stem>.png beside them when the result is a harness table (plots.py)."""
    import plots  # this folder is on sys.path wherever harness is

    text = json.dumps(result, indent=1, default=_json_default)
    places = [RESULTS / gpu] if save else []
    if os.environ.get("OUT"):
        places.append(Path(os.environ["OUT"]))
    for place in places:
        place.mkdir(parents=True, exist_ok=True)
        (place / f"{stem}.json").write_text(text)
        (place / f"{stem}.md").write_text(md)
        if plots.plottable(result):
            write_png(result, place / f"{stem}.png")


def write_png(result: dict, path: Path) -> None:
    """The chart of a harness result; never fails the benchmark whose numbers are already saved
    (no matplotlib, or a plotting error: one line says why there is no PNG)."""
    import plots

    try:
        plots.plot(result, path)
    except ImportError as exc:
        print(f"# no {path.name}: matplotlib is not installed ({exc})", flush=True)
    except Exception as exc:  # noqa: BLE001 - a chart is never worth the run's results
        print(f"# no {path.name}: plotting failed: {type(exc).__name__}: {exc}", flush=True)


def main_guard(suite_factory: Callable[[bool], Suite]) -> None:
    """Entry point of a bench script: builds the suite (smoke or full) and runs it."""
    args = parse_args()
    suite = suite_factory(args.smoke)
    run(suite, sys.argv[1:])
