"""Every config of every matmul backend on a few shapes, against cuBLAS: what the configs lists
and the cost model are fitted from (benchmarks/results/h200/fits/matmul.md).

    python benchmarks/probe_matmul.py [--json PATH]

Device time is do_bench's median (L2 flushed before each run); the table gives TFLOP/s, the
percent of the weight's read at the measured copy bandwidth (decode shapes) and the ratio to
torch. Variants of one shape are timed in turns (A B C A B C ...) over rounds, median kept."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from opselect.kernels import matmul as mm  # noqa: E402

SHAPES = [
    # (form, M, N, K, dtype)
    ("linear", 1, 4096, 4096, torch.bfloat16),
    ("linear", 16, 11008, 4096, torch.bfloat16),
    ("linear", 4, 128256, 4096, torch.bfloat16),
    ("linear", 1, 4096, 14336, torch.bfloat16),
    ("linear", 4, 11008, 4096, torch.bfloat16),
    ("linear", 2048, 4096, 4096, torch.bfloat16),
    ("matmul", 4096, 4096, 4096, torch.bfloat16),
    ("matmul", 1000, 777, 3000, torch.float16),
]


def copy_bw() -> float:
    x = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    ms = triton.testing.do_bench(lambda: y.copy_(x), return_mode="median")
    return 2 * x.numel() / (ms * 1e-3)


@triton.jit
def _gemv_kernel(x, w, y, N, K, block_n: tl.constexpr, block_k: tl.constexpr):
    # One program per block_n rows of the weight (N, K), each row's dot with x over all of k:
    # plain loads and a row sum, no tensor cores (a probe: is tl.dot's padding to 16 rows or
    # its pipeline what holds decode back?).
    rn = tl.program_id(0) * block_n + tl.arange(0, block_n)
    acc = tl.zeros((block_n,), dtype=tl.float32)
    for k in range(0, K, block_k):
        rk = k + tl.arange(0, block_k)
        tile = tl.load(w + rn[:, None] * K + rk[None, :], mask=rn[:, None] < N, other=0.0)
        acc += tl.sum(tile.to(tl.float32) * tl.load(x + rk).to(tl.float32)[None, :], axis=1)
    tl.store(y + rn, acc.to(y.dtype.element_ty), mask=rn < N)


def gemv(x, w, block_n: int, block_k: int, warps: int):
    n, k = w.shape
    y = torch.empty(1, n, dtype=x.dtype, device=x.device)
    _gemv_kernel[(triton.cdiv(n, block_n),)](x, w, y, n, k, block_n, block_k, num_warps=warps)
    return y


def sweep(backend: str) -> list[dict]:
    """Decode-sized configs beyond the lists: wider k steps, deeper pipelines, more splits."""
    out = []
    for bn in (32, 64):
        for bk in (256, 512):
            for stages in (3, 5):
                base = {"block_m": 16, "block_n": bn, "block_k": bk, "group_m": 8,
                        "num_warps": 4, "num_stages": stages}
                if backend == "splitk":
                    out += [{**base, "split": s} for s in (2, 4, 8)]
                elif backend == "tiled":
                    out.append(base)
    return out


def graph_rotate(rounds: int, bw: float) -> list[dict]:
    """Decode shapes as a model's decode step meets them: each call reads another weight (as
    many distinct weights as make three L2s), the calls replayed from a CUDA graph (no host
    time, no L2 flush between them: no dirty lines to write back). Device time per call."""
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows = []
    for form, m, n, k, dtype in SHAPES:
        if m > 16:
            continue
        nbytes = n * k * dtype.itemsize
        copies = max(2, min(32, -(-3 * l2 // nbytes)))
        x = torch.randn(m, k, device="cuda", dtype=dtype)
        weights = [torch.randn(n, k, device="cuda", dtype=dtype) / k ** 0.5 for _ in range(copies)]
        calls = [mm.prepare_linear(x, w) for w in weights]
        op = mm.LINEAR_OP
        runs = {"torch": lambda c: torch.nn.functional.linear(c.a, c.b)}
        for backend in op.backends[1:]:
            if backend.supports(calls[0]) is None:
                for i, cfg in enumerate(backend.configs(calls[0])[:4]):
                    runs[f"{backend.name}#{i}"] = (lambda c, b=backend, cfg=cfg: b.run(c, cfg))
        graphs = {}
        for name, run in runs.items():
            for c in calls:
                run(c)  # compile and bind outside the capture
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for c in calls:
                    run(c)
            graphs[name] = g
        times = {name: [] for name in graphs}
        for _ in range(rounds):
            for name, g in graphs.items():
                g.replay()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(10):
                    g.replay()
                end.record()
                end.synchronize()
                times[name].append(start.elapsed_time(end) / (10 * copies))
        med = {name: statistics.median(t) for name, t in times.items()}
        best = min((v, name) for name, v in med.items() if name != "torch")
        print(f"graph {m}x{n}x{k} ({copies} weights): torch {med['torch'] * 1e3:.1f} us "
              f"({100 * nbytes / (med['torch'] * 1e-3) / bw:.0f}% of copy bw), best {best[1]} "
              f"{best[0] * 1e3:.1f} us ({100 * nbytes / (best[0] * 1e-3) / bw:.0f}%, "
              f"{med['torch'] / best[0]:.2f}x)")
        for name, ms in med.items():
            rows.append(dict(m=m, n=n, k=k, variant=name, ms=ms, copies=copies,
                             weight_pct=100 * nbytes / (ms * 1e-3) / bw,
                             spread=max(times[name]) / min(times[name])))
    return rows


def explain_tuned() -> None:
    """Tune a few calls as `opselect warm` does and print every candidate's measured host and
    device time and the choice: a check of what tuning decides on products."""
    import opselect
    from opselect.warm import warm_call

    cases = [("linear", (torch.randn(512, 4096, device="cuda", dtype=torch.bfloat16),
                         torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)), {}),
             ("matmul", (torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16),
                         torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)), {}),
             ("matmul", (torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16),
                         torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)), {})]
    for name, args, kwargs in cases:
        op = mm.LINEAR_OP if name == "linear" else mm.MATMUL_OP
        warm_call(op.name, args, kwargs)
        d = op.explain(*args, **kwargs)
        print(name, [tuple(a.shape) for a in args], "choice", d.choice, d.source)
        for c in d.candidates:
            print(f"   {c.name:<11} predicted {c.predicted_s and c.predicted_s * 1e6:.1f} us, "
                  f"measured {c.measured_s and c.measured_s * 1e6} host "
                  f"{c.measured_host_s and c.measured_host_s * 1e6} device "
                  f"{c.measured_device_s and c.measured_device_s * 1e6} config {c.config}")
        opselect.forget()


def host_times() -> None:
    """Host microseconds per call of back-to-back calls queued behind a sleeping device (as
    tuning's stage 2 measures host time): torch's ops against the routes of ops.matmul /
    ops.linear, to see what an eager call's host part is."""
    from opselect import ops

    bf = torch.bfloat16
    x, w = torch.randn(512, 4096, device="cuda", dtype=bf), torch.randn(4096, 4096, device="cuda", dtype=bf)
    a = torch.randn(1024, 1024, device="cuda", dtype=bf)
    a32 = torch.randn(1024, 1024, device="cuda")
    fns = {
        "F.linear 512x4096x4096": lambda: torch.nn.functional.linear(x, w),
        "torch.matmul 1024 bf16": lambda: torch.matmul(a, a),
        "torch.mm 1024 bf16": lambda: torch.mm(a, a),
        "torch.matmul 1024 fp32": lambda: torch.matmul(a32, a32),
        "ops.linear tiled": lambda: ops.linear(x, w, backend="tiled"),
        "ops.linear torch": lambda: ops.linear(x, w, backend="torch"),
        "ops.matmul tiled": lambda: ops.matmul(a, a, backend="tiled"),
        "ops.matmul auto": lambda: ops.matmul(a, a),
        "x + 1": lambda: x + 1,
    }
    for _ in range(2):
        for name, fn in fns.items():
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            samples = []
            for _ in range(5):
                torch.cuda._sleep(int(2e8))
                start = time.perf_counter()
                for _ in range(20):
                    fn()
                samples.append((time.perf_counter() - start) / 20 * 1e6)
                torch.cuda.synchronize()
            print(f"{name:<26} host {statistics.median(samples):6.1f} us  (min {min(samples):.1f})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-configs", type=int, default=12)
    ap.add_argument("--sweep-decode", action="store_true",
                    help="decode shapes only, with a grid of configs beyond the backends' lists")
    ap.add_argument("--graph-rotate", action="store_true",
                    help="decode shapes replayed from a CUDA graph over distinct weights")
    ap.add_argument("--explain-tuned", action="store_true",
                    help="tune a few calls and print what tuning measured and chose")
    ap.add_argument("--host", action="store_true", help="host time per call of torch's and ours")
    args = ap.parse_args()
    if args.host:
        host_times()
        return
    if args.explain_tuned:
        explain_tuned()
        return
    if args.graph_rotate:
        rows = graph_rotate(args.rounds, copy_bw())
        if args.json:
            Path(args.json).write_text(json.dumps(dict(rows=rows), indent=1))
        return
    if args.sweep_decode:
        SHAPES[:] = [s for s in SHAPES if s[1] <= 16]
    bw = copy_bw()
    rows = []
    for form, m, n, k, dtype in SHAPES:
        if form == "linear":
            x = torch.randn(m, k, device="cuda", dtype=dtype)
            w = torch.randn(n, k, device="cuda", dtype=dtype) / k ** 0.5
            op, call = mm.LINEAR_OP, mm.prepare_linear(x, w)
            ref = torch.nn.functional.linear(x, w)
        else:
            x = torch.randn(m, k, device="cuda", dtype=dtype)
            w = torch.randn(k, n, device="cuda", dtype=dtype) / k ** 0.5
            op, call = mm.MATMUL_OP, mm.prepare_matmul(x, w)
            ref = x @ w
        variants = {"torch": lambda: op.backend("torch").run(call, {})}
        cfgs_of = {"torch": None}
        for backend in op.backends[1:]:
            if backend.supports(call) is not None:
                continue
            configs = backend.configs(call)[: args.max_configs]
            if args.sweep_decode:
                configs = configs + sweep(backend.name)
            for i, cfg in enumerate(configs):
                try:
                    got = backend.run(call, cfg)
                except Exception as exc:  # noqa: BLE001 (out of shared memory: skip it)
                    print(f"skip {backend.name} {cfg}: {type(exc).__name__}")
                    continue
                err = (got.float() - ref.float()).abs().max().item()
                scale = ref.float().abs().max().item()
                if not err <= 2e-2 * scale + 1e-2:
                    print(f"WRONG {form} {m}x{n}x{k} {backend.name} {cfg}: err {err} scale {scale}")
                    continue
                variants[f"{backend.name}#{i}"] = (lambda b=backend, c=cfg: b.run(call, c))
                cfgs_of[f"{backend.name}#{i}"] = cfg
        if args.sweep_decode and m == 1:
            for bn in (4, 8, 16, 32):
                for bk in (256, 512, 1024):
                    for warps in (2, 4, 8):
                        name = f"gemv#{bn}-{bk}-{warps}"
                        fn = (lambda bn=bn, bk=bk, warps=warps: gemv(x, w, bn, bk, warps))
                        try:
                            got = fn()
                        except Exception as exc:  # noqa: BLE001
                            print(f"skip {name}: {type(exc).__name__}")
                            continue
                        if (got.float() - ref.float()).abs().max() > 2e-2 * ref.float().abs().max() + 1e-2:
                            print(f"WRONG {name}")
                            continue
                        variants[name], cfgs_of[name] = fn, dict(bn=bn, bk=bk, warps=warps)
        times = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name, fn in variants.items():
                times[name].append(triton.testing.do_bench(fn, warmup=5, rep=30,
                                                           return_mode="median"))
        med = {name: statistics.median(t) for name, t in times.items()}
        torch_ms = med["torch"]
        weight_bytes = n * k * dtype.itemsize
        best = {}
        for name, ms in sorted(med.items(), key=lambda kv: kv[1]):
            b = name.split("#")[0]
            best.setdefault(b, (name, ms))
        for name, ms in med.items():
            cfg = cfgs_of[name]
            rows.append(dict(form=form, m=m, n=n, k=k, dtype=str(dtype)[6:], variant=name,
                             config=cfg, ms=ms, tflops=2 * m * n * k / ms / 1e9,
                             weight_pct=100 * weight_bytes / (ms * 1e-3) / bw,
                             vs_torch=torch_ms / ms, spread=max(times[name]) / min(times[name])))
        line = "  ".join(f"{b}={ms * 1e3:.1f}us({torch_ms / ms:.2f}x)" for b, (_, ms) in best.items())
        print(f"{form} {m}x{n}x{k} {str(dtype)[6:]}: {line}  weight%={100 * weight_bytes / (best['torch'][1] * 1e-3) / bw:.0f} (torch)")
        for b, (name, ms) in best.items():
            if b != "torch":
                print(f"    best {b}: {cfgs_of[name]}  "
                      f"weight%={100 * weight_bytes / (ms * 1e-3) / bw:.0f}")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(copy_bw=bw, rows=rows), indent=1))


if __name__ == "__main__":
    main()
