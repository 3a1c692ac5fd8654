"""softmax over few long columns: the calls strided now splits over programs (the dim in chunks,
two launches), against its unsplit configs, torch and the row backends. The calls are those of
the committed bench_random softmax runs (every seed, fit and report) that `_splits` splits, and a
few dim=0 / dim=1 shapes of our own. Device time only (do_bench, L2 flushed), the providers in
turns over --rounds rounds (3; median); each strided config runs through its prepared call, as
tuning times it; `fused` / `online` through Backend.run.

    python benchmarks/probe_softmax_split.py [--json out.json] [--limit N] [--rounds 3] [--smoke]
        [--backward]

--backward times the backward instead (autograd's kernels on (y, dy), the calls whose backward
is strided: a dim of x's own layout): prepared split and unsplit (cost.SPLIT_MIN_TILES out of
reach), against torch's _softmax_backward_data.

--sweep times forced split counts (2 to 64) on our own calls from 239 x 63263 x 4 on (column
blocks as many as SMs or more), forward (every count at the first config's columns and twice
them) and backward; the data of SPLIT_PROGRAMS_PER_SM and of the walk-bound rule.
--rates times autograd's prepared strided backward, split or not, single pass or two, against
torch on RATES: with --backward's calls, the data of STRIDED_BWD_EFF.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.setdefault("OPSELECT_CACHE_DIR", tempfile.mkdtemp(prefix="opselect-split-"))

import torch  # noqa: E402

import bench_random  # noqa: E402
import harness  # noqa: E402
from opselect.dispatch import get_op  # noqa: E402
from opselect.heuristics import softmax as cost  # noqa: E402
from opselect.kernels.softmax import autograd  # noqa: E402
from opselect.heuristics.device_model import known_gpu  # noqa: E402
from opselect.kernels.softmax.strided import StridedBackend  # noqa: E402

#: (shape, dim, dtype) beyond the random calls: tall matrices over dim 0, long middle dims; from
#: 239 x 63263 x 4 on, column blocks as many as SMs or more whose walks set the time, then two
#: whose memory does (no split).
OWN = [((16, 4096, 64), 1, torch.float32), ((32000, 64), 0, torch.bfloat16),
       ((8192, 128), 0, torch.float16), ((4, 100000, 16), 1, torch.float32),
       ((239, 63263, 4), 1, torch.bfloat16), ((200, 30000, 16), 1, torch.bfloat16),
       ((150, 100000, 2), 1, torch.float16), ((300, 20000, 32), 1, torch.float16),
       ((133, 40000, 8), 1, torch.bfloat16), ((512, 8192, 8), 1, torch.float32),
       ((8192, 8192), 0, torch.bfloat16)]
SMOKE = [((2, 600, 3), 1, torch.float32)]
#: (shape, dim, dtype, log) of --rates: dims held whole in registers and dims in two passes.
RATES = [((64, 512, 512), 1, torch.float32, False), ((256, 64, 1024), 0, torch.bfloat16, False),
         ((16, 1024, 1024), 1, torch.bfloat16, False), ((128, 256, 256), 1, torch.float32, True),
         ((32, 2048, 256), 1, torch.float16, False), ((1024, 128, 64), 1, torch.float32, False),
         ((4096, 64, 32), 1, torch.bfloat16, True), ((8, 4096, 2048), 1, torch.bfloat16, False),
         ((2048, 2048), 0, torch.float32, False), ((4096, 1024), 0, torch.bfloat16, True),
         ((64, 100, 5000), 1, torch.float32, False), ((1000, 33, 777), 1, torch.float16, True)]
#: Forced split counts of --sweep.
SWEEP_SPLITS = (2, 4, 8, 16, 32, 64)


def random_calls() -> list[tuple[str, dict]]:
    """The committed H200 random calls that strided takes and splits on an H200."""
    seen, out = set(), []
    for path in sorted(glob.glob(str(ROOT / "benchmarks/results/h200/random_*softmax*.json"))):
        data = json.loads(Path(path).read_text())
        for section in ("fit", "report"):
            for row in data.get(section, {}).get("rows", []):
                spec = row["spec"]
                if spec["op"] not in ("softmax", "log_softmax") or row["call"] in seen:
                    continue
                op = get_op(spec["op"])
                args, kwargs = bench_random.make(spec, torch.device("meta"))
                call = op.prepare(*args, **kwargs)
                call.info = known_gpu("H200")
                if (op.backend("strided").supports(call) is None
                        and StridedBackend._splits(call, call.info.sm_count)[0]):
                    seen.add(row["call"])
                    out.append((row["call"], spec))
    return out


def providers(op, call) -> dict:
    strided = op.backend("strided")
    fns = {"torch": lambda: op.backend("torch").run(call, {})}
    for i, config in enumerate(strided.configs(call)):
        tag = f"#{i}" + (f"s{config['splits']}" if "splits" in config else "")
        bound = strided.bind(call, config)
        fns[f"{tag}@{config['inner_block']}w{config['warp_scale']}"] = (
            (lambda b=bound: b(*call.inputs())) if bound is not None
            else (lambda c=config: strided.run(call, c)))
    for name in ("fused", "online"):
        backend = op.backend(name)
        if backend.supports(call) is None:
            fns[name] = lambda b=backend: b.run(call, b.configs(call)[0])
    return fns


def backward_providers(op, call) -> dict:
    """The backward of the call's output under a fresh upstream gradient: autograd's prepared
    kernels split (as the library runs them) and unsplit, and torch's own backward op."""
    log, x = call.log, call.x
    if x.dim() == 0 or call.inner == 1 or call.columns is not None:
        return {}
    dim = call.dim
    y = op.backend("torch").run(call, {})
    g = torch.randn_like(y)
    split = autograd.prepare_backward(y, g, dim, log, x.dtype)
    keep = cost.SPLIT_MIN_TILES
    cost.SPLIT_MIN_TILES = 1 << 62  # (read at prepare time: this one never splits)
    try:
        unsplit = autograd.prepare_backward(y, g, dim, log, x.dtype)
    finally:
        cost.SPLIT_MIN_TILES = keep
    ref = torch._log_softmax_backward_data if log else torch._softmax_backward_data
    return {"torch": lambda: ref(g, y, dim, x.dtype), "split": lambda: split(y, g),
            "unsplit": lambda: unsplit(y, g)}


