"""Cost model of the matmul backends: a product takes the longer of its tensor-core time and its
memory time, each counted the way the backend's launch shapes them, plus its launch.

  * compute: the FLOPs of the tiles the programs really run (padded to whole tiles, in waves of
    programs over the SMs) at a fraction of the dtype's dense tensor-core peak (float32 without
    tf32 runs on the FMA units);
  * memory: A, B and C once each (the grouped tile order keeps re-reads in L2), at the bandwidth
    that the programs running at once can draw: a few programs on a 132-SM GPU cannot pull the
    copy bandwidth (one SM draws about PER_SM_DRAW times its share), which is what split-k fixes
    for decode-sized products; split-k adds its float32 partial tiles, written and read in L2;
  * launch: the host's part (a bound launch and the output's allocation for a Triton backend,
    an ATen op for torch), which a short product cannot hide.

The fractions of peak are first estimates from the H200's measurements
(benchmarks/results/h200/fits/matmul.md keeps the runs and the fit); the tune cache's timings
correct them per call.
"""

from __future__ import annotations

import torch

from ..dispatch.backend import Estimate
from .device_model import ALLOCATION, BOUND_LAUNCH

OPS = ("matmul", "linear")

#: Dense peak FLOP/s by GPU and operand type (datasheet figures, SXM parts).
PEAK = {
    "H200": {"16": 989e12, "tf32": 494e12, "f32": 67e12},
    "H100": {"16": 989e12, "tf32": 494e12, "f32": 67e12},
    "A100": {"16": 312e12, "tf32": 156e12, "f32": 19.5e12},
}
#: Fraction of peak each backend sustains on large products, by operand type.
EFFICIENCY = {
    "torch": {"16": 0.77, "tf32": 0.7, "f32": 0.75},
    "tiled": {"16": 0.6, "tf32": 0.55, "f32": 0.4},
    "persistent": {"16": 0.62, "tf32": 0.55, "f32": 0.4},
    "splitk": {"16": 0.5, "tf32": 0.45, "f32": 0.35},
}
#: Fraction of the copy bandwidth a product's streaming reads reach at best.
MEMORY_EFFICIENCY = {"torch": 0.8, "tiled": 0.85, "persistent": 0.85, "splitk": 0.85}
#: One SM streams about this many times its fair share (bandwidth / SMs) when few run.
PER_SM_DRAW = 2.5
#: Device seconds a kernel costs beyond its traffic and math (fill, drain, the last wave's tail).
KERNEL_FIXED = 2.5e-6


def operand_type(call) -> str:
    if call.dtype == torch.float32:
        return "tf32" if call.tf32 else "f32"
    return "16"


def peak(model, call) -> float:
    kind = operand_type(call)
    for tag, figures in PEAK.items():
        if tag in model.name.upper():
            return figures[kind]
    if "cpu" in model.name.lower():
        return {"16": 2e11, "tf32": 2e11, "f32": 2e11}[kind]
    return PEAK["H100"][kind] * model.sm_count / 132  # an unknown GPU: scaled by its SMs


def traffic(call) -> float:
    """Bytes of A, B and C, each once (a batch-broadcast operand once for the whole batch)."""
    es = call.esize
    a = call.m * call.k * (call.batch if call.sa[0] else 1)
    b = call.k * call.n * (call.batch if call.sb[0] else 1)
    return es * (a + b + call.batch * call.m * call.n)


def _draw(model, concurrent: int) -> float:
    """Bytes/s that `concurrent` programs streaming at once can draw."""
    return min(model.bandwidth, concurrent * PER_SM_DRAW * model.bandwidth / model.sm_count)


def _triton(call, model, plan, backend: str, *, programs_per_sm: int = 2) -> Estimate:
    kind = operand_type(call)
    sms = model.sm_count
    split = getattr(plan, "split", 1)
    chunk = -(-call.k // split)
    bm, bn = plan.block_m, plan.block_n
    tiles = -(-call.m // bm) * -(-call.n // bn) * call.batch
    programs = tiles * split
    slots = sms * programs_per_sm
    waves = -(-programs // slots)
    per_sm = min(programs_per_sm, -(-programs // sms))
    per_sm_peak = peak(model, call) / sms * EFFICIENCY[backend][kind]
    compute = waves * per_sm * 2 * bm * bn * chunk / per_sm_peak
    concurrent = min(programs, slots)
    memory = traffic(call) / (_draw(model, concurrent) * MEMORY_EFFICIENCY[backend])
    parts = {"launch": BOUND_LAUNCH + ALLOCATION, "compute": compute, "memory": 0.0,
             "fixed": KERNEL_FIXED}
    # Math and loads overlap (the pipeline): the longer counts, the other is hidden.
    if memory > compute:
        parts["memory"], parts["compute"] = memory, 0.0
    if split > 1:
        partial_bytes = 2 * programs * bm * bn * 4
        parts["partials"] = partial_bytes / model.l2_bandwidth
        parts["launch"] += ALLOCATION
    op = call.form if call.form in OPS else "linear"
    return model.estimate(op, backend, triton=True, **parts)


def tiled(call, model, plan) -> Estimate:
    return _triton(call, model, plan, "tiled")


def persistent(call, model, plan) -> Estimate:
    # A grid of programs_per_sm per SM: the waves are the walk's rounds.
    per_sm = max(1, plan.programs // max(1, model.sm_count))
    return _triton(call, model, plan, "persistent", programs_per_sm=per_sm)


def splitk(call, model, plan) -> Estimate:
    return _triton(call, model, plan, "splitk")


def torch_(call, model) -> Estimate:
    """cuBLAS: its own tile choice (no padding modelled), the same roofline at its fractions."""
    kind = operand_type(call)
    compute = call.flops / (peak(model, call) * EFFICIENCY["torch"][kind])
    memory = traffic(call) / (model.bandwidth * MEMORY_EFFICIENCY["torch"])
    op = call.form if call.form in OPS else "linear"
    return model.estimate(op, "torch", triton=False, launch=model.torch_launch,
                          compute=max(compute, memory), fixed=KERNEL_FIXED)
