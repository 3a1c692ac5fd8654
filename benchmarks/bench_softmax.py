"""softmax benchmark: torch, every backend, auto (cold and warm), flag_gems; forward, then
forward + backward.

    python benchmarks/bench_softmax.py             # the full suite on the GPU, results committed
    python benchmarks/bench_softmax.py --smoke     # tiny cases, any device (CI checks the script)

Forward cases go through the shared harness (results/<gpu>/softmax.{json,md}). The harness times
ops.softmax only, so the forward + backward cases (torch.autograd.grad of the output, whose
backward runs opselect's own kernels) are timed here with the harness's timer and summary, and
written next to them as softmax_backward.{json,md}.

Targets (the issue's): auto never more than 2% slower than torch on any case, at least 1.3x torch
as a geometric mean, and rows of >= 1024 elements at >= 85% of the copy bandwidth.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from harness import Case, Suite, at_least, main_guard  # noqa: E402

from opselect.dispatch import get_op  # noqa: E402

K, M = 1024, 1 << 20
F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32

# (shape, dim, dtype, out dtype or None)
FORWARD = [
    ((4096, 256), -1, F32, None),
    ((4096, 1024), -1, F32, None),
    ((4096, 4096), -1, F32, None),
    ((4096, 16384), -1, F32, None),
    ((4096, 256), -1, BF16, None),
    ((4096, 1024), -1, BF16, None),
    ((4096, 4096), -1, BF16, None),
    ((4096, 16384), -1, BF16, None),
    ((4096, 4096), -1, F16, None),
    ((4096, 16384), -1, F16, None),
    ((4096, 4096), -1, F16, F32),          # dtype=float32 of a half input: cast fused in the load
    ((1024, 131072), -1, F32, None),
    ((1024, 131072), -1, BF16, None),
    ((32, 1048576), -1, F32, None),
    ((32, 1048576), -1, BF16, None),
    ((1048576, 64), -1, F32, None),
    ((1048576, 64), -1, BF16, None),
    ((65536, 1000), -1, F16, None),         # not a power of two
    ((4096, 50257), -1, BF16, None),        # a vocabulary: rows not 16-byte aligned
    # Language-model heads (issue 35): vocabularies of Llama-3, GPT-2, Llama-2, Qwen, from a
    # training batch's rows down to a decode step's few
    ((4096, 128256), -1, BF16, None),
    ((8192, 50257), -1, F16, None),
    ((16384, 32000), -1, BF16, None),
    ((1024, 151936), -1, F32, None),
    ((256, 151936), -1, BF16, None),
    ((64, 128256), -1, BF16, None),
    ((8, 128256), -1, BF16, None),
    ((1, 151936), -1, F32, None),
    ((64, 512, 512), 1, F32, None),
    ((64, 512, 512), 1, BF16, None),
    ((256, 64, 1024), 0, F32, None),
    ((256, 64, 1024), 0, F16, None),
    ((16, 4096, 64), 1, F32, None),         # a long dim with a short inner
]
BACKWARD = [
    ((4096, 1024), -1, F32),
    ((4096, 4096), -1, BF16),
    ((4096, 16384), -1, F32),
    ((1024, 131072), -1, BF16),
    ((4096, 128256), -1, BF16),  # Llama 3's vocabulary (the lagged backward)
    ((8192, 50257), -1, F16),  # GPT-2's, rows off the 16-byte grid
    ((32, 1048576), -1, F32),
    ((1048576, 64), -1, F32),
    ((64, 512, 512), 1, F32),
    ((256, 64, 1024), 0, BF16),
]
SMOKE_FORWARD = [((16, 64), -1, F32, None), ((4, 1100), -1, BF16, None),
                 ((4, 8, 6), 1, F32, None), ((8, 33), -1, F16, F32)]
SMOKE_BACKWARD = [((16, 40), -1, F32), ((3, 5, 4), 1, F32)]

TOL = {F16: 2e-3, BF16: 1.6e-2, F32: 2e-5, torch.float64: 1e-10}


def _name(shape, dim, dtype, out=None, suffix="") -> str:
    dims = "x".join(_num(d) for d in shape)
    cast = f"->{str(out)[6:]}" if out is not None else ""
    where = f" dim={dim}" if len(shape) > 2 or dim not in (-1, len(shape) - 1) else ""
    return f"{dims}{where} {str(dtype)[6:]}{cast}{suffix}"


def _num(n: int) -> str:
    for unit, size in (("M", M), ("K", K)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def _geometry(shape, dim):
    dim = dim % len(shape)
    return (math.prod(shape[:dim]), shape[dim], math.prod(shape[dim + 1:]))


def _tags(shape, dim, dtype, out=None) -> dict:
    outer, n, inner = _geometry(shape, dim)
    return {"shape": list(shape), "dim": dim, "dtype": str(dtype)[6:],
            "out_dtype": str(out or dtype)[6:], "n": n, "rows": outer * inner,
            "layout": "rows" if inner == 1 else "strided"}


def _forward_case(shape, dim, dtype, out) -> Case:
    op = get_op("softmax")
    options = {"dim": dim, **({"out_dtype": str(out)[6:]} if out is not None else {})}

    def make(device: torch.device):
        return op.sample([list(shape)], dtype, dict(options), device)

    numel = math.prod(shape)
    return Case(_name(shape, dim, dtype, out), make,
                nbytes=numel * (dtype.itemsize + (out or dtype).itemsize),
                tags=_tags(shape, dim, dtype, out))


def check(got, ref, inputs) -> str | None:
    if got.dtype != ref.dtype or got.shape != ref.shape:
        return (f"dtype/shape {got.dtype} {tuple(got.shape)}, expected {ref.dtype} "
                f"{tuple(ref.shape)}")
    tol = TOL[ref.dtype]
    err = (got.double() - ref.double()).abs()
    bound = tol + tol * ref.double().abs()
    nan_ok = torch.equal(got.isnan(), ref.isnan())
    bad = int(((err > bound) & ~ref.isnan()).sum())
    if bad or not nan_ok:
        worst = float(err.nan_to_num(0).max())
        return (f"{bad} of {ref.numel()} beyond tolerance {tol} (max error {worst:.3g})"
                + ("" if nan_ok else "; NaN positions differ"))
    return None


def _peers() -> dict:
    try:
        import flag_gems
    except Exception:  # noqa: BLE001 - the peer is optional
        return {}

    def gems_softmax(x, dim=-1, dtype=None):
        if dtype is not None and not (x.dtype in (F16, BF16) and dtype == F32):
            x = x.to(dtype)
        return flag_gems.ops.softmax(x, dim, half_to_float=dtype == F32 and x.dtype in (F16, BF16))

    return {"flag_gems": gems_softmax}



def targets(rows: list[dict], summary: dict) -> dict:
    """The issue's targets, each with its measured value and whether it is met."""
    def pct(r):
        return r["pct_copy_bw"].get("auto-warm")

    long_rows = {r["case"]: pct(r) for r in rows
                 if r.get("layout") == "rows" and r.get("n", 0) >= 1024}
    slower = {r["case"]: r["speedup_vs_torch"].get("auto-warm") for r in rows
              if r["speedup_vs_torch"].get("auto-warm") is not None
              and r["speedup_vs_torch"]["auto-warm"] < 0.98}
    worst = summary.get("auto-warm_worst_vs_torch")
    geo = summary.get("auto-warm_geomean_speedup_vs_torch")
    low_bw = {k: v for k, v in long_rows.items() if v is not None and v < 85.0}
    out = {
        "target_never_2pct_slower_than_torch_worst_ratio": worst,
        "cases_more_than_2pct_slower_than_torch": slower,
        "target_1.3x_torch_geomean": geo,
        "target_85pct_copy_bw_rows_ge_1024_min": min(filter(None, long_rows.values()),
                                                      default=None),
        "rows_ge_1024_below_85pct_copy_bw": low_bw,
        "target_cold_regret_p90_within_15pct": summary.get("auto-cold_regret_p90"),
    }
    out["targets_met"] = {
        "never_2pct_slower": at_least(worst, 0.98),
        "1.3x_torch_geomean": at_least(geo, 1.3),
        "85pct_bw_rows_ge_1024": None if not long_rows else not low_bw,
        "cold_p90_15pct": None if summary.get("auto-cold_regret_p90") is None
        else bool(summary["auto-cold_regret_p90"] <= 1.15),
    }
    return out


