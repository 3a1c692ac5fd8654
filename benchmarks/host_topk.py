"""Host time of topk calls: what a call costs the CPU, next to what do_bench reports.

do_bench flushes L2 between calls (a 256 MB memset, about 60 us on an H100 or H200). A call
whose host time is longer than its device time plus that flush is measured at its host time:
this shows which calls are host-bound, and what binding launches once (Launcher) saves.

  python benchmarks/host_topk.py [--cases "16000000 float32 k=1|..."] [--json out.json]

Per case and path: host us per call (back to back, no sync), device us per call (profiler),
do_bench median us, each with the bound fast path off and on.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from opselect import ops
from opselect.kernels import _common
from opselect.kernels import topk as K
from profile_topk import selected  # the same case filter (this folder is on sys.path)

CASES = [((100_000,), 1, torch.float32), ((1_000_000,), 1, torch.float32),
         ((16_000_000,), 64, torch.float32), ((16_000_000,), 1, torch.float32),
         ((16_000_000,), 1024, torch.float32),
         ((64, 128000), 50, torch.float32), ((4096, 256), 8, torch.float32),
         ((1, 1 << 20), 64, torch.float32), ((4096, 32000), 50, torch.bfloat16)]
PATHS = ("torch", "auto", "maxima", "radix", "tournament", "bitonic")


def host_us(fn, n: int = 200) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    return host


def device_us(fn, n: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    total = sum(e.device_time_total for e in prof.key_averages())
    return total / n


def bench_us(fn) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=25, rep=100, return_mode="median")) * 1e3


def profile_host(paths: list[str], wanted: list[str]) -> None:
    """The Python functions a call spends its host time in (cProfile, 2000 calls)."""
    import cProfile
    import pstats

    for label, x, k in selected(CASES, wanted):
        for path in paths:
            backend = None if path == "auto" else path
            for _ in range(3):
                ops.topk(x, k, backend=backend)
            torch.cuda.synchronize()
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(2000):
                ops.topk(x, k, backend=backend)
            prof.disable()
            torch.cuda.synchronize()
            print(f"== {label} {path}: host {host_us(lambda: ops.topk(x, k, backend=backend)):.1f}"
                  " us per call without the profiler")
            pstats.Stats(prof).sort_stats("tottime").print_stats(14)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="", help="|-separated substrings of case labels")
    ap.add_argument("--json", default="", help="write the rows here")
    ap.add_argument("--cprofile", default="", help="profile the host side of these paths "
                    "(comma-separated, e.g. auto,maxima) on the chosen cases instead")
    args = ap.parse_args()
    wanted = [w for w in args.cases.split("|") if w]
    if args.cprofile:
        return profile_host(args.cprofile.split(","), wanted)
    rows = []
    x = torch.randn(1000, device="cuda")
    steps = {"prepare": lambda: K.prepare(x, 8),
             "torch.empty": lambda: torch.empty(1000, device="cuda"),
             "empty launch (torch.zeros 1)": lambda: torch.zeros(1, device="cuda")}
    for name, fn in steps.items():
        print(f"{name:>32}: host {host_us(fn, 2000):6.2f} us")
    for label, x, k in selected(CASES, wanted):
        call = K.prepare(x, k)
        for path in PATHS:
            if path not in ("torch", "auto") and (
                    K.OP.backend(path).supports(call) is not None):
                continue
            fn = ((lambda: torch.topk(x, k)) if path == "torch" else
                  (lambda: ops.topk(x, k)) if path == "auto" else
                  (lambda: ops.topk(x, k, backend=path)))
            for fast in ((False, True) if path != "torch" else (False,)):
                _common.Launcher.enabled = fast
                row = dict(case=label, path=path, fast=fast, host_us=host_us(fn),
                           device_us=device_us(fn), bench_us=bench_us(fn))
                rows.append(row)
                print(f"{label:>28} {path:>10} {'bound' if fast else 'triton':>6}: host "
                      f"{row['host_us']:6.1f} us, device {row['device_us']:6.1f} us, "
                      f"do_bench {row['bench_us']:7.1f} us", flush=True)
            _common.Launcher.enabled = True
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
