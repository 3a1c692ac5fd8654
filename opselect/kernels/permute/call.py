"""permute's calls: torch's argument rules (dims, out=), the simplified geometry of a call
(dims merged, size-1 dims dropped, elements widened), outputs, the torch fallback, and the
inputs warm and tuning make (sample / replay)."""

from __future__ import annotations

import math
import operator
import warnings

import torch

from ...dispatch.device import device_info
from ...dispatch.op import Call
from ...dispatch.signature import bucket
from ...errors import ArgumentTypeError, DimError, InvalidArgument
from .._common import prepared


#: The kernels take at most this many dims after simplification (the torch backend takes any).
MAX_DIMS = 8


# ---------------------------------------------------------------------------------------------
# The problem after simplification
# ---------------------------------------------------------------------------------------------
def simplify(shape, strides, dims) -> tuple[list[int], list[int]]:
    """(sizes, input strides) of the output's dims in output order, with size-1 dims dropped and
    output-adjacent dims merged where the input holds them as one block. The result reads the same
    elements in the same order: as_strided(input, sizes, strides).contiguous() equals
    input.permute(dims).contiguous() flattened. An input of one element gives ([], [])."""
    sizes: list[int] = []
    out_strides: list[int] = []
    for d in dims:
        n = shape[d]
        if n == 1:
            continue
        t = strides[d]
        if sizes and out_strides[-1] == n * t:
            sizes[-1] *= n
            out_strides[-1] = t
        else:
            sizes.append(n)
            out_strides.append(t)
    return sizes, out_strides


