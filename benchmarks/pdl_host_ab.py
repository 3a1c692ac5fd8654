"""A/B of the maxima select launch with and without PDL: host time per call (back to back, no
sync), host time of one call on an idle GPU, device time (profiler) and do_bench median.

  python benchmarks/pdl_host_ab.py [--reps 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from opselect.kernels import topk as K
from host_topk import device_us, host_us  # this folder is on sys.path

CASES = [((16_000_000,), 1), ((16_000_000,), 64), ((16_000_000,), 1024), ((64, 128000), 50),
         ((130_000_000,), 1024)]


def idle_us(fn, n: int = 50) -> float:
    times = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(times)


def main() -> None:
    from triton.testing import do_bench

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    backend = K.OP.backend("maxima")
    rows = []
    for shape, k in CASES:
        x = torch.randn(shape, device="cuda")
        label = f"{'x'.join(map(str, shape))} k={k}"
        for rep in range(args.reps):
            for pdl in (False, True):
                cfg = {"pdl": pdl}
                fn = lambda: backend.run(K.prepare(x, k), cfg)  # noqa: E731
                fn()
                row = dict(case=label, rep=rep, pdl=pdl, host_us=host_us(fn, 300),
                           idle_us=idle_us(fn), device_us=device_us(fn),
                           bench_us=float(do_bench(fn, warmup=25, rep=100,
                                                   return_mode="median")) * 1e3)
                rows.append(row)
                print(f"{label:>22} rep {rep} pdl {int(pdl)}: host {row['host_us']:6.1f} idle "
                      f"{row['idle_us']:6.1f} device {row['device_us']:6.1f} do_bench "
                      f"{row['bench_us']:6.1f} us", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
