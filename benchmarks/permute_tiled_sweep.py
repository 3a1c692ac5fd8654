"""Every config of permute's tiled backend on random calls: which one should come first (the
one the cold model runs)?

    python benchmarks/permute_tiled_sweep.py [SECONDS]     # on a GPU; $OUT/tiled_sweep.json

Calls are drawn as bench_random draws permute's (seeds 100-399, main scale only), kept where
they move 2 MB to 1 GB and the tiled backend takes them. Each config is checked against torch's
copy and timed by do_bench (the best of two medians, device time: these calls are device-bound).
The H200's run is benchmarks/results/h200/permute_tiled_sweep.json; tiled.configs() cites it.
On a machine without a GPU it is a dry run of a few tiny calls under the interpreter.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import torch  # noqa: E402

import bench_random  # noqa: E402
from opselect.dispatch import get_op  # noqa: E402
from opselect.kernels.permute.tiled import _plan  # noqa: E402


def timer(device: torch.device):
    if device.type != "cuda":
        return lambda fn: (fn(), 1.0)[1]  # a dry run
    from triton.testing import do_bench

    return lambda fn: min(do_bench(fn, warmup=10, rep=40, return_mode="median")
                          for _ in range(2))


def sweep_call(tiled, x: torch.Tensor, dims: list, time_ms) -> dict:
    """{config (JSON): ms, or None where the result was wrong, or the error's text}."""
    call = get_op("permute").prepare(x, dims)
    ref = x.permute(dims).contiguous()
    times: dict[str, float | str | None] = {}
    for cfg in tiled.configs(call):
        name = json.dumps(cfg, sort_keys=True)
        try:
            right = torch.equal(tiled.run(call, cfg), ref)
            times[name] = time_ms(lambda: tiled.run(call, cfg)) if right else None
        except Exception as exc:  # noqa: BLE001 - a failing config is recorded, the sweep goes on
            times[name] = f"{type(exc).__name__}: {str(exc)[:100]}"
    plan = _plan(call)
    return dict(unit=call.unit, A=plan.A, B=plan.B, narrow=bool(plan.narrow), configs=times)


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 200.0
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    lo, hi = ((2 << 20), (1 << 30)) if device.type == "cuda" else (1000, 20000)
    time_ms = timer(device)
    op = get_op("permute")
    tiled = op.backend("tiled")
    rows, started = [], time.monotonic()
    for seed in range(100, 400):
        if time.monotonic() - started > seconds:
            break
        spec = bench_random.draw("permute", random.Random(seed), False)
        numel = 1
        for n in spec["shape"]:
            numel *= n
        nbytes = numel * getattr(torch, spec["dtype"]).itemsize
        if spec["scale"] != "main" or not lo <= nbytes <= hi:
            continue
        (x, dims), _ = bench_random.make(spec, device)
        if tiled.supports(op.prepare(x, dims)) is not None:
            continue
        row = dict(call=bench_random.describe(spec), bytes=nbytes,
                   **sweep_call(tiled, x, dims, time_ms),
                   torch_ms=time_ms(lambda: x.permute(dims).contiguous()))
        rows.append(row)
        times = [v for v in row["configs"].values() if isinstance(v, float)]
        first = next(iter(row["configs"].values()))
        ratio = f"{first / min(times):.2f}" if times and isinstance(first, float) else "-"
        print(f"{row['call'][:48]:48s} unit={row['unit']} A={row['A']} B={row['B']} "
              f"first/best={ratio}", flush=True)
        Path(os.environ.get("OUT", "/tmp"), "tiled_sweep.json").write_text(
            json.dumps(rows, indent=0))
        if device.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
