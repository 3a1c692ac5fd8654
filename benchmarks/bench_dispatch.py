"""Host time of a call, opselect's against torch's own op, for every op and every backend.

A call's host time is what a Python loop pays per call while the GPU only queues work: 2,000
back-to-back calls without a synchronisation inside, divided by 2,000. Per case (a tiny call of
one op that the backend takes) the variants are timed in turns, several rounds (A B C A B C ...),
and each reports its median and range over the rounds:

  torch      torch's own op (the reference)
  auto       ops.<op>(...) with the choice pinned to the backend (as tuning pins it): from the
             second call on, the route (Op.routes) answers: the backend's prepared call, or
             torch's op for the torch backend
  forced     ops.<op>(..., backend=name): the forced route (Op.forced_routes)

Targets (issue 33): auto of a Triton backend <= torch's op; auto of the torch backend (a torch
route) <= torch + 1 us.

    python benchmarks/bench_dispatch.py            (GPU: results/<gpu>/dispatch.{json,md})
    python benchmarks/bench_dispatch.py --smoke    (CPU: the torch routes; proves the script)
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
from opselect import ops  # noqa: E402
from opselect.dispatch import get_op  # noqa: E402
from opselect.dispatch.op import Choice, fresh_decisions  # noqa: E402


def cases(device: torch.device):
    """(op, backend names, label, args, kwargs, torch's call): tiny calls, one per kind of call
    the backends take."""
    g = torch.Generator(device=device).manual_seed(0)
    small = torch.randn(8, 512, device=device, generator=g)
    long_rows = torch.randn(2, 151936, device=device, generator=g)
    mid_dim = torch.randn(4, 64, 8, device=device, generator=g)
    heads = torch.randn(4, 64, 8, 32, device=device, generator=g)
    square = torch.randn(64, 32, device=device, generator=g)
    a = torch.randint(0, 1000, (256,), device=device, generator=g)
    b = torch.randint(0, 1000, (16,), device=device, generator=g)
    narrow = torch.randn(64, 128, device=device, generator=g)
    yield ("softmax", ("torch", "fused"), "softmax 8x512 fp32", (small, -1), {},
           lambda: torch.softmax(small, -1))
    yield ("softmax", ("torch", "multirow"), "softmax 64x128 fp32", (narrow, -1), {},
           lambda: torch.softmax(narrow, -1))
    yield ("softmax", ("torch", "online"), "softmax 2x151936 fp32", (long_rows, -1), {},
           lambda: torch.softmax(long_rows, -1))
    yield ("softmax", ("torch", "strided"), "softmax 4x64x8 fp32 dim 1", (mid_dim, 1), {},
           lambda: torch.softmax(mid_dim, 1))
    yield ("topk", ("torch", "radix", "tournament", "maxima", "sort", "bitonic"),
           "topk 8x512 fp32 k=8", (small, 8), {}, lambda: torch.topk(small, 8))
    yield ("permute", ("torch", "naive", "vectorized"), "permute (4,64,8,32) fp32 (0,2,1,3)",
           (heads, (0, 2, 1, 3)), {}, lambda: heads.permute(0, 2, 1, 3).contiguous())
    yield ("permute", ("torch", "tiled", "naive"), "transpose 64x32 fp32", (square, (1, 0)), {},
           lambda: square.t().contiguous())
    yield ("isin", ("torch", "compare", "search", "hash", "bitmap"), "isin 256 in 16 int64",
           (a, b), {}, lambda: torch.isin(a, b))


def per_call_us(fn, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def measure_case(op_name: str, backend: str, args: tuple, kwargs: dict, plain, calls: int,
                 rounds: int, sync) -> dict | None:
    """The variants of one (call, backend), in turns; None when the backend cannot take it."""
    op = get_op(op_name)
    public = getattr(ops, op_name)
    call = op.prepare(*args, **kwargs)
    chosen = op.backend(backend)
    if chosen.device_reason(call.info) or chosen.supports(call):
        return None
    # The auto choice pinned to the backend (a settled choice, as tuning pins a candidate), in
    # decisions of this benchmark's own, for the whole case.
    mine = fresh_decisions()
    mine[1][call.key] = Choice(chosen, dict(chosen.configs(call)[0]), "pinned")
    saved = op.decisions
    op.decisions = mine
    try:
        variants = {"torch": plain, "auto": lambda: public(*args, **kwargs)}
        if backend != "torch":
            variants["forced"] = lambda: public(*args, backend=backend, **kwargs)
        for fn in variants.values():  # compile, decide, install the routes
            for _ in range(3):
                fn()
        sync()
        samples: dict[str, list[float]] = {v: [] for v in variants}
        for r in range(rounds):
            order = list(variants)
            order = order[r % len(order):] + order[:r % len(order)]
            for v in order:
                samples[v].append(per_call_us(variants[v], calls))
                sync()
        routed = op.routes.get(next(iter(op.routes), None))
    finally:
        op.decisions = saved
    row = {"op": op_name, "backend": backend,
           "route": None if routed is None else ("torch's op" if routed[0] is None
                                                 else "prepared call")}
    for v, s in samples.items():
        row[v] = {"median_us": statistics.median(s), "min_us": min(s), "max_us": max(s)}
    t_torch = row["torch"]["median_us"]
    row["auto_minus_torch_us"] = row["auto"]["median_us"] - t_torch
    row["target_met"] = (row["auto"]["median_us"] <= t_torch + 1.0) if backend == "torch" \
        else row["auto"]["median_us"] <= t_torch
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    calls, rounds = (20, 2) if args.smoke else (args.calls, args.rounds)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    rows = []
    # On the CPU (the interpreter) host times mean nothing: the torch routes, and in --smoke
    # one Triton backend of each op, to prove the script.
    smoke_backends = {"fused", "naive", "compare", "bitonic"}
    for op_name, backends, label, a, kw, plain in cases(device):
        for backend in backends:
            if device.type == "cpu" and backend != "torch" and not (
                    args.smoke and backend in smoke_backends and "151936" not in label):
                continue
            row = measure_case(op_name, backend, a, kw, plain, calls, rounds, sync)
            if row is None:
                print(f"skip {label} / {backend}: the backend does not take it")
                continue
            row["case"] = label
            rows.append(row)
            print(f"{label:<36} {backend:<10} torch {row['torch']['median_us']:6.2f}  auto "
                  f"{row['auto']['median_us']:6.2f}"
                  + (f"  forced {row['forced']['median_us']:6.2f}" if "forced" in row else ""),
                  flush=True)
    result = {"benchmark": "dispatch", "device": str(device), "gpu": gpu_slug(device),
              "torch": torch.__version__, "opselect": opselect.__version__,
              "calls": calls, "rounds": rounds, "rows": rows,
              "targets": {"triton_auto_le_torch": all(r["target_met"] for r in rows
                                                      if r["backend"] != "torch"),
                          "torch_route_le_torch_plus_1us": all(r["target_met"] for r in rows
                                                               if r["backend"] == "torch")}}
    text = json.dumps(result, indent=1)
    md = _markdown(result)
    print(md)
    if not args.smoke:
        out = RESULTS / gpu_slug(device)
        out.mkdir(parents=True, exist_ok=True)
        (out / "dispatch.json").write_text(text)
        (out / "dispatch.md").write_text(md)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "dispatch.json").write_text(text)


def _markdown(result: dict) -> str:
    lines = [f"# Host time per call ({result['gpu']}, torch {result['torch']})", "",
             f"{result['calls']} back-to-back calls without a sync, median [min-max] of "
             f"{result['rounds']} rounds taken in turns; us per call.", "",
             "| case | backend | torch | auto | forced | auto - torch | target |",
             "|---|---|---|---|---|---|---|"]

    def cell(v):
        return f"{v['median_us']:.2f} [{v['min_us']:.2f}-{v['max_us']:.2f}]" if v else "-"

    for r in result["rows"]:
        target = ("<= torch + 1" if r["backend"] == "torch" else "<= torch") + \
            (" met" if r["target_met"] else " MISSED")
        lines.append(f"| {r['case']} | {r['backend']} | {cell(r['torch'])} | {cell(r['auto'])} "
                     f"| {cell(r.get('forced'))} | {r['auto_minus_torch_us']:+.2f} | {target} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
