"""softmax and log_softmax along any dim, forward and backward.

The call is viewed as (outer, N, inner): N is the softmax dim, outer the dims before it, inner the
dims after. Five forward algorithms:

  torch     torch.softmax / torch.log_softmax (ATen)
  fused     inner == 1, N <= FUSED_MAX: a row held in registers, 16-byte vector loads and stores:
            one read and one write per element; num_warps grows with the row (~16 values per
            thread). When rows vastly outnumber the programs that fit on the GPU, each program
            takes several rows (a persistent-style grid) and the loop over them is software-
            pipelined (NUM_STAGES), so the next row's load overlaps this row's reductions.
  multirow  inner == 1, N <= MULTIROW_MAX: a [BLOCK_R x BLOCK_N] tile of many short rows per
            program, so a program moves kilobytes, not one 64-byte row.
  online    inner == 1, N > ONLINE_MIN: rows too long for registers. One pass keeps a running max
            and sum per lane (online softmax: s = s * exp(m_old - m_new) + exp(x - m_new)), a
            second pass normalises, reading the chunks in reverse so the ones read last (still in
            L2) come first. With few rows, each row is split over SPLIT programs: a stats kernel
            writes (max, sum) per chunk, a normalising kernel combines them and runs in reverse
            program order.
  strided   inner > 1: softmax over a non-innermost dim with no transpose copy. A program owns
            BLOCK_I contiguous inner columns and reduces a [BLOCK_N x BLOCK_I] tile along axis 0
            (single load when the whole dim fits, else the online two-pass scheme over chunks of
            the dim).

Backward (ops.softmax under autograd): a torch.autograd.Function whose backward runs its own
kernels, whichever forward backend ran (torch's backend uses torch's own autograd):
  softmax      dx = y * (dy - sum(dy * y))
  log_softmax  dx = dy - exp(y) * sum(dy)
with the same layouts: rows (in registers, or two passes over chunks, or split over programs)
and strided tiles.

Numerics follow torch: float16/bfloat16/float32 accumulate in float32, float64 in float64. dtype=
casts the input first; a widening cast is fused into the kernels' load (exact), a narrowing one is
done by torch before the kernel (it rounds). A row of all -inf, or one holding +inf or NaN, gives
NaN as in torch.

Memory layout: kernels take the input with its strides when they fit the pattern a kernel needs
(rows: the softmax dim has stride 1; strided: the innermost dim has stride 1; the dims before and
after must each collapse into one), else the input is made contiguous first (as torch does). The
output is contiguous, as torch's.
"""

from __future__ import annotations

import math
import operator

import torch
import triton
import triton.language as tl

from ..dispatch.backend import Backend, Estimate, TorchBackend
from ..dispatch.device import INTERPRETED, device_info
from ..dispatch.op import Call, Op, register
from ..dispatch.signature import bucket
from ..errors import ArgumentTypeError, DimError, InvalidArgument, TorchOnlyCall
from ..heuristics import softmax as cost
from ._common import FLOAT_DTYPES, Launcher, cdiv, needs_int64, next_pow2

# Longest row the fused backend holds in registers (16 warps x 32 threads x 64 values).
FUSED_MAX = 32768
FUSED_MAX_F64 = 16384
# Widest row the multirow backend packs into tiles.
MULTIROW_MAX = 256
# online takes rows longer than this (shorter ones are the fused and multirow backends' job).
ONLINE_MIN = 1024
# Most elements a program of the strided / backward kernels holds in registers at once.
TILE_MAX = 16384
# Backward rows kernel: rows up to this long are held in registers (two tensors: y and dy).
BWD_SINGLE_MAX = 16384
BWD_SINGLE_MAX_F64 = 8192
# Programs take several tiles only when there are at least WAVES times more tiles than programs
# that can run at once: the GPU schedules programs as slots free up, so the time lost at the end
# (at most one program's duration) stays a small fraction even if the occupancy guess is off.
WAVES = 16

_WIDENING = {(torch.float16, torch.float32), (torch.bfloat16, torch.float32),
             (torch.float16, torch.float64), (torch.bfloat16, torch.float64),
             (torch.float32, torch.float64)}


# ---------------------------------------------------------------------------------------------
# Kernels: helpers
# ---------------------------------------------------------------------------------------------
@triton.jit
def _acc(v, F64: tl.constexpr):
    """The accumulation type: float64 for float64 outputs, else float32 (as torch's accscalar_t)."""
    if F64:
        r = v.to(tl.float64)
    else:
        r = v.to(tl.float32)
    return r


@triton.jit
def _online_step(m, s, x):
    """Fold x into the per-lane running max m and sum s (of exp(. - m)), with one exp per element:
    exactly one of exp(m_old - m_new) and exp(x - m_new) differs from 1, and both are
    exp(-|x - m|)."""
    m_new = tl.maximum(m, x)
    bigger = x > m
    e = tl.exp(tl.where(bigger, m - x, x - m))
    # x = -inf adds exactly nothing (and -inf - -inf would be NaN). A lane still at m = -inf has
    # s = 0, and s * exp(-inf) + 1 = 1. NaN must still reach the sum: the max ignores NaN (maxnum
    # on the GPU), but x - m is NaN. +inf makes the lane's max +inf, and the merge's
    # exp(inf - inf) makes the sum NaN. So a row with NaN or +inf comes out NaN, as in torch.
    s = tl.where(x == float("-inf"), s, tl.where(bigger, s * e + 1.0, s + e))
    return m_new, s


@triton.jit
def _merge(m, s, AXIS: tl.constexpr):
    """Combine per-lane (max, sum) pairs along AXIS into the row's (max, sum), dims kept."""
    big = tl.max(m, axis=AXIS, keep_dims=True)
    # Lanes with s == 0 saw only -inf (their m - big may be NaN); NaN sums stay NaN.
    part = tl.where(s == 0.0, 0.0, s * tl.exp(m - big))
    return big, tl.sum(part, axis=AXIS, keep_dims=True)


#: Triton's interpreter converts float32 to bfloat16 by truncation (toward zero; the GPU rounds
#: to nearest even, as torch does): log_softmax of OpInfo's bfloat16 samples came out one unit
#: in the last place from torch's, and farther from the exact answer. Under the interpreter
#: _cast_for rounds by hand; compiled kernels keep the hardware conversion.
_ROUND_BF16_BY_HAND = tl.constexpr(INTERPRETED)


@triton.jit
def _bf16_nearest_even(v):
    """float32 -> bfloat16, rounded to nearest even on the bits (NaN stays a quiet NaN)."""
    bits = v.to(tl.uint32, bitcast=True)
    rounded = (bits + (0x7FFF + ((bits >> 16) & 1))) >> 16
    rounded = tl.where(v != v, 0x7FC0, rounded)
    return rounded.to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _cast_for(v, ptr):
    """v in the dtype `ptr` points to. float64 reaches bfloat16 through float32, as torch
    converts (c10's BFloat16 is built from a float), and as Triton's interpreter needs (its
    direct float64 -> bfloat16 conversion gives garbage: softmax(bf16 x, dtype=float64)'s
    gradient was off by 0.25)."""
    if v.dtype == tl.float64:
        if ptr.dtype.element_ty == tl.bfloat16:
            v = v.to(tl.float32)
    if _ROUND_BF16_BY_HAND:
        if ptr.dtype.element_ty == tl.bfloat16:
            if v.dtype == tl.float32:
                return _bf16_nearest_even(v)
    return v.to(ptr.dtype.element_ty)


@triton.jit
def _finish(x, big, total, LOG: tl.constexpr):
    """softmax = exp(x - max) / sum, log_softmax = (x - max) - log(sum). A row of -inf has
    max = -inf, so x - max is NaN there, as in torch."""
    z = x - big
    if LOG:
        out = z - tl.log(total)
    else:
        out = tl.exp(z) * (1.0 / total)
    return out


@triton.jit
def _row_and_part(index, split, I64: tl.constexpr):
    """The row and the part of it that program `index` takes when rows are split in `split`."""
    row = index // split
    part = index % split
    if I64:
        row = row.to(tl.int64)
        part = part.to(tl.int64)
    return row, part


