"""Probe (issue 35): a language model's loss, F.cross_entropy over its vocabulary, with enable()
routing it, against torch's own cross_entropy.

Each case is the loss of a training step: logits (tokens x vocabulary, float32 as Hugging Face's
loss upcasts them, or the model's bfloat16), int64 targets with some -100 (ignored), the loss and
the gradient of the logits (torch.autograd.grad). Timed with do_bench (L2 flushed), the variants
in turns, 3 rounds; the answers checked against torch's first. Variants: torch; the route's
composed path (opselect's log_softmax forward and backward, then torch's nll_loss: what the route
ran before the fused loss); the fused loss (kernels/softmax/cross_entropy.py); `clone`, a copy of
the logits (one read and one write), the fused loss's floor being 1.5 of it (a read forward, a
read and a write backward).

    python benchmarks/probe_cross_entropy.py       # on the GPU: a table, JSON under $OUT
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import threading

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import opselect  # noqa: E402
from opselect.fronts import softmax as softmax_front  # noqa: E402

CASES = [  # (tokens, vocabulary, dtype): GPT-2 b8 x 1024, Llama 2 and 3, Qwen 2, a classifier
    (8192, 50257, torch.float32), (4096, 32000, torch.float32), (4096, 128256, torch.float32),
    (4096, 128256, torch.bfloat16), (2048, 151936, torch.bfloat16), (8192, 50257, torch.bfloat16),
    (256, 1000, torch.float32)]


def step(logits, target):
    x = logits.detach().requires_grad_()
    loss = F.cross_entropy(x, target)
    return loss, torch.autograd.grad(loss, x)[0]


def main() -> None:
    out = os.environ.get("OUT", ".")
    # Routing is per thread, and its entry points are put back when the last thread stops
    # routing: a parked thread that routes keeps them installed, so that enable() and disable()
    # below only switch this thread (torch's variant runs through the wrappers' first check,
    # a few hundred ns).
    ready, parked = threading.Event(), threading.Event()
    threading.Thread(target=lambda: (opselect.enable(), ready.set(), parked.wait()),
                     daemon=True).start()
    ready.wait()
    rows = []
    for tokens, vocab, dtype in CASES:
        torch.manual_seed(0)
        logits = (torch.randn(tokens, vocab, device="cuda") * 2).to(dtype)
        target = torch.randint(0, vocab, (tokens,), device="cuda")
        target[::17] = -100
        want_loss, want_grad = step(logits, target)

        def routed():
            return step(logits, target)

        def timed(name: str, fn) -> float:
            # enable() around the whole do_bench, as a program enables once: not per call
            if name.startswith("routed"):
                opselect.enable(ops=["log_softmax"])
            try:
                return triton.testing.do_bench(fn, warmup=5, rep=40) * 1e3
            finally:
                if name.startswith("routed"):
                    opselect.disable()

        fused_takes = softmax_front._fused_loss_takes

        def composed():
            softmax_front._fused_loss_takes = lambda *a: False
            try:
                return step(logits, target)
            finally:
                softmax_front._fused_loss_takes = fused_takes

        opselect.reset_stats()
        with opselect.enabled(ops=["log_softmax"]):
            got_loss, got_grad = routed()
        backends = opselect.stats().get("log_softmax", {}).get("backends", {})
        loss_err = abs(got_loss.item() - want_loss.item()) / abs(want_loss.item())
        grad_err = (got_grad.float() - want_grad.float()).abs().max().item()
        variants = {"torch": lambda: step(logits, target), "routed composed": composed,
                    "routed fused": routed, "clone": lambda: logits.clone()}
        times = {n: [] for n in variants}
        for _ in range(3):
            for n, fn in variants.items():
                times[n].append(timed(n, fn))
        med = {n: statistics.median(t) for n, t in times.items()}
        spread = {n: (max(t) - min(t)) / statistics.median(t) for n, t in times.items()}
        row = {"tokens": tokens, "vocab": vocab, "dtype": str(dtype), "us": med,
               "spread": spread, "backends": backends,
               "fused_pct_of_floor": 100 * 1.5 * med["clone"] / med["routed fused"],
               "loss_rel_err": loss_err, "grad_max_err": grad_err}
        rows.append(row)
        print(f"{tokens} x {vocab} {str(dtype)[6:]}: {backends} "
              f"loss err {loss_err:.1e} grad err {grad_err:.1e}", flush=True)
        for n in sorted(med, key=med.get):
            print(f"    {n:16s} {med[n]:9.1f} us  spread {100 * spread[n]:.0f}%  "
                  f"x{med['torch'] / med[n]:.2f} torch", flush=True)
        del logits, target, want_grad, got_grad
        torch.cuda.empty_cache()
    with open(os.path.join(out, "probe_cross_entropy.json"), "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
