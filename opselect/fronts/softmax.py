"""softmax's and log_softmax's front: the public functions ops.softmax and ops.log_softmax, their
torch.library ops for compiled code (with the fused backward, opselect.softmax_backward), their one
autograd.Function (for eager calls under function transforms and as the library ops' Autograd
kernel) and enable()'s handlers. The kernels and backends are in opselect/kernels/softmax/."""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
import torch.autograd.forward_ad as _fwad
import torch.nn.functional as F
from torch.compiler import is_compiling as _compiling

from .. import routing_state as _state
from .. import transforms as _transforms
from ..dispatch.tuning_mode import state as _tuning_state
from ..errors import TorchOnlyCall
from ..dispatch.device import device_info
from ..heuristics import softmax as _cost
from ..kernels import softmax as _softmax
from ..kernels.softmax.call import plain_key as _softmax_key
from ..kernels.softmax.call import prepare_keyed as _prepare_softmax
from ..kernels.softmax.cross_entropy import REDUCTIONS as _LOSS_REDUCTIONS
from ..kernels.softmax.cross_entropy import fused_cross_entropy as _fused_cross_entropy
from ..library import (LIB, _BelowAutograd, _apply, _differentiated, _ops, _placed, _run,
                       _unrouted, _wrap)
from ..transforms import _bdim_first, batched
from ..usage import _ran
from ._base import (PASS, _FLOATS, _STRIDED, _TENSOR, _UNSEEN, _VF, _any_autocast, _counted,
                    _functorch_active, _prepared, _route, _takes, _torch_answers, _tracing,
                    autocast_float32, in_regime)

_TORCH_SOFTMAX, _TORCH_LOG_SOFTMAX = _VF.softmax, _VF.log_softmax


# ---------------------------------------------------------------------------------------------
# The public function (ops.softmax)
# ---------------------------------------------------------------------------------------------
def _public(log: bool):
    """ops.softmax (log False) or ops.log_softmax: one body, the op's names bound here (a
    closure's names are read as fast as globals)."""
    name = "log_softmax" if log else "softmax"
    op = _softmax.LOG_SOFTMAX_OP if log else _softmax.SOFTMAX_OP
    torch_op = torch.log_softmax if log else torch.softmax
    compiled = _compiled_log_softmax if log else _compiled_softmax

    def public(input: torch.Tensor, dim: int = -1, *, dtype: Optional[torch.dtype] = None,
               backend: Optional[str] = None) -> torch.Tensor:
        if _compiling():
            return compiled(input, dim, dtype, backend)
        if (_functorch_active() or _fwad._current_level >= 0) and _transforms.watched(input):
            return _transformed(input, dim, log, dtype, backend)
        key = _softmax_key(log, input, dim, dtype)
        if backend is None or backend == "auto":
            route = op.routes.get(key)  # (op.routes, not a local: tuning swaps the table)
            if route is not None and (route[1] or not _tuning_state.active):
                prepared = route[0] if route[3] is None else in_regime(route)
                if prepared is None:
                    return torch_op(input, dim, dtype)  # (positional: quicker to parse)
                return prepared(input)
        elif key is not None:
            prepared = op.forced_routes.get((backend, key), _UNSEEN)
            if prepared is not _UNSEEN:
                return torch_op(input, dim, dtype) if prepared is None else prepared(input)
        try:
            call = _prepare_softmax(name, log, key, input, dim, dtype)
        except TorchOnlyCall as why:
            return _torch_answers(op, backend, why, lambda: torch_op(input, dim, dtype=dtype))
        return op.run(call, backend, key)

    public.__name__ = public.__qualname__ = name
    return public


# ---------------------------------------------------------------------------------------------
# Autograd, forward-mode AD and vmap: one autograd.Function for softmax and log_softmax, which
# is both the library ops' Autograd kernel (compiled graphs, torch.ops.opselect.softmax) and
# what an eager call that a transform watches goes through (forward-mode AD, torch.func)
# ---------------------------------------------------------------------------------------------
def softmax_tangent(y: torch.Tensor, t: torch.Tensor, dim: int, log: bool) -> torch.Tensor:
    """d softmax(x)[t] (log=False) or d log_softmax(x)[t] from the output y, along dim (0-d:
    the only element is its own row, whose softmax is constant)."""
    if y.dim() == 0:
        return torch.zeros_like(y)
    if log:
        return t - (torch.exp(y) * t).sum(dim, keepdim=True)
    return y * (t - (y * t).sum(dim, keepdim=True))


