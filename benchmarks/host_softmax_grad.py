"""The Python of ops.softmax under autograd, with and without a route: host time per call of the
forward and of forward + backward, the kernels' launches replaced by no-ops (so it runs on any
host, the CPU included, and times opselect's Python and autograd's alone).

"route": the call's route (the prepared forward inside the autograd.Function, and the route's
memo of prepared backwards); "unbound": the same backend with bind() refusing grad calls, as
before routes took them (each call planned its forward and its backward). Interleaved in one
process, 9 rounds of 1,000 calls: 64 x 256 takes the route, 63 x 256 is refused it. torch's
rows include its own CPU kernels, so they are a reference, not a like-for-like.

    python benchmarks/host_softmax_grad.py [fused|multirow]
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"  # (before triton is imported: no GPU wanted)
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from opselect import ops  # noqa: E402
from opselect.kernels import _common  # noqa: E402
from opselect.kernels.softmax import autograd as _autograd  # noqa: E402


def main() -> None:
    backend = sys.argv[1] if len(sys.argv) > 1 else "fused"
    _common.Launcher.__call__ = lambda self, *a, **k: None
    _common.BoundLaunch.__call__ = lambda self, *a, **k: None
    bind = _autograd.ForwardBackend.bind
    _autograd.ForwardBackend.bind = (
        lambda self, call, cfg: None if (call.grad and call.outer == 63) else bind(self, call, cfg))
    xb, gb = torch.randn(64, 256, requires_grad=True), torch.randn(64, 256)
    xu, gu = torch.randn(63, 256, requires_grad=True), torch.randn(63, 256)
    variants = {
        "torch fwd": lambda: torch.softmax(xb, -1),
        "torch fwd+bwd": lambda: torch.autograd.grad(torch.softmax(xb, -1), xb, gb),
        "unbound fwd": lambda: ops.softmax(xu, -1, backend=backend),
        "unbound fwd+bwd": lambda: torch.autograd.grad(ops.softmax(xu, -1, backend=backend), xu,
                                                       gu),
        "route fwd": lambda: ops.softmax(xb, -1, backend=backend),
        "route fwd+bwd": lambda: torch.autograd.grad(ops.softmax(xb, -1, backend=backend), xb,
                                                     gb),
    }
    for fn in variants.values():
        for _ in range(50):
            fn()
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(9):
        for name, fn in variants.items():
            start = time.perf_counter()
            for _ in range(1000):
                fn()
            times[name].append((time.perf_counter() - start) / 1000 * 1e6)
    for name, t in times.items():
        t.sort()
        print(f"{name:>16}: {statistics.median(t):7.2f} us a call "
              f"(quartiles {t[2]:.2f}-{t[6]:.2f})")


if __name__ == "__main__":
    main()
