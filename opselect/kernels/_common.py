"""Small helpers shared by the kernel modules (host side)."""

from __future__ import annotations

import torch

INT32_SAFE = 2**31 - 2**20  # above this, offsets in kernels are computed in 64 bits


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def needs_int64(*numels: int) -> bool:
    """Offsets overflow int32 past 2**31 elements; add margin for block tails."""
    return max(numels, default=0) >= INT32_SAFE


def flat(t: torch.Tensor) -> torch.Tensor:
    """A contiguous 1-d view of t (a copy only when t is not contiguous)."""
    return t.reshape(-1) if t.is_contiguous() else t.contiguous().view(-1)


FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
