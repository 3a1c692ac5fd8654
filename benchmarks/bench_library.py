"""Host cost of calling an op through each torch.library mechanism, on the CPU, in microseconds.

The same trivial body (return a preallocated tensor) is registered four ways:

  direct          the Python function itself (the floor)
  custom_op       torch.library.custom_op + register_fake
  define+impl     torch.library.Library("...", "DEF").define + .impl(CompositeExplicitAutograd)
                  + torch.library.register_fake
  define+impl+ag  the same with torch.library.register_autograd (what a differentiable op pays)
  triton_op       torch.library.triton_op (torch >= 2.6)

so the difference to `direct` is what the mechanism adds to every eager call. opselect's ops are
registered with define+impl (opselect/library.py) on this measurement.

    python benchmarks/bench_library.py [--calls N] [--smoke]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_dispatch import per_call_us  # noqa: E402
from harness import save_result  # noqa: E402

NS = "opselect_bench_library"


def variants(x: torch.Tensor) -> dict:
    out = torch.empty_like(x)

    def body(t: torch.Tensor, k: int, backend: str | None = None) -> torch.Tensor:
        return out

    found = {"direct": lambda: body(x, 3, None)}

    @torch.library.custom_op(f"{NS}::via_custom_op", mutates_args=())
    def via_custom_op(t: torch.Tensor, k: int, backend: str | None = None) -> torch.Tensor:
        return out

    @via_custom_op.register_fake
    def _(t, k, backend=None):
        return torch.empty_like(t)

    found["custom_op"] = lambda: via_custom_op(x, 3, None)

    lib = torch.library.Library(NS, "FRAGMENT")
    for name in ("plain", "with_autograd"):
        lib.define(f"{name}(Tensor t, SymInt k, str? backend=None) -> Tensor")
        lib.impl(name, body, "CompositeExplicitAutograd")
        torch.library.register_fake(f"{NS}::{name}", lambda t, k, backend=None: torch.empty_like(t),
                                    lib=lib)
    torch.library.register_autograd(
        f"{NS}::with_autograd", lambda ctx, g: (g, None, None),
        setup_context=lambda ctx, inputs, output: None, lib=lib)
    plain = getattr(torch.ops, NS).plain.default
    with_ag = getattr(torch.ops, NS).with_autograd.default
    found["define+impl"] = lambda: plain(x, 3, None)
    found["define+impl (packet)"] = lambda: getattr(torch.ops, NS).plain(x, 3, None)
    found["define+impl+autograd"] = lambda: with_ag(x, 3, None)

    triton_op = getattr(torch.library, "triton_op", None)
    if triton_op is not None:
        @triton_op(f"{NS}::via_triton_op", mutates_args=())
        def via_triton_op(t: torch.Tensor, k: int, backend: str | None = None) -> torch.Tensor:
            return out

        found["triton_op"] = lambda: via_triton_op(x, 3, None)
    found["torch.compiler.is_compiling()"] = torch.compiler.is_compiling
    return found, lib


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--no-save", action="store_true")
    args = p.parse_args()
    calls = 500 if args.smoke else args.calls
    x = torch.zeros(16)
    found, _lib = variants(x)
    rows = []
    floor = None
    for name, fn in found.items():
        us = per_call_us(fn, calls)
        if name == "direct":
            floor = us
        rows.append({"mechanism": name, "us_per_call": us,
                     "added_us": None if floor is None or name == "direct" else us - floor})
    print(f"host time per call on the CPU (median of 7 x {calls} calls), torch {torch.__version__}")
    for r in rows:
        added = "" if r["added_us"] is None else f"  (+{r['added_us']:.2f})"
        print(f"  {r['mechanism']:<32} {r['us_per_call']:7.2f} us{added}")
    result = {"torch": torch.__version__, "python": sys.version.split()[0], "calls": calls,
              "rows": rows}
    lines = [f"# torch.library dispatch cost on the CPU (torch {torch.__version__})", "",
             "| mechanism | us per call | added to a direct call |", "|---|---|---|"]
    for r in rows:
        added = "-" if r["added_us"] is None else f"{r['added_us']:.2f}"
        lines.append(f"| {r['mechanism']} | {r['us_per_call']:.2f} | {added} |")
    md = "\n".join(lines) + "\n"
    save_result("library", result, md, "cpu", not args.smoke and not args.no_save)


if __name__ == "__main__":
    main()