def softmax_vjp(y: torch.Tensor, g: torch.Tensor, dim: int, log: bool) -> torch.Tensor:
    """The gradient of the input from the output y and its gradient g (the transposed tangent;
    softmax's Jacobian is symmetric, log_softmax's is not)."""
    if y.dim() == 0:
        return torch.zeros_like(g)
    if log:
        return g - torch.exp(y) * g.sum(dim, keepdim=True)
    return y * (g - (g * y).sum(dim, keepdim=True))


class _Softmax(torch.autograd.Function):
    """softmax's (log False) and log_softmax's rules for every path; `library` picks what
    forward runs (library._apply)."""

    op_name = "softmax"  # (library._apply's error names the eager op)

    @staticmethod
    def forward(x, dim: int, log: bool, dtype, backend, library: bool):
        if library:
            with _BelowAutograd():
                return (_ops.log_softmax if log else _ops.softmax)(x, dim, dtype, backend)
        op = _softmax.LOG_SOFTMAX_OP if log else _softmax.SOFTMAX_OP
        prepare = _softmax.prepare_log_softmax if log else _softmax.prepare_softmax
        return op.run(prepare(x, dim, dtype=dtype), backend)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, dim, log, dtype = inputs[:4]
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
    def jvp(ctx, t, *_):
        (y,) = ctx.saved_tensors
        return softmax_tangent(y, t.to(y.dtype), ctx.dim, ctx.log)

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        if torch.is_grad_enabled() or _softmax.kernels_cannot_read(g):
            # A graph of the backward is wanted (double backward, torch.func.grad), or g is
            # batched or wrapped by a transform (vmap over the backward): differentiable torch
            # ops.
            dx = softmax_vjp(y, g.to(y.dtype), ctx.dim, ctx.log).to(ctx.grad_dtype)
        else:
            dx = _ops.softmax_backward(y, g, ctx.dim, ctx.log, ctx.grad_dtype)
        if dx.dtype != ctx.in_dtype:
            dx = dx.to(ctx.in_dtype)
        return dx, None, None, None, None, None

    @staticmethod
    def vmap(info, in_dims, x, dim, log, dtype, backend, library):
        if in_dims[0] is not None and x.dim() > 1:
            _softmax_dim_check(dim, x.dim() - 1, log)
        return _softmax_batched(lambda v, d: _Softmax.apply(v, d, log, dtype, backend, library),
                                in_dims[0], x, dim, log)


def _softmax_batched(run, bdim: Optional[int], x, dim: int, log: bool):
    """softmax's vmap rule, the Function's and the library ops': the batch dim becomes one more
    leading dim of the call (the softmax dim shifts by one); run(x, dim) is _Softmax.apply (the
    Function's rule: a transform below this one still sees the Function) or the library op."""
    if bdim is None:
        return run(x, dim), None
    x = _bdim_first(x, bdim)
    rank = x.dim() - 1
    if rank == 0:  # each element its own row
        return run(x.unsqueeze(1), 1).squeeze(1), 0
    d = _wrap(dim, rank, "log_softmax" if log else "softmax")
    return batched(lambda: run(x, d + 1), lambda b: run(x[b].contiguous(), d), x.shape[0]), 0


def _softmax_dim_check(dim: int, rank: int, log: bool) -> None:
    # The logical call's dim rule, as the plain path gives its error (the batch's call would
    # name its shifted dim).
    prepare = _softmax.prepare_log_softmax if log else _softmax.prepare_softmax
    prepare(torch.empty((1,) * rank, device="meta"), dim)


