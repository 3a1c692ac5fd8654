"""The machinery of opselect's torch.library ops, so torch.compile traces them with no graph break
and CUDA graphs capture them: the library handle, the run-time kernel's wrapper, the autograd and
vmap helpers, and the trace-time rule below. Each op's own definitions (schema, kernel, fake,
autograd, vmap, trace-time choice) are in its front, opselect/fronts/<op>.py.

Two ops per public function, in the `opselect` namespace:

  opselect.<op>           the op itself (isin, topk, permute, softmax, log_softmax,
                          softmax_backward, matmul and linear): its kernel runs the dispatcher's
                          choice at run time, a fake implementation gives the exact shapes,
                          dtypes and strides, and autograd is registered (softmax and
                          log_softmax backward through opselect.softmax_backward, which runs
                          the fused backward kernels).
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
    matmul and linear: inductor calls ATen's product (an extern cuBLAS kernel) and fuses nothing
    into it, so the dispatcher's choice decides as for topk; under inductor's max-autotune it
    times Triton GEMM templates of its own against cuBLAS and fuses their epilogues, and keeps
    the aten op (inductor_gemm in fronts/_matmul_rules.py).
  * Dynamic shapes (a symbolic size): permute and softmax stay aten; isin, topk, matmul and
    linear become opselect.<op>, which chooses per call at run time (torch's kernel among the
    candidates), so no size is guarded and no size recompiles.

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
from . import usage as _usage
from .dispatch.op import Op
from .errors import BackendError, TorchOnlyCall

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
_DYNAMIC_OPSELECT = frozenset({"isin", "topk", "matmul", "linear"})

LIB = torch.library.Library("opselect", "DEF")
_ops = torch.ops.opselect


# ---------------------------------------------------------------------------------------------
# The ops' kernels run the dispatcher at run time, below autograd: grad mode off inside, so the
# eager autograd wrappers of the backends stay out of it
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


# ---------------------------------------------------------------------------------------------
# The dim rule of the fake implementations (which give the outputs' metadata exactly as the
# kernels make them: every output a new contiguous tensor) and of the vmap rules
# ---------------------------------------------------------------------------------------------
def _wrap(dim: int, rank: int, what: str) -> int:
    span = max(rank, 1)
    if not -span <= dim < span:
        raise IndexError(f"{what}: dim {dim} is out of range for a {rank}-d input "
                         f"(expected [{-span}, {span - 1}])")
    return dim % span


# ---------------------------------------------------------------------------------------------
# Autograd (reverse and forward mode) and vmap
#
# Each op's Autograd kernel applies the op's one autograd.Function, the class in its front that
# eager calls watched by a transform go through too. It is what torch.library.register_autograd
# would make, plus a jvp, so a dual tensor's tangent is carried, never dropped; applied from here
# (library=True), its forward runs the op below autograd. The op's vmap rule folds the batch dim
# into the op's own input: the Function's rule (the front's batching helper, given the op).
# ---------------------------------------------------------------------------------------------
_BelowAutograd = torch._C._AutoDispatchBelowAutograd
_any_requires_grad = torch._C._any_requires_grad


def _apply(fn: type, *args):
    """fn.apply as the op's Autograd kernel; args end with the Function's `library` argument,
    True here: its forward runs the library op below autograd (a traced graph keeps the op,
    whose fake gives the outputs). An eager call applies the same Function with False: its
    forward runs the dispatcher on plain tensors (torch.func calls it one level down, where
    they are plain). torch.func's grad / jvp transforms cannot run a custom op's
    autograd.Function from here (register_autograd's ops fail the same way), so they get a
    clear error naming the eager op, which supports them (the same Function, through
    fn.apply)."""
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