# ---------------------------------------------------------------------------------------------
# Kernels: forward
# ---------------------------------------------------------------------------------------------
@triton.jit
def _rows_fwd_kernel(x_ptr, y_ptr, R, n_q, sx_q, sy_q, tiles_per_program,
                     ALIGN: tl.constexpr, LOG: tl.constexpr, F64: tl.constexpr,
                     BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr,
                     NUM_STAGES: tl.constexpr, I64: tl.constexpr):
    """fused (BLOCK_R = 1) and multirow: whole rows in registers, one read and one write.

    N and the row strides arrive divided by ALIGN, their common power-of-two factor (<= 16), and are
    multiplied back here: the compiler then knows every row starts ALIGN-aligned and that the column
    mask is constant over ALIGN-wide groups, so it emits 16-byte vector accesses even when N is not
    a multiple of 16 (Triton only assumes divisibility by 16 of integer arguments)."""
    N = n_q * ALIGN
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    # The loop over this program's tiles is software-pipelined: the next tile's load is issued
    # before the current tile's reductions.
    for i in tl.range(0, tiles_per_program, num_stages=NUM_STAGES):
        tile = pid * tiles_per_program + i
        if I64:
            tile = tile.to(tl.int64)
        rows = tile * BLOCK_R + tl.arange(0, BLOCK_R)
        mask = rows[:, None] < R
        if not EVEN_N:
            mask = mask & (cols[None, :] < N)
        x = tl.load(x_ptr + (rows * sx_q * ALIGN)[:, None] + cols[None, :], mask=mask,
                    other=float("-inf"))
        x = _acc(x, F64)
        big = tl.max(x, axis=1, keep_dims=True)
        z = x - big
        e = tl.exp(z)
        total = tl.sum(e, axis=1, keep_dims=True)
        if LOG:
            out = z - tl.log(total)
        else:
            out = e * (1.0 / total)
        tl.store(y_ptr + (rows * sy_q * ALIGN)[:, None] + cols[None, :],
                 _cast_for(out, y_ptr), mask=mask)


@triton.jit
def _online_fwd_kernel(x_ptr, y_ptr, n_q, sx_q, sy_q,
                       ALIGN: tl.constexpr, LOG: tl.constexpr, F64: tl.constexpr,
                       BLOCK_N: tl.constexpr, I64: tl.constexpr):
    """online, one program per row: a running (max, sum) pass, then a normalising pass."""
    N = n_q * ALIGN
    row = tl.program_id(0)
    if I64:
        row = row.to(tl.int64)
    x_row = x_ptr + row * sx_q * ALIGN
    y_row = y_ptr + row * sy_q * ALIGN
    cols = tl.arange(0, BLOCK_N)
    m = _acc(tl.full([BLOCK_N], float("-inf"), tl.float32), F64)
    s = _acc(tl.zeros([BLOCK_N], tl.float32), F64)
    for start in range(0, N, BLOCK_N):
        offs = start + cols
        x = _acc(tl.load(x_row + offs, mask=offs < N, other=float("-inf")), F64)
        m, s = _online_step(m, s, x)
    big, total = _merge(m, s, 0)
    # Backwards: the chunks read last by the first pass are the likeliest to still be in L2.
    n_chunks = tl.cdiv(N, BLOCK_N)
    for i in range(0, n_chunks):
        offs = (n_chunks - 1 - i) * BLOCK_N + cols
        mask = offs < N
        x = _acc(tl.load(x_row + offs, mask=mask, other=float("-inf")), F64)
        tl.store(y_row + offs, _cast_for(_finish(x, big, total, LOG), y_ptr), mask=mask)


@triton.jit
def _split_stats_kernel(x_ptr, m_ptr, s_ptr, n_q, sx_q, chunk, split,
                        ALIGN: tl.constexpr, F64: tl.constexpr, BLOCK_N: tl.constexpr,
                        I64: tl.constexpr):
    """online with SPLIT > 1, step 1: (max, sum) of one chunk of one row. chunk is a multiple
    of BLOCK_N."""
    N = n_q * ALIGN
    pid = tl.program_id(0)
    row, part = _row_and_part(pid, split, I64)
    x_row = x_ptr + row * sx_q * ALIGN
    first = part * chunk
    cols = tl.arange(0, BLOCK_N)
    m = _acc(tl.full([BLOCK_N], float("-inf"), tl.float32), F64)
    s = _acc(tl.zeros([BLOCK_N], tl.float32), F64)
    for start in range(0, chunk, BLOCK_N):
        offs = first + start + cols
        x = _acc(tl.load(x_row + offs, mask=offs < N, other=float("-inf")), F64)
        m, s = _online_step(m, s, x)
    big, total = _merge(m, s, 0)
    one = tl.arange(0, 1)
    tl.store(m_ptr + pid + one, big)
    tl.store(s_ptr + pid + one, total)


@triton.jit
def _split_norm_kernel(x_ptr, y_ptr, m_ptr, s_ptr, n_q, sx_q, sy_q, chunk, split,
                       ALIGN: tl.constexpr, LOG: tl.constexpr, F64: tl.constexpr,
                       SPLIT_POW2: tl.constexpr, BLOCK_N: tl.constexpr, I64: tl.constexpr):
    """online with SPLIT > 1, step 2: combine the row's chunk statistics, normalise one chunk."""
    N = n_q * ALIGN
    # Reverse program order (and reverse chunk order inside): the data the stats kernel read last
    # is still in L2.
    pid = tl.num_programs(0) - 1 - tl.program_id(0)
    row, part = _row_and_part(pid, split, I64)
    k = tl.arange(0, SPLIT_POW2)
    pm = tl.load(m_ptr + row * split + k, mask=k < split, other=float("-inf"))
    ps = tl.load(s_ptr + row * split + k, mask=k < split, other=0.0)
    big, total = _merge(pm, ps, 0)
    x_row = x_ptr + row * sx_q * ALIGN
    y_row = y_ptr + row * sy_q * ALIGN
    cols = tl.arange(0, BLOCK_N)
    last = part * chunk + chunk - BLOCK_N
    for start in range(0, chunk, BLOCK_N):
        offs = last - start + cols
        mask = offs < N
        x = _acc(tl.load(x_row + offs, mask=mask, other=float("-inf")), F64)
        tl.store(y_row + offs, _cast_for(_finish(x, big, total, LOG), y_ptr), mask=mask)


@triton.jit
def _coop_fwd_kernel(x_ptr, y_ptr, part_ptr, sync_ptr, n_q, sx_q, sy_q, split, rows,
                     ALIGN: tl.constexpr, LOG: tl.constexpr, F64: tl.constexpr,
                     CHUNK: tl.constexpr, SPLIT_POW2: tl.constexpr, SPIN_LIMIT: tl.constexpr,
                     FALLBACK_BLOCK: tl.constexpr, I64: tl.constexpr):
    """online, cooperative: `split` programs share a row, each holding one CHUNK of it in
    registers. Each publishes its chunk's (max, sum), waits for the row's other chunks, merges
    and normalises its registers: one read and one write of the row, in one launch.

    Chunks are handed out by ticket (an atomic counter), not by program id, so they go to
    programs in the order the programs start: a program that waits holds the last ticket taken
    so far of its row, and the row's remaining tickets go to programs that are running or start
    next. At least `split` programs run at once (split <= SM count), so the wait ends. If it ever
    does not (SPIN_LIMIT polls: another kernel holding the SMs, or the interpreter, which runs
    programs one by one), the program reads its whole row to compute the statistics itself:
    slower, never wrong and never hung."""
    N = n_q * ALIGN
    ticket = tl.atomic_add(sync_ptr, 1, sem="relaxed")
    row, part = _row_and_part(ticket, split, I64)
    x_row = x_ptr + row * sx_q * ALIGN
    y_row = y_ptr + row * sy_q * ALIGN
    offs = part * CHUNK + tl.arange(0, CHUNK)
    mask = offs < N
    x = _acc(tl.load(x_row + offs, mask=mask, other=float("-inf")), F64)
    big = tl.max(x, axis=0)
    # -inf lanes add nothing (an all -inf chunk has big = -inf, and -inf - -inf would be NaN).
    total = tl.sum(tl.where(x == float("-inf"), 0.0, tl.exp(x - big)), axis=0)
    one = tl.arange(0, 1)
    slot = row * split + part
    tl.store(part_ptr + slot + one, big + tl.zeros([1], big.dtype))
    tl.store(part_ptr + rows * split + slot + one, total + tl.zeros([1], total.dtype))
    tl.debug_barrier()  # every thread's stores precede the release below
    counter = sync_ptr + 1 + row
    tl.atomic_add(counter, 1, sem="release")
    arrived = tl.atomic_add(counter, 0, sem="acquire")
    polls = tl.full([], 0, tl.int32)
    while (arrived < split) & (polls < SPIN_LIMIT):
        arrived = tl.atomic_add(counter, 0, sem="acquire")
        polls += 1
    if arrived >= split:
        k = tl.arange(0, SPLIT_POW2)
        used = k < split
        pm = tl.load(part_ptr + row * split + k, mask=used, other=float("-inf"),
                     cache_modifier=".cg")
        ps = tl.load(part_ptr + rows * split + row * split + k, mask=used, other=0.0,
                     cache_modifier=".cg")
        row_max, row_sum = _merge(pm, ps, 0)
    else:
        # (a narrower block than the chunk: x stays live in registers meanwhile)
        cols = tl.arange(0, FALLBACK_BLOCK)
        m = _acc(tl.full([FALLBACK_BLOCK], float("-inf"), tl.float32), F64)
        t = _acc(tl.zeros([FALLBACK_BLOCK], tl.float32), F64)
        for start in range(0, N, FALLBACK_BLOCK):
            o = start + cols
            m, t = _online_step(m, t, _acc(tl.load(x_row + o, mask=o < N, other=float("-inf")),
                                           F64))
        row_max, row_sum = _merge(m, t, 0)
    tl.store(y_row + offs, _cast_for(_finish(x, row_max, row_sum, LOG), y_ptr),
             mask=mask)


