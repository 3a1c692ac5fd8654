"""permute's vectorized backend: calls whose last dim stays in place copy contiguous runs."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ...heuristics import permute as cost
from .._common import cdiv, needs_int64, next_pow2
from .call import MAX_DIMS, PermuteCall
from .common import (UNIT_DTYPES, _offset, _padded, _prepared_copy, _tiles_per_program,
                     _TritonBackend, plan_launcher, check_config)


@triton.jit
def _runs_kernel(src, dst, R, L, n_cb,
                 n1, t1, n2, t2, n3, t3, n4, t4, n5, t5, n6, t6, n7, t7,
                 dims: tl.constexpr, rows_per_tile: tl.constexpr, run_block: tl.constexpr,
                 tiles_per_program: tl.constexpr, even_run: tl.constexpr, vector: tl.constexpr,
                 offsets_64bit: tl.constexpr):
    """R runs of L contiguous units: run r starts at input offset _offset(r) (outer dims n/t,
    innermost first) and output offset r * L. A tile is rows_per_tile runs x run_block units;
    each program copies tiles_per_program consecutive tiles (column blocks fastest), a divisor of
    the tile count."""
    pid = tl.program_id(0)
    for k in range(tiles_per_program):
        t = pid * tiles_per_program + k
        rb = t // n_cb
        cb = t - rb * n_cb
        if offsets_64bit:
            rb = rb.to(tl.int64)
            cb = cb.to(tl.int64)
        r = rb * rows_per_tile + tl.arange(0, rows_per_tile)
        ok_r = r < R
        if dims == 0:
            row_in = r * 0
        else:
            row_in = _offset(r, n1, t1, n2, t2, n3, t3, n4, t4, n5, t5, n6, t6, n7, t7, 1, 0,
                             dims)
        # Every run starts at a multiple of vector units (the host checked the strides): with it
        # the compiler emits 16-byte accesses even though the row offsets are data.
        row_in = tl.multiple_of(row_in, vector)
        row_out = tl.multiple_of(r * L, vector)
        c = cb * run_block + tl.arange(0, run_block)
        if even_run:
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
    dims: int  # outer dims
    rows_per_tile: int
    run_block: int  # elements of a run per tile
    tiles_per_program: int
    even_run: bool  # run_block divides the run: no column mask
    vector: int  # elements per vector access
    offsets_64bit: bool
    num_warps: int

    @property
    def grid(self) -> tuple[int]:
        """A program per tiles_per_program tiles (which divides the tiles): tiles of
        rows_per_tile rows times the run's blocks."""
        rows, _, run_blocks = self.ints[:3]
        return (cdiv(rows, self.rows_per_tile) * run_blocks // self.tiles_per_program,)


runs_plan = functools.lru_cache(maxsize=4096)(RunsPlan)

_RUNS = plan_launcher(_runs_kernel)

#: The keys of a vectorized config: tile_bytes (bytes a tile holds), tiles_per_program (the most
#: a program takes: the plan's is the largest power of two up to it that divides the tiles).
CONFIG_KEYS = frozenset({"tile_bytes", "tiles_per_program", "num_warps"})


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
        return [{"tile_bytes": 16384, "num_warps": 4, "tiles_per_program": 2 if big else 1},
                {"tile_bytes": 32768, "num_warps": 8, "tiles_per_program": 1},
                {"tile_bytes": 8192, "num_warps": 4, "tiles_per_program": 4 if big else 2},
                {"tile_bytes": 16384, "num_warps": 8, "tiles_per_program": 1}]

    def make_plan(self, call: PermuteCall, config, sms: int) -> RunsPlan:
        check_config(f"permute {self.name}", config, CONFIG_KEYS)
        unit, w = call.unit, call.W
        sizes, strides = call.sizes or [1], call.strides or [1]
        lu = sizes[-1] * w  # units per run
        rows = call.numel * call.input.element_size() // call.esize // sizes[-1]
        tile = max(1, config["tile_bytes"] // unit)
        block_l = min(next_pow2(lu), tile)
        low = lu & -lu
        if lu % block_l and low * unit >= 256:
            block_l = low  # whole column blocks: no column mask, full vectors
        block_r = max(1, min(tile // block_l, next_pow2(rows)))
        n_cb = cdiv(lu, block_l)
        n_tiles = cdiv(rows, block_r) * n_cb
        tpp = _tiles_per_program(config["tiles_per_program"], n_tiles)
        outer = list(zip(reversed(sizes[:-1]), (t * w for t in reversed(strides[:-1]))))
        ints = (rows, lu, n_cb, *_padded(outer, MAX_DIMS - 1))
        nd, warps = len(outer), config["num_warps"]
        i64 = needs_int64(rows * lu + tile, call.span * w + tile)
        return runs_plan(UNIT_DTYPES[unit], ints, nd, block_r, block_l, tpp, lu % block_l == 0, w,
                         i64, warps)

    def _prepared(self, plan: RunsPlan, call: PermuteCall):
        return _prepared_copy(call, _RUNS.bind(plan, plan.grid, call.info.index), plan.ints)
