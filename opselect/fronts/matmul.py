"""matmul's and linear's front: the public functions ops.matmul and ops.linear, their
torch.library ops for compiled code, their one autograd.Function (for eager calls under autograd
or function transforms and as the library ops' Autograd kernel; its rules are in
_matmul_rules.py) and enable()'s handlers of torch.matmul, Tensor.matmul, Tensor.__matmul__,
F.linear (nn.Linear) and torch.addmm (Hugging Face's Conv1D, GPT-2's projections). The kernels
and backends are in opselect/kernels/matmul/; an addmm call runs on linear's op."""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.autograd.forward_ad as _fwad
import torch.nn.functional as F
from torch.compiler import is_compiling as _compiling

from .. import routing_state as _state
from .. import transforms as _transforms
from .. import usage as _usage
from ..dispatch.tuning_mode import state as _tuning_state
from ..errors import InvalidArgument, TorchOnlyCall
from ..kernels.matmul import LINEAR_OP, MATMUL_OP, prepare_addmm, prepare_linear, prepare_matmul
from ..library import (LIB, _BelowAutograd, _apply, _differentiated, _ops, _placed, _run,
                       _unrouted)
from ._base import (PASS, _TENSOR, _UNSEEN, _VF, _any_autocast, _counted, _functorch_active,
                    _prepared, _route, _torch_answers, _tracing, in_regime)
from ._matmul_rules import (arguments, bias_row, inductor_gemm, linear_batched, linear_vjp, logical,
                            matmul_batched, matmul_vjp, plain_eager, product_tangent, route_key,
                            taken, torch_route, traced, write_out)

#: torch's own ops (never the wrappers enable() installs over them)
_TORCH_MATMUL, _TORCH_LINEAR = _VF.matmul, torch._C._nn.linear
_grad_enabled = torch.is_grad_enabled
_any_requires_grad = torch._C._any_requires_grad


# ---------------------------------------------------------------------------------------------
# The public functions (ops.matmul, ops.linear)
# ---------------------------------------------------------------------------------------------
def matmul(input: torch.Tensor, other: torch.Tensor, *, out: Optional[torch.Tensor] = None,
           backend: Optional[str] = None) -> torch.Tensor:
    """torch.matmul: 1-d to n-d operands, batch dims broadcast; out= written into (resized as
    torch resizes it). float16, bfloat16 and float32 run on opselect's backends, any other call
    on torch's op; works under autograd, forward-mode AD, torch.func and torch.compile.

    Backends: torch, tiled, splitk, persistent (see opselect.kernels.matmul)."""
    if _compiling():
        return _compiled_matmul(input, other, out, backend)
    if (_functorch_active() or _fwad._current_level >= 0) and _transforms.watched(input, other):
        return _transformed(False, backend, input, other, None, out)
    if out is not None:
        return write_out(out, input, lambda: matmul(input, other, backend=backend),
                         lambda: _TORCH_MATMUL(input, other, out=out), input, other)
    if _grad_enabled() and _any_requires_grad(input, other):
        return _recorded(False, backend, input, other, None)
    key = route_key("matmul", input, other)
    if backend is None or backend == "auto":
        route = MATMUL_OP.routes.get(key)  # (op.routes, not a local: tuning swaps the table)
        if route is not None and (route[1] or not _tuning_state.active):
            prepared = route[0] if route[3] is None else in_regime(route)
            return _TORCH_MATMUL(input, other) if prepared is None else prepared(input, other)
    elif key is not None:
        prepared = MATMUL_OP.forced_routes.get((backend, key), _UNSEEN)
        if prepared is not _UNSEEN:
            return _TORCH_MATMUL(input, other) if prepared is None else prepared(input, other)
    return _first(MATMUL_OP, backend, key, input, other)


def linear(input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, *,
           backend: Optional[str] = None) -> torch.Tensor:
    """F.linear: input @ weight^T + bias, over input's leading dims; the bias added before the
    one rounding to the output dtype. Dtypes and paths as matmul()."""
    if _compiling():
        return _ops.linear_or_aten(input, weight, bias, backend)
    if (_functorch_active() or _fwad._current_level >= 0) and \
            _transforms.watched(input, weight, bias):
        return _transformed(True, backend, input, weight, bias)
    if _grad_enabled() and _any_requires_grad(input, weight, bias):
        return _recorded(True, backend, input, weight, bias)
    key = route_key("linear", input, weight, bias)
    if backend is None or backend == "auto":
        route = LINEAR_OP.routes.get(key)
        if route is not None and (route[1] or not _tuning_state.active):
            prepared = route[0] if route[3] is None else in_regime(route)
            if prepared is None:
                return _TORCH_LINEAR(input, weight, bias)
            return prepared(input, weight, bias)
    elif key is not None:
        prepared = LINEAR_OP.forced_routes.get((backend, key), _UNSEEN)
        if prepared is not _UNSEEN:
            if prepared is None:
                return _TORCH_LINEAR(input, weight, bias)
            return prepared(input, weight, bias)
    return _first(LINEAR_OP, backend, key, input, weight, bias)