@triton.jit
def _strided_fwd_kernel(x_ptr, y_ptr, N, inner_q, n_iblocks, sxo_q, sxn_q,
                        ALIGN: tl.constexpr, LOG: tl.constexpr, F64: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_I: tl.constexpr, SINGLE: tl.constexpr,
                        I64: tl.constexpr):
    """strided: x viewed as (outer, N, inner) with inner contiguous; the output is contiguous.

    A program owns BLOCK_I consecutive inner columns of one outer index: every load is a row of
    BLOCK_I contiguous elements (coalesced, vectorised), and the reduction runs along axis 0 of the
    [BLOCK_N x BLOCK_I] tile, so no transpose copy is needed."""
    inner = inner_q * ALIGN
    pid = tl.program_id(0)
    o = pid // n_iblocks
    ib = pid % n_iblocks
    r = tl.arange(0, BLOCK_N)
    if I64:
        o = o.to(tl.int64)
        r = r.to(tl.int64)
    cols = ib * BLOCK_I + tl.arange(0, BLOCK_I)
    cmask = cols[None, :] < inner
    x_base = x_ptr + o * sxo_q * ALIGN + cols[None, :]
    y_base = y_ptr + o * N * inner + cols[None, :]
    if SINGLE:
        mask = (r[:, None] < N) & cmask
        x = _acc(tl.load(x_base + (r * sxn_q * ALIGN)[:, None], mask=mask, other=float("-inf")),
                 F64)
        big = tl.max(x, axis=0, keep_dims=True)
        z = x - big
        e = tl.exp(z)
        total = tl.sum(e, axis=0, keep_dims=True)
        if LOG:
            out = z - tl.log(total)
        else:
            out = e * (1.0 / total)
        tl.store(y_base + (r * inner)[:, None], _cast_for(out, y_ptr), mask=mask)
    else:
        m = _acc(tl.full([BLOCK_N, BLOCK_I], float("-inf"), tl.float32), F64)
        s = _acc(tl.zeros([BLOCK_N, BLOCK_I], tl.float32), F64)
        for start in range(0, N, BLOCK_N):
            rr = start + r
            mask = (rr[:, None] < N) & cmask
            x = _acc(tl.load(x_base + (rr * sxn_q * ALIGN)[:, None], mask=mask,
                             other=float("-inf")), F64)
            m, s = _online_step(m, s, x)
        big, total = _merge(m, s, 0)
        n_chunks = tl.cdiv(N, BLOCK_N)
        for i in range(0, n_chunks):
            rr = (n_chunks - 1 - i) * BLOCK_N + r
            mask = (rr[:, None] < N) & cmask
            x = _acc(tl.load(x_base + (rr * sxn_q * ALIGN)[:, None], mask=mask,
                             other=float("-inf")), F64)
            tl.store(y_base + (rr * inner)[:, None],
                     _cast_for(_finish(x, big, total, LOG), y_ptr), mask=mask)


# ---------------------------------------------------------------------------------------------
# Kernels: backward. y and dx are contiguous; dy (g) has its own strides.
# ---------------------------------------------------------------------------------------------
@triton.jit
def _grad(y, g, t, LOG: tl.constexpr):
    if LOG:
        dx = g - tl.exp(y) * t
    else:
        dx = y * (g - t)
    return dx


@triton.jit
def _rows_bwd_kernel(y_ptr, g_ptr, dx_ptr, R, n_q, sg_q, tiles_per_program,
                     ALIGN: tl.constexpr, LOG: tl.constexpr, F64: tl.constexpr,
                     BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr,
                     SINGLE: tl.constexpr, NUM_STAGES: tl.constexpr, I64: tl.constexpr):
    """Rows: SINGLE holds [BLOCK_R x N] of y and dy in registers (two reads, one write); else one
    row at a time in two passes over chunks (the sum, then dx, the second pass backwards)."""
    N = n_q * ALIGN
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    for i in tl.range(0, tiles_per_program, num_stages=NUM_STAGES):
        tile = pid * tiles_per_program + i
        if I64:
            tile = tile.to(tl.int64)
        rows = tile * BLOCK_R + tl.arange(0, BLOCK_R)
        rmask = rows[:, None] < R
        y_off = (rows * n_q * ALIGN)[:, None]
        g_off = (rows * sg_q * ALIGN)[:, None]
        if SINGLE:
            mask = rmask
            if not EVEN_N:
                mask = mask & (cols[None, :] < N)
            y = _acc(tl.load(y_ptr + y_off + cols[None, :], mask=mask, other=0.0), F64)
            g = _acc(tl.load(g_ptr + g_off + cols[None, :], mask=mask, other=0.0), F64)
            if LOG:
                t = tl.sum(g, axis=1, keep_dims=True)
            else:
                t = tl.sum(g * y, axis=1, keep_dims=True)
            tl.store(dx_ptr + y_off + cols[None, :],
                     _cast_for(_grad(y, g, t, LOG), dx_ptr), mask=mask)
        else:
            part = _acc(tl.zeros([BLOCK_R, BLOCK_N], tl.float32), F64)
            for start in range(0, N, BLOCK_N):
                c = start + cols[None, :]
                mask = rmask & (c < N)
                g = _acc(tl.load(g_ptr + g_off + c, mask=mask, other=0.0), F64)
                if LOG:
                    part += g
                else:
                    part += g * _acc(tl.load(y_ptr + y_off + c, mask=mask, other=0.0), F64)
            t = tl.sum(part, axis=1, keep_dims=True)
            n_chunks = tl.cdiv(N, BLOCK_N)
            for j in range(0, n_chunks):
                c = (n_chunks - 1 - j) * BLOCK_N + cols[None, :]
                mask = rmask & (c < N)
                y = _acc(tl.load(y_ptr + y_off + c, mask=mask, other=0.0), F64)
                g = _acc(tl.load(g_ptr + g_off + c, mask=mask, other=0.0), F64)
                tl.store(dx_ptr + y_off + c, _cast_for(_grad(y, g, t, LOG), dx_ptr),
                         mask=mask)


