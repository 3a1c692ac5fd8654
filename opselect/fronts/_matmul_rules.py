"""What matmul's and linear's front (fronts/matmul.py) shares that needs nothing of its own, so
the front reads top-down: the route key, out=, the checks of enable()'s handlers, the trace-time
rule's inductor question, and the rules of the front's autograd.Function: the gradients and
tangents of the products, each written with the products themselves (the caller passes
ops.matmul / ops.linear in, so the backward is dispatched too), and the vmap rules, which fold
the vmapped dim into one more batch dim of the product.

torch.matmul's forms, for the rules below (a of rank ra, b of rank rb):

    a is 1-d: a row (1, k) whose row dim is dropped from the result
    b is 1-d: a column (k, 1) whose column dim is dropped
    the dims before the last two are batch dims, broadcast against each other
"""

from __future__ import annotations

import sys
import warnings
from typing import Any, Callable, Optional

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch._subclasses.functional_tensor import FunctionalTensor
from torch.compiler import is_compiling as _compiling

from ..dispatch.tuning_mode import state as _tuning_state
from ..errors import TorchOnlyCall
from ..kernels.matmul import prepare_linear, prepare_matmul
from ..kernels.matmul.call import DTYPES, plain_key
from ..transforms import _bdim_first, batched
from ._base import _STRIDED, _TENSOR, _UNSEEN, _takes, in_regime

_PARAMETER = torch.nn.Parameter
_DTYPES = frozenset(DTYPES)
_grad_enabled = torch.is_grad_enabled
_any_requires_grad = torch._C._any_requires_grad


# ---------------------------------------------------------------------------------------------
# The front's calls
# ---------------------------------------------------------------------------------------------
#: The route key of a call: kernels/matmul's plain_key (an nn.Parameter keyed as the plain
#: tensor it is, so nn.Linear's calls are answered from their routes).
route_key = plain_key


def write_out(out, input, compute, torch_answer, *tensors):
    """matmul's out=: the product written into out, resized where its shape differs (with a
    warning where it had elements, as torch gives). What torch refuses (out of another dtype
    or device, autograd recording the call) is torch's to answer."""
    if (not isinstance(out, torch.Tensor) or not isinstance(input, torch.Tensor)
            or out.layout is not _STRIDED or out.dtype != input.dtype
            or out.device != input.device
            or (_grad_enabled() and _any_requires_grad(out, *tensors))):
        return torch_answer()
    result = compute()
    if out.shape != result.shape:
        if out.numel():
            warnings.warn(f"matmul: out has shape {tuple(out.shape)}, resizing it to "
                          f"{tuple(result.shape)} (as torch does for out=; pass an empty tensor "
                          "to avoid this warning)", UserWarning, stacklevel=3)
        out.resize_(result.shape)
    return out.copy_(result)


def inductor_gemm(call, choice: str) -> bool:
    """Inductor calls ATen's product (cuBLAS) unless max-autotune is on, when it times its own
    Triton GEMM templates against it and fuses the neighbours into them: then its op."""
    config = sys.modules.get("torch._inductor.config")
    return bool(config is not None and (getattr(config, "max_autotune", False)
                                        or getattr(config, "max_autotune_gemm", False)))


def taken(t: Any) -> bool:
    """A tensor the kernels can take: plain (or a graph's own call's while AOTAutograd traces),
    strided, of a dtype they take; anything else (float64 included) is torch's, untouched."""
    return _takes(t) and t.layout is _STRIDED and t.dtype in _DTYPES


def arguments(args: tuple, kwargs: dict, names: tuple, known: frozenset) -> Optional[tuple]:
    """An entry point's tensor arguments, by position or by name (a missing one None); None
    for other arguments (out=, or more than torch's)."""
    n = len(args)
    if not kwargs:
        if n == len(names):
            return args
        if n > len(names):
            return None
    elif n > len(names) or not kwargs.keys() <= known:
        return None
    return tuple([args[i] if i < n else kwargs.get(name) for i, name in enumerate(names)])


def torch_route(op, key, backend) -> bool:
    """The key's route is torch's own op (which records autograd itself)."""
    if key is None:
        return False
    if backend is None or backend == "auto":
        route = op.routes.get(key)
        return route is not None and (route[1] or not _tuning_state.active) and (
            route[0] if route[3] is None else in_regime(route)) is None
    return op.forced_routes.get((backend, key), _UNSEEN) is None


