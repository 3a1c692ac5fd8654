"""Where a topk call's time goes: device time per kernel (torch.profiler, L2 flushed before each
call as do_bench does) and host time per call (back to back, no sync), per backend.

    python benchmarks/profile_topk.py            # a few cases on the GPU
"""

from __future__ import annotations

import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from opselect import ops
from opselect.kernels import topk as K

CASES = [((100_000,), 64, torch.float32), ((1_000_000,), 1, torch.float32),
         ((16_000_000,), 1, torch.float32), ((16_000_000,), 64, torch.float32),
         ((16_000_000,), 1024, torch.float32), ((64, 128_000), 50, torch.float32),
         ((4096, 32_000), 50, torch.bfloat16), ((256, 50_000), 1, torch.float32),
         ((1024, 4096), 32, torch.float16)]
BACKENDS = ("torch", "radix", "tournament")


def main() -> None:
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    for shape, k, dtype in CASES:
        x = torch.randn(shape, device="cuda").to(dtype)
        runs = [(b, None) for b in BACKENDS]
        for name in ("radix", "tournament"):
            backend = K.OP.backend(name)
            tc = K.prepare(x, k)
            if backend.supports(tc) is None:
                runs += [(f"{name}#{i}", (backend, tc, cfg))
                         for i, cfg in enumerate(backend.configs(tc))]
        for backend, direct in runs:
            def call(backend=backend, direct=direct):
                if direct:
                    b, tc, cfg = direct
                    return b.run(tc, cfg)
                return ops.topk(x, k, backend=backend)
            try:
                for _ in range(3):
                    call()
            except Exception as exc:  # noqa: BLE001 - a backend that cannot take the case
                print(f"{str(shape):>18} k={k:<5} {backend:>13}: {type(exc).__name__}")
                continue
            torch.cuda.synchronize()
            n = 50
            t0 = time.perf_counter()
            for _ in range(n):
                call()
            host = (time.perf_counter() - t0) / n * 1e6
            torch.cuda.synchronize()
            reps = 10
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(reps):
                    flush.bitwise_not_()  # evicts L2 (not a fill: the call's own memsets show)
                    call()
                torch.cuda.synchronize()
            per = defaultdict(float)
            for e in prof.events():
                if e.device_type.name == "CUDA" and "bitwise_not" not in e.name:
                    per[e.name[:40]] += e.device_time / reps
            total = sum(per.values())
            parts = ", ".join(f"{name} {us:.1f}" for name, us in
                              sorted(per.items(), key=lambda kv: -kv[1])[:4])
            print(f"{str(shape):>18} k={k:<5} {backend:>13}: device {total:7.1f} us, "
                  f"host {host:6.1f} us/call | {parts}", flush=True)


if __name__ == "__main__":
    main()