# what tuning's stage 2 times (Op._pinned_public)
MATMUL_OP.public, LINEAR_OP.public = matmul, linear

#: per op: (its form's name, prepare, torch's op), all taking the public function's tensors
_FORMS = {MATMUL_OP: ("matmul", prepare_matmul, _TORCH_MATMUL),
          LINEAR_OP: ("linear", prepare_linear, _TORCH_LINEAR)}


def _first(op, backend, key, *tensors):
    """A call with no route yet: prepared and run, which installs its route under `key`, with
    routing off meanwhile (the torch backend's torch.matmul must reach torch's own). A call
    only torch's op takes is torch's (a forced Triton backend is refused)."""
    if key is None and traced(*tensors):
        # Fake or functional tensors of a graph being traced (AOTAutograd tracing the
        # Function's backward): the compiled call, decided at trace time.
        if op is LINEAR_OP:
            return _ops.linear_or_aten(*tensors, None)
        return _ops.matmul_or_aten(*tensors, None)
    _, prepare, torch_op = _FORMS[op]
    token = _state.suspend()
    try:
        try:
            call = prepare(*tensors)
        except TorchOnlyCall as why:
            return _torch_answers(op, backend, why, lambda: torch_op(*tensors))
        return op.run(call, backend, key)
    finally:
        _state.resume(token)


def _plain(linear: bool, backend, *tensors):
    """The product of plain tensors autograd does not record (what the Function's forward
    runs): by the key's route, else prepared and run. The public functions inline it."""
    op = LINEAR_OP if linear else MATMUL_OP
    form, _, torch_op = _FORMS[op]
    key = route_key(form, *tensors)
    if backend is None or backend == "auto":
        route = op.routes.get(key)
        if route is not None and (route[1] or not _tuning_state.active):
            prepared = route[0] if route[3] is None else in_regime(route)
            return torch_op(*tensors) if prepared is None else prepared(*tensors)
    elif key is not None:
        prepared = op.forced_routes.get((backend, key), _UNSEEN)
        if prepared is not _UNSEEN:
            return torch_op(*tensors) if prepared is None else prepared(*tensors)
    return _first(op, backend, key, *tensors)


def _recorded(linear: bool, backend, a, b, bias):
    """A call autograd records: torch's op where the route names it, else the Function (the
    kernels record nothing). A call only torch's op takes is torch's."""
    op = LINEAR_OP if linear else MATMUL_OP
    form, prepare, torch_op = _FORMS[op]
    tensors = (a, b, bias) if linear else (a, b)
    if torch_route(op, route_key(form, *tensors), backend):
        return torch_op(*tensors)
    try:
        prepare(*tensors)  # (the argument errors, as the plain path gives them)
    except TorchOnlyCall as why:
        return _torch_answers(op, backend, why, lambda: torch_op(*tensors))
    return _Product.apply(a, b, bias, linear, backend, False)


