"""matmul's calls: torch's argument rules for torch.matmul, F.linear and torch.addmm, the one
problem every form reduces to, the torch fallbacks, and the inputs warm and tuning make.

Every form is one batched product with an optional bias, written into a new contiguous output:

    C[b, m, n] = sum_k A[b, m, k] * B[b, k, n]  (+ bias[n])

A and B are read through their own strides (a transposed weight, a stepped slice or a batch dim
broadcast with stride 0 cost no copy); only a batch whose dims cannot be viewed as one dim is made
contiguous first. The output is (batch, M, N) contiguous, viewed as the form's result shape.
"""

from __future__ import annotations

import math

import torch

from ...dispatch.device import device_info
from ...dispatch.op import Call
from ...dispatch.signature import bucket
from ...errors import ArgumentTypeError, InvalidArgument, TorchOnlyCall
from .._common import allocator

#: The dtypes the kernels take (tl.dot's inputs); float64, integers and complex go to torch.
DTYPES = (torch.float16, torch.bfloat16, torch.float32)

_PRECISION = getattr(torch._C, "_get_fp32_precision_getter", None)


def allow_tf32() -> bool:
    """Whether torch's float32 matmuls may use tf32 now, read per call (part of the key).

    torch 2.9+ has two switches: the legacy allow_tf32 (set_float32_matmul_precision) and
    fp32_precision, per backend and op with a global fallback. Its C getter of the latter
    answers for every way of setting either; the legacy getter raises once the new switch has
    been set (torch refuses to read a mix), so it is only the fallback of an older torch."""
    if _PRECISION is not None:
        return _PRECISION("cuda", "matmul") == "tf32"
    return torch._C._get_cublas_allow_tf32()


class MatmulCall(Call):
    __slots__ = ("form", "a", "b", "bias", "out_shape", "batch", "m", "n", "k", "sa", "sb",
                 "bias_stride", "a_src", "b_src", "copied", "dtype", "tf32")

    # form         "matmul", "linear" or "addmm": which torch function answers it (TorchBackend)
    # a, b, bias   the public function's tensors (inputs(): what a prepared call is given)
    # out_shape    the result's shape (the output is made (batch, m, n) and viewed as this)
    # batch, m, n, k  the problem's sizes
    # sa, sb       (batch, row, column) element strides of A (m, k) and B (k, n) in a_src, b_src
    # bias_stride  the bias's element stride along n (0: one value broadcast), or None
    # a_src, b_src the tensors the kernels read: a and b themselves, or a contiguous copy where
    #              a batch could not be viewed as one dim (copied: then no prepared call)
    # dtype        of A, B, the bias and the output
    # tf32         float32 products may round their inputs to tf32 (torch's allow_tf32)

    def for_input(self, *tensors) -> "MatmulCall":
        """This call's facts for other tensors of the same plain key (shapes, strides, dtypes,
        device): every view of them the kernels read has the same geometry, so the sources are
        the tensors themselves (a call that needed a copy is never prepared: no for_input)."""
        c = MatmulCall.__new__(MatmulCall)
        for name in MatmulCall.__slots__:
            setattr(c, name, getattr(self, name))
        c.info, c.key, c.exact = self.info, self.key, self.exact
        if tensors:
            c.a, c.b = tensors[0], tensors[1]
            c.bias = tensors[2] if len(tensors) > 2 else None
            c.a_src, c.b_src = c.a, c.b
        else:
            c.a = c.b = c.bias = c.a_src = c.b_src = None
        return c

    @property
    def empty(self) -> bool:
        return self.batch * self.m * self.n == 0 or self.k == 0

    def empty_result(self) -> torch.Tensor:
        # No products (k = 0): zeros, or the bias itself broadcast where there is one, as torch
        # gives (copied, not added to zeros: 0.0 + -0.0 is +0.0, torch keeps the -0.0).
        if self.bias is None or not math.prod(self.out_shape):
            return torch.zeros(self.out_shape, dtype=self.dtype, device=self.a.device)
        out = torch.empty(self.out_shape, dtype=self.dtype, device=self.a.device)
        return out.copy_(self.bias_row().expand(self.out_shape))

    def bias_row(self) -> torch.Tensor:
        """The bias as its (n,) or (1,) view (torch's broadcast of what the form was given)."""
        return self.bias.reshape(-1)[: self.n] if self.bias.numel() != 1 else self.bias.reshape(1)

    def inputs(self) -> tuple:
        return (self.a, self.b) if self.bias is None else (self.a, self.b, self.bias)

    def describe(self) -> str:
        batch = f"{self.batch} x " if self.batch != 1 else ""
        bias = " + bias" if self.bias is not None else ""
        tf32 = " (tf32 allowed)" if self.tf32 and self.dtype == torch.float32 else ""
        return (f"{self.form}: {batch}({self.m} x {self.k}) @ ({self.k} x {self.n}){bias} "
                f"{str(self.dtype)[6:]}{tf32} on {self.a.device}")

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.m * self.n * self.k

    @property
    def esize(self) -> int:
        return self.dtype.itemsize

    @property
    def layout(self) -> tuple[bool, bool]:
        """(A's k stride is 1, B's k stride is 1): the loads the tiles make (k-contiguous
        operands are what nn.Linear's weight gives)."""
        return self.sa[2] == 1, self.sb[1] == 1

    def output(self) -> torch.Tensor:
        return allocator((self.batch, self.m, self.n), self.dtype, self.a.device)()