def bias_row(bias: torch.Tensor, m1: torch.Tensor, m2: torch.Tensor) -> bool:
    """torch.addmm(bias, m1, m2) is a product plus a bias row, (n,), (1, n) or one value
    (what the kernels add; a full matrix is torch's), of 2-d matrices that fit: read off the
    shapes alone, so Dynamo traces it as it is."""
    if m1.dim() != 2 or m2.dim() != 2 or m1.shape[1] != m2.shape[0] or bias.dim() > 2:
        return False
    return bias.numel() in (1, m2.shape[1]) and (bias.dim() < 2 or bias.shape[0] == 1)


def traced(*tensors) -> bool:
    """A tensor of a graph being traced: fake, or AOTAutograd's functional one."""
    for t in tensors:
        if isinstance(t, (FakeTensor, FunctionalTensor)):
            return True
    return False


def plain_eager(*tensors) -> bool:
    """An eager call of plain tensors autograd does not record: its route may answer it."""
    for t in tensors:
        if t is not None and type(t) is not _TENSOR and type(t) is not _PARAMETER:
            return False
    return not _compiling() and not (_grad_enabled() and _any_requires_grad(*tensors))



Product = Callable[..., torch.Tensor]


# ---------------------------------------------------------------------------------------------
# Reverse mode
# ---------------------------------------------------------------------------------------------
def _as_matrices(a: torch.Tensor, b: torch.Tensor, g: torch.Tensor):
    """a, b and the result's gradient g with matmul's dropped dims put back: a (.., m, k),
    b (.., k, n), g (.., m, n)."""
    a2 = a.unsqueeze(0) if a.dim() == 1 else a
    b2 = b.unsqueeze(-1) if b.dim() == 1 else b
    if b.dim() == 1:
        g = g.unsqueeze(-1)
    if a.dim() == 1:
        g = g.unsqueeze(-2)
    return a2, b2, g


def matmul_vjp(a: torch.Tensor, b: torch.Tensor, g: torch.Tensor, need_a: bool, need_b: bool,
               mm: Product):
    """(grad of a, grad of b) of torch.matmul(a, b) from the result's gradient g: g @ b^T and
    a^T @ g, summed over the batch dims each operand was broadcast along (sum_to_size)."""
    a2, b2, g2 = _as_matrices(a, b, g)
    ga = gb = None
    if need_a:
        ga = mm(g2, b2.mT).sum_to_size(a2.shape).reshape(a.shape)
    if need_b:
        if b2.dim() == 2 and a2.dim() > 2:
            # (.., m, k) @ (k, n): one product over every row instead of a product per batch
            # entry summed afterwards (no (batch, k, n) intermediate).
            k, n = a2.shape[-1], g2.shape[-1]
            gb = mm(a2.reshape(-1, k).mT, g2.reshape(-1, n))
        else:
            gb = mm(a2.mT, g2).sum_to_size(b2.shape)
        gb = gb.reshape(b.shape)
    return ga, gb


def linear_vjp(x: torch.Tensor, w: torch.Tensor, bias_shape, g: torch.Tensor, needs,
               mm: Product):
    """(grad of x, of the weight, of the bias) of F.linear(x, w, bias): g @ w, g^T @ x over
    every row, and g summed over the rows (then to the bias's own shape: one value or n)."""
    n, k = w.shape
    gx = gw = gbias = None
    if needs[0]:
        gx = mm(g, w)
    if needs[1]:
        gw = mm(g.reshape(-1, n).mT, x.reshape(-1, k))
    if needs[2] and bias_shape is not None:
        gbias = g.reshape(-1, n).sum(0).sum_to_size(bias_shape)
    return gx, gw, gbias


# ---------------------------------------------------------------------------------------------
# Forward mode
# ---------------------------------------------------------------------------------------------
def _add(total: Optional[torch.Tensor], term: torch.Tensor) -> torch.Tensor:
    return term if total is None else total + term


def product_tangent(prod: Product, a: torch.Tensor, b: torch.Tensor, ta, tb,
                    tbias=None) -> torch.Tensor:
    """d (prod(a, b) + bias) = prod(da, b) + prod(a, db) + dbias, for prod bilinear (matmul,
    or linear without its bias); a missing tangent is zero."""
    out = None
    if ta is not None:
        out = prod(ta, b)
    if tb is not None:
        out = _add(out, prod(a, tb))
    if out is None:  # (only the bias has a tangent)
        out = torch.zeros_like(prod(a, b))
    return out if tbias is None else out + tbias


