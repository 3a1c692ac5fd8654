"""permute: input.permute(dims).contiguous() as one copy that moves every byte once.

Before any backend runs, the call is reduced to its simplest equivalent (see `simplify`):

  1. the output is described in its own order: output dim i has size input.size(dims[i]) and reads
     with input stride input.stride(dims[i]);
  2. size-1 dims are dropped, and neighbouring output dims that the input also holds as one block
     (outer stride == inner size * inner stride) are merged: a 5-d permute is often a 2-d or 3-d
     one, and a non-contiguous input merges wherever its strides allow;
  3. when the output's last dim is also contiguous in the input (it "stays"), its elements are
     regrouped into the widest unit (2, 4, 8 or 16 bytes) that the run length, the other strides
     and both pointers are multiples of; a run that becomes one unit is dropped, which turns e.g.
     (N, M, 2) fp32 -> (M, N, 2) into a plain transpose of 8-byte elements.

The kernels see only bytes: every dtype (bool, complex, float8, ...) moves as an integer of its
size; 16-byte elements (complex128, or runs widened to 16 bytes) move as pairs of int64.

Backends:

  torch       input.permute(dims).contiguous() (ATen's strided copy)
  naive       one program per block of output elements; each maps its output offset to the input
              offset by peeling the (simplified) dims off with div/mod, in 32 bits when the
              tensor allows; reads are uncoalesced when the last dim moves
  vectorized  permutations that keep the last dim: copies whole contiguous runs, a tile of
              rows_per_tile runs x run_block units per step, with 16-byte loads and stores
              where the alignment allows (the run starts are declared multiples of the vector
              to the compiler)
  tiled       permutations that move the last dim: a tile is loaded coalesced along the input's
              contiguous dims (group A) and stored coalesced along the output's (group B); the
              compiler moves it between the two register layouts through shared memory (with its
              own swizzling, so the 32-bank conflicts of a naive 128x128 smem tile do not arise).
              Groups A and B each take up to 3 dims, so short contiguous runs on either side are
              extended to whole cache lines; the other dims are a batch index. Short kept runs of
              16 or 32 bytes are moved as one element (unit_width units). When one group is under 16
              bytes (3 colour channels: NCHW <-> NHWC, HWC -> CHW) and the other continues it in
              memory, a narrow variant moves that side as one flat chunk, 16 bytes a lane, and
              permutes it on chip with tl.gather."""

from __future__ import annotations

import functools

import torch

from ...dispatch.backend import TorchBackend
from ...dispatch.op import Op, register
from ...heuristics import permute as cost
from .call import (PermuteCall, _torch_permute, prepare, prepare_keyed, random_tensor, replay,
                   sample, simplify, transpose_dims, widen, wrap_dims)
from .naive import NaiveBackend
from .tiled import TiledBackend, _plan
from .vectorized import VectorizedBackend

# What other modules use (ops, routing, library, transforms, warm, tests).
__all__ = ["OP", "PermuteCall", "prepare", "prepare_keyed", "sample", "replay", "transpose", "transpose_dims",
           "wrap_dims", "random_tensor", "simplify", "widen", "_plan", "NaiveBackend",
           "TiledBackend", "VectorizedBackend"]


def transpose(input, dim0, dim1, *, out: torch.Tensor | None = None,
              backend: str | None = None) -> torch.Tensor:
    """input.transpose(dim0, dim1).contiguous(): permute() with two dims swapped."""
    return OP(input, transpose_dims(input, dim0, dim1), out=out, backend=backend)


OP = register(Op("permute", prepare, [
    TorchBackend(_torch_permute, cost.torch_,
                 lambda call: functools.partial(torch.permute_copy, dims=call.dims)),
    NaiveBackend(),
    TiledBackend(),
    VectorizedBackend(),
], sample=sample, replay=replay))
