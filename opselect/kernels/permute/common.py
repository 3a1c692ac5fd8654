"""What several permute backends share: the index arithmetic of up to eight dims (jit helpers),
the base class of the Triton backends and their prepared call (the views the kernels take, the
output, the bound launch)."""

from __future__ import annotations

import math
from typing import Callable

import torch
import triton
import triton.language as tl

from ...dispatch.backend import PlannedBackend
from .._common import BoundLaunch, Launcher, allocator, check_config, plan_launcher  # noqa: F401 (the backends import the last two from here)
from .call import PermuteCall, _direct_out, _finish


#: Integer types of each unit width: the kernels move bytes, never values.
UNIT_DTYPES = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


# ---------------------------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------------------------
@triton.jit
def _offset(i, n0, t0, n1, t1, n2, t2, n3, t3, n4, t4, n5, t5, n6, t6, n7, t7,
            dims: tl.constexpr):
    """Input offset of the linear index i over `dims` dims (innermost first: sizes n, strides
    t). The outermost dim needs no modulo (i is in range), so d dims cost d - 1 div/mod pairs;
    the remainder is taken as i - q * n (one division, not two). Exactly one `dims == k` branch
    ends it.
    """
    off = i * 0
    rem = i
    if dims == 1:
        off += rem * t0
    if dims > 1:
        q = rem // n0
        off += (rem - q * n0) * t0
        rem = q
    if dims == 2:
        off += rem * t1
    if dims > 2:
        q = rem // n1
        off += (rem - q * n1) * t1
        rem = q
    if dims == 3:
        off += rem * t2
    if dims > 3:
        q = rem // n2
        off += (rem - q * n2) * t2
        rem = q
    if dims == 4:
        off += rem * t3
    if dims > 4:
        q = rem // n3
        off += (rem - q * n3) * t3
        rem = q
    if dims == 5:
        off += rem * t4
    if dims > 5:
        q = rem // n4
        off += (rem - q * n4) * t4
        rem = q
    if dims == 6:
        off += rem * t5
    if dims > 6:
        q = rem // n5
        off += (rem - q * n5) * t5
        rem = q
    if dims == 7:
        off += rem * t6
    if dims > 7:
        q = rem // n6
        off += (rem - q * n6) * t6
        rem = q
    if dims == 8:
        off += rem * t7
    return off


def _unit_view(shape, strides, dtype: torch.dtype, unit: int
              ) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """How a kernel sees any tensor of this shape, strides and dtype: as `unit`-byte integers
    starting at its first element (offsets are computed by the kernels, so only the pointer and
    the element type matter). Worked out once per geometry: the cheapest tensor op that gives
    the view, or None where the tensor is of that type already."""
    target = UNIT_DTYPES[unit]
    if dtype == target:
        return None
    esize = dtype.itemsize
    if esize == unit or _views_as(shape, strides, esize, unit):
        return lambda t: t.view(target)
    if _is_contiguous(shape, strides):
        # as_strided, not reshape: a contiguous tensor may still carry odd strides on size-1 dims.
        flat = (math.prod(shape),)
        return lambda t: t.as_strided(flat, (1,)).view(target)
    if esize > unit and dtype.is_complex:
        # Pairs of float64 have a contiguous last dim whatever the complex tensor's strides.
        return lambda t: torch.view_as_real(t).view(target)
    return lambda t: _storage_units(t, target, unit)


def _views_as(shape, strides, esize: int, unit: int) -> bool:
    """Whether torch's view(dtype) takes every tensor of this shape and these strides to
    `unit`-byte elements (its rules where the element size changes). Its check of the storage
    offset, which the key does not fix, torch makes per call, as on a contiguous tensor's flat
    view."""
    if not shape or strides[-1] != 1:
        return False
    if esize > unit:
        return True
    ratio = unit // esize
    return shape[-1] % ratio == 0 and all(s % ratio == 0 for s in strides[:-1])


def _is_contiguous(shape, strides) -> bool:
    """torch's is_contiguous() of a (non-empty) tensor of this shape and these strides."""
    expected = 1
    for n, s in zip(reversed(shape), reversed(strides)):
        if n != 1:
            if s != expected:
                return False
            expected *= n
    return True


def _contiguous_strides(shape) -> tuple[int, ...]:
    """The strides torch.empty(shape) gives."""
    strides = []
    step = 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def _storage_units(t: torch.Tensor, dtype: torch.dtype, unit: int) -> torch.Tensor:
    """A strided tensor regrouped into wider (or, for 16-byte elements, narrower) units: a 1-d
    view of its storage from its first byte (the caller checked the alignment). Per call: the
    storage's size and the offset into it differ between tensors of one geometry."""
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


def _prepared_copy(call: PermuteCall, launch: BoundLaunch, ints: tuple
                   ) -> Callable[..., torch.Tensor]:
    """The prepared permute of a call whose copy is one launch: a function (x, out=None) of any
    input with the call's plain key that returns the contiguous permuted copy, written into
    `out` (run's contiguous out=, of call.out's strides) or a new tensor. Per call it is the
    unit views, the allocation and the launch."""
    x = call.input
    unit, dtype, device, shape = call.unit, x.dtype, x.device, call.out_shape
    src_of = _unit_view(x.shape, x.stride(), dtype, unit)
    given = _direct_out(call)
    out_strides = given.stride() if given is not None else _contiguous_strides(shape)
    dst_of = _unit_view(shape, out_strides, dtype, unit)

    new_out = allocator(shape, dtype, device)

    def permuted(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        if out is None:
            out = new_out()
        launch(x if src_of is None else src_of(x), out if dst_of is None else dst_of(out),
               *ints)
        return out

    return permuted


class _TritonBackend(PlannedBackend):
    """A Triton backend of permute: its plan (make_plan) holds the launch's spec, grid and
    integer arguments, and its work is `_prepared(plan, call)` (_prepared_copy), the function
    of the input that both a run and a route (bind) call."""

    def supports(self, call: PermuteCall) -> str | None:
        # Only the call is judged: the dispatcher asks the device first (device_reason), and a
        # plan made for another device (tools/compile_check.py, what_if) must still be made.
        return call.torch_only

    def plan_facts(self, call: PermuteCall) -> tuple:
        # The call's exact facts are its geometry: shape, strides, dims, element size, both
        # pointers' alignment (which the widening reads) and whether the kernels take it.
        return call.exact

    def _launch(self, plan, call: PermuteCall) -> torch.Tensor:
        return _finish(call, self._prepared(plan, call)(call.input, _direct_out(call)))

    def bind(self, call: PermuteCall, config) -> Callable[..., torch.Tensor] | None:
        """The prepared permute of a plain call; None for out=, autograd, an empty call and an
        input only torch takes, which go through run()."""
        if (call.out is not None or call.kind not in ("keep", "move", "gather")
                or self.supports(call) is not None
                or (call.input.requires_grad and torch.is_grad_enabled())):
            return None
        return self._prepared(self.plan(call, config), call)

    def _prepared(self, plan, call: PermuteCall) -> Callable[..., torch.Tensor]:
        """The prepared permute (_prepared_copy) of the call under its plan: the plan's one
        bound launch."""
        raise NotImplementedError
