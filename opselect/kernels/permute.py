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
  naive       one program per BLOCK output elements; each maps its output offset to the input
              offset by peeling the (simplified) dims off with div/mod, in 32 bits when the
              tensor allows; reads are uncoalesced when the last dim moves
  vectorized  permutations that keep the last dim: copies whole contiguous runs, a tile of ROWS
              runs x BLOCK_L units per step, with 16-byte loads and stores where the alignment
              allows (the run starts are declared multiples of the vector to the compiler)
  tiled       permutations that move the last dim: a tile is loaded coalesced along the input's
              contiguous dims (group A) and stored coalesced along the output's (group B); the
              compiler moves it between the two register layouts through shared memory (with its
              own swizzling, so the 32-bank conflicts of a naive 128x128 smem tile do not arise).
              Groups A and B each take up to 3 dims, so short contiguous runs on either side are
              extended to whole cache lines; the other dims are a batch index. Short kept runs of
              16 or 32 bytes are moved as one element of W units. When one group is under 16
              bytes (3 colour channels: NCHW <-> NHWC, HWC -> CHW) and the other continues it in
              memory, a narrow variant moves that side as one flat chunk, 16 bytes a lane, and
              permutes it on chip with tl.gather.
"""

from __future__ import annotations

import math
import operator
import warnings

import torch
import triton
import triton.language as tl

from ..dispatch.backend import Backend, Estimate, TorchBackend
from ..dispatch.device import device_info
from ..dispatch.op import Call, Op, register
from ..dispatch.signature import bucket
from ..errors import ArgumentTypeError, DimError, InvalidArgument
from ..heuristics import permute as cost
from ._common import Launcher, cdiv, needs_int64, next_pow2

#: The kernels take at most this many dims after simplification (the torch backend takes any).
MAX_DIMS = 8
#: Batch dims of the tiled kernel: MAX_DIMS minus one dim each for groups A and B.
MAX_BATCH = MAX_DIMS - 2
#: Groups A (input-contiguous) and B (output-contiguous) of the tiled kernel grow until they hold
#: this many elements (whole cache lines along a tile edge), taking at most GROUP_DIMS dims each.
GROUP_TARGET = 128
GROUP_DIMS = 3
#: The narrow variant of the tiled kernel takes groups of at most this many elements.
NARROW_MAX = 15
#: Integer types of each unit width: the kernels move bytes, never values.
UNIT_DTYPES = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


# ---------------------------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------------------------
@triton.jit
def _offset(i, n0, t0, n1, t1, n2, t2, n3, t3, n4, t4, n5, t5, n6, t6, n7, t7,
            ND: tl.constexpr):
    """Input offset of the linear index i over ND dims (innermost first: sizes n, strides t).

    The outermost dim needs no modulo (i is in range), so ND dims cost ND - 1 div/mod pairs; the
    remainder is taken as i - q * n (one division, not two). Exactly one `ND == k` branch ends it.
    """
    off = i * 0
    rem = i
    if ND == 1:
        off += rem * t0
    if ND > 1:
        q = rem // n0
        off += (rem - q * n0) * t0
        rem = q
    if ND == 2:
        off += rem * t1
    if ND > 2:
        q = rem // n1
        off += (rem - q * n1) * t1
        rem = q
    if ND == 3:
        off += rem * t2
    if ND > 3:
        q = rem // n2
        off += (rem - q * n2) * t2
        rem = q
    if ND == 4:
        off += rem * t3
    if ND > 4:
        q = rem // n3
        off += (rem - q * n3) * t3
        rem = q
    if ND == 5:
        off += rem * t4
    if ND > 5:
        q = rem // n4
        off += (rem - q * n4) * t4
        rem = q
    if ND == 6:
        off += rem * t5
    if ND > 6:
        q = rem // n5
        off += (rem - q * n5) * t5
        rem = q
    if ND == 7:
        off += rem * t6
    if ND > 7:
        q = rem // n6
        off += (rem - q * n6) * t6
        rem = q
    if ND == 8:
        off += rem * t7
    return off


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
def _naive_kernel(src, dst, numel,
                  n0, t0, n1, t1, n2, t2, n3, t3, n4, t4, n5, t5, n6, t6, n7, t7,
                  ND: tl.constexpr, W: tl.constexpr, BLOCK: tl.constexpr, I64: tl.constexpr):
    pid = tl.program_id(0)
    if I64:
        pid = pid.to(tl.int64)
    o = pid * BLOCK + tl.arange(0, BLOCK)
    ok = o < numel
    s = _offset(o, n0, t0, n1, t1, n2, t2, n3, t3, n4, t4, n5, t5, n6, t6, n7, t7, ND)
    if W == 1:
        tl.store(dst + o, tl.load(src + s, mask=ok), mask=ok)
    else:
        # A 16-byte element is W = 2 int64 units: the pair is contiguous and starts at an even
        # unit, which the [BLOCK, W] shape and the factor W make visible: one 16-byte access.
        w = tl.arange(0, W)
        v = tl.load(src + (s * W)[:, None] + w[None, :], mask=ok[:, None])
        tl.store(dst + (o * W)[:, None] + w[None, :], v, mask=ok[:, None])


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


# ---------------------------------------------------------------------------------------------
# The problem after simplification
# ---------------------------------------------------------------------------------------------
def simplify(shape, strides, dims) -> tuple[list[int], list[int]]:
    """(sizes, input strides) of the output's dims in output order, with size-1 dims dropped and
    output-adjacent dims merged where the input holds them as one block. The result reads the same
    elements in the same order: as_strided(input, sizes, strides).contiguous() equals
    input.permute(dims).contiguous() flattened. An input of one element gives ([], [])."""
    sizes: list[int] = []
    out_strides: list[int] = []
    for d in dims:
        n = shape[d]
        if n == 1:
            continue
        t = strides[d]
        if sizes and out_strides[-1] == n * t:
            sizes[-1] *= n
            out_strides[-1] = t
        else:
            sizes.append(n)
            out_strides.append(t)
    return sizes, out_strides


def widen(sizes: list[int], strides: list[int], esize: int, *ptrs: int
          ) -> tuple[list[int], list[int], int]:
    """Regroup a kept last dim into the widest unit (<= 16 bytes) that divides the run length,
    every other stride (in bytes) and every pointer; a run that becomes one unit is dropped.
    Returns (sizes, strides, element bytes); a problem whose last dim moves is returned as is."""
    if not sizes or strides[-1] != 1:
        return sizes, strides, esize
    run = sizes[-1] * esize
    bits = run
    for p in ptrs:
        bits |= p
    for t in strides[:-1]:
        bits |= t * esize
    width = min(16, bits & -bits)
    if width <= esize:
        return sizes, strides, esize
    k = width // esize
    sizes = sizes[:-1] + [run // width]
    strides = [t // k for t in strides[:-1]] + [1]
    if sizes[-1] == 1:
        sizes.pop()
        strides.pop()
    return sizes, strides, width


def _kind(sizes: list[int], strides: list[int]) -> str:
    if not sizes or strides[-1] == 1:
        return "keep"  # the last dim stays contiguous (a plain copy has one dim or none)
    if 1 in strides:
        return "move"  # the input's contiguous dim moves away from the end: a transpose
    return "gather"  # no dim is contiguous in the input (a strided view)


def _tile_form(kind: str, sizes: list[int], strides: list[int], esize: int
               ) -> tuple[int, list[int], list[int]] | None:
    """(W units per element, sizes, strides) the tiled kernel takes, or None.

    A moving problem is taken as is (16-byte elements are W = 2 int64). A kept last dim of 16 or
    32 bytes in 2 or 4 units becomes one element of W units, if the rest then moves."""
    unit = min(esize, 8)
    w = esize // unit
    if kind == "move":
        return w, sizes, strides
    if kind != "keep" or len(sizes) < 3:
        return None
    run = sizes[-1]
    units = run * w
    if units not in (2, 4) or run * esize > 32:
        return None
    rest = strides[:-1]
    if any(t % run for t in rest):
        return None
    rest = [t // run for t in rest]
    if rest[-1] == 1 or 1 not in rest:
        return None
    return units, sizes[:-1], rest


class PermuteCall(Call):
    __slots__ = ("input", "dims", "out", "out_shape", "numel", "esize", "sizes", "strides",
                 "kind", "torch_only", "tile", "span", "_plan")

    @property
    def empty(self) -> bool:
        return self.numel == 0

    def describe(self) -> str:
        x = self.input
        text = (f"input {tuple(x.shape)} {str(x.dtype)[6:]}, dims {self.dims} on {x.device}")
        if self.kind in ("keep", "move", "gather"):
            text += (f"; simplified: sizes {tuple(self.sizes)} strides {tuple(self.strides)} "
                     f"of {self.esize}-byte elements ({self.kind})")
        return text

    @property
    def unit(self) -> int:
        return min(self.esize, 8)

    @property
    def W(self) -> int:
        return self.esize // self.unit


def wrap_dims(dims, ndim: int) -> tuple[int, ...]:
    """dims wrapped into [0, ndim), with torch's checks and order of checks (length, range,
    repeats). The loop is the hot path: plain ints, one pass, a bit set for repeats."""
    if type(dims) in (tuple, list) and len(dims) == ndim:
        seen = 0
        wrapped = []
        for d in dims:
            if type(d) is not int:
                break
            if d < 0:
                d += ndim
            if d < 0 or d >= ndim or (seen >> d) & 1:
                break
            seen |= 1 << d
            wrapped.append(d)
        else:
            return tuple(wrapped)
    return _wrap_dims_checked(dims, ndim)


def _wrap_dims_checked(dims, ndim: int) -> tuple[int, ...]:
    if isinstance(dims, torch.Tensor) or not isinstance(dims, (tuple, list, torch.Size)):
        raise ArgumentTypeError(f"permute: dims must be a tuple or list of ints, "
                                f"got {type(dims).__name__}")
    wrapped = []
    for i, d in enumerate(dims):
        if isinstance(d, (bool, float)):
            raise ArgumentTypeError(f"permute: dims[{i}] must be an int, got "
                                    f"{type(d).__name__} {d!r}")
        try:
            wrapped.append(operator.index(d))
        except TypeError:
            raise ArgumentTypeError(f"permute: dims[{i}] must be an int, got "
                                    f"{type(d).__name__}") from None
    if len(wrapped) != ndim:
        raise InvalidArgument(f"permute: dims has {len(wrapped)} entries but input has {ndim} "
                              "dimensions; expected one entry per dimension "
                              f"(dims={tuple(wrapped)})")
    for i, d in enumerate(wrapped):
        if d < -ndim or d >= ndim:
            raise DimError(f"permute: dims[{i}] = {d} is out of range for a {ndim}-d input "
                           f"(expected to be in range of [{-ndim}, {ndim - 1}])")
        if d < 0:
            wrapped[i] = d + ndim
    if len(set(wrapped)) != ndim:
        seen: set[int] = set()
        dup = next(d for d in wrapped if d in seen or seen.add(d))
        raise InvalidArgument(f"permute: dims {tuple(dims)} names dimension {dup} more than once; "
                              "each dimension must appear exactly once")
    return tuple(wrapped)


def _torch_only(x: torch.Tensor) -> str | None:
    """Why the Triton backends cannot take x (None when they can)."""
    if x.is_quantized:
        return "the input is quantized; the kernels take plain tensors"
    if x.is_conj() or x.is_neg():
        return "the input is a lazy conjugate/negative view (resolve_conj()/resolve_neg() first)"
    if x.requires_grad and torch.is_grad_enabled():
        return "the input requires grad; only the torch backend records autograd"
    if x.element_size() not in (1, 2, 4, 8, 16):
        return f"{x.dtype} elements are {x.element_size()} bytes; the kernels move 1 to 16"
    return None


def prepare(input, dims, *, out: torch.Tensor | None = None) -> PermuteCall:
    if not isinstance(input, torch.Tensor):
        raise ArgumentTypeError(f"permute: input must be a tensor, got {type(input).__name__}")
    if input.layout != torch.strided:
        # torch cannot make a sparse (or other non-strided) permute contiguous either.
        raise InvalidArgument(f"permute: input has layout {input.layout}; expected a strided "
                              "tensor (a contiguous result needs one)")
    shape = input.shape
    dims = wrap_dims(dims, len(shape))
    if out is not None:
        _check_out(out, input, tuple([shape[d] for d in dims]))
    call = PermuteCall()
    call.input, call.dims, call.out = input, dims, out
    call.numel = numel = input.numel()
    call.torch_only = reason = _torch_only(input)
    call._plan = None
    esize = input.element_size()
    out_ptr = out.data_ptr() if out is not None and out.is_contiguous() else 0
    # The plan depends on the geometry and the pointers' alignment only: calls of one shape in a
    # loop reuse it instead of simplifying again (that is most of this function's time).
    plan_key = (shape, input.stride(), dims, esize, input.data_ptr() % 16, out_ptr % 16,
                reason is None)
    plan = _PLANS.get(plan_key)
    if plan is None:
        plan = _geometry(input, dims, esize, out_ptr, reason)
        if len(_PLANS) >= _PLANS_MAX:
            _PLANS.clear()
        _PLANS[plan_key] = plan
    (call.out_shape, call.sizes, call.strides, call.esize, call.kind, call.span, call.tile,
     too_many, key_tail) = plan
    if too_many is not None:
        call.torch_only = too_many
    dev = input.device
    call.info = device_info(dev)
    call.key = (dev, *key_tail)
    return call


_PLANS: dict[tuple, tuple] = {}
_PLANS_MAX = 4096


def _geometry(input: torch.Tensor, dims: tuple[int, ...], esize: int, out_ptr: int,
              reason: str | None) -> tuple:
    """Everything about a call that its geometry decides: the output shape, the simplified
    permutation (widened when the last dim stays), its kind, span and tile form, why the kernels
    cannot take it (too many dims left), and the key's tail."""
    shape, numel, in_esize = input.shape, input.numel(), esize
    out_shape = tuple([shape[d] for d in dims])
    tile, too_many, span = None, None, 0
    if reason is not None:
        kind, sizes, strides = "other", [], []
    elif numel == 0:
        kind, sizes, strides = "empty", [], []
    else:
        sizes, strides = simplify(shape, input.stride(), dims)
        if strides and strides[-1] == 1:
            sizes, strides, esize = widen(sizes, strides, esize, input.data_ptr(), out_ptr)
        kind = _kind(sizes, strides)
        if len(sizes) > MAX_DIMS:
            too_many = (f"{len(sizes)} dims remain after simplification; the kernels take at "
                        f"most {MAX_DIMS}")
        # One past the largest input offset (elements): int32 offsets must reach it too.
        span = 1
        for n, t in zip(sizes, strides):
            span += (n - 1) * t
        tile = _tile_form(kind, sizes, strides, esize)
    in_run = sizes[strides.index(1)] if 1 in strides else 0
    key_tail = (esize, kind, tile[0] if tile else 0, len(sizes),
                bucket(numel * in_esize // esize), bucket(sizes[-1]) if sizes else 0,
                bucket(in_run), reason is None and too_many is None)
    return out_shape, sizes, strides, esize, kind, span, tile, too_many, key_tail


def _check_out(out, input: torch.Tensor, shape: tuple[int, ...]) -> None:
    if not isinstance(out, torch.Tensor):
        raise ArgumentTypeError(f"permute: out must be a tensor, got {type(out).__name__}")
    if out.dtype != input.dtype:
        raise InvalidArgument(f"permute: out has dtype {out.dtype} but input has {input.dtype}; "
                              "expected the same dtype")
    if out.device != input.device:
        raise InvalidArgument(f"permute: out is on {out.device} but input is on {input.device}")
    if out.layout != torch.strided:
        raise InvalidArgument(f"permute: out must be a strided tensor, got layout {out.layout}")
    if tuple(out.shape) != shape:
        if out.numel() != 0:
            warnings.warn(f"permute: out has shape {tuple(out.shape)}, resizing it to {shape} (as "
                          "torch does for out=; pass an empty tensor to avoid this warning)",
                          UserWarning, stacklevel=4)
        out.resize_(shape)
    if _overlaps(out, input):
        raise InvalidArgument("permute: out shares memory with input; some elements of the input "
                              "and the written-to tensor refer to a single memory location "
                              "(pass a separate out, or clone() the input)")


def _byte_range(t: torch.Tensor) -> tuple[int, int]:
    lo = t.data_ptr()
    span = sum((n - 1) * s for n, s in zip(t.shape, t.stride())) + 1
    return lo, lo + span * t.element_size()


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.numel() == 0 or b.numel() == 0:
        return False
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False
    a0, a1 = _byte_range(a)
    b0, b1 = _byte_range(b)
    return a0 < b1 and b0 < a1


def transpose_dims(input, dim0, dim1) -> list[int]:
    """The permutation of input.transpose(dim0, dim1), with torch's argument rules."""
    if not isinstance(input, torch.Tensor):
        raise ArgumentTypeError(f"transpose: input must be a tensor, got {type(input).__name__}")
    ndim = input.dim()
    # torch wraps transpose's dims as if a 0-d tensor had one dim.
    lo, hi = -max(ndim, 1), max(ndim, 1) - 1
    wrapped = []
    for name, d in (("dim0", dim0), ("dim1", dim1)):
        if isinstance(d, (bool, float)) or not hasattr(d, "__index__"):
            raise ArgumentTypeError(f"transpose: {name} must be an int, got {type(d).__name__}")
        d = operator.index(d)
        if d < lo or d > hi:
            raise DimError(f"transpose: {name} = {d} is out of range for a {ndim}-d input "
                           f"(expected to be in range of [{lo}, {hi}])")
        wrapped.append(d % max(ndim, 1))
    dims = list(range(ndim))
    if ndim:
        a, b = wrapped
        dims[a], dims[b] = dims[b], dims[a]
    return dims


def transpose(input, dim0, dim1, *, out: torch.Tensor | None = None,
              backend: str | None = None) -> torch.Tensor:
    """input.transpose(dim0, dim1).contiguous(): permute() with two dims swapped."""
    return OP(input, transpose_dims(input, dim0, dim1), out=out, backend=backend)


# ---------------------------------------------------------------------------------------------
# Backends
# ---------------------------------------------------------------------------------------------
def _torch_permute(call: PermuteCall) -> torch.Tensor:
    view = call.input.permute(call.dims)
    if call.out is not None:
        return call.out.copy_(view)
    # clone, not contiguous(): the result is a new tensor even when the permutation is a no-op.
    return view.clone(memory_format=torch.contiguous_format)


def _output(call: PermuteCall) -> torch.Tensor:
    """Where the kernel writes: the caller's `out` when it is contiguous, else a new tensor."""
    out = call.out
    if out is not None and out.is_contiguous():
        return out
    return torch.empty(call.out_shape, dtype=call.input.dtype, device=call.input.device)


def _finish(call: PermuteCall, result: torch.Tensor) -> torch.Tensor:
    if call.out is not None and result is not call.out:
        call.out.copy_(result)
        return call.out
    return result


def _units(t: torch.Tensor, unit: int) -> torch.Tensor:
    """t's bytes as a tensor of `unit`-byte integers starting at t's first element (offsets are
    computed by the kernels, so only the pointer and the element type matter)."""
    dtype = UNIT_DTYPES[unit]
    if t.element_size() == unit:
        return t.view(dtype)
    if t.is_contiguous():
        # as_strided, not reshape: a contiguous tensor may still carry odd strides on size-1 dims.
        return t.as_strided((t.numel(),), (1,)).view(dtype)
    # A strided view regrouped into wider (or, for 16-byte elements, narrower) units: a 1-d view
    # of the storage from t's first byte (the caller checked the alignment).
    start = t.storage_offset() * t.element_size()
    storage = t.untyped_storage()
    n = (storage.nbytes() - start) // unit
    return torch.empty(0, dtype=dtype, device=t.device).set_(storage, start // unit, (n,), (1,))


def _trivial(call: PermuteCall) -> torch.Tensor | None:
    if call.kind == "empty":
        return _finish(call, _output(call))
    return None


def _padded(dims: list[tuple[int, int]], n: int) -> list[int]:
    """Flatten (size, stride) pairs, padded with (1, 0) to n pairs (a size of 1 is specialised
    into a constant by Triton, so the padding costs nothing)."""
    flat: list[int] = []
    for size, stride in dims:
        flat += [size, stride]
    flat += [1, 0] * (n - len(dims))
    return flat


def _tiles_per_program(wanted: int, n_tiles: int) -> int:
    """The largest power of two up to `wanted` that divides the tile count (so no program has a
    ragged tail to mask) and leaves at least two programs."""
    tpp = 1
    while tpp < wanted and n_tiles % (2 * tpp) == 0 and n_tiles // (2 * tpp) >= 2:
        tpp *= 2
    return tpp


# Bound launches (kernels/_common.py): Triton binds a kernel's arguments once per spec, later calls
# go straight to the compiled kernel. A spec is the unit dtype (which fixes both pointers'), every
# integer argument, the constexprs and the warps.
_NAIVE = Launcher(_naive_kernel)
_RUNS = Launcher(_runs_kernel)
_TILED = Launcher(_tiled_kernel)
_NARROW = Launcher(_narrow_kernel)


class _TritonBackend(Backend):
    def supports(self, call: PermuteCall) -> str | None:
        if call.torch_only is not None:
            return call.torch_only
        return self.device_reason(call.info)


class NaiveBackend(_TritonBackend):
    name = "naive"
    kernels = (_naive_kernel, _offset)

    def configs(self, call: PermuteCall) -> list[dict]:
        return [{"BLOCK": 1024, "num_warps": 4}, {"BLOCK": 2048, "num_warps": 8},
                {"BLOCK": 512, "num_warps": 4}]

    def run(self, call: PermuteCall, config) -> torch.Tensor:
        done = _trivial(call)
        if done is not None:
            return done
        unit, w = call.unit, call.W
        src = _units(call.input, unit)
        out = _output(call)
        dst = _units(out, unit)
        sizes, strides = call.sizes or [1], call.strides or [1]
        n = call.numel * call.input.element_size() // call.esize
        block = config["BLOCK"]
        ints = (n, *_padded(list(zip(reversed(sizes), reversed(strides))), MAX_DIMS))
        nd, i64, warps = len(sizes), needs_int64(n * w, call.span * w), config["num_warps"]
        _NAIVE((src.dtype, ints, nd, w, block, i64, warps), (cdiv(n, block),), (src, dst, *ints),
               lambda: dict(ND=nd, W=w, BLOCK=block, I64=i64, num_warps=warps))
        return _finish(call, out)

    def cost(self, call: PermuteCall, model) -> Estimate:
        return cost.naive(call, model)


class VectorizedBackend(_TritonBackend):
    name = "vectorized"
    kernels = (_runs_kernel, _offset)

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

    def run(self, call: PermuteCall, config) -> torch.Tensor:
        done = _trivial(call)
        if done is not None:
            return done
        unit, w = call.unit, call.W
        src = _units(call.input, unit)
        out = _output(call)
        dst = _units(out, unit)
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
        nd, even, warps = len(outer), lu % block_l == 0, config["num_warps"]
        i64 = needs_int64(rows * lu + tile, call.span * w + tile)
        _RUNS((src.dtype, ints, nd, block_r, block_l, tpp, w, i64, warps), (n_tiles // tpp,),
              (src, dst, *ints),
              lambda: dict(ND=nd, ROWS=block_r, BLOCK_L=block_l, TPP=tpp, EVEN_L=even, VEC=w,
                           I64=i64, num_warps=warps))
        return _finish(call, out)

    def cost(self, call: PermuteCall, model) -> Estimate:
        return cost.vectorized(call, model)


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
    if call._plan is None:
        w, sizes, strides = call.tile
        call._plan = plan = TilePlan(w, sizes, strides)
        plan.find_narrow(call.unit * w)
    return call._plan


#: Tile edges (elements along A, along B) by element bytes: 128-byte rows on both sides at the
#: least, 8 to 16 KB a tile (the layout change goes through as much shared memory).
TILE_EDGES = {1: (128, 128), 2: (64, 128), 4: (64, 64), 8: (32, 64), 16: (32, 32), 32: (16, 32)}


class TiledBackend(_TritonBackend):
    name = "tiled"
    kernels = (_tiled_kernel, _narrow_kernel, _offset3, _batch_offsets)

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
        if call.tile is not None and _plan(call).narrow:
            return [{"NARROW": True, "TILE_BYTES": 16384, "num_warps": 4, "TPP": 2 if big else 1},
                    {"NARROW": True, "TILE_BYTES": 32768, "num_warps": 8, "TPP": 1},
                    general[0], general[1]]
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

    def run(self, call: PermuteCall, config) -> torch.Tensor:
        done = _trivial(call)
        if done is not None:
            return done
        plan = _plan(call)
        unit, w = call.unit, plan.w
        src = _units(call.input, unit)
        out = _output(call)
        dst = _units(out, unit)
        batch = []
        for size, s_in, s_out in plan.batch:
            batch += [size, s_in, s_out]
        batch += [1, 0, 0] * (MAX_BATCH - len(plan.batch))
        n_units = call.numel * call.input.element_size() // unit
        if config.get("NARROW") and plan.narrow:
            self._run_narrow(call, plan, config, src, dst, batch, n_units)
            return _finish(call, out)
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
        _TILED((src.dtype, ints, na, nb, nc, ba, bb, w, tpp, i64, warps), (n_tiles // tpp,),
               (src, dst, *ints),
               lambda: dict(NA=na, NB=nb, NC=nc, BA=ba, BB=bb, W=w, TPP=tpp,
                            EVEN_A=plan.A % ba == 0, EVEN_B=plan.B % bb == 0, I64=i64,
                            num_warps=warps))
        return _finish(call, out)

    @staticmethod
    def narrow_width(n: int, m: int, unit: int, tile_bytes: int) -> int:
        """Elements of the wide group per narrow tile: next_pow2(n) rows of them fill tile_bytes."""
        return max(16, min(next_pow2(m), tile_bytes // (next_pow2(n) * unit)))

    @staticmethod
    def _run_narrow(call: PermuteCall, plan: TilePlan, config, src, dst, batch, n_units) -> None:
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
        _NARROW((src.dtype, ints, n, np_, ng, nc, bw, tpp, narrow_in, i64, warps),
                (n_tiles // tpp,), (src, dst, *ints),
                lambda: dict(N=n, NP=np_, NG=ng, NC=nc, BW=bw, TPP=tpp, IN_NARROW=narrow_in,
                             I64=i64, num_warps=warps))

    def cost(self, call: PermuteCall, model) -> Estimate:
        return cost.tiled(call, model)


# ---------------------------------------------------------------------------------------------
# Sample inputs (warm specs and benchmarks)
# ---------------------------------------------------------------------------------------------
def random_tensor(shape, dtype: torch.dtype, device) -> torch.Tensor:
    """Random values of any dtype: normal floats, full-range integers, 0/1 bools, random bytes
    for the rest (float8, ...). A permute moves bytes, so the values only need to differ."""
    shape = tuple(shape)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, device=device).bool()
    if dtype.is_complex or dtype.is_floating_point:
        if dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64,
                     torch.complex64, torch.complex128):
            return torch.randn(shape, dtype=dtype, device=device)
    elif dtype in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64):
        info = torch.iinfo(dtype)
        return torch.randint(info.min, info.max, shape, dtype=dtype, device=device)
    size = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (math.prod(shape) * size,), dtype=torch.uint8, device=device)
    return raw.view(dtype).reshape(shape)


def sample(shapes, dtype: torch.dtype, options: dict, device: torch.device):
    """Inputs for warming and benchmarks: one shape; options: dims (default: reversed), and
    `layout` = "contiguous" (default) or "permuted" (the input is itself a permuted view of a
    contiguous tensor, with the given `layout_dims`)."""
    if len(shapes) != 1:
        raise InvalidArgument(f"permute sample: expected one shape (the input's), got {shapes}")
    shape = list(shapes[0])
    options = dict(options)
    dims = options.pop("dims", None)
    dims = list(range(len(shape)))[::-1] if dims is None else [int(d) for d in dims]
    layout = options.pop("layout", "contiguous")
    if layout == "contiguous":
        x = random_tensor(shape, dtype, device)
    elif layout == "permuted":
        order = [int(d) for d in options.pop("layout_dims", list(range(len(shape)))[::-1])]
        inverse = [order.index(i) for i in range(len(order))]
        base = random_tensor([shape[d] for d in order], dtype, device)
        x = base.permute(inverse)  # a view of `shape` whose memory order is `order`
    else:
        raise InvalidArgument(f"permute sample: layout must be 'contiguous' or 'permuted', "
                              f"got {layout!r}")
    return (x, dims), options


def replay(call: PermuteCall) -> tuple[tuple, dict]:
    """The public call a prepared one came from (tuning's first runs; without out=)."""
    return (call.input, list(call.dims)), {}


OP = register(Op("permute", prepare, [
    TorchBackend(_torch_permute, cost.torch_),
    NaiveBackend(),
    TiledBackend(),
    VectorizedBackend(),
], sample=sample, replay=replay))
