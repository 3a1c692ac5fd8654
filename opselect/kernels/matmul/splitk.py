"""matmul's splitk backend: k split over `split` programs per output tile, for products whose
tiles are too few to fill the GPU (a decode step's M of 1 to 16 rows times a weight) and whose k
is long. Each program writes its float32 partial tile to a workspace and counts itself in at
the tile's counter; the last to arrive adds the partials (from L2), adds the bias, rounds once
and stores the tile, then sets the counter back to 0 for the next launch. One launch, no
memset, and the sum's order is fixed (split 0, 1, ...), so the result is deterministic."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ...dispatch.signature import bucket
from ...heuristics import matmul as cost
from .._common import allocator, cdiv, per_stream, plan_launcher
from .call import MatmulCall
from .common import MatmulBackend, block_index, ints_of, store_tile, tile_of, tile_product, \
    wide_offsets

#: Counters per stream: a launch takes at most this many tiles (batch included).
MAX_TILES = 1 << 14
#: k up to this is too short to split (a bucket edge: 129 to 256 share a key)
MIN_K = 256


@triton.jit
def _splitk_kernel(a, b, bias, c, partials, counters, M, N, K, sab, sam, sak, sbb, sbk, sbn,
                   sbias, k_chunk,
                   block_m: tl.constexpr, block_n: tl.constexpr, block_k: tl.constexpr,
                   group_m: tl.constexpr, split: tl.constexpr, even_k: tl.constexpr,
                   tf32: tl.constexpr, has_bias: tl.constexpr, wide: tl.constexpr):
    tile = tl.program_id(0)
    part = tl.program_id(1)
    batch = tl.program_id(2)
    tiles = tl.num_programs(0)
    if wide:
        batch = batch.to(tl.int64)
    pm, pn = tile_of(tile, tl.cdiv(M, block_m), tl.cdiv(N, block_n), group_m)
    rm = block_index(pm, block_m, wide)
    rn = block_index(pn, block_n, wide)
    k_lo = part * k_chunk
    acc = tile_product(a + batch * sab, b + batch * sbb, rm, rn, k_lo,
                       tl.minimum(k_chunk, K - k_lo), M, N, sam, sak, sbk, sbn,
                       block_m, block_n, block_k, even_k, tf32)
    # The tile's partials lie together, each a dense block_m x block_n block (no masks).
    slot = batch * tiles + tile
    inner = tl.arange(0, block_m)[:, None] * block_n + tl.arange(0, block_n)[None, :]
    first = partials + slot * (split * block_m * block_n)
    tl.store(first + part * (block_m * block_n) + inner, acc)
    # Every thread's stores come before the count (the barrier), and the release of the
    # atomic publishes them to the program that counts last, whose acquire sees them all.
    tl.debug_barrier()
    arrived = tl.atomic_add(counters + slot, 1, sem="acq_rel")
    if arrived == split - 1:
        total = tl.zeros((block_m, block_n), dtype=tl.float32)
        for j in range(split):
            # (.cg: from L2, never a line this SM's L1 might hold from before)
            total += tl.load(first + j * (block_m * block_n) + inner, cache_modifier=".cg")
        tl.store(counters + slot, 0)
        store_tile(c + batch * M * N, bias, total, rm, rn, M, N, sbias, has_bias)


@dataclass(frozen=True, eq=False)
class SplitKPlan:
    """One split-k launch (splitk_plan: one object per distinct launch)."""

    dtype: torch.dtype  # of A, B and C
    ints: tuple  # the integer arguments (ints_of, then k_chunk)
    block_m: int
    block_n: int
    block_k: int
    group_m: int
    split: int  # programs per tile, each a k_chunk of k
    even_k: bool  # every chunk a whole number of steps
    tf32: bool
    has_bias: bool
    wide: bool
    num_warps: int
    num_stages: int
    tiles: int  # tiles per batch entry
    batch: int

    @property
    def grid(self) -> tuple[int, int, int]:
        return (self.tiles, self.split, self.batch)

    @property
    def partial_floats(self) -> int:
        return self.tiles * self.batch * self.split * self.block_m * self.block_n


splitk_plan = functools.lru_cache(maxsize=4096)(SplitKPlan)
_SPLITK = plan_launcher(_splitk_kernel, num_stages="num_stages")

CONFIG_KEYS = frozenset({"block_m", "block_n", "block_k", "group_m", "num_warps", "num_stages",
                         "split"})


def _counters(device) -> tuple:
    return (torch.zeros(MAX_TILES, dtype=torch.int32, device=device),)


_COUNTERS: dict = {}


def counters_of(device) -> torch.Tensor:
    """This stream's tile counters on the device (all 0 between launches)."""
    get = _COUNTERS.get(device)
    if get is None:
        get = _COUNTERS[device] = per_stream(device, functools.partial(_counters, device))
    return get()[0]


