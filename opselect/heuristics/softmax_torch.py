"""Cost model of torch's own softmax / log_softmax on CUDA (aten/src/ATen/native/cuda/SoftMax.cu),
forward and, under autograd, backward: the `torch` candidate's estimate. The constants are first
guesses from the kernels' structure, except those fitted to measured calls, which name their
heading in benchmarks/results/h200/fits/softmax.md."""

from __future__ import annotations

import math

import torch

from .softmax_shared import AUTOGRAD_ENGINE_HOST, L2_USABLE, busy, input_copy, op_name, torch_launch

#: torch's softmax kernels (aten/src/ATen/native/cuda/SoftMax.cu): the fraction of the copy
#: bandwidth each path reaches. A warp per row (up to 2048 elements and 8 KB; 1024 and 4 KB when it
#: widens half to float), else a 1024-thread block per row with the row in registers (up to
#: TORCH_REG_MAX elements; not half to float), in shared memory (under 48 KB, whole 16-byte
#: vectors) or read three times. On every row path a 16-bit element takes about a 32-bit one's
#: time: the bytes charged an element (fits/softmax.md, "TORCH_BLOCK_ELEMENT_BYTES").
TORCH_WARP_EFF = 0.85
TORCH_BLOCK_EFF = 0.80
TORCH_REG_EFF = 0.60  # two blocks an SM, in waves (fits/softmax.md, "torch's register path")
TORCH_SPATIAL_READS = 2.0  # softmax over a non-last dim: three passes, about one served by L2
TORCH_REG_MAX = 9216
TORCH_BLOCK_ELEMENT_BYTES = 4
TORCH_SMEM_BYTES = 48 * 1024
#: Seconds of a step of the serial walk down the dim each thread of torch's spatial kernels makes
#: (softmax over a non-last dim) past TORCH_SPATIAL_SMALL_BYTES: a dependent load from L2 or DRAM,
#: fitted to measured backward times (fits/softmax.md, "TORCH_SPATIAL_STEP_S").
TORCH_SPATIAL_STEP_S = 0.3e-6
#: ... and where the tensor fits in an SM's L1 (TORCH_SPATIAL_L1_BYTES): a few tens of ns at most,
#: a bound from a tiny measured call (fits/softmax.md, "TORCH_SPATIAL_CACHED_STEP_S").
TORCH_SPATIAL_CACHED_STEP_S = 0.03e-6
TORCH_SPATIAL_L1_BYTES = 64 * 1024
#: ... and up to about 1 MB (as float32), whose lines stay near the SMs: within the 0.06-0.12 us
#: a step measured on such calls (fits/softmax.md, "TORCH_SPATIAL_SMALL_STEP_S").
TORCH_SPATIAL_SMALL_STEP_S = 0.1e-6
TORCH_SPATIAL_SMALL_BYTES = 1 << 20
SM_THREADS = 2048  # an SM's threads (Ampere, Hopper): the columns torch's spatial kernels walk


def _torch_backward(call, model, fused_cast: bool) -> tuple[dict, float, str]:
    """Device parts, host seconds and a note of torch's own backward of softmax / log_softmax
    (softmax_backward_data, aten/src/ATen/native/cuda/SoftMax.cu). fused_cast: the forward
    widened half to float inside its kernel, so dx is written in the input's dtype directly."""
    n, numel, outer, inner = call.n, call.numel, call.outer, call.inner
    e_x, e_y = call.x.dtype.itemsize, call.out_dtype.itemsize
    cast_back = call.x.dtype != call.out_dtype and not fused_cast
    e_dx = e_y if cast_back else e_x
    parts: dict[str, float] = {}
    host = AUTOGRAD_ENGINE_HOST + 2 * torch_launch(model)  # the backward op, dx's allocation
    if not call.log:
        # softmax's backward forms dy * y first (its kernel then subtracts y * sum): an
        # elementwise op that reads two tensors and writes a third.
        parts["backward_mul"] = model.stream(3 * numel * e_y)
        host += 2 * torch_launch(model)
    if inner == 1:
        if n <= 1024 and n * e_dx <= 4096:
            # A warp per row, persistent: the row stays in registers, one read of each input.
            parts["backward"] = (model.stream(numel * (2 * e_y + e_dx))
                                 / (TORCH_WARP_EFF * busy(model, outer)))
            note = "backward: torch's warp-per-row kernel"
        else:
            # A block per row: a sum pass over the product (or dy), then a pass that reads it
            # again with y and writes dx; the re-read hits L2 when the rows in flight fit.
            in_flight = min(outer, 2 * model.sm_count) * n * e_y
            reuse = min(1.0, L2_USABLE * model.l2_bytes / in_flight)
            parts["backward_l2"] = numel * reuse * e_y / model.l2_bandwidth
            parts["backward"] = (model.stream(numel * ((3.0 - reuse) * e_y + e_dx))
                                 / (TORCH_BLOCK_EFF * busy(model, outer)))
            note = "backward: torch's block-per-row kernel"
    else:
        # The spatial kernel walks each column down the dim twice (the sum, then dx).
        latency = _spatial_walk(outer, n, inner, model, passes=2)
        memory = (model.stream(numel * (TORCH_SPATIAL_READS * e_y + e_dx))
                  / (TORCH_BLOCK_EFF * busy(model, outer * inner / 32)))
        parts["backward"] = max(memory, latency)
        note = "backward: torch's spatial kernel (a serial walk down the dim)"
    if cast_back:
        # The forward's cast (x.to(dtype)) is undone on the gradient.
        parts["backward_cast"] = model.stream(numel * (e_y + e_x))
        host += torch_launch(model)
    return parts, host, note


