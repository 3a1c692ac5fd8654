"""Where a topk call's time goes: device time per kernel (torch.profiler, L2 flushed before each
call as do_bench does) and host time per call (back to back, no sync), per backend and config.
Each run's result is checked against torch.topk first. `amax` (torch's max over the input, one
read) is the floor a selection that reads the input once can approach.

    python benchmarks/profile_topk.py                          # the default cases on the GPU
    python benchmarks/profile_topk.py --backends maxima,radix --cases 16000000
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from opselect import ops
from opselect.kernels import topk as K

CASES = [((100_000,), 64, torch.float32), ((1_000_000,), 64, torch.float32),
         ((16_000_000,), 1, torch.float32), ((16_000_000,), 64, torch.float32),
         ((16_000_000,), 1024, torch.float32), ((130_000_000,), 1024, torch.float32),
         ((16_000_000,), 1024, torch.bfloat16), ((16_000_000,), 64, torch.float64),
         ((64, 128_000), 50, torch.float32), ((16, 1_000_000), 2048, torch.float32),
         ((4096, 32_000), 50, torch.bfloat16), ((256, 50_000), 1, torch.float32),
         ((1024, 4096), 32, torch.float16),
         # GPT-2's vocabulary: rows off the 16-byte grid
         ((1024, 50257), 1, torch.float16), ((1024, 50257), 50, torch.float16),
         ((256, 50257), 40, torch.bfloat16),
         # k = 1 (greedy decoding): argmax's one read
         ((64, 128_000), 1, torch.bfloat16), ((8, 128_256), 1, torch.bfloat16),
         ((4096, 32_000), 1, torch.bfloat16), ((4096, 256), 1, torch.float32)]
BACKENDS = ("torch", "radix", "tournament", "maxima", "argmax")


def selected(cases, wanted: list[str]):
    """(label, input, k) of the cases whose label contains one of `wanted` (all if empty)."""
    for shape, k, dtype in cases:
        label = f"{'x'.join(map(str, shape))} {str(dtype)[6:]} k={k}"
        if not wanted or any(w in label for w in wanted):
            yield label, torch.randn(shape, device="cuda").to(dtype), k


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype.is_floating_point:
        return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())
    return bool((a == b).all())


def _profile(call, flush, reps: int = 10) -> dict[str, float]:
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            flush.bitwise_not_()  # evicts L2 (not a fill: the call's own memsets show)
            call()
        torch.cuda.synchronize()
    per: dict[str, float] = defaultdict(float)
    for e in prof.events():
        if e.device_type.name == "CUDA" and "bitwise_not" not in e.name:
            per[e.name[:40]] += e.device_time / reps
    return per


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default=",".join(BACKENDS))
    ap.add_argument("--cases", default="", help="only cases whose shape text contains one of "
                    "these (a|b)")
    ap.add_argument("--configs", default="{}", help='extra configs per backend, JSON: '
                    '{"maxima": [{"select_programs_per_sm": 1}]}')
    args = ap.parse_args()
    backends = args.backends.split(",")
    extra = json.loads(args.configs)
    wanted = [w for w in args.cases.split("|") if w]
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    for label, x, k in selected(CASES, wanted):
        ref = torch.topk(x, k)
        per = _profile(lambda: torch.amax(x, -1), flush)
        print(f"{label:>28} {'amax':>13}: device {sum(per.values()):7.1f} us (one read)")
        runs = []
        for name in backends:
            if name in ("torch", "sort"):
                runs.append((name, None))
                continue
            backend = K.OP.backend(name)
            tc = K.prepare(x, k)
            if backend.supports(tc) is None:
                configs = backend.configs(tc) + extra.get(name, [])
                runs += [(f"{name}#{i}", (backend, tc, cfg)) for i, cfg in enumerate(configs)]
        for backend, direct in runs:
            def call(backend=backend, direct=direct):
                if direct:
                    b, tc, cfg = direct
                    return b.run(tc, cfg)
                return ops.topk(x, k, backend=backend)
            try:
                got = call()
            except Exception as exc:  # noqa: BLE001 - a backend that cannot take the case
                print(f"{label:>28} {backend:>13}: {type(exc).__name__}: {str(exc)[:200]}")
                continue
            ok = _same(got.values, ref.values) and _same(x.gather(-1, got.indices), got.values)
            for _ in range(2):
                call()
            torch.cuda.synchronize()
            n = 30
            t0 = time.perf_counter()
            for _ in range(n):
                call()
            host = (time.perf_counter() - t0) / n * 1e6
            torch.cuda.synchronize()
            per = _profile(call, flush)
            total = sum(per.values())
            parts = ", ".join(f"{name} {us:.1f}" for name, us in
                              sorted(per.items(), key=lambda kv: -kv[1])[:4])
            print(f"{label:>28} {backend:>13}: device {total:7.1f} us, host {host:6.1f} us/call"
                  f"{'' if ok else ' WRONG'} | {parts}", flush=True)


if __name__ == "__main__":
    main()
