"""softmax's calls: torch's argument rules (dim, dtype=), the (outer, N, inner) view of a call,
the torch fallback, and the inputs warm, tuning and calibration make."""

from __future__ import annotations

import math
import operator

import torch

from ...dispatch.device import device_info
from ...dispatch.op import Call
from ...dispatch.signature import bucket
from ...errors import ArgumentTypeError, DimError, InvalidArgument, TorchOnlyCall
from .._common import FLOAT_DTYPES, allocator, prepared


_WIDENING = {(torch.float16, torch.float32), (torch.bfloat16, torch.float32),
             (torch.float16, torch.float64), (torch.bfloat16, torch.float64),
             (torch.float32, torch.float64)}


# ---------------------------------------------------------------------------------------------
# The call: torch.softmax's argument rules and the memory layout
# ---------------------------------------------------------------------------------------------
class SoftmaxCall(Call):
    __slots__ = ("x", "dim", "log", "dtype_arg", "out_dtype", "cast_first", "outer", "n", "inner",
                 "so", "sn", "fast", "columns", "grad")

    def for_input(self, x) -> "SoftmaxCall":
        """This call's facts for another tensor of the same shape, strides, dtype and device."""
        c = SoftmaxCall.__new__(SoftmaxCall)
        c.x, c.dim, c.log, c.dtype_arg, c.out_dtype, c.cast_first = (
            x, self.dim, self.log, self.dtype_arg, self.out_dtype, self.cast_first)
        c.outer, c.n, c.inner, c.so, c.sn, c.fast, c.columns, c.grad = (
            self.outer, self.n, self.inner, self.so, self.sn, self.fast, self.columns, self.grad)
        c.info, c.key, c.exact = self.info, self.key, self.exact
        return c

    @property
    def empty(self) -> bool:
        return self.outer == 0 or self.n == 0 or self.inner == 0

    def empty_result(self) -> torch.Tensor:
        if self.grad:
            # torch's own op records autograd (and computes nothing for no elements): the
            # gradient is an empty tensor of the input's shape and dtype.
            return _torch_softmax(self)
        return allocator(self.x.shape, self.out_dtype, self.x.device)()

    def inputs(self) -> tuple:
        return (self.x,)

    def describe(self) -> str:
        x = self.x
        name = "log_softmax" if self.log else "softmax"
        cast = f" -> {str(self.out_dtype)[6:]}" if self.out_dtype != x.dtype else ""
        layout = ("" if self.fast else ", rows read in place as columns" if self.columns
                  else ", strides need a copy")
        return (f"{name} of {tuple(x.shape)} {str(x.dtype)[6:]}{cast} over dim {self.dim} "
                f"(outer {self.outer}, dim {self.n}, inner {self.inner}{layout}) on {x.device}")

    @property
    def numel(self) -> int:
        return self.outer * self.n * self.inner

    @property
    def f64(self) -> bool:
        return self.out_dtype == torch.float64

    @property
    def in_bytes(self) -> int:
        """Bytes per element the kernels read: the input's, or the output's after a torch cast."""
        return self.out_dtype.itemsize if self.cast_first else self.x.dtype.itemsize


def _collapse(shape, strides, lo: int, hi: int):
    """Stride of dims lo..hi-1 viewed as one dim, or None when they do not form one (size-1 dims
    are ignored; 0 when all are size 1)."""
    stride = None
    expect = None
    for i in range(hi - 1, lo - 1, -1):
        d = shape[i]
        if d == 1:
            continue
        if stride is None:
            stride = strides[i]
        elif strides[i] != expect:
            return None
        expect = strides[i] * d
    return 0 if stride is None else stride


def _columns(shape, strides, dim: int, n: int) -> tuple | None:
    """(outer, inner, outer stride) of rows whose elements lie apart, viewed as (outer, n, inner)
    with inner contiguous: the dims just before `dim` collapse to stride 1 (the rows of a
    transposed matrix are its columns). The strided kernel reads such rows in place and writes
    them as rows; the row kernels need a contiguous copy first. None where the dims do not split
    so (the largest inner group is taken)."""
    if n < 2:
        return None
    for k in range(dim):
        if _collapse(shape, strides, k, dim) == 1:
            so = _collapse(shape, strides, 0, k)
            inner = math.prod(shape[k:dim])
            if so is not None and inner > 1:
                return math.prod(shape[:k]), inner, so
    return None