@triton.jit
def _split_bwd_sum_kernel(y_ptr, g_ptr, t_ptr, n_q, sg_q, chunk, split,
                          ALIGN: tl.constexpr, LOG: tl.constexpr, F64: tl.constexpr,
                          BLOCK_N: tl.constexpr, I64: tl.constexpr):
    """Few long rows, step 1: the partial sum (of dy, or dy * y) of one chunk of one row."""
    N = n_q * ALIGN
    pid = tl.program_id(0)
    row, part = _row_and_part(pid, split, I64)
    first = part * chunk
    cols = tl.arange(0, BLOCK_N)
    acc = _acc(tl.zeros([BLOCK_N], tl.float32), F64)
    for start in range(0, chunk, BLOCK_N):
        offs = first + start + cols
        mask = offs < N
        g = _acc(tl.load(g_ptr + row * sg_q * ALIGN + offs, mask=mask, other=0.0), F64)
        if LOG:
            acc += g
        else:
            acc += g * _acc(tl.load(y_ptr + row * n_q * ALIGN + offs, mask=mask, other=0.0), F64)
    tl.store(t_ptr + pid + tl.arange(0, 1), tl.sum(acc, axis=0, keep_dims=True))


@triton.jit
def _split_bwd_apply_kernel(y_ptr, g_ptr, dx_ptr, t_ptr, n_q, sg_q, chunk, split,
                            ALIGN: tl.constexpr, LOG: tl.constexpr, F64: tl.constexpr,
                            SPLIT_POW2: tl.constexpr, BLOCK_N: tl.constexpr, I64: tl.constexpr):
    """Few long rows, step 2 (reverse order, for L2 hits): dx of one chunk."""
    N = n_q * ALIGN
    pid = tl.num_programs(0) - 1 - tl.program_id(0)
    row, part = _row_and_part(pid, split, I64)
    k = tl.arange(0, SPLIT_POW2)
    t = tl.sum(tl.load(t_ptr + row * split + k, mask=k < split, other=0.0), axis=0, keep_dims=True)
    cols = tl.arange(0, BLOCK_N)
    last = part * chunk + chunk - BLOCK_N
    for start in range(0, chunk, BLOCK_N):
        offs = last - start + cols
        mask = offs < N
        y = _acc(tl.load(y_ptr + row * n_q * ALIGN + offs, mask=mask, other=0.0), F64)
        g = _acc(tl.load(g_ptr + row * sg_q * ALIGN + offs, mask=mask, other=0.0), F64)
        tl.store(dx_ptr + row * n_q * ALIGN + offs, _cast_for(_grad(y, g, t, LOG), dx_ptr),
                 mask=mask)


@triton.jit
def _strided_bwd_kernel(y_ptr, g_ptr, dx_ptr, N, inner_q, n_iblocks, sgo_q, sgn_q,
                        ALIGN: tl.constexpr, LOG: tl.constexpr, F64: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_I: tl.constexpr, SINGLE: tl.constexpr,
                        I64: tl.constexpr):
    """Backward of strided: [BLOCK_N x BLOCK_I] tiles reduced along axis 0."""
    inner = inner_q * ALIGN
    pid = tl.program_id(0)
    o = pid // n_iblocks
    ib = pid % n_iblocks
    r = tl.arange(0, BLOCK_N)
    if I64:
        o = o.to(tl.int64)
        r = r.to(tl.int64)
    cols = ib * BLOCK_I + tl.arange(0, BLOCK_I)
    cmask = cols[None, :] < inner
    y_base = y_ptr + o * N * inner + cols[None, :]
    dx_base = dx_ptr + o * N * inner + cols[None, :]
    g_base = g_ptr + o * sgo_q * ALIGN + cols[None, :]
    if SINGLE:
        mask = (r[:, None] < N) & cmask
        y = _acc(tl.load(y_base + (r * inner)[:, None], mask=mask, other=0.0), F64)
        g = _acc(tl.load(g_base + (r * sgn_q * ALIGN)[:, None], mask=mask, other=0.0), F64)
        if LOG:
            t = tl.sum(g, axis=0, keep_dims=True)
        else:
            t = tl.sum(g * y, axis=0, keep_dims=True)
        tl.store(dx_base + (r * inner)[:, None], _cast_for(_grad(y, g, t, LOG), dx_ptr),
                 mask=mask)
    else:
        part = _acc(tl.zeros([BLOCK_N, BLOCK_I], tl.float32), F64)
        for start in range(0, N, BLOCK_N):
            rr = start + r
            mask = (rr[:, None] < N) & cmask
            g = _acc(tl.load(g_base + (rr * sgn_q * ALIGN)[:, None], mask=mask, other=0.0), F64)
            if LOG:
                part += g
            else:
                part += g * _acc(tl.load(y_base + (rr * inner)[:, None], mask=mask, other=0.0), F64)
        t = tl.sum(part, axis=0, keep_dims=True)
        n_chunks = tl.cdiv(N, BLOCK_N)
        for i in range(0, n_chunks):
            rr = (n_chunks - 1 - i) * BLOCK_N + r
            mask = (rr[:, None] < N) & cmask
            y = _acc(tl.load(y_base + (rr * inner)[:, None], mask=mask, other=0.0), F64)
            g = _acc(tl.load(g_base + (rr * sgn_q * ALIGN)[:, None], mask=mask, other=0.0), F64)
            tl.store(dx_base + (rr * inner)[:, None],
                     _cast_for(_grad(y, g, t, LOG), dx_ptr), mask=mask)


_HELPERS = (_acc, _online_step, _merge, _finish, _row_and_part, _cast_for, _bf16_nearest_even)
_BWD_KERNELS = (_grad, _rows_bwd_kernel, _split_bwd_sum_kernel, _split_bwd_apply_kernel,
                _strided_bwd_kernel)


# ---------------------------------------------------------------------------------------------
# The call: torch.softmax's argument rules and the memory layout
# ---------------------------------------------------------------------------------------------
class SoftmaxCall(Call):
    __slots__ = ("x", "dim", "log", "dtype_arg", "out_dtype", "cast_first", "outer", "n", "inner",
                 "so", "sn", "fast", "grad")

    @property
    def empty(self) -> bool:
        return self.outer == 0 or self.n == 0 or self.inner == 0

    def describe(self) -> str:
        x = self.x
        name = "log_softmax" if self.log else "softmax"
        cast = f" -> {str(self.out_dtype)[6:]}" if self.out_dtype != x.dtype else ""
        layout = "" if self.fast else ", strides need a copy"
        return (f"{name} of {tuple(x.shape)} {str(x.dtype)[6:]}{cast} over dim {self.dim} "
                f"(outer {self.outer}, dim {self.n}, inner {self.inner}{layout}) on {x.device}")

    @property
    def numel(self) -> int:
        return self.outer * self.n * self.inner

    @property
    def f64(self) -> bool:
        return self.out_dtype == torch.float64

    @property
    def in_bytes(self) -> int:
        """Bytes per element the kernels read: the input's, or the output's after a torch cast."""
        return self.out_dtype.itemsize if self.cast_first else self.x.dtype.itemsize


def _collapse(shape, strides, lo: int, hi: int):
    """Stride of dims lo..hi-1 viewed as one dim, or None when they do not form one (size-1 dims
    are ignored; 0 when all are size 1)."""
    stride = None
    expect = None
    for i in range(hi - 1, lo - 1, -1):
        d = shape[i]
        if d == 1:
            continue
        if stride is None:
            stride = strides[i]
        elif strides[i] != expect:
            return None
        expect = strides[i] * d
    return 0 if stride is None else stride


