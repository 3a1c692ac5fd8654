"""permute's vectorized backend: calls whose last dim stays in place copy contiguous runs."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ...heuristics import permute as cost
from .._common import Launcher, cdiv, needs_int64, next_pow2
from .call import MAX_DIMS, PermuteCall
from .common import (UNIT_DTYPES, _offset, _padded, _prepared_copy, _tiles_per_program,
                     _TritonBackend)


@triton.jit
def _runs_kernel(src, dst, R, L, n_cb,
                 n1, t1, n2, t2, n3, t3, n4, t4, n5, t5, n6, t6, n7, t7,
                 ND: tl.constexpr, ROWS: tl.constexpr, BLOCK_L: tl.constexpr,
                 TPP: tl.constexpr, EVEN_L: tl.constexpr, VEC: tl.constexpr,
                 I64: tl.constexpr):
    """R runs of L contiguous units: run r starts at input offset _offset(r) (outer dims n/t,
    innermost first) and output offset r * L. A tile is ROWS runs x BLOCK_L units; each program
    copies TPP consecutive tiles (column blocks fastest), TPP dividing the tile count."""
    pid = tl.program_id(0)
    for k in range(TPP):
        t = pid * TPP + k
        rb = t // n_cb
        cb = t - rb * n_cb
        if I64:
            rb = rb.to(tl.int64)
            cb = cb.to(tl.int64)
        r = rb * ROWS + tl.arange(0, ROWS)
        ok_r = r < R
        if ND == 0:
            row_in = r * 0
        else:
            row_in = _offset(r, n1, t1, n2, t2, n3, t3, n4, t4, n5, t5, n6, t6, n7, t7, 1, 0,
                             ND)
        # Every run starts at a multiple of VEC units (the host checked the strides): with it
        # the compiler emits 16-byte accesses even though the row offsets are data.
        row_in = tl.multiple_of(row_in, VEC)
        row_out = tl.multiple_of(r * L, VEC)
        c = cb * BLOCK_L + tl.arange(0, BLOCK_L)
        if EVEN_L:
            mask = ok_r[:, None]
        else:
            mask = ok_r[:, None] & (c < L)[None, :]
        v = tl.load(src + row_in[:, None] + c[None, :], mask=mask)
        tl.store(dst + row_out[:, None] + c[None, :], v, mask=mask)


@dataclass(frozen=True, eq=False)
class RunsPlan:
    """One vectorized launch (tiles of [rows x contiguous run]): the Launcher's spec and
    constexpr source (runs_plan: one object per distinct launch)."""

    dtype: torch.dtype  # of the elements
    ints: tuple  # every integer argument: rows, run length, run blocks, outer (size, stride)s
    dims: int  # ND: outer dims
    rows_per_tile: int  # ROWS
    run_block: int  # BLOCK_L: elements of a run per tile
    tiles_per_program: int  # TPP
    vector: int  # VEC: elements per vector access
    offsets_64bit: bool
    warps: int


runs_plan = functools.lru_cache(maxsize=4096)(RunsPlan)

_RUNS = Launcher(_runs_kernel, lambda p: dict(
    ND=p.dims, ROWS=p.rows_per_tile, BLOCK_L=p.run_block, TPP=p.tiles_per_program,
    EVEN_L=p.ints[1] % p.run_block == 0, VEC=p.vector, I64=p.offsets_64bit, num_warps=p.warps))


class VectorizedBackend(_TritonBackend):
    name = "vectorized"
    estimate = staticmethod(cost.vectorized)

    def supports(self, call: PermuteCall) -> str | None:
        if call.kind not in ("keep", "empty", "other"):
            return (f"the last dim moves ({call.kind}: simplified sizes {tuple(call.sizes)}, "
                    f"strides {tuple(call.strides)}); vectorized copies runs that stay contiguous")
        return super().supports(call)

    def configs(self, call: PermuteCall) -> list[dict]:
        big = call.numel * call.input.element_size() >= (64 << 20)
        return [{"TILE_BYTES": 16384, "num_warps": 4, "TPP": 2 if big else 1},
                {"TILE_BYTES": 32768, "num_warps": 8, "TPP": 1},
                {"TILE_BYTES": 8192, "num_warps": 4, "TPP": 4 if big else 2},
                {"TILE_BYTES": 16384, "num_warps": 8, "TPP": 1}]

    def _prepare(self, call: PermuteCall, config):
        unit, w = call.unit, call.W
        sizes, strides = call.sizes or [1], call.strides or [1]
        lu = sizes[-1] * w  # units per run
        rows = call.numel * call.input.element_size() // call.esize // sizes[-1]
        tile = max(1, config["TILE_BYTES"] // unit)
        block_l = min(next_pow2(lu), tile)
        low = lu & -lu
        if lu % block_l and low * unit >= 256:
            block_l = low  # whole column blocks: no column mask, full vectors
        block_r = max(1, min(tile // block_l, next_pow2(rows)))
        n_cb = cdiv(lu, block_l)
        n_tiles = cdiv(rows, block_r) * n_cb
        tpp = _tiles_per_program(config["TPP"], n_tiles)
        outer = list(zip(reversed(sizes[:-1]), (t * w for t in reversed(strides[:-1]))))
        ints = (rows, lu, n_cb, *_padded(outer, MAX_DIMS - 1))
        nd, warps = len(outer), config["num_warps"]
        i64 = needs_int64(rows * lu + tile, call.span * w + tile)
        plan = runs_plan(UNIT_DTYPES[unit], ints, nd, block_r, block_l, tpp, w, i64, warps)
        return _prepared_copy(call, _RUNS.bind(plan, (n_tiles // tpp,), call.info.index), ints)
