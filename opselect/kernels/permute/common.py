"""What several permute backends share: the index arithmetic of up to eight dims (jit helpers)
and the base class of the Triton backends."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...dispatch.backend import Backend
from .call import PermuteCall


#: Integer types of each unit width: the kernels move bytes, never values.
UNIT_DTYPES = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


# ---------------------------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------------------------
@triton.jit
def _offset(i, n0, t0, n1, t1, n2, t2, n3, t3, n4, t4, n5, t5, n6, t6, n7, t7,
            ND: tl.constexpr):
    """Input offset of the linear index i over ND dims (innermost first: sizes n, strides t).

    The outermost dim needs no modulo (i is in range), so ND dims cost ND - 1 div/mod pairs; the
    remainder is taken as i - q * n (one division, not two). Exactly one `ND == k` branch ends it.
    """
    off = i * 0
    rem = i
    if ND == 1:
        off += rem * t0
    if ND > 1:
        q = rem // n0
        off += (rem - q * n0) * t0
        rem = q
    if ND == 2:
        off += rem * t1
    if ND > 2:
        q = rem // n1
        off += (rem - q * n1) * t1
        rem = q
    if ND == 3:
        off += rem * t2
    if ND > 3:
        q = rem // n2
        off += (rem - q * n2) * t2
        rem = q
    if ND == 4:
        off += rem * t3
    if ND > 4:
        q = rem // n3
        off += (rem - q * n3) * t3
        rem = q
    if ND == 5:
        off += rem * t4
    if ND > 5:
        q = rem // n4
        off += (rem - q * n4) * t4
        rem = q
    if ND == 6:
        off += rem * t5
    if ND > 6:
        q = rem // n5
        off += (rem - q * n5) * t5
        rem = q
    if ND == 7:
        off += rem * t6
    if ND > 7:
        q = rem // n6
        off += (rem - q * n6) * t6
        rem = q
    if ND == 8:
        off += rem * t7
    return off


def _units(t: torch.Tensor, unit: int) -> torch.Tensor:
    """t's bytes as a tensor of `unit`-byte integers starting at t's first element (offsets are
    computed by the kernels, so only the pointer and the element type matter)."""
    dtype = UNIT_DTYPES[unit]
    if t.element_size() == unit:
        return t.view(dtype)
    if t.is_contiguous():
        # as_strided, not reshape: a contiguous tensor may still carry odd strides on size-1 dims.
        return t.as_strided((t.numel(),), (1,)).view(dtype)
    # A strided view regrouped into wider (or, for 16-byte elements, narrower) units: a 1-d view
    # of the storage from t's first byte (the caller checked the alignment).
    start = t.storage_offset() * t.element_size()
    storage = t.untyped_storage()
    n = (storage.nbytes() - start) // unit
    return torch.empty(0, dtype=dtype, device=t.device).set_(storage, start // unit, (n,), (1,))


def _padded(dims: list[tuple[int, int]], n: int) -> list[int]:
    """Flatten (size, stride) pairs, padded with (1, 0) to n pairs (a size of 1 is specialised
    into a constant by Triton, so the padding costs nothing)."""
    flat: list[int] = []
    for size, stride in dims:
        flat += [size, stride]
    flat += [1, 0] * (n - len(dims))
    return flat


def _tiles_per_program(wanted: int, n_tiles: int) -> int:
    """The largest power of two up to `wanted` that divides the tile count (so no program has a
    ragged tail to mask) and leaves at least two programs."""
    tpp = 1
    while tpp < wanted and n_tiles % (2 * tpp) == 0 and n_tiles // (2 * tpp) >= 2:
        tpp *= 2
    return tpp


class _TritonBackend(Backend):
    def supports(self, call: PermuteCall) -> str | None:
        if call.torch_only is not None:
            return call.torch_only
        return self.device_reason(call.info)
