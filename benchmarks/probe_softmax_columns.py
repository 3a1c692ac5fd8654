"""softmax over the last dim of a transposed matrix: its rows are the memory's columns. torch and
opselect's row kernels (fused, online) make the input contiguous first, a transposing copy;
`strided` reads the columns in place and writes rows. Device time only (do_bench, L2 flushed),
the providers interleaved over rounds (median of the rounds' medians, and their spread); `copy`
is a contiguous copy of the same bytes (the floor of one read and one write), `auto` the cold
model's pick (no tune cache).

    python benchmarks/probe_softmax_columns.py [--rounds 3] [--json out.json] [--smoke]
        [--configs [--splits 2,4 [--split-columns 16,64]]]

--configs adds each of strided's configs as a provider of its own ("strided#i": the i-th of
`configs(call)`, #0 the cold pick's), through its prepared call, as tuning times them.
--split-columns adds each split of --splits at these columns a program ("strided/s@c"; the first
4 cases: `fits/softmax_columns_wide_splits.json`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("OPSELECT_CACHE_DIR", tempfile.mkdtemp(prefix="opselect-columns-"))

import torch  # noqa: E402

from opselect import ops  # noqa: E402
from opselect.dispatch import get_op  # noqa: E402
from opselect.kernels.softmax.call import prepare_softmax  # noqa: E402

# (logical shape, dtype, log): each made as its last two dims swapped in memory.
CASES = [((4096, 4096), torch.bfloat16, False), ((2967, 22615), torch.float16, False),
         ((9661, 6946), torch.float32, True), ((1205, 55691), torch.bfloat16, False),
         ((64, 32000), torch.bfloat16, False), ((32, 1024, 1024), torch.float16, False),
         ((8, 512, 512), torch.float32, False), ((512, 831), torch.bfloat16, False),
         ((16, 65536), torch.float32, False), ((256, 16384), torch.float16, True)]
SMOKE = [((6, 40), torch.float32, False), ((2, 5, 9), torch.float32, True)]


def transposed(shape, dtype, device) -> torch.Tensor:
    stored = list(shape)
    stored[-2:] = stored[-1:-3:-1]
    return torch.randn(stored, device=device, dtype=torch.float32).to(dtype).transpose(-1, -2)


def config_providers(x: torch.Tensor, log: bool, splits: list[int],
                     columns: list[int] = ()) -> dict:
    """strided's configs, each through its prepared call (Backend.bind) or, where a config is
    not prepared, Backend.run; then the first config split `s` ways for each s in `splits`
    ("strided/s"), and the second ("strided/s@its inner_block"), offered or not; and each split
    at each of `columns` columns a program ("strided/s@c")."""
    op = get_op("log_softmax" if log else "softmax")
    backend = op.backend("strided")
    call = op.prepare(x, -1)
    if backend.supports(call) is not None:
        return {}
    out = {}
    configs = backend.configs(call)
    named = [(f"strided#{i}", c) for i, c in enumerate(configs)]
    bases = [c for c in configs[:2] if "splits" not in c]  # (#1: #0 with twice the columns)
    named += [(f"strided/{s}" + ("" if b is bases[0] else f"@{b['inner_block']}"),
               {**b, "splits": s}) for b in bases[:2] for s in splits
              if {**b, "splits": s} not in configs]
    named += [(f"strided/{s}@{c}", {**bases[0], "inner_block": c, "splits": s})
              for c in columns for s in splits]
    named = list({name: (name, config) for name, config in named}.values())
    for name, config in named:
        bound = backend.bind(call, config)
        out[name] = ((lambda b=bound, a=call.inputs(): b(*a)) if bound is not None
                     else (lambda c=config: backend.run(call, c)))
        print(f"  {name}: {config}")
    return out


def providers(x: torch.Tensor, log: bool) -> dict:
    fn = ops.log_softmax if log else ops.softmax
    ref = torch.log_softmax if log else torch.softmax
    call = prepare_softmax(x, -1)
    out = {"torch": lambda: ref(x, -1)}
    for name in ("fused", "online", "strided"):
        if get_op("softmax").backend(name).supports(call) is None:
            out[name] = lambda name=name: fn(x, -1, backend=name)
    out["auto"] = lambda: fn(x, -1)
    flat = x.contiguous()
    out["copy"] = lambda: flat.clone()
    return out


def time_all(fns: dict, rounds: int, device) -> dict:
    if device.type != "cuda":  # (the interpreter: one call each, for the smoke run)
        return {n: {"median_us": 0.0, "spread_us": 0.0} for n in fns}
    from triton.testing import do_bench

    samples = {n: [] for n in fns}
    for r in range(rounds):
        for n in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            samples[n].append(do_bench(fns[n], return_mode="median") * 1e3)
    return {n: {"median_us": statistics.median(v), "spread_us": max(v) - min(v)}
            for n, v in samples.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default="")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--configs", action="store_true", help="time each of strided's configs")
    ap.add_argument("--splits", default="", help="with --configs: comma list of splits to time "
                                                 "on every case, offered or not")
    ap.add_argument("--split-columns", default="", help="with --splits: comma list of columns a "
                                                        "program to time each split at")
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    results = {}
    for shape, dtype, log in (SMOKE if args.smoke else CASES):
        torch.manual_seed(0)
        x = transposed(shape, dtype, device)
        fns = providers(x, log)
        if args.configs:
            fns.update(config_providers(
                x, log, [int(v) for v in args.splits.split(",") if v],
                [int(v) for v in args.split_columns.split(",") if v]))
        want = (torch.log_softmax if log else torch.softmax)(x.double(), -1)
        tol = 1e-5 if dtype == torch.float32 else 1e-2
        for name, f in fns.items():
            if name != "copy":
                torch.testing.assert_close(f().double(), want, atol=tol * (8 if log else 1),
                                           rtol=tol, equal_nan=True, msg=lambda m: f"{name}: {m}")
        op = get_op("log_softmax" if log else "softmax")
        pick = op.decide(op.prepare(x, -1), tune=False).choice
        case = f"{'log_' if log else ''}softmax {'x'.join(map(str, shape))} {str(dtype)[6:]}"
        print(f"{case}: {', '.join(n for n in fns if n != 'copy')} ok", flush=True)
        times = time_all(fns, args.rounds, device)
        results[case] = {"times": times, "auto_pick": str(pick)}
        copy = times["copy"]["median_us"]
        print(f"\n{case} (auto: {pick})")
        for name, t in times.items():
            pct = f"{100 * copy / t['median_us']:5.0f}% of copy" if t["median_us"] else ""
            print(f"  {name:>8} {t['median_us']:9.1f} us +- {t['spread_us']:5.1f}  {pct}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
