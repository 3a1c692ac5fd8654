"""matmul and linear: C = A @ B (+ bias) for float16, bfloat16 and float32, 2-d and batched.

Every call (torch.matmul's 1-d to n-d forms, F.linear, torch.addmm with a bias row) is prepared
into one problem, a batch of (M x K) @ (K x N) products with an optional bias along N, read
through the operands' own strides (kernels/matmul/call.py). Two ops share the backends: `matmul`
(ops.matmul) and `linear` (ops.linear and the addmm form), the bias added in the kernels'
epilogue. Backends:

  torch       torch.matmul / F.linear / torch.addmm (cuBLAS)
  tiled       a program per output tile, k walked in block_k steps through a software pipeline
              of num_stages shared-memory buffers, tiles in groups of group_m row blocks (the
              programs running together share rows of A and columns of B in L2)
  splitk      k split over `split` programs per tile: float32 partial tiles in a workspace, the
              last program of a tile to arrive (an atomic counter, reset by that program) adds
              them, adds the bias and stores: one launch. For decode-sized products (M of 1 to
              16 rows), whose few tiles would leave most SMs idle while the weight streams in
  persistent  one or two programs per SM walking the tiles in the grouped order (no partial
              last wave of launches)

Numerics: products accumulate in float32 and are rounded once into the output dtype (the bias
added before the rounding, as cuBLAS's epilogue adds it). float32 follows
torch.backends.cuda.matmul.allow_tf32 (tf32 tensor cores when allowed, else full float32
products), read per call and part of the call's key.
"""

from __future__ import annotations

from ...dispatch.backend import TorchBackend
from ...dispatch.op import Op, register
from ...heuristics import matmul as cost
from .call import (CALIBRATION_LINEAR, CALIBRATION_MATMUL, MatmulCall, plain_key, prepare_addmm,
                   prepare_linear, prepare_matmul, replay, sample_linear, sample_matmul,
                   torch_prepared, torch_product)
from .persistent import _PERSISTENT, PersistentBackend
from .splitk import _SPLITK, SplitKBackend
from .tiled import _TILED, TiledBackend

__all__ = ["MATMUL_OP", "LINEAR_OP", "OP", "LAUNCHERS", "MatmulCall", "plain_key",
           "prepare_matmul", "prepare_linear", "prepare_addmm", "replay", "sample_matmul",
           "sample_linear", "TiledBackend", "SplitKBackend", "PersistentBackend"]

# Every launcher of the package by its kernel's name (tests launch each under a checked spec).
LAUNCHERS = {launcher.fn.__name__: launcher for launcher in (_TILED, _SPLITK, _PERSISTENT)}


def _make_op(name: str, prepare, sample, calibration) -> Op:
    op = Op(name, prepare, [
        TorchBackend(torch_product, cost.torch_, torch_prepared),
        TiledBackend(),
        SplitKBackend(),
        PersistentBackend(),
    ], sample=sample, replay=replay)
    op.calibration = list(calibration)
    return register(op)


MATMUL_OP = _make_op("matmul", prepare_matmul, sample_matmul, CALIBRATION_MATMUL)
LINEAR_OP = _make_op("linear", prepare_linear, sample_linear, CALIBRATION_LINEAR)
OP = MATMUL_OP
