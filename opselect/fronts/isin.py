"""isin's front: the public function ops.isin, its torch.library ops for compiled code, its
function-transform rules and its enable() handler. The kernels and backends are in
opselect/kernels/isin/."""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.autograd.forward_ad as _fwad
from torch.compiler import is_compiling as _compiling

from .. import routing_state as _state
from .. import transforms as _transforms
from ..dispatch.op import TORCH_MARGIN
from ..dispatch.tuning_mode import state as _tuning_state
from ..errors import TorchOnlyCall
from ..kernels import isin as _isin
from ..kernels.isin.call import plain_key as _isin_key
from ..library import LIB, _ops, _placed, _run, _unrouted
from ..transforms import _bdim_first
from ._base import (PASS, _UNSEEN, _VF, _arg, _counted, _functorch_active, _prepared,
                    _route, _takes, _torch_answers, _tracing, in_regime)

_TORCH_ISIN = _VF.isin


# ---------------------------------------------------------------------------------------------
# The public function (ops.isin)
# ---------------------------------------------------------------------------------------------
def isin(elements, test_elements, *, assume_unique: bool = False, invert: bool = False,
         out: Optional[torch.Tensor] = None, backend: Optional[str] = None) -> torch.Tensor:
    """torch.isin: a bool tensor shaped like `elements`, True where the element is in
    `test_elements` (False with invert=True). Either argument may be a Python number; dtypes are
    promoted as torch does; NaN is never a member and -0.0 equals 0.0.

    Backends: torch, compare, search, hash, bitmap (see opselect.kernels.isin)."""
    if _compiling():
        return _compiled(elements, test_elements, assume_unique, invert, out, backend)
    if (_functorch_active() or _fwad._current_level >= 0) and out is None and \
            _transforms.watched(elements, test_elements):
        return _transformed(elements, test_elements, assume_unique, invert, backend)
    key = None if out is not None else _isin_key(elements, test_elements, assume_unique, invert)
    # A call decided before: its route (see Op.routes), before any preparing.
    if backend is None or backend == "auto":
        route = _isin.OP.routes.get(key)
        if route is not None and (route[1] or not _tuning_state.active):
            prepared = route[0] if route[3] is None else in_regime(route)
            if prepared is None:
                if assume_unique or invert:
                    return torch.isin(elements, test_elements, assume_unique=assume_unique,
                                      invert=invert)
                return torch.isin(elements, test_elements)  # (keywords cost the parser time)
            return prepared(elements, test_elements)
    elif key is not None:
        prepared = _isin.OP.forced_routes.get((backend, key), _UNSEEN)
        if prepared is not _UNSEEN:
            if prepared is None:
                return torch.isin(elements, test_elements, assume_unique=assume_unique,
                                  invert=invert)
            return prepared(elements, test_elements)
    try:
        call = _isin.prepare(elements, test_elements, assume_unique=assume_unique, invert=invert,
                             out=out)
    except TorchOnlyCall as why:
        return _torch_answers(_isin.OP, backend, why, lambda: torch.isin(
            elements, test_elements, assume_unique=assume_unique, invert=invert,
            **({} if out is None else {"out": out})))
    return _isin.OP.run(call, backend, key)


_isin.OP.public = isin  # what tuning's stage 2 times (Op._pinned_public)


# ---------------------------------------------------------------------------------------------
# vmap (and forward-mode AD, torch.func): one autograd.Function for an eager call that a
# transform watches, with the vmap rule the library op shares (isin has no gradient: the library
# op needs no Autograd kernel, and the Function's backward and jvp give none)
# ---------------------------------------------------------------------------------------------
class _Isin(torch.autograd.Function):
    @staticmethod
    def forward(elements, test_elements, assume_unique: bool, invert: bool, backend):
        call = _isin.prepare(elements, test_elements, assume_unique=assume_unique,
                             invert=invert)
        return _isin.OP.run(call, backend)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.mark_non_differentiable(output)

    @staticmethod
    def jvp(ctx, *_):
        return None

    @staticmethod
    def backward(ctx, _g):
        return None, None, None, None, None

    @staticmethod
    def vmap(info, in_dims, elements, test, assume_unique, invert, backend):
        return _isin_batched(lambda e, t: _Isin.apply(e, t, assume_unique, invert, backend),
                             in_dims[0], in_dims[1], elements, test)