# ---------------------------------------------------------------------------------------------
# torch's argument rules
# ---------------------------------------------------------------------------------------------
def _check_tensors(name: str, **tensors) -> None:
    for arg, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise ArgumentTypeError(f"{name}: {arg} must be a tensor, got {type(t).__name__}")
    first = next(iter(tensors.values()))
    for arg, t in tensors.items():
        if t.layout is not torch.strided or t.is_neg() or t.is_conj() or t.is_quantized:
            raise TorchOnlyCall(f"{name}: {arg} is not a plain strided tensor")
        if t.dtype not in DTYPES:
            raise TorchOnlyCall(f"{name}: {arg} is {str(t.dtype)[6:]}; opselect's kernels take "
                                "float16, bfloat16 and float32")
        if t.dtype != first.dtype or t.device != first.device:
            # torch names the mismatch in its own words (and promotes nothing here either).
            raise TorchOnlyCall(f"{name}: {arg} is {str(t.dtype)[6:]} on {t.device}, the first "
                                f"tensor {str(first.dtype)[6:]} on {first.device}")


def _batch_view(t: torch.Tensor, batch_shape: tuple, rows: int, cols: int):
    """(source tensor, (batch stride, row stride, col stride)) of t (.., rows, cols) expanded to
    batch_shape and viewed as (batch, rows, cols), without a copy when the batch dims (after
    expanding) collapse into one; else a contiguous copy of the expanded tensor."""
    if t.dim() == 2 and not batch_shape:
        return t, (0, t.stride(0), t.stride(1)), False
    lead = len(batch_shape) - (t.dim() - 2)
    strides = [0] * lead + list(t.stride()[:-2])
    sizes = list(batch_shape)
    for i in range(lead, len(sizes)):
        if t.shape[i - lead] == 1:
            strides[i] = 0  # broadcast
    stride = None
    expect = None
    for i in range(len(sizes) - 1, -1, -1):
        if sizes[i] == 1:
            continue
        if stride is None:
            stride = strides[i]
        elif strides[i] != expect:
            stride = None
            break
        expect = strides[i] * sizes[i]
    else:
        if stride is None:
            stride = 0
        return t, (stride, t.stride(-2), t.stride(-1)), False
    copy = t.expand(*batch_shape, rows, cols).contiguous()
    return copy, (rows * cols, cols, 1), True


def _fill(call: MatmulCall, form: str, a, b, bias, out_shape, batch, m, n, k, sa, sb,
          a_src, b_src, copied) -> MatmulCall:
    call.form, call.a, call.b, call.bias, call.out_shape = form, a, b, bias, tuple(out_shape)
    call.batch, call.m, call.n, call.k, call.sa, call.sb = batch, m, n, k, tuple(sa), tuple(sb)
    call.a_src, call.b_src, call.copied = a_src, b_src, copied
    call.dtype = a.dtype
    call.tf32 = tf32 = call.dtype == torch.float32 and allow_tf32()
    if bias is None:
        call.bias_stride = None
    else:
        call.bias_stride = 0 if bias.numel() == 1 else bias.stride(-1)
    dev = a.device
    call.info = device_info(dev)
    has_bias = bias is not None
    layout = (sa[2] == 1, sb[1] == 1)
    call.key = (dev.index if dev.type == "cuda" else dev.type, call.dtype, tf32, has_bias,
                bucket(batch), bucket(m), bucket(n), bucket(k), layout)
    call.exact = (call.key[0], call.dtype, tf32, has_bias, batch, m, n, k, call.sa, call.sb,
                  call.bias_stride, copied)
    return call


