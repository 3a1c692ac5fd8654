"""permute's tiled backend: a tiled transpose through shared memory (and a narrow variant for
a moving dim of few elements)."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ...heuristics import permute as cost
from .._common import cdiv, needs_int64, next_pow2
from .call import MAX_DIMS, PermuteCall
from .common import (UNIT_DTYPES, _prepared_copy, _tiles_per_program, _TritonBackend,
                     plan_launcher, check_config)


#: Batch dims of the tiled kernel: MAX_DIMS minus one dim each for groups A and B.
MAX_BATCH = MAX_DIMS - 2


#: Groups A (input-contiguous) and B (output-contiguous) of the tiled kernel grow until they hold
#: this many elements (whole cache lines along a tile edge), taking at most GROUP_DIMS dims each.
GROUP_TARGET = 128


GROUP_DIMS = 3


#: The narrow variant of the tiled kernel takes groups of at most this many elements.
NARROW_MAX = 15


@triton.jit
def _offset3(i, n0, t0, n1, t1, t2, dims: tl.constexpr):
    """_offset for the at most 3 dims of a tiled kernel's group (the last size is implicit)."""
    if dims == 1:
        off = i * t0
    elif dims == 2:
        q = i // n0
        off = (i - q * n0) * t0 + q * t1
    else:
        q = i // n0
        off = (i - q * n0) * t0
        q2 = q // n1
        off += (q - q2 * n1) * t1 + q2 * t2
    return off


@triton.jit
def _batch_offsets(bat, c0, i0, o0, c1, i1, o1, c2, i2, o2, c3, i3, o3, c4, i4, o4, c5, i5, o5,
                   batch_dims: tl.constexpr):
    """(input offset, output offset) of the scalar batch index `bat` over batch_dims dims (innermost
    first): once per tile, so a few scalar divisions are nothing next to the tile's traffic."""
    off_in = bat * 0
    off_out = bat * 0
    rem = bat
    if batch_dims > 0:
        q = rem // c0
        off_in += (rem - q * c0) * i0
        off_out += (rem - q * c0) * o0
        rem = q
    if batch_dims > 1:
        q = rem // c1
        off_in += (rem - q * c1) * i1
        off_out += (rem - q * c1) * o1
        rem = q
    if batch_dims > 2:
        q = rem // c2
        off_in += (rem - q * c2) * i2
        off_out += (rem - q * c2) * o2
        rem = q
    if batch_dims > 3:
        q = rem // c3
        off_in += (rem - q * c3) * i3
        off_out += (rem - q * c3) * o3
        rem = q
    if batch_dims > 4:
        q = rem // c4
        off_in += (rem - q * c4) * i4
        off_out += (rem - q * c4) * o4
        rem = q
    if batch_dims > 5:
        q = rem // c5
        off_in += (rem - q * c5) * i5
        off_out += (rem - q * c5) * o5
    return off_in, off_out


