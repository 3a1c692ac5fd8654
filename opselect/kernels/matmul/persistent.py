"""matmul's persistent backend: as many programs as fit on the GPU at once (programs_per_sm per
SM), each walking the output tiles with a stride of the grid: no tail of half-empty waves and no
launch of a program per tile; the order within the walk is the grouped order of tiled, so the
programs running at once still share their rows of A and columns of B in L2."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ...heuristics import matmul as cost
from .._common import cdiv, plan_launcher
from .call import MatmulCall
from .common import MatmulBackend, block_index, ints_of, store_tile, tile_of, tile_product, \
    wide_offsets
from .tiled import tile_configs


@triton.jit
def _persistent_kernel(a, b, bias, c, M, N, K, sab, sam, sak, sbb, sbk, sbn, sbias, batches,
                       block_m: tl.constexpr, block_n: tl.constexpr, block_k: tl.constexpr,
                       group_m: tl.constexpr, even_k: tl.constexpr, tf32: tl.constexpr,
                       has_bias: tl.constexpr, wide: tl.constexpr):
    grid_m = tl.cdiv(M, block_m)
    grid_n = tl.cdiv(N, block_n)
    per_batch = grid_m * grid_n
    total = per_batch * batches
    for tile in range(tl.program_id(0), total, tl.num_programs(0)):
        entry = tile // per_batch
        if wide:
            entry = entry.to(tl.int64)
        pm, pn = tile_of(tile % per_batch, grid_m, grid_n, group_m)
        rm = block_index(pm, block_m, wide)
        rn = block_index(pn, block_n, wide)
        acc = tile_product(a + entry * sab, b + entry * sbb, rm, rn, 0, K, M, N, sam, sak, sbk,
                           sbn, block_m, block_n, block_k, even_k, tf32)
        store_tile(c + entry * M * N, bias, acc, rm, rn, M, N, sbias, has_bias)


@dataclass(frozen=True, eq=False)
class PersistentPlan:
    """One persistent launch (persistent_plan: one object per distinct launch)."""

    dtype: torch.dtype  # of A, B and C
    ints: tuple  # the integer arguments (ints_of, then the batch count)
    block_m: int
    block_n: int
    block_k: int
    group_m: int
    even_k: bool
    tf32: bool
    has_bias: bool
    wide: bool
    num_warps: int
    num_stages: int
    programs: int  # the grid: programs_per_sm per SM, or one per tile when there are fewer
    tiles: int  # output tiles in all (the batch's included)


persistent_plan = functools.lru_cache(maxsize=4096)(PersistentPlan)
_PERSISTENT = plan_launcher(_persistent_kernel, num_stages="num_stages")

CONFIG_KEYS = frozenset({"block_m", "block_n", "block_k", "group_m", "num_warps", "num_stages",
                         "programs_per_sm"})


class PersistentBackend(MatmulBackend):
    name = "persistent"
    CONFIG_KEYS = CONFIG_KEYS
    estimate = staticmethod(cost.persistent)

    def configs(self, call: MatmulCall) -> list[dict]:
        # tiled's first three tile shapes (tuning time: each config is a compile), one
        # program per SM for large tiles (they fill its shared memory), else two to an SM.
        cfgs = []
        for cfg in tile_configs(call)[:3]:
            per_sm = 1 if cfg["block_m"] * cfg["block_n"] >= 128 * 128 else 2
            cfgs.append({**cfg, "programs_per_sm": per_sm})
        return cfgs

    def make_plan(self, call: MatmulCall, config, sms: int) -> PersistentPlan:
        self.check(config)
        bm, bn, bk = config["block_m"], config["block_n"], config["block_k"]
        tiles = cdiv(call.m, bm) * cdiv(call.n, bn) * call.batch
        programs = max(1, min(tiles, sms * config["programs_per_sm"]))
        return persistent_plan(call.dtype, (*ints_of(call), call.batch), bm, bn, bk,
                               config["group_m"], call.k % bk == 0, call.tf32,
                               call.bias is not None, wide_offsets(call), config["num_warps"],
                               config["num_stages"], programs, tiles)

    def launch(self, plan: PersistentPlan, call: MatmulCall, a, b, bias, c) -> None:
        _PERSISTENT(plan, (plan.programs,), (a, b, bias, c, *plan.ints))

    def bound(self, plan: PersistentPlan, call: MatmulCall):
        launch = _PERSISTENT.bind(plan, (plan.programs,), call.info.index)
        ints = plan.ints
        return lambda a, b, bias, c: launch(a, b, bias, c, *ints)