def sweep_providers(op, call) -> dict:
    """--sweep: strided's first config, then forced splits of its columns and twice them."""
    strided, n = op.backend("strided"), call.n
    first = strided.configs(call)[0]
    fns = {"torch": lambda: op.backend("torch").run(call, {})}
    configs = {"first": first}
    for block in sorted({first["inner_block"], 2 * first["inner_block"]}):
        for s in SWEEP_SPLITS:
            if n // s >= cost.SPLIT_ROWS_MIN:
                configs[f"s{s}b{block}"] = {**first, "inner_block": block, "splits": s}
    for label, config in configs.items():
        bound = strided.bind(call, config)
        fns[label] = ((lambda b=bound: b(*call.inputs())) if bound is not None
                      else (lambda c=config: strided.run(call, c)))
    return fns


def forced_backward_providers(op, call) -> dict:
    """--sweep's backward: the library's, then the split forced to each count."""
    if call.x.dim() == 0 or call.inner == 1 or call.columns is not None:
        return {}
    y = op.backend("torch").run(call, {})
    g = torch.randn_like(y)
    ref = torch._log_softmax_backward_data if call.log else torch._softmax_backward_data
    library = autograd.prepare_backward(y, g, call.dim, call.log, call.x.dtype)
    fns = {"torch": lambda: ref(g, y, call.dim, call.x.dtype), "lib": lambda: library(y, g)}
    real = cost.strided_walk_bound, cost.strided_splits
    for s in SWEEP_SPLITS:
        if call.n // s < cost.SPLIT_ROWS_MIN:
            continue
        cost.strided_walk_bound = lambda *a, **k: True
        cost.strided_splits = lambda *a, s=s, **k: s
        try:
            prepared = autograd.prepare_backward(y, g, call.dim, call.log, call.x.dtype)
        finally:
            cost.strided_walk_bound, cost.strided_splits = real
        fns[f"s{s}"] = lambda p=prepared: p(y, g)
    return fns


