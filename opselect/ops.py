"""The public ops. Each is a thin function over an Op of the dispatcher (see dispatch/op.py),
defined in its front (opselect/fronts/<op>.py):

    ops.isin(a, b)                    automatic choice of backend
    ops.isin(a, b, backend="hash")    force one ("auto" or None: choose)

Every op accepts what its torch namesake accepts and returns what it returns. A call decided
before, with plain arguments, is answered from its route (Op.routes: a dict lookup by the
arguments' shapes, strides, dtypes, device and scalars) by the chosen backend's prepared call, or
by torch's op; other calls go through the op's prepare() and Op.run(). While torch.compile
traces a function (torch.compiler.is_compiling()), they call the op's torch.library ops instead,
which the graph keeps. While a function transform watches a call (forward-mode AD, torch.func's
vmap / jvp / grad), they go through the op's autograd.Function. A call whose dtype opselect's
kernels do not take (quantized, uint16-64, float8, ...) goes to torch's own op untouched.
"""

from __future__ import annotations

from .fronts.isin import isin
from .fronts.matmul import linear, matmul
from .fronts.permute import permute, transpose
from .fronts.softmax import log_softmax, softmax
from .fronts.topk import topk

__all__ = ["isin", "linear", "log_softmax", "matmul", "permute", "softmax", "topk", "transpose"]