# ---------------------------------------------------------------------------------------------
# vmap: the vmapped dim becomes one more leading batch dim of the product
# ---------------------------------------------------------------------------------------------
def logical(t: Optional[torch.Tensor], bdim: Optional[int]) -> Optional[torch.Tensor]:
    """A meta tensor of t's shape and dtype as the function being vmapped sees it."""
    if t is None:
        return None
    shape = list(t.shape)
    if bdim is not None:
        del shape[bdim]
    return torch.empty(shape, dtype=t.dtype, device="meta")


def _torch_only(prepare, *logical) -> bool:
    """The logical call's argument errors (raised here, as the plain path gives them), and
    whether it is a call only torch's op takes (then it runs sample by sample)."""
    try:
        prepare(*logical)
    except TorchOnlyCall:
        return True
    return False


def _per_sample(run: Product, bdims, tensors, size: int):
    """run on each sample's tensors, stacked: for a call the batch cannot be folded into."""
    def sample(i):
        return [None if t is None else (t if d is None else t.select(d, i))
                for t, d in zip(tensors, bdims)]

    return torch.stack([run(*sample(i)) for i in range(size)]), 0


def _pad_batch(t: torch.Tensor, lead: int) -> torch.Tensor:
    """t (B, ...) with `lead` dims of size 1 after its first: its batch dims then line up with
    those of an operand that has more of them (matmul broadcasts batch dims from the right)."""
    return t.reshape(t.shape[0], *([1] * lead), *t.shape[1:]) if lead else t


def matmul_batched(run: Product, bdims, a: torch.Tensor, b: torch.Tensor, size: int):
    """matmul's vmap rule: run(a, b) is the Function again or the library op."""
    ad, bd = bdims
    if ad is None and bd is None:
        return run(a, b), None
    if _torch_only(prepare_matmul, logical(a, ad), logical(b, bd)):
        return _per_sample(run, bdims, (a, b), size)
    ra, rb = a.dim() - (ad is not None), b.dim() - (bd is not None)
    a, b = _bdim_first(a, ad), _bdim_first(b, bd)
    # matmul's 1-d forms as matrices (the vmapped dim stays first), then the same number of
    # batch dims on both sides of the vmapped one.
    a3 = a.unsqueeze(-2) if ra == 1 else a
    b3 = b.unsqueeze(-1) if rb == 1 else b
    batch = max(ra, rb, 2) - 2
    if ad is not None:
        a3 = _pad_batch(a3, batch - (max(ra, 2) - 2))
    if bd is not None:
        b3 = _pad_batch(b3, batch - (max(rb, 2) - 2))

    def whole():
        out = run(a3, b3)
        if ra == 1:
            out = out.squeeze(-2)
        return out.squeeze(-1) if rb == 1 else out

    def one(i):
        return run(a[i] if ad is not None else a, b[i] if bd is not None else b)

    return batched(whole, one, size), 0


def linear_batched(run_linear: Product, run_matmul: Product, bdims, x: torch.Tensor,
                   w: torch.Tensor, bias: Optional[torch.Tensor], size: int):
    """linear's vmap rule. A vmapped input only: its dim is one more leading dim of linear's
    input. A vmapped weight or bias: one batched product, x (B, rows, k) @ w^T (B, k, n), plus
    the bias of each sample."""
    xd, wd, bd = bdims
    if xd is None and wd is None and bd is None:
        return run_linear(x, w, bias), None
    if _torch_only(prepare_linear, logical(x, xd), logical(w, wd), logical(bias, bd)):
        return _per_sample(run_linear, bdims, (x, w, bias), size)
    if wd is None and bd is None:
        x = _bdim_first(x, xd)
        return batched(lambda: run_linear(x, w, bias), lambda i: run_linear(x[i], w, bias),
                       size), 0
    x = _bdim_first(x, xd) if xd is not None else x.unsqueeze(0)
    lead, k = x.shape[1:-1], x.shape[-1]
    w = _bdim_first(w, wd) if wd is not None else w.unsqueeze(0)
    n = w.shape[-2]
    out = run_matmul(x.reshape(x.shape[0], -1, k), w.mT)
    if bias is not None:
        bias = _bdim_first(bias, bd) if bd is not None else bias.unsqueeze(0)
        out = out + bias.reshape(bias.shape[0], 1, -1)
    return out.reshape(size, *lead, n), 0