def _prepare(name: str, log: bool, input, dim, dtype) -> SoftmaxCall:
    if not isinstance(input, torch.Tensor):
        raise ArgumentTypeError(f"{name}: input must be a tensor, got {type(input).__name__}")
    if type(dim) is not int:
        if dim is None:
            raise ArgumentTypeError(f"{name}: dim must be an int (None is not accepted: name the dim)")
        try:
            dim = operator.index(dim)
        except TypeError:
            raise ArgumentTypeError(f"{name}: dim must be an int, got {type(dim).__name__}") from None
    in_dtype = input.dtype
    if dtype is None:
        out_dtype = in_dtype
    elif isinstance(dtype, torch.dtype):
        out_dtype = dtype
    else:
        raise ArgumentTypeError(f"{name}: dtype must be a torch.dtype or None, got {dtype!r}")
    if out_dtype not in FLOAT_DTYPES:
        # Integers, bool, complex, quantized: torch has no softmax kernel for most (it raises its
        # own NotImplementedError) and answers the rest.
        what = "dtype" if dtype is not None else "input"
        raise TorchOnlyCall(f"{name}: {what} is {str(out_dtype)[6:]}; opselect's kernels take "
                            "float16, bfloat16, float32 and float64")
    shape = input.shape
    rank = len(shape)
    width = rank or 1
    if not -width <= dim < width:
        raise DimError(f"{name}: dim {dim} is out of range for a {rank}-d input (expected "
                       f"[{-width}, {width - 1}])")
    if dim < 0:
        dim += width
    cast_first = in_dtype is not out_dtype and (in_dtype, out_dtype) not in _WIDENING
    if rank == 0:
        outer = n = inner = so = sn = 1
        fast = True
    else:
        n = shape[dim]
        outer = math.prod(shape[:dim])
        inner = math.prod(shape[dim + 1:])
        if input.is_contiguous():  # the common case, without looking at the strides
            so, sn, fast = n * inner, inner, True
        else:
            strides = input.stride()
            so = _collapse(shape, strides, 0, dim)
            sn = strides[dim] if n > 1 else 1
            if inner == 1:
                fast = so is not None and sn == 1
            else:
                fast = so is not None and _collapse(shape, strides, dim + 1, rank) == 1
    call = SoftmaxCall()
    call.x, call.dim, call.log, call.dtype_arg, call.out_dtype = input, dim, log, dtype, out_dtype
    call.cast_first = cast_first
    call.outer, call.n, call.inner, call.so, call.sn = outer, n, inner, so, sn
    call.fast = fast = fast and not cast_first
    # Under autograd the Triton backends add a Python autograd.Function (host time): its own key.
    call.grad = grad = input.requires_grad and torch.is_grad_enabled()
    dev = input.device
    call.info = device_info(dev)
    call.key = (dev.index if dev.type == "cuda" else dev.type, in_dtype, out_dtype,
                bucket(outer), bucket(n), bucket(inner), fast, grad)
    return call


def prepare_softmax(input, dim=-1, *, dtype=None) -> SoftmaxCall:
    return _prepare("softmax", False, input, dim, dtype)


def prepare_log_softmax(input, dim=-1, *, dtype=None) -> SoftmaxCall:
    return _prepare("log_softmax", True, input, dim, dtype)


# ---------------------------------------------------------------------------------------------
# Launch helpers
# ---------------------------------------------------------------------------------------------
# Bound launches (kernels/_common.py): Triton binds a kernel's arguments once per spec, later calls
# go straight to the compiled kernel. A spec is the input and output dtypes (the scratch tensors'
# follow from F64), every integer argument, the constexprs and the warps. LAUNCHERS names them by
# kernel, for tests that watch the launches.
_ROWS_FWD = Launcher(_rows_fwd_kernel)
_ONLINE_FWD = Launcher(_online_fwd_kernel)
_SPLIT_STATS = Launcher(_split_stats_kernel)
_SPLIT_NORM = Launcher(_split_norm_kernel)
_COOP_FWD = Launcher(_coop_fwd_kernel)
_STRIDED_FWD = Launcher(_strided_fwd_kernel)
_ROWS_BWD = Launcher(_rows_bwd_kernel)
_SPLIT_BWD_SUM = Launcher(_split_bwd_sum_kernel)
_SPLIT_BWD_APPLY = Launcher(_split_bwd_apply_kernel)
_STRIDED_BWD = Launcher(_strided_bwd_kernel)
LAUNCHERS = {launcher.fn.__name__: launcher for launcher in (
    _ROWS_FWD, _ONLINE_FWD, _SPLIT_STATS, _SPLIT_NORM, _COOP_FWD, _STRIDED_FWD, _ROWS_BWD,
    _SPLIT_BWD_SUM, _SPLIT_BWD_APPLY, _STRIDED_BWD)}


def _align(*values: int) -> int:
    """The largest power of two (<= 16) dividing every value."""
    a = 16
    for v in values:
        while a > 1 and v % a:
            a //= 2
    return a