@triton.jit
def _tiled_kernel(src, dst, A, B, n_ta, n_tb,
                  a0, oa0, a1, oa1, oa2,
                  b0, ib0, b1, ib1, ib2,
                  c0, i0, o0, c1, i1, o1, c2, i2, o2, c3, i3, o3, c4, i4, o4, c5, i5, o5,
                  a_dims: tl.constexpr, b_dims: tl.constexpr, batch_dims: tl.constexpr,
                  a_block: tl.constexpr, b_block: tl.constexpr, unit_width: tl.constexpr,
                  tiles_per_program: tl.constexpr, even_a: tl.constexpr, even_b: tl.constexpr,
                  offsets_64bit: tl.constexpr):
    """out[batch, a, b] = in[batch, a, b] where group A (index a) is contiguous in the input and
    group B (index b) is contiguous in the output: a's input offset is a itself and b's output
    offset is b itself, so a tile [b_block, a_block] is loaded with a fastest (coalesced,
    vectorised) and its transpose [a_block, b_block] stored with b fastest; the layout change
    goes through shared memory. The cross terms (a's output offset, b's input offset) are
    per-row vectors of a_block and b_block offsets, computed once per tile. Elements are
    unit_width units; offsets below are in elements and the fast axes are flattened to
    a_block * unit_width and b_block * unit_width units so both accesses stay plain 2-D. Each
    program moves tiles_per_program consecutive tiles (B fastest), a divisor of the tile count."""
    pid = tl.program_id(0)
    for k in range(tiles_per_program):
        t = pid * tiles_per_program + k
        tb = t % n_tb
        q = t // n_tb
        ta = q % n_ta
        bat = q // n_ta
        if offsets_64bit:
            tb = tb.to(tl.int64)
            ta = ta.to(tl.int64)
            bat = bat.to(tl.int64)
        base_in, base_out = _batch_offsets(bat, c0, i0, o0, c1, i1, o1, c2, i2, o2, c3, i3, o3,
                                           c4, i4, o4, c5, i5, o5, batch_dims)
        a = ta * a_block + tl.arange(0, a_block)
        b = tb * b_block + tl.arange(0, b_block)
        # Units along the fast axes: element a covers units a * unit_width and the next
        # unit_width - 1.
        au = ta * (a_block * unit_width) + tl.arange(0, a_block * unit_width)
        bu = tb * (b_block * unit_width) + tl.arange(0, b_block * unit_width)
        b_in = base_in + _offset3(b, b0, ib0, b1, ib1, ib2, b_dims)   # input offsets of rows b
        a_out = base_out + _offset3(a, a0, oa0, a1, oa1, oa2, a_dims)  # output offsets of rows a
        # Masks only where a group does not divide into whole tiles: an all-true splat keeps
        # the accesses vectorised, and the fully even case needs none at all.
        if even_a:
            ok_a = tl.full([a_block], 1, tl.int1)
            ok_au = tl.full([a_block * unit_width], 1, tl.int1)
        else:
            ok_a = a < A
            ok_au = au < A * unit_width
        if even_b:
            ok_b = tl.full([b_block], 1, tl.int1)
            ok_bu = tl.full([b_block * unit_width], 1, tl.int1)
        else:
            ok_b = b < B
            ok_bu = bu < B * unit_width
        src_ptr = src + (b_in * unit_width)[:, None] + au[None, :]  # [b_block, a units], a fastest
        dst_ptr = dst + (a_out * unit_width)[:, None] + bu[None, :]  # [a_block, b units], b fastest
        if even_a and even_b:
            x = tl.load(src_ptr)
        else:
            x = tl.load(src_ptr, mask=ok_b[:, None] & ok_au[None, :])
        if unit_width == 1:
            y = tl.trans(x)
        else:
            y = tl.reshape(tl.permute(tl.reshape(x, (b_block, a_block, unit_width)), (1, 0, 2)),
                           (a_block, b_block * unit_width))
        if even_a and even_b:
            tl.store(dst_ptr, y)
        else:
            tl.store(dst_ptr, y, mask=ok_a[:, None] & ok_bu[None, :])


