"""softmax over a short non-last dim (padded to at most heuristics.softmax.SHORT_DIM_MAX, held
whole in registers): strided's tile and warps for such dims, before and after the short-dim rule,
forward and backward, against torch. Device time only (do_bench, L2 flushed), the providers in
turns over --rounds rounds (3; median and spread).

    python benchmarks/probe_softmax_short.py [--json out.json] [--rounds 3] [--smoke]
        [--sweep | --bound]

Default: "before" is the general rule (SHORT_DIM_MAX set to 0 while the calls are prepared: a
tile of up to 16384 elements, about 16 elements a thread), "after" the short-dim rule (a quarter
of the tile, at least 32 columns; cost.single_warps); the forward is strided's first config
through its prepared call, the backward autograd's prepared backward; with the cold pick after.

--sweep times the single-pass layout at forced column blocks and warp counts instead (forward:
16-256 columns, 2-16 warps; backward: 32-256 columns, 1-8 warps): the data of the rule
(fits/softmax.md, "Short dims").

--bound times the forward's bound on columns (cost.SHORT_FWD_COLUMNS_MAX): strided's first
config without it ("unbounded", the bound set to 0 while the call is prepared) and with it
(fits/softmax.md, "Short dims: the forward at most 64 columns"); the forward only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.setdefault("OPSELECT_CACHE_DIR", tempfile.mkdtemp(prefix="opselect-short-"))

import torch  # noqa: E402

import harness  # noqa: E402
from opselect.dispatch import get_op  # noqa: E402
from opselect.heuristics import softmax as cost  # noqa: E402
from opselect.kernels.softmax import autograd  # noqa: E402
from opselect.kernels.softmax import strided  # noqa: E402
from opselect.kernels.softmax.common import (_align, _read_dtype, cdiv, next_pow2,  # noqa: E402
                                             strided_launch_plan)

#: (shape, dim, dtype, log): dims of 7 to 256, columns on and off the 16-byte grid, a dim 0 and
#: an attention-shaped call over the heads; the last three are longer dims' controls.
CALLS = [((1000, 33, 777), 1, torch.float16, True), ((1000, 33, 768), 1, torch.float16, True),
         ((100, 60, 4000), 1, torch.bfloat16, False), ((4000, 17, 250), 1, torch.float16, True),
         ((2000, 7, 333), 1, torch.float32, False), ((64, 100, 5000), 1, torch.float32, False),
         ((256, 64, 1024), 0, torch.bfloat16, False), ((30, 200, 3000), 1, torch.float16, False),
         ((16, 128, 4096), 1, torch.bfloat16, True), ((101, 323), 0, torch.float32, False),
         ((8, 64, 65536), 1, torch.bfloat16, False), ((4096, 32, 512), 1, torch.float32, False),
         ((2, 256, 100000), 1, torch.float16, False), ((64, 12, 197, 197), 1, torch.float16, False),
         ((25, 3, 944), 1, torch.float32, False), ((64, 512, 512), 1, torch.float32, False),
         ((256, 64, 1024), 0, torch.float32, False), ((256, 64, 1024), 0, torch.float16, False)]
SMOKE = [((3, 5, 40), 1, torch.float32, True), ((3, 70, 40), 1, torch.float16, False)]


def _name(shape, dim, dtype, log) -> str:
    return (f"{'log_' if log else ''}softmax {'x'.join(map(str, shape))} dim={dim} "
            f"{str(dtype)[6:]}")


def _forward(op, call):
    backend = op.backend("strided")
    config = backend.configs(call)[0]
    prepared = backend.bind(call, config)
    x = call.x
    return config, ((lambda: prepared(x)) if prepared is not None
                    else (lambda: backend.run(call, config)))


def ab_groups(op, call, y, g) -> dict:
    """Before (the general rule) and after, forward and backward, with torch first."""
    dim, log, dtype = call.dim, call.log, call.x.dtype
    ref = torch._log_softmax_backward_data if log else torch._softmax_backward_data
    keep = cost.SHORT_DIM_MAX
    cost.SHORT_DIM_MAX = 0
    try:
        _, fwd_before = _forward(op, call)
        bwd_before = autograd.prepare_backward(y, g, dim, log, dtype)
    finally:
        cost.SHORT_DIM_MAX = keep
    _, fwd_after = _forward(op, call)
    bwd_after = autograd.prepare_backward(y, g, dim, log, dtype)
    return {"fwd": {"torch": lambda: op.backend("torch").run(call, {}), "before": fwd_before,
                    "after": fwd_after},
            "bwd": {"torch": lambda: ref(g, y, dim, dtype), "before": lambda: bwd_before(y, g),
                    "after": lambda: bwd_after(y, g)}}


def bound_groups(op, call) -> dict:
    """The forward with and without the bound on a short dim's columns, torch first."""
    keep = cost.SHORT_FWD_COLUMNS_MAX
    cost.SHORT_FWD_COLUMNS_MAX = 0
    try:
        before, unbounded = _forward(op, call)
    finally:
        cost.SHORT_FWD_COLUMNS_MAX = keep
    after, bounded = _forward(op, call)
    return {"fwd": {"torch": lambda: op.backend("torch").run(call, {}),
                    f"unbounded {before.get('inner_block')}": unbounded,
                    f"bounded {after.get('inner_block')}": bounded}}


