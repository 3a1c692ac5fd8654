"""Host time the dispatcher adds to a call on the memo-hit path (the target: at most 5 us).

Compares, per call, in host time (the GPU only queues work, so this is what a user's Python loop
feels):  ops.<op>(...)  against  backend.run(prepared_call, config)  for the backend the dispatcher
chose, and against the plain torch op. Prints a table and writes dispatch.json beside the other
results.

    python benchmarks/bench_dispatch.py            (GPU: a Triton backend is chosen and launched)
    python benchmarks/bench_dispatch.py --smoke    (CPU: the torch backend; proves the script)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import RESULTS, gpu_slug  # noqa: E402

import opselect  # noqa: E402
from opselect.dispatch import get_op  # noqa: E402


def per_call_us(fn, calls: int, repeats: int = 7) -> float:
    """Median over repeats of the mean host time per call, in microseconds."""
    for _ in range(50):
        fn()
    runs = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        runs.append((time.perf_counter() - t) / calls * 1e6)
    return statistics.median(runs)


def cases(device: torch.device):
    """(label, op name, args, kwargs, plain torch fn)."""
    a = torch.randint(0, 1000, (4096,), device=device)
    b = torch.randint(0, 1000, (64,), device=device)
    yield "isin 4096 in 64 int64", "isin", (a, b), {}, lambda: torch.isin(a, b)
    x = torch.randn(64, 512, device=device)
    for name, fn in (("topk", lambda: torch.topk(x, 8)),
                     ("softmax", lambda: torch.softmax(x, -1)),
                     ("permute", lambda: x.permute(1, 0).contiguous())):
        try:
            get_op(name)
        except Exception:  # noqa: BLE001 - an op not built yet is skipped
            continue
        args = {"topk": ((x, 8), {}), "softmax": ((x, -1), {}), "permute": ((x, (1, 0)), {})}[name]
        yield f"{name} 64x512 float32", name, args[0], args[1], fn


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--calls", type=int, default=2000)
    args = p.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    calls = 200 if args.smoke else args.calls
    rows = []
    for label, name, a, kw, plain in cases(device):
        try:
            op = get_op(name)
            public = getattr(opselect.ops, name)
            public(*a, **kw)  # decide once: later calls hit the memo
            call = op.prepare(*a, **kw)
            choice = op.chosen(call)
        except Exception as exc:  # noqa: BLE001 - an op not built yet is skipped, not fatal
            print(f"skipping {label}: {type(exc).__name__}: {exc}")
            continue
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        t_auto = per_call_us(lambda: public(*a, **kw), calls)
        sync()
        t_direct = per_call_us(lambda: choice.backend.run(call, choice.config), calls)
        sync()
        t_prepare = per_call_us(lambda: op.prepare(*a, **kw), calls)
        t_torch = per_call_us(plain, calls)
        sync()
        rows.append({"case": label, "backend": choice.backend.name, "auto_us": t_auto,
                     "direct_us": t_direct, "overhead_us": t_auto - t_direct,
                     "prepare_us": t_prepare, "torch_us": t_torch})
    print(f"\nhost time per call on {device} (median of 7 x {calls} calls)")
    print(f"{'case':<26} {'backend':<9} {'auto':>8} {'direct':>8} {'overhead':>9} "
          f"{'prepare':>8} {'torch':>8}")
    for r in rows:
        print(f"{r['case']:<26} {r['backend']:<9} {r['auto_us']:8.2f} {r['direct_us']:8.2f} "
              f"{r['overhead_us']:9.2f} {r['prepare_us']:8.2f} {r['torch_us']:8.2f}")
    result = {"device": str(device), "gpu": gpu_slug(device), "torch": torch.__version__,
              "target_overhead_us": 5.0, "rows": rows,
              "max_overhead_us": max((r["overhead_us"] for r in rows), default=None)}
    text = json.dumps(result, indent=1)
    if not args.smoke:
        out = RESULTS / gpu_slug(device)
        out.mkdir(parents=True, exist_ok=True)
        (out / "dispatch.json").write_text(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "dispatch.json").write_text(text)


if __name__ == "__main__":
    main()