class SplitKBackend(MatmulBackend):
    name = "splitk"
    CONFIG_KEYS = CONFIG_KEYS
    estimate = staticmethod(cost.splitk)

    def supports(self, call: MatmulCall) -> str | None:
        # On the key's bucket edges (MatmulBackend): k up to 256 is one bucket, and the tile
        # count is that of the bucket's largest sizes.
        if call.k <= MIN_K:
            return f"k = {call.k}: too short to split (splitk takes k > {MIN_K})"
        most = cdiv(bucket(call.m), 16) * cdiv(bucket(call.n), 32) * bucket(call.batch)
        if most > MAX_TILES:
            return (f"{call.batch} x {call.m} x {call.n} outputs are more tiles than splitk's "
                    f"{MAX_TILES} counters (it is for products of few tiles)")
        return None

    def configs(self, call: MatmulCall) -> list[dict]:
        f32 = call.dtype == torch.float32
        k = 64 if f32 else 128
        if call.m <= 16:
            tiles = [(16, 32, k, 4, 4), (16, 64, k, 4, 4)]
        elif call.m <= 64:
            tiles = [(64, 64, k // 2, 4, 4), (32, 64, k, 4, 4)]
        else:
            tiles = [(128, 128, k // 2, 8, 3), (64, 128, k // 2, 4, 4)]
        cfgs = []
        for bm, bn, bk, w, s in tiles:
            count = cdiv(call.m, bm) * cdiv(call.n, bn) * call.batch
            if count > MAX_TILES:
                continue
            for split in self._splits(call, count, bk):
                cfgs.append({"block_m": bm, "block_n": bn, "block_k": bk, "group_m": 8,
                             "num_warps": w, "num_stages": s, "split": split})
        return cfgs or [{"block_m": 16, "block_n": 32, "block_k": k, "group_m": 8,
                         "num_warps": 4, "num_stages": 4, "split": 2}]

    @staticmethod
    def _splits(call: MatmulCall, tiles: int, block_k: int) -> list[int]:
        """Splits that bring the programs to about two per SM (the first is the pick), halved
        and doubled, each leaving every chunk at least two steps long."""
        steps = cdiv(call.k, block_k)
        want = max(2, min(32, cdiv(2 * call.info.sm_count, tiles)))
        picks = []
        for s in (want, want // 2, want * 2):
            s = min(s, max(2, steps // 2))
            if s >= 2 and s not in picks:
                picks.append(s)
        return picks

    def make_plan(self, call: MatmulCall, config, sms: int) -> SplitKPlan:
        self.check(config)
        bm, bn, bk, split = config["block_m"], config["block_n"], config["block_k"], \
            config["split"]
        # Chunks of whole steps: split * chunk covers k, the last chunk may be shorter.
        chunk = cdiv(cdiv(call.k, split), bk) * bk
        split = cdiv(call.k, chunk)  # (a split larger than k's steps leaves no empty chunk)
        return splitk_plan(call.dtype, (*ints_of(call), chunk), bm, bn, bk, config["group_m"],
                           split, call.k % bk == 0, call.tf32, call.bias is not None,
                           wide_offsets(call), config["num_warps"], config["num_stages"],
                           cdiv(call.m, bm) * cdiv(call.n, bn), call.batch)

    def launch(self, plan: SplitKPlan, call: MatmulCall, a, b, bias, c) -> None:
        partials = torch.empty(plan.partial_floats, dtype=torch.float32, device=c.device)
        _SPLITK(plan, plan.grid, (a, b, bias, c, partials, counters_of(c.device), *plan.ints))

    def bound(self, plan: SplitKPlan, call: MatmulCall):
        launch = _SPLITK.bind(plan, plan.grid, call.info.index)
        ints = plan.ints
        new_partials = allocator((plan.partial_floats,), torch.float32, call.a.device)
        device = call.a.device

        def run(a, b, bias, c):
            launch(a, b, bias, c, new_partials(), counters_of(device), *ints)

        return run
