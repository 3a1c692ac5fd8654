"""`opselect calibrate`: measure the cost model's constants on this device, then fit one correction
per backend (measured over predicted time, geometric mean over each op's calibration shapes).

The microbenchmarks time exactly the mechanisms the cost functions charge for: streaming copies,
launches, host syncs, random loads from L2 / DRAM / on-chip tables, atomics, comparisons, sorts.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable

import torch
import triton
import triton.language as tl

from ..dispatch.device import device_info
from ..dispatch.tuning_mode import measure
from .device_model import DeviceModel, defaults_for, forget_models, with_calibration


@triton.jit
def _noop_kernel(x_ptr):
    pass


@triton.jit
def _gather_kernel(idx_ptr, table_ptr, out_ptr, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < N
    idx = tl.load(idx_ptr + offs, mask=ok, other=0)
    tl.store(out_ptr + offs, tl.load(table_ptr + idx, mask=ok), mask=ok)


@triton.jit
def _local_gather_kernel(idx_ptr, table_ptr, out_ptr, N, T: tl.constexpr, BLOCK: tl.constexpr,
                         REPEAT: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < N
    table = tl.load(table_ptr + tl.arange(0, T))
    idx = tl.load(idx_ptr + offs, mask=ok, other=0)
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    # REPEAT dependent lookups per element so the on-chip gathers, not the streaming, dominate.
    for _ in tl.static_range(REPEAT):
        idx = tl.gather(table, idx, 0) & (T - 1)
        acc += idx
    tl.store(out_ptr + offs, acc, mask=ok)


@triton.jit
def _atomic_kernel(idx_ptr, table_ptr, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < N
    idx = tl.load(idx_ptr + offs, mask=ok, other=0)
    tl.atomic_cas(table_ptr + idx, idx, idx + 1, sem="relaxed")


def _time(fn: Callable[[], Any], device: torch.device) -> float:
    return measure(fn, device, budget_ms=100.0)


def _host_time(fn: Callable[[], Any], device: torch.device, calls: int = 300) -> float:
    """Host seconds per call of fn, queueing work without waiting for it (the launch cost)."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - t0
    torch.cuda.synchronize(device)
    return elapsed / calls


def measure_constants(device: torch.device, log: Callable[[str], None] = print) -> dict[str, float]:
    c: dict[str, float] = {}
    n = 1 << 28  # 256 MiB copies: far past L2
    src = torch.empty(n, dtype=torch.uint8, device=device).random_(0, 255)
    dst = torch.empty_like(src)
    c["bandwidth"] = 2 * n / _time(lambda: dst.copy_(src), device)
    small = 1 << 22  # 4 MiB: stays in L2 between repeats when the flush is skipped
    s2, d2 = src[:small], dst[:small]
    t0 = time.perf_counter()
    for _ in range(200):
        d2.copy_(s2)
    torch.cuda.synchronize(device)
    c["l2_bandwidth"] = max(c["bandwidth"], 2 * small * 200 / (time.perf_counter() - t0))
    del src, dst
    log(f"  bandwidth {c['bandwidth'] / 1e9:.0f} GB/s")

    x = torch.empty(1, device=device)
    c["launch"] = _host_time(lambda: _noop_kernel[(1,)](x), device)
    c["torch_launch"] = _host_time(lambda: x.add_(1), device)
    one = torch.ones(1, device=device)
    for _ in range(10):
        one.item()
    t0 = time.perf_counter()
    for _ in range(200):
        (one + 1).item()
    c["sync"] = (time.perf_counter() - t0) / 200
    log(f"  launch: Triton {c['launch'] * 1e6:.1f} us, torch {c['torch_launch'] * 1e6:.1f} us; "
        f"sync {c['sync'] * 1e6:.1f} us")

    m = 1 << 24
    out = torch.empty(m, dtype=torch.int32, device=device)
    for name, table_elems in (("gather_l2", 1 << 21), ("gather_dram", 1 << 28)):
        table = torch.randint(0, 1 << 30, (table_elems,), dtype=torch.int32, device=device)
        idx = torch.randint(0, table_elems, (m,), dtype=torch.int32, device=device)
        t = _time(lambda: _gather_kernel[(triton.cdiv(m, 1024),)](idx, table, out, m, BLOCK=1024),
                  device)
        c[name] = max(0.0, t - 8 * m / c["bandwidth"]) / m
        del table
    log(f"  random loads: L2 {1 / c['gather_l2'] / 1e9:.0f} G/s, DRAM {1 / c['gather_dram'] / 1e9:.0f} G/s")

    t_small = 2048
    table = torch.randint(0, t_small, (t_small,), dtype=torch.int32, device=device)
    idx = torch.randint(0, t_small, (m,), dtype=torch.int32, device=device)
    rep = 8
    t = _time(lambda: _local_gather_kernel[(triton.cdiv(m, 2048),)](
        idx, table, out, m, T=t_small, BLOCK=2048, REPEAT=rep, num_warps=8), device)
    c["gather_smem"] = max(0.0, t - 8 * m / c["bandwidth"]) / (m * rep)

    slots = 1 << 22
    table = torch.zeros(slots, dtype=torch.int32, device=device)
    idx = torch.randint(0, slots, (m,), dtype=torch.int32, device=device)
    c["atomic"] = _time(lambda: _atomic_kernel[(triton.cdiv(m, 1024),)](idx, table, m, BLOCK=1024),
                        device) / m
    log(f"  on-chip lookups {1 / c['gather_smem'] / 1e9:.0f} G/s, atomics {1 / c['atomic'] / 1e9:.1f} G/s")

    from ..kernels.isin import CompareBackend, prepare

    a = torch.randint(0, 1 << 30, (m,), dtype=torch.int32, device=device)
    b = torch.randint(0, 1 << 30, (256,), dtype=torch.int32, device=device)
    cb = CompareBackend()
    call = prepare(a, b)
    t = _time(lambda: cb.run(call, cb.configs(call)[0]), device)
    c["compare"] = max(1e-15, t - 5 * m / c["bandwidth"]) / (m * 256)

    keys = torch.randint(0, 1 << 30, (1 << 24,), dtype=torch.int32, device=device)
    tiny = keys[:16]
    c["sort_fixed"] = _time(lambda: torch.sort(tiny), device)
    t = _time(lambda: torch.sort(keys), device)
    # model.sort charges passes * 3 * n * bytes(keys + int64 indices) * sort_per_byte.
    c["sort_per_byte"] = max(1e-15, t - c["sort_fixed"]) / (4 * 3 * keys.numel() * (4 + 8))
    log(f"  compares {1 / c['compare'] / 1e12:.1f} T/s, sort {keys.numel() / t / 1e9:.2f} Gkeys/s")
    del keys, a, b, out, idx, table
    torch.cuda.empty_cache()
    return c


