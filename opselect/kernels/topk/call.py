"""topk's calls: torch's argument rules (k, dim, largest, sorted), the rows view of a call,
outputs, the torch fallback, and the inputs warm and tuning make (sample / replay)."""

from __future__ import annotations

import math
import operator

import torch

from ...dispatch.device import device_info
from ...dispatch.op import Call
from ...dispatch.signature import bucket
from ...errors import ArgumentTypeError, DimError, InvalidArgument, TorchOnlyCall
from .._common import allocator, prepared


SUPPORTED_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                    torch.float16, torch.bfloat16, torch.float32, torch.float64)


# ---------------------------------------------------------------------------------------------
# The call: torch.topk's argument rules
# ---------------------------------------------------------------------------------------------
class TopkCall(Call):
    __slots__ = ("input", "k", "dim", "largest", "sorted", "nd", "R", "N", "lead",
                 "row_stride", "col_stride", "viewable")

    def inputs(self) -> tuple:
        return (self.input,)

    def for_input(self, input) -> "TopkCall":
        """This call's facts for another tensor of the same shape, strides, dtype and device."""
        c = TopkCall.__new__(TopkCall)
        c.info, c.key, c.exact, c.input, c.k, c.dim, c.largest, c.sorted, c.nd = (
            self.info, self.key, self.exact, input, self.k, self.dim, self.largest, self.sorted,
            self.nd)
        c.R, c.N, c.lead, c.row_stride, c.col_stride, c.viewable = (
            self.R, self.N, self.lead, self.row_stride, self.col_stride, self.viewable)
        return c

    @property
    def empty(self) -> bool:
        return self.k == 0 or self.R == 0

    def empty_result(self):
        if self.nd == 0:
            return _zero_dim(self)
        # R rows of k values and int64 indices, shaped as torch's (under autograd the values
        # are gathered from the input, as every backend's are, for their gradient).
        return _with_grad(self, _output_finisher(self)(*_output_maker(self)()))

    def describe(self) -> str:
        x = self.input
        return (f"input {tuple(x.shape)} {str(x.dtype)[6:]}, k={self.k}, dim={self.dim}"
                f"{'' if self.largest else ', smallest'}{'' if self.sorted else ', unsorted'}"
                f" on {x.device}")


def _int_arg(value, name: str) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise ArgumentTypeError(f"topk: {name} must be an int, got {type(value).__name__}")
    return operator.index(value)


def _bool_arg(value, name: str) -> bool:
    if not isinstance(value, bool):
        raise ArgumentTypeError(f"topk: {name} must be a bool, got {type(value).__name__}")
    return value


def _layout(shape: tuple, strides: tuple, d: int) -> tuple[int, int, bool]:
    """(row_stride, col_stride, viewable): whether the rows (every dim but d, in order) collapse
    into one dim of a single stride, so kernels can read the input in place."""
    lead = [(shape[i], strides[i]) for i in range(len(shape)) if i != d and shape[i] != 1]
    for (s0, st0), (s1, st1) in zip(lead, lead[1:]):
        if st0 != st1 * s1:
            return 0, 0, False
    row_stride = lead[-1][1] if lead else 0
    return row_stride, (strides[d] if shape else 1), True


#: prepare()'s results by plain_key (shape, strides, dtype, device, k, dim, largest, sorted,
#: autograd), without their tensors: a call like an earlier one skips the argument checks and
#: the layout work (several microseconds of Python, a fair part of a call that launches in a
#: few more).
_PREPARED: dict[tuple, TopkCall] = {}


def plain_key(input, k, dim, largest, sorted) -> tuple | None:
    """Everything _prepare reads of a call with plain arguments (a tensor, int k and dim, bool
    largest and sorted), as a key; None for any other arguments. ops.py and routing.py key
    their routes (Op.routes) by it too, so it also says whether autograd records the call: a
    prepared call made without autograd must not answer one that needs it."""
    if (type(k) is int and type(dim) is int and type(largest) is bool
            and type(sorted) is bool and isinstance(input, torch.Tensor)
            and not input.is_neg()):  # (prepared afresh: _prepare materialises the view)
        return (input.shape, input.stride(), input.dtype, input.device, k, dim, largest, sorted,
                input.requires_grad and torch.is_grad_enabled())
    return None


