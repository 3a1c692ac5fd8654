"""What opselect.enable() costs a program's torch calls, on the host, in microseconds per call.

Each case is timed three ways, interleaved (rounds of: without, with, reference), best of the
rounds, so that a loaded machine's noise lands on every variant alike:

  torch        routing off: the program as it is
  enable()     under opselect.enable() (every op routed)
  mode         under a pass-through TorchFunctionMode (no routing): the floor of the first design
               of enable(), which was a TorchFunctionMode and so put a Python handler on every
               torch call and tensor method of the thread

Cases: torch calls and tensor attributes opselect does not route (torch.add, x + y, x.shape,
x.size(0), x.view(-1)); routed entry points with calls opselect passes on (x.contiguous() of a
contiguous tensor, x.reshape(-1) that views); routed calls (F.softmax, torch.topk, the copy of a
transposed view), whose `enable()` time is the dispatcher's work plus the wrapper's; and, with
transformers installed, a tiny GPT-2's forward pass (eager, and compiled with --compile).

    python benchmarks/bench_routing.py                 # CPU; results/cpu/routing.{json,md}
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
from harness import save_result  # noqa: E402

import opselect  # noqa: E402


class PassThrough(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def contexts() -> dict[str, Callable]:
    return {"torch": nullcontext, "enable()": opselect.enabled, "mode": PassThrough}


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


def per_call_us(fn: Callable, ctx: Callable, calls: int) -> float:
    with ctx():
        for _ in range(min(calls, 200)):
            fn()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - start) / calls * 1e6


def best_of_rounds(fn: Callable, calls: int, rounds: int) -> dict[str, float]:
    best = {name: float("inf") for name in contexts()}
    for _ in range(rounds):
        for name, ctx in contexts().items():
            best[name] = min(best[name], per_call_us(fn, ctx, calls))
    return best


def model_cases(smoke: bool, compile_too: bool) -> dict[str, Callable]:
    try:
        import transformers
    except ImportError:
        return {}
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=256, n_positions=64,
                                  attn_implementation="eager", pad_token_id=0)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    ids = torch.randint(3, 256, (2, 16), generator=torch.Generator().manual_seed(1))

    def forward():
        with torch.no_grad():
            return model(ids).logits

    found = {"tiny GPT-2 forward, eager": forward}
    if compile_too and not smoke:
        compiled = torch.compile(forward)
        for name, ctx in contexts().items():
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
    args = p.parse_args(argv)
    calls, rounds = (300, 2) if args.smoke else (args.calls, args.rounds)
    device = torch.device("cpu")
    rows = []
    for name, fn in call_cases(device).items():
        rows.append({"case": name, "us": best_of_rounds(fn, calls, rounds)})
        print(f"  {name:<58} " + "  ".join(f"{k} {v:8.3f}" for k, v in rows[-1]["us"].items()),
              flush=True)
    for name, fn in model_cases(args.smoke, args.compile).items():
        rows.append({"case": name, "us": best_of_rounds(fn, max(calls // 400, 5), rounds)})
        print(f"  {name:<58} " + "  ".join(f"{k} {v:8.1f}" for k, v in rows[-1]["us"].items()),
              flush=True)
    for r in rows:
        r["enable_added_us"] = r["us"]["enable()"] - r["us"]["torch"]
        r["mode_added_us"] = r["us"]["mode"] - r["us"]["torch"]
    result = {"device": "cpu", "torch": torch.__version__, "python": sys.version.split()[0],
              "opselect": opselect.__version__, "calls": calls, "rounds": rounds,
              "date": time.strftime("%Y-%m-%d"), "smoke": args.smoke, "rows": rows}
    lines = [f"# opselect.enable(): host cost per call on the CPU (torch {torch.__version__})", "",
             f"Best of {rounds} interleaved rounds of {calls} calls (the model: fewer); us per "
             "call. `mode`: a pass-through TorchFunctionMode, the floor of the first design.",
             "", "| case | torch | enable() | added | mode | added |", "|---|---|---|---|---|---|"]
    for r in rows:
        us = r["us"]
        lines.append(f"| {r['case']} | {us['torch']:.3f} | {us['enable()']:.3f} | "
                     f"{r['enable_added_us']:+.3f} | {us['mode']:.3f} | "
                     f"{r['mode_added_us']:+.3f} |")
    md = "\n".join(lines) + "\n"
    print(md)
    save_result("routing", result, md, "cpu", not args.smoke and not args.no_save)


if __name__ == "__main__":
    main()
