"""Where a call's host time goes: each part of a repeated call timed on its own.

bench_dispatch.py gives a call's whole host time against torch's; this splits opselect's call
into what it does (the public function's checks, the route key, the lookup, the output's
allocation, the bound launch, Triton's C launcher) and times each part alone, in turns with the
others (A B C ... A B C ..., 7 rounds of 4,000 calls, no synchronisation inside a round), so
that the parts are measured under the same load. The sum of the parts is not the whole (a part
timed alone runs warm in the caches); what matters is which parts are large.

    python benchmarks/host_parts.py             (GPU; prints a table, writes $OUT/host_parts.json)
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from opselect import ops  # noqa: E402
from opselect.dispatch.tuning_mode import capturing  # noqa: E402
from opselect.kernels import _common  # noqa: E402
from opselect.kernels import softmax as _softmax  # noqa: E402
from opselect.kernels.softmax.call import plain_key as softmax_key  # noqa: E402


def per_call_us(fn, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def last_bound_launch(run):
    """The BoundLaunch (and its arguments) that `run` calls last."""
    seen = []
    original = _common.BoundLaunch.__call__

    def spy(self, *args):
        seen.append((self, args))
        return original(self, *args)

    _common.BoundLaunch.__call__ = spy
    try:
        run()
    finally:
        _common.BoundLaunch.__call__ = original
    return seen[-1]


def parts(device: torch.device) -> dict:
    x = torch.randn(8, 512, device=device)
    ops.softmax(x, backend="fused")
    ops.softmax(x, backend="fused")
    key = softmax_key(False, x, -1, None)
    forced = _softmax.SOFTMAX_OP.forced_routes
    prepared = forced[("fused", key)]
    bound, args = last_bound_launch(lambda: prepared(x))
    misaligned = 0
    launch = bound.kernels[misaligned]
    values = [a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args]
    stream = _common._current_stream(device.index or 0)
    info = _softmax.prepare_softmax(x).info
    y = args[1]
    index = device.index or 0
    ix = torch.zeros(8, dtype=torch.int64, device=device)
    table = {
        "torch.softmax(x, -1)": lambda: torch.softmax(x, -1),
        "ops.softmax(x, backend='fused')": lambda: ops.softmax(x, backend="fused"),
        "prepared(x) (the route's closure)": lambda: prepared(x),
        "bound(x, y, *ints) (BoundLaunch)": lambda: bound(*args),
        "launch(..., addresses) (C launcher)": lambda: launch(bound.g0, bound.g1, bound.g2,
                                                              stream, values),
        "launch(..., tensors) (C launcher)": lambda: launch(bound.g0, bound.g1, bound.g2,
                                                            stream, args),
        "torch.empty((8, 512), ...)": lambda: torch.empty((8, 512), dtype=torch.float32,
                                                          device=device),
        "torch.empty_like(x)": lambda: torch.empty_like(x),
        "torch.empty((8, 512), dtype, device=int)": lambda: torch.empty(
            (8, 512), dtype=torch.float32, device=index),
        "torch.empty(8, 512, dtype, device)": lambda: torch.empty(8, 512, dtype=torch.float32,
                                                                  device=device),
        "torch.empty_strided(...)": lambda: torch.empty_strided((8, 512), (512, 1),
                                                                dtype=torch.float32,
                                                                device=device),
        "x.new_empty((8, 512))": lambda: x.new_empty((8, 512)),
        "x.new_empty((8, 512), dtype=float16)": lambda: x.new_empty((8, 512),
                                                                    dtype=torch.float16),
        "x.new_empty(4096)": lambda: x.new_empty(4096),
        "torch.empty_like(x, dtype=float16)": lambda: torch.empty_like(x, dtype=torch.float16),
        "x.new_empty((8, 512)) int64 x": lambda: ix.new_empty((8, 512)),
        "plain_key(...)": lambda: softmax_key(False, x, -1, None),
        "forced.get((backend, key))": lambda: forced.get(("fused", key)),
        "key + get": lambda: forced.get(("fused", softmax_key(False, x, -1, None))),
        "torch.compiler.is_compiling()": torch.compiler.is_compiling,
        "_current_device()": _common._current_device,
        "_current_stream(d)": lambda: _common._current_stream(0),
        "_hooks_idle()": _common._hooks_idle,
        "capturing(info)": lambda: capturing(info),
        "x.data_ptr()": x.data_ptr,
        "x.shape, x.stride()": lambda: (x.shape, x.stride()),
        "x.device": lambda: x.device,
        "y.data_ptr() (lambda)": lambda: y.data_ptr(),
        "an empty lambda": lambda: None,
    }
    rounds, calls = 7, 4000
    times: dict[str, list[float]] = {name: [] for name in table}
    for _ in range(rounds):
        for name, fn in table.items():
            torch.cuda.synchronize(device)
            times[name].append(per_call_us(fn, calls))
    torch.cuda.synchronize(device)
    return {name: {"median_us": statistics.median(v), "min_us": min(v), "max_us": max(v)}
            for name, v in times.items()}


def main() -> None:
    device = torch.device("cuda", torch.cuda.current_device())
    result = parts(device)
    out = os.environ.get("OUT")
    if out:
        Path(out, "host_parts.json").write_text(json.dumps(result, indent=1))
    print(f"{'part':44s} {'median us':>10s} {'[min-max]':>16s}")
    for name, r in result.items():
        print(f"{name:44s} {r['median_us']:10.2f} [{r['min_us']:.2f}-{r['max_us']:.2f}]")


if __name__ == "__main__":
    main()
