"""The public ops. Each is a thin function over an Op of the dispatcher (see dispatch/op.py):

    ops.isin(a, b)                    automatic choice of backend
    ops.isin(a, b, backend="hash")    force one ("auto" or None: choose)

Every op accepts what its torch namesake accepts and returns what it returns. Each function calls
its op's prepare() and then Op.run() directly: the memo-hit path stays a few microseconds. While
torch.compile traces a function (torch.compiler.is_compiling()), they call the torch.library ops
instead (opselect/library.py), which the graph keeps.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch.compiler import is_compiling as _compiling

from . import library as _library
from .kernels import isin as _isin
from .kernels import permute as _permute
from .kernels import softmax as _softmax
from .kernels import topk as _topk


def isin(elements, test_elements, *, assume_unique: bool = False, invert: bool = False,
         out: Optional[torch.Tensor] = None, backend: Optional[str] = None) -> torch.Tensor:
    """torch.isin: a bool tensor shaped like `elements`, True where the element is in
    `test_elements` (False with invert=True). Either argument may be a Python number; dtypes are
    promoted as torch does; NaN is never a member and -0.0 equals 0.0.

    Backends: torch, compare, search, hash, bitmap (see opselect.kernels.isin)."""
    if _compiling():
        return _library.isin(elements, test_elements, assume_unique, invert, out, backend)
    call = _isin.prepare(elements, test_elements, assume_unique=assume_unique, invert=invert,
                         out=out)
    return _isin.OP.run(call, backend)


def topk(input: torch.Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True,
         *, backend: Optional[str] = None):
    """torch.topk: the k largest (or smallest) values along `dim` and their indices, as
    torch.return_types.topk(values, indices). NaN counts as larger than every number.

    Backends: torch, radix, tournament, maxima, sort, bitonic (see opselect.kernels.topk)."""
    if _compiling():
        return _library.topk(input, k, dim, largest, sorted, backend)
    return _topk.OP.run(_topk.prepare(input, k, dim, largest, sorted), backend)


def permute(input: torch.Tensor, dims: Sequence[int], *, out: Optional[torch.Tensor] = None,
            backend: Optional[str] = None) -> torch.Tensor:
    """input.permute(dims).contiguous(), as a new tensor (or written into `out`).

    Backends: torch, naive, tiled, vectorized (see opselect.kernels.permute)."""
    if _compiling():
        return _library.permute(input, dims, out, backend)
    return _permute.OP.run(_permute.prepare(input, dims, out=out), backend)


def transpose(input: torch.Tensor, dim0: int, dim1: int, *, out: Optional[torch.Tensor] = None,
              backend: Optional[str] = None) -> torch.Tensor:
    """input.transpose(dim0, dim1).contiguous(): permute() with two dims swapped."""
    if _compiling():
        dims = list(range(input.dim()))
        if dims:
            dims[dim0], dims[dim1] = dims[dim1], dims[dim0]
        return _library.permute(input, dims, out, backend)
    return _permute.transpose(input, dim0, dim1, out=out, backend=backend)


def softmax(input: torch.Tensor, dim: int = -1, *, dtype: Optional[torch.dtype] = None,
            backend: Optional[str] = None) -> torch.Tensor:
    """torch.softmax along `dim` (accumulating in float32, float64 stays float64); works under
    autograd. Backends: torch, fused, online, multirow, strided (see opselect.kernels.softmax)."""
    if _compiling():
        return _library.softmax(input, dim, dtype, backend)
    return _softmax.SOFTMAX_OP.run(_softmax.prepare_softmax(input, dim, dtype=dtype), backend)


def log_softmax(input: torch.Tensor, dim: int = -1, *, dtype: Optional[torch.dtype] = None,
                backend: Optional[str] = None) -> torch.Tensor:
    """torch.log_softmax, with the same backends and rules as softmax()."""
    if _compiling():
        return _library.log_softmax(input, dim, dtype, backend)
    return _softmax.LOG_SOFTMAX_OP.run(_softmax.prepare_log_softmax(input, dim, dtype=dtype),
                                       backend)


__all__ = ["isin", "log_softmax", "permute", "softmax", "topk", "transpose"]
