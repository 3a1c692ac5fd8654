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
from .._common import BoundLaunch, Launcher, cdiv, needs_int64, next_pow2
from .call import MAX_DIMS, PermuteCall
from .common import UNIT_DTYPES, _prepared_copy, _tiles_per_program, _TritonBackend


#: Batch dims of the tiled kernel: MAX_DIMS minus one dim each for groups A and B.
MAX_BATCH = MAX_DIMS - 2


#: Groups A (input-contiguous) and B (output-contiguous) of the tiled kernel grow until they hold
#: this many elements (whole cache lines along a tile edge), taking at most GROUP_DIMS dims each.
GROUP_TARGET = 128


GROUP_DIMS = 3


#: The narrow variant of the tiled kernel takes groups of at most this many elements.
NARROW_MAX = 15


@triton.jit
def _offset3(i, n0, t0, n1, t1, t2, ND: tl.constexpr):
    """_offset for the at most 3 dims of a tiled kernel's group (the last size is implicit)."""
    if ND == 1:
        off = i * t0
    elif ND == 2:
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
                   NC: tl.constexpr):
    """(input offset, output offset) of the scalar batch index `bat` over NC dims (innermost
    first): once per tile, so a few scalar divisions are nothing next to the tile's traffic."""
    off_in = bat * 0
    off_out = bat * 0
    rem = bat
    if NC > 0:
        q = rem // c0
        off_in += (rem - q * c0) * i0
        off_out += (rem - q * c0) * o0
        rem = q
    if NC > 1:
        q = rem // c1
        off_in += (rem - q * c1) * i1
        off_out += (rem - q * c1) * o1
        rem = q
    if NC > 2:
        q = rem // c2
        off_in += (rem - q * c2) * i2
        off_out += (rem - q * c2) * o2
        rem = q
    if NC > 3:
        q = rem // c3
        off_in += (rem - q * c3) * i3
        off_out += (rem - q * c3) * o3
        rem = q
    if NC > 4:
        q = rem // c4
        off_in += (rem - q * c4) * i4
        off_out += (rem - q * c4) * o4
        rem = q
    if NC > 5:
        q = rem // c5
        off_in += (rem - q * c5) * i5
        off_out += (rem - q * c5) * o5
    return off_in, off_out


@triton.jit
def _tiled_kernel(src, dst, A, B, n_ta, n_tb,
                  a0, oa0, a1, oa1, oa2,
                  b0, ib0, b1, ib1, ib2,
                  c0, i0, o0, c1, i1, o1, c2, i2, o2, c3, i3, o3, c4, i4, o4, c5, i5, o5,
                  NA: tl.constexpr, NB: tl.constexpr, NC: tl.constexpr,
                  BA: tl.constexpr, BB: tl.constexpr, W: tl.constexpr, TPP: tl.constexpr,
                  EVEN_A: tl.constexpr, EVEN_B: tl.constexpr, I64: tl.constexpr):
    """out[batch, a, b] = in[batch, a, b] where group A (index a) is contiguous in the input and
    group B (index b) is contiguous in the output: a's input offset is a itself and b's output
    offset is b itself, so a tile [BB, BA] is loaded with a fastest (coalesced, vectorised) and
    its transpose [BA, BB] stored with b fastest; the layout change goes through shared memory.
    The cross terms (a's output offset, b's input offset) are per-row vectors of BA and BB
    offsets, computed once per tile. Elements are W units; offsets below are in elements and the
    fast axes are flattened to BA * W and BB * W units so both accesses stay plain 2-D. Each
    program moves TPP consecutive tiles (B fastest), TPP dividing the tile count."""
    pid = tl.program_id(0)
    for k in range(TPP):
        t = pid * TPP + k
        tb = t % n_tb
        q = t // n_tb
        ta = q % n_ta
        bat = q // n_ta
        if I64:
            tb = tb.to(tl.int64)
            ta = ta.to(tl.int64)
            bat = bat.to(tl.int64)
        base_in, base_out = _batch_offsets(bat, c0, i0, o0, c1, i1, o1, c2, i2, o2, c3, i3, o3,
                                           c4, i4, o4, c5, i5, o5, NC)
        a = ta * BA + tl.arange(0, BA)
        b = tb * BB + tl.arange(0, BB)
        # Units along the fast axes: element a covers units a * W .. a * W + W - 1.
        au = ta * (BA * W) + tl.arange(0, BA * W)
        bu = tb * (BB * W) + tl.arange(0, BB * W)
        b_in = base_in + _offset3(b, b0, ib0, b1, ib1, ib2, NB)   # [BB] input offsets of rows b
        a_out = base_out + _offset3(a, a0, oa0, a1, oa1, oa2, NA)  # [BA] output offsets of rows a
        # Masks only where a group does not divide into whole tiles: an all-true splat keeps
        # the accesses vectorised, and the fully even case needs none at all.
        if EVEN_A:
            ok_a = tl.full([BA], 1, tl.int1)
            ok_au = tl.full([BA * W], 1, tl.int1)
        else:
            ok_a = a < A
            ok_au = au < A * W
        if EVEN_B:
            ok_b = tl.full([BB], 1, tl.int1)
            ok_bu = tl.full([BB * W], 1, tl.int1)
        else:
            ok_b = b < B
            ok_bu = bu < B * W
        src_ptr = src + (b_in * W)[:, None] + au[None, :]  # [BB, BA*W], a fastest
        dst_ptr = dst + (a_out * W)[:, None] + bu[None, :]  # [BA, BB*W], b fastest
        if EVEN_A and EVEN_B:
            x = tl.load(src_ptr)
        else:
            x = tl.load(src_ptr, mask=ok_b[:, None] & ok_au[None, :])
        if W == 1:
            y = tl.trans(x)
        else:
            y = tl.reshape(tl.permute(tl.reshape(x, (BB, BA, W)), (1, 0, 2)), (BA, BB * W))
        if EVEN_A and EVEN_B:
            tl.store(dst_ptr, y)
        else:
            tl.store(dst_ptr, y, mask=ok_a[:, None] & ok_bu[None, :])


