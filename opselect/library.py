"""opselect's ops as torch.library ops, so torch.compile traces them with no graph break and CUDA
graphs capture them.

Two ops per public function, in the `opselect` namespace:

  opselect.<op>           the op itself (isin, topk, permute, softmax, log_softmax, and
                          softmax_backward): its kernel runs the dispatcher's choice at run time,
                          a fake implementation gives the exact shapes, dtypes and strides, and
                          autograd is registered (softmax and log_softmax backward through
                          opselect.softmax_backward, which runs the fused backward kernels).
  opselect.<op>_or_aten   what `ops.<op>` calls while compiling: a CompositeImplicitAutograd op,
                          so its Python runs at trace time on the traced shapes (never traced by
                          Dynamo) and leaves either the aten op or opselect.<op> in the graph.

Where a compiled call goes (the rule, decided at trace time; `COMPILED_RULE` below):

  * A forced backend keeps it: backend="torch" is the aten op, any other is opselect.<op>.
  * Static shapes: the aten op where inductor generates a kernel of its own as good as ours
    (it fuses that kernel with its neighbours, which an opaque op prevents): permute (a tiled
    copy), softmax and log_softmax (a fused reduction). isin: inductor runs torch._decomp's
    decomposition, never aten.isin: below 10 * M**0.145 test elements it compares every element
    with every test element (one fused reduction), above it sorts the test set (one Triton
    kernel up to 512 elements, aten.sort beyond) and runs one fused binary search per element
    (bucketize). Its time is estimated by our backend that does the same work (`compare`,
    `search`; `torch` for assume_unique, which sorts everything), measured where the tune cache
    has it, else the cost model's, and opselect.isin is placed only where the dispatcher's choice,
    plus one more pass over the elements and the result (fused by inductor, not by an opaque op),
    beats that by the dispatcher's TORCH_MARGIN (_isin_inductor_keeps). topk: inductor falls
    back to aten.topk (it sorts only with config.triton.decompose_sort_ops, off by default, and
    a sort loses to opselect's selection kernels either way), so the dispatcher's choice for the
    traced shapes decides: torch's choice is the aten op, any other backend is opselect.<op>.
  * Dynamic shapes (a symbolic size): permute and softmax stay aten; isin and topk become
    opselect.<op>, which chooses per call at run time (torch's kernel among the candidates), so
    no size is guarded and no size recompiles.

The ops are registered with Library.define + impl + register_fake: their dispatch costs 1.7 us
a call on the CPU against 8.5-16 us for torch.library.custom_op and 11-12 us for triton_op
(benchmarks/bench_library.py, benchmarks/results/cpu/library.md). Eager calls of `ops.*` do not pay even that: they call the
dispatcher directly and come here only while compiling (torch.compiler.is_compiling()).
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Callable, Optional, Sequence

import torch
import torch.autograd.forward_ad as _fwad

from . import routing_state as _routing
from . import transforms as _transforms
from . import usage as _usage
from .dispatch import op as _dispatch_op
from .dispatch.op import Op
from .errors import BackendError, TorchOnlyCall
from .kernels import isin as _isin
from .kernels import permute as _permute
from .kernels import softmax as _softmax
from .kernels import topk as _topk

#: "auto": the rule in the module's docstring; "dispatcher": the dispatcher's choice wherever the
#: shapes are static (what opselect would do in eager mode, ignoring what inductor does itself);
#: "aten": never opselect's op unless a backend is forced. Read at trace time (a graph compiled
#: earlier keeps its choices). OPSELECT_COMPILED sets it from the environment.
_RULES = ("auto", "dispatcher", "aten")
COMPILED_RULE = os.environ.get("OPSELECT_COMPILED", "auto")
if COMPILED_RULE not in _RULES:
    warnings.warn(f"opselect: OPSELECT_COMPILED={COMPILED_RULE!r} is not one of {_RULES}; "
                  "using 'auto'", UserWarning, stacklevel=2)
    COMPILED_RULE = "auto"

#: Ops whose calls with dynamic shapes become opselect's op under the "auto" rule.
_DYNAMIC_OPSELECT = frozenset({"isin", "topk"})

LIB = torch.library.Library("opselect", "DEF")
_ops = torch.ops.opselect

LIB.define("isin(Tensor elements, Tensor test_elements, bool assume_unique=False, "
           "bool invert=False, str? backend=None) -> Tensor")
LIB.define("topk(Tensor input, SymInt k, int dim=-1, bool largest=True, bool sorted=True, "
           "str? backend=None) -> (Tensor values, Tensor indices)")
LIB.define("permute(Tensor input, int[] dims, str? backend=None) -> Tensor")
LIB.define("softmax(Tensor input, int dim, ScalarType? dtype=None, str? backend=None) -> Tensor")
LIB.define("log_softmax(Tensor input, int dim, ScalarType? dtype=None, str? backend=None) "
           "-> Tensor")
LIB.define("softmax_backward(Tensor output, Tensor grad, int dim, bool log, "
           "ScalarType grad_dtype) -> Tensor")
LIB.define("isin_or_aten(Tensor elements, Tensor test_elements, bool assume_unique=False, "
           "bool invert=False, str? backend=None) -> Tensor")
LIB.define("topk_or_aten(Tensor input, SymInt k, int dim=-1, bool largest=True, "
           "bool sorted=True, str? backend=None) -> (Tensor values, Tensor indices)")
LIB.define("permute_or_aten(Tensor input, int[] dims, str? backend=None) -> Tensor")
LIB.define("softmax_or_aten(Tensor input, int dim, ScalarType? dtype=None, str? backend=None) "
           "-> Tensor")
LIB.define("log_softmax_or_aten(Tensor input, int dim, ScalarType? dtype=None, "
           "str? backend=None) -> Tensor")


# ---------------------------------------------------------------------------------------------
# The ops' kernels: the dispatcher at run time (below autograd: grad mode off inside, so the
# eager autograd wrappers of the backends stay out of it)
# ---------------------------------------------------------------------------------------------
_set_grad_enabled = torch._C._set_grad_enabled


def _unrouted(fn: Callable) -> Callable:
    """fn with opselect.enable()'s routing off while it runs: torch's own ops that it calls
    (the `torch` backend, a trace-time fallback to the aten op, a .contiguous() in a prepare)
    reach torch, never a patched entry point that would come back here."""

    def unrouted(*args, **kwargs):
        token = _routing.suspend()
        try:
            return fn(*args, **kwargs)
        finally:
            _routing.resume(token)

    unrouted.__name__ = unrouted.__qualname__ = fn.__name__
    return unrouted


def _run(op: Op, call, backend: Optional[str]):
    grad = torch.is_grad_enabled()
    if grad:
        _set_grad_enabled(False)
    try:
        result = op.run(call, backend)
    finally:
        if grad:
            _set_grad_enabled(True)
    _usage.record_run(op, call, backend)
    return result


def _isin_kernel(elements, test_elements, assume_unique=False, invert=False, backend=None):
    try:
        call = _isin.prepare(elements, test_elements, assume_unique=assume_unique, invert=invert)
    except TorchOnlyCall:  # (placed with dynamic shapes; a dtype only torch's op takes)
        return torch.isin(elements, _flat_test(test_elements), assume_unique=assume_unique,
                          invert=invert)
    return _run(_isin.OP, call, backend)


def _topk_kernel(input, k, dim=-1, largest=True, sorted=True, backend=None):
    try:
        call = _topk.prepare(input, int(k), dim, largest, sorted)
    except TorchOnlyCall:  # (placed with dynamic shapes; a dtype only torch's op takes)
        values, indices = torch.topk(input, int(k), dim, largest, sorted)
        return values, indices
    # Each output a tensor of its own (the schema's outputs alias nothing).
    values, indices = _run(_topk.OP, call, backend)
    return values, indices


def _permute_kernel(input, dims, backend=None):
    return _run(_permute.OP, _permute.prepare(input, list(dims)), backend)


def _softmax_kernel(input, dim, dtype=None, backend=None):
    return _run(_softmax.SOFTMAX_OP, _softmax.prepare_softmax(input, dim, dtype=dtype), backend)


def _log_softmax_kernel(input, dim, dtype=None, backend=None):
    return _run(_softmax.LOG_SOFTMAX_OP, _softmax.prepare_log_softmax(input, dim, dtype=dtype),
                backend)


def _softmax_backward_kernel(output, grad, dim, log, grad_dtype):
    from .dispatch.device import device_info

    if not device_info(output.device).runs_triton:
        # In the output's dtype, then cast: torch's CPU kernels take no mixed dtypes.
        fn = torch._log_softmax_backward_data if log else torch._softmax_backward_data
        return fn(grad, output, dim, output.dtype).to(grad_dtype)
    if output.is_cuda and output.device.index != torch.cuda.current_device():
        with torch.cuda.device(output.device):
            return _softmax.backward(output.contiguous(), grad, dim, log, grad_dtype)
    return _softmax.backward(output.contiguous(), grad, dim, log, grad_dtype)


for _name, _fn in (("isin", _isin_kernel), ("topk", _topk_kernel), ("permute", _permute_kernel),
                   ("softmax", _softmax_kernel), ("log_softmax", _log_softmax_kernel),
                   ("softmax_backward", _softmax_backward_kernel)):
    LIB.impl(_name, _unrouted(_fn), "CompositeExplicitAutograd")


# ---------------------------------------------------------------------------------------------
# Fake implementations: the outputs' metadata, exactly as the kernels make them (every output is
# a new contiguous tensor, as torch's own ops return)
# ---------------------------------------------------------------------------------------------
def _wrap(dim: int, rank: int, what: str) -> int:
    span = max(rank, 1)
    if not -span <= dim < span:
        raise IndexError(f"{what}: dim {dim} is out of range for a {rank}-d input "
                         f"(expected [{-span}, {span - 1}])")
    return dim % span


@torch.library.register_fake("opselect::isin", lib=LIB)
def _isin_fake(elements, test_elements, assume_unique=False, invert=False, backend=None):
    return elements.new_empty(elements.shape, dtype=torch.bool)


@torch.library.register_fake("opselect::topk", lib=LIB)
def _topk_fake(input, k, dim=-1, largest=True, sorted=True, backend=None):
    d = _wrap(dim, input.dim(), "topk")
    shape = list(input.shape)
    if shape:
        shape[d] = k
    return input.new_empty(shape), input.new_empty(shape, dtype=torch.int64)


@torch.library.register_fake("opselect::permute", lib=LIB)
def _permute_fake(input, dims, backend=None):
    return input.new_empty([input.shape[d] for d in dims])


def _softmax_fake(input, dim, dtype=None, backend=None):
    _wrap(dim, input.dim(), "softmax")
    return input.new_empty(input.shape, dtype=dtype if dtype is not None else input.dtype)


torch.library.register_fake("opselect::softmax", _softmax_fake, lib=LIB)
torch.library.register_fake("opselect::log_softmax", _softmax_fake, lib=LIB)


@torch.library.register_fake("opselect::softmax_backward", lib=LIB)
def _softmax_backward_fake(output, grad, dim, log, grad_dtype):
    return output.new_empty(output.shape, dtype=grad_dtype)


# ---------------------------------------------------------------------------------------------
# Autograd (reverse and forward mode) and vmap
#
# Each op's Autograd kernel is an autograd.Function (as torch.library.register_autograd makes
# one) that also has a jvp, so a dual tensor's tangent is carried, never dropped; its forward
# runs the op below autograd. vmap rules fold the batch dim into the op's own input
# (transforms.py has the same rules for the eager path).
# ---------------------------------------------------------------------------------------------
_BelowAutograd = torch._C._AutoDispatchBelowAutograd
_any_requires_grad = torch._C._any_requires_grad


def _apply(fn: type, *args):
    """fn.apply as the op's Autograd kernel. torch.func's grad / jvp transforms cannot run a
    custom op's autograd.Function from there (register_autograd's ops fail the same way), so
    they get a clear error naming the eager op, which supports them (transforms.py)."""
    if _functorch_active():
        raise NotImplementedError(
            f"torch.ops.opselect.{fn.op_name}: torch.func's grad / jvp / jacrev transforms do "
            f"not reach a custom op's autograd; call opselect.ops.{fn.op_name} (which supports "
            "them) instead. Forward-mode AD (torch.autograd.forward_ad), autograd and vmap work "
            "here.")
    return super(torch.autograd.Function, fn).apply(*args)


_functorch_active = torch._C._are_functorch_transforms_active


def _differentiated(*tensors) -> bool:
    """Autograd records this call (reverse mode), or a forward-AD tangent rides on an input."""
    if torch.is_grad_enabled() and _any_requires_grad(*tensors):
        return True
    if _fwad._current_level < 0:
        return False
    return any(_fwad.unpack_dual(t).tangent is not None for t in tensors)


class _SoftmaxAutograd(torch.autograd.Function):
    op_name = "softmax"
    @staticmethod
    def forward(x, dim, dtype, backend, log):
        with _BelowAutograd():
            return (_ops.log_softmax if log else _ops.softmax)(x, dim, dtype, backend)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, dim, dtype, _, log = inputs
        ctx.save_for_backward(output)
        ctx.save_for_forward(output)
        ctx.dim, ctx.log = dim % max(x.dim(), 1), log
        ctx.in_dtype = x.dtype
        out_dtype = dtype if dtype is not None else x.dtype
        # A widening cast is part of the kernels' load: dx comes out in the input's dtype. A
        # narrowing one rounds the input first (as torch does): dx is the cast input's, then
        # cast back.
        ctx.grad_dtype = x.dtype if (x.dtype, out_dtype) in _softmax._WIDENING else out_dtype

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        if torch.is_grad_enabled() or _softmax.kernels_cannot_read(g):
            # A graph of the backward is wanted (double backward), or g is batched (vmap over
            # the backward): differentiable torch ops.
            dx = _transforms.softmax_vjp(y, g.to(y.dtype), ctx.dim, ctx.log).to(ctx.grad_dtype)
        else:
            dx = _ops.softmax_backward(y, g, ctx.dim, ctx.log, ctx.grad_dtype)
        if dx.dtype != ctx.in_dtype:
            dx = dx.to(ctx.in_dtype)
        return dx, None, None, None, None

    @staticmethod
    def jvp(ctx, t, *_):
        (y,) = ctx.saved_tensors
        return _transforms.softmax_tangent(y, t.to(y.dtype), ctx.dim, ctx.log)


def _softmax_autograd(log: bool):
    kernel = _ops.log_softmax if log else _ops.softmax

    def autograd(input, dim, dtype=None, backend=None):
        if _differentiated(input):
            return _apply(_SoftmaxAutograd, input, dim, dtype, backend, log)
        with _BelowAutograd():
            return kernel(input, dim, dtype, backend)

    return autograd


class _TopkAutograd(torch.autograd.Function):
    op_name = "topk"
    @staticmethod
    def forward(x, k, dim, largest, sorted_, backend):
        with _BelowAutograd():
            return _ops.topk(x, k, dim, largest, sorted_, backend)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, dim = inputs[0], inputs[2]
        ctx.mark_non_differentiable(output[1])
        ctx.save_for_backward(output[1])
        ctx.save_for_forward(output[1])
        ctx.shape, ctx.dim = x.shape, dim % max(x.dim(), 1)

    @staticmethod
    def backward(ctx, g_values, _g_indices):
        (indices,) = ctx.saved_tensors
        dx = _transforms.topk_vjp(g_values, indices, ctx.shape, ctx.dim)
        return dx, None, None, None, None, None

    @staticmethod
    def jvp(ctx, t, *_):
        (indices,) = ctx.saved_tensors
        return _transforms.topk_tangent(t, indices, ctx.dim), None


def _topk_autograd(input, k, dim=-1, largest=True, sorted=True, backend=None):
    if _differentiated(input):
        return _apply(_TopkAutograd, input, k, dim, largest, sorted, backend)
    with _BelowAutograd():
        return _ops.topk(input, k, dim, largest, sorted, backend)


class _PermuteAutograd(torch.autograd.Function):
    op_name = "permute"
    @staticmethod
    def forward(x, dims, backend):
        with _BelowAutograd():
            return _ops.permute(x, dims, backend)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.dims = list(inputs[1])

    @staticmethod
    def backward(ctx, g):
        return g.permute(_transforms.inverse(ctx.dims)), None, None

    @staticmethod
    def jvp(ctx, t, *_):
        return t.permute(ctx.dims)


def _permute_autograd(input, dims, backend=None):
    if _differentiated(input):
        return _apply(_PermuteAutograd, input, dims, backend)
    with _BelowAutograd():
        return _ops.permute(input, dims, backend)


for _name, _fn in (("softmax", _softmax_autograd(False)), ("log_softmax", _softmax_autograd(True)),
                   ("topk", _topk_autograd), ("permute", _permute_autograd)):
    LIB.impl(_name, _fn, "Autograd")


def _first(x: torch.Tensor, bdim) -> torch.Tensor:
    return x if bdim in (None, 0) else x.movedim(bdim, 0)


def _softmax_vmap(log: bool):
    kernel = _ops.log_softmax if log else _ops.softmax

    def vmap(info, in_dims, input, dim, dtype=None, backend=None):
        if in_dims[0] is None:
            return kernel(input, dim, dtype, backend), None
        x = _first(input, in_dims[0])
        rank = x.dim() - 1
        if rank == 0:  # each element its own row
            return kernel(x.unsqueeze(1), 1, dtype, backend).squeeze(1), 0
        d = _wrap(dim, rank, "log_softmax" if log else "softmax")
        return _transforms.batched(lambda: kernel(x, d + 1, dtype, backend),
                                   lambda b: kernel(x[b].contiguous(), d, dtype, backend), x.shape[0]), 0

    return vmap


def _topk_vmap(info, in_dims, input, k, dim=-1, largest=True, sorted=True, backend=None):
    if in_dims[0] is None:
        return _ops.topk(input, k, dim, largest, sorted, backend), (None, None)
    x = _first(input, in_dims[0])
    if x.dim() == 1:  # a 0-d input per batch: each answered as torch answers a 0-d topk
        _wrap(dim, 0, "topk")
        rows = [_ops.topk(x[b], k, dim, largest, sorted, backend) for b in range(x.shape[0])]
        if not rows:
            return (x.clone(), torch.zeros(x.shape, dtype=torch.int64, device=x.device)), (0, 0)
        return (torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows])), (0, 0)
    d = _wrap(dim, x.dim() - 1, "topk")
    return _transforms.batched(lambda: _ops.topk(x, k, d + 1, largest, sorted, backend),
                               lambda b: _ops.topk(x[b].contiguous(), k, d, largest, sorted, backend),
                               x.shape[0]), (0, 0)


def _permute_vmap(info, in_dims, input, dims, backend=None):
    if in_dims[0] is None:
        return _ops.permute(input, dims, backend), None
    x = _first(input, in_dims[0])
    rank = x.dim() - 1
    wrapped = [_wrap(d, rank, "permute") for d in dims]
    return _transforms.batched(lambda: _ops.permute(x, [0, *(d + 1 for d in wrapped)], backend),
                               lambda b: _ops.permute(x[b].contiguous(), wrapped, backend), x.shape[0]), 0


def _isin_vmap(info, in_dims, elements, test_elements, assume_unique=False, invert=False,
               backend=None):
    e_dim, t_dim = in_dims[0], in_dims[1]
    if t_dim is None:
        out = _ops.isin(_first(elements, e_dim), test_elements, assume_unique, invert, backend)
        return out, (None if e_dim is None else 0)
    # A test set per batch: each batch's elements against its own test set.
    test = _first(test_elements, t_dim)
    batch = test.shape[0]
    e = (elements.expand(batch, *elements.shape) if e_dim is None
         else _first(elements, e_dim))
    rows = [_ops.isin(e[b], test[b], assume_unique, invert, backend) for b in range(batch)]
    if not rows:
        return torch.empty(e.shape, dtype=torch.bool, device=e.device), 0
    return torch.stack(rows), 0


def _softmax_backward_vmap(info, in_dims, output, grad, dim, log, grad_dtype):
    y_dim, g_dim = in_dims[0], in_dims[1]
    y = _first(output, y_dim) if y_dim is not None else output.expand(info.batch_size,
                                                                      *output.shape)
    g = _first(grad, g_dim) if g_dim is not None else grad.expand(info.batch_size, *grad.shape)
    if y.dim() == 1:  # 0-d rows: the gradient is 0
        return torch.zeros(y.shape, dtype=grad_dtype, device=y.device), 0
    return _ops.softmax_backward(y.contiguous(), g, dim + 1, log, grad_dtype), 0


for _name, _fn in (("softmax", _softmax_vmap(False)), ("log_softmax", _softmax_vmap(True)),
                   ("topk", _topk_vmap), ("permute", _permute_vmap), ("isin", _isin_vmap),
                   ("softmax_backward", _softmax_backward_vmap)):
    torch.library.register_vmap(f"opselect::{_name}", _fn, lib=LIB)


# ---------------------------------------------------------------------------------------------
# Trace-time choice: the aten op or opselect's
# ---------------------------------------------------------------------------------------------
def _symbolic(*values) -> bool:
    for v in values:
        if isinstance(v, torch.Tensor):
            if any(isinstance(s, torch.SymInt) for s in v.shape):
                return True
        elif isinstance(v, torch.SymInt):
            return True
    return False


def _placed(op: Op, backend: Optional[str], shapes: Sequence[Any],
            make_call: Callable[[], Any] | None,
            inductor_keeps: bool | Callable[[Any, str], bool] = False) -> bool:
    """Whether a compiled call of `op` becomes opselect's op (True) or the aten op (False).
    make_call None: the call cannot be prepared from traced tensors (permute reads the data
    pointer's alignment), so opselect's op decides at run time. inductor_keeps (the "auto"
    rule, static shapes): True where inductor's own kernel is always as good; a function of
    (call, the dispatcher's choice) where inductor's kernel is estimated; False where inductor
    falls back to ATen (the dispatcher's choice decides alone)."""
    if backend is not None and backend != "auto":
        if make_call is not None and not _symbolic(*shapes):
            try:
                call = make_call()
            except TorchOnlyCall as why:
                if op.backend(backend).name != "torch":
                    raise BackendError(f"{op.name}: backend {backend!r} cannot take this call "
                                       f"({why}); only the torch backend can") from None
            else:
                op._force(call, backend)  # refused here, at trace time, as in eager mode
        else:
            op.backend(backend)  # an unknown name fails here, naming the valid ones
        placed = backend != "torch"
    else:
        rule = COMPILED_RULE if COMPILED_RULE in _RULES else "auto"
        auto = rule == "auto"
        if rule == "aten":
            placed = False
        elif _symbolic(*shapes):
            placed = rule == "dispatcher" or op.name in _DYNAMIC_OPSELECT
        elif auto and inductor_keeps is True:
            placed = False
        elif make_call is None:
            placed = True
        else:
            try:
                call = make_call()  # the op's argument errors are raised here, at trace time
            except TorchOnlyCall:
                call = None  # a dtype only torch's op takes
            if call is None or not call.info.runs_triton:
                placed = False
            else:
                choice = op.chosen(call)
                # tune=False: the inputs are fake while tracing; nothing can be measured.
                name = choice.backend.name if choice else op.decide(call, tune=False).choice
                placed = name != "torch"
                if placed and auto and callable(inductor_keeps):
                    placed = not inductor_keeps(call, name)
    _usage.record_trace(op.name, "opselect" if placed else "aten")
    return placed


def _isin_inductor_keeps(call, choice: str) -> bool:
    """Inductor's own isin is estimated no slower than opselect.isin running `choice`
    (isin_inductor_keeps, with the dispatcher's candidates for this call and its device's model)."""
    from .heuristics.device_model import model_for

    decision = _isin.OP.decide(call, tune=False)
    return isin_inductor_keeps(call, choice, decision.candidates, model_for(call.info))


def isin_inductor_keeps(call, choice: str, candidates, model) -> bool:
    """Whether inductor's own isin (torch._decomp's, traced) is estimated no slower than
    opselect.isin running the backend `choice`. Inductor compares every element with every test
    element (one fused reduction: our `compare` backend's work) below 10 * M**0.145 test
    elements, and above it sorts the test set (in one Triton kernel up to 512 elements, aten.sort
    beyond) and runs one fused binary search (bucketize) per element (our `search` backend's
    work); assume_unique sorts elements and test set together (about torch's own sorting path).
    So that backend's time stands in for inductor's, measured where the tune cache has both
    times, else the cost model's; opselect's op must beat it, with one more pass over the
    elements and the bool result (which inductor fuses into its neighbours and an opaque op
    cannot), by the dispatcher's TORCH_MARGIN (dispatch/op.py)."""
    m, n = call.m, call.n
    if n < 10.0 * m ** 0.145:
        stand_in = "compare"
    else:
        stand_in = "torch" if call.assume_unique else "search"
    if choice == stand_in:
        return True  # the same algorithm, unfused: inductor's is at least as fast
    found = {c.name: c for c in candidates}
    mine, theirs = found.get(choice), found.get(stand_in)
    if mine is None or theirs is None or not theirs.supported:
        return False
    measured = mine.measured_s is not None and theirs.measured_s is not None
    t_mine = mine.measured_s if measured else mine.predicted_s
    t_theirs = theirs.measured_s if measured else theirs.predicted_s
    if t_mine is None or t_theirs is None:
        return False
    unfused = model.stream(m * call.elements.dtype.itemsize + 2 * m)
    return t_mine + unfused >= _dispatch_op.TORCH_MARGIN * t_theirs


def _flat_test(test: torch.Tensor) -> torch.Tensor:
    # torch.isin fails on a non-contiguous multi-dimensional test set (torch 2.11-2.13).
    return test.reshape(-1) if test.dim() > 1 else test


def _isin_or_aten(elements, test_elements, assume_unique=False, invert=False, backend=None):
    if _placed(_isin.OP, backend, (elements, test_elements),
               lambda: _isin.prepare(elements, test_elements, assume_unique=assume_unique,
                                     invert=invert), _isin_inductor_keeps):
        return _ops.isin(elements, test_elements, assume_unique, invert, backend)
    return torch.isin(elements, _flat_test(test_elements), assume_unique=assume_unique,
                      invert=invert)


def _topk_or_aten(input, k, dim=-1, largest=True, sorted=True, backend=None):
    if _placed(_topk.OP, backend, (input, k),
               lambda: _topk.prepare(input, k, dim, largest, sorted)):
        return _ops.topk(input, k, dim, largest, sorted, backend)
    values, indices = torch.topk(input, k, dim, largest, sorted)
    return values, indices


def _permute_or_aten(input, dims, backend=None):
    if _placed(_permute.OP, backend, (input,),
               None if type(input) is not torch.Tensor else
               lambda: _permute.prepare(input, list(dims)), True):
        return _ops.permute(input, dims, backend)
    if list(dims) != list(range(input.dim())):
        input = input.permute(dims)
    return input.clone(memory_format=torch.contiguous_format)


def _softmax_or_aten(log: bool):
    op = _softmax.LOG_SOFTMAX_OP if log else _softmax.SOFTMAX_OP
    prepare = _softmax.prepare_log_softmax if log else _softmax.prepare_softmax
    kernel = _ops.log_softmax if log else _ops.softmax
    aten = torch.log_softmax if log else torch.softmax

    def or_aten(input, dim, dtype=None, backend=None):
        if _placed(op, backend, (input,), lambda: prepare(input, dim, dtype=dtype), True):
            return kernel(input, dim, dtype, backend)
        return aten(input, dim, dtype=dtype)

    return or_aten


for _name, _fn in (("isin_or_aten", _isin_or_aten), ("topk_or_aten", _topk_or_aten),
                   ("permute_or_aten", _permute_or_aten),
                   ("softmax_or_aten", _softmax_or_aten(False)),
                   ("log_softmax_or_aten", _softmax_or_aten(True))):
    LIB.impl(_name, _unrouted(_fn), "CompositeImplicitAutograd")


# ---------------------------------------------------------------------------------------------
# What ops.* call while compiling (traced by Dynamo: plain Python over the arguments)
# ---------------------------------------------------------------------------------------------
def isin(elements, test_elements, assume_unique, invert, out, backend):
    if out is None and isinstance(elements, torch.Tensor) and isinstance(test_elements,
                                                                         torch.Tensor):
        return _ops.isin_or_aten(elements, test_elements, assume_unique, invert, backend)
    # A Python number on either side, or out=: torch's own op (it takes both).
    if isinstance(test_elements, torch.Tensor):
        test_elements = _flat_test(test_elements)
    if out is not None:
        return torch.isin(elements, test_elements, assume_unique=assume_unique, invert=invert,
                          out=out)
    return torch.isin(elements, test_elements, assume_unique=assume_unique, invert=invert)


def topk(input, k, dim, largest, sorted, backend):
    values, indices = _ops.topk_or_aten(input, k, dim, largest, sorted, backend)
    return torch.return_types.topk((values, indices))


def permute(input, dims, out, backend):
    result = _ops.permute_or_aten(input, list(dims), backend)
    if out is not None:
        return out.copy_(result)
    return result


def softmax(input, dim, dtype, backend):
    return _ops.softmax_or_aten(input, dim, dtype, backend)


def log_softmax(input, dim, dtype, backend):
    return _ops.log_softmax_or_aten(input, dim, dtype, backend)
