"""Jit helpers more than one op's kernels call."""

from __future__ import annotations

import triton
import triton.language as tl

from ..dispatch.device import INTERPRETED

#: Triton's interpreter converts float32 to bfloat16 by truncation (toward zero; the GPU rounds
#: to nearest even, as torch does): kernels that store bfloat16 round by hand under it
#: (bf16_nearest_even); compiled kernels keep the hardware conversion.
ROUND_BF16_BY_HAND = tl.constexpr(INTERPRETED)


@triton.jit
def bf16_nearest_even(v):
    """float32 -> bfloat16, rounded to nearest even on the bits (NaN stays a quiet NaN)."""
    bits = v.to(tl.uint32, bitcast=True)
    rounded = (bits + (0x7FFF + ((bits >> 16) & 1))) >> 16
    rounded = tl.where(v != v, 0x7FC0, rounded)
    return rounded.to(tl.uint16).to(tl.bfloat16, bitcast=True)
