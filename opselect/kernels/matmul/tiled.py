"""matmul's tiled backend: one program per (block_m x block_n) output tile, which walks all of k
in block_k steps (software-pipelined over num_stages shared-memory buffers); tiles in groups of
group_m row blocks, so that programs running together reuse each other's A and B in L2."""

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


@triton.jit
def _tiled_kernel(a, b, bias, c, M, N, K, sab, sam, sak, sbb, sbk, sbn, sbias,
                  block_m: tl.constexpr, block_n: tl.constexpr, block_k: tl.constexpr,
                  group_m: tl.constexpr, even_k: tl.constexpr, tf32: tl.constexpr,
                  has_bias: tl.constexpr, wide: tl.constexpr):
    # One grid dim for tiles and batch entries: the second and third take at most 65535.
    grid_m = tl.cdiv(M, block_m)
    grid_n = tl.cdiv(N, block_n)
    program = tl.program_id(0)
    batch = program // (grid_m * grid_n)
    if wide:
        batch = batch.to(tl.int64)
    pm, pn = tile_of(program % (grid_m * grid_n), grid_m, grid_n, group_m)
    rm = block_index(pm, block_m, wide)
    rn = block_index(pn, block_n, wide)
    acc = tile_product(a + batch * sab, b + batch * sbb, rm, rn, 0, K, M, N, sam, sak, sbk, sbn,
                       block_m, block_n, block_k, even_k, tf32)
    store_tile(c + batch * M * N, bias, acc, rm, rn, M, N, sbias, has_bias)


@dataclass(frozen=True, eq=False)
class TiledPlan:
    """One tiled launch (tiled_plan: one object per distinct launch, the Launcher's spec)."""

    dtype: torch.dtype  # of A, B and C
    ints: tuple  # the integer arguments (ints_of)
    block_m: int  # output rows per tile
    block_n: int  # output columns per tile
    block_k: int  # k per step of the loop
    group_m: int  # row blocks per group of the tile order
    even_k: bool  # k is a whole number of steps: no mask on k
    tf32: bool  # float32 products in tf32
    has_bias: bool
    wide: bool  # 64-bit offsets
    num_warps: int
    num_stages: int  # shared-memory buffers of the software pipeline
    tiles: int  # tiles per batch entry
    batch: int

    @property
    def grid(self) -> tuple[int]:
        return (self.tiles * self.batch,)


tiled_plan = functools.lru_cache(maxsize=4096)(TiledPlan)
_TILED = plan_launcher(_tiled_kernel, num_stages="num_stages")

CONFIG_KEYS = frozenset({"block_m", "block_n", "block_k", "group_m", "num_warps", "num_stages"})


def tile_configs(call: MatmulCall) -> list[dict]:
    """Tile shapes for the call's size, the heuristic pick first: 16-row tiles for decode-sized
    products (M <= 16: the weight is read once, at a tile narrow in n), 64 up to 64 rows, else
    128-row tiles; float32 halves block_k (the same bytes per step)."""
    f32 = call.dtype == torch.float32
    k = 32 if f32 else 64
    if call.m <= 16:
        cfgs = [(16, 64, 2 * k, 4, 4), (16, 128, 2 * k, 4, 4), (16, 32, 4 * k, 4, 4),
                (16, 64, 4 * k, 4, 3)]
    elif call.m <= 64:
        cfgs = [(64, 64, k, 4, 4), (64, 128, k, 4, 4), (32, 64, 2 * k, 4, 4), (64, 256, k, 8, 3)]
    else:
        cfgs = [(128, 128, k, 8, 3), (128, 256, k, 8, 3), (64, 128, k, 4, 4), (128, 64, k, 4, 4)]
    return [{"block_m": bm, "block_n": bn, "block_k": bk, "group_m": 8, "num_warps": w,
             "num_stages": s} for bm, bn, bk, w, s in cfgs]


class TiledBackend(MatmulBackend):
    name = "tiled"
    CONFIG_KEYS = CONFIG_KEYS
    estimate = staticmethod(cost.tiled)

    def configs(self, call: MatmulCall) -> list[dict]:
        return tile_configs(call)

    def make_plan(self, call: MatmulCall, config, sms: int) -> TiledPlan:
        self.check(config)
        bm, bn, bk = config["block_m"], config["block_n"], config["block_k"]
        return tiled_plan(call.dtype, ints_of(call), bm, bn, bk, config["group_m"],
                          call.k % bk == 0, call.tf32, call.bias is not None, wide_offsets(call),
                          config["num_warps"], config["num_stages"],
                          cdiv(call.m, bm) * cdiv(call.n, bn), call.batch)

    def launch(self, plan: TiledPlan, call: MatmulCall, a, b, bias, c) -> None:
        _TILED(plan, plan.grid, (a, b, bias, c, *plan.ints))

    def bound(self, plan: TiledPlan, call: MatmulCall):
        launch = _TILED.bind(plan, plan.grid, call.info.index)
        ints = plan.ints
        return lambda a, b, bias, c: launch(a, b, bias, c, *ints)