def widen(sizes: list[int], strides: list[int], esize: int, *ptrs: int
          ) -> tuple[list[int], list[int], int]:
    """Regroup a kept last dim into the widest unit (<= 16 bytes) that divides the run length,
    every other stride (in bytes) and every pointer; a run that becomes one unit is dropped.
    Returns (sizes, strides, element bytes); a problem whose last dim moves is returned as is."""
    if not sizes or strides[-1] != 1:
        return sizes, strides, esize
    run = sizes[-1] * esize
    bits = run
    for p in ptrs:
        bits |= p
    for t in strides[:-1]:
        bits |= t * esize
    width = min(16, bits & -bits)
    if width <= esize:
        return sizes, strides, esize
    k = width // esize
    sizes = sizes[:-1] + [run // width]
    strides = [t // k for t in strides[:-1]] + [1]
    if sizes[-1] == 1:
        sizes.pop()
        strides.pop()
    return sizes, strides, width


def _kind(sizes: list[int], strides: list[int]) -> str:
    if not sizes or strides[-1] == 1:
        return "keep"  # the last dim stays contiguous (a plain copy has one dim or none)
    if 1 in strides:
        return "move"  # the input's contiguous dim moves away from the end: a transpose
    return "gather"  # no dim is contiguous in the input (a strided view)


def _tile_form(kind: str, sizes: list[int], strides: list[int], esize: int
               ) -> tuple[int, list[int], list[int]] | None:
    """(W units per element, sizes, strides) the tiled kernel takes, or None.

    A moving problem is taken as is (16-byte elements are W = 2 int64). A kept last dim of 16 or
    32 bytes in 2 or 4 units becomes one element of W units, if the rest then moves."""
    unit = min(esize, 8)
    w = esize // unit
    if kind == "move":
        return w, sizes, strides
    if kind != "keep" or len(sizes) < 3:
        return None
    run = sizes[-1]
    units = run * w
    if units not in (2, 4) or run * esize > 32:
        return None
    rest = strides[:-1]
    if any(t % run for t in rest):
        return None
    rest = [t // run for t in rest]
    if rest[-1] == 1 or 1 not in rest:
        return None
    return units, sizes[:-1], rest


class PermuteCall(Call):
    __slots__ = ("input", "dims", "out", "out_shape", "numel", "esize", "sizes", "strides",
                 "kind", "torch_only", "tile", "span", "_plan", "view_is_contiguous")

    def for_input(self, input) -> "PermuteCall":
        """This call's facts for another tensor of the same shape, strides, dtype, device and
        alignment (no out)."""
        c = PermuteCall.__new__(PermuteCall)
        c.info, c.key, c.exact, c.input, c.dims, c.out, c.out_shape, c.numel = (
            self.info, self.key, self.exact, input, self.dims, None, self.out_shape, self.numel)
        c.esize, c.sizes, c.strides, c.kind, c.torch_only, c.tile, c.span, c._plan = (
            self.esize, self.sizes, self.strides, self.kind, self.torch_only, self.tile,
            self.span, self._plan)
        c.view_is_contiguous = self.view_is_contiguous
        return c

    def inputs(self) -> tuple:
        return (self.input,)

    @property
    def empty(self) -> bool:
        return self.numel == 0

    def empty_result(self) -> torch.Tensor:
        # The permuted shape, nothing to copy (the caller's out=, resized, where given).
        return _finish(self, _output(self))

    def describe(self) -> str:
        x = self.input
        text = (f"input {tuple(x.shape)} {str(x.dtype)[6:]}, dims {self.dims} on {x.device}")
        if self.kind in ("keep", "move", "gather"):
            text += (f"; simplified: sizes {tuple(self.sizes)} strides {tuple(self.strides)} "
                     f"of {self.esize}-byte elements ({self.kind})")
        return text

    @property
    def unit(self) -> int:
        return min(self.esize, 8)

    @property
    def W(self) -> int:
        return self.esize // self.unit


def wrap_dims(dims, ndim: int) -> tuple[int, ...]:
    """dims wrapped into [0, ndim), with torch's checks and order of checks (length, range,
    repeats). The loop is the hot path: plain ints, one pass, a bit set for repeats."""
    if type(dims) in (tuple, list) and len(dims) == ndim:
        seen = 0
        wrapped = []
        for d in dims:
            if type(d) is not int:
                break
            if d < 0:
                d += ndim
            if d < 0 or d >= ndim or (seen >> d) & 1:
                break
            seen |= 1 << d
            wrapped.append(d)
        else:
            return tuple(wrapped)
    return _wrap_dims_checked(dims, ndim)


def _wrap_dims_checked(dims, ndim: int) -> tuple[int, ...]:
    if isinstance(dims, torch.Tensor) or not isinstance(dims, (tuple, list, torch.Size)):
        raise ArgumentTypeError(f"permute: dims must be a tuple or list of ints, "
                                f"got {type(dims).__name__}")
    wrapped = []
    for i, d in enumerate(dims):
        if isinstance(d, (bool, float)):
            raise ArgumentTypeError(f"permute: dims[{i}] must be an int, got "
                                    f"{type(d).__name__} {d!r}")
        try:
            wrapped.append(operator.index(d))
        except TypeError:
            raise ArgumentTypeError(f"permute: dims[{i}] must be an int, got "
                                    f"{type(d).__name__}") from None
    if len(wrapped) != ndim:
        raise InvalidArgument(f"permute: dims has {len(wrapped)} entries but input has {ndim} "
                              "dimensions; expected one entry per dimension "
                              f"(dims={tuple(wrapped)})")
    for i, d in enumerate(wrapped):
        if d < -ndim or d >= ndim:
            raise DimError(f"permute: dims[{i}] = {d} is out of range for a {ndim}-d input "
                           f"(expected to be in range of [{-ndim}, {ndim - 1}])")
        if d < 0:
            wrapped[i] = d + ndim
    if len(set(wrapped)) != ndim:
        seen: set[int] = set()
        dup = next(d for d in wrapped if d in seen or seen.add(d))
        raise InvalidArgument(f"permute: dims {tuple(dims)} names dimension {dup} more than once; "
                              "each dimension must appear exactly once")
    return tuple(wrapped)


def _torch_only(x: torch.Tensor) -> str | None:
    """Why the Triton backends cannot take x (None when they can)."""
    if x.is_quantized:
        return "the input is quantized; the kernels take plain tensors"
    if x.is_conj() or x.is_neg():
        return "the input is a lazy conjugate/negative view (resolve_conj()/resolve_neg() first)"
    if x.requires_grad and torch.is_grad_enabled():
        return "the input requires grad; only the torch backend records autograd"
    if x.element_size() not in (1, 2, 4, 8, 16):
        return f"{x.dtype} elements are {x.element_size()} bytes; the kernels move 1 to 16"
    return None


def plain_key(input, dims) -> tuple | None:
    """A key of everything the choice for a plain call reads (a torch.Tensor, dims a tuple or
    list of ints, no out): its geometry, dtype, device and alignment; None for any other
    arguments. ops.py keys its torch routes by it."""
    if type(input) is torch.Tensor and type(dims) in (tuple, list) and \
            input.layout is torch.strided:  # (a sparse tensor has no data pointer)
        for d in dims:
            if type(d) is not int:
                return None
        return strided_key(input, tuple(dims))
    return None


def strided_key(input: torch.Tensor, dims: tuple) -> tuple | None:
    """plain_key(input, dims) of a strided torch.Tensor and a tuple of ints, its checks made by
    the caller (enable()'s copy of a view: a call in a model's layer, where every step it takes
    costs several times its microbenchmark)."""
    if input.is_neg() or input.is_conj():
        return None  # a lazy negated or conjugated view only torch's copy resolves
    return (input.shape, input.stride(), input.dtype, input.device, dims, input.data_ptr() % 16)


def prepare_keyed(key: tuple | None, input, dims) -> PermuteCall:
    """prepare(input, dims), from the memo when `key` (plain_key's) was prepared before: the
    checks, the plan lookup and the keys were most of a small call's dispatch time."""
    return prepared(_PREPARED, key, input, prepare, input, dims)


_PREPARED: dict[tuple, PermuteCall] = {}


def prepare(input, dims, *, out: torch.Tensor | None = None) -> PermuteCall:
    if not isinstance(input, torch.Tensor):
        raise ArgumentTypeError(f"permute: input must be a tensor, got {type(input).__name__}")
    if input.layout != torch.strided:
        # torch cannot make a sparse (or other non-strided) permute contiguous either.
        raise InvalidArgument(f"permute: input has layout {input.layout}; expected a strided "
                              "tensor (a contiguous result needs one)")
    shape = input.shape
    dims = wrap_dims(dims, len(shape))
    if out is not None:
        _check_out(out, input, tuple([shape[d] for d in dims]))
    call = PermuteCall()
    call.input, call.dims, call.out = input, dims, out
    call.numel = input.numel()
    call.torch_only = reason = _torch_only(input)
    esize = input.element_size()
    out_ptr = out.data_ptr() if out is not None and out.is_contiguous() else 0
    # The plan depends on the geometry and the pointers' alignment only: calls of one shape in a
    # loop reuse it instead of simplifying again (that is most of this function's time).
    plan_key = (shape, input.stride(), dims, esize, input.data_ptr() % 16, out_ptr % 16,
                reason is None)
    plan = _PLANS.get(plan_key)
    if plan is None:
        plan = _geometry(input, dims, esize, out_ptr, reason)
        if len(_PLANS) >= _PLANS_MAX:
            _PLANS.clear()
        _PLANS[plan_key] = plan
    (call.out_shape, call.sizes, call.strides, call.esize, call.kind, call.span, call.tile,
     too_many, key_tail, call._plan, call.view_is_contiguous) = plan
    if too_many is not None:
        call.torch_only = too_many
    dev = input.device
    call.info = device_info(dev)
    call.key = (dev, *key_tail)
    call.exact = (dev, plan_key)  # everything the plan (and so the cost model) reads
    return call


_PLANS: dict[tuple, tuple] = {}


_PLANS_MAX = 4096


def _geometry(input: torch.Tensor, dims: tuple[int, ...], esize: int, out_ptr: int,
              reason: str | None) -> tuple:
    """Everything about a call that its geometry decides: the output shape, the simplified
    permutation (widened when the last dim stays), its kind, span and tile form, why the kernels
    cannot take it (too many dims left), and the key's tail."""
    shape, numel, in_esize = input.shape, input.numel(), esize
    out_shape = tuple([shape[d] for d in dims])
    tile, too_many, span = None, None, 0
    if reason is not None:
        kind, sizes, strides = "other", [], []
    elif numel == 0:
        kind, sizes, strides = "empty", [], []
    else:
        sizes, strides = simplify(shape, input.stride(), dims)
        if strides and strides[-1] == 1:
            sizes, strides, esize = widen(sizes, strides, esize, input.data_ptr(), out_ptr)
        kind = _kind(sizes, strides)
        if len(sizes) > MAX_DIMS:
            too_many = (f"{len(sizes)} dims remain after simplification; the kernels take at "
                        f"most {MAX_DIMS}")
        # One past the largest input offset (elements): int32 offsets must reach it too.
        span = 1
        for n, t in zip(sizes, strides):
            span += (n - 1) * t
        tile = _tile_form(kind, sizes, strides, esize)
    in_run = sizes[strides.index(1)] if 1 in strides else 0
    key_tail = (esize, kind, tile[0] if tile else 0, len(sizes),
                bucket(numel * in_esize // esize), bucket(sizes[-1]) if sizes else 0,
                bucket(in_run), reason is None and too_many is None)
    # The tiled backend's plan of this geometry, made on its first tiled run (tiled._plan) and
    # shared by every call of the geometry: building it is several microseconds of Python.
    tile_plan_box = [None]
    # Whether input.permute(dims) is contiguous already (it moves dims of size 1 only, or undoes
    # the input's own permutation; empty and one-element tensors): torch's contiguous() copies
    # nothing then, and ops.permute answers with the view too.
    view_is_contiguous = input.permute(dims).is_contiguous()
    return (out_shape, sizes, strides, esize, kind, span, tile, too_many, key_tail, tile_plan_box,
            view_is_contiguous)


def _check_out(out, input: torch.Tensor, shape: tuple[int, ...]) -> None:
    if not isinstance(out, torch.Tensor):
        raise ArgumentTypeError(f"permute: out must be a tensor, got {type(out).__name__}")
    if out.dtype != input.dtype:
        raise InvalidArgument(f"permute: out has dtype {out.dtype} but input has {input.dtype}; "
                              "expected the same dtype")
    if out.device != input.device:
        raise InvalidArgument(f"permute: out is on {out.device} but input is on {input.device}")
    if out.layout != torch.strided:
        raise InvalidArgument(f"permute: out must be a strided tensor, got layout {out.layout}")
    if tuple(out.shape) != shape:
        if out.numel() != 0:
            warnings.warn(f"permute: out has shape {tuple(out.shape)}, resizing it to {shape} (as "
                          "torch does for out=; pass an empty tensor to avoid this warning)",
                          UserWarning, stacklevel=4)
        out.resize_(shape)
    if _overlaps(out, input):
        raise InvalidArgument("permute: out shares memory with input; some elements of the input "
                              "and the written-to tensor refer to a single memory location "
                              "(pass a separate out, or clone() the input)")


def _byte_range(t: torch.Tensor) -> tuple[int, int]:
    lo = t.data_ptr()
    span = sum((n - 1) * s for n, s in zip(t.shape, t.stride())) + 1
    return lo, lo + span * t.element_size()


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.numel() == 0 or b.numel() == 0:
        return False
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False
    a0, a1 = _byte_range(a)
    b0, b1 = _byte_range(b)
    return a0 < b1 and b0 < a1


def transpose_dims(input, dim0, dim1) -> list[int]:
    """The permutation of input.transpose(dim0, dim1), with torch's argument rules."""
    if not isinstance(input, torch.Tensor):
        raise ArgumentTypeError(f"transpose: input must be a tensor, got {type(input).__name__}")
    ndim = input.dim()
    # torch wraps transpose's dims as if a 0-d tensor had one dim.
    lo, hi = -max(ndim, 1), max(ndim, 1) - 1
    wrapped = []
    for name, d in (("dim0", dim0), ("dim1", dim1)):
        if isinstance(d, (bool, float)) or not hasattr(d, "__index__"):
            raise ArgumentTypeError(f"transpose: {name} must be an int, got {type(d).__name__}")
        d = operator.index(d)
        if d < lo or d > hi:
            raise DimError(f"transpose: {name} = {d} is out of range for a {ndim}-d input "
                           f"(expected to be in range of [{lo}, {hi}])")
        wrapped.append(d % max(ndim, 1))
    dims = list(range(ndim))
    if ndim:
        a, b = wrapped
        dims[a], dims[b] = dims[b], dims[a]
    return dims


# ---------------------------------------------------------------------------------------------
# Backends
# ---------------------------------------------------------------------------------------------
def _torch_permute(call: PermuteCall) -> torch.Tensor:
    if call.out is not None:
        return call.out.copy_(call.input.permute(call.dims))
    # permute_copy: one ATen call (the view and its contiguous clone made in C++, about 2 us less
    # host time than permute() then clone()), and always a new tensor, which the torch.library op
    # and autograd's path need (ops.permute itself answers a contiguous view with the view).
    return torch.permute_copy(call.input, call.dims)


def _direct_out(call: PermuteCall) -> torch.Tensor | None:
    """The caller's `out` when the kernels can write it (contiguous); None: they write a new
    tensor, which _finish copies into a strided `out`."""
    out = call.out
    return out if out is not None and out.is_contiguous() else None


def _output(call: PermuteCall) -> torch.Tensor:
    """Where the kernel writes: the caller's `out` when it is contiguous, else a new tensor."""
    out = _direct_out(call)
    if out is not None:
        return out
    return torch.empty(call.out_shape, dtype=call.input.dtype, device=call.input.device)


def _finish(call: PermuteCall, result: torch.Tensor) -> torch.Tensor:
    if call.out is not None and result is not call.out:
        call.out.copy_(result)
        return call.out
    return result



# ---------------------------------------------------------------------------------------------
# Sample inputs (warm specs and benchmarks)
# ---------------------------------------------------------------------------------------------
def random_tensor(shape, dtype: torch.dtype, device) -> torch.Tensor:
    """Random values of any dtype: normal floats, full-range integers, 0/1 bools, random bytes
    for the rest (float8, ...). A permute moves bytes, so the values only need to differ."""
    shape = tuple(shape)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, device=device).bool()
    if dtype.is_complex or dtype.is_floating_point:
        if dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64,
                     torch.complex64, torch.complex128):
            return torch.randn(shape, dtype=dtype, device=device)
    elif dtype in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64):
        info = torch.iinfo(dtype)
        return torch.randint(info.min, info.max, shape, dtype=dtype, device=device)
    size = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (math.prod(shape) * size,), dtype=torch.uint8, device=device)
    return raw.view(dtype).reshape(shape)


