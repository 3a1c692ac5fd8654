"""topk's bitonic backend: a bitonic sort of each row in registers (short rows)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ...dispatch.backend import PlannedBackend
from ...heuristics import topk as cost
from .._common import cdiv, next_pow2
from .call import PreparedRuns, TopkCall, _output_maker, _output_finisher, _reader
from .common import _order_key, check_config, plan_launcher


BITONIC_MAX = 16384


# ---------------------------------------------------------------------------------------------
# Kernels: bitonic
# ---------------------------------------------------------------------------------------------
@triton.jit(do_not_specialize=["R", "k", "flip"])
def _bitonic_kernel(x_ptr, val_ptr, idx_ptr, R, N, k, row_stride, col_stride, flip,
                    rows_per_program: tl.constexpr, row_padded: tl.constexpr,
                    k_padded: tl.constexpr, is_float: tl.constexpr):
    """rows_per_program rows of up to row_padded elements, loaded once (strided rows too: a
    column-major tile is read along its contiguous axis). Key and column are packed in one int64
    so that one bitonic network orders both; padding is the smallest int64 and never outranks a
    real element (a real element packed equal to it decodes to the same key and index 0)."""
    pid = tl.program_id(0)
    rows = pid.to(tl.int64) * rows_per_program + tl.arange(0, rows_per_program).to(tl.int64)
    cols = tl.arange(0, row_padded)
    row_ok = rows < R
    col_ok = cols < N
    ptrs = x_ptr + rows[:, None] * row_stride + cols[None, :].to(tl.int64) * col_stride
    x = tl.load(ptrs, mask=row_ok[:, None] & col_ok[None, :], other=0)
    key = _order_key(x, is_float, flip, False)
    packed = (key.to(tl.int64) << 32) | cols[None, :].to(tl.int64)
    packed = tl.where(col_ok[None, :], packed, -9223372036854775807 - 1)
    if k_padded == 1:
        # (triton 3.6's tl.topk reduces one row of k = 1 to a scalar and fails to compile)
        top = tl.max(packed, axis=1)[:, None]
    elif k_padded < row_padded:
        # a bitonic top-k: log2(k_padded) merge stages, then halvings
        top = tl.topk(packed, k_padded, dim=1)
    else:
        top = tl.sort(packed, dim=1, descending=True)
    idx = top & 0xFFFFFFFF
    kc = tl.arange(0, k_padded)
    om = row_ok[:, None] & (kc[None, :] < k)
    v = tl.load(x_ptr + rows[:, None] * row_stride + idx * col_stride, mask=om)
    out = rows[:, None] * k + kc[None, :]
    tl.store(val_ptr + out, v, mask=om)
    tl.store(idx_ptr + out, idx, mask=om)


@dataclass(frozen=True, eq=False)
class BitonicPlan:
    """Launch parameters of the bitonic backend: `rows_per_program` whole rows, each padded to a
    power of two and held in registers, sorted or topk-merged by one program."""

    rows_per_program: int = 0  # rows each program holds (a power of two)
    row_padded: int = 0  # a row's length rounded up to a power of two
    k_padded: int = 0  # k rounded up to a power of two
    num_warps: int = 0  # warps per program
    is_float: bool = False  # floating-point keys (their bits are reordered to compare as integers)
    row_stride: int = 0  # elements between rows
    col_stride: int = 0  # elements between a row's neighbours
    flip: int = 0  # 0, or -1 for the smallest k (complements every key: see _order_key)


# The spec is the plan (made per call's sizes, dtype, layout and direction): it fixes every
# integer argument Triton specialises on, every constexpr (each the plan's field of its name)
# and the warps.
_BITONIC = plan_launcher(_bitonic_kernel)


#: The config keys of bitonic's plan (any other is refused: see check_config).
CONFIG_KEYS = frozenset({"rows_per_program", "num_warps"})


# ---------------------------------------------------------------------------------------------
# bitonic
# ---------------------------------------------------------------------------------------------
class BitonicBackend(PreparedRuns, PlannedBackend):
    name = "bitonic"
    estimate = staticmethod(cost.bitonic)
    MAX_N = BITONIC_MAX

    def supports(self, call: TopkCall) -> str | None:
        if call.input.dtype.itemsize > 4:
            return ("bitonic packs a 32-bit key with the index in one int64; "
                    f"{str(call.input.dtype)[6:]} keys are 64 bits (radix and sort take them)")
        if call.N > self.MAX_N:
            return (f"rows of {call.N} elements; bitonic holds a row in registers "
                    f"(at most {self.MAX_N})")
        return None

    def configs(self, call: TopkCall) -> list[dict]:
        npow = max(1, next_pow2(call.N))
        out = []
        for per_prog in (2048, 8192):
            rows = max(1, min(next_pow2(max(call.R, 1)), per_prog // npow))
            elems = rows * npow
            warps = 4 if elems <= 2048 else (8 if elems <= 4096 else 16)
            cfg = {"rows_per_program": rows, "num_warps": warps}
            if cfg not in out:
                out.append(cfg)
        return out

    def _prepared(self, p, call: TopkCall):
        """The prepared call (see Backend.bind) under the plan p: a function of the input,
        everything else worked out here once."""
        read = _reader(call, unit_col=False)[0]
        R = call.R
        new_outputs, finish = _output_maker(call), _output_finisher(call)
        launch = _BITONIC.bind(p, (cdiv(R, p.rows_per_program),), call.info.index)
        ints = (R, call.N, call.k, p.row_stride, p.col_stride, p.flip)

        def topk(x: torch.Tensor):
            if read is not None:
                x = read(x)
            values, indices = new_outputs()
            launch(x, values, indices, *ints)
            return finish(values, indices)

        return topk

    def plan_facts(self, call: TopkCall) -> tuple:
        return call.R, call.N, call.k, call.input.dtype, call.largest, _reader(call, False)[1:]

    def make_plan(self, call: TopkCall, config: dict, sms: int) -> BitonicPlan:
        check_config("topk bitonic", config, CONFIG_KEYS)
        _, row_stride, col_stride = _reader(call, unit_col=False)
        return BitonicPlan(rows_per_program=config["rows_per_program"],
                           row_padded=max(1, next_pow2(call.N)), k_padded=next_pow2(call.k),
                           num_warps=config["num_warps"],
                           is_float=call.input.dtype.is_floating_point, row_stride=row_stride,
                           col_stride=col_stride, flip=0 if call.largest else -1)
