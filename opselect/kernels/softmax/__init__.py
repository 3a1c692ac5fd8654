"""softmax and log_softmax along any dim, forward and backward.

The call is viewed as (outer, N, inner): N is the softmax dim, outer the dims before it, inner the
dims after. Five forward algorithms:

  torch     torch.softmax / torch.log_softmax (ATen)
  fused     inner == 1, N <= FUSED_MAX: a row held in registers, 16-byte vector loads and stores:
            one read and one write per element; num_warps grows with the row (~16 values per
            thread). When rows vastly outnumber the programs that fit on the GPU, each program
            takes several rows (a persistent-style grid) and the loop over them is software-
            pipelined (pipeline_stages), so the next row's load overlaps this row's reductions.
  multirow  inner == 1, N <= MULTIROW_MAX: a [rows_per_tile x row_block] tile of many short
            rows per program, so a program moves kilobytes, not one 64-byte row.
  online    inner == 1, N > ONLINE_MIN: rows too long for registers. One pass keeps a running max
            and sum per lane (online softmax: s = s * exp(m_old - m_new) + exp(x - m_new)), a
            second pass normalises, reading the chunks in reverse so the ones read last (still in
            L2) come first. With few rows, each row is split over `split` programs: a stats kernel
            writes (max, sum) per chunk, a normalising kernel combines them and runs in reverse
            program order. Rows of a few to 64 chunks run in one launch: cooperative (a row's
            programs hold their chunks until the row's statistics are in) or, on many rows,
            lagged (each program publishes one row's chunk statistics and writes the same
            chunk of a row `lag` programs earlier, read again from L2: nothing waits).
  strided   inner > 1: softmax over a non-innermost dim with no transpose copy. A program owns
            inner_block contiguous inner columns and reduces a [dim_block x inner_block] tile
            along axis 0 (single load when the whole dim fits, else the online two-pass scheme
            over chunks of the dim).

Backward (ops.softmax under autograd): a torch.autograd.Function whose backward runs its own
kernels, whichever forward backend ran (torch's backend uses torch's own autograd):
  softmax      dx = y * (dy - sum(dy * y))
  log_softmax  dx = dy - exp(y) * sum(dy)
with the same layouts: rows (in registers, lagged on many long rows, or two passes over
chunks, or split over programs) and strided tiles.

Numerics follow torch: float16/bfloat16/float32 accumulate in float32, float64 in float64. dtype=
casts the input first; a widening cast is fused into the kernels' load (exact), a narrowing one is
done by torch before the kernel (it rounds). A row of all -inf, or one holding +inf or NaN, gives
NaN as in torch.

Memory layout: kernels take the input with its strides when they fit the pattern a kernel needs
(rows: the softmax dim has stride 1; strided: the innermost dim has stride 1; the dims before and
after must each collapse into one), else the input is made contiguous first (as torch does). The
output is contiguous, as torch's."""

from __future__ import annotations

import functools

import torch

from ...dispatch.backend import TorchBackend
from ...dispatch.op import Op, register
from ...heuristics import softmax_torch
from .autograd import (_ROWS_BWD, _SPLIT_BWD_APPLY, _SPLIT_BWD_SUM, _STRIDED_BWD,
                       _STRIDED_SPLIT_BWD, _with_backward, backward, kernels_cannot_read)
from .call import (_WIDENING, CALIBRATION, SoftmaxCall, _torch_softmax, prepare_log_softmax,
                   prepare_softmax, replay, sample)
from .common import _ROWS_FWD, _strided_plan
from .cross_entropy import _BACKWARD as _CE_BWD, _FORWARD as _CE_FWD
from .fused import FusedBackend
from .multirow import MultirowBackend
from .lagged import _LAGGED_BWD, _LAGGED_FWD
from .online import _COOP_FWD, _ONLINE_FWD, _SPLIT_NORM, _SPLIT_STATS, OnlineBackend, coop_split
from .strided import _STRIDED_FWD, _STRIDED_SPLIT, StridedBackend

# What other modules use (ops, routing, library, transforms, calibrate, tests).
__all__ = ["OP", "SOFTMAX_OP", "LOG_SOFTMAX_OP", "LAUNCHERS", "SoftmaxCall", "prepare_softmax",
           "prepare_log_softmax", "sample", "replay", "backward", "kernels_cannot_read",
           "_WIDENING", "coop_split", "_strided_plan", "FusedBackend", "MultirowBackend",
           "OnlineBackend", "StridedBackend"]

# Every launcher of the package by its kernel's name (tests launch each under a checked spec).
LAUNCHERS = {launcher.fn.__name__: launcher for launcher in (
    _ROWS_FWD, _ONLINE_FWD, _SPLIT_STATS, _SPLIT_NORM, _COOP_FWD, _LAGGED_FWD, _STRIDED_FWD,
    _STRIDED_SPLIT,
    _ROWS_BWD, _SPLIT_BWD_SUM, _SPLIT_BWD_APPLY, _STRIDED_BWD, _STRIDED_SPLIT_BWD, _LAGGED_BWD,
    _CE_FWD, _CE_BWD)}


def _make_op(name: str, prepare) -> Op:
    op = Op(name, prepare, [
        TorchBackend(_torch_softmax, softmax_torch.torch_, lambda call: functools.partial(
            torch.log_softmax if call.log else torch.softmax, dim=call.dim,
            dtype=call.dtype_arg)),
        FusedBackend(),
        OnlineBackend(),
        MultirowBackend(),
        StridedBackend(),
    ], sample=sample, timed=_with_backward, replay=replay)
    op.calibration = list(CALIBRATION)  # read by `opselect calibrate`
    return register(op)


SOFTMAX_OP = _make_op("softmax", prepare_softmax)
LOG_SOFTMAX_OP = _make_op("log_softmax", prepare_log_softmax)
OP = SOFTMAX_OP