def fit_scales(device: torch.device, model: DeviceModel,
               log: Callable[[str], None] = print) -> dict[str, float]:
    """Per op and backend: the geometric mean of measured over predicted time on the op's
    calibration shapes (each op lists them as Op.calibration: [(shapes, dtype, options), ...])."""
    from ..dispatch import all_ops

    scales: dict[str, float] = {}
    for op in all_ops():
        shapes_list = getattr(op, "calibration", None) or []
        logs: dict[str, list[float]] = {}
        for shapes, dtype, options in shapes_list:
            args, kwargs = op.sample(shapes, dtype, dict(options), device)
            call = op.prepare(*args, **kwargs)
            for cand in op.plan(call, model):
                if not cand.supported:
                    continue
                b = op.backend(cand.name)
                cfg = b.configs(call)[0]
                try:
                    t = _time(lambda: b.run(call, cfg), device)
                except Exception as exc:  # noqa: BLE001 - report and skip the backend
                    log(f"  {op.name}/{b.name} failed on {shapes}: {exc}")
                    continue
                # Undo any earlier scale: the fit is against the bare roofline.
                bare = cand.predicted_s / model.scales.get(f"{op.name}/{b.name}", 1.0)
                if bare > 0 and math.isfinite(t):
                    logs.setdefault(b.name, []).append(math.log(t / bare))
        for name, xs in logs.items():
            scales[f"{op.name}/{name}"] = math.exp(sum(xs) / len(xs))
            log(f"  {op.name}/{name}: measured / predicted = {scales[f'{op.name}/{name}']:.2f}")
    return scales


def calibrate(device: torch.device, *, fit: bool = True, log: Callable[[str], None] = print) -> DeviceModel:
    """Measure, fit, store in the tune cache, and return the calibrated model."""
    if device.type != "cuda":
        raise RuntimeError("calibrate measures a GPU; no CUDA device is available")
    from ..tune_cache import store

    info = device_info(device)
    log(f"calibrating {info.name} ({info.sm_count} SMs)")
    constants = measure_constants(device, log)
    model = with_calibration(defaults_for(info), constants, {})
    scales = fit_scales(device, model, log) if fit else {}
    store().put_calibration(info, constants, scales)
    forget_models()
    return with_calibration(model, {}, scales)