@triton.jit
def _narrow_kernel(src, dst, M, n_tm,
                   g0, s0, g1, s1, s2,
                   c0, i0, o0, c1, i1, o1, c2, i2, o2, c3, i3, o3, c4, i4, o4, c5, i5, o5,
                   narrow: tl.constexpr, narrow_padded: tl.constexpr, group_dims: tl.constexpr,
                   batch_dims: tl.constexpr, wide_block: tl.constexpr,
                   tiles_per_program: tl.constexpr, narrow_in: tl.constexpr,
                   offsets_64bit: tl.constexpr):
    """The tiled copy when one group has only `narrow` < 16 bytes of elements (3 colour
    channels) and its partner's rows lie back to back on that side, so a tile's
    narrow * wide_block elements there form one contiguous chunk. That chunk is moved flat, 16
    bytes a lane, and tl.gather (through shared memory) converts between it and the
    [narrow_padded, wide_block] tile of the other side, which has wide_block-long rows:

      narrow_in   input  chunk[i * narrow + j]  <->  output row j (group A index), column i (B)
      not         output chunk[i * narrow + j]  <->  input  row j (group B index), column i (A)

    The narrow group's dims (g sizes, s strides on the tile side) give each row's offset; M is
    the wide group's size; narrow and narrow_padded = next_pow2(narrow) are compile-time, so
    i * narrow + j is cheap."""
    pid = tl.program_id(0)
    for k in range(tiles_per_program):
        t = pid * tiles_per_program + k
        tm = t % n_tm
        bat = t // n_tm
        if offsets_64bit:
            tm = tm.to(tl.int64)
            bat = bat.to(tl.int64)
        base_in, base_out = _batch_offsets(bat, c0, i0, o0, c1, i1, o1, c2, i2, o2, c3, i3, o3,
                                           c4, i4, o4, c5, i5, o5, batch_dims)
        m0 = tm * wide_block
        rows = tl.minimum(M - m0, wide_block)  # wide-group elements in this tile
        j = tl.arange(0, narrow_padded)
        i = tl.arange(0, wide_block)
        row_off = _offset3(j, g0, s0, g1, s1, s2, group_dims)  # offsets of the narrow rows
        flat = tl.arange(0, narrow_padded * wide_block)
        # Position in the flat chunk of tile element (j, i), clamped for the padding rows
        # j >= narrow.
        idx = tl.minimum(i[None, :] * narrow + j[:, None], narrow_padded * wide_block - 1)
        ok = (j[:, None] < narrow) & (i[None, :] < rows)
        if narrow_in:
            chunk = tl.load(src + base_in + m0 * narrow + flat, mask=flat < rows * narrow)
            tile = tl.reshape(tl.gather(chunk, tl.reshape(idx, (narrow_padded * wide_block,)), 0),
                              (narrow_padded, wide_block))
            tl.store(dst + base_out + row_off[:, None] + (m0 + i)[None, :], tile, mask=ok)
        else:
            tile = tl.load(src + base_in + row_off[:, None] + (m0 + i)[None, :], mask=ok)
            # Output element f = i * narrow + j holds tile[j, i], at tile position
            # j * wide_block + i.
            fi = flat // narrow
            fj = flat - fi * narrow
            pos = tl.minimum(fj * wide_block + fi, narrow_padded * wide_block - 1)
            chunk = tl.gather(tl.reshape(tile, (narrow_padded * wide_block,)), pos, 0)
            tl.store(dst + base_out + m0 * narrow + flat, chunk, mask=flat < rows * narrow)


@dataclass(frozen=True, eq=False)
class TiledLaunchPlan:
    """One tiled launch (tiles of [a_block x b_block] over the two groups of dims that swap): the
    Launcher's spec and constexpr source (tiled_launch_plan: one object per distinct launch)."""

    dtype: torch.dtype  # of the units moved
    ints: tuple  # every integer argument: A, B, tile counts, each group's (size, stride)s, batch
    a_dims: int  # dims of group A
    b_dims: int  # dims of group B
    batch_dims: int
    a_block: int  # elements of A per tile
    b_block: int  # elements of B per tile
    unit_width: int  # units per element
    tiles_per_program: int
    even_a: bool  # a_block divides A: no mask along A
    even_b: bool  # b_block divides B
    offsets_64bit: bool
    num_warps: int


@dataclass(frozen=True, eq=False)
class NarrowLaunchPlan:
    """One narrow-tile launch (a short group of dims against a long one)."""

    dtype: torch.dtype
    ints: tuple  # the wide group's length, its tile count, the group's (size, stride)s, batch
    narrow: int  # length of the narrow group
    narrow_padded: int  # narrow padded to a power of two
    group_dims: int  # dims of the narrow group
    batch_dims: int
    wide_block: int  # elements of the wide group per tile
    tiles_per_program: int
    narrow_in: bool  # the narrow group is the input's innermost
    offsets_64bit: bool
    num_warps: int


tiled_launch_plan = functools.lru_cache(maxsize=4096)(TiledLaunchPlan)
narrow_launch_plan = functools.lru_cache(maxsize=4096)(NarrowLaunchPlan)

_TILED = plan_launcher(_tiled_kernel)
_NARROW = plan_launcher(_narrow_kernel)

#: The keys of a tiled config: the square tile's a_block x b_block (preferred edges, clamped to
#: the groups), or narrow with tile_bytes (the narrow kernel's tile); tiles_per_program (the most
#: a program takes) and num_warps for both.
CONFIG_KEYS = frozenset({"a_block", "b_block", "narrow", "tile_bytes", "tiles_per_program",
                         "num_warps"})


