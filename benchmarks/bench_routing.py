"""What opselect.enable() costs a program's torch calls, on the host, in microseconds per call.

Each case is timed several ways, interleaved (rounds of: without, with, ...), best of the
rounds, so that a loaded machine's noise lands on every variant alike:

  torch          routing off: the program as it is
  enable()       under opselect.enable() (every op routed, each call to its choice)
  to torch       enable() with every op's backend set to torch: a routed call that ends at
                 torch's op (issue 33's target: at most 1 us more than torch)
  to a backend   (GPU) enable() with each op forced to one of its Triton backends
  mode           under a pass-through TorchFunctionMode (no routing): the floor of the first
                 design of enable(), which was a TorchFunctionMode and so put a Python handler
                 on every torch call and tensor method of the thread

Cases: torch calls and tensor attributes opselect does not route (torch.add, x + y, x.shape,
x.size(0), x.view(-1)); routed entry points with calls opselect passes on (x.contiguous() of a
contiguous tensor, x.reshape(-1) that views); routed calls (F.softmax, torch.topk, the copy of a
transposed view), whose `enable()` time is the dispatcher's work plus the wrapper's; and, with
transformers installed, a tiny GPT-2's forward pass (eager, and compiled with --compile).

    python benchmarks/bench_routing.py                 # results/<gpu or cpu>/routing.{json,md}
    python benchmarks/bench_routing.py --device cpu    # the CPU on a GPU machine
    python benchmarks/bench_routing.py --compile       # also the compiled forward (inductor)
    python benchmarks/bench_routing.py --smoke         # a few hundred calls (CI)
"""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import gpu_slug, save_result  # noqa: E402

import opselect  # noqa: E402


class PassThrough(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


_OPS = ("softmax", "log_softmax", "topk", "permute", "isin")
#: A Triton backend per op for the "to a backend" column (each takes every routed case here).
_TRITON = {"softmax": "fused", "log_softmax": "fused", "topk": "radix", "permute": "naive",
           "isin": "compare"}


def contexts(device: torch.device) -> dict[str, Callable]:
    found = {"torch": nullcontext, "enable()": opselect.enabled,
             "to torch": lambda: opselect.enabled(backends={op: "torch" for op in _OPS})}
    if device.type == "cuda":
        found["to a backend"] = lambda: opselect.enabled(backends=_TRITON)
    found["mode"] = PassThrough
    return found


def call_cases(device: torch.device) -> dict[str, Callable]:
    x = torch.randn(8, 64, device=device)
    y = torch.randn(8, 64, device=device)
    wide = torch.randn(64, 8, device=device)
    return {
        "torch.add(x, y)  (not routed)": lambda: torch.add(x, y),
        "x + y  (not routed)": lambda: x + y,
        "x.shape  (attribute)": lambda: x.shape,
        "x.size(0)  (method)": lambda: x.size(0),
        "x.view(-1)  (method)": lambda: x.view(-1),
        "x.contiguous(), contiguous x  (routed entry, passed on)": lambda: x.contiguous(),
        "x.reshape(-1), a view  (routed entry, passed on)": lambda: x.reshape(-1),
        "F.softmax(x, dim=-1)  (routed)": lambda: F.softmax(x, dim=-1),
        "torch.topk(x, 4)  (routed)": lambda: torch.topk(x, 4),
        "x.t().contiguous()  (routed permute)": lambda: wide.t().contiguous(),
    }


def per_call_us(fn: Callable, ctx: Callable, calls: int, sync: Callable) -> float:
    with ctx():
        for _ in range(min(calls, 200)):
            fn()
        sync()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        elapsed = time.perf_counter() - start
        sync()
        return elapsed / calls * 1e6


def best_of_rounds(fn: Callable, calls: int, rounds: int, device: torch.device
                   ) -> dict[str, float]:
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    best = {name: float("inf") for name in contexts(device)}
    for _ in range(rounds):
        for name, ctx in contexts(device).items():
            best[name] = min(best[name], per_call_us(fn, ctx, calls, sync))
    return best


def model_cases(smoke: bool, compile_too: bool, device: torch.device) -> dict[str, Callable]:
    try:
        import transformers
    except ImportError:
        return {}
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=256, n_positions=64,
                                  attn_implementation="eager", pad_token_id=0)
    model = transformers.GPT2LMHeadModel(cfg).eval().to(device)
    ids = torch.randint(3, 256, (2, 16), generator=torch.Generator().manual_seed(1)).to(device)

    def forward():
        with torch.no_grad():
            return model(ids).logits

    found = {"tiny GPT-2 forward, eager": forward}
    if compile_too and not smoke:
        compiled = torch.compile(forward)
        for name, ctx in contexts(device).items():
            with ctx():
                compiled()  # compiled (and recompiled per context) before the timing
        found["tiny GPT-2 forward, compiled"] = compiled
    return found


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="a few hundred calls (CI)")
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--compile", action="store_true", help="also the compiled tiny GPT-2")
    p.add_argument("--no-save", action="store_true")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args(argv)
    calls, rounds = (300, 2) if args.smoke else (args.calls, args.rounds)
    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    where = gpu_slug(device) if device.type == "cuda" else "cpu"
    rows = []
    for name, fn in call_cases(device).items():
        rows.append({"case": name, "us": best_of_rounds(fn, calls, rounds, device)})
        print(f"  {name:<58} " + "  ".join(f"{k} {v:8.3f}" for k, v in rows[-1]["us"].items()),
              flush=True)
    for name, fn in model_cases(args.smoke, args.compile, device).items():
        rows.append({"case": name, "us": best_of_rounds(fn, max(calls // 400, 5), rounds,
                                                        device)})
        print(f"  {name:<58} " + "  ".join(f"{k} {v:8.1f}" for k, v in rows[-1]["us"].items()),
              flush=True)
    columns = [c for c in contexts(device) if c != "torch"]
    for r in rows:
        r["added_us"] = {c: r["us"][c] - r["us"]["torch"] for c in columns}
    result = {"device": where, "torch": torch.__version__, "python": sys.version.split()[0],
              "opselect": opselect.__version__, "calls": calls, "rounds": rounds,
              "date": time.strftime("%Y-%m-%d"), "smoke": args.smoke, "rows": rows}
    lines = [f"# opselect.enable(): host cost per call on {where} (torch {torch.__version__})",
             "", f"Best of {rounds} interleaved rounds of {calls} calls (the model: fewer); us "
             "per call, and what each variant adds to torch's. `to torch`: every op's backend "
             "set to torch (the call ends at torch's op); `to a backend`: each op forced to a "
             "Triton backend (" + ", ".join(f"{k} {v}" for k, v in _TRITON.items()) + "); "
             "`mode`: a pass-through TorchFunctionMode, the floor of the first design.", "",
             "| case | torch | " + " | ".join(f"{c} | added" for c in columns) + " |",
             "|---|---|" + "---|---|" * len(columns)]
    for r in rows:
        us = r["us"]
        lines.append(f"| {r['case']} | {us['torch']:.3f} | " + " | ".join(
            f"{us[c]:.3f} | {r['added_us'][c]:+.3f}" for c in columns) + " |")
    md = "\n".join(lines) + "\n"
    print(md)
    save_result("routing", result, md, where, not args.smoke and not args.no_save)


if __name__ == "__main__":
    main()