def _transformed(x, dim, log: bool, dtype, backend):
    if not isinstance(x, torch.Tensor):
        # The argument errors as the plain path gives them.
        prepare = _softmax.prepare_log_softmax if log else _softmax.prepare_softmax
        prepare(x, dim, dtype=dtype)
    return _Softmax.apply(x, dim, log, dtype, backend, False)


# ---------------------------------------------------------------------------------------------
# Compiled calls: the torch.library ops, their fake, autograd and vmap rules, and the
# trace-time choice between opselect's op and the aten op (opselect/library.py has the rule)
# ---------------------------------------------------------------------------------------------
LIB.define("softmax(Tensor input, int dim, ScalarType? dtype=None, str? backend=None) -> Tensor")
LIB.define("log_softmax(Tensor input, int dim, ScalarType? dtype=None, str? backend=None) "
           "-> Tensor")
LIB.define("softmax_backward(Tensor output, Tensor grad, int dim, bool log, "
           "ScalarType grad_dtype) -> Tensor")
LIB.define("softmax_or_aten(Tensor input, int dim, ScalarType? dtype=None, str? backend=None) "
           "-> Tensor")
LIB.define("log_softmax_or_aten(Tensor input, int dim, ScalarType? dtype=None, "
           "str? backend=None) -> Tensor")


def _softmax_kernel(input, dim, dtype=None, backend=None):
    return _run(_softmax.SOFTMAX_OP, _softmax.prepare_softmax(input, dim, dtype=dtype), backend)


def _log_softmax_kernel(input, dim, dtype=None, backend=None):
    return _run(_softmax.LOG_SOFTMAX_OP, _softmax.prepare_log_softmax(input, dim, dtype=dtype),
                backend)


def _softmax_backward_kernel(output, grad, dim, log, grad_dtype):
    from ..dispatch.device import device_info

    if not device_info(output.device).runs_triton:
        # In the output's dtype, then cast: torch's CPU kernels take no mixed dtypes.
        fn = torch._log_softmax_backward_data if log else torch._softmax_backward_data
        return fn(grad, output, dim, output.dtype).to(grad_dtype)
    if output.is_cuda and output.device.index != torch.cuda.current_device():
        with torch.cuda.device(output.device):
            return _softmax.backward(output.contiguous(), grad, dim, log, grad_dtype)
    return _softmax.backward(output.contiguous(), grad, dim, log, grad_dtype)


def _softmax_fake(input, dim, dtype=None, backend=None):
    _wrap(dim, input.dim(), "softmax")
    return input.new_empty(input.shape, dtype=dtype if dtype is not None else input.dtype)


@torch.library.register_fake("opselect::softmax_backward", lib=LIB)
def _softmax_backward_fake(output, grad, dim, log, grad_dtype):
    return output.new_empty(output.shape, dtype=grad_dtype)


def _softmax_autograd(log: bool):
    kernel = _ops.log_softmax if log else _ops.softmax

    def autograd(input, dim, dtype=None, backend=None):
        if _differentiated(input):
            return _apply(_Softmax, input, dim, log, dtype, backend, True)
        with _BelowAutograd():
            return kernel(input, dim, dtype, backend)

    return autograd


def _softmax_vmap(log: bool):
    kernel = _ops.log_softmax if log else _ops.softmax

    def vmap(info, in_dims, input, dim, dtype=None, backend=None):
        return _softmax_batched(lambda v, d: kernel(v, d, dtype, backend), in_dims[0], input,
                                dim, log)

    return vmap


def _softmax_backward_vmap(info, in_dims, output, grad, dim, log, grad_dtype):
    y_dim, g_dim = in_dims[0], in_dims[1]
    y = _bdim_first(output, y_dim) if y_dim is not None else output.expand(info.batch_size,
                                                                           *output.shape)
    g = _bdim_first(grad, g_dim) if g_dim is not None else grad.expand(info.batch_size,
                                                                       *grad.shape)
    if y.dim() == 1:  # 0-d rows: the gradient is 0
        return torch.zeros(y.shape, dtype=grad_dtype, device=y.device), 0
    return _ops.softmax_backward(y.contiguous(), g, dim + 1, log, grad_dtype), 0


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


