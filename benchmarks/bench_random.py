"""Random calls (issue 16 item 3): how auto's choices fare on calls no suite was written for.

    python benchmarks/bench_random.py                  # 60 calls per op; fit seed 0, report 1
    python benchmarks/bench_random.py --ops topk       # one op (writes random_topk.{json,md})
    TRITON_INTERPRET=1 python benchmarks/bench_random.py --smoke --no-save   # a few tiny calls, CPU

A run too long for one GPU session goes in parts: the fit seed once (any run leaves its rows in
$OUT/random.fit.rows.json), then `--fit-from <that file> --part i/n` for each part of the report
seed, then `--merge <part results>` (no GPU time) for the summary of the whole.

For every op, --calls calls are drawn from the distribution below with a seeded random.Random
(one stream per op and seed, so --ops picks the same calls as a full run) and a torch seed per
call for the values. Each call is timed, by tuning_mode.time_interleaved (blocks of back-to-back
calls between two synchronisations, the providers taking turns, median over rounds; host time
counts where a call is host-bound), for:

  torch          the plain torch op (also the `torch` backend's time)
  <backend>      every other backend that supports the call, run with its tuned config
                 (Op.decide(call, tune=True) on an empty tune cache), through its prepared
                 call as auto runs it (since 2026-11-29; before, through Backend.run)
  auto-cold      the public op, decided by the unfitted cost model (empty tune cache)
  auto-fitted    the same, with the model fitted on --fit-seed (report seed only)
  auto-tuned     the public op after one call in tuning mode (the call's bucket measured)
  pick-cold/...  a cold pick run with the default config it gets, when that is not its tuned one

Regret = time of the backend (and config) a mode picks / the best backend's time. The fit: per
"op/backend", scale = old scale x geometric mean of measured / predicted over --fit-seed's calls,
laid over the live model with device_model.with_calibration; the report seed's cold column is
that model's choice, and the unfitted model's is reported next to it.

The distribution (sizes log-uniform in [lo, hi]; a fraction TINY = 20% of the calls is drawn
from the tiny, host-bound ranges instead of the main ones; --smoke uses the smoke ranges):

  isin     elements M: main [2^10, 2^24], tiny [1, 2^12]; test set N: main [1, 2^22], tiny
           [1, 256]. dtype int64 .35, int32 .30, float32 .15, int16/uint8/float16/float64 .05
           each. values wide/narrow 50/50 (op.sample), invert 20%. Elements 1-d, or 2-d (30%);
           contiguous 85%, a stride-2 slice 7.5%, a transposed 2-d view 7.5%.
  topk     rows (R, N), dim -1 (75%): R [1, 2^14], N [8, 2^18], R N <= 2^26; one long row (15%):
           N [2^18, 2^26]; a middle dim (10%): (B, N, C), dim 1. Tiny: R [1, 64], N [2, 1024].
           k log-uniform in [1, min(N, 4096)]. dtype float32 .45, bfloat16 .25, float16 .15,
           int32/int64/float64 .05 each; values randn .7, uniform .15, ties .15; largest 85%,
           sorted 80%. 2-d rows: contiguous 80%, transposed view (strided rows) 10%, a slice
           x[:, :N] of wider rows 10%.
  permute  numel: main [2^12, 2^26], tiny [4, 2^12], split over rank 2/3/4/5 (.35/.30/.25/.10)
           dims with log-uniform shares; dims a random non-identity permutation, keeping the
           last dim in 30% of rank >= 3 calls. dtype float32 .30, bfloat16 .20, float16 .15,
           uint8 .10, int32/int64/float64/bool .05 each. Input contiguous 80%, itself a permuted
           view 10% (never one the permutation makes contiguous), a slice of its last dim 10%.
  softmax  log_softmax in 30% of calls. Rows (R, N) dim -1 (70%), (outer, N, inner) dim 1 (20%),
           (N, C) dim 0 (10%); R / outer x inner [1, 2^16], N [2, 2^17], numel <= 2^26; tiny:
           numel <= 2^12. dtype float32 .40, bfloat16 .35, float16 .20, float64 .05; dtype=
           float32 for 16-bit inputs 10%. 2-d rows: contiguous 80%, transposed view 10%, slice
           of wider rows 10%.

No call runs under autograd. Inputs are checked once against torch before timing; a wrong or
failing provider is printed with "!!" and not timed. Tuning's first stage here measures each
config for --tune-budget-ms (default 10 ms; the library's is 40) and first runs stay in-process
(OPSELECT_TUNE_ISOLATE=0), to keep the GPU run within minutes. Results:
benchmarks/results/<gpu>/random.{json,md} (random_<ops>.* for a subset of --ops), and $OUT.
"""

from __future__ import annotations

import argparse
import atexit
import functools
import json
import math
import os
import random
import shutil
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any, Callable