@triton.jit
def _narrow_kernel(src, dst, M, n_tm,
                   g0, s0, g1, s1, s2,
                   c0, i0, o0, c1, i1, o1, c2, i2, o2, c3, i3, o3, c4, i4, o4, c5, i5, o5,
                   N: tl.constexpr, NP: tl.constexpr, NG: tl.constexpr, NC: tl.constexpr,
                   BW: tl.constexpr, TPP: tl.constexpr, IN_NARROW: tl.constexpr,
                   I64: tl.constexpr):
    """The tiled copy when one group has only N < 16 bytes of elements (3 colour channels) and
    its partner's rows lie back to back on that side, so a tile's N * BW elements there form one
    contiguous chunk. That chunk is moved flat, 16 bytes a lane, and tl.gather (through shared
    memory) converts between it and the [NP, BW] tile of the other side, which has BW-long rows:

      IN_NARROW   input  chunk[i * N + j]  <->  output row j (group A index), column i (B)
      not         output chunk[i * N + j]  <->  input  row j (group B index), column i (A)

    The narrow group's dims (g sizes, s strides on the tile side) give each row's offset; M is
    the wide group's size; N and NP = next_pow2(N) are compile-time, so i * N + j is cheap."""
    pid = tl.program_id(0)
    for k in range(TPP):
        t = pid * TPP + k
        tm = t % n_tm
        bat = t // n_tm
        if I64:
            tm = tm.to(tl.int64)
            bat = bat.to(tl.int64)
        base_in, base_out = _batch_offsets(bat, c0, i0, o0, c1, i1, o1, c2, i2, o2, c3, i3, o3,
                                           c4, i4, o4, c5, i5, o5, NC)
        m0 = tm * BW
        rows = tl.minimum(M - m0, BW)  # wide-group elements in this tile
        j = tl.arange(0, NP)
        i = tl.arange(0, BW)
        row_off = _offset3(j, g0, s0, g1, s1, s2, NG)  # [NP] offsets of the narrow rows
        flat = tl.arange(0, NP * BW)
        # Position in the flat chunk of tile element (j, i), clamped for the padding rows j >= N.
        idx = tl.minimum(i[None, :] * N + j[:, None], NP * BW - 1)
        ok = (j[:, None] < N) & (i[None, :] < rows)
        if IN_NARROW:
            chunk = tl.load(src + base_in + m0 * N + flat, mask=flat < rows * N)
            tile = tl.reshape(tl.gather(chunk, tl.reshape(idx, (NP * BW,)), 0), (NP, BW))
            tl.store(dst + base_out + row_off[:, None] + (m0 + i)[None, :], tile, mask=ok)
        else:
            tile = tl.load(src + base_in + row_off[:, None] + (m0 + i)[None, :], mask=ok)
            # Output element f = i * N + j holds tile[j, i], at tile position j * BW + i.
            fi = flat // N
            fj = flat - fi * N
            pos = tl.minimum(fj * BW + fi, NP * BW - 1)
            chunk = tl.gather(tl.reshape(tile, (NP * BW,)), pos, 0)
            tl.store(dst + base_out + m0 * N + flat, chunk, mask=flat < rows * N)


