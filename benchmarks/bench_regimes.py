"""Decisions on the time that counts: tuning's choice for an eager call and for one captured in a
CUDA graph, on calls where a Triton backend's device time is far below torch's but its host
time is not (and on device-bound calls, where both regimes agree).

Per call, with an empty tune cache: tune it (`opselect.tuning()`), then report
  - each candidate's host and device time as tuning measured them, and do_bench's time of the
    same backend forced (device time with L2 flushed; tuning's device time must agree within
    10% on device-bound calls),
  - the eager choice (by max(host, device)) and the graph choice (by device time),
  - eager: the call in a loop, auto against torch's op (interleaved blocks, wall clock),
  - graph: the call captured in a CUDA graph, auto against torch's op captured the same way
    (replays timed by CUDA events), and the captured answer checked against torch's.

    python benchmarks/bench_regimes.py            (GPU: results/<gpu>/regimes.{json,md})
    python benchmarks/bench_regimes.py --smoke    (CPU: tuning and reports, no graphs)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import RESULTS, gpu_slug  # noqa: E402


def calls(device: torch.device, smoke: bool):
    """(label, op, args, kwargs, torch's call)."""
    g = torch.Generator(device=device).manual_seed(0)
    if smoke:
        x = torch.randn(2, 300, device=device, generator=g)
        yield "softmax 2x300 fp32", "softmax", (x, -1), {}, lambda: torch.softmax(x, -1)
        return
    rows = torch.randn(2, 151936, device=device, generator=g)
    yield ("softmax 2x151936 fp32", "softmax", (rows, -1), {}, lambda: torch.softmax(rows, -1))
    img = torch.randint(0, 256, (32, 224, 224, 3), device=device, dtype=torch.uint8,
                        generator=g)
    yield ("permute (32,224,224,3) uint8 NHWC->NCHW", "permute", (img, (0, 3, 1, 2)), {},
           lambda: img.permute(0, 3, 1, 2).contiguous())
    big = torch.randn(4096, 16384, device=device, generator=g).to(torch.bfloat16)
    yield ("softmax 4096x16384 bf16", "softmax", (big, -1), {}, lambda: torch.softmax(big, -1))
    row = torch.randn(1 << 24, device=device, generator=g)
    yield "topk 16M fp32 k=64", "topk", (row, 64), {}, lambda: torch.topk(row, 64)
    a = torch.randint(0, 1 << 30, (1 << 24,), device=device, generator=g)
    b = torch.randint(0, 1 << 30, (1024,), device=device, generator=g)
    yield "isin 16M in 1024 int64", "isin", (a, b), {}, lambda: torch.isin(a, b)
    # matmuls of about 10 us where bench_matmul's do_bench (device time, L2 flushed) and
    # tuning's eager choice disagree: whose host time counts
    for label, shape_a, shape_b, t in (("matmul 1024^3 bf16", (1024, 1024), (1024, 1024), False),
                                       ("matmul 32x512x64 @ 32x64x512 B^T bf16", (32, 512, 64),
                                        (32, 512, 64), True),
                                       ("matmul 1000x3000 @ 3000x777 fp16", (1000, 3000),
                                        (3000, 777), False)):
        dtype = torch.float16 if "fp16" in label else torch.bfloat16
        ma = torch.randn(shape_a, device=device, generator=g).to(dtype)
        mb = torch.randn(shape_b, device=device, generator=g).to(dtype)
        mb = mb.transpose(-1, -2) if t else mb
        yield label, "matmul", (ma, mb), {}, lambda ma=ma, mb=mb: torch.matmul(ma, mb)


def eager_us(fns: dict, rounds: int, sync) -> dict[str, float]:
    """Median us per call of each fn, in blocks of back-to-back calls taken in turns."""
    per = {}
    for name, fn in fns.items():
        fn()
        sync()
        t = time.perf_counter()
        fn()
        sync()
        per[name] = max(1, min(500, int(20e-3 / max(time.perf_counter() - t, 1e-6))))
    samples: dict[str, list[float]] = {n: [] for n in fns}
    for r in range(rounds):
        for name in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            sync()
            t = time.perf_counter()
            for _ in range(per[name]):
                fns[name]()
            sync()
            samples[name].append((time.perf_counter() - t) / per[name] * 1e6)
    return {n: statistics.median(s) for n, s in samples.items()}


def graph_us(fn, replays: int = 200):
    """(us per replay of fn captured in a CUDA graph, the captured output)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    graph.replay()
    torch.cuda.synchronize()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(5):
        begin.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        samples.append(begin.elapsed_time(end) * 1e3 / replays)
    return statistics.median(samples), out


def same(got, want) -> bool:
    if isinstance(want, tuple):  # topk: values (NaN-free inputs) and the selected values
        return torch.equal(got[0], want[0])
    if want.dtype.is_floating_point:
        # (16-bit matmuls: another order of the k sums moves an output by a few of its units
        # in the last place, relative to the largest output rather than to itself)
        floor = 1e-2 * float(want.abs().max()) if want.dtype.itemsize == 2 else 1e-5
        return torch.allclose(got.float(), want.float(), rtol=1e-2, atol=floor)
    return torch.equal(got, want)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--no-save", action="store_true")
    p.add_argument("--filter", default="",
                   help="only calls whose label contains this text; saved as regimes_<name>")
    p.add_argument("--name", default="", help="with --filter: the results' stem suffix")
    args = p.parse_args()
    stem = f"regimes_{args.name or 'part'}" if args.filter else "regimes"
    os.environ.setdefault("OPSELECT_CACHE_DIR", tempfile.mkdtemp(prefix="opselect-regimes-"))
    import opselect
    from opselect import ops

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    rows = []
    for label, op_name, a, kw, plain in calls(device, args.smoke):
        if args.filter and args.filter not in label:
            continue
        public = getattr(ops, op_name)
        opselect.forget()
        with opselect.tuning():
            public(*a, **kw)
        d = opselect.explain(op_name, *a, **kw, show=False)
        row = {"call": label, "eager_choice": d.choice, "graph_choice": d.graph_choice or d.choice,
               "candidates": {}}
        for c in d.candidates:
            if not c.supported:
                continue
            entry = {"host_us": _us(c.measured_host_s), "device_us": _us(c.measured_device_s),
                     "eager_us": _us(c.measured_s)}
            if cuda:
                from triton.testing import do_bench

                fn = (lambda b=c.name: public(*a, **kw, backend=b))
                entry["do_bench_us"] = do_bench(fn, warmup=25, rep=100,
                                                return_mode="median") * 1e3
            row["candidates"][c.name] = entry
        for name in (row["eager_choice"], row["graph_choice"]):
            e = row["candidates"][name]
            if e.get("do_bench_us") and e["device_us"]:
                e["device_over_do_bench"] = e["device_us"] / e["do_bench_us"]
        times = eager_us({"torch": plain, "auto": lambda: public(*a, **kw)}, args.rounds, sync)
        row["eager_us"] = times
        row["eager_torch_over_auto"] = times["torch"] / times["auto"]
        if cuda:
            want = plain()
            try:
                t_torch, _ = graph_us(plain)
            except RuntimeError as exc:  # torch.isin synchronises: it cannot be captured
                t_torch = None
                row["graph_torch_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
                torch.cuda.synchronize()
            t_auto, got = graph_us(lambda: public(*a, **kw))
            row["graph_us"] = {"torch": t_torch, "auto": t_auto}
            if t_torch is not None:
                row["graph_torch_over_auto"] = t_torch / t_auto
            row["graph_answer_right"] = same(got, want)
        rows.append(row)
        graph = row.get("graph_torch_over_auto")
        print(f"{label:<42} eager {row['eager_choice']:<10} graph {row['graph_choice']:<10} "
              f"eager torch/auto {row['eager_torch_over_auto']:.2f}"
              + (f"  graph torch/auto {graph if graph is None else round(graph, 2)} right "
                 f"{row['graph_answer_right']}" if cuda else ""), flush=True)
    result = {"benchmark": "regimes", "gpu": gpu_slug(device), "torch": torch.__version__,
              "opselect": opselect.__version__, "date": time.strftime("%Y-%m-%d"),
              "rows": rows}
    text = json.dumps(result, indent=1)
    md = markdown(result)
    print(md)
    if not (args.smoke or args.no_save):
        out = RESULTS / gpu_slug(device)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{stem}.json").write_text(text)
        (out / f"{stem}.md").write_text(md)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], f"{stem}.json").write_text(text)
        Path(os.environ["OUT"], f"{stem}.md").write_text(md)


def _us(s):
    return None if s is None else s * 1e6


def markdown(result: dict) -> str:
    lines = [f"# Eager and CUDA-graph choices after tuning ({result['gpu']}, torch "
             f"{result['torch']}, {result['date']})", "",
             "Per candidate: host / device us as tuning measured them (device: kernels back to "
             "back, the host ahead), do_bench us of the backend forced. Eager: auto against "
             "torch in a loop; graph: both captured in a CUDA graph, replays timed.", "",
             "| call | eager choice | graph choice | eager torch/auto | graph torch/auto | "
             "tuning device / do_bench (chosen) | candidates host/device/do_bench us |",
             "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        cands = "; ".join(
            f"{n} {_f(e['host_us'])}/{_f(e['device_us'])}/{_f(e.get('do_bench_us'))}"
            for n, e in r["candidates"].items())
        agree = ", ".join(f"{n} {r['candidates'][n]['device_over_do_bench']:.2f}"
                          for n in {r["eager_choice"], r["graph_choice"]}
                          if "device_over_do_bench" in r["candidates"][n])
        graph = f"{r['graph_torch_over_auto']:.2f}" if "graph_torch_over_auto" in r else "-"
        lines.append(f"| {r['call']} | {r['eager_choice']} | {r['graph_choice']} | "
                     f"{r['eager_torch_over_auto']:.2f} | {graph} | {agree or '-'} | {cands} |")
    return "\n".join(lines) + "\n"


def _f(v):
    return "-" if v is None else f"{v:.1f}"


if __name__ == "__main__":
    main()
