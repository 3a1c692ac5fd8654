"""What the op fronts share: the routing helpers of their enable() handlers, the answer of a call
only torch's op takes, and the markers of the hot path.

A handler (fronts/<op>.py) gets the arguments of a patched torch entry point (routing.py installs
the wrappers) and returns the op's result, or PASS for a call opselect does not take (the wrapper
then calls torch's original). An eager call decided before is answered by its route (_route), the
first call of a key by _counted, which prepares and runs it and so installs the route.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, Mapping, Optional

import torch
from torch._subclasses.functional_tensor import FunctionalTensor
from torch.compiler import is_compiling as _compiling

from .. import routing_state as _state
from .. import usage as _usage
from ..dispatch import tuning_mode as _tuning
from ..dispatch.op import Op
from ..dispatch.tuning_mode import state as _tuning_state
from ..errors import BackendError, TorchOnlyCall
from ..usage import _ran

_functorch_active = torch._C._are_functorch_transforms_active
_TENSOR, _STRIDED = torch.Tensor, torch.strided
#: torch's own ops, never the wrappers enable() installs over torch.isin & co (positional
#: arguments: quicker to parse)
_VF = torch._C._VariableFunctions

_ROUTING_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                             "routing.py")
_FRONTS_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _ours(filename: str) -> bool:
    """A frame of the routing machinery: the wrappers (routing.py) or a front's handler."""
    return filename == _ROUTING_FILE or filename.startswith(_FRONTS_DIR)


#: What a handler returns for a call opselect does not take: the wrapper then calls torch.
PASS = NotImplemented


_PLAIN = (torch.Tensor, torch.nn.Parameter)


_FLOATS = frozenset((torch.float16, torch.bfloat16, torch.float32, torch.float64))


def _takes(x: Any) -> bool:
    """A tensor opselect takes: a plain one (also what Dynamo's traced code sees), or, while
    AOTAutograd traces a graph, the functional tensor of a call that the graph itself makes (a
    Tensor method call that Dynamo left in its graph), not one made by torch's own
    decompositions (torch._decomp's matmul reshapes its operands, for instance)."""
    kind = type(x)
    return kind in _PLAIN or (kind is FunctionalTensor and _graph_call())


#: Whether any device's autocast is on (one C call, ~0.1 us): the routes of ops whose result
#: autocast changes (softmax, log_softmax, cross_entropy; matmul, linear) look further only then.
_any_autocast = torch._C._is_any_autocast_enabled


def autocast_float32(x: torch.Tensor, dtype: Any) -> Any:
    """softmax's and log_softmax's dtype under autocast, as torch's own op takes it: on CUDA (the
    'fp32_set_opt_dtype' policy) a call without dtype= of a float16, bfloat16 or float32 input
    runs as dtype=torch.float32; a call with dtype= as given. On another device type with
    autocast on: PASS (torch's op, under that device's own lists). Off: dtype unchanged."""
    kind = x.device.type
    if not torch.is_autocast_enabled(kind):
        return dtype
    if kind != "cuda":
        return PASS
    if dtype is None and x.is_floating_point() and x.dtype != torch.float64:
        return torch.float32
    return dtype


def _tracing(x: Any) -> bool:
    """A traced call: Dynamo is tracing, or AOTAutograd is (x is one of its functional tensors;
    torch 2.11's torch.compiler.is_compiling() is False there, 2.13's True)."""
    return _compiling() or type(x) is FunctionalTensor


def _graph_call() -> bool:
    """The routed call comes from an FX graph's code or from an FX Interpreter running a
    graph's node itself: a call_method (x.topk(k)), or a call_function whose target reached the
    wrapper directly (`a @ b` is operator.matmul in Dynamo's graph, a C function with no frame
    of its own). A call from inside a target written in Python (torch's decompositions, say)
    has that function's frame in between, and is torch's own."""
    frame = sys._getframe(1)
    while frame is not None and _ours(frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None:
        return False
    code = frame.f_code
    return code.co_filename.startswith("<eval_with_key>") or (
        code.co_name in ("call_method", "call_function")
        and code.co_filename.replace("\\", "/").endswith("torch/fx/interpreter.py"))


def _arg(args: tuple, kwargs: Mapping[str, Any], i: int, name: str, default: Any = None) -> Any:
    if len(args) > i:
        return args[i]
    return kwargs.get(name, default)


#: forced_routes' answer for a call not seen yet (None there means torch's op)
_UNSEEN = object()


def _route(op: Op, key: Optional[tuple], backend: Optional[str]) -> Any:
    """The route of an eager call decided before (Op.routes, keyed as ops.py keys them): PASS
    where it is torch's op (the wrapper then calls the original entry point: nothing of
    opselect's runs in between), the chosen backend's prepared call, or None for a call not
    decided yet (or whose route waits while tuning is on). The call is counted (stats())."""
    if key is None:
        return None
    if backend is None:
        route = op.routes.get(key)
        if route is None or not (route[1] or not _tuning_state.active):
            return None
        _ran[op.name][route[2]] += 1  # (usage.count, inline: a frame less on every call)
        prepared = route[0] if route[3] is None else in_regime(route)
        return PASS if prepared is None else prepared
    prepared = op.forced_routes.get((backend, key), _UNSEEN)
    if prepared is _UNSEEN:
        return None
    _usage.count(op.name, backend)
    return PASS if prepared is None else prepared


def in_regime(route: tuple) -> Optional[Callable]:
    """The prepared call (None: torch's op) of a route whose choice differs under a CUDA graph
    (Op.routes' regime): the graph's while the current stream captures, else the eager one.
    The fronts call it only for such routes: the others' cost is one test of route[3]."""
    graph, info = route[3]
    return graph if _tuning.capturing(info) else route[0]


def _prepared(prepared: Callable, *tensors) -> Any:
    """A backend's prepared call, with routing off meanwhile (a tensor method it calls, such as
    contiguous(), must reach torch's own)."""
    token = _state.suspend()
    try:
        return prepared(*tensors)
    finally:
        _state.resume(token)


def _counted(op: Op, prepare: Callable, backend: Optional[str], key: Optional[tuple], *args,
             **kwargs):
    """An eager routed call seen for the first time: prepare(*args, **kwargs) and run it, which
    installs its route under `key`, with routing off meanwhile (the `torch` backend calls
    torch's own op, which must not come back here)."""
    token = _state.suspend()
    try:
        call = prepare(*args, **kwargs)
        result = op.run(call, backend, key)
    finally:
        _state.resume(token)
    _usage.record_run(op, call, backend)
    return result


def _torch_answers(op: Op, backend: Optional[str], why: TorchOnlyCall, answer):
    """A call only torch's op takes: torch's answer (or torch's own error). A forced Triton
    backend is refused, naming why."""
    if backend is not None and backend != "auto" and op.backend(backend).name != "torch":
        raise BackendError(f"{op.name}: backend {backend!r} cannot take this call ({why}); "
                           "only the torch backend can") from None
    return answer()