@dataclass(frozen=True, eq=False)
class TiledLaunchPlan:
    """One tiled launch (tiles of [BA x BB] over the two groups of dims that swap): the
    Launcher's spec and constexpr source (tiled_launch_plan: one object per distinct launch)."""

    dtype: torch.dtype  # of the units moved
    ints: tuple  # every integer argument: A, B, tile counts, each group's (size, stride)s, batch
    a_dims: int  # NA
    b_dims: int  # NB
    batch_dims: int  # NC
    a_block: int  # BA
    b_block: int  # BB
    unit_width: int  # W: elements per unit
    tiles_per_program: int  # TPP
    offsets_64bit: bool
    warps: int


@dataclass(frozen=True, eq=False)
class NarrowLaunchPlan:
    """One narrow-tile launch (a short group of dims against a long one)."""

    dtype: torch.dtype
    ints: tuple  # the wide group's length, its tile count, the group's (size, stride)s, batch
    narrow: int  # N: length of the narrow group
    narrow_padded: int  # NP: N padded to a power of two
    group_dims: int  # NG
    batch_dims: int  # NC
    wide_block: int  # BW: elements of the wide group per tile
    tiles_per_program: int  # TPP
    narrow_in: bool  # the narrow group is the input's innermost
    offsets_64bit: bool
    warps: int


tiled_launch_plan = functools.lru_cache(maxsize=4096)(TiledLaunchPlan)
narrow_launch_plan = functools.lru_cache(maxsize=4096)(NarrowLaunchPlan)

_TILED = Launcher(_tiled_kernel, lambda p: dict(
    NA=p.a_dims, NB=p.b_dims, NC=p.batch_dims, BA=p.a_block, BB=p.b_block, W=p.unit_width,
    TPP=p.tiles_per_program, EVEN_A=p.ints[0] % p.a_block == 0,
    EVEN_B=p.ints[1] % p.b_block == 0, I64=p.offsets_64bit, num_warps=p.warps))


_NARROW = Launcher(_narrow_kernel, lambda p: dict(
    N=p.narrow, NP=p.narrow_padded, NG=p.group_dims, NC=p.batch_dims, BW=p.wide_block,
    TPP=p.tiles_per_program, IN_NARROW=p.narrow_in, I64=p.offsets_64bit, num_warps=p.warps))


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
    """What a tiled launch of one call under one config moves per tile (the cost model's input,
    and the tile edges run() launches with)."""

    geometry: TilePlan  # the call's two groups (A along the input, B along the output) and batch
    narrow: bool  # the narrow kernel (a group of under 16 bytes) rather than the square tile
    tile_a: int  # square tile: elements along A (clamped to the group, see tile_shape)
    tile_b: int  # square tile: elements along B
    narrow_rows: int  # narrow kernel: the short group's length rounded up to a power of two
    narrow_width: int  # narrow kernel: elements of the long group per tile


