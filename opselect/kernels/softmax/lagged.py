"""softmax's online backend, lagged mode: many long rows in one launch where no program waits for
another. Program (r, p) publishes chunk p of row r's (max, sum) and writes chunk p of an earlier
row, whose statistics are complete by then (fits/softmax.md, "online: lagged", has the H200's
numbers against the cooperative kernel of online.py, which holds a chunk while its row's others
arrive)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ...errors import InvalidArgument
from ...heuristics import softmax as cost
from .._common import allocator, cdiv, needs_int64, next_pow2, per_stream
from .call import SoftmaxCall
from .common import (_align, _cast_for, _finish, _grad, _merge, _read_dtype, _reader,
                     _row_and_part, _row_stats, _vector_window, plan_launcher)

#: Polls of a row's statistics before a program gives up and reads the row itself (never, in
#: practice: the row's programs started long before).
SPIN_LIMIT = 1 << 20


@triton.jit
def tagged_word(big, total, epoch):
    """A chunk's (max, sum) as one 64-bit word, the launch's tag (0-3) in the sum's two lowest
    bits: the sum rounded to a multiple of 4 units in the last place first (2**-22 of it at
    most); a NaN sum becomes the quiet NaN 0x7FC00000 first (the GPU's NaN is 0x7FFFFFFF:
    rounded, it carried into the sign and came out a tiny negative number, and the row's NaN
    was lost; a NaN whose mantissa lies in the two lowest bits would come out inf). The max
    keeps every bit: it shifts the exps of the merge, where an ulp of a large max is a large
    factor. (A sum is at most the chunk's length, never inf.)"""
    bits = total.to(tl.int32, bitcast=True)
    sum_bits = tl.where(total == total, (bits + 2) & -4, 0x7FC00000) | epoch
    return (big.to(tl.int32, bitcast=True).to(tl.int64) << 32) | (sum_bits.to(tl.int64)
                                                                 & 0xFFFFFFFF)


@triton.jit
def untagged(words, used, epoch):
    """How many of the used words do not carry this launch's tag yet."""
    return tl.sum(tl.where(used & ((words & 3).to(tl.int32) != epoch), 1, 0), axis=0)


@triton.jit
def words_stats(words, used):
    """The row's (max, sum), each of shape [1], from its chunks' tagged words (the tag's bits
    cleared: a sum is then within 2 units in the last place of its chunk's, and a sum of 0
    is 0)."""
    pm = tl.where(used, (words >> 32).to(tl.int32).to(tl.float32, bitcast=True), float("-inf"))
    ps = tl.where(used, (words.to(tl.int32) & -4).to(tl.float32, bitcast=True), 0.0)
    return _merge(pm, ps, 0)


@triton.jit
def _lagged_fwd_kernel(x_ptr, y_ptr, slot_ptr, n_q, sx_q, sy_q, split, rows, lag_rows,
                       align: tl.constexpr, log: tl.constexpr, chunk: tl.constexpr,
                       words_block: tl.constexpr, spin_limit: tl.constexpr,
                       fallback_block: tl.constexpr, offsets_64bit: tl.constexpr,
                       vector: tl.constexpr):
    """online, lagged: program (r, p) publishes chunk p of row r's (max, sum), then writes chunk
    p of row q = r - lag_rows, reading it again (from L2: the row's programs read it lag_rows *
    split programs before). Nothing is held while a row's statistics gather, which is what
    costs the cooperative kernel a third of the bandwidth on many rows (fits/softmax.md,
    "online: lagged"). The grid has lag_rows rows of programs past the last row, which only
    write.

    No atomics: each program's (max, sum) is one 64-bit word (tagged_word), stored at once
    (single-copy atomic), the launch's tag in the sum's two lowest bits. Every slot is written
    once a launch, so the tag a launch writes is its program's slot's old tag + 1 (mod 4), the
    same for every slot. q's words are loaded with the program's data, before its own
    statistics: where all carry this launch's tag (the usual case) the program waits on
    nothing. Otherwise it polls; q's programs started before it, and a program waits only on
    earlier ones, so the wait ends (if it ever outlasts spin_limit polls, the program reads row
    q again for its statistics: slower, never wrong, never hung; the interpreter runs programs
    in order, so they never wait).

    vector > 0: packed rows off the 16-byte grid read in 16-byte vectors, as the cooperative
    kernel does (a row's chunks from its first whole vector on; part 0 also takes the head
    before it and the tail past its last whole vector)."""
    N = n_q * align
    pid = tl.program_id(0)
    row, part = _row_and_part(pid, split, offsets_64bit)
    q = row - lag_rows
    own = row < rows
    later = q >= 0
    epoch = ((tl.load(slot_ptr + pid, volatile=True).to(tl.int32) & 3) + 1) & 3
    first = part == 0
    if vector > 0:
        start = row * sx_q * align
        lo, end, hi, cut = _vector_window(start, N, vector)
        offs = lo + part * chunk + tl.arange(0, chunk)
        a = tl.load(x_ptr + offs, mask=offs < tl.where(own, hi, 0), other=float("-inf"))
        a = tl.where(offs < end, a.to(tl.float32), float("-inf"))
        head = start + tl.arange(0, vector)
        h = tl.load(x_ptr + head, mask=head < tl.where(first & own, lo, start),
                    other=float("-inf")).to(tl.float32)
        q_start = q * sx_q * align
        q_lo, q_end, q_hi, q_cut = _vector_window(q_start, N, vector)
        q_offs = q_lo + part * chunk + tl.arange(0, chunk)
        # (q_offs >= q_lo: an early program's row q < 0 loads nothing; its offsets are negative)
        b = tl.load(x_ptr + q_offs, mask=q_offs < tl.where(later, q_cut, q_lo), other=0.0)
    else:
        offs = part * chunk + tl.arange(0, chunk)
        a = tl.load(x_ptr + row * sx_q * align + offs, mask=offs < tl.where(own, N, 0),
                    other=float("-inf")).to(tl.float32)
        b = tl.load(x_ptr + q * sx_q * align + offs, mask=offs < tl.where(later, N, 0),
                    other=0.0)
    # One word a thread at most (words_block covers every thread): a word held by several
    # threads is loaded by each, and copies read a moment apart may differ, so threads could
    # disagree on whether the row is complete (and part at the reductions' barriers). Held once,
    # the reductions below combine every thread's words into one answer for all.
    k = tl.arange(0, words_block)
    used = k < tl.where(later, split, 0)
    words = tl.load(slot_ptr + q * split + k, mask=used, other=0, volatile=True)
    big = tl.max(a, axis=0)
    if vector > 0:
        big = tl.maximum(big, tl.max(h, axis=0))
    # An all -inf chunk (big = -inf) sums exp(x - 0) = 0; NaN stays NaN.
    shift = tl.where(big == float("-inf"), 0.0, big)
    total = tl.sum(tl.exp(a - shift), axis=0)
    if vector > 0:
        total += tl.sum(tl.exp(h - shift), axis=0)
    one = tl.arange(0, 1)
    tl.store(slot_ptr + pid + one, tagged_word(big, total, epoch) + tl.zeros([1], tl.int64))
    if later:
        late = untagged(words, used, epoch)
        polls = tl.full([], 0, tl.int32)
        while (late > 0) & (polls < spin_limit):
            words = tl.load(slot_ptr + q * split + k, mask=used, other=0, volatile=True)
            late = untagged(words, used, epoch)
            polls += 1
        if late == 0:
            row_max, row_sum = words_stats(words, used)
        else:
            row_max, row_sum = _row_stats(x_ptr + q * sx_q * align, N, fallback_block, False)
        out = _finish(b.to(tl.float32), row_max, row_sum, log)
        if vector > 0:
            tl.store(y_ptr + q_offs, _cast_for(out, y_ptr), mask=q_offs < q_cut)
            q_head = q_start + tl.arange(0, vector)
            in_head = q_head < tl.where(first, q_lo, q_start)
            g = tl.load(x_ptr + q_head, mask=in_head, other=0.0).to(tl.float32)
            tl.store(y_ptr + q_head, _cast_for(_finish(g, row_max, row_sum, log), y_ptr),
                     mask=in_head)
            q_tail = q_cut + tl.arange(0, vector)
            in_tail = q_tail < tl.where(first, q_end, q_cut)
            t = tl.load(x_ptr + q_tail, mask=in_tail, other=0.0).to(tl.float32)
            tl.store(y_ptr + q_tail, _cast_for(_finish(t, row_max, row_sum, log), y_ptr),
                     mask=in_tail)
        else:
            tl.store(y_ptr + q * sy_q * align + offs, _cast_for(out, y_ptr), mask=offs < N)


@dataclass(frozen=True, eq=False)
class LaggedPlan:
    """One lagged launch (each program publishes one row's chunk statistics and writes another,
    earlier row's chunk): the Launcher's spec and constexpr source."""

    in_dtype: torch.dtype
    out_dtype: torch.dtype
    ints: tuple  # N / align, the row strides / align, programs per row, rows, lag_rows
    align: int
    log: bool
    chunk: int  # elements of a row per program
    spin_limit: int  # polls of a row's statistics before a program reads the row itself
    fallback_block: int  # block of that reading
    offsets_64bit: bool
    num_warps: int
    vector: int = 0  # elements per 16-byte vector of rows off the grid (heuristics' vector_shift)

    @property
    def words_block(self) -> int:
        """The lanes a program loads a row's statistics words in: the programs per row padded
        to a power of two, and at least two a thread, so that no word is held by two threads
        (the kernel's docstring says why)."""
        return max(next_pow2(self.ints[3]), 64 * self.num_warps)


lagged_plan = functools.lru_cache(maxsize=4096)(LaggedPlan)
_LAGGED_FWD = plan_launcher(_lagged_fwd_kernel)


# A lagged row has at most this many chunks: each program loads the row's statistics words (a
# KB at most, against an 8 KB chunk; the H200 ran 1024 x 151936 fp32 fastest in 75 chunks).
LAGGED_MAX_SPLIT = 128

# Lagged configs are offered where the grid has at least this many programs (rows x chunks):
# fewer rows than that spend most of a launch in the lag's tail (H200: 64 x 128256 bf16, 2,048
# programs, ran as fast as the cooperative kernel; fits/softmax.md, "online: lagged").
LAGGED_MIN_PROGRAMS = 2048

# The largest lag a config may name, in programs (a config is data from the tune cache).
LAGGED_MAX_LAG = 1 << 16


def lagged_split(call: SoftmaxCall, chunk: int) -> int | None:
    """Programs per row of the lagged kernel with chunks of `chunk`, or None where it does not
    take the row: one chunk (fused's job), more than LAGGED_MAX_SPLIT, or float64 (its (max, sum)
    word holds two float32)."""
    split = cdiv(call.n, chunk)
    return split if 1 < split <= LAGGED_MAX_SPLIT and not call.f64 else None


def lagged_rows(call: SoftmaxCall, split: int, lag: int) -> int:
    """The rows of programs between a row's statistics and the programs that write it: `lag`
    programs, in whole rows, at least one, at most the rows."""
    return max(1, min(call.outer, cdiv(lag, split)))


def lagged_fwd_plan(call: SoftmaxCall, chunk: int, warps: int, lag) -> LaggedPlan | None:
    """The lagged forward's launch, `lag` programs between a chunk's statistics and the program
    that writes it; None for a row it does not take (lagged_split)."""
    if type(lag) is not int or not 1 <= lag <= LAGGED_MAX_LAG:
        raise InvalidArgument(f"softmax online: config lag={lag!r} is not an int in "
                              f"[1, {LAGGED_MAX_LAG}]")
    split = lagged_split(call, chunk)
    if split is None:
        return None
    _, sx, _ = _reader(call)
    n, rows = call.n, call.outer
    lag_rows = lagged_rows(call, split, lag)
    a = _align(n, sx)
    ints = (n // a, sx // a, n // a, split, rows, lag_rows)
    spin = 1 if call.info.interpreted else SPIN_LIMIT
    fallback = min(chunk, 64 * 32 * warps // 16)
    i64 = needs_int64(call.numel + chunk, (rows + lag_rows) * max(sx, n) + n)
    return lagged_plan(_read_dtype(call), call.out_dtype, ints, a, call.log, chunk, spin,
                       fallback, i64, warps, cost.vector_shift(call))


def lagged_configs(call: SoftmaxCall) -> list[dict]:
    """Lagged rows (one read from memory, one from L2, nothing waits): chunks of 8 KB on 4 warps
    1,024 and 512 programs behind, 16 KB on 8 warps 256 behind, where the grid has
    LAGGED_MIN_PROGRAMS. The H200's fastest on every vocabulary row from 64 rows up
    (fits/softmax.md, "online: lagged")."""
    small = 8192 // call.x.element_size()
    shapes = [(small, 4, 1024), (small, 4, 512), (2 * small, 8, 256)]
    return [{"chunk": c, "num_warps": w, "lag": lag} for c, w, lag in shapes
            if lagged_split(call, c) and call.outer * lagged_split(call, c) >= LAGGED_MIN_PROGRAMS]


def lagged_fwd(plan: LaggedPlan, call: SoftmaxCall):
    """The prepared lagged forward: a function x -> y of the call's input."""
    read = _reader(call)[0]
    ints = plan.ints
    programs = (call.outer + ints[-1]) * ints[3]
    device = call.x.device
    launch = _LAGGED_FWD.bind(plan, (programs,), call.info.index)
    new_y = allocator(tuple(call.x.shape), call.out_dtype, device)
    # Each program's (max, sum) word, its tag moving on every launch: the stream's, kept.
    slots = per_stream(device, lambda: (torch.zeros(programs, dtype=torch.int64, device=device),))

    def forward(x: torch.Tensor) -> torch.Tensor:
        if read is not None:
            x = read(x)
        y = new_y()
        launch(x, y, slots()[0], *ints)
        return y

    return forward


# ---------------------------------------------------------------------------------------------
# The backward: many long rows, the same lag. A row's sum (of dy * y; log_softmax's, of dy) is
# one float32 a chunk, so a word holds it whole, the launch's tag in the high half.
# ---------------------------------------------------------------------------------------------
@triton.jit
def sum_word(total, epoch):
    """A chunk's partial sum as a 64-bit word: its float32 bits, every one kept (dx = y * (dy -
    t) cancels where dy is near t), and the launch's tag (0-3) above them."""
    bits = total.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF
    return (epoch.to(tl.int64) << 32) | bits


@triton.jit
def _row_dot(y_row, g_row, N, log: tl.constexpr, block: tl.constexpr):
    """A row's sum of dy * y (log_softmax's: of dy), of shape [1], read from the row itself:
    what a program that stopped waiting for the row's chunks falls back on."""
    cols = tl.arange(0, block)
    acc = tl.zeros([block], tl.float32)
    for start in range(0, N, block):
        o = start + cols
        g = tl.load(g_row + o, mask=o < N, other=0.0).to(tl.float32)
        if log:
            acc += g
        else:
            acc += g * tl.load(y_row + o, mask=o < N, other=0.0).to(tl.float32)
    return tl.sum(acc, axis=0, keep_dims=True)


@triton.jit
def _lagged_bwd_kernel(y_ptr, g_ptr, dx_ptr, slot_ptr, n_q, sg_q, split, rows, lag_rows,
                       align: tl.constexpr, log: tl.constexpr, chunk: tl.constexpr,
                       words_block: tl.constexpr, spin_limit: tl.constexpr,
                       fallback_block: tl.constexpr, offsets_64bit: tl.constexpr,
                       vector: tl.constexpr):
    """The backward, lagged: program (r, p) publishes chunk p of row r's partial sum, then
    writes dx of chunk p of row q = r - lag_rows from y and dy read again (from L2). The
    forward's protocol (_lagged_fwd_kernel): one tagged word a program, q's words loaded with
    the program's data, a poll only where one is late, the row read again past spin_limit
    polls. y and dx are packed rows of N; dy's rows are sg_q * align apart.

    vector > 0: rows off the 16-byte grid in 16-byte vectors, as the forward's (dy packed as y:
    the same window cuts both); the first chunk's program also takes the head and the tail."""
    N = n_q * align
    pid = tl.program_id(0)
    row, part = _row_and_part(pid, split, offsets_64bit)
    q = row - lag_rows
    later = q >= 0
    first = part == 0
    epoch = ((tl.load(slot_ptr + pid, volatile=True) >> 32).to(tl.int32) + 1) & 3
    if vector > 0:
        # Offsets of the whole rows (dy's row stride is N): the window's, and the head's
        # and the tail's (masked to part 0; head and tail loads go through one mask each).
        start = row * N
        lo, end, hi, cut = _vector_window(start, N, vector)
        offs = lo + part * chunk + tl.arange(0, chunk)
        mine = offs < tl.where(row < rows, hi, 0)
        g = tl.load(g_ptr + offs, mask=mine, other=0.0).to(tl.float32)
        if not log:
            g *= tl.load(y_ptr + offs, mask=mine, other=0.0).to(tl.float32)
        g = tl.where(offs < end, g, 0.0)  # (after the product: the next row's y may be NaN)
        ends = start + tl.arange(0, vector)
        h = tl.load(g_ptr + ends, mask=ends < tl.where(first & (row < rows), lo, start),
                    other=0.0).to(tl.float32)
        if not log:
            h *= tl.load(y_ptr + ends, mask=ends < tl.where(first & (row < rows), lo, start),
                         other=0.0).to(tl.float32)
        q_start = q * N
        q_lo, q_end, q_hi, q_cut = _vector_window(q_start, N, vector)
        q_offs = q_lo + part * chunk + tl.arange(0, chunk)
        # (q_offs >= q_lo: an early program's row q < 0 loads nothing)
        theirs = q_offs < tl.where(later, q_cut, q_lo)
        q_y = tl.load(y_ptr + q_offs, mask=theirs, other=0.0)
        q_g = tl.load(g_ptr + q_offs, mask=theirs, other=0.0)
    else:
        offs = part * chunk + tl.arange(0, chunk)
        mine = offs < tl.where(row < rows, N, 0)
        g = tl.load(g_ptr + row * sg_q * align + offs, mask=mine, other=0.0).to(tl.float32)
        if not log:
            g *= tl.load(y_ptr + row * n_q * align + offs, mask=mine, other=0.0).to(tl.float32)
        theirs = offs < tl.where(later, N, 0)
        q_y = tl.load(y_ptr + q * n_q * align + offs, mask=theirs, other=0.0)
        q_g = tl.load(g_ptr + q * sg_q * align + offs, mask=theirs, other=0.0)
    # One word a thread at most (the forward's kernel says why).
    k = tl.arange(0, words_block)
    used = k < tl.where(later, split, 0)
    words = tl.load(slot_ptr + q * split + k, mask=used, other=0, volatile=True)
    one = tl.arange(0, 1)
    total = tl.sum(g, axis=0)
    if vector > 0:
        total += tl.sum(h, axis=0)
    tl.store(slot_ptr + pid + one, sum_word(total, epoch) + tl.zeros([1], tl.int64))
    if later:
        late = tl.sum(tl.where(used & ((words >> 32).to(tl.int32) != epoch), 1, 0), axis=0)
        polls = tl.full([], 0, tl.int32)
        while (late > 0) & (polls < spin_limit):
            words = tl.load(slot_ptr + q * split + k, mask=used, other=0, volatile=True)
            late = tl.sum(tl.where(used & ((words >> 32).to(tl.int32) != epoch), 1, 0), axis=0)
            polls += 1
        if late == 0:
            partials = tl.where(used, words.to(tl.int32).to(tl.float32, bitcast=True), 0.0)
            t = tl.sum(partials, axis=0, keep_dims=True)
        else:
            t = _row_dot(y_ptr + q * n_q * align, g_ptr + q * sg_q * align, N, log,
                         fallback_block)
        dx = _cast_for(_grad(q_y.to(tl.float32), q_g.to(tl.float32), t, log), dx_ptr)
        if vector > 0:
            tl.store(dx_ptr + q_offs, dx, mask=theirs)
            # The head and the tail, element-wise (part 0 only).
            for side in tl.static_range(2):
                if side == 0:
                    at = q_start + tl.arange(0, vector)
                    on = at < tl.where(first, q_lo, q_start)
                else:
                    at = q_cut + tl.arange(0, vector)
                    on = at < tl.where(first, q_end, q_cut)
                e_y = tl.load(y_ptr + at, mask=on, other=0.0).to(tl.float32)
                e_g = tl.load(g_ptr + at, mask=on, other=0.0).to(tl.float32)
                tl.store(dx_ptr + at, _cast_for(_grad(e_y, e_g, t, log), dx_ptr), mask=on)
        else:
            tl.store(dx_ptr + q * n_q * align + offs, dx, mask=theirs)


@dataclass(frozen=True, eq=False)
class LaggedBackwardPlan:
    """One lagged backward launch: the Launcher's spec and constexpr source."""

    y_dtype: torch.dtype
    grad_dtype: torch.dtype
    dx_dtype: torch.dtype
    ints: tuple  # N / align, dy's row stride / align, programs per row, rows, lag_rows
    align: int
    log: bool
    chunk: int
    spin_limit: int
    fallback_block: int
    offsets_64bit: bool
    num_warps: int
    vector: int = 0  # elements per 16-byte vector of rows off the grid (y and dy packed)

    @property
    def words_block(self) -> int:
        """As LaggedPlan's: the programs per row, at least two lanes a thread (no word is held
        by two threads)."""
        return max(next_pow2(self.ints[2]), 64 * self.num_warps)


lagged_backward_plan = functools.lru_cache(maxsize=4096)(LaggedBackwardPlan)
_LAGGED_BWD = plan_launcher(_lagged_bwd_kernel)

#: The backward's chunk (bytes of y) and warps, and its lag in programs: BWD_LAG_SHAPE.
BWD_LAG_SHAPE = (8192, 4, 384)


def lagged_backward(launch_of, y: torch.Tensor, g_stride: int, g_dtype: torch.dtype,
                    dx_dtype: torch.dtype, log: bool, align: int, new_dx, interpreted: bool,
                    shape: tuple | None = None):
    """The prepared lagged backward (y, g) -> dx of rows y (packed, the last dim), g's rows
    g_stride apart; None where it does not take the rows (one chunk, more than
    LAGGED_MAX_SPLIT, float64, or fewer than LAGGED_MIN_PROGRAMS programs). launch_of(launcher,
    plan, grid) binds a launch (autograd.prepare_backward's); shape: (chunk bytes, warps, lag
    in programs), BWD_LAG_SHAPE unless given."""
    chunk_bytes, warps, lag = shape or BWD_LAG_SHAPE
    n = y.shape[-1]
    rows = y.numel() // max(n, 1)
    chunk = chunk_bytes // y.element_size()
    split = cdiv(n, chunk)
    if y.dtype == torch.float64 or not 1 < split <= LAGGED_MAX_SPLIT:
        return None
    if rows * split < LAGGED_MIN_PROGRAMS:
        return None
    lag_rows = max(1, min(rows, cdiv(lag, split)))
    ints = (n // align, g_stride // align, split, rows, lag_rows)
    # Rows off the 16-byte grid in shifted 16-byte vectors, where dy is packed as y is.
    narrow = min(y.element_size(), g_dtype.itemsize, dx_dtype.itemsize)
    vector = 0
    if (n * narrow) % 16 and (g_stride == n or rows == 1) and n >= 32 // narrow:
        vector = 16 // narrow
    i64 = needs_int64(rows * n + chunk, (rows + lag_rows) * max(g_stride, n) + n)
    plan = lagged_backward_plan(y.dtype, g_dtype, dx_dtype, ints, align, log, chunk,
                                1 if interpreted else SPIN_LIMIT, min(chunk, 1024), i64, warps,
                                vector)
    programs = (rows + lag_rows) * split
    launch = launch_of(_LAGGED_BWD, plan, (programs,))
    device = y.device
    slots = per_stream(device, lambda: (torch.zeros(programs, dtype=torch.int64, device=device),))

    def lagged_rows_backward(y: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        dx = new_dx()
        launch(y, g, dx, slots()[0], *ints)
        return dx

    return lagged_rows_backward