def sample(shapes, dtype: torch.dtype, options: dict, device: torch.device):
    """Inputs for warming and benchmarks: one shape; options: dims (default: reversed), and
    `layout` = "contiguous" (default) or "permuted" (the input is itself a permuted view of a
    contiguous tensor, with the given `layout_dims`)."""
    if len(shapes) != 1:
        raise InvalidArgument(f"permute sample: expected one shape (the input's), got {shapes}")
    shape = list(shapes[0])
    options = dict(options)
    dims = options.pop("dims", None)
    dims = list(range(len(shape)))[::-1] if dims is None else [int(d) for d in dims]
    layout = options.pop("layout", "contiguous")
    if layout == "contiguous":
        x = random_tensor(shape, dtype, device)
    elif layout == "permuted":
        order = [int(d) for d in options.pop("layout_dims", list(range(len(shape)))[::-1])]
        inverse = [order.index(i) for i in range(len(order))]
        base = random_tensor([shape[d] for d in order], dtype, device)
        x = base.permute(inverse)  # a view of `shape` whose memory order is `order`
    else:
        raise InvalidArgument(f"permute sample: layout must be 'contiguous' or 'permuted', "
                              f"got {layout!r}")
    return (x, dims), options


def replay(call: PermuteCall) -> tuple[tuple, dict]:
    """The public call a prepared one came from (tuning's first runs; without out=)."""
    return (call.input, list(call.dims)), {}