class TiledBackend(_TritonBackend):
    name = "tiled"
    estimate = staticmethod(cost.tiled)

    def plan(self, call: PermuteCall, config=None, *, sms=None) -> TiledPlan | None:
        if call.tile is None:  # nothing to tile (an empty call, or one torch answers)
            return None
        config = self.configs(call)[0] if config is None else config
        geometry = _plan(call)
        if config.get("NARROW") and geometry.narrow:
            n, m = ((geometry.A, geometry.B) if geometry.narrow == "in"
                    else (geometry.B, geometry.A))
            return TiledPlan(geometry, True, 0, 0, next_pow2(n),
                             self.narrow_width(n, m, call.unit, config["TILE_BYTES"]))
        ba, bb = self.tile_shape(geometry, config.get("BA", 64), config.get("BB", 64))
        return TiledPlan(geometry, False, ba, bb, 0, 0)

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
        general = [{"BA": ba, "BB": bb, "num_warps": 4, "TPP": 2 if big else 1},
                   {"BA": ba, "BB": 2 * bb, "num_warps": 8, "TPP": 1},
                   {"BA": max(8, ba // 2), "BB": bb, "num_warps": 4, "TPP": 4 if big else 1},
                   {"BA": 2 * ba, "BB": bb, "num_warps": 8, "TPP": 1}]
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
            narrow = [{"NARROW": True, "TILE_BYTES": 16384, "num_warps": 4, "TPP": 2 if big else 1},
                      {"NARROW": True, "TILE_BYTES": 32768, "num_warps": 8, "TPP": 1}]
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

    def _prepare(self, call: PermuteCall, config):
        plan = _plan(call)
        unit, w = call.unit, plan.w
        batch = []
        for size, s_in, s_out in plan.batch:
            batch += [size, s_in, s_out]
        batch += [1, 0, 0] * (MAX_BATCH - len(plan.batch))
        n_units = call.numel * call.input.element_size() // unit
        if config.get("NARROW") and plan.narrow:
            launch, ints = self._narrow_launch(call, plan, config, batch, n_units)
            return _prepared_copy(call, launch, ints)
        if "BA" not in config:  # a narrow config memoised for a call that is not narrow
            config = self.configs(call)[0]
            if "BA" not in config:
                config = {**config, "BA": 64, "BB": 64}
        ba, bb = self.tile_shape(plan, config["BA"], config["BB"])
        n_ta, n_tb = cdiv(plan.A, ba), cdiv(plan.B, bb)
        n_tiles = plan.n_batch * n_ta * n_tb
        tpp = _tiles_per_program(config["TPP"], n_tiles)
        ints = (plan.A, plan.B, n_ta, n_tb, *plan.group_args(plan.a_dims),
                *plan.group_args(plan.b_dims), *batch)
        na, nb, nc = len(plan.a_dims), len(plan.b_dims), len(plan.batch)
        i64 = needs_int64(n_units + (ba + bb) * w, call.span * w + (ba + bb) * w)
        warps = config["num_warps"]
        spec = tiled_launch_plan(UNIT_DTYPES[unit], ints, na, nb, nc, ba, bb, w, tpp, i64, warps)
        return _prepared_copy(call, _TILED.bind(spec, (n_tiles // tpp,), call.info.index), ints)

    @staticmethod
    def narrow_width(n: int, m: int, unit: int, tile_bytes: int) -> int:
        """Elements of the wide group per narrow tile: next_pow2(n) rows of them fill tile_bytes."""
        return max(16, min(next_pow2(m), tile_bytes // (next_pow2(n) * unit)))

    @staticmethod
    def _narrow_launch(call: PermuteCall, plan: TilePlan, config, batch, n_units
                       ) -> tuple[BoundLaunch, tuple]:
        """The narrow kernel's bound launch and its integer arguments."""
        narrow_in = plan.narrow == "in"
        n, m = (plan.A, plan.B) if narrow_in else (plan.B, plan.A)
        group = plan.a_dims if narrow_in else plan.b_dims
        np_ = next_pow2(n)
        bw = TiledBackend.narrow_width(n, m, call.unit, config["TILE_BYTES"])
        n_tm = cdiv(m, bw)
        n_tiles = plan.n_batch * n_tm
        tpp = _tiles_per_program(config["TPP"], n_tiles)
        ints = (m, n_tm, *plan.group_args(group), *batch)
        ng, nc, warps = len(group), len(plan.batch), config["num_warps"]
        i64 = needs_int64(n_units + np_ * bw, call.span + np_ * bw)
        spec = narrow_launch_plan(UNIT_DTYPES[call.unit], ints, n, np_, ng, nc, bw, tpp,
                                  narrow_in, i64, warps)
        return _NARROW.bind(spec, (n_tiles // tpp,), call.info.index), ints