# ---------------------------------------------------------------------------------------------
# Autograd, forward-mode AD and vmap: one autograd.Function for matmul and linear, which is both
# the library ops' Autograd kernel (compiled graphs, torch.ops.opselect.matmul / linear) and what
# an eager call that records autograd or that a transform watches goes through
# ---------------------------------------------------------------------------------------------
class _Product(torch.autograd.Function):
    """matmul's (linear False, bias None) and linear's rules for every path; `library` picks
    what forward runs (library._apply). The gradients and tangents are products again, through
    ops.matmul / ops.linear: dispatched, and differentiable where a graph of the backward is
    wanted (double backward, torch.func.grad of grad)."""

    op_name = "matmul"  # (library._apply's error names the eager op; ops.linear's path alike)

    @staticmethod
    def forward(a, b, bias, linear: bool, backend, library: bool):
        if library:
            with _BelowAutograd():
                if linear:
                    return _ops.linear(a, b, bias, backend)
                return _ops.matmul(a, b, backend)
        return _plain(linear, backend, *((a, b, bias) if linear else (a, b)))

    @staticmethod
    def setup_context(ctx, inputs, output):
        a, b, bias, linear = inputs[:4]
        ctx.linear = linear
        ctx.bias_shape = None if bias is None else bias.shape
        ctx.save_for_backward(a, b)
        ctx.save_for_forward(a, b)

    @staticmethod
    def jvp(ctx, ta, tb, tbias, *_):
        a, b = ctx.saved_tensors
        if ctx.linear:
            return product_tangent(lambda x, w: linear(x, w), a, b, ta, tb, tbias)
        return product_tangent(matmul, a, b, ta, tb)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        # (auto: a forced forward backend may not take the backward's products)
        if ctx.linear:
            ga, gb, gbias = linear_vjp(a, b, ctx.bias_shape, g, ctx.needs_input_grad, matmul)
        else:
            (ga, gb), gbias = matmul_vjp(a, b, g, *ctx.needs_input_grad[:2], matmul), None
        return ga, gb, gbias, None, None, None

    @staticmethod
    def vmap(info, in_dims, a, b, bias, linear, backend, library):
        def run_matmul(x, y):
            return _Product.apply(x, y, None, False, backend, library)

        if linear:
            return linear_batched(lambda x, w, c: _Product.apply(x, w, c, True, backend, library),
                                  run_matmul, in_dims[:3], a, b, bias, info.batch_size)
        return matmul_batched(run_matmul, in_dims[:2], a, b, info.batch_size)


def _transformed(linear: bool, backend, a, b, bias=None, out=None):
    """A call a transform watches: the Function (it runs the kernels on plain tensors only),
    or torch's op for a call only it takes (out= included: torch's rules for it)."""
    op = LINEAR_OP if linear else MATMUL_OP
    _, prepare, torch_op = _FORMS[op]
    tensors = (a, b, bias) if linear else (a, b)
    if not all(isinstance(t, torch.Tensor) for t in tensors if t is not None):
        prepare(*tensors)  # the argument error
    if out is not None:
        return _TORCH_MATMUL(a, b, out=out)
    try:
        # The logical call's rules, on its shapes and dtypes (a transform's wrapper has no
        # strides to read); operands on two devices are torch's to refuse.
        if len({t.device for t in tensors if t is not None}) > 1:
            raise TorchOnlyCall(f"{op.name}: operands on more than one device")
        prepare(*(logical(t, None) for t in tensors))
    except TorchOnlyCall as why:
        return _torch_answers(op, backend, why, lambda: torch_op(*tensors))
    return _Product.apply(a, b, bias, linear, backend, False)


# ---------------------------------------------------------------------------------------------
# Compiled calls: the torch.library ops, their fake, autograd and vmap rules, and the
# trace-time choice between opselect's op and the aten op (opselect/library.py has the rule)
# ---------------------------------------------------------------------------------------------
LIB.define("matmul(Tensor input, Tensor other, str? backend=None) -> Tensor")
LIB.define("linear(Tensor input, Tensor weight, Tensor? bias=None, str? backend=None) -> Tensor")
LIB.define("matmul_or_aten(Tensor input, Tensor other, str? backend=None) -> Tensor")
LIB.define("linear_or_aten(Tensor input, Tensor weight, Tensor? bias=None, str? backend=None) "
           "-> Tensor")


def _kernel(op, backend, *tensors):
    _, prepare, torch_op = _FORMS[op]
    try:
        call = prepare(*tensors)
    except TorchOnlyCall as why:
        return _torch_answers(op, backend, why, lambda: torch_op(*tensors))
    return _run(op, call, backend)


def _matmul_kernel(input, other, backend=None):
    return _kernel(MATMUL_OP, backend, input, other)


def _linear_kernel(input, weight, bias=None, backend=None):
    return _kernel(LINEAR_OP, backend, input, weight, bias)


def _matmul_fake(input, other, backend=None):
    # torch's own shape rules (and errors); every backend's output is a new contiguous tensor,
    # as torch's is.
    return input.new_empty(_TORCH_MATMUL(input, other).shape)


def _linear_fake(input, weight, bias=None, backend=None):
    return input.new_empty(_TORCH_LINEAR(input, weight, bias).shape)


def _matmul_autograd(input, other, backend=None):
    if _differentiated(input, other):
        return _apply(_Product, input, other, None, False, backend, True)
    with _BelowAutograd():
        return _ops.matmul(input, other, backend)


def _linear_autograd(input, weight, bias=None, backend=None):
    if _differentiated(*((input, weight) if bias is None else (input, weight, bias))):
        return _apply(_Product, input, weight, bias, True, backend, True)
    with _BelowAutograd():
        return _ops.linear(input, weight, bias, backend)


def _matmul_vmap(info, in_dims, input, other, backend=None):
    return matmul_batched(lambda a, b: _ops.matmul(a, b, backend), in_dims[:2], input, other,
                          info.batch_size)