def _prepare(name: str, log: bool, input, dim, dtype) -> SoftmaxCall:
    if not isinstance(input, torch.Tensor):
        raise ArgumentTypeError(f"{name}: input must be a tensor, got {type(input).__name__}")
    if input.is_neg():
        # A lazy negative view (z.conj().imag) holds its values un-negated in memory, which is
        # what the kernels read: they get the values materialised (recorded by autograd).
        input = input.resolve_neg()
    if type(dim) is not int:
        if dim is None:
            raise ArgumentTypeError(f"{name}: dim must be an int (None is not accepted: name the dim)")
        try:
            dim = operator.index(dim)
        except TypeError:
            raise ArgumentTypeError(f"{name}: dim must be an int, got {type(dim).__name__}") from None
    in_dtype = input.dtype
    if dtype is None:
        out_dtype = in_dtype
    elif isinstance(dtype, torch.dtype):
        out_dtype = dtype
    else:
        raise ArgumentTypeError(f"{name}: dtype must be a torch.dtype or None, got {dtype!r}")
    if out_dtype not in FLOAT_DTYPES:
        # Integers, bool, complex, quantized: torch has no softmax kernel for most (it raises its
        # own NotImplementedError) and answers the rest.
        what = "dtype" if dtype is not None else "input"
        raise TorchOnlyCall(f"{name}: {what} is {str(out_dtype)[6:]}; opselect's kernels take "
                            "float16, bfloat16, float32 and float64")
    shape = input.shape
    rank = len(shape)
    width = rank or 1
    if not -width <= dim < width:
        raise DimError(f"{name}: dim {dim} is out of range for a {rank}-d input (expected "
                       f"[{-width}, {width - 1}])")
    if dim < 0:
        dim += width
    cast_first = in_dtype is not out_dtype and (in_dtype, out_dtype) not in _WIDENING
    columns = None
    if rank == 0:
        outer = n = inner = so = sn = 1
        fast = contiguous = True
    else:
        n = shape[dim]
        outer = math.prod(shape[:dim])
        inner = math.prod(shape[dim + 1:])
        contiguous = input.is_contiguous()
        if contiguous:  # the common case, without looking at the strides
            so, sn, fast = n * inner, inner, True
        else:
            strides = input.stride()
            so = _collapse(shape, strides, 0, dim)
            sn = strides[dim] if n > 1 else 1
            if inner == 1:
                fast = so is not None and sn == 1
                if not fast and not cast_first:
                    columns = _columns(shape, strides, dim, n)
            else:
                fast = so is not None and _collapse(shape, strides, dim + 1, rank) == 1
    call = SoftmaxCall()
    call.x, call.dim, call.log, call.dtype_arg, call.out_dtype = input, dim, log, dtype, out_dtype
    call.cast_first = cast_first
    call.outer, call.n, call.inner, call.so, call.sn = outer, n, inner, so, sn
    call.columns = columns
    call.fast = fast = fast and not cast_first
    # Under autograd the Triton backends add a Python autograd.Function (host time): its own key.
    call.grad = grad = input.requires_grad and torch.is_grad_enabled()
    dev = input.device
    call.info = device_info(dev)
    # (columns: a layout of its own, which strided takes and the row backends copy first)
    call.key = (dev.index if dev.type == "cuda" else dev.type, in_dtype, out_dtype,
                bucket(outer), bucket(n), bucket(inner), "columns" if columns else fast, grad)
    call.exact = (call.key[0], in_dtype, out_dtype, outer, n, inner, fast, grad, cast_first,
                  contiguous, columns)
    return call