def rates_providers(op, call) -> dict:
    """--rates: autograd's prepared backward as the library runs it, and torch's."""
    y = op.backend("torch").run(call, {})
    g = torch.randn_like(y)
    prepared = autograd.prepare_backward(y, g, call.dim, call.log, call.x.dtype)
    ref = torch._log_softmax_backward_data if call.log else torch._softmax_backward_data
    return {"torch": lambda: ref(g, y, call.dim, call.x.dtype), "lib": lambda: prepared(y, g)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default="")
    ap.add_argument("--limit", type=int, default=0, help="only the first N calls")
    ap.add_argument("--smoke", action="store_true", help="one tiny call, any device")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--backward", action="store_true", help="time the backward (see above)")
    ap.add_argument("--sweep", action="store_true", help="forced split counts (see above)")
    ap.add_argument("--rates", action="store_true", help="the backward's rates (see above)")
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cases = [] if args.smoke or args.sweep or args.rates else random_calls()
    own = [(shape, dim, dtype, False) for shape, dim, dtype in OWN]
    if args.sweep:
        own = own[[shape for shape, *_ in own].index((239, 63263, 4)):]
    for shape, dim, dtype, log in (
            [(*c, False) for c in SMOKE] if args.smoke else RATES if args.rates else own):
        cases.append((f"{'log_' if log else ''}softmax {'x'.join(map(str, shape))} dim={dim} "
                      f"{str(dtype)[6:]}", {"own": (shape, dim, dtype, log)}))
    results = {}
    for name, spec in cases[:args.limit or None]:
        if "own" in spec:
            shape, dim, dtype, log = spec["own"]
            op = get_op("log_softmax" if log else "softmax")
            a, kw = (torch.randn(shape, device=device).to(dtype), dim), {}
        else:
            op = get_op(spec["op"])
            a, kw = bench_random.make(spec, device)
        call = op.prepare(*a, **kw)
        groups = ({"fwd": sweep_providers(op, call), "bwd": forced_backward_providers(op, call)}
                  if args.sweep else
                  {"bwd": rates_providers(op, call)} if args.rates else
                  {"bwd": backward_providers(op, call)} if args.backward else
                  {"fwd": providers(op, call)})
        for tag, fns in groups.items():
            if fns:
                time_group(args, device, op, call, f"{name} {tag}", fns, results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


def time_group(args, device, op, call, name: str, fns: dict, results: dict) -> None:
    """Check every provider against the first (torch), then time them in turns."""
    want = fns["torch"]().double()
    tol = 1e-5 if call.x.dtype in (torch.float32, torch.float64) else 2e-2
    for label, fn in fns.items():
        torch.testing.assert_close(fn().double(), want, atol=tol, rtol=1e-2, equal_nan=True,
                                   msg=lambda m: f"{name} {label}: {m}")
    pick = op.decide(call, tune=False)
    if device.type != "cuda":
        print(f"{name}: {', '.join(fns)} ok (pick {pick.choice} {pick.config})")
        return
    samples = harness.do_bench_in_turns(fns, args.rounds)
    us = {k: statistics.median(v) for k, v in samples.items()}
    results[name] = {"us": us, "pick": pick.choice, "config": pick.config}
    print(f"{name}: pick {pick.choice} {pick.config}\n   "
          + " ".join(f"{k}={v:.1f}" for k, v in us.items()), flush=True)


if __name__ == "__main__":
    main()