def _compiled_softmax(input, dim, dtype, backend):
    """What softmax() calls while torch.compile traces (Dynamo traces this Python)."""
    return _ops.softmax_or_aten(input, dim, dtype, backend)


def _compiled_log_softmax(input, dim, dtype, backend):
    return _ops.log_softmax_or_aten(input, dim, dtype, backend)


for _name, _fn in (("softmax", _softmax_kernel), ("log_softmax", _log_softmax_kernel),
                   ("softmax_backward", _softmax_backward_kernel)):
    LIB.impl(_name, _unrouted(_fn), "CompositeExplicitAutograd")
torch.library.register_fake("opselect::softmax", _softmax_fake, lib=LIB)
torch.library.register_fake("opselect::log_softmax", _softmax_fake, lib=LIB)
LIB.impl("softmax", _softmax_autograd(False), "Autograd")
LIB.impl("log_softmax", _softmax_autograd(True), "Autograd")
for _name, _fn in (("softmax", _softmax_vmap(False)), ("log_softmax", _softmax_vmap(True)),
                   ("softmax_backward", _softmax_backward_vmap)):
    torch.library.register_vmap(f"opselect::{_name}", _fn, lib=LIB)
LIB.impl("softmax_or_aten", _unrouted(_softmax_or_aten(False)), "CompositeImplicitAutograd")
LIB.impl("log_softmax_or_aten", _unrouted(_softmax_or_aten(True)), "CompositeImplicitAutograd")


# The public functions, made once the compiled path they name is defined.
softmax = _public(False)
softmax.__doc__ = """torch.softmax along `dim` (accumulating in float32, float64 stays float64); works
    under autograd. Backends: torch, fused, online, multirow, strided (see
    opselect.kernels.softmax)."""
log_softmax = _public(True)
log_softmax.__doc__ = "torch.log_softmax, with the same backends and rules as softmax()."
# what tuning's stage 2 times (Op._pinned_public)
_softmax.SOFTMAX_OP.public, _softmax.LOG_SOFTMAX_OP.public = softmax, log_softmax


# ---------------------------------------------------------------------------------------------
# opselect.enable(): the handler of the torch entry points this op takes over
# ---------------------------------------------------------------------------------------------
_SOFTMAX_KW = frozenset(("input", "dim", "dtype", "_stacklevel"))
_ROWS_NUMEL, _ROWS_LENGTH = _cost.TORCH_ROWS_NUMEL, _cost.TORCH_ROWS_LENGTH


def _softmax_handler(log: bool, functional: bool) -> Callable[[_state.Router, tuple, dict], Any]:
    """torch.softmax(input, dim, dtype=None), Tensor.softmax(dim, dtype=None) and
    F.softmax(input, dim=None, _stacklevel=3, dtype=None) (functional: dtype is 4th)."""
    name = "log_softmax" if log else "softmax"
    op = _softmax.LOG_SOFTMAX_OP if log else _softmax.SOFTMAX_OP
    compiled = _compiled_log_softmax if log else _compiled_softmax
    torch_op = _TORCH_LOG_SOFTMAX if log else _TORCH_SOFTMAX

    dtype_at, most = (3, 4) if functional else (2, 3)

    def handler(router: _state.Router, args: tuple, kwargs: dict) -> Any:
        n = len(args)
        if n > most or not kwargs.keys() <= _SOFTMAX_KW:
            return PASS
        if kwargs:
            x = args[0] if n else kwargs.get("input")
            dim = args[1] if n > 1 else kwargs.get("dim")
            dtype = args[dtype_at] if n > dtype_at else kwargs.get("dtype")
        else:
            x = args[0] if n else None
            dim = args[1] if n > 1 else None
            dtype = args[dtype_at] if n > dtype_at else None
        if _any_autocast() and type(x) is _TENSOR:
            # (autocast's dtype for softmax, as torch's op would take the call)
            dtype = autocast_float32(x, dtype)
            if dtype is PASS:
                return PASS
        if type(x) is _TENSOR and type(dim) is int and x.layout is _STRIDED and \
                not _compiling():
            forced = router.backends.get(name)
            if (dtype is None and forced is None and x.is_cuda and x.numel() <= _ROWS_NUMEL
                    and (dim == -1 or dim == x.dim() - 1) and x.dim() > 0
                    and x.shape[-1] <= _ROWS_LENGTH and x.is_contiguous()
                    and not _tuning_state.active):
                # Rows the cost model leaves to torch on every GPU it knows (see
                # heuristics.softmax.TORCH_ROWS_NUMEL): torch's op at once, with no key (in a
                # model's layer the key and the lookup were most of a routed call's cost).
                _ran[name]["torch"] += 1
                return torch_op(x, dim, None)
            # An eager plain call decided before: its route, before the checks below (the
            # route's key holds what they read, and a route is made only past them).
            route = _route(op, _softmax_key(log, x, dim, dtype), forced)
            if route is not None:
                return torch_op(x, dim, dtype) if route is PASS else _prepared(route, x)
        if (not _takes(x) or type(dim) is not int or x.layout != torch.strided
                or (dtype if dtype is not None else x.dtype) not in _FLOATS):
            return PASS  # an implicit or named dim, an integer input, a subclass: torch's
        backend = router.backends.get(name)
        if _tracing(x):
            return compiled(x, dim, dtype, backend)
        key = _softmax_key(log, x, dim, dtype)
        route = _route(op, key, backend)
        if route is not None:
            return torch_op(x, dim, dtype) if route is PASS else _prepared(route, x)
        return _counted(op, _prepare_softmax, backend, key, name, log, key, x, dim, dtype)

    return handler