def prepare(input, k, dim=-1, largest=True, sorted=True) -> TopkCall:
    return prepare_keyed(plain_key(input, k, dim, largest, sorted), input, k, dim, largest,
                         sorted)


def prepare_keyed(key: tuple | None, input, k, dim, largest, sorted) -> TopkCall:
    """_prepare, from the memo when `key` (plain_key's) was prepared before."""
    return prepared(_PREPARED, key, input, _prepare, input, k, dim, largest, sorted)


def _prepare(input, k, dim, largest, sorted) -> TopkCall:
    """torch.topk's argument rules, and the facts every backend needs about the call."""
    if not isinstance(input, torch.Tensor):
        raise ArgumentTypeError(f"topk: input must be a Tensor, got {type(input).__name__}")
    if input.is_neg():
        # A lazy negative view (z.conj().imag) holds its values un-negated in memory, which is
        # what the kernels read: they get the values materialised (recorded by autograd).
        input = input.resolve_neg()
    k = _int_arg(k, "k")
    dim = _int_arg(dim, "dim")
    largest = _bool_arg(largest, "largest")
    sorted = _bool_arg(sorted, "sorted")
    dtype = input.dtype
    if dtype not in SUPPORTED_DTYPES:
        # Quantized, bool, complex, uint16-64, float8: torch's op answers (some on some devices
        # only) or raises its own error.
        raise TorchOnlyCall(f"topk: input has dtype {dtype}; opselect's kernels take "
                            f"{', '.join(str(d)[6:] for d in SUPPORTED_DTYPES)}")
    shape = tuple(input.shape)
    nd = len(shape)
    span = max(nd, 1)
    if not -span <= dim < span:
        raise DimError(f"topk: dim {dim} is out of range for a {nd}-d input (expected to be in "
                       f"range of [{-span}, {span - 1}], but got {dim})")
    d = dim % span
    n = shape[d] if nd else 1
    if k < 0 or k > n:
        raise InvalidArgument(f"topk: selected index k out of range: k={k} but dim {dim} has "
                              f"size {n} (expected 0 <= k <= {n})")
    call = TopkCall()
    call.input, call.k, call.dim, call.largest, call.sorted, call.nd = (
        input, k, d, largest, sorted, nd)
    call.N = n
    call.R = input.numel() // n if n else math.prod(shape[:d] + shape[d + 1:])
    call.lead = shape[:d] + shape[d + 1:]
    call.row_stride, call.col_stride, call.viewable = _layout(shape, input.stride(), d)
    dev = input.device
    call.info = device_info(dev)
    inner = call.viewable and (call.col_stride == 1 or n <= 1)
    call.key = (dev.index if dev.type == "cuda" else dev.type, dtype, bucket(call.R),
                bucket(n), bucket(k), largest, sorted, "rows" if inner else
                ("strided" if call.viewable else "gather"))
    call.exact = (call.key[0], dtype, call.R, n, k, largest, sorted, call.key[-1],
                  call.row_stride, call.col_stride)
    return call


# ---------------------------------------------------------------------------------------------
# Shared host helpers
# ---------------------------------------------------------------------------------------------
def _reader(call: TopkCall, unit_col: bool):
    """(read, row_stride, col_stride) for kernels reading R rows of N: read(x) is the tensor
    they read for an input x of the call's layout, None where that is x itself (its rows are
    one strided dim and, if unit_col, elements are adjacent), else a contiguous copy."""
    if call.viewable and (not unit_col or call.col_stride == 1 or call.N <= 1):
        return None, call.row_stride, (call.col_stride if call.N > 1 else 1)
    dim = call.dim
    return (lambda x: x.movedim(dim, -1).contiguous()), call.N, 1


def _output_maker(call: TopkCall):
    """new() -> (values, indices) as the kernels write them: R rows of k, contiguous, shaped
    with the input's other dims first (already torch's layout when dim is the last one)."""
    shape = call.lead + (call.k,)
    dtype, device = call.input.dtype, call.input.device

    new_values = allocator(shape, dtype, device)
    new_indices = allocator(shape, torch.int64, device)

    def new() -> tuple[torch.Tensor, torch.Tensor]:
        return new_values(), new_indices()

    return new