class TilePlan:
    """Groups of the tiled kernel for one call: A (input-contiguous dims, innermost first, with
    their output strides), B (output-contiguous dims, innermost first, with their input
    strides) and the batch dims (innermost first, with input and output strides)."""

    __slots__ = ("w", "A", "B", "a_dims", "b_dims", "batch", "n_batch", "narrow")

    def __init__(self, w: int, sizes: list[int], strides: list[int]):
        k = len(sizes)
        ostr = [1] * k
        for d in range(k - 2, -1, -1):
            ostr[d] = ostr[d + 1] * sizes[d + 1]
        p = strides.index(1)
        a_dims, b_dims = [p], [k - 1]
        used = {p, k - 1}
        A, B = sizes[p], sizes[k - 1]
        grown = True
        while grown:
            grown = False
            if A < GROUP_TARGET and len(a_dims) < GROUP_DIMS:
                # The next input dim outwards: its stride is the product of A's sizes.
                q = next((q for q in range(k) if q not in used and strides[q] == A), None)
                if q is not None:
                    a_dims.append(q)
                    used.add(q)
                    A *= sizes[q]
                    grown = True
            if B < GROUP_TARGET and len(b_dims) < GROUP_DIMS:
                q = k - 1 - len(b_dims)  # the next output dim inwards
                if q >= 0 and q not in used:
                    b_dims.append(q)
                    used.add(q)
                    B *= sizes[q]
                    grown = True
        self.w, self.A, self.B = w, A, B
        self.a_dims = [(sizes[d], ostr[d]) for d in a_dims]
        self.b_dims = [(sizes[d], strides[d]) for d in b_dims]
        self.batch = [(sizes[d], strides[d], ostr[d]) for d in range(k - 1, -1, -1)
                      if d not in used]
        self.n_batch = math.prod(s for s, _, _ in self.batch)
        self.narrow = None

    def find_narrow(self, elem: int) -> None:
        """Which side (if any) the narrow kernel serves: a group of fewer than 16 bytes whose
        partner group continues it in memory on that side (so the tile's chunk is contiguous)."""
        def chained(n: int, dims: list[tuple[int, int]]) -> bool:
            for size, stride in dims:
                if stride != n:
                    return False
                n *= size
            return True

        if self.w != 1:
            return
        a_ok = self.A * elem < 16 and self.A <= NARROW_MAX and chained(self.A, self.b_dims)
        b_ok = self.B * elem < 16 and self.B <= NARROW_MAX and chained(self.B, self.a_dims)
        if a_ok and (not b_ok or self.A <= self.B):
            self.narrow = "in"
        elif b_ok:
            self.narrow = "out"

    def group_args(self, dims: list[tuple[int, int]]) -> list[int]:
        """(n0, t0, n1, t1, t2) for _offset3."""
        (n0, t0), (n1, t1), (_, t2) = (dims + [(1, 0)] * 3)[:3]
        return [n0, t0, n1, t1, t2]


def _plan(call: PermuteCall) -> TilePlan:
    box = call._plan  # one per geometry, shared by its calls (call.py's _geometry)
    plan = box[0]
    if plan is None:
        w, sizes, strides = call.tile
        plan = TilePlan(w, sizes, strides)
        plan.find_narrow(call.unit * w)
        box[0] = plan
    return plan


#: Tile edges (elements along A, along B) by element bytes: 64-byte rows along A and 128-byte
#: rows along B at the least, 8 to 16 KB a tile (the layout change goes through as much shared
#: memory). Bytes take 64 x 128, not 128 x 128: the 128 x 128 byte tile of 4 warps puts 128
#: bytes on a thread and ran slower on every byte call of a sweep of all configs, many times
#: slower where a group spans several dims, while 64 x 128 stayed within 5% of the best
#: (benchmarks/results/h200/fits/permute.md, "tiled: TILE_EDGES").
TILE_EDGES = {1: (64, 128), 2: (64, 128), 4: (64, 64), 8: (32, 64), 16: (32, 32), 32: (16, 32)}