def suite(smoke: bool) -> Suite:
    cases = [_forward_case(*c) for c in (SMOKE_FORWARD if smoke else FORWARD)]
    return Suite("softmax", cases, torch.softmax, check, peers=_peers(), targets=targets)


# ---------------------------------------------------------------------------------------------
# Forward + backward (the harness times the forward only)
# ---------------------------------------------------------------------------------------------
def _fwd_bwd(forward):
    """A provider: forward, then the gradient of x for a fixed upstream gradient."""
    def run(x, g, dim):
        xr = x.detach().requires_grad_()
        y = forward(xr, dim)
        return torch.autograd.grad(y, xr, g)[0]
    return run


def run_backward(smoke: bool, argv: list[str]) -> dict | None:
    args = harness.parse_args(argv)
    if args.merge_rows:
        return None  # (the forward's rows folded in; nothing runs)
    import opselect
    from opselect import ops
    from opselect.warm import warm_call

    op = get_op("softmax")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    time_ms = harness.timer(device, args.rep_ms, args.repeat)
    time_once = harness.timer(device, args.rep_ms, 1)
    bw = harness.copy_bandwidth(device, time_ms)
    only = {p for p in args.providers.split(",") if p}
    wanted = lambda p: not only or p in only  # noqa: E731
    print(f"# softmax forward + backward on {harness.gpu_slug(device)}", flush=True)
    peers = {}
    try:
        import flag_gems

        def gems(x, dim):
            xr = x.detach()
            y = flag_gems.ops.softmax(xr, dim)
            return flag_gems.ops.softmax_backward(g_holder[0], y, dim, x.dtype)

        peers["flag_gems"] = gems
    except Exception:  # noqa: BLE001 - the peer is optional
        pass
    g_holder: list = [None]
    rows = []
    for shape, dim, dtype in (SMOKE_BACKWARD if smoke else BACKWARD):
        name = _name(shape, dim, dtype, suffix=" fwd+bwd")
        if not harness.selected(args, name):
            continue
        torch.manual_seed(0)
        x = op.sample([list(shape)], dtype, {"dim": dim}, device)[0][0]
        g = torch.randn(shape, device=device).to(dtype)
        g_holder[0] = g
        ref = _fwd_bwd(lambda t, d: torch.softmax(t.double(), d))(x, g.double(), dim).to(dtype)
        numel = math.prod(shape)
        e = dtype.itemsize
        row = {"case": name, **_tags(shape, dim, dtype), "bytes": numel * 5 * e, "ms": {},
               "errors": {}}
        providers = {}
        if wanted("torch"):
            providers["torch"] = lambda: _fwd_bwd(torch.softmax)(x, g, dim)
        # The calls timed here run under autograd, which is a decision of its own (its own
        # memo and cache key): explain and warm that call, not the forward-only one.
        xg = x.detach().requires_grad_()
        call = op.prepare(xg, dim)
        for b in op.backends[1:]:
            if wanted(b.name) and b.supports(call) is None:
                providers[b.name] = (lambda n: lambda: _fwd_bwd(
                    lambda t, d: ops.softmax(t, d, backend=n))(x, g, dim))(b.name)
        for peer, f in peers.items():
            if wanted(peer):
                providers[peer] = (lambda f: lambda: f(x, dim))(f)
        auto = lambda: _fwd_bwd(lambda t, d: ops.softmax(t, d))(x, g, dim)  # noqa: E731
        harness.measure(row, providers, auto, ref=ref, inputs=None, check=check, wanted=wanted,
                        explain=lambda: op.explain(xg, dim).choice,
                        warm=lambda: warm_call("softmax", (xg,), {"dim": dim}),
                        time_once=time_once, rounds=args.repeat)
        harness._derive(row, op, bw)
        rows.append(row)
        print(harness._line(row), flush=True)
        del x, xg, g, ref, providers
        g_holder[0] = None
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if not rows:  # (--filter took no backward case: the saved results stay as they are)
        return None
    if args.merge:  # this run's rows over the saved ones, case by case, in the saved order
        path = harness.RESULTS / harness.gpu_slug(device) / "softmax_backward.json"
        saved = json.loads(path.read_text())["rows"] if path.exists() else []
        rows = harness.fold_by_case(saved, rows)
        for row in rows:
            harness._derive(row, op, bw)
    summary = harness._summarise(rows, bw)
    summary.update(targets(rows, summary))
    result = {"op": "softmax (forward + backward)", "device": torch.cuda.get_device_name(device)
              if device.type == "cuda" else "cpu (interpreter)", "gpu": harness.gpu_slug(device),
              "copy_bandwidth_GBps": bw / 1e9, "torch": torch.__version__,
              "triton": harness._triton_version(), "opselect": opselect.__version__,
              "date": time.strftime("%Y-%m-%d"), "smoke": smoke, "summary": summary, "rows": rows,
              "note": "bytes = 5 passes over the tensor: x read, y written (forward); y, dy read, "
                      "dx written (backward)"}
    md = harness.markdown(result)
    # .json and .md, and the chart beside them, as the harness writes the forward's
    harness.save_result("softmax_backward", result, md, result["gpu"],
                        not args.no_save and not smoke)
    print(md)
    return result


if __name__ == "__main__":
    main_guard(suite)
    smoke_run = "--smoke" in sys.argv[1:]
    run_backward(smoke_run, sys.argv[1:])