def _output_finisher(call: TopkCall, sort_after: bool = False):
    """finish(values, indices): results from _output_maker()'s tensors in torch.topk's layout
    (k at `dim`, contiguous); with sort_after, winners the kernels left unordered (64-bit
    keys, k past an in-register sort) are sorted first."""
    dim, largest = call.dim, call.largest
    moved = dim != max(call.nd, 1) - 1

    def finish(values: torch.Tensor, indices: torch.Tensor):
        if sort_after:
            values, order = torch.sort(values, dim=-1, descending=largest)
            indices = indices.gather(-1, order)
        if moved:
            values = values.movedim(-1, dim).contiguous()
            indices = indices.movedim(-1, dim).contiguous()
        return torch.return_types.topk((values, indices))

    return finish


def _grad(call: TopkCall) -> bool:
    return call.input.requires_grad and torch.is_grad_enabled()


def _with_grad(call: TopkCall, out):
    """Under autograd the values are gathered again from the input (k per row), which gives
    them torch's gradient (a scatter into the selected positions)."""
    if _grad(call):
        return torch.return_types.topk((torch.gather(call.input, call.dim, out.indices),
                                        out.indices))
    return out


def _zero_dim(call: TopkCall):
    """A 0-d input (k = 0 or 1 of its one value): torch's own answer, which no kernel needs
    (and whose shapes, 0-d outputs, the rows view does not describe)."""
    return torch.topk(call.input, call.k, -1, call.largest, call.sorted)


def _torch_topk(call: TopkCall):
    return torch.topk(call.input, call.k, call.dim, call.largest, call.sorted)


# ---------------------------------------------------------------------------------------------
# Warm-spec inputs
# ---------------------------------------------------------------------------------------------
def sample(shapes, dtype: torch.dtype, options: dict, device: torch.device):
    """Inputs for warming and benchmarks: one shape; options: k (required), dim, largest,
    sorted, values = "randn" (default), "uniform" (in [0, 1)) or "ties" (a few distinct
    values, so the k-th value is shared by many elements)."""
    if len(shapes) != 1:
        raise InvalidArgument(f"topk sample: expected one shape (the input), got {shapes}")
    options = dict(options)
    if "k" not in options:
        raise InvalidArgument("topk sample: options must give k")
    k = options.pop("k")
    values = options.pop("values", "randn")
    shape = tuple(shapes[0])
    n = math.prod(shape)
    if values == "randn":
        x = torch.randn(n, device=device)
    elif values == "uniform":
        x = torch.rand(n, device=device)
    elif values == "ties":
        x = torch.randint(0, 16, (n,), device=device).float()
    else:
        raise InvalidArgument(f"topk sample: values must be 'randn', 'uniform' or 'ties', "
                              f"got {values!r}")
    if dtype.is_floating_point:
        x = x.to(dtype)
    else:
        info = torch.iinfo(dtype)
        if values == "ties":
            x = x.to(dtype)
        else:
            x = torch.randint(info.min, info.max, (n,), device=device, dtype=dtype)
    return (x.reshape(shape), k), options


def replay(call: TopkCall) -> tuple[tuple, dict]:
    """The public call a prepared one came from (tuning's first runs)."""
    return (call.input, call.k, call.dim, call.largest, call.sorted), {}


class PreparedRuns:
    """_launch() and bind() of a backend whose work is its `_prepared(plan, call)`, a function
    of the input: a run and a route both go through it (one code path for the launch
    arithmetic)."""

    def _launch(self, plan, call: TopkCall):
        if call.nd == 0:
            return _zero_dim(call)
        # Under autograd the values are gathered again (_with_grad).
        return _with_grad(call, self._prepared(plan, call)(call.input))

    def bind(self, call: TopkCall, config):
        return _bind(self, call, config)


def _bind(backend, call: TopkCall, config):
    """bind() of a topk backend: its prepared call under its plan of the call; None (run()
    every time) where a call launches nothing or needs autograd (its gather reads the call's
    own input, which a prepared call never holds)."""
    if call.nd == 0 or call.empty or _grad(call):
        return None
    return backend._prepared(backend.plan(call, config), call)