# The cold column needs an empty tune cache and the live model's defaults: point the cache at a
# fresh directory (never tuned into) and drop layers and switches that would change the chain,
# all before opselect is imported (some are read at import).
_WORK = tempfile.mkdtemp(prefix="opselect-random-")
_COLD_DIR = tempfile.mkdtemp(prefix="cold-", dir=_WORK)
# Registered before opselect's own atexit flush of queued cache writes, so it runs after it.
atexit.register(shutil.rmtree, _WORK, ignore_errors=True)
os.environ["OPSELECT_CACHE_DIR"] = _COLD_DIR
for _name in ("OPSELECT_CACHE_PATH", "OPSELECT_CACHE_REMOTE", "OPSELECT_TUNE", "OPSELECT_FREEZE"):
    os.environ.pop(_name, None)
# The benchmark trusts its backends (a crash is a finding); the helper process would compile
# every kernel a second time.
os.environ.setdefault("OPSELECT_TUNE_ISOLATE", "0")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

import opselect  # noqa: E402
from opselect.dispatch import get_op  # noqa: E402
from opselect.dispatch import tuning_mode  # noqa: E402
from opselect.dispatch.op import fresh_decisions  # noqa: E402
from opselect.dispatch.device import device_info  # noqa: E402
from opselect.heuristics import device_model  # noqa: E402

OPS = ("isin", "topk", "permute", "softmax")
TINY = 0.2
DTYPES = {
    "isin": {"int64": .35, "int32": .30, "float32": .15, "int16": .05, "uint8": .05,
             "float16": .05, "float64": .05},
    "topk": {"float32": .45, "bfloat16": .25, "float16": .15, "int32": .05, "int64": .05,
             "float64": .05},
    "permute": {"float32": .30, "bfloat16": .20, "float16": .15, "uint8": .10, "int32": .05,
                "int64": .05, "float64": .05, "bool": .05},
    "softmax": {"float32": .40, "bfloat16": .35, "float16": .20, "float64": .05},
}
# (lo, hi) of each size by scale; "smoke" keeps the interpreter fast.
RANGES = {
    "isin": {"main": {"m": (2**10, 2**24), "n": (1, 2**22)},
             "tiny": {"m": (1, 2**12), "n": (1, 256)},
             "smoke": {"m": (1, 300), "n": (1, 40)}},
    "topk": {"main": {"r": (1, 2**14), "n": (8, 2**18), "long": (2**18, 2**26), "numel": 2**26,
                      "k": 4096},
             "tiny": {"r": (1, 64), "n": (2, 1024), "long": (2, 1024), "numel": 2**16, "k": 4096},
             "smoke": {"r": (1, 4), "n": (2, 300), "long": (2, 600), "numel": 1200, "k": 16}},
    "permute": {"main": {"numel": (2**12, 2**26)}, "tiny": {"numel": (4, 2**12)},
                "smoke": {"numel": (4, 600)}},
    "softmax": {"main": {"r": (1, 2**16), "n": (2, 2**17), "numel": 2**26},
                "tiny": {"r": (1, 64), "n": (2, 256), "numel": 2**12},
                "smoke": {"r": (1, 8), "n": (2, 64), "numel": 400}},
}


# ---------------------------------------------------------------------------------------------
# Drawing calls
# ---------------------------------------------------------------------------------------------
def _logu(rng: random.Random, lo: int, hi: int) -> int:
    return max(lo, min(hi, round(math.exp(rng.uniform(math.log(lo), math.log(hi))))))


def _pick(rng: random.Random, weights: dict) -> Any:
    return rng.choices(list(weights), weights=list(weights.values()))[0]


def _split(rng: random.Random, numel: int, rank: int) -> list[int]:
    """numel spread over rank dims with log-uniform shares (each dim >= 1)."""
    shares = [rng.random() + 1e-3 for _ in range(rank)]
    total = sum(shares)
    return [max(1, round(numel ** (s / total))) for s in shares]


