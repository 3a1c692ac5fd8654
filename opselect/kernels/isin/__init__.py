"""isin: is each element of `elements` among `test_elements`?

Six algorithms, with M = elements.numel() and N = test_elements.numel():

  torch    torch.isin (N passes over the elements when N is small, several sorts otherwise)
  compare  every element against every test element, one fused kernel: O(M * N), wins for tiny N
  search   sort the test elements, then a branchless lower-bound search per element:
           log2(N) dependent loads each
  hash     an open-addressing hash set of the test elements built with atomic compare-and-swap,
           then one probe (about 1.5 loads) per element; a table of up to LOCAL_TABLE_BYTES is held
           on chip by every program (gathers from shared memory), larger ones are read through L2
  bitmap   integers: one bit per value from the test set's minimum up, set with atomic or; one bit
           test per element. 8/16-bit integers use their whole range; wider ones measure min and
           max on the device and, when the range exceeds the bitmap's capacity (32 bits per test
           element, at most BITMAP_MAX_BITS), the same kernels use the hash set instead. The choice
           is made on the device: no host sync.
  cuckoo   test sets of up to 16,384 values: a cuckoo hash table (each key in one of its two
           slots, L1 holds up to 4,096 keys' table), built with atomic exchanges; a lookup reads
           one slot, or two, no loop

Semantics are torch's: NaN is never a member, -0.0 equals 0.0, a subnormal is itself. The kernels
compare integer keys made from a value's bits, never floats (_value_key): float compares may flush
subnormals to zero (a GPU's flush-to-zero modes; Triton's interpreter converts bfloat16 subnormals
to 0.0), which made 0.0 a member of a test set holding only a subnormal. The key keeps the values'
order, so a test set sorted as floats is sorted as keys too."""

from __future__ import annotations

import functools

import torch

from ...dispatch.backend import TorchBackend
from ...dispatch.op import Op, register
from ...heuristics import isin as cost
from .bitmap import BitmapBackend, bitmap_capacity
from .call import _SUPPORTED, SUPPORTED_DTYPES, IsinCall, _torch_isin, prepare, replay, sample
from .compare import CompareBackend
from .cuckoo import CuckooBackend
from .hash import HashBackend
from .search import SearchBackend


# What other modules use (ops, routing, library, transforms, warm, tests).
__all__ = ["OP", "IsinCall", "SUPPORTED_DTYPES", "_SUPPORTED", "prepare", "sample", "replay",
           "bitmap_capacity", "CompareBackend", "SearchBackend", "HashBackend", "CuckooBackend",
           "BitmapBackend"]

OP = register(Op("isin", prepare, [
    TorchBackend(_torch_isin, cost.torch_, lambda call: functools.partial(
        torch.isin, assume_unique=call.assume_unique, invert=call.invert)),
    CompareBackend(),
    SearchBackend(),
    HashBackend(),
    CuckooBackend(),
    BitmapBackend(),
], sample=sample, replay=replay, calibration=[
    ([[1 << 22], [32]], torch.int32, {}),
    ([[1 << 22], [1024]], torch.int32, {}),
    ([[1 << 24], [1 << 16]], torch.int32, {}),
    ([[1 << 24], [1 << 20]], torch.int64, {}),
    ([[1 << 22], [1 << 20]], torch.float32, {"values": "narrow"}),
]))
