"""Cost model of the softmax / log_softmax backends: roofline terms per backend, in seconds.

Every backend must read the input and write the output once (numel * (in + out) bytes); they differ
in how many more passes they make over the input (torch's long-row kernel reads a row three times,
online twice, the second time partly from L2), in how many programs keep the memory system busy
(one program per row cannot saturate HBM with 32 rows), and in per-tile latency (two block-wide
reductions per tile, which many-short-row calls pay millions of times).

The part named `launch` is host time (the model takes the longer of host and device): a Triton
launch plus torch allocations, plus the Python autograd.Function when the input requires grad.

The constants below are first guesses from the kernels' structure; `opselect calibrate` fits one
scale per backend on top, and the tune cache replaces the model wherever a call was measured.
"""

from __future__ import annotations

import math

from .device_model import BOUND_LAUNCH

#: Fraction of the SMs that, each running one large program, saturate DRAM bandwidth.
SATURATING_FRACTION = 0.6
#: Fraction of L2 that re-reads can count on (the rest holds other traffic and the output).
L2_USABLE = 0.5
#: Latency of one tile in the fused kernel (load, two block reductions, store), when it cannot be
#: overlapped by other programs: paid tiles / resident programs times.
FUSED_TILE_S = 0.6e-6
#: The same for a multirow tile (its reductions stay inside a warp or two).
MULTIROW_TILE_S = 0.4e-6
#: Misaligned rows (no 16-byte vector access) move data at this fraction of the aligned rate.
UNALIGNED_EFF = 0.85
#: Fraction of the copy bandwidth a single-pass Triton kernel reaches.
TRITON_EFF = 0.92
#: Host seconds of the Python autograd.Function around the Triton backends (torch's is C++).
AUTOGRAD_HOST = 15e-6
#: torch's softmax kernels: fraction of the copy bandwidth they reach on their best path.
TORCH_WARP_EFF = 0.85  # rows <= 1024: a warp per row, persistent
TORCH_BLOCK_EFF = 0.80  # a block per row, row in registers or shared memory
TORCH_SPATIAL_READS = 2.0  # softmax over a non-last dim: three passes, about one served by L2
#: torch's register path takes rows up to this many elements; its shared-memory path rows up to
#: 48 KB (and a multiple of the 16-byte vector); longer rows read the input three times.
TORCH_REG_MAX = 9216
#: ... and on that block-per-row path a 16-bit row costs about as much as a 32-bit one.
TORCH_BLOCK_ELEMENT_BYTES = 4
TORCH_SMEM_BYTES = 48 * 1024


def _name(call) -> str:
    return "log_softmax" if call.log else "softmax"


def _busy(model, programs: float) -> float:
    """Fraction of DRAM bandwidth reachable with this many concurrently running programs."""
    return min(1.0, max(programs, 1) / (SATURATING_FRACTION * model.sm_count))


def _torch_launch(model) -> float:
    return getattr(model, "torch_launch", model.launch)


def _host(call, model, *, kernels: int = 1, allocations: int = 1) -> float:
    """Host seconds of a Triton backend: its launches (bound: kernels/_common.py), torch
    allocations, the cast or copy done by torch first, and the autograd.Function."""
    host = kernels * BOUND_LAUNCH + allocations * _torch_launch(model)
    if call.cast_first or not call.fast:
        host += _torch_launch(model)
    if call.grad:
        host += AUTOGRAD_HOST
    return host


def _prepass(call, model) -> dict:
    """Device time of the torch cast (narrowing dtype=) or contiguous copy done first."""
    n = call.numel
    e_x = call.x.dtype.itemsize
    if call.cast_first:
        return {"cast": model.stream(n * (e_x + call.out_dtype.itemsize))}
    if not call.fast:
        return {"copy": model.stream(2 * n * e_x)}
    return {}


def _aligned(call) -> bool:
    """Whether rows start 16-byte aligned (the kernels use vector loads then)."""
    step = call.n if call.inner == 1 else call.inner
    return (step * call.in_bytes) % 16 == 0