def _prepare_matmul(input, other) -> MatmulCall:
    name = "matmul"
    _check_tensors(name, input=input, other=other)
    da, db = input.dim(), other.dim()
    if da == 0 or db == 0:
        raise InvalidArgument(f"{name}: both arguments to matmul need to be at least 1D, but they "
                              f"are {da}D and {db}D")
    a, b = input, other
    # 1-d operands as torch treats them: a vector on the left is a row, on the right a column;
    # its dim is dropped from the result.
    a2 = a.unsqueeze(0) if da == 1 else a
    b2 = b.unsqueeze(-1) if db == 1 else b
    m, k = a2.shape[-2], a2.shape[-1]
    k2, n = b2.shape[-2], b2.shape[-1]
    if k != k2:
        raise InvalidArgument(
            f"{name}: input is {tuple(a.shape)} and other {tuple(b.shape)}: input's last dim "
            f"({k}) must equal other's {'only' if db == 1 else 'second to last'} dim ({k2})")
    try:
        batch_shape = tuple(torch.broadcast_shapes(a2.shape[:-2], b2.shape[:-2]))
    except RuntimeError:
        raise InvalidArgument(f"{name}: the batch dims of input {tuple(a.shape)} and other "
                              f"{tuple(b.shape)} do not broadcast") from None
    out_shape = list(batch_shape)
    if da > 1:
        out_shape.append(m)
    if db > 1:
        out_shape.append(n)
    batch = math.prod(batch_shape)
    if db <= 2 and da > 2 and _rows_fold(a2):
        # (.., m, k) @ (k, n): the batch folds into the rows (one product of batch * m rows),
        # B is read once per tile column instead of once per batch.
        m, batch, sa = batch * m, 1, (0, a2.stride(-2), a2.stride(-1))
        a_src, a_copied = a2, False
    else:
        a_src, sa, a_copied = _batch_view(a2, batch_shape, m, k)
    b_src, sb, b_copied = _batch_view(b2, batch_shape, k, n)
    return _fill(MatmulCall(), name, input, other, None, out_shape, batch, m, n, k, sa, sb,
                 a_src, b_src, a_copied or b_copied)


def _rows_fold(a: torch.Tensor) -> bool:
    """The dims of a before its last one are one run of rows (viewable as (batch * m, k))."""
    expect = a.stride(-2)
    size = a.shape[-2]
    for i in range(a.dim() - 3, -1, -1):
        if a.shape[i] == 1:
            continue
        if a.stride(i) != expect * size:
            return False
        expect, size = a.stride(i), a.shape[i]
    return True


def _prepare_linear(input, weight, bias=None) -> MatmulCall:
    name = "linear"
    tensors = {"input": input, "weight": weight}
    if bias is not None:
        tensors["bias"] = bias
    _check_tensors(name, **tensors)
    if weight.dim() != 2:
        raise TorchOnlyCall(f"{name}: weight is {weight.dim()}-d; the kernels take a 2-d weight")
    if input.dim() == 0:
        raise InvalidArgument(f"{name}: input must be at least 1-d, got a 0-d tensor")
    n, k = weight.shape
    if input.shape[-1] != k:
        raise InvalidArgument(f"{name}: input's last dim is {input.shape[-1]}, weight is "
                              f"{tuple(weight.shape)} (out_features x in_features = {k})")
    if bias is not None and not (bias.dim() <= 1 and bias.numel() in (1, n)):
        raise TorchOnlyCall(f"{name}: bias is {tuple(bias.shape)}; the kernels add a bias of "
                            f"shape ({n},) or one value")
    a2 = input.unsqueeze(0) if input.dim() == 1 else input
    out_shape = (*input.shape[:-1], n)
    m = math.prod(a2.shape[:-1])
    if _rows_fold(a2):
        a_src, sa, copied = a2, (0, a2.stride(-2), a2.stride(-1)), False
    else:
        a_src = a2.reshape(m, k)  # a copy: the rows are no single run
        sa, copied = (0, a_src.stride(0), a_src.stride(1)), True
    sb = (0, weight.stride(1), weight.stride(0))  # B = weight.T
    return _fill(MatmulCall(), name, input, weight, bias, out_shape, 1, m, n, k, sa, sb,
                 a_src, weight, copied)