def _linear_vmap(info, in_dims, input, weight, bias=None, backend=None):
    return linear_batched(lambda x, w, c: _ops.linear(x, w, c, backend),
                          lambda a, b: _ops.matmul(a, b, backend), in_dims[:3], input, weight,
                          bias, info.batch_size)


def _matmul_or_aten(input, other, backend=None):
    if _placed(MATMUL_OP, backend, (input, other), lambda: prepare_matmul(input, other),
               inductor_gemm):
        return _ops.matmul(input, other, backend)
    return _TORCH_MATMUL(input, other)


def _linear_or_aten(input, weight, bias=None, backend=None):
    if _placed(LINEAR_OP, backend, (input, weight, bias),
               lambda: prepare_linear(input, weight, bias), inductor_gemm):
        return _ops.linear(input, weight, bias, backend)
    return _TORCH_LINEAR(input, weight, bias)


def _compiled_matmul(input, other, out, backend):
    """What matmul() calls while torch.compile traces (Dynamo traces this Python)."""
    result = _ops.matmul_or_aten(input, other, backend)
    if out is None:
        return result
    if out.shape != result.shape:
        out.resize_(result.shape)
    return out.copy_(result)


LIB.impl("matmul", _unrouted(_matmul_kernel), "CompositeExplicitAutograd")
LIB.impl("linear", _unrouted(_linear_kernel), "CompositeExplicitAutograd")
torch.library.register_fake("opselect::matmul", _matmul_fake, lib=LIB)
torch.library.register_fake("opselect::linear", _linear_fake, lib=LIB)
LIB.impl("matmul", _matmul_autograd, "Autograd")
LIB.impl("linear", _linear_autograd, "Autograd")
torch.library.register_vmap("opselect::matmul", _matmul_vmap, lib=LIB)
torch.library.register_vmap("opselect::linear", _linear_vmap, lib=LIB)
LIB.impl("matmul_or_aten", _unrouted(_matmul_or_aten), "CompositeImplicitAutograd")
LIB.impl("linear_or_aten", _unrouted(_linear_or_aten), "CompositeImplicitAutograd")


# ---------------------------------------------------------------------------------------------
# opselect.enable(): the handlers of the torch entry points this op takes over
# ---------------------------------------------------------------------------------------------
_MATMUL_ARGS, _LINEAR_ARGS, _ADDMM_ARGS = ("input", "other"), ("input", "weight", "bias"), \
    ("input", "mat1", "mat2")
_MATMUL_KW, _LINEAR_KW = frozenset(_MATMUL_ARGS), frozenset(_LINEAR_ARGS)
_ADDMM_KW = frozenset((*_ADDMM_ARGS, "beta", "alpha"))


def _answered(op, backend, key, *tensors) -> Any:
    """A routed call decided before: PASS where its route is torch's op, else the route's
    prepared call (routing off meanwhile); None for a call with no route (counted: stats())."""
    route = _route(op, key, backend)
    if route is None:
        return None
    return PASS if route is PASS else _prepared(route, *tensors)


def _routed(op, backend, key, prepare, route_args: tuple, prepare_args: tuple) -> Any:
    """An eager routed call: by its route, else prepared and run (counted); PASS for a call
    only torch's op takes, or one torch rejects (its own error then)."""
    result = _answered(op, backend, key, *route_args)
    if result is not None:
        return result
    try:
        return _counted(op, prepare, backend, key, *prepare_args)
    except (TorchOnlyCall, InvalidArgument):
        return PASS


def _recorded_routed(linear: bool, backend, a, b, bias) -> Any:
    """A routed call autograd records: torch's op where the route names it (counted), else
    the Function with routing off while it runs."""
    op = LINEAR_OP if linear else MATMUL_OP
    form, prepare, _ = _FORMS[op]
    tensors = (a, b, bias) if linear else (a, b)
    if torch_route(op, route_key(form, *tensors), backend):
        _usage.count(op.name, "torch")
        return PASS
    token = _state.suspend()
    try:
        call = prepare(*tensors)
        result = _Product.apply(a, b, bias, linear, backend, False)
    except (TorchOnlyCall, InvalidArgument):
        return PASS
    finally:
        _state.resume(token)
    _usage.record_run(op, call, backend)
    return result