def _isin_batched(run, e_dim: Optional[int], t_dim: Optional[int], elements, test):
    """isin's vmap rule, the Function's and the library op's; run(elements, test) is
    _Isin.apply (the Function's rule: a transform below this one still sees the Function) or
    the library op. A batched elements tensor is one call; a batched test set (not an
    elementwise argument) runs each batch's elements against its own test set."""
    if t_dim is None:
        if e_dim is None:
            return run(elements, test), None
        return run(_bdim_first(elements, e_dim), test), 0
    test = _bdim_first(test, t_dim)
    batch = test.shape[0]
    if isinstance(elements, torch.Tensor):
        elements = (elements.expand(batch, *elements.shape) if e_dim is None
                    else _bdim_first(elements, e_dim))
        rows = [run(elements[b], test[b]) for b in range(batch)]
        shape, device = elements.shape, elements.device
    else:  # a Python number (the eager function takes one)
        rows = [run(elements, test[b]) for b in range(batch)]
        shape, device = (0,), test.device
    if not rows:
        return torch.empty(shape, dtype=torch.bool, device=device), 0
    return torch.stack(rows), 0


def _transformed(elements, test_elements, assume_unique: bool, invert: bool, backend):
    return _Isin.apply(elements, test_elements, assume_unique, invert, backend)


# ---------------------------------------------------------------------------------------------
# Compiled calls: the torch.library ops, their fake, autograd and vmap rules, and the
# trace-time choice between opselect's op and the aten op (opselect/library.py has the rule)
# ---------------------------------------------------------------------------------------------
LIB.define("isin(Tensor elements, Tensor test_elements, bool assume_unique=False, "
           "bool invert=False, str? backend=None) -> Tensor")
LIB.define("isin_or_aten(Tensor elements, Tensor test_elements, bool assume_unique=False, "
           "bool invert=False, str? backend=None) -> Tensor")


def _isin_kernel(elements, test_elements, assume_unique=False, invert=False, backend=None):
    try:
        call = _isin.prepare(elements, test_elements, assume_unique=assume_unique, invert=invert)
    except TorchOnlyCall:  # (placed with dynamic shapes; a dtype only torch's op takes)
        return torch.isin(elements, _flat_test(test_elements), assume_unique=assume_unique,
                          invert=invert)
    return _run(_isin.OP, call, backend)


@torch.library.register_fake("opselect::isin", lib=LIB)
def _isin_fake(elements, test_elements, assume_unique=False, invert=False, backend=None):
    return elements.new_empty(elements.shape, dtype=torch.bool)


def _isin_vmap(info, in_dims, elements, test_elements, assume_unique=False, invert=False,
               backend=None):
    return _isin_batched(lambda e, t: _ops.isin(e, t, assume_unique, invert, backend),
                         in_dims[0], in_dims[1], elements, test_elements)


def _isin_inductor_keeps(call, choice: str) -> bool:
    """Inductor's own isin is estimated no slower than opselect.isin running `choice`
    (isin_inductor_keeps, with the dispatcher's candidates for this call and its device's model)."""
    from ..heuristics.device_model import model_for

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
    return t_mine + unfused >= TORCH_MARGIN * t_theirs


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


def _compiled(elements, test_elements, assume_unique, invert, out, backend):
    """What isin() calls while torch.compile traces (Dynamo traces this Python)."""
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


LIB.impl("isin", _unrouted(_isin_kernel), "CompositeExplicitAutograd")
torch.library.register_vmap("opselect::isin", _isin_vmap, lib=LIB)
LIB.impl("isin_or_aten", _unrouted(_isin_or_aten), "CompositeImplicitAutograd")


# ---------------------------------------------------------------------------------------------
# opselect.enable(): the handler of the torch entry points this op takes over
# ---------------------------------------------------------------------------------------------
_ISIN_KW = frozenset(("elements", "test_elements", "assume_unique", "invert"))


def _isin_handler(router: _state.Router, args: tuple, kwargs: dict) -> Any:
    elements = _arg(args, kwargs, 0, "elements")
    test = _arg(args, kwargs, 1, "test_elements")
    if (len(args) > 2 or not kwargs.keys() <= _ISIN_KW or not _takes(elements)
            or not _takes(test)):
        return PASS
    assume_unique = bool(kwargs.get("assume_unique", False))
    invert = bool(kwargs.get("invert", False))
    if (elements.dtype not in _isin._SUPPORTED or test.dtype not in _isin._SUPPORTED
            or elements.device != test.device):
        return PASS
    backend = router.backends.get("isin")
    if _tracing(elements):
        return _compiled(elements, test, assume_unique, invert, None, backend)
    key = _isin_key(elements, test, assume_unique, invert)
    route = _route(_isin.OP, key, backend)
    if route is not None:
        if route is PASS:
            return _TORCH_ISIN(elements, test, assume_unique=assume_unique, invert=invert)
        return _prepared(route, elements, test)
    return _counted(_isin.OP, _isin.prepare, backend, key, elements, test,
                    assume_unique=assume_unique, invert=invert)


ENTRY_POINTS = [
    # (op, owner, attribute, handler, whether the original is Python that calls another entry
    # point, whether it copies a view (the layout entries: contiguous, reshape))
    ("isin", torch, "isin", _isin_handler, False, False),
]