@dataclass(frozen=True, eq=False)
class TiledPlan:
    """A tiled launch of one call under one config: what it moves per tile (the cost model's
    input) and the launch itself (its spec, grid and integer arguments)."""

    geometry: TilePlan  # the call's two groups (A along the input, B along the output) and batch
    narrow: bool  # the narrow kernel (a group of under 16 bytes) rather than the square tile
    a_block: int  # square tile: elements along A (clamped to the group, see tile_shape)
    b_block: int  # square tile: elements along B
    narrow_padded: int  # narrow kernel: the short group's length rounded up to a power of two
    wide_block: int  # narrow kernel: elements of the long group per tile
    launch: TiledLaunchPlan | NarrowLaunchPlan  # the Launcher's spec (_NARROW's when narrow)
    grid: tuple[int]  # a program per tiles_per_program tiles


class TiledBackend(_TritonBackend):
    name = "tiled"
    estimate = staticmethod(cost.tiled)

    def make_plan(self, call: PermuteCall, config, sms: int) -> TiledPlan | None:
        if call.tile is None:  # nothing to tile (an empty call, or one torch answers)
            return None
        check_config(f"permute {self.name}", config, CONFIG_KEYS)
        geometry = _plan(call)
        batch = []
        for size, s_in, s_out in geometry.batch:
            batch += [size, s_in, s_out]
        batch += [1, 0, 0] * (MAX_BATCH - len(geometry.batch))
        n_units = call.numel * call.input.element_size() // call.unit
        if config.get("narrow") and geometry.narrow:
            n, m = ((geometry.A, geometry.B) if geometry.narrow == "in"
                    else (geometry.B, geometry.A))
            launch, grid = self._narrow_launch(call, geometry, config, batch, n_units)
            return TiledPlan(geometry, True, 0, 0, next_pow2(n), launch.wide_block, launch, grid)
        if "a_block" not in config:  # a narrow config memoised for a call that is not narrow
            config = self.configs(call)[0]
            if "a_block" not in config:
                config = {**config, "a_block": 64, "b_block": 64}
        ba, bb = self.tile_shape(geometry, config["a_block"], config["b_block"])
        launch, grid = self._tiled_launch(call, geometry, config, ba, bb, batch, n_units)
        return TiledPlan(geometry, False, ba, bb, 0, 0, launch, grid)

    def _prepared(self, plan: TiledPlan, call: PermuteCall):
        launcher = _NARROW if plan.narrow else _TILED
        return _prepared_copy(call, launcher.bind(plan.launch, plan.grid, call.info.index),
                              plan.launch.ints)

    def supports(self, call: PermuteCall) -> str | None:
        if call.tile is None and call.kind not in ("empty", "other"):
            if call.kind == "keep":
                return ("the last dim stays contiguous in runs of more than 32 bytes "
                        f"(simplified sizes {tuple(call.sizes)}); tiled is for permutations "
                        "that move it (vectorized copies the runs)")
            return ("no dim of the input is contiguous (a strided view); tiled needs one to "
                    "load along")
        return super().supports(call)

    def configs(self, call: PermuteCall) -> list[dict]:
        elem = call.unit * call.tile[0] if call.tile else call.esize
        ba, bb = TILE_EDGES.get(elem, (32, 32))
        big = call.numel * call.input.element_size() >= (64 << 20)
        general = [{"a_block": ba, "b_block": bb, "num_warps": 4,
                    "tiles_per_program": 2 if big else 1},
                   {"a_block": ba, "b_block": 2 * bb, "num_warps": 8, "tiles_per_program": 1},
                   {"a_block": max(8, ba // 2), "b_block": bb, "num_warps": 4,
                    "tiles_per_program": 4 if big else 1},
                   {"a_block": 2 * ba, "b_block": bb, "num_warps": 8, "tiles_per_program": 1}]
        # The cold model runs the first config: the one nearest the best in a sweep of every
        # config (benchmarks/results/h200/fits/permute.md, "tiled: the first config").
        if big and elem >= 2:
            # 64 MB and more of 2-byte and wider elements: the wider tile of 8 warps, nearest
            # the best on such calls (and the one earlier tuning runs mostly chose).
            general[0], general[1] = general[1], general[0]
        elif elem == 8:
            # Smaller 8-byte units: half as many rows along A, faster than the default tile on
            # every such call of the sweep.
            general[0], general[2] = general[2], general[0]
        plan = _plan(call) if call.tile is not None else None
        if plan is not None and plan.narrow:
            narrow = [{"narrow": True, "tile_bytes": 16384, "num_warps": 4,
                       "tiles_per_program": 2 if big else 1},
                      {"narrow": True, "tile_bytes": 32768, "num_warps": 8,
                       "tiles_per_program": 1}]
            if plan.narrow == "out" and any(stride % 16 for _, stride in plan.b_dims):
                # The narrow kernel loads its rows at the input strides of the narrow group;
                # unless each is a multiple of 16 elements (the only divisibility Triton is told
                # of) those loads are not vectorised, and the narrow tile mostly ran slower than
                # the general one; with aligned rows, or the narrow group on the input side, it
                # was within 5% of the best (benchmarks/results/h200/fits/permute.md, "tiled: the
                # narrow tile's order").
                return [general[0], general[1], *narrow]
            return [*narrow, general[0], general[1]]
        return general

    @staticmethod
    def tile_shape(plan: TilePlan, ba: int, bb: int) -> tuple[int, int]:
        """Clamp the preferred edges to the groups, giving what one side cannot use to the other
        (A = 3 channels: a 4 x 4096 tile, not 4 x 128)."""
        budget = ba * bb
        cap_a, cap_b = next_pow2(plan.A), next_pow2(plan.B)
        ba, bb = min(ba, cap_a), min(bb, cap_b)
        while ba * bb < budget and bb < cap_b and bb < 4096:
            bb *= 2
        while ba * bb < budget and ba < cap_a and ba < 4096:
            ba *= 2
        return ba, bb

    @staticmethod
    def _tiled_launch(call: PermuteCall, plan: TilePlan, config, ba: int, bb: int, batch,
                      n_units: int) -> tuple[TiledLaunchPlan, tuple[int]]:
        """The square tile's launch spec and grid, for tiles of ba x bb."""
        unit, w = call.unit, plan.w
        n_ta, n_tb = cdiv(plan.A, ba), cdiv(plan.B, bb)
        n_tiles = plan.n_batch * n_ta * n_tb
        tpp = _tiles_per_program(config["tiles_per_program"], n_tiles)
        ints = (plan.A, plan.B, n_ta, n_tb, *plan.group_args(plan.a_dims),
                *plan.group_args(plan.b_dims), *batch)
        na, nb, nc = len(plan.a_dims), len(plan.b_dims), len(plan.batch)
        i64 = needs_int64(n_units + (ba + bb) * w, call.span * w + (ba + bb) * w)
        warps = config["num_warps"]
        spec = tiled_launch_plan(UNIT_DTYPES[unit], ints, na, nb, nc, ba, bb, w, tpp,
                                 plan.A % ba == 0, plan.B % bb == 0, i64, warps)
        return spec, (n_tiles // tpp,)

    @staticmethod
    def narrow_width(n: int, m: int, unit: int, tile_bytes: int) -> int:
        """Elements of the wide group per narrow tile: next_pow2(n) rows of them fill tile_bytes."""
        return max(16, min(next_pow2(m), tile_bytes // (next_pow2(n) * unit)))

    @staticmethod
    def _narrow_launch(call: PermuteCall, plan: TilePlan, config, batch, n_units
                       ) -> tuple[NarrowLaunchPlan, tuple[int]]:
        """The narrow kernel's launch spec and grid."""
        narrow_in = plan.narrow == "in"
        n, m = (plan.A, plan.B) if narrow_in else (plan.B, plan.A)
        group = plan.a_dims if narrow_in else plan.b_dims
        np_ = next_pow2(n)
        bw = TiledBackend.narrow_width(n, m, call.unit, config["tile_bytes"])
        n_tm = cdiv(m, bw)
        n_tiles = plan.n_batch * n_tm
        tpp = _tiles_per_program(config["tiles_per_program"], n_tiles)
        ints = (m, n_tm, *plan.group_args(group), *batch)
        ng, nc, warps = len(group), len(plan.batch), config["num_warps"]
        i64 = needs_int64(n_units + np_ * bw, call.span + np_ * bw)
        spec = narrow_launch_plan(UNIT_DTYPES[call.unit], ints, n, np_, ng, nc, bw, tpp,
                                  narrow_in, i64, warps)
        return spec, (n_tiles // tpp,)