def _prepare_addmm(input, mat1, mat2) -> MatmulCall:
    """torch.addmm(input, mat1, mat2) with beta = alpha = 1 and input a bias row ((n,), (1, n)
    or one value): what GPT-2's Conv1D calls."""
    name = "addmm"
    _check_tensors(name, input=input, mat1=mat1, mat2=mat2)
    if mat1.dim() != 2 or mat2.dim() != 2:
        raise InvalidArgument(f"{name}: mat1 and mat2 must be 2-d, got {mat1.dim()}-d and "
                              f"{mat2.dim()}-d")
    m, k = mat1.shape
    k2, n = mat2.shape
    if k != k2:
        raise InvalidArgument(f"{name}: mat1 is {tuple(mat1.shape)} and mat2 "
                              f"{tuple(mat2.shape)}: mat1's columns must equal mat2's rows")
    if not (input.numel() in (1, n) and input.dim() <= 2 and
            (input.dim() < 2 or input.shape[0] == 1)):
        raise TorchOnlyCall(f"{name}: input is {tuple(input.shape)}; the kernels add a bias row "
                            f"of ({n},) or (1, {n})")
    return _fill(MatmulCall(), name, mat1, mat2, input, (m, n), 1, m, n, k,
                 (0, mat1.stride(0), mat1.stride(1)), (0, mat2.stride(0), mat2.stride(1)),
                 mat1, mat2, False)


# Prepared calls by everything the prepare functions read (their checks and views are most of a
# small call's host time); the memo keeps no tensor.
_PREPARED: dict[tuple, MatmulCall] = {}


def _plain(t) -> tuple | None:
    if type(t) is not torch.Tensor:
        return None
    return (t.shape, t.stride(), t.dtype, t.device)


_TENSOR, _PARAMETER, _FLOAT32 = torch.Tensor, torch.nn.Parameter, torch.float32


def plain_key(form: str, *tensors) -> tuple | None:
    """Everything a prepare function reads of a call of plain tensors (torch.Tensor, or None
    for a missing bias), with the tf32 switch where a float32 tensor makes it matter; None for
    other arguments.

    Every ops.matmul / ops.linear call computes it, torch's route included, so it is kept lean:
    one flat tuple, the switch read only for float32 (2.25 us a key on the H200's host before,
    against torch.matmul's 16.7 us of host time on a small product), and matmul's two operands
    keyed without a loop (1.57 -> 1.24 us on this workplace's CPU host)."""
    if len(tensors) == 2:
        a, b = tensors
        kind_a, kind_b = type(a), type(b)
        if (kind_a is not _TENSOR and kind_a is not _PARAMETER) or (
                kind_b is not _TENSOR and kind_b is not _PARAMETER) or a.is_neg() or \
                b.is_neg() or a.is_conj() or b.is_conj():
            return None
        dtype_a, dtype_b = a.dtype, b.dtype
        return (form, a.shape, a.stride(), dtype_a, a.device, b.shape, b.stride(), dtype_b,
                b.device, (dtype_a is _FLOAT32 or dtype_b is _FLOAT32) and allow_tf32())
    parts = [form]
    float32 = False
    for t in tensors:
        if t is None:
            parts.append(None)
            continue
        # (an nn.Parameter is keyed as the plain tensor it is: nn.Linear's weight and bias)
        kind = type(t)
        if (kind is not _TENSOR and kind is not _PARAMETER) or t.is_neg() or t.is_conj():
            return None
        dtype = t.dtype
        float32 = float32 or dtype is _FLOAT32
        parts += (t.shape, t.stride(), dtype, t.device)
    parts.append(float32 and allow_tf32())
    return tuple(parts)


def prepare_matmul(input, other) -> MatmulCall:
    key = plain_key("matmul", input, other)
    if key is None:
        return _prepare_matmul(input, other)
    known = _PREPARED.get(key)
    if known is not None and not known.copied:
        return known.for_input(input, other)
    call = _prepare_matmul(input, other)
    _remember(key, call)
    return call


def prepare_linear(input, weight, bias=None) -> MatmulCall:
    key = plain_key("linear", input, weight, bias)
    if key is None:
        return _prepare_linear(input, weight, bias)
    known = _PREPARED.get(key)
    if known is not None and not known.copied:
        return known.for_input(*((input, weight) if bias is None else (input, weight, bias)))
    call = _prepare_linear(input, weight, bias)
    _remember(key, call)
    return call