def sweep_groups(op, call, y, g, smoke: bool) -> dict:
    """The single-pass layout at forced column blocks and warps, forward and backward."""
    _, outer, n, inner, so, sn = strided.strided_view(call)
    a, pn = _align(inner, so, sn), next_pow2(n)
    dim, log, dtype = call.dim, call.log, call.x.dtype
    ref = torch._log_softmax_backward_data if log else torch._softmax_backward_data
    fwd = {"torch": lambda: op.backend("torch").run(call, {}), "library": _forward(op, call)[1]}
    for bi in (16, 32, 64, 128, 256):
        if pn * bi > 16384 or bi > next_pow2(inner):
            continue
        for warps in ((2, 4) if smoke else (2, 4, 8, 16)):
            ints = (n, inner // a, cdiv(inner, bi), so // a, sn // a)
            plan = strided_launch_plan(_read_dtype(call), call.out_dtype, None, ints, a, log,
                                       call.f64, pn, bi, True, False, warps, False)
            prepared = strided._strided_fwd(plan, call)
            fwd[f"b{bi} w{warps}"] = lambda p=prepared: p(call.x)
    library = autograd.prepare_backward(y, g, dim, log, dtype)
    bwd = {"torch": lambda: ref(g, y, dim, dtype), "library": lambda: library(y, g)}
    real_plan, real_warps = autograd._strided_plan, autograd._warps
    for bi in (32, 64, 128, 256):
        if pn * bi > cost.BWD_STRIDED_TILE or bi > next_pow2(inner):
            continue
        for warps in ((1, 2) if smoke else (1, 2, 4, 8)):
            autograd._strided_plan = lambda *args, bi=bi, **kwargs: (bi, pn, True)
            autograd._warps = lambda elements, w=warps: w
            try:
                prepared = autograd.prepare_backward(y, g, dim, log, dtype)
            finally:
                autograd._strided_plan, autograd._warps = real_plan, real_warps
            bwd[f"b{bi} w{warps}"] = lambda p=prepared: p(y, g)
    return {"fwd": fwd, "bwd": bwd}


def time_group(args, device, name: str, fns: dict, extra: dict, results: dict) -> None:
    """Check every provider against the first (torch), then time them in turns."""
    want = fns["torch"]().double()
    for label, fn in fns.items():
        torch.testing.assert_close(fn().double(), want, atol=2e-2, rtol=1e-2, equal_nan=True,
                                   msg=lambda m: f"{name} {label}: {m}")
    if device.type != "cuda":
        print(f"{name}: {', '.join(fns)} ok")
        return
    samples = harness.do_bench_in_turns(fns, args.rounds)
    us = {k: round(statistics.median(v), 1) for k, v in samples.items()}
    spread = {k: round(max(v) - min(v), 1) for k, v in samples.items()}
    results[name] = {"us": us, "spread": spread, **extra}
    best = sorted(us.items(), key=lambda kv: kv[1])[:4]
    shown = ("torch", "before", "after", "library")
    print(f"{name}: {' '.join(f'{k}={v}' for k, v in us.items() if k.startswith(shown))}"
          f" | best {best}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default="")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="two tiny calls, any device")
    ap.add_argument("--sweep", action="store_true", help="forced layouts (see above)")
    ap.add_argument("--bound", action="store_true", help="the forward's bound on columns")
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    results: dict = {}
    for shape, dim, dtype, log in (SMOKE if args.smoke else CALLS):
        op = get_op("log_softmax" if log else "softmax")
        call = op.prepare(torch.randn(shape, device=device).to(dtype), dim)
        y = op.backend("torch").run(call, {})
        g = torch.randn_like(y)
        groups = (sweep_groups(op, call, y, g, args.smoke) if args.sweep
                  else bound_groups(op, call) if args.bound else ab_groups(op, call, y, g))
        extra = {} if args.sweep or args.bound else {
            "cold_pick_after": op.decide(call, tune=False).choice}
        for tag, fns in groups.items():
            time_group(args, device, f"{_name(shape, dim, dtype, log)} {tag}", fns, extra,
                       results)
    out = args.json or (str(Path(os.environ["OUT"], "probe_softmax_short.json"))
                        if os.environ.get("OUT") else "")
    if out:
        Path(out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