_CROSS_ENTROPY_KW = frozenset(("input", "target", "weight", "size_average", "ignore_index",
                               "reduce", "reduction", "label_smoothing"))
_LOG_SOFTMAX_ROWS = _softmax_handler(True, False)  # torch.log_softmax(input, dim)'s


def _cross_entropy(router: _state.Router, args: tuple, kwargs: dict) -> Any:
    """F.cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100,
    reduce=None, reduction="mean", label_smoothing=0.0) (nn.CrossEntropyLoss; a language model's
    loss over its vocabulary) with class indices. Rows of logits the fused loss takes
    (_fused_loss_takes; class weights or label smoothing too) go to it: three passes over the
    matrix, not six. Otherwise, without label smoothing: log_softmax over the class dim through
    opselect (its forward and, under autograd, its backward), then torch's nll_loss, which is
    what torch's own cross_entropy composes for such a call. Anything else (probabilities as the
    target, the legacy size_average / reduce) is torch's, and so is a call whose log_softmax is
    (by its size: the log_softmax handler's shortcut, checked first here; or by its route)."""
    n = len(args)
    x = args[0] if n else kwargs.get("input")
    target = args[1] if n > 1 else kwargs.get("target")
    if type(x) is not _TENSOR or type(target) is not _TENSOR or x.dim() == 0:
        return PASS
    classes = x.shape[1 if x.dim() > 1 else 0]
    if x.is_cuda and x.numel() <= _ROWS_NUMEL and classes <= _ROWS_LENGTH and \
            not _tuning_state.active:
        return PASS  # (and torch's single call costs less host time than two)
    if n > 8 or not kwargs.keys() <= _CROSS_ENTROPY_KW or target.dtype != torch.int64:
        return PASS
    # Under CUDA autocast torch's cross_entropy casts the logits to float32 (its 'fp32' list):
    # the fused loss reads them as they are and gives the float32 loss (and the gradient in
    # their dtype, as the cast's backward would); the composed route, and autocast on another
    # device type, leave the call to torch.
    autocast = _any_autocast() and autocast_float32(x, None) is not None
    weight = args[2] if n > 2 else kwargs.get("weight")
    legacy = (args[3] if n > 3 else kwargs.get("size_average"),
              args[5] if n > 5 else kwargs.get("reduce"))
    ignore_index = args[4] if n > 4 else kwargs.get("ignore_index", -100)
    reduction = args[6] if n > 6 else kwargs.get("reduction", "mean")
    smoothing = args[7] if n > 7 else kwargs.get("label_smoothing", 0.0)
    if (legacy != (None, None) or type(smoothing) not in (float, int)
            or not 0.0 <= smoothing <= 1.0 or type(ignore_index) is not int
            or type(reduction) is not str or _tracing(x)):
        return PASS  # (torch's own errors; traced: inductor fuses its own)
    # Class weights of the logits' dtype and device, not learned, or label smoothing (not both:
    # torch then weights the smoothing term by class too).
    plain_weight = weight is None or (
        type(weight) is _TENSOR and weight.dim() == 1 and weight.shape[0] == classes
        and weight.dtype == x.dtype and weight.device == x.device
        and not weight.requires_grad and smoothing == 0)
    if plain_weight and (x.is_cuda or not autocast) and \
            _fused_loss_takes(router, x, target, reduction):
        _ran["log_softmax"]["fused_loss"] += 1
        return _fused_cross_entropy(x, target, ignore_index, reduction,
                                    torch.float32 if autocast else None, weight=weight,
                                    smoothing=smoothing)
    if autocast or smoothing != 0:
        return PASS  # (the composed route has neither autocast's casts nor label smoothing)
    logp = _LOG_SOFTMAX_ROWS(router, (x, 1 if x.dim() > 1 else 0), {})
    if logp is PASS:
        return PASS
    return F.nll_loss(logp, target, weight, None, ignore_index, None, reduction)


