"""topk: the k largest (or smallest) values along one dim and their indices, as torch.topk.

Seven algorithms; a call is seen as R rows of N elements (the dim moved last) and k per row:

  torch    torch.topk (ATen: a radix select per slice, or a full sort for <= 10 long slices)
  radix    a radix select on order-preserving integer keys that reads the data once, with no
           host sync and, on the GPU, in one launch:
             sample     each row draws positions of a Weyl sequence (spread evenly over the row
                        for every period); each sample block keeps its top keys
             threshold  every program of the row derives the same T = the m-th largest sampled
                        key, with m = mu + 5 sqrt(mu) + 5 for mu = k S / N: at least k keys reach
                        T unless the sample is off by five standard deviations, yet only about
                        m N / S do (a few thousand for k <= 1024)
             filter     the programs stream their chunks of the row once: keys > T are appended
                        to the row's survivor buffer (one atomic per tile that has any, ranks by
                        cumsum), keys == T to a tie buffer of at most k
             finish     the last program of the row (a ticket) selects from the survivors: digit
                        by digit from the top, two bits a step (three counts per step, one
                        reduction), it finds the k-th key, takes every key above it and enough
                        ties, and sorts just those k in registers (key and index in one int64;
                        k <= 1024, larger k and 64-bit keys are sorted by torch.sort after)
           The same 4-ary search finds each sample block's top and the threshold, so the only
           sorting network compiled is the winners' (each constexpr is a compiled variant of a
           big kernel, 5-15 s of compiling: sizes are quantised to few values).
           The threshold stands in for the histogram of the top digit: Triton has no shared-
           memory atomics, and tl.histogram costs about a hundred instructions per element for
           256 bins (ballots, popcounts), several times a pass's memory time, so histograms are
           built only over survivors (as counts), never over the row. If the sample was off
           (fewer than k keys reach T, or more survivors than the buffer holds), the finisher
           selects from the whole row: always correct, only slow, and rare by construction.
           Launch shapes: `coop` (rows fewer than SMs): several programs per row in one launch,
           which wait for each other once, after sampling, so the grid is kept to one program per
           SM; `split`: the same in two launches (samples first) where programs may not wait
           (the interpreter, OPSELECT_TOPK_COOP=0); `fused` (as many rows as SMs or more): one
           program per row does everything; `direct` (rows of one tile): select from the row.
  tournament  per chunk, the maxima of groups of a few elements cut the chunk to its 2k hot groups,
           read again in pieces; the last program of a shared row merges the chunks' winners
           (small k). One launch, or two (config apart: the pass, then the selection)
  maxima   one cut for a whole row from supergroup maxima: launch 1 reads the row once (group
           and supergroup maxima, no search, no wait), launch 2 gathers the groups that reach
           the cut and the row's programs rank the ~1.2 k candidates into place together
           (long rows, k <= 1024; see _maxima_select_kernel)
  argmax   k = 1: each lane keeps the best key it has read and its first place, one read of the
           rows in one launch; rows fewer than SMs are split over programs, the row's last
           program (a ticket) merges their parts (greedy decoding, argmax / argmin)
  sort     torch.sort of each row, then the first k: wins when k is a large part of the row
  bitonic  rows of up to 16384 elements are loaded once; key and index are packed in one int64
           and tl.topk (a bitonic top-k network) or tl.sort runs in registers: many short rows

Semantics are torch's: NaN is larger than every number (every NaN gets one key above +inf),
-0.0 equals 0.0 (one key), ties may return any of the tied indices but values are exactly
torch's (they are read back from the input at the returned indices)."""

from __future__ import annotations

import functools

import torch

from ...dispatch.backend import TorchBackend
from ...dispatch.op import Op, register
from ...heuristics import topk as cost
from .argmax import ArgmaxBackend
from .bitonic import BitonicBackend
from .call import SUPPORTED_DTYPES, TopkCall, _torch_topk, prepare, replay, sample
from .maxima import MaximaBackend
from .radix import RadixBackend
from .sort import SortBackend
from .tournament import TournamentBackend


# What other modules use (ops, routing, library, transforms, tests, benchmarks).
__all__ = ["OP", "TopkCall", "SUPPORTED_DTYPES", "prepare", "sample", "replay", "RadixBackend",
           "TournamentBackend", "MaximaBackend", "ArgmaxBackend", "SortBackend", "BitonicBackend"]


OP = register(Op("topk", prepare, [
    TorchBackend(_torch_topk, cost.torch_, lambda call: functools.partial(
        torch.topk, k=call.k, dim=call.dim, largest=call.largest, sorted=call.sorted)),
    RadixBackend(),
    TournamentBackend(),
    MaximaBackend(),
    ArgmaxBackend(),
    SortBackend(),
    BitonicBackend(),
], sample=sample, replay=replay, calibration=[
    ([[1 << 24]], torch.float32, {"k": 1024}),
    ([[64, 128000]], torch.float32, {"k": 50}),
    ([[4096, 32000]], torch.bfloat16, {"k": 50}),
    ([[4096, 256]], torch.float32, {"k": 8}),
    ([[16, 1 << 20]], torch.float32, {"k": 2048}),
    ([[1 << 20]], torch.float32, {"k": 1 << 17}),
]))