def _resident(model, warps: int, elements: int, f64: bool) -> int:
    per_thread = elements / (warps * 32) * (2 if f64 else 1)
    regs = min(255, 8 * math.ceil((24 + 1.25 * per_thread) / 8))
    return model.sm_count * max(1, min(64 // warps, 65536 // (regs * 32 * warps), 16))


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def torch_(call, model, plan=None):
    op = _name(call)
    n, numel = call.n, call.numel
    host = 2 * _torch_launch(model)  # the op and its output's allocation
    if numel == 0:
        return model.estimate(op, "torch", triton=False, launch=host)
    e_x, e_out = call.x.dtype.itemsize, call.out_dtype.itemsize
    parts: dict[str, float] = {}
    e_in = e_x
    # torch casts first, except half -> float on CUDA, which its kernels fuse.
    if call.x.dtype != call.out_dtype and not (e_x == 2 and e_out == 4):
        parts["cast"] = model.stream(numel * (e_x + e_out))
        host += _torch_launch(model)
        e_in = e_out
    if not call.x.is_contiguous():
        parts["copy"] = model.stream(2 * numel * e_in)
        host += _torch_launch(model)
    if call.inner == 1:
        if n <= 1024 and n * e_in <= 4096:
            reads, eff = 1.0, TORCH_WARP_EFF
        elif n <= TORCH_REG_MAX or (n * e_in < TORCH_SMEM_BYTES and (n * e_in) % 16 == 0):
            # A block per row, its time set by the elements more than their bytes: 16- and 32-bit
            # rows of 4K took the same 58 us for 4K rows on the H200 (16K: 131 against 176).
            # Under autograd the backward, which the model leaves out, gives that gain back
            # (4K x 4K bf16 forward + backward: 111 us fused, 110 us torch), so the forward's
            # bytes stay the measure there.
            slow_bytes = e_in if call.grad else max(e_in, TORCH_BLOCK_ELEMENT_BYTES)
            reads, eff = 1.0, TORCH_BLOCK_EFF * e_in / slow_bytes
        else:
            # max pass, sum pass, write pass: the re-reads hit L2 only when the rows in flight fit.
            in_flight = min(call.outer, 2 * model.sm_count) * n * e_in
            reuse = min(1.0, L2_USABLE * model.l2_bytes / in_flight)
            reads, eff = 3.0 - 2.0 * reuse, TORCH_BLOCK_EFF
            parts["l2"] = numel * 2.0 * reuse * e_in / model.l2_bandwidth
        programs = call.outer
    else:
        reads, eff = TORCH_SPATIAL_READS, TORCH_BLOCK_EFF
        programs = call.outer * call.inner / 32
    parts["memory"] = model.stream(numel * (reads * e_in + e_out)) / (eff * _busy(model, programs))
    return model.estimate(op, "torch", triton=False, launch=host, **parts)


def fused(call, model, *, warps: int):
    op = _name(call)
    host = _host(call, model)
    if call.numel == 0:
        return model.estimate(op, "fused", triton=True, launch=host)
    parts = _prepass(call, model)
    resident = _resident(model, warps, _pow2(call.n), call.f64)
    eff = TRITON_EFF * _busy(model, min(call.outer, resident))
    eff *= 1.0 if _aligned(call) else UNALIGNED_EFF
    memory = model.stream(call.numel * (call.in_bytes + call.out_dtype.itemsize)) / eff
    latency = math.ceil(call.outer / resident) * FUSED_TILE_S
    return model.estimate(op, "fused", triton=True, launch=host, memory=max(memory, latency),
                          **parts)


def multirow(call, model):
    op = _name(call)
    host = _host(call, model)
    if call.numel == 0:
        return model.estimate(op, "multirow", triton=True, launch=host)
    parts = _prepass(call, model)
    bn = _pow2(call.n)
    block_r = max(1, min((2048 if call.f64 else 4096) // bn, _pow2(call.outer)))
    tiles = math.ceil(call.outer / block_r)
    resident = _resident(model, 4, block_r * bn, call.f64)
    eff = TRITON_EFF * _busy(model, min(tiles, resident))
    eff *= 1.0 if _aligned(call) else UNALIGNED_EFF
    memory = model.stream(call.numel * (call.in_bytes + call.out_dtype.itemsize)) / eff
    latency = math.ceil(tiles / resident) * MULTIROW_TILE_S
    return model.estimate(op, "multirow", triton=True, launch=host, memory=max(memory, latency),
                          **parts)


#: Time a wave of cooperative programs spends waiting for the row's other chunks (a guess: a few
#: polls of an L2 atomic after the slowest sibling's load).
COOP_WAIT_S = 2e-6


def online(call, model, *, split: int, cooperative: bool = False):
    op = _name(call)
    if cooperative:
        # One read and one write; the programs of a row wait for each other (a few us per wave
        # of rows), and the counters are zeroed by one more launch.
        host = _host(call, model, kernels=2, allocations=3)
        if call.numel == 0:
            return model.estimate(op, "online", triton=True, launch=host)
        parts = _prepass(call, model)
        programs = call.outer * split
        eff = TRITON_EFF * _busy(model, programs) * (1.0 if _aligned(call) else UNALIGNED_EFF)
        parts["memory"] = model.stream(call.numel * (call.in_bytes + call.out_dtype.itemsize)) / eff
        parts["sync"] = COOP_WAIT_S * math.ceil(programs / (2 * model.sm_count))
        return model.estimate(op, "online", triton=True, launch=host, **parts)
    if split == 1:
        host = _host(call, model)
    else:  # two kernels, the output and two workspaces
        host = _host(call, model, kernels=2, allocations=3)
    if call.numel == 0:
        return model.estimate(op, "online", triton=True, launch=host)
    parts = _prepass(call, model)
    e_in, e_out = call.in_bytes, call.out_dtype.itemsize
    usable = L2_USABLE * model.l2_bytes
    if split == 1:
        programs = call.outer
        # Rows in flight while a program re-reads its own row (backwards, last chunks first).
        in_flight = min(call.outer, 2 * model.sm_count) * call.n * e_in
    else:
        programs = call.outer * split
        # The stats kernel reads everything before the normalising kernel re-reads it (reversed).
        in_flight = call.numel * e_in
    reuse = min(1.0, usable / max(in_flight, 1))
    eff = TRITON_EFF * _busy(model, programs) * (1.0 if _aligned(call) else UNALIGNED_EFF)
    parts["memory"] = model.stream(call.numel * ((2.0 - reuse) * e_in + e_out)) / eff
    parts["l2"] = call.numel * reuse * e_in / model.l2_bandwidth
    return model.estimate(op, "online", triton=True, launch=host, **parts)


def strided(call, model, *, block_i: int, single: bool):
    op = _name(call)
    host = _host(call, model)
    if call.numel == 0:
        return model.estimate(op, "strided", triton=True, launch=host)
    parts = _prepass(call, model)
    e_in, e_out = call.in_bytes, call.out_dtype.itemsize
    programs = call.outer * math.ceil(call.inner / block_i)
    if single:
        reads = 1.0
    else:
        in_flight = min(programs, 4 * model.sm_count) * call.n * block_i * e_in
        reuse = min(1.0, L2_USABLE * model.l2_bytes / in_flight)
        reads = 2.0 - reuse
        parts["l2"] = call.numel * reuse * e_in / model.l2_bandwidth
    eff = TRITON_EFF * _busy(model, programs) * (1.0 if _aligned(call) else UNALIGNED_EFF)
    if block_i < call.inner and block_i * e_in < 128:
        # Row segments shorter than a 128-byte line: neighbouring programs read the line's other
        # sectors, mostly from L2, at some cost.
        eff *= 0.6 + 0.4 * block_i * e_in / 128
    parts["memory"] = model.stream(call.numel * (reads * e_in + e_out)) / eff
    return model.estimate(op, "strided", triton=True, launch=host, **parts)