# Prepared calls by everything _prepare reads (the checks, the layout arithmetic and the key
# were most of a small call's dispatch time: about 10 us against torch's own 5 on a CPU host).
# Only plain tensors, int dims and dtype None or a torch.dtype take it, so every error still
# comes from _prepare; the memo keeps no tensor alive.
_PREPARED: dict[tuple, SoftmaxCall] = {}


def plain_key(log: bool, input, dim, dtype) -> tuple | None:
    """Everything _prepare reads of a call with plain arguments (a torch.Tensor, an int dim,
    dtype None or a torch.dtype), as a key; None for any other arguments. ops.py keys its torch
    routes by it too."""
    if type(input) is torch.Tensor and type(dim) is int and (
            dtype is None or type(dtype) is torch.dtype) and not input.is_neg():
        return (log, input.shape, input.stride(), input.dtype, input.device, dim, dtype,
                input.requires_grad and torch.is_grad_enabled())
    return None


def prepare_keyed(name: str, log: bool, key: tuple | None, input, dim, dtype) -> SoftmaxCall:
    """_prepare, from the memo when `key` (plain_key's) was prepared before."""
    return prepared(_PREPARED, key, input, _prepare, name, log, input, dim, dtype)


def prepare_softmax(input, dim=-1, *, dtype=None) -> SoftmaxCall:
    return prepare_keyed("softmax", False, plain_key(False, input, dim, dtype), input, dim, dtype)


def prepare_log_softmax(input, dim=-1, *, dtype=None) -> SoftmaxCall:
    return prepare_keyed("log_softmax", True, plain_key(True, input, dim, dtype), input, dim,
                         dtype)


# ---------------------------------------------------------------------------------------------
# Backends
# ---------------------------------------------------------------------------------------------
def _torch_softmax(call: SoftmaxCall) -> torch.Tensor:
    fn = torch.log_softmax if call.log else torch.softmax
    return fn(call.x, call.dim, dtype=call.dtype_arg)


# ---------------------------------------------------------------------------------------------
# Inputs for warming, calibration and benchmarks
# ---------------------------------------------------------------------------------------------
def sample(shapes, dtype: torch.dtype, options: dict, device: torch.device):
    """One input of shapes[0], standard normal times `scale` (option, default 1; large scales give
    peaked rows). Options: dim (default -1), out_dtype (a dtype name: softmax's dtype=), scale,
    transposed (true: the last two dims swapped in memory, as a transposed matrix's are)."""
    if len(shapes) != 1:
        raise InvalidArgument(f"softmax sample: expected one shape (the input), got {shapes}")
    options = dict(options)
    dim = int(options.pop("dim", -1))
    scale = float(options.pop("scale", 1.0))
    out_dtype = options.pop("out_dtype", None)
    transposed = options.pop("transposed", False)
    if options:
        raise InvalidArgument(f"softmax sample: unknown options {sorted(options)}; expected dim, "
                              "out_dtype, scale, transposed")
    if transposed not in (True, False) or (transposed and len(shapes[0]) < 2):
        raise InvalidArgument("softmax sample: transposed must be true or false, and true needs "
                              f"two dims or more (shape {list(shapes[0])})")
    wide = dtype if dtype in (torch.float32, torch.float64) else torch.float32
    shape = list(shapes[0])
    if transposed:
        shape[-2:] = shape[-1:-3:-1]
    x = (torch.randn(shape, device=device, dtype=wide) * scale).to(dtype)
    if transposed:
        x = x.transpose(-1, -2)
    kwargs = {"dim": dim}
    if out_dtype is not None:
        kwargs["dtype"] = getattr(torch, str(out_dtype).replace("torch.", ""))
    return (x,), kwargs


CALIBRATION = [
    ([[4096, 1024]], torch.float32, {}),
    ([[4096, 8192]], torch.bfloat16, {}),
    ([[1048576, 64]], torch.float32, {}),
    ([[256, 131072]], torch.float32, {}),
    ([[64, 512, 512]], torch.float16, {"dim": 1}),
]


def replay(call: SoftmaxCall) -> tuple[tuple, dict]:
    """The public call a prepared one came from (tuning's first runs)."""
    return (call.x, call.dim), {"dtype": call.dtype_arg}
