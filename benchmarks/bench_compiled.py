"""Compiled programs with and without opselect: torch.compile of a small function around each op.

Every case is one call of an op with a neighbour op on each side (a scale before, an add after;
for integers an add, for bools a not), the way a model's graph holds it: inductor fuses the
neighbours into its own kernel for permute and softmax, which an opaque op prevents. Timed
(median of do_bench, ms):

  eager       the torch function, not compiled
  inductor    torch.compile of the torch function (no opselect)
  opselect    torch.compile of the same function calling opselect.ops.*: each call is the aten op
              or opselect's op, as opselect/library.py decides at trace time ("placed")

When the trace-time rule keeps the aten op, the compiled graph is inductor's own, so `opselect`
is not compiled again: its time is inductor's (placed = aten). The target (issue 15): compiling
with opselect is never more than 3% slower than compiling without it, on every case.

Cases: the shapes of issue 15 and every case of benchmarks/bench_<op>.py (--ops, --filter,
--issue-only, --part i/n choose some). Decisions come from the cost model (an empty tune cache)
unless --warm measures every case first (`opselect warm`). --rule dispatcher places opselect's op
wherever the dispatcher picks a Triton backend (to see what the rule saves). Results go to
benchmarks/results/<gpu>/compiled.{json,md} (--merge folds a partial run into them) and $OUT.

    python benchmarks/bench_compiled.py --issue-only            # 12 cases, a few minutes
    python benchmarks/bench_compiled.py --ops topk,isin --merge
    python benchmarks/bench_compiled.py --smoke                 # tiny, CPU, aot_eager
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_isin  # noqa: E402
import bench_permute  # noqa: E402
import bench_softmax  # noqa: E402
import bench_topk  # noqa: E402
from harness import RESULTS, Case, gpu_slug, save_result, timer  # noqa: E402

import opselect  # noqa: E402
from opselect import library, ops  # noqa: E402
from opselect.dispatch import get_op  # noqa: E402

f16, bf16, f32, i64, u8 = torch.float16, torch.bfloat16, torch.float32, torch.int64, torch.uint8
M = 1 << 20
# The shapes issue 15 measured inductor on (H200): (op, case).
ISSUE = [
    ("permute", bench_permute._case((64, 197, 12, 64), f16, (0, 2, 1, 3), {})),
    ("permute", bench_permute._case((8192, 8192), f32, (1, 0), {})),
    ("permute", bench_permute._case((8, 4096, 40, 128), bf16, (0, 2, 1, 3), {})),
    ("permute", bench_permute._case((32, 224, 224, 3), u8, (0, 3, 1, 2), {})),
    ("softmax", bench_softmax._forward_case((16384, 32000), -1, bf16, None)),
    ("softmax", bench_softmax._forward_case((4096, 4096), -1, f32, None)),
    ("softmax", bench_softmax._forward_case((8192, 50257), -1, f16, None)),
    ("softmax", bench_softmax._forward_case((4096, 128256), -1, bf16, None)),
    ("topk", bench_topk._case((16_000_000,), f32, 64, {})),
    ("topk", bench_topk._case((4096, 32_000), bf16, 50, {})),
    ("isin", bench_isin._case(16 * M, 1_000_000, i64, "wide")),
    ("isin", bench_isin._case(16 * M, 1024, i64, "wide")),
]
SUITES = {"isin": bench_isin, "topk": bench_topk, "permute": bench_permute,
          "softmax": bench_softmax}
TOL = {f16: 4e-3, bf16: 2e-2, f32: 1e-4, torch.float64: 1e-8}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="tiny cases on any device (CI)")
    p.add_argument("--ops", default="isin,topk,permute,softmax", help="comma list of ops")
    p.add_argument("--filter", default="", help="only cases whose name contains this (a|b)")
    p.add_argument("--issue-only", action="store_true", help="only issue 15's shapes")
    p.add_argument("--part", default="", help="i/n: every n-th case from the i-th")
    p.add_argument("--deadline-s", type=float, default=0.0,
                   help="start no case after this many seconds (the rest are listed)")
    p.add_argument("--rule", default="auto", choices=library._RULES,
                   help="opselect.library.COMPILED_RULE for the opselect provider")
    p.add_argument("--warm", action="store_true", help="tune every case before compiling")
    p.add_argument("--backend", default="", help="torch.compile backend (default inductor; "
                   "aot_eager with --smoke)")
    p.add_argument("--rep-ms", type=float, default=60.0)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--no-save", action="store_true")
    p.add_argument("--merge", action="store_true",
                   help="fold this run's rows into the saved results (by case)")
    return p.parse_args(argv)


# ---------------------------------------------------------------------------------------------
# The functions compiled: neighbour, op, neighbour
# ---------------------------------------------------------------------------------------------
def _before(t: torch.Tensor) -> torch.Tensor:
    if t.dtype == torch.bool:
        return ~t
    if t.dtype.is_floating_point or t.is_complex():
        return t * 2
    return t + 1


def _after(t: torch.Tensor) -> torch.Tensor:
    return ~t if t.dtype == torch.bool else t + 1


def functions(op: str, args: tuple, kwargs: dict, backend: str | None):
    """(tensors, torch function, opselect function, chooser call for fake tensors)."""
    if op == "softmax":
        (x,), dim, dtype = args, kwargs.get("dim", -1), kwargs.get("dtype")
        return ((x,), lambda t: _after(torch.softmax(_before(t), dim, dtype=dtype)),
                lambda t: _after(ops.softmax(_before(t), dim, dtype=dtype, backend=backend)),
                lambda t: torch.ops.opselect.softmax_or_aten(t, dim, dtype, backend))
    if op == "topk":
        (x, k) = args
        dim, largest = kwargs.get("dim", -1), kwargs.get("largest", True)
        sorted_ = kwargs.get("sorted", True)

        def torch_fn(t):
            v, i = torch.topk(_before(t), k, dim, largest, sorted_)
            return _after(v), i

        def opselect_fn(t):
            v, i = ops.topk(_before(t), k, dim, largest, sorted_, backend=backend)
            return _after(v), i

        return ((x,), torch_fn, opselect_fn,
                lambda t: torch.ops.opselect.topk_or_aten(t, k, dim, largest, sorted_, backend))
    if op == "isin":
        (a, b) = args
        return ((a, b), lambda p, q: ~torch.isin(_before(p), q),
                lambda p, q: ~ops.isin(_before(p), q, backend=backend),
                lambda p, q: torch.ops.opselect.isin_or_aten(p, q, False, False, backend))
    (x, dims) = args
    return ((x,), lambda t: _after(_before(t).permute(dims).contiguous()),
            lambda t: _after(ops.permute(_before(t), dims, backend=backend)),
            lambda t: torch.ops.opselect.permute_or_aten(t, list(dims), backend))


def placement(op: str, chooser: Callable, tensors: tuple) -> str:
    """Where the trace-time rule puts this call ("aten" or "opselect"), asked on fake tensors."""
    before = dict(opselect.stats().get(op, {}).get("traced", {}))
    with FakeTensorMode() as mode:
        chooser(*(mode.from_tensor(t) for t in tensors))
    after = opselect.stats()[op]["traced"]
    return "opselect" if after.get("opselect", 0) > before.get("opselect", 0) else "aten"


def compare(got, want) -> str | None:
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    for g, w in zip(got[:1], want[:1]):  # topk: the values (tied indices may differ)
        if g.shape != w.shape or g.dtype != w.dtype:
            return f"shape/dtype {tuple(g.shape)} {g.dtype}, expected {tuple(w.shape)} {w.dtype}"
        if g.dtype in TOL:
            try:
                torch.testing.assert_close(g, w, rtol=TOL[g.dtype], atol=TOL[g.dtype],
                                           equal_nan=True)
            except AssertionError as exc:
                return str(exc).splitlines()[0][:200]
        elif not torch.equal(g, w):
            return f"{int((g != w).sum())} of {w.numel()} elements differ"
    return None


def _forced_backend(op: str, args: tuple, kwargs: dict) -> str | None:
    """The first Triton backend that takes the call (--smoke: opselect's op in every graph)."""
    o = get_op(op)
    call = o.prepare(*args, **kwargs)
    able = [c.name for c in o.plan(call) if c.supported and c.name != "torch"]
    return able[0] if able else None


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------
def cases(args: argparse.Namespace) -> list[tuple[str, Case]]:
    wanted = [o for o in args.ops.split(",") if o]
    if args.smoke:
        chosen = [(op, c) for op in wanted for c in SUITES[op].suite(True).cases]
    else:
        chosen = [(op, c) for op, c in ISSUE if op in wanted]
        if not args.issue_only:
            names = {c.name for _, c in chosen}
            chosen += [(op, c) for op in wanted for c in SUITES[op].suite(False).cases
                       if c.name not in names]
    if args.filter:
        chosen = [(op, c) for op, c in chosen if any(f in f"{op} {c.name}"
                                                    for f in args.filter.split("|"))]
    if args.part:
        i, n = (int(v) for v in args.part.split("/"))
        chosen = chosen[i - 1::n]
    return chosen


def run_case(op: str, case: Case, device: torch.device, args: argparse.Namespace,
             time_ms: Callable, backend_name: str) -> dict:
    torch.manual_seed(0)
    (a, kw) = case.make(device)
    forced = _forced_backend(op, a, kw) if args.smoke else None
    tensors, torch_fn, opselect_fn, chooser = functions(op, a, kw, forced)
    row: dict[str, Any] = {"op": op, "case": case.name, **case.tags, "ms": {}, "errors": {},
                           "forced": forced}
    if args.warm:
        from opselect.warm import warm_call

        warm_call(op, a, kw)
        opselect.forget()
    library.COMPILED_RULE = args.rule
    row["placed"] = placement(op, chooser, tensors)
    want = torch_fn(*tensors)
    providers = {"eager": torch_fn}
    torch._dynamo.reset()
    providers["inductor"] = torch.compile(torch_fn, backend=backend_name)
    if row["placed"] == "opselect" or args.smoke:
        providers["opselect"] = torch.compile(opselect_fn, backend=backend_name)
    for name, fn in providers.items():
        try:
            err = compare(fn(*tensors), want)
            if err:
                row["errors"][name] = err
                print(f"  !! {op} {case.name}: {name} is WRONG: {err}", flush=True)
                continue
            row["ms"][name] = time_ms(lambda fn=fn: fn(*tensors))
        except Exception as exc:  # noqa: BLE001 - a failing provider is reported, not fatal
            row["errors"][name] = f"{type(exc).__name__}: {str(exc)[:300]}"
            print(f"  !! {op} {case.name}: {name} failed: {row['errors'][name]}", flush=True)
    if "opselect" not in providers and "inductor" in row["ms"]:
        row["ms"]["opselect"] = row["ms"]["inductor"]  # the same graph: the aten op was kept
    _derive(row)
    torch._dynamo.reset()
    return row


def _derive(row: dict) -> None:
    ms = row["ms"]
    if ms.get("opselect") and ms.get("inductor"):
        row["opselect_over_inductor"] = ms["opselect"] / ms["inductor"]
    if ms.get("opselect") and ms.get("eager"):
        row["eager_over_opselect"] = ms["eager"] / ms["opselect"]


def summarise(rows: list[dict]) -> dict:
    ratios = {r["op"] + " " + r["case"]: r.get("opselect_over_inductor") for r in rows}
    measured = {k: v for k, v in ratios.items() if v is not None}
    placed = [r.get("opselect_over_inductor") for r in rows
              if r.get("placed") == "opselect" and r.get("opselect_over_inductor")]
    worst = max(measured.values(), default=None)
    return {
        "cases": len(rows),
        "placed_opselect": sum(r.get("placed") == "opselect" for r in rows),
        "worst_opselect_over_inductor": worst,
        "cases_more_than_3pct_slower_than_inductor":
            {k: v for k, v in measured.items() if v > 1.03},
        "geomean_inductor_over_opselect_where_placed":
            math.exp(-sum(map(math.log, placed)) / len(placed)) if placed else None,
        "target_never_3pct_slower_met": None if worst is None else bool(worst <= 1.03),
        "wrong_or_failed": {r["op"] + " " + r["case"]: r["errors"] for r in rows if r["errors"]},
    }


def markdown(result: dict) -> str:
    out = [f"# Compiled programs with and without opselect on {result['device']}", "",
           f"torch {result['torch']}, triton {result['triton']}, opselect {result['opselect']}, "
           f"{result['date']}; torch.compile backend `{result['backend']}`, rule "
           f"`{result['rule']}`, decisions from {'a warmed cache' if result['warm'] else 'the cost model'}. "
           "Median ms of do_bench. Each case is `neighbour(op(neighbour(x)))`; `placed` is where "
           "the trace-time rule put the op (aten: the graph is inductor's own, timed once).", "",
           "| op | case | eager | inductor | opselect | placed | opselect / inductor |",
           "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        ms = r["ms"]
        cells = ["-" if ms.get(k) is None else f"{ms[k]:.4g}"
                 for k in ("eager", "inductor", "opselect")]
        ratio = r.get("opselect_over_inductor")
        out.append(f"| {r['op']} | {r['case']} | " + " | ".join(cells) +
                   f" | {r.get('placed', '-')}{' (' + r['forced'] + ')' if r.get('forced') else ''}"
                   f" | {'-' if ratio is None else f'{ratio:.3f}'} |")
    out += ["", "## Summary", ""]
    for k, v in result["summary"].items():
        out.append(f"- {k}: {f'{v:.3f}' if isinstance(v, float) else v}")
    return "\n".join(out) + "\n"


def main(argv=None) -> dict:
    args = parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    backend_name = args.backend or ("aot_eager" if args.smoke else "inductor")
    os.environ["OPSELECT_CACHE_DIR"] = tempfile.mkdtemp(prefix="opselect-bench-compiled-")
    from opselect.tune_cache import reset

    reset()
    opselect.forget()
    time_ms = timer(device, args.rep_ms, args.repeat)
    slug = gpu_slug(device)
    rows, left, started = [], [], time.monotonic()
    for op, case in cases(args):
        if args.deadline_s and time.monotonic() - started > args.deadline_s:
            left.append(f"{op} {case.name}")
            continue
        row = run_case(op, case, device, args, time_ms, backend_name)
        rows.append(row)
        ms = " ".join(f"{k}={v:.4g}" for k, v in row["ms"].items())
        print(f"{op:<8} {case.name:<40} {row['placed']:<8} {ms}", flush=True)
        if os.environ.get("OUT"):
            Path(os.environ["OUT"], "compiled.rows.json").write_text(json.dumps(rows, indent=1))
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if left:
        print(f"# past the deadline, not run: {'|'.join(left)}", flush=True)
    path = RESULTS / slug / "compiled.json"
    if args.merge and path.exists():
        saved = {(r["op"], r["case"]): r for r in json.loads(path.read_text())["rows"]}
        saved.update({(r["op"], r["case"]): r for r in rows})
        rows = list(saved.values())
    import triton

    result = {"device": torch.cuda.get_device_name(device) if device.type == "cuda"
              else "cpu (interpreter)", "gpu": slug, "torch": torch.__version__,
              "triton": triton.__version__, "python": platform.python_version(),
              "opselect": opselect.__version__, "date": time.strftime("%Y-%m-%d"),
              "backend": backend_name, "rule": args.rule, "warm": args.warm,
              "smoke": args.smoke, "summary": summarise(rows), "rows": rows}
    md = markdown(result)
    save_result("compiled", result, md, slug, not args.no_save and not args.smoke)
    print(md)
    return result


if __name__ == "__main__":
    main()