def _warps(elements: int) -> int:
    """About 16 elements per thread (loads in flight without spilling registers): one warp for
    512 elements, 16 from 8192 up."""
    return max(1, min(16, next_pow2(elements) // 512))


def _resident(sm_count: int, warps: int, elements: int, f64: bool) -> int:
    """A guess at how many programs run at once: limited by warps (64 per SM) and registers (64K
    per SM). Registers per thread ~ 24 + 1.25 per 32-bit value held (fitted to ptxas's counts for
    these kernels on sm_90)."""
    per_thread = elements / (warps * 32) * (2 if f64 else 1)
    regs = min(255, 8 * math.ceil((24 + 1.25 * per_thread) / 8))
    per_sm = max(1, min(64 // warps, 65536 // (regs * 32 * warps), 16))
    return sm_count * per_sm


def _tiles_per_program(tiles: int, resident: int) -> int:
    return max(1, min(64, tiles // max(1, WAVES * resident)))


def _operand(call: SoftmaxCall) -> tuple[torch.Tensor, int, int]:
    """The tensor the kernels read, with its (outer, dim) strides (inner stride 1)."""
    x = call.x.detach()
    if call.cast_first:
        x = x.to(call.out_dtype, memory_format=torch.contiguous_format)
    if call.fast:
        return x, call.so, call.sn
    x = x.contiguous()
    return x, call.n * call.inner, call.inner


def _new(shape, dtype: torch.dtype, device) -> torch.Tensor:
    """Every tensor the kernels write (tests replace it with one that poisons the memory)."""
    return torch.empty(shape, dtype=dtype, device=device)


def _empty_out(call: SoftmaxCall) -> torch.Tensor:
    return _new(call.x.shape, call.out_dtype, call.x.device)


def _rows_fwd(call: SoftmaxCall, block_r: int, warps: int, stages: int) -> torch.Tensor:
    x, sx, _ = _operand(call)
    y = _empty_out(call)
    n, rows = call.n, call.outer
    bn = next_pow2(n)
    block_r = max(1, min(block_r, TILE_MAX // bn, next_pow2(rows)))
    tiles = cdiv(rows, block_r)
    resident = _resident(call.info.sm_count, warps, block_r * bn, call.f64)
    per = _tiles_per_program(tiles, resident)
    a = _align(n, sx)
    ints = (rows, n // a, sx // a, n // a, per)
    log, f64, stages = call.log, call.f64, stages if per > 1 else 1
    i64 = needs_int64(call.numel + block_r * bn, rows * sx + n)
    _ROWS_FWD((x.dtype, y.dtype, ints, a, log, f64, block_r, bn, stages, i64, warps),
              (cdiv(tiles, per),), (x, y, *ints),
              lambda: dict(ALIGN=a, LOG=log, F64=f64, BLOCK_R=block_r, BLOCK_N=bn,
                           EVEN_N=bn == n, NUM_STAGES=stages, I64=i64, num_warps=warps))
    return y


# A cooperative row has at most this many chunks (a program each, all running at once).
COOP_MAX_SPLIT = 64
COOP_SPIN_LIMIT = 1 << 20


def coop_split(call: SoftmaxCall, chunk: int) -> int | None:
    """Programs per row of the cooperative kernel with chunks of `chunk`, or None if the row
    needs more than may be relied on to run at once (one per SM; the interpreter runs them one
    by one whatever the count)."""
    split = cdiv(call.n, chunk)
    limit = COOP_MAX_SPLIT if call.info.interpreted else min(COOP_MAX_SPLIT, call.info.sm_count)
    return split if 1 < split <= limit else None


def _coop_fwd(call: SoftmaxCall, chunk: int, warps: int) -> torch.Tensor:
    x, sx, _ = _operand(call)
    y = _empty_out(call)
    n, rows = call.n, call.outer
    split = coop_split(call, chunk)
    if split is None:
        # A cached config of this shape bucket, for a row this chunk size does not suit.
        block = 2048 if call.f64 else 4096
        return _online_fwd(call, block, 8, OnlineBackend.split_for(call, block, call.info.sm_count))
    a = _align(n, sx)
    acc = torch.float64 if call.f64 else torch.float32
    partials = torch.empty(2 * rows * split, dtype=acc, device=x.device)  # maxima, then sums
    sync = torch.zeros(1 + rows, dtype=torch.int32, device=x.device)  # ticket, arrivals per row
    ints = (n // a, sx // a, n // a, split, rows)
    log, f64 = call.log, call.f64
    spin = 1 if call.info.interpreted else COOP_SPIN_LIMIT
    fallback = min(chunk, 64 * 32 * warps // 16)
    i64 = needs_int64(call.numel + chunk, rows * sx + n, 2 * rows * split)
    _COOP_FWD((x.dtype, y.dtype, ints, a, log, f64, chunk, spin, fallback, i64, warps),
              (rows * split,), (x, y, partials, sync, *ints),
              lambda: dict(ALIGN=a, LOG=log, F64=f64, CHUNK=chunk, SPLIT_POW2=next_pow2(split),
                           SPIN_LIMIT=spin, FALLBACK_BLOCK=fallback, I64=i64, num_warps=warps))
    return y


def _online_fwd(call: SoftmaxCall, block: int, warps: int, split: int) -> torch.Tensor:
    x, sx, _ = _operand(call)
    y = _empty_out(call)
    n, rows = call.n, call.outer
    block = min(block, next_pow2(n))
    split = max(1, min(split, cdiv(n, block)))
    a = _align(n, sx)
    i64 = needs_int64(call.numel + split * block, rows * sx + n)
    log, f64 = call.log, call.f64
    if split == 1:
        ints = (n // a, sx // a, n // a)
        _ONLINE_FWD((x.dtype, y.dtype, ints, a, log, f64, block, i64, warps), (rows,),
                    (x, y, *ints),
                    lambda: dict(ALIGN=a, LOG=log, F64=f64, BLOCK_N=block, I64=i64,
                                 num_warps=warps))
        return y
    chunk = cdiv(cdiv(n, split), block) * block
    split = cdiv(n, chunk)
    acc = torch.float64 if call.f64 else torch.float32
    m = torch.empty(rows * split, dtype=acc, device=x.device)
    s = torch.empty(rows * split, dtype=acc, device=x.device)
    stats = (n // a, sx // a, chunk, split)
    _SPLIT_STATS((x.dtype, stats, a, f64, block, i64, warps), (rows * split,),
                 (x, m, s, *stats),
                 lambda: dict(ALIGN=a, F64=f64, BLOCK_N=block, I64=i64, num_warps=warps))
    norm = (n // a, sx // a, n // a, chunk, split)
    _SPLIT_NORM((x.dtype, y.dtype, norm, a, log, f64, block, i64, warps), (rows * split,),
                (x, y, m, s, *norm),
                lambda: dict(ALIGN=a, LOG=log, F64=f64, SPLIT_POW2=next_pow2(split),
                             BLOCK_N=block, I64=i64, num_warps=warps))
    return y


def _strided_plan(n: int, inner: int, outer: int, itemsize: int, sm_count: int,
                  block_i: int | None = None, tile: int = TILE_MAX) -> tuple[int, int, bool]:
    """(BLOCK_I, BLOCK_N, SINGLE) for a [dim x inner] reduction along axis 0: BLOCK_I inner columns
    per program, and the whole dim in registers (SINGLE) when BLOCK_N x BLOCK_I fits in `tile`."""
    pn = next_pow2(n)
    # Row segments of 128 bytes (a cache line) by default, at most 2 KB; down to 32 bytes (a
    # sector, still fully used) when that keeps the whole dim in registers or gives every SM work.
    wide_i = max(1, min(next_pow2(inner), 128 // itemsize))
    min_i = max(1, min(next_pow2(inner), 32 // itemsize))
    if block_i is None:
        block_i = min(next_pow2(inner), 2048 // itemsize, max(wide_i, tile // pn))
        if pn * block_i > tile and tile // pn >= min_i:
            block_i = tile // pn  # one read instead of two, with shorter segments
        while block_i > min_i and outer * cdiv(inner, block_i) < 2 * sm_count:
            block_i //= 2
    block_i = max(1, min(block_i, next_pow2(inner)))
    if pn * block_i <= tile:
        return block_i, pn, True
    # Chunks of the dim: the loop keeps a running max and sum per lane, so a chunk is a quarter
    # of the tile (state, the chunk and its exponentials share the registers).
    return block_i, max(1, min(pn, tile // (4 * block_i))), False


def _strided_fwd(call: SoftmaxCall, block_i: int, tile: int, warp_scale: int) -> torch.Tensor:
    x, so, sn = _operand(call)
    y = _empty_out(call)
    n, inner, outer = call.n, call.inner, call.outer
    bi, bn, single = _strided_plan(n, inner, outer, call.in_bytes, call.info.sm_count, block_i,
                                   tile)
    warps = min(32, _warps(bi * bn) * warp_scale)
    n_ib = cdiv(inner, bi)
    a = _align(inner, so, sn)
    ints = (n, inner // a, n_ib, so // a, sn // a)
    log, f64 = call.log, call.f64
    i64 = needs_int64(call.numel + bn * bi, outer * so + n * sn + inner)
    _STRIDED_FWD((x.dtype, y.dtype, ints, a, log, f64, bn, bi, single, i64, warps),
                 (outer * n_ib,), (x, y, *ints),
                 lambda: dict(ALIGN=a, LOG=log, F64=f64, BLOCK_N=bn, BLOCK_I=bi, SINGLE=single,
                              I64=i64, num_warps=warps))
    return y


# ---------------------------------------------------------------------------------------------
# Autograd
# ---------------------------------------------------------------------------------------------
_functorch_active = torch._C._are_functorch_transforms_active
_wrapped = torch._C._functorch.is_functorch_wrapped_tensor
_legacy_batched = torch._C._functorch.is_legacy_batchedtensor


def kernels_cannot_read(g: torch.Tensor) -> bool:
    """g is batched or wrapped by a function transform (torch.func's vmap, or the legacy vmap
    that gradcheck's batched checks use): it has no memory a kernel could read."""
    return _functorch_active() or _wrapped(g) or _legacy_batched(g)


class _SoftmaxFunction(torch.autograd.Function):
    """Forward: the chosen backend's kernels. Backward: backward()'s kernels (or, when a graph of
    the backward is wanted for double backward, the same formula in differentiable torch ops)."""

    @staticmethod
    def forward(ctx, x, call, launch):
        y = launch()
        ctx.save_for_backward(y)
        ctx.geom = (call.log, call.dim)
        ctx.in_dtype = x.dtype
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        log, dim = ctx.geom
        if torch.is_grad_enabled() or kernels_cannot_read(g):
            # create_graph=True: build the backward from differentiable ops (double backward);
            # under vmap (batched gradients) g is a BatchedTensor, whose memory the kernels
            # cannot read, and torch's ops batch it.
            d = dim if y.dim() else None
            if log:
                dx = g - torch.exp(y) * (g.sum(d, keepdim=True) if d is not None else g)
            else:
                dx = y * (g - ((g * y).sum(d, keepdim=True) if d is not None else g * y))
            return dx.to(ctx.in_dtype), None, None
        if y.is_cuda and y.device.index != torch.cuda.current_device():
            with torch.cuda.device(y.device):
                return backward(y, g, dim, log, ctx.in_dtype), None, None
        return backward(y, g, dim, log, ctx.in_dtype), None, None


def backward(y: torch.Tensor, g: torch.Tensor, dim: int, log: bool,
             dx_dtype: torch.dtype) -> torch.Tensor:
    """dx of softmax (log=False) or log_softmax over dim (>= 0), given the contiguous output y and
    the gradient g of y (any strides). dx is contiguous, of dx_dtype."""
    dx = _new(y.shape, dx_dtype, y.device)
    shape, strides = g.shape, g.stride()
    rank = len(shape)
    if rank == 0:
        outer = n = inner = 1
    else:
        outer, n, inner = math.prod(shape[:dim]), shape[dim], math.prod(shape[dim + 1:])
    numel = outer * n * inner
    if numel == 0:
        return dx
    f64 = y.dtype == torch.float64
    sm_count = device_info(y.device).sm_count
    if rank == 0:
        sgo, sgn, ok = 1, 1, True
    else:
        sgo = _collapse(shape, strides, 0, dim)
        sgn = strides[dim] if n > 1 else 1
        if inner == 1:
            ok = sgo is not None and sgn == 1
        else:
            ok = sgo is not None and _collapse(shape, strides, dim + 1, rank) == 1
    if not ok:
        g = g.contiguous()
        sgo, sgn = n * inner, inner
    i64 = needs_int64(numel + TILE_MAX, outer * sgo + n * sgn + inner)
    if inner > 1:
        bi, bn, single = _strided_plan(n, inner, outer, y.dtype.itemsize, sm_count,
                                       tile=TILE_MAX // 2)  # two tensors in registers
        n_ib = cdiv(inner, bi)
        a = _align(inner, sgo, sgn)
        ints = (n, inner // a, n_ib, sgo // a, sgn // a)
        warps = _warps(bn * bi)
        _STRIDED_BWD((y.dtype, g.dtype, dx.dtype, ints, a, log, f64, bn, bi, single, i64, warps),
                     (outer * n_ib,), (y, g, dx, *ints),
                     lambda: dict(ALIGN=a, LOG=log, F64=f64, BLOCK_N=bn, BLOCK_I=bi,
                                  SINGLE=single, I64=i64, num_warps=warps))
        return dx
    a = _align(n, sgo)
    bn = next_pow2(n)
    single_max = BWD_SINGLE_MAX_F64 if f64 else BWD_SINGLE_MAX
    if n > single_max and outer < sm_count:
        # Few long rows: split each over several programs (partial sums, then dx in reverse).
        block = 2048
        split = max(1, min(cdiv(2 * sm_count, outer), cdiv(n, block)))
        chunk = cdiv(cdiv(n, split), block) * block
        split = cdiv(n, chunk)
        t = torch.empty(outer * split, dtype=torch.float64 if f64 else torch.float32,
                        device=y.device)
        ints = (n // a, sgo // a, chunk, split)
        spec = (y.dtype, g.dtype, dx.dtype, ints, a, log, f64, block, i64)
        _SPLIT_BWD_SUM(spec, (outer * split,), (y, g, t, *ints),
                       lambda: dict(ALIGN=a, LOG=log, F64=f64, BLOCK_N=block, I64=i64,
                                    num_warps=8))
        _SPLIT_BWD_APPLY(spec, (outer * split,), (y, g, dx, t, *ints),
                         lambda: dict(ALIGN=a, LOG=log, F64=f64, SPLIT_POW2=next_pow2(split),
                                      BLOCK_N=block, I64=i64, num_warps=8))
        return dx
    single = n <= single_max
    if single:
        block_r = 1
        if n <= MULTIROW_MAX:  # short rows: a tile of many rows per program
            block_r = max(1, min((2048 if f64 else 4096) // bn, next_pow2(outer)))
        block_n = bn
    else:
        block_r, block_n = 1, 4096 if not f64 else 2048
    tiles = cdiv(outer, block_r)
    warps = _warps(block_r * block_n)
    per = _tiles_per_program(tiles, _resident(sm_count, warps, 2 * block_r * block_n, f64))
    ints = (outer, n // a, sgo // a, per)
    stages = 2 if per > 1 and single and block_r * block_n <= 8192 else 1
    _ROWS_BWD((y.dtype, g.dtype, dx.dtype, ints, a, log, f64, block_r, block_n, single, stages,
               i64, warps), (cdiv(tiles, per),), (y, g, dx, *ints),
              lambda: dict(ALIGN=a, LOG=log, F64=f64, BLOCK_R=block_r, BLOCK_N=block_n,
                           EVEN_N=block_n == n, SINGLE=single, NUM_STAGES=stages, I64=i64,
                           num_warps=warps))
    return dx


def _run(call: SoftmaxCall, launch) -> torch.Tensor:
    """Shared by the Triton backends: empty inputs, the torch cast, autograd, and the current
    device (Triton launches on the current CUDA device, which may not be the tensor's)."""
    info = call.info
    if info.type == "cuda" and info.index != torch.cuda.current_device():
        with torch.cuda.device(info.index):
            return _run_here(call, launch)
    return _run_here(call, launch)


def _run_here(call: SoftmaxCall, launch) -> torch.Tensor:
    if call.numel == 0:
        x = call.x.to(call.out_dtype) if call.cast_first else call.x
        if call.grad:
            return _SoftmaxFunction.apply(x, call, lambda: _empty_out(call))
        return _empty_out(call)
    if call.grad:
        if call.cast_first:
            # A narrowing cast (it rounds): torch's .to() records it for autograd; the kernels
            # then read the cast tensor.
            x = call.x.to(call.out_dtype, memory_format=torch.contiguous_format)
            inner = _call_on(call, x)
            return _SoftmaxFunction.apply(x, inner, lambda: launch(inner))
        return _SoftmaxFunction.apply(call.x, call, lambda: launch(call))
    return launch(call)


def _call_on(call: SoftmaxCall, x: torch.Tensor) -> SoftmaxCall:
    """The same call on the already cast input x (so the kernels need no cast)."""
    c = SoftmaxCall()
    c.x, c.dim, c.log, c.dtype_arg, c.out_dtype = x, call.dim, call.log, None, call.out_dtype
    c.cast_first, c.outer, c.n, c.inner = False, call.outer, call.n, call.inner
    c.so, c.sn, c.fast, c.grad = call.n * call.inner, call.inner, True, call.grad
    c.info, c.key = call.info, call.key
    return c


# ---------------------------------------------------------------------------------------------
# Backends
# ---------------------------------------------------------------------------------------------
def _torch_softmax(call: SoftmaxCall) -> torch.Tensor:
    fn = torch.log_softmax if call.log else torch.softmax
    return fn(call.x, call.dim, dtype=call.dtype_arg)


def _rows_reason(call: SoftmaxCall) -> str | None:
    if call.inner != 1:
        return (f"the softmax dim is not the innermost ({call.inner} elements follow it); "
                "strided takes that layout")
    return None


class FusedBackend(Backend):
    name = "fused"
    kernels = (_rows_fwd_kernel, *_HELPERS, *_BWD_KERNELS)

    @staticmethod
    def limit(call: SoftmaxCall) -> int:
        return FUSED_MAX_F64 if call.f64 else FUSED_MAX

    def supports(self, call: SoftmaxCall) -> str | None:
        reason = _rows_reason(call)
        if reason is None and call.n > self.limit(call):
            reason = (f"rows of {call.n} elements do not fit in registers (fused takes at most "
                      f"{self.limit(call)}); online takes longer rows")
        return reason

    def configs(self, call: SoftmaxCall) -> list[dict]:
        bn = next_pow2(call.n)
        w = _warps(bn)
        stages = 2 if bn * call.in_bytes <= 32 * 1024 else 1
        cfgs = [{"num_warps": w, "NUM_STAGES": stages},
                {"num_warps": min(32, 2 * w), "NUM_STAGES": stages},
                {"num_warps": max(1, w // 2), "NUM_STAGES": stages},
                {"num_warps": w, "NUM_STAGES": 3 - stages}]
        return [c for i, c in enumerate(cfgs) if c not in cfgs[:i]]

    def run(self, call: SoftmaxCall, config) -> torch.Tensor:
        return _run(call, lambda c: _rows_fwd(c, 1, config["num_warps"], config["NUM_STAGES"]))

    def cost(self, call: SoftmaxCall, model) -> Estimate:
        return cost.fused(call, model, warps=self.configs(call)[0]["num_warps"])


class MultirowBackend(Backend):
    name = "multirow"
    kernels = (_rows_fwd_kernel, *_HELPERS, *_BWD_KERNELS)

    def supports(self, call: SoftmaxCall) -> str | None:
        reason = _rows_reason(call)
        if reason is None and call.n > MULTIROW_MAX:
            reason = f"rows of {call.n} elements; multirow packs rows of at most {MULTIROW_MAX}"
        return reason

    def configs(self, call: SoftmaxCall) -> list[dict]:
        bn = next_pow2(call.n)
        # ~4K elements per tile (16 KB of float32): enough bytes in flight per program.
        br = max(1, (2048 if call.f64 else 4096) // bn)
        return [{"BLOCK_R": br, "num_warps": 4, "NUM_STAGES": 2},
                {"BLOCK_R": 2 * br, "num_warps": 8, "NUM_STAGES": 2},
                {"BLOCK_R": max(1, br // 2), "num_warps": 4, "NUM_STAGES": 2},
                {"BLOCK_R": br, "num_warps": 4, "NUM_STAGES": 1}]

    def run(self, call: SoftmaxCall, config) -> torch.Tensor:
        return _run(call, lambda c: _rows_fwd(c, config["BLOCK_R"], config["num_warps"],
                                              config["NUM_STAGES"]))

    def cost(self, call: SoftmaxCall, model) -> Estimate:
        return cost.multirow(call, model)


class OnlineBackend(Backend):
    name = "online"
    kernels = (_online_fwd_kernel, _split_stats_kernel, _split_norm_kernel, _coop_fwd_kernel,
               *_HELPERS, *_BWD_KERNELS)

    def supports(self, call: SoftmaxCall) -> str | None:
        reason = _rows_reason(call)
        if reason is None and call.n <= ONLINE_MIN:
            reason = (f"rows of {call.n} elements fit in registers; online is for rows longer "
                      f"than {ONLINE_MIN}")
        return reason

    @staticmethod
    def split_for(call: SoftmaxCall, block: int, sm_count: int) -> int:
        """Programs per row: enough programs for two per SM, chunks of at least 4 blocks."""
        if call.outer >= 2 * sm_count:
            return 1
        return max(1, min(cdiv(2 * sm_count, max(call.outer, 1)), cdiv(call.n, 4 * block)))

    @staticmethod
    def coop_configs(call: SoftmaxCall) -> list[dict]:
        """Cooperative rows (one read): chunks of 32 or 16 values per thread of 16 warps."""
        wide = 2 if call.f64 else 1
        shapes = ((16384, 16), (8192, 8), (8192, 16), (4096, 4))  # (chunk, warps)
        return [{"COOP_CHUNK": c // wide, "num_warps": w} for c, w in shapes
                if coop_split(call, c // wide)]

    def configs(self, call: SoftmaxCall) -> list[dict]:
        block = 2048 if call.f64 else 4096
        split = self.split_for(call, block, call.info.sm_count)
        cfgs = self.coop_configs(call) + [
            {"BLOCK_N": block, "num_warps": 8, "SPLIT": split},
            {"BLOCK_N": 2 * block, "num_warps": 16, "SPLIT": split}]
        if split > 1:
            cfgs.append({"BLOCK_N": block, "num_warps": 8, "SPLIT": max(1, split // 2)})
            cfgs.append({"BLOCK_N": block, "num_warps": 8, "SPLIT": 2 * split})
        else:
            cfgs.append({"BLOCK_N": block // 2, "num_warps": 4, "SPLIT": 1})
        return cfgs

    def run(self, call: SoftmaxCall, config) -> torch.Tensor:
        if "COOP_CHUNK" in config:
            return _run(call, lambda c: _coop_fwd(c, config["COOP_CHUNK"], config["num_warps"]))
        return _run(call, lambda c: _online_fwd(c, config["BLOCK_N"], config["num_warps"],
                                                config["SPLIT"]))

    def cost(self, call: SoftmaxCall, model) -> Estimate:
        coop = self.coop_configs(call)
        if coop:
            return cost.online(call, model, split=coop_split(call, coop[0]["COOP_CHUNK"]),
                               cooperative=True)
        cfg = self.configs(call)[0]
        split = max(1, min(self.split_for(call, cfg["BLOCK_N"], model.sm_count),
                           cdiv(call.n, cfg["BLOCK_N"])))
        return cost.online(call, model, split=split)


class StridedBackend(Backend):
    name = "strided"
    kernels = (_strided_fwd_kernel, *_HELPERS, *_BWD_KERNELS)

    def supports(self, call: SoftmaxCall) -> str | None:
        if call.inner == 1:
            return "the softmax dim is the innermost; fused, multirow or online take rows"
        return None

    def configs(self, call: SoftmaxCall) -> list[dict]:
        tile = TILE_MAX // 2 if call.f64 else TILE_MAX
        bi, bn, _ = _strided_plan(call.n, call.inner, call.outer, call.in_bytes,
                                  call.info.sm_count, None, tile)
        # num_warps follows the tile actually used (~16 elements per thread), times WARP_SCALE.
        cfgs = [{"BLOCK_I": bi, "TILE": tile, "WARP_SCALE": 1},
                {"BLOCK_I": bi, "TILE": tile, "WARP_SCALE": 2}]
        if bi > 1:
            cfgs.append({"BLOCK_I": bi // 2, "TILE": tile, "WARP_SCALE": 1})
        if bi < next_pow2(call.inner):
            cfgs.append({"BLOCK_I": 2 * bi, "TILE": tile, "WARP_SCALE": 1})
        return cfgs

    def run(self, call: SoftmaxCall, config) -> torch.Tensor:
        return _run(call, lambda c: _strided_fwd(c, config["BLOCK_I"], config["TILE"],
                                                 config.get("WARP_SCALE", 1)))

    def cost(self, call: SoftmaxCall, model) -> Estimate:
        tile = TILE_MAX // 2 if call.f64 else TILE_MAX
        bi, bn, single = _strided_plan(call.n, call.inner, call.outer, call.in_bytes,
                                       model.sm_count, None, tile)
        return cost.strided(call, model, block_i=bi, single=single)


# ---------------------------------------------------------------------------------------------
# Inputs for warming, calibration and benchmarks
# ---------------------------------------------------------------------------------------------
def sample(shapes, dtype: torch.dtype, options: dict, device: torch.device):
    """One input of shapes[0], standard normal times `scale` (option, default 1; large scales give
    peaked rows). Options: dim (default -1), out_dtype (a dtype name: softmax's dtype=), scale."""
    if len(shapes) != 1:
        raise InvalidArgument(f"softmax sample: expected one shape (the input), got {shapes}")
    options = dict(options)
    dim = int(options.pop("dim", -1))
    scale = float(options.pop("scale", 1.0))
    out_dtype = options.pop("out_dtype", None)
    if options:
        raise InvalidArgument(f"softmax sample: unknown options {sorted(options)}; expected dim, "
                              "out_dtype, scale")
    wide = dtype if dtype in (torch.float32, torch.float64) else torch.float32
    x = (torch.randn(shapes[0], device=device, dtype=wide) * scale).to(dtype)
    kwargs = {"dim": dim}
    if out_dtype is not None:
        kwargs["dtype"] = getattr(torch, str(out_dtype).replace("torch.", ""))
    return (x,), kwargs


CALIBRATION = [
    ([[4096, 1024]], torch.float32, {}),
    ([[4096, 8192]], torch.bfloat16, {}),
    ([[1048576, 64]], torch.float32, {}),
    ([[256, 131072]], torch.float32, {}),
    ([[64, 512, 512]], torch.float16, {"dim": 1}),
]


def _with_backward(call: SoftmaxCall, run):
    """Under autograd, tuning times the forward and the backward: a backend that wins the forward
    alone can lose the step (the Python autograd.Function costs host time torch's does not)."""
    if not call.grad:
        return run
    upstream = []

    def forward_backward():
        y = run()
        if not upstream:
            upstream.append(torch.randn_like(y))
        return torch.autograd.grad(y, call.x, upstream[0])

    return forward_backward


def replay(call: SoftmaxCall) -> tuple[tuple, dict]:
    """The public call a prepared one came from (tuning's first runs)."""
    return (call.x, call.dim), {"dtype": call.dtype_arg}


def _make_op(name: str, prepare) -> Op:
    op = Op(name, prepare, [
        TorchBackend(_torch_softmax, cost.torch_),
        FusedBackend(),
        OnlineBackend(),
        MultirowBackend(),
        StridedBackend(),
    ], sample=sample, timed=_with_backward, replay=replay)
    op.calibration = list(CALIBRATION)  # read by `opselect calibrate`
    return register(op)


SOFTMAX_OP = _make_op("softmax", prepare_softmax)
LOG_SOFTMAX_OP = _make_op("log_softmax", prepare_log_softmax)
OP = SOFTMAX_OP
