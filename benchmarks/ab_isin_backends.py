"""isin's backends, each config of each, on the same inputs, interleaved (A B C A B C ...).

Every variant runs through its prepared call (what a route runs), timed by do_bench (median,
L2 flushed) in turns for several rounds; the table gives each variant's median over the rounds
and the spread (min-max), and its percent of the copy bandwidth (elements read, bools written).
Answers are checked against torch.isin first.

    python benchmarks/ab_isin_backends.py                          # GPU: the cases below
    python benchmarks/ab_isin_backends.py --backends hash,cuckoo --cases "in 1024"
    python benchmarks/ab_isin_backends.py --smoke                  # tiny inputs, any device
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from opselect.dispatch import get_op  # noqa: E402
from probe_isin_onchip import _bench, inputs  # noqa: E402

M = 1 << 20
#: Test sets a table in L1 holds (up to 2,048 values), wide and narrow values, and two calls
#: on either side (16 values: compare's; 4,096: past cuckoo's bound).
CASES = [(16 * M, 1024, torch.int64, "wide"), (16 * M, 1024, torch.int32, "wide"),
         (16 * M, 1024, torch.float32, "wide"), (16 * M, 256, torch.int64, "wide"),
         (16 * M, 1024, torch.float32, "narrow"), (64 * M, 1024, torch.int64, "wide"),
         (1 * M, 1024, torch.int64, "wide"), (16 * M, 2048, torch.int64, "wide"),
         (16 * M, 64, torch.int32, "wide"), (16 * M, 16, torch.int32, "wide"),
         (16 * M, 4096, torch.int64, "wide")]


def _copy_bandwidth() -> float:
    """Bytes per second of a device-to-device copy of 256 MB (read + write)."""
    if not torch.cuda.is_available():
        return 0.0
    a = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    return 2 * a.numel() / (_bench(lambda: b.copy_(a)) * 1e-6)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--backends", default="torch,compare,hash,cuckoo,bitmap")
    ap.add_argument("--cases", default="", help="only cases whose label contains this text")
    ap.add_argument("--smoke", action="store_true", help="tiny cases on any device")
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cases = [(3000, n, d, v) for _, n, d, v in CASES] if args.smoke else CASES
    op = get_op("isin")
    bw = _copy_bandwidth()
    results = []
    for label, (m, n, dtype), x, t, ref, call in inputs(op, cases, args.cases, device):
        variants = {}
        for name in args.backends.split(","):
            backend = op.backend(name)
            if backend.supports(call) is not None:
                continue
            if name == "torch":
                variants["torch"] = lambda x=x, t=t: torch.isin(x, t)
                continue
            for i, config in enumerate(backend.configs(call)):
                fn = backend.bind(call, config)
                got = fn(x, t)
                if not torch.equal(got, ref):
                    raise AssertionError(f"{label}: {name} config {i} answers wrong")
                variants[f"{name}/{i}"] = (lambda fn=fn, x=x, t=t: fn(x, t))
        times = {v: [] for v in variants}
        for _ in range(args.rounds):
            for v, fn in variants.items():
                times[v].append(_bench(fn))
        nbytes = m * (dtype.itemsize + 1) + n * dtype.itemsize
        row = {"case": label, "us": {v: statistics.median(ts) for v, ts in times.items()},
               "spread": {v: [min(ts), max(ts)] for v, ts in times.items()}}
        results.append(row)
        best = min(row["us"], key=row["us"].get)
        print(f"# {label}: best {best} {row['us'][best]:.1f} us"
              f" ({100 * nbytes / (row['us'][best] * 1e-6) / bw if bw else 0:.0f}% of copy)")
        for v in sorted(row["us"], key=row["us"].get):
            lo, hi = row["spread"][v]
            pct = 100 * nbytes / (row["us"][v] * 1e-6) / bw if bw else 0.0
            print(f"    {v:>10}: {row['us'][v]:8.1f} us ({lo:.1f}-{hi:.1f})  {pct:4.0f}%", flush=True)
        del x, t, ref, call, variants
    out = os.environ.get("OUT")
    if out:
        Path(out, "ab_isin_backends.json").write_text(json.dumps(
            {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
             "copy_bandwidth_GBps": bw / 1e9, "rounds": args.rounds, "rows": results}, indent=1))


if __name__ == "__main__":
    main()