def _fused_loss_takes(router: _state.Router, x: torch.Tensor, target: torch.Tensor,
                      reduction: str) -> bool:
    """The fused loss (kernels/softmax/cross_entropy.py) takes rows of logits with unit column
    stride and one int64 class index per row, where its one-program-a-row forward fills the GPU
    (a row per SM at least; fewer, longer rows keep the split log_softmax kernels) and the
    logits are large enough to repay its host time (FUSED_LOSS_MIN_BYTES), unless a
    log_softmax backend is forced. It moves the N x C matrix three times where log_softmax +
    nll_loss move it six: the lower cost on every call it takes."""
    if (x.dim() != 2 or target.dim() != 1 or target.shape[0] != x.shape[0]
            or x.dtype not in _FUSED_LOSS_DTYPES or (x.stride(1) != 1 and x.shape[1] > 1)
            or reduction not in _LOSS_REDUCTIONS or router.backends.get("log_softmax") is not None):
        return False
    info = device_info(x.device)
    return info.interpreted or (x.is_cuda and x.shape[0] >= info.sm_count
                                and x.numel() * x.element_size() >= FUSED_LOSS_MIN_BYTES)


_FUSED_LOSS_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: Logits smaller than this keep the composed route. The fused loss's call costs about 0.4 ms of
#: host time on the H200's host (its target check's seven small ops, 73 us; the autograd
#: Function), which loss + gradient of fewer bytes do not repay: 1024 x 50257 fp32 (196 MB)
#: took 551 us fused against 369 composed, 2048 x 32000 fp32 (250 MB) 596 against 419; from
#: 393 MB on it won (2048 x 50257 fp32 434 against 693; 4096 x 50257 bf16 721 against 781).
#: benchmarks/results/h200/fits/softmax.md, "The fused loss".
FUSED_LOSS_MIN_BYTES = 384 << 20


ENTRY_POINTS = [
    # (op, owner, attribute, handler, whether the original is Python that calls another entry
    # point, whether it copies a view (the layout entries: contiguous, reshape))
    ("softmax", torch, "softmax", _softmax_handler(False, False), False, False),
    ("softmax", torch.special, "softmax", _softmax_handler(False, False), False, False),
    ("softmax", torch.Tensor, "softmax", _softmax_handler(False, False), False, False),
    ("softmax", F, "softmax", _softmax_handler(False, True), True, False),
    ("log_softmax", torch, "log_softmax", _softmax_handler(True, False), False, False),
    ("log_softmax", torch.special, "log_softmax", _softmax_handler(True, False), False, False),
    ("log_softmax", torch.Tensor, "log_softmax", _softmax_handler(True, False), False, False),
    ("log_softmax", F, "log_softmax", _softmax_handler(True, True), True, False),
    ("log_softmax", F, "cross_entropy", _cross_entropy, False, False),
]