def draw(op: str, rng: random.Random, smoke: bool) -> dict:
    """One call's description (JSON-able); make() turns it into tensors."""
    scale = "smoke" if smoke else ("tiny" if rng.random() < TINY else "main")
    size = RANGES[op][scale]
    dtype = _pick(rng, DTYPES[op])
    spec: dict[str, Any] = {"op": op, "scale": scale, "dtype": dtype}
    if op == "isin":
        m, n = _logu(rng, *size["m"]), _logu(rng, *size["n"])
        layout = _pick(rng, {"contiguous": .85, "strided": .075, "transposed": .075})
        two_d = layout == "transposed" or (layout == "contiguous" and rng.random() < .3)
        a = _logu(rng, 1, max(1, int(math.sqrt(m)))) if two_d else 1
        shape = [a, max(1, m // a)] if two_d else [m]
        spec.update(shape=shape, n=n, layout=layout, values=_pick(rng, {"wide": .5, "narrow": .5}),
                    invert=rng.random() < .2)
    elif op == "topk":
        kind = _pick(rng, {"rows": .75, "long": .15, "middle": .10})
        n = _logu(rng, *(size["long"] if kind == "long" else size["n"]))
        r = 1 if kind == "long" else min(_logu(rng, *size["r"]), max(1, size["numel"] // n))
        if kind == "middle":
            b = _logu(rng, 1, r)
            shape, dim = [b, n, max(1, r // b)], 1
        else:
            shape, dim = ([n] if kind == "long" else [r, n]), -1
        layout = _pick(rng, {"contiguous": .8, "transposed": .1, "sliced": .1}) \
            if kind == "rows" else "contiguous"
        spec.update(shape=shape, dim=dim, k=_logu(rng, 1, min(n, size["k"])), layout=layout,
                    largest=rng.random() < .85, sorted=rng.random() < .8,
                    values=_pick(rng, {"randn": .7, "uniform": .15, "ties": .15}))
    elif op == "permute":
        rank = _pick(rng, {2: .35, 3: .30, 4: .25, 5: .10})
        shape = _split(rng, _logu(rng, *size["numel"]), rank)
        keep = rank >= 3 and rng.random() < .3
        dims = list(range(rank))
        while dims == sorted(dims):  # the identity is a no-op copy, not a permute
            head = dims[:-1] if keep else dims
            rng.shuffle(head)
            dims = head + ([rank - 1] if keep else [])
        layout = _pick(rng, {"contiguous": .8, "permuted": .1, "sliced": .1})
        if layout == "permuted" and rank == 2:
            layout = "sliced"  # a transposed 2-d input is the one layout (1, 0) makes contiguous
        spec.update(shape=shape, dims=dims, layout=layout)
        if layout == "permuted":
            order = list(range(rank))
            # A layout the permutation undoes would make torch's copy a free view.
            while order == sorted(order) or order == dims:
                rng.shuffle(order)
            spec["layout_dims"] = order
        elif layout == "sliced":
            spec["pad"] = _logu(rng, 1, max(1, shape[-1]))
    else:
        log = rng.random() < .3
        geometry = _pick(rng, {"rows": .7, "middle": .2, "first": .1})
        n = _logu(rng, *size["n"])
        r = min(_logu(rng, *size["r"]), max(1, size["numel"] // n))
        if geometry == "middle":
            outer = _logu(rng, 1, r)
            shape, dim = [outer, n, max(1, r // outer)], 1
        else:
            shape, dim = ([r, n], -1) if geometry == "rows" else ([n, r], 0)
        layout = _pick(rng, {"contiguous": .8, "transposed": .1, "sliced": .1}) \
            if geometry == "rows" else "contiguous"
        out = "float32" if dtype in ("float16", "bfloat16") and rng.random() < .1 else None
        spec.update(op="log_softmax" if log else "softmax", shape=shape, dim=dim,
                    out_dtype=out, layout=layout)
    return spec


def describe(spec: dict) -> str:
    shape = "x".join(map(str, spec["shape"]))
    dt = spec["dtype"]
    op = spec["op"]
    lay = "" if spec.get("layout", "contiguous") == "contiguous" else f" [{spec['layout']}]"
    if op == "isin":
        return (f"isin {shape} in {spec['n']} {dt} {spec['values']}"
                f"{' invert' if spec['invert'] else ''}{lay}")
    if op == "topk":
        flags = ("" if spec["largest"] else " smallest") + ("" if spec["sorted"] else " unsorted")
        return f"topk {shape} dim={spec['dim']} k={spec['k']} {dt}{flags} {spec['values']}{lay}"
    if op == "permute":
        return f"permute {shape} {dt} {''.join(map(str, spec['dims']))}{lay}"
    cast = f"->{spec['out_dtype']}" if spec["out_dtype"] else ""
    return f"{op} {shape} dim={spec['dim']} {dt}{cast}{lay}"


def _base(shape: list, layout: str) -> list:
    """The shape to sample for a 2-d rows view: transposed (strided rows) or sliced (gaps)."""
    return shape[::-1] if layout == "transposed" else \
        [shape[0], 2 * shape[1]] if layout == "sliced" else shape


def _view(x: torch.Tensor, shape: list, layout: str) -> torch.Tensor:
    return x.t() if layout == "transposed" else x[:, :shape[1]] if layout == "sliced" else x


def make(spec: dict, device: torch.device) -> tuple[tuple, dict]:
    """(args, kwargs) of the public op and of torch's, from op.sample plus the layout."""
    op = get_op(spec["op"])
    dtype = getattr(torch, spec["dtype"])
    shape, layout = list(spec["shape"]), spec.get("layout", "contiguous")
    if spec["op"] == "isin":
        base = [[2 * shape[0]]] if layout == "strided" else \
            [shape[::-1]] if layout == "transposed" else [shape]
        (e, t), kw = op.sample(base + [[spec["n"]]], dtype,
                               {"values": spec["values"], "invert": spec["invert"]}, device)
        e = e[::2] if layout == "strided" else e.t() if layout == "transposed" else e
        return (e, t), kw
    if spec["op"] == "topk":
        (x, _), _ = op.sample([_base(shape, layout)], dtype, {"k": 1, "values": spec["values"]},
                              device)
        kw = {"dim": spec["dim"], "largest": spec["largest"], "sorted": spec["sorted"]}
        return (_view(x, shape, layout), spec["k"]), kw
    if spec["op"] == "permute":
        options: dict[str, Any] = {"dims": spec["dims"]}
        if layout == "permuted":
            options.update(layout="permuted", layout_dims=spec["layout_dims"])
        base = shape[:-1] + [shape[-1] + spec["pad"]] if layout == "sliced" else shape
        (x, dims), _ = op.sample([base], dtype, options, device)
        if layout == "sliced":
            x = x[..., :shape[-1]]
        return (x, list(dims)), {}
    options = {"dim": spec["dim"]}
    if spec["out_dtype"]:
        options["out_dtype"] = spec["out_dtype"]
    (x,), kw = op.sample([_base(shape, layout)], dtype, options, device)
    return (_view(x, shape, layout),), kw


def torch_fn(op: str) -> Callable[..., Any]:
    return {"isin": torch.isin, "topk": torch.topk, "softmax": torch.softmax,
            "log_softmax": torch.log_softmax,
            "permute": lambda x, dims: x.permute(dims).contiguous()}[op]


def checker(op: str) -> Callable[[Any, Any, Any], str | None]:
    """Each op's suite check (the bench_<op>.py next to this one)."""
    import importlib

    return importlib.import_module(f"bench_{'softmax' if 'softmax' in op else op}").check


# ---------------------------------------------------------------------------------------------
# One call
# ---------------------------------------------------------------------------------------------
def _point_cache(path: str) -> None:
    from opselect.tune_cache import reset

    os.environ["OPSELECT_CACHE_DIR"] = path
    reset()


# Each mode (cold, fitted, tuned) gets its own set of the Op's in-process decisions
# (Op.decisions), which its timed closure puts in place before the call: three attribute stores
# (~60 ns) on a path of microseconds.


def _decide_auto(op, public, a, kw, call) -> tuple[tuple, dict]:
    """Run the public op once with empty memos: (the memos it filled, the pick)."""
    memos = fresh_decisions()
    op.decisions = memos
    public(*a, **kw)
    choice = op.chosen(call)
    if choice is None:  # answered without dispatch: a permute whose view is contiguous, as torch
        return memos, {"backend": "torch", "config": {}, "source": "view"}
    return memos, {"backend": choice.backend.name, "config": dict(choice.config),
                   "source": choice.source}


def run_call(spec: dict, index: int, seed: int, device: torch.device, fitted, args,
             time_fns) -> dict:
    op = get_op(spec["op"])
    public = getattr(opselect.ops, spec["op"])
    torch.manual_seed(zlib.crc32(f"{spec['op']}/{seed}/{index}".encode()))
    a, kw = make(spec, device)
    reference = torch_fn(spec["op"])
    ref = reference(*a, **kw)
    call = op.prepare(*a, **kw)
    info = call.info
    live = device_model.model_for(info)
    row: dict[str, Any] = {"op": spec["op"], "group": spec.get("group", spec["op"]),
                           "index": index, "call": describe(spec), "spec": spec,
                           "s": {}, "errors": {}, "picks": {}}
    plan = op.plan(call, live)
    able = [c.name for c in plan if c.supported]
    row["predicted_s"] = {c.name: c.predicted_s for c in plan if c.supported}
    memos = {}
    memos["cold"], row["picks"]["cold"] = _decide_auto(op, public, a, kw, call)
    if fitted is not None:
        row["predicted_fitted_s"] = {c.name: c.predicted_s for c in op.plan(call, fitted)
                                     if c.supported}
        device_model._models[info.cache_key] = fitted
        try:
            memos["fitted"], row["picks"]["fitted"] = _decide_auto(op, public, a, kw, call)
        finally:
            device_model._models[info.cache_key] = live
    tuned_dir = tempfile.mkdtemp(prefix="tuned-", dir=_WORK)
    _point_cache(tuned_dir)
    try:
        decision = op.decide(call, tune=True)
        with opselect.tuning():
            memos["tuned"], row["picks"]["tuned"] = _decide_auto(op, public, a, kw, call)
    finally:
        _point_cache(_COLD_DIR)
        shutil.rmtree(tuned_dir, ignore_errors=True)
    configs = {c.name: dict(c.config if c.config is not None
                            else op.backend(c.name).configs(call)[0])
               for c in decision.candidates if c.supported}
    row["tuned_configs"] = configs
    row["tuning_measured_s"] = {c.name: c.measured_s for c in decision.candidates if c.supported}

    fns: dict[str, Callable[[], Any]] = {"torch": lambda: reference(*a, **kw)}
    for name in able:
        if name != "torch":
            fns[name] = _as_auto_runs(op, name, call, configs[name])
    for mode, memo in memos.items():
        def auto(memo=memo):
            op.decisions = memo  # this mode's decisions
            return public(*a, **kw)
        fns[f"auto-{mode}"] = auto
        pick = row["picks"][mode]
        if pick["backend"] != "torch" and pick["config"] != configs.get(pick["backend"]):
            fns[f"pick-{mode}"] = _as_auto_runs(op, pick["backend"], call, pick["config"])
    check = checker(spec["op"])
    good = {}
    for name, fn in fns.items():
        try:
            err = check(fn(), ref, (a, kw))
        except Exception as exc:  # noqa: BLE001 - a failing provider is reported, the run goes on
            err = f"{type(exc).__name__}: {str(exc)[:300]}"
        if err:
            row["errors"][name] = err
            print(f"  !! {row['call']}: {name}: {err}", flush=True)
        else:
            good[name] = fn
    times = time_fns([(f"{spec['op']} {name}", fn) for name, fn in good.items()], device,
                     rounds=args.rounds)
    # Each (host, device) apart; "s" keeps the steady-state eager time, the larger of the two.
    row["s"] = {name: (max(t) if math.isfinite(max(t)) else None) for name, t in zip(good, times)}
    row["host_s"] = {name: (t[0] if math.isfinite(t[0]) else None) for name, t in zip(good, times)}
    row["device_s"] = {name: (t[1] if math.isfinite(t[1]) else None)
                       for name, t in zip(good, times)}
    op.decisions = fresh_decisions()
    _derive(row, able)
    return row


def _as_auto_runs(op, name: str, call, config) -> Callable[[], Any]:
    """A backend under a config, timed as auto runs it: its prepared call (Backend.bind: the
    plan, grid and bound launches worked out once) where it has one, else its run(). Timing
    run() instead charged every call the plan and Triton's argument binding (a tiny softmax's
    multirow: 38 us against 15 prepared, H200, 2026-11-29), which auto never pays: regrets of
    up to 3.5x that auto's own time did not show."""
    backend = op.backend(name)
    prepared = backend.bind(call, config)
    if prepared is None:
        return functools.partial(backend.run, call, config)
    tensors = call.inputs()
    return lambda: prepared(*tensors)


def _derive(row: dict, able: list[str]) -> None:
    s = row["s"]
    backends = {b: s[b] for b in able if s.get(b) is not None}
    if not backends:
        return
    row["best"] = min(backends, key=backends.get)
    best = backends[row["best"]]
    row["regret"] = {}
    for mode, pick in row["picks"].items():
        t = s.get(f"pick-{mode}", backends.get(pick["backend"]))
        if t is not None and f"pick-{mode}" not in row["errors"]:
            row["regret"][mode] = t / best
    ratios = {}
    for mode in row["picks"]:
        if s.get(f"auto-{mode}") and s.get("torch"):
            ratios[f"{mode}/torch"] = s[f"auto-{mode}"] / s["torch"]
    for mode in ("cold", "fitted"):
        if s.get("auto-tuned") and s.get(f"auto-{mode}"):
            ratios[f"tuned/{mode}"] = s["auto-tuned"] / s[f"auto-{mode}"]
    row["ratios"] = ratios


# ---------------------------------------------------------------------------------------------
# Fit and summary
# ---------------------------------------------------------------------------------------------
#: Calls whose backends all took less than this are host-bound: left out of the fit. A scale
#: multiplies a whole estimate, and host-bound calls (where the model's host constants decide)
#: made the scales 2x-3x on the H100, which then sent device-bound calls to torch (x2.6).
FIT_MIN_S = 60e-6


# A backend's scale from n rows is pulled toward 1 as n / (n + FIT_PRIOR_ROWS): a fit seed gives
# some backends only a handful of device-bound rows, and a scale of 2.5 from nine of them (topk
# maxima, most of them rows of tied values) moved the next seed's picks more than it corrected.
FIT_PRIOR_ROWS = 6


def fit(rows: list[dict], live) -> tuple[Any, dict, dict]:
    """Per op/backend: old scale x the median of measured / predicted over the device-bound
    rows (the median: one odd row, a tie-heavy call or a noisy timing, does not set the
    scale), shrunk toward 1 where the rows are few."""
    ratios: dict[str, list[float]] = {}
    for r in rows:
        measured = [t for t in r["s"].values() if t]
        if not measured or max(measured) < FIT_MIN_S:
            continue
        for b, p in r.get("predicted_s", {}).items():
            t = r["s"].get(b)
            if t and p and math.isfinite(p) and p > 0:
                ratios.setdefault(f"{r['op']}/{b}", []).append(t / p)
    scales = {k: live.scales.get(k, 1.0)
              * harness._pct(v, .5) ** (len(v) / (len(v) + FIT_PRIOR_ROWS))
              for k, v in sorted(ratios.items())}
    return (device_model.with_calibration(live, {}, scales), scales,
            {k: len(v) for k, v in ratios.items()})


def _stats(xs: list[float]) -> dict:
    xs = [x for x in xs if x is not None]
    return {"n": len(xs), "p50": harness._pct(xs, .5), "p90": harness._pct(xs, .9),
            "max": max(xs, default=None), "geomean": harness._geomean(xs)}


def summarise(rows: list[dict], cold: str) -> dict:
    """cold: the mode reported as cold ("fitted" on the report seed, else "cold")."""
    def reg(mode):
        return [r.get("regret", {}).get(mode) for r in rows]

    def slower(num, den, bound=1.03):
        out = []
        for r in rows:
            n, d = r["s"].get(num), r["s"].get(den)
            if n and d and n > bound * d:
                # The picks say which it is: a worse choice, or (the same pick, or torch
                # picked against torch) the dispatcher's own host time and noise.
                picks = [r["picks"][x[5:]]["backend"] if x.startswith("auto-") else x
                         for x in (num, den)]
                out.append({"call": r["call"], "ratio": n / d, "picks": picks,
                            "same_pick": picks[0] == picks[1] and (
                                den == "torch" or r["picks"][num[5:]] == r["picks"][den[5:]])})
        return out

    s = {"calls": len(rows), "cold_is": "fitted model" if cold == "fitted" else "unfitted model",
         "cold_regret": _stats(reg(cold)), "unfitted_cold_regret": _stats(reg("cold")),
         "tuned_regret": _stats(reg("tuned")),
         "tuned_slower_than_cold": slower("auto-tuned", f"auto-{cold}"),
         "tuned_slower_than_torch": slower("auto-tuned", "torch"),
         "cold_slower_than_torch": slower(f"auto-{cold}", "torch"),
         "errors": {r["call"]: r["errors"] for r in rows if r["errors"]}}
    for key in ("tuned_slower_than_cold", "tuned_slower_than_torch", "cold_slower_than_torch"):
        s[f"n_{key}"] = len(s[key])
    for mode in ("cold", "tuned"):
        m = cold if mode == "cold" else mode
        s[f"{mode}_vs_torch_geomean"] = harness._geomean(
            [r.get("ratios", {}).get(f"{m}/torch") for r in rows])
    c, t = s["cold_regret"], s["tuned_regret"]
    s["targets_met"] = {
        "tuned_never_3pct_slower_than_cold": bool(rows) and not s["tuned_slower_than_cold"],
        "auto_tuned_never_3pct_slower_than_torch": bool(rows) and not s["tuned_slower_than_torch"],
        "auto_cold_never_3pct_slower_than_torch": bool(rows) and not s["cold_slower_than_torch"],
        "cold_regret_p90_le_1.10": harness.at_most(c["p90"], 1.10),
        "cold_regret_max_le_1.5": harness.at_most(c["max"], 1.5),
        "tuned_regret_geomean_le_1.03": harness.at_most(t["geomean"], 1.03),
    }
    return s


def _f(x, digits=3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _us(x) -> str:
    return "-" if x is None else f"{x * 1e6:.1f}"


def markdown(result: dict) -> str:
    rep = result["report"]
    out = [f"# Random calls on {result['device']}", "",
           f"torch {result['torch']}, triton {result['triton']}, opselect {result['opselect']}, "
           f"{result['date']}. Fit on seed {result['fit']['seed']}, report on seed {rep['seed']}; "
           f"timer: {result['timer']}. Times in us per call (back to back); regret = the "
           "pick's time / the best backend's; cold = the fitted model's pick, unfit = the "
           "unfitted model's.", "",
           "| op | calls | cold regret p50 / p90 / max | unfit p90 / max | tuned regret geomean "
           "/ max | tuned > 1.03 cold | tuned > 1.03 torch | cold > 1.03 torch |",
           "|---|---|---|---|---|---|---|---|"]
    for name, s in rep["summary"].items():
        c, u, t = s["cold_regret"], s["unfitted_cold_regret"], s["tuned_regret"]
        out.append(f"| {name} | {s['calls']} | {_f(c['p50'])} / {_f(c['p90'])} / {_f(c['max'])} "
                   f"| {_f(u['p90'])} / {_f(u['max'])} | {_f(t['geomean'])} / {_f(t['max'])} | "
                   f"{s['n_tuned_slower_than_cold']} | {s['n_tuned_slower_than_torch']} | "
                   f"{s['n_cold_slower_than_torch']} |")
    out += ["", "## Targets (all ops)", ""]
    out += [f"- {k}: {v}" for k, v in rep["summary"]["all"]["targets_met"].items()]
    out += ["", "## Calls (report seed)", "",
            "| call | torch | best | cold pick (regret) | unfit pick (regret) | tuned pick "
            "(regret) | cold/torch | tuned/torch | tuned/cold | backends |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rep["rows"]:
        s, g, p, ra = r["s"], r.get("regret", {}), r["picks"], r.get("ratios", {})
        best = r.get("best")

        def pick(mode):
            return f"{p[mode]['backend']} ({_f(g.get(mode), 2)})" if mode in p else "-"

        backends = " ".join(f"{k}={_us(v)}" for k, v in s.items()
                            if not k.startswith(("auto-", "pick-", "torch")))
        out.append(f"| {r['call']} | {_us(s.get('torch'))} | {best or '-'} "
                   f"{_us(s.get(best)) if best else ''} | {pick('fitted')} | {pick('cold')} | "
                   f"{pick('tuned')} | {_f(ra.get('fitted/torch'), 2)} | "
                   f"{_f(ra.get('tuned/torch'), 2)} | {_f(ra.get('tuned/fitted'), 2)} | "
                   f"{backends} |")
    out += ["", "## Fitted scales (measured / predicted, geomean)", ""]
    out += [f"- {k}: {v:.3g} ({result['fit']['samples'][k]} calls)"
            for k, v in result["fit"]["scales"].items()]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------
def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=1, help="the seed reported on")
    p.add_argument("--fit-seed", type=int, default=0, help="the seed the model is fitted on")
    p.add_argument("--calls", type=int, default=0, help="calls per op and seed (60; smoke 3)")
    p.add_argument("--ops", default=",".join(OPS), help=f"comma list of {', '.join(OPS)}")
    p.add_argument("--smoke", action="store_true", help="a few tiny calls (any device)")
    p.add_argument("--no-save", action="store_true", help="do not write benchmarks/results/")
    p.add_argument("--rounds", type=int, default=None, help="rounds of time_interleaved")
    p.add_argument("--deadline-s", type=float, default=0.0,
                   help="start no call after this many seconds (0: no limit); the fit seed "
                        "gets the first 40%% of them: a run that must end in time reports "
                        "on the calls it measured")
    p.add_argument("--part", default="",
                   help="i/n: measure only every n-th call of the report seed from the i-th "
                        "(1-based), to spread a run over several GPU sessions; with --fit-from")
    p.add_argument("--fit-from", default="",
                   help="take the fit seed's rows from this file (a saved result, or "
                        "$OUT/random.fit.rows.json of an earlier run) instead of measuring them")
    p.add_argument("--merge", default="",
                   help="comma list of saved results (parts of one run): measure nothing, "
                        "combine their report rows, summarise and save")
    p.add_argument("--tune-budget-ms", type=float, default=10.0,
                   help="tuning's time per config (0: the library's default)")
    args = p.parse_args(argv)
    args.ops = [o for o in args.ops.split(",") if o]
    bad = [o for o in args.ops if o not in OPS]
    if bad:
        p.error(f"unknown ops {bad}; choose from {', '.join(OPS)}")
    args.calls = args.calls or (3 if args.smoke else 60)
    args.part_index, args.part_count = 0, 1
    if args.part:
        try:
            i, n = (int(v) for v in args.part.split("/"))
        except ValueError:
            p.error(f"--part {args.part!r}: expected i/n, such as 2/3")
        if not 1 <= i <= n:
            p.error(f"--part {args.part!r}: i must be in 1..n")
        args.part_index, args.part_count = i - 1, n
    return args


def _load_rows(path: str, section: str) -> list[dict]:
    """Rows of a saved result's section ("fit" or "report"), or a rows file (a JSON list)."""
    data = json.loads(Path(path).read_text())
    return data if isinstance(data, list) else data[section]["rows"]


def predicted_again(rows: list[dict], info, live) -> list[dict]:
    """Saved fit rows with each backend's estimate from today's model (meta tensors: nothing
    runs). Their stored estimates are the model's of the run that measured them: a scale fitted
    on those would carry the old model's error into the new one."""
    out = []
    for row in rows:
        op = get_op(row["spec"]["op"])
        a, kw = make(row["spec"], torch.device("meta"))
        call = op.prepare(*a, **kw)
        call.info = info
        out.append(dict(row, predicted_s={c.name: c.predicted_s for c in
                                          op.plan(call, live, check_device=False)
                                          if c.supported}))
    return out


def run_seed(seed: int, args, device, fitted, time_fns, started: float, tag: str,
             deadline: float = 0.0) -> list[dict]:
    rows = []
    for op in args.ops:
        rng = random.Random(f"bench_random/{op}/{seed}")
        for i in range(args.calls):
            if tag == "report" and i % args.part_count != args.part_index:
                draw(op, rng, args.smoke)  # (the same stream of calls in every part)
                continue
            if deadline and time.monotonic() - started > deadline:
                print(f"# {tag}: past {deadline:.0f}s, {op} stops after {i} calls", flush=True)
                break
            spec = draw(op, rng, args.smoke)
            spec["group"] = op
            row = run_call(spec, i, seed, device, fitted, args, time_fns)
            rows.append(row)
            g, p = row.get("regret", {}), row["picks"]
            cold = "fitted" if "fitted" in p else "cold"
            print(f"[{tag} {op} {i + 1}/{args.calls} {time.monotonic() - started:6.1f}s] "
                  f"{row['call']}: torch {_us(row['s'].get('torch'))} us, best "
                  f"{row.get('best')} {_us(row['s'].get(row.get('best')))} us; cold "
                  f"{p[cold]['backend']} x{_f(g.get(cold), 2)}, tuned {p['tuned']['backend']} "
                  f"x{_f(g.get('tuned'), 2)}", flush=True)
            if os.environ.get("OUT"):  # what a run killed for time leaves behind
                Path(os.environ["OUT"], f"random.{tag}.rows.json").write_text(
                    json.dumps(rows, indent=1, default=harness._json_default))
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return rows


def main(argv=None) -> dict:
    args = parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.tune_budget_ms > 0:  # Op._measure calls tuning_mode.measure_all by module attribute
        tuning_mode.measure_all = functools.partial(tuning_mode.measure_all,
                                                    budget_ms=args.tune_budget_ms)
    from opselect.dispatch.tuning_mode import time_interleaved as time_fns  # item 1's measure

    timer_name = f"{time_fns.__module__}.{time_fns.__name__}"
    slug = harness.gpu_slug(device)
    started = time.monotonic()
    print(f"# random calls on {slug}: ops {','.join(args.ops)}, {args.calls} calls each, fit seed "
          f"{args.fit_seed}, report seed {args.seed}; timer {timer_name}", flush=True)
    device = torch.empty(0, device=device).device  # cuda:0, as the tensors' calls see it
    live = device_model.model_for(device_info(device))
    measured_on = None  # a merge reports the machine the parts ran on, not this one
    if args.merge:
        paths = [q for q in args.merge.split(",") if q]
        first = json.loads(Path(paths[0]).read_text())
        if isinstance(first, dict):
            measured_on = {key: first[key] for key in ("device", "gpu", "torch", "triton")
                           if key in first}
            slug = measured_on.get("gpu", slug)
        fit_rows = _load_rows(paths[0], "fit")
        fitted, scales, samples = fit(fit_rows, live)
        seen: dict[tuple, dict] = {}
        for path in paths:
            for row in _load_rows(path, "report"):
                seen.setdefault((row["group"], row["index"]), row)
        rows = [seen[k] for k in sorted(seen, key=lambda k: (args.ops.index(k[0])
                                                             if k[0] in args.ops else 99, k[1]))]
    else:
        if args.fit_from:
            fit_rows = predicted_again(_load_rows(args.fit_from, "fit"), device_info(device),
                                       live)
        else:
            fit_rows = run_seed(args.fit_seed, args, device, None, time_fns, started, "fit",
                                0.4 * args.deadline_s)
        fitted, scales, samples = fit(fit_rows, live)
        rows = run_seed(args.seed, args, device, fitted, time_fns, started, "report",
                        args.deadline_s)

    groups = {op: [r for r in rows if r["group"] == op] for op in args.ops}
    summary = {op: summarise(rs, "fitted") for op, rs in groups.items()}
    summary["all"] = summarise(rows, "fitted")
    result = {"benchmark": "random", "device": torch.cuda.get_device_name(device)
              if device.type == "cuda" else "cpu (interpreter)", "gpu": slug,
              "torch": torch.__version__, "triton": harness._triton_version(),
              "opselect": opselect.__version__, "date": time.strftime("%Y-%m-%d"),
              "smoke": args.smoke, "timer": timer_name, "seconds": time.monotonic() - started,
              "args": vars(args),
              "distribution": {"tiny_fraction": TINY, "dtypes": DTYPES, "ranges": RANGES},
              "fit": {"seed": args.fit_seed, "scales": scales, "samples": samples,
                      "summary": summarise(fit_rows, "cold"), "rows": fit_rows},
              "report": {"seed": args.seed, "summary": summary, "rows": rows},
              "targets_met": summary["all"]["targets_met"]}
    result.update(measured_on or {})
    stem = "random" if sorted(args.ops) == sorted(OPS) else "random_" + "_".join(args.ops)
    if args.part_count > 1:
        stem += f"_part{args.part_index + 1}of{args.part_count}"
    harness.save_result(stem, result, markdown(result), slug,
                        save=not args.no_save and not args.smoke)

    print(f"\n# report seed {args.seed} (cold = model fitted on seed {args.fit_seed}), "
          f"{result['seconds']:.0f}s")
    print(f"{'op':<8} {'calls':>5} {'cold p50':>8} {'p90':>6} {'max':>6} {'unfit p90':>9} "
          f"{'tuned geo':>9} {'max':>6} {'t>c':>4} {'t>torch':>7} {'c>torch':>7}")
    for name, s in summary.items():
        c, u, t = s["cold_regret"], s["unfitted_cold_regret"], s["tuned_regret"]
        print(f"{name:<8} {s['calls']:>5} {_f(c['p50']):>8} {_f(c['p90']):>6} {_f(c['max']):>6} "
              f"{_f(u['p90']):>9} {_f(t['geomean']):>9} {_f(t['max']):>6} "
              f"{s['n_tuned_slower_than_cold']:>4} {s['n_tuned_slower_than_torch']:>7} "
              f"{s['n_cold_slower_than_torch']:>7}")
    print("targets met:", ", ".join(f"{k}={v}" for k, v in result["targets_met"].items()))
    return result


if __name__ == "__main__":
    main()