def _matmul_handler(router: _state.Router, args: tuple, kwargs: dict) -> Any:
    """torch.matmul(input, other), Tensor.matmul(other) and Tensor.__matmul__ (a @ b); out=
    passes to torch."""
    if _any_autocast():
        return PASS  # (autocast casts a product's inputs first: torch's op, with its lists)
    given = arguments(args, kwargs, _MATMUL_ARGS, _MATMUL_KW)
    if given is None:
        return PASS
    a, b = given
    backend = router.backends.get("matmul")
    if type(a) is _TENSOR and plain_eager(a, b):
        # An eager plain call decided before: its route, before the checks below (the key
        # holds what they read, and a route is made only past them).
        answered = _answered(MATMUL_OP, backend, route_key("matmul", a, b), a, b)
        if answered is not None:
            return answered
    if not (taken(a) and taken(b)):
        return PASS
    if _tracing(a) or _tracing(b):
        return _compiled_matmul(a, b, None, backend)
    if _grad_enabled() and _any_requires_grad(a, b):
        return _recorded_routed(False, backend, a, b, None)
    return _routed(MATMUL_OP, backend, route_key("matmul", a, b), prepare_matmul, (a, b), (a, b))


def _linear_handler(router: _state.Router, args: tuple, kwargs: dict) -> Any:
    """F.linear(input, weight, bias=None): what nn.Linear calls."""
    if _any_autocast():
        return PASS  # (autocast casts a product's inputs first: torch's op, with its lists)
    given = arguments(args, kwargs, _LINEAR_ARGS, _LINEAR_KW)
    if given is None:
        return PASS
    x, w, bias = given
    backend = router.backends.get("linear")
    if type(x) is _TENSOR and plain_eager(x, w, bias):
        answered = _answered(LINEAR_OP, backend, route_key("linear", x, w, bias), x, w, bias)
        if answered is not None:
            return answered
    if not (taken(x) and taken(w) and (bias is None or taken(bias))):
        return PASS
    if _tracing(x) or _tracing(w):
        return _ops.linear_or_aten(x, w, bias, backend)
    if _grad_enabled() and _any_requires_grad(x, w, bias):
        return _recorded_routed(True, backend, x, w, bias)
    return _routed(LINEAR_OP, backend, route_key("linear", x, w, bias), prepare_linear,
                   (x, w, bias), (x, w, bias))


def _addmm_handler(router: _state.Router, args: tuple, kwargs: dict) -> Any:
    """torch.addmm(input, mat1, mat2) with beta = alpha = 1 and input a bias row (what
    Hugging Face's Conv1D calls): linear's op. Other scales, a full input matrix, out=: torch."""
    if _any_autocast():
        return PASS  # (autocast casts a product's inputs first: torch's op, with its lists)
    given = arguments(args, kwargs, _ADDMM_ARGS, _ADDMM_KW)
    if given is None:
        return PASS
    bias, m1, m2 = given
    if kwargs:
        beta, alpha = kwargs.get("beta", 1), kwargs.get("alpha", 1)
        if not (type(beta) in (int, float) and beta == 1 and type(alpha) in (int, float)
                and alpha == 1):
            return PASS
    backend = router.backends.get("linear")
    if type(m1) is _TENSOR and plain_eager(bias, m1, m2):
        answered = _answered(LINEAR_OP, backend, route_key("addmm", m1, m2, bias), m1, m2, bias)
        if answered is not None:
            return answered
    if not (taken(bias) and taken(m1) and taken(m2) and bias_row(bias, m1, m2)):
        return PASS
    if _tracing(m1) or _tracing(m2):
        # linear of mat2's transpose (a view): the same product, on linear's library op
        return _ops.linear_or_aten(m1, m2.t(), bias.reshape(-1), backend)
    if _grad_enabled() and _any_requires_grad(bias, m1, m2):
        token = _state.suspend()
        try:
            row = bias.reshape(-1)  # (views autograd records: the grads reach mat2 and input)
        finally:
            _state.resume(token)
        return _recorded_routed(True, backend, m1, m2.t(), row)
    return _routed(LINEAR_OP, backend, route_key("addmm", m1, m2, bias), prepare_addmm,
                   (m1, m2, bias), (bias, m1, m2))


ENTRY_POINTS = [
    # (op, owner, attribute, handler, whether the original is Python that calls another entry
    # point, whether it copies a view (the layout entries: contiguous, reshape)). Tensor's
    # __rmatmul__ is not one: torch's calls torch.matmul, which is.
    ("matmul", torch, "matmul", _matmul_handler, False, False),
    ("matmul", torch.Tensor, "matmul", _matmul_handler, False, False),
    ("matmul", torch.Tensor, "__matmul__", _matmul_handler, False, False),
    ("linear", F, "linear", _linear_handler, False, False),
    ("linear", torch, "addmm", _addmm_handler, False, False),
]
