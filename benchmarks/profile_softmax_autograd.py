"""Where a softmax forward + backward under autograd spends its host time, per backend.

On the H200 a Triton backend's forward + backward of a short-row call never took under about 165
us (4096 x 1024 float32: fused 197 us, torch 83, flag_gems calling its two kernels directly 33),
and counting the Python on the way explained about 30 us of it (results/h200/fits/softmax.md,
"AUTOGRAD_HOST"). This splits it: per backend the host time of the forward alone and of forward
plus backward (back to back, one synchronisation at the end), the device time of the same (its
kernels' durations, torch.profiler), and a cProfile of the Python of forward plus backward (the
kernels run asynchronously on a GPU, so what cProfile sees is the host's own work).

    python benchmarks/profile_softmax_autograd.py                        # GPU, 4096 x 1024 fp32
    python benchmarks/profile_softmax_autograd.py --shape 4096x4096 --dtype bfloat16
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from opselect import ops  # noqa: E402


def _host_us(fn, calls: int, sync) -> float:
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - start) / calls * 1e6


def _kernel_us(fn, cuda: bool, calls: int = 20) -> float | None:
    """Device time of one call: the sum of its kernels' durations, from torch.profiler. Not
    do_bench: a call whose host time exceeds its kernels' leaves the GPU idle between them, and
    do_bench's events count that idle time (on the H200 they gave fused 4096 x 4096 bf16 forward
    + backward 366 us, where its two kernels take 42)."""
    if not cuda:
        return None
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    total = 0.0
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            total += getattr(event, "device_time", None) or event.cuda_time
    return total / calls


def _python_profile(fn, calls: int, top: int) -> str:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    return out.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="4096x1024")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--backends", default="torch,fused,online,multirow")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    shape = tuple(int(s) for s in args.shape.split("x"))
    dtype = getattr(torch, args.dtype)
    x = torch.randn(shape, device=device).to(dtype)
    g = torch.randn(shape, device=device).to(dtype)
    xr = x.detach().requires_grad_()
    results = {}
    for name in args.backends.split(","):
        backend = None if name == "auto" else name

        def forward(backend=backend):
            return ops.softmax(xr, -1, backend=backend)

        def forward_backward(backend=backend):
            return torch.autograd.grad(ops.softmax(xr, -1, backend=backend), xr, g)[0]

        try:
            want = torch.autograd.grad(torch.softmax(xr.double(), -1), xr, g.double())[0]
            got = forward_backward()
        except Exception as exc:  # noqa: BLE001 - a backend that does not take the call
            print(f"{name:>9}: {type(exc).__name__}: {str(exc)[:160]}")
            continue
        ok = torch.allclose(got.double(), want.double(), rtol=2e-2, atol=1e-4)
        for _ in range(3):
            forward_backward()
        row = {
            "host_forward_us": _host_us(forward, args.calls, sync),
            "host_forward_backward_us": _host_us(forward_backward, args.calls, sync),
            "kernels_forward_backward_us": _kernel_us(forward_backward, cuda),
            "correct": ok,
        }
        row["python"] = _python_profile(forward_backward, max(1, args.calls // 4), args.top)
        results[name] = row
        device_us = row["kernels_forward_backward_us"]
        print(f"{name:>9}: host fwd {row['host_forward_us']:7.1f} us, fwd+bwd "
              f"{row['host_forward_backward_us']:7.1f} us; kernels fwd+bwd "
              f"{'-' if device_us is None else f'{device_us:.1f} us'}"
              f"{'' if ok else '  WRONG'}", flush=True)
    for name, row in results.items():
        print(f"\n# {name}: the Python of forward + backward, by own time\n{row['python']}")
    out = os.environ.get("OUT")
    if out:
        Path(out, "softmax_autograd_profile.json").write_text(json.dumps(
            {"shape": shape, "dtype": args.dtype, "device": torch.cuda.get_device_name()
             if cuda else "cpu", "rows": results}, indent=1))


if __name__ == "__main__":
    main()
