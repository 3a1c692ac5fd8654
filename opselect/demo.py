"""`opselect demo`: automatic selection, a forced backend, explain and tuning, on a GPU or on the CPU.

On the CPU, Triton kernels run through the interpreter (TRITON_INTERPRET=1), so the real choice is
torch there; the last part shows what the cost model would pick on an H200 for a range of shapes.
"""

from __future__ import annotations

import torch
from rich.console import Console
from rich.table import Table

import opselect
from opselect import ops
from opselect.dispatch.device import INTERPRETED
from opselect.errors import BackendError
from opselect.tune_cache import default_directory


def main() -> int:
    console = Console()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    where = torch.cuda.get_device_name() if cuda else (
        "cpu, Triton kernels through the interpreter" if INTERPRETED else
        "cpu, no interpreter: only the torch backend can run (set TRITON_INTERPRET=1)")
    console.rule("[bold]opselect demo")
    console.print(f"device: {where}\ncache:  {default_directory()}\n")
    scale = 64 if cuda else 1
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randint(0, 5000, (4000 * scale,), device=device, generator=gen)
    b = torch.randint(0, 5000, (300,), device=device, generator=gen)

    console.print("[bold]1. Automatic choice[/bold]: ops.isin(a, b)")
    result = ops.isin(a, b)
    assert torch.equal(result, torch.isin(a, b))
    console.print(f"   {result.sum().item()} of {a.numel()} elements found, same as torch.isin")
    opselect.explain("isin", a, b)

    if cuda or INTERPRETED:
        console.print("\n[bold]2. A forced backend[/bold]: ops.isin(a, b, backend='hash')")
        forced = ops.isin(a, b, backend="hash")
        console.print(f"   equal to torch.isin: {torch.equal(forced, torch.isin(a, b))}")
    console.print("\n[bold]3. A forced backend that cannot take the call[/bold]: "
                  "ops.isin(floats, b, backend='bitmap')")
    try:
        ops.isin(a.float(), b.float(), backend="bitmap")
    except BackendError as exc:
        console.print(f"   BackendError: {exc}")

    if cuda or INTERPRETED:
        console.print("\n[bold]4. Tuning[/bold]: with opselect.tuning(): measure the candidates of "
                      "an unseen shape, record them in the cache, use the fastest")
        small_a, small_b = a[: 1000 * scale], b[:40]
        with opselect.tuning():
            ops.isin(small_a, small_b)
        opselect.explain("isin", small_a, small_b)
        console.print("   (a second process reads these timings from the tune cache)")

    console.print("\n[bold]5. What the cost model picks on an H200[/bold] (no GPU needed)")
    from opselect.dispatch import get_op
    from opselect.heuristics.device_model import what_if

    op = get_op("isin")
    table = Table()
    for h in ("elements", "test_elements", "dtype", "model's pick", "predicted", "torch predicted"):
        table.add_column(h)
    for m, n in ((10**6, 16), (16_777_216, 1024), (16_777_216, 10**6), (67_108_864, 16_000_000),
                 (10**4, 10**4)):
        for dtype in (torch.int32,):
            decision = what_if(op, [[m], [n]], dtype, {}, "H200")
            pick = decision.candidate(decision.choice)
            table.add_row(f"{m:,}", f"{n:,}", str(dtype)[6:], pick.name, _fmt(pick.predicted_s),
                          _fmt(decision.candidate("torch").predicted_s))
    console.print(table)
    console.print("\nMore: `opselect --help`, `opselect explain isin --shapes '1000000;5000' "
                  "--dtype int64 --what-if H200`, README.md.")
    return 0


def _fmt(s: float) -> str:
    return f"{s * 1e3:.3f} ms" if s >= 1e-3 else f"{s * 1e6:.1f} us"


if __name__ == "__main__":
    raise SystemExit(main())