def _spatial_walk(outer: int, n: int, inner: int, model, *, passes: int) -> float:
    """Seconds of torch's spatial softmax kernels (a non-last dim) as a latency: each thread walks
    its column down the dim, `passes` times, one dependent step at a time (dim_threads threads to
    a column when the inner dims are narrow); the columns run in waves of the chip's threads."""
    inner_threads = min(inner, 1024)
    dim_threads = 1
    if inner_threads <= 64 and n >= 64:
        while inner_threads * dim_threads <= 1024 and dim_threads <= n:
            dim_threads *= 2
        dim_threads //= 2
    waves = math.ceil(outer * inner * dim_threads / (SM_THREADS * model.sm_count))
    # A step waits for a load; only a tensor small enough for an SM's L1 makes that cheap: one
    # that is only in L2 still pays about the full step (fits/softmax.md,
    # "TORCH_SPATIAL_CACHED_STEP_S").
    size = outer * n * inner * 4
    step = (TORCH_SPATIAL_CACHED_STEP_S if size <= TORCH_SPATIAL_L1_BYTES
            else TORCH_SPATIAL_SMALL_STEP_S if size <= TORCH_SPATIAL_SMALL_BYTES
            else TORCH_SPATIAL_STEP_S)
    return waves * passes * -(-n // dim_threads) * step


#: Elements a second one torch softmax block takes on a row too long for its registers
#: (fits/softmax.md, "TORCH_ROW_ELEMENTS_PER_S").
TORCH_ROW_ELEMENTS_PER_S = 3.2e9


def torch_(call, model, plan=None):
    op = op_name(call)
    n, numel = call.n, call.numel
    host = torch_launch(model)  # the op (its output's allocation is inside it)
    if numel == 0:
        return model.estimate(op, "torch", triton=False, launch=host)
    e_x, e_out = call.x.dtype.itemsize, call.out_dtype.itemsize
    parts: dict[str, float] = {}
    e_in = e_x
    # torch casts first, except half -> float on CUDA, which its kernels fuse (not bfloat16).
    fused_cast = call.x.dtype == torch.float16 and call.out_dtype == torch.float32
    if call.x.dtype != call.out_dtype and not fused_cast:
        parts["cast"] = model.stream(numel * (e_x + e_out))
        host += torch_launch(model)
        e_in = e_out
    if not call.x.is_contiguous():
        parts["copy"] = input_copy(call, model, e_in)
        host += torch_launch(model)
    if call.inner == 1:
        narrow = e_in / max(e_in, TORCH_BLOCK_ELEMENT_BYTES)  # (TORCH_BLOCK_ELEMENT_BYTES)
        warp_max = 1024 if fused_cast else 2048
        if n <= warp_max and n * e_in <= 4 * warp_max:
            reads, eff = 1.0, TORCH_WARP_EFF * narrow
        elif n <= TORCH_REG_MAX and not fused_cast:
            # Two blocks an SM at a time: rows go in waves, of which the last may be thin.
            at_once = 2 * model.sm_count
            full = call.outer / (math.ceil(call.outer / at_once) * at_once)
            reads, eff = 1.0, TORCH_REG_EFF * narrow * (full if call.outer > at_once else 1.0)
        elif n * e_in < TORCH_SMEM_BYTES and (n * e_in) % 16 == 0:
            reads, eff = 1.0, TORCH_BLOCK_EFF * narrow
        else:
            # max pass, sum pass, write pass: the re-reads hit L2 only when the rows in flight fit.
            in_flight = min(call.outer, 2 * model.sm_count) * n * e_in
            reuse = min(1.0, L2_USABLE * model.l2_bytes / in_flight)
            reads, eff = 3.0 - 2.0 * reuse, TORCH_BLOCK_EFF
            parts["l2"] = numel * 2.0 * reuse * e_in / model.l2_bandwidth
            # A block walks a row three times at a rate of its own: with few rows, that rate
            # sets the time, not the bandwidth.
            waves = math.ceil(call.outer / (2 * model.sm_count))
            parts["rows"] = waves * n / TORCH_ROW_ELEMENTS_PER_S
        programs = call.outer
    else:
        reads, eff = TORCH_SPATIAL_READS, TORCH_BLOCK_EFF
        programs = call.outer * call.inner / 32
    parts["memory"] = model.stream(numel * (reads * e_in + e_out)) / (eff * busy(model, programs))
    if "rows" in parts:  # (the longer of the two)
        parts["rows"] = max(0.0, parts["rows"] - parts["memory"])
    if call.inner > 1:
        # The forward walks the dim three times (max, sum, write): with few columns and a long
        # dim that latency, not the bytes, sets the time, and can be far longer than the bytes
        # take (fits/softmax.md, "torch's spatial forward is latency-bound").
        parts["memory"] = max(parts["memory"], _spatial_walk(call.outer, n, call.inner, model,
                                                             passes=3))
    notes: tuple[str, ...] = ()
    if call.grad:
        backward, bwd_host, note = _torch_backward(call, model, fused_cast)
        parts.update(backward)
        host += bwd_host
        notes = (note,)
    return model.estimate(op, "torch", triton=False, notes=notes, launch=host, **parts)