def prepare_addmm(input, mat1, mat2, *, beta=1, alpha=1) -> MatmulCall:
    if not (type(beta) in (int, float) and beta == 1 and type(alpha) in (int, float) and alpha == 1):
        raise TorchOnlyCall("addmm: beta and alpha other than 1 are torch's")
    key = plain_key("addmm", mat1, mat2, input)
    if key is None:
        return _prepare_addmm(input, mat1, mat2)
    known = _PREPARED.get(key)
    if known is not None:
        return known.for_input(mat1, mat2, input)
    call = _prepare_addmm(input, mat1, mat2)
    _remember(key, call)
    return call


def _remember(key: tuple, call: MatmulCall) -> None:
    if len(_PREPARED) >= 4096:
        _PREPARED.clear()
    _PREPARED[key] = call.for_input()


# ---------------------------------------------------------------------------------------------
# torch's own ops (the torch backend)
# ---------------------------------------------------------------------------------------------
def torch_product(call: MatmulCall) -> torch.Tensor:
    if call.form == "matmul":
        return torch.matmul(call.a, call.b)
    if call.form == "linear":
        return torch.nn.functional.linear(call.a, call.b, call.bias)
    return torch.addmm(call.bias, call.a, call.b)


def torch_prepared(call: MatmulCall):
    """torch's op as a function of the call's tensors (what a route of torch's choice runs)."""
    if call.form == "matmul":
        return torch.matmul
    if call.form == "linear":
        return torch.nn.functional.linear
    return lambda a, b, bias: torch.addmm(bias, a, b)


# ---------------------------------------------------------------------------------------------
# Inputs for warming, calibration and benchmarks
# ---------------------------------------------------------------------------------------------
def _random(shape, dtype, device, transposed: bool) -> torch.Tensor:
    shape = list(shape)
    if transposed:
        shape[-2], shape[-1] = shape[-1], shape[-2]
    t = torch.randn(shape, device=device, dtype=torch.float32).to(dtype)
    return t.transpose(-1, -2) if transposed else t


def sample_matmul(shapes, dtype: torch.dtype, options: dict, device: torch.device):
    """Inputs of torch.matmul: shapes [input's, other's]; options transpose_a / transpose_b
    (the operand is the transpose of a contiguous tensor)."""
    if len(shapes) != 2:
        raise InvalidArgument(f"matmul sample: expected two shapes (input, other), got {shapes}")
    options = dict(options)
    ta = bool(options.pop("transpose_a", False))
    tb = bool(options.pop("transpose_b", False))
    if options:
        raise InvalidArgument(f"matmul sample: unknown options {sorted(options)}; expected "
                              "transpose_a, transpose_b")
    a = _random(shapes[0], dtype, device, ta and len(shapes[0]) > 1)
    b = _random(shapes[1], dtype, device, tb and len(shapes[1]) > 1)
    return (a, b), {}


def sample_linear(shapes, dtype: torch.dtype, options: dict, device: torch.device):
    """Inputs of F.linear: shapes [input's, weight's (out, in)]; option bias (default True)."""
    if len(shapes) != 2:
        raise InvalidArgument(f"linear sample: expected two shapes (input, weight), got {shapes}")
    options = dict(options)
    with_bias = bool(options.pop("bias", True))
    if options:
        raise InvalidArgument(f"linear sample: unknown options {sorted(options)}; expected bias")
    x = _random(shapes[0], dtype, device, False)
    w = _random(shapes[1], dtype, device, False) / math.sqrt(max(1, shapes[1][-1]))
    bias = _random([shapes[1][0]], dtype, device, False) if with_bias else None
    return (x, w, bias), {}


def replay(call: MatmulCall) -> tuple[tuple, dict]:
    """The public call a prepared one came from (tuning's first runs): ops.matmul's arguments,
    or ops.linear's (an addmm is the linear of mat2's transpose)."""
    if call.form == "matmul":
        return (call.a, call.b), {}
    if call.form == "linear":
        return (call.a, call.b, call.bias), {}
    return (call.a, call.b.t(), call.bias.reshape(-1).expand(call.n)), {}


CALIBRATION_MATMUL = [
    ([[4096, 4096], [4096, 4096]], torch.bfloat16, {}),
    ([[16, 4096], [4096, 4096]], torch.bfloat16, {"transpose_b": True}),
    ([[1000, 3000], [3000, 777]], torch.float16, {}),
    ([[8, 512, 512], [8, 512, 512]], torch.float32, {}),
]
CALIBRATION_LINEAR = [
    ([[1, 4096], [11008, 4096]], torch.bfloat16, {}),
    ([[2048, 4096], [4096, 4096]], torch.bfloat16, {}),
]
