"""Probe (issue 35): softmax's backward on many long rows, lagged against the two-pass rows kernel.

The rows backward (kernels/softmax/autograd.py) holds no row: each program takes one row at a
time, its sum in a pass over the row, then dx in a second pass backwards (for L2 hits). On
vocabulary rows a row of y and dy is 0.25-1.2 MB, and the programs in flight read more than L2
holds, so the second pass comes from memory again. The lagged backward (kernels/softmax/
lagged.py) reads each chunk once from memory and once from L2. Timed in turns with the add
y + dy -> dx (the same traffic: two reads, one write) and flag_gems' softmax_backward where it
is installed; each variant's answer checked against float64 first (outputs poisoned).

    python benchmarks/probe_softmax_lagged_bwd.py            # on the GPU: tables, JSON in $OUT
    python benchmarks/probe_softmax_lagged_bwd.py 1024x131072  # only these shapes
    python benchmarks/probe_softmax_lagged_bwd.py --lagged 8192/4/512,4096/4/1024  # these
        # lagged shapes (chunk bytes / warps / lag in programs) instead of LAGGED_SHAPES
    python benchmarks/probe_softmax_lagged_bwd.py --smoke    # tiny rows, any device
"""

from __future__ import annotations

import json
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from opselect.kernels._common import allocator  # noqa: E402
from opselect.kernels.softmax import autograd, lagged  # noqa: E402
from probe_softmax_coop import summary  # noqa: E402

SHAPES = [((1024, 131072), torch.bfloat16, False), ((4096, 128256), torch.bfloat16, False),
          ((16384, 32000), torch.bfloat16, False), ((4096, 32000), torch.bfloat16, True),
          ((8192, 50257), torch.float16, False), ((1024, 151936), torch.float32, False),
          ((256, 151936), torch.bfloat16, False), ((64, 128256), torch.bfloat16, False)]

# (chunk bytes, warps, lag in programs)
LAGGED_SHAPES = [(8192, 4, 1024), (8192, 4, 512), (8192, 8, 1024), (16384, 8, 512),
                 (4096, 4, 1024), (8192, 4, 2048)]


def rows_backward(y, g, log):
    """The library's backward with the lagged mode off: the rows kernel (or, under SM count
    rows, the split one)."""
    keep = lagged.lagged_backward
    lagged.lagged_backward = lambda *args, **kwargs: None
    try:
        prepared = autograd.prepare_backward(y, g, 1, log, y.dtype)
    finally:
        lagged.lagged_backward = keep
    return lambda: prepared(y, g)


def lagged_variant(y, g, log, shape, min_programs=None):
    keep = lagged.LAGGED_MIN_PROGRAMS
    if min_programs is not None:
        lagged.LAGGED_MIN_PROGRAMS = min_programs
    try:
        new_dx = allocator(y.shape, y.dtype, y.device)
        interpreted = y.device.type != "cuda"
        prepared = lagged.lagged_backward(
            lambda launcher, plan, grid: lambda *args: launcher(plan, grid, args), y, g.stride(0),
            g.dtype, y.dtype, log, 1, new_dx, interpreted, shape)
    finally:
        lagged.LAGGED_MIN_PROGRAMS = keep
    return None if prepared is None else (lambda: prepared(y, g))


def variants_for(y, g, log) -> dict:
    out = {"rows (lib)": rows_backward(y, g, log)}
    for shape in LAGGED_SHAPES:
        v = lagged_variant(y, g, log, shape, min_programs=1)
        if v is not None:
            out["lagged %d/%d/%d" % shape] = v
    dx = torch.empty_like(y)
    out["add (same bytes)"] = lambda: torch.add(y, g, out=dx)
    try:
        import flag_gems

        if not log:
            out["flag_gems"] = lambda: flag_gems.ops.softmax_backward(g, y, 1, y.dtype)
    except Exception:  # noqa: BLE001 - the peer is optional
        pass
    return out


def reference(y, g, log):
    yd, gd = y.double(), g.double()
    if log:
        return gd - yd.exp() * gd.sum(-1, keepdim=True)
    return yd * (gd - (gd * yd).sum(-1, keepdim=True))


def inputs(shape, dtype, log, device):
    x = torch.randn(shape, device=device) * 3
    if shape[0] > 3:
        x[1, : shape[1] // 2] = float("-inf")
    y = (torch.log_softmax if log else torch.softmax)(x, -1).to(dtype)
    g = torch.randn(shape, device=device).to(dtype)
    return y, g


def wrong(variants, ref, dtype) -> dict:
    """Variants whose answer (three runs: the tags move on) is off by more than the dtype's
    rounding of the answer allows."""
    bad = {}
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    scale = ref.abs().amax().item() + 1e-30
    for name, fn in variants.items():
        if name.startswith("add") or name == "flag_gems":
            continue
        for _ in range(3):
            out = fn()
            err = (out.double() - ref).abs().amax().item() / scale
            if not err <= tol:
                bad[name] = err
                break
    return bad


def main(only) -> None:
    out = os.environ.get("OUT", ".")
    src = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")
    copy_bw = 2 * src.numel() / triton.testing.do_bench(src.clone, rep=50) / 1e9
    results = []
    for shape, dtype, log in SHAPES:
        if only and f"{shape[0]}x{shape[1]}" not in only:
            continue
        torch.manual_seed(0)
        y, g = inputs(shape, dtype, log, "cuda")
        ref = reference(y, g, log)
        variants = variants_for(y, g, log)
        bad = wrong(variants, ref, dtype)
        del ref
        times = {n: [] for n in variants}
        for _ in range(3):
            for n, fn in variants.items():
                times[n].append(triton.testing.do_bench(fn, warmup=5, rep=25) * 1e3)
        label = f"{shape} {str(dtype)[6:]}{' log' if log else ''}"
        results.append(summary(times, 3 * y.numel() * y.element_size(), copy_bw, label,
                               shape=list(shape), dtype=str(dtype), log=log, bad=bad))
        del y, g, variants
        torch.cuda.empty_cache()
    with open(os.path.join(out, "probe_softmax_lagged_bwd.json"), "w") as f:
        json.dump({"copy_tb_s": copy_bw, "results": results}, f, indent=1)


def smoke() -> None:
    """Tiny rows on any device: every lagged shape (a lag of a few programs) against float64."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for shape, dtype, log in (((6, 1000), torch.float32, False), ((5, 777), torch.bfloat16, True),
                              ((4, 301), torch.float16, False)):
        y, g = inputs(shape, dtype, log, device)
        ref = reference(y, g, log)
        for chunk_bytes, warps, lag in ((256, 4, 3), (512, 4, 40), (1024, 4, 1)):
            v = lagged_variant(y, g, log, (chunk_bytes, warps, lag), min_programs=1)
            if v is None:  # (a single chunk: not lagged's)
                continue
            bad = wrong({"lagged": v}, ref, dtype)
            print(shape, dtype, log, chunk_bytes, lag, "bad" if bad else "ok", bad)


if __name__ == "__main__":
    args = sys.argv[1:]
    if "--lagged" in args:
        at = args.index("--lagged")
        LAGGED_SHAPES = [tuple(int(v) for v in s.split("/")) for s in args[at + 1].split(",")]
        del args[at:at + 2]
    smoke() if "--smoke" in args else main([a for a in args if not a.startswith("--")])
