"""softmax's online backend: rows too long for registers, a running max and sum per lane, split
over programs (two launches, or one cooperative launch) when rows are few."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ...dispatch.backend import Estimate
from ...heuristics import softmax as cost
from .._common import allocator, cdiv, needs_int64, next_pow2, per_stream
from .autograd import ForwardBackend
from .call import SoftmaxCall
from .common import (_acc, _align, _cast_for, _finish, _merge, _one_launch, _online_step,
                     _read_dtype, _reader, _row_and_part, _row_stats, _rows_reason,
                     _vector_window, plan_launcher, programs_per_sm)
from .lagged import (LaggedPlan, lagged_configs, lagged_fwd, lagged_fwd_plan, lagged_rows,
                     lagged_split)


# online takes rows longer than this (shorter ones are the fused and multirow backends' job).
ONLINE_MIN = 1024


@triton.jit
def _online_fwd_kernel(x_ptr, y_ptr, n_q, sx_q, sy_q,
                       align: tl.constexpr, log: tl.constexpr, f64: tl.constexpr,
                       block: tl.constexpr, offsets_64bit: tl.constexpr):
    """online, one program per row: a running (max, sum) pass, then a normalising pass."""
    N = n_q * align
    row = tl.program_id(0)
    if offsets_64bit:
        row = row.to(tl.int64)
    x_row = x_ptr + row * sx_q * align
    y_row = y_ptr + row * sy_q * align
    cols = tl.arange(0, block)
    m = _acc(tl.full([block], float("-inf"), tl.float32), f64)
    s = _acc(tl.zeros([block], tl.float32), f64)
    for start in range(0, N, block):
        offs = start + cols
        x = _acc(tl.load(x_row + offs, mask=offs < N, other=float("-inf")), f64)
        m, s = _online_step(m, s, x)
    big, total = _merge(m, s, 0)
    # Backwards: the chunks read last by the first pass are the likeliest to still be in L2.
    n_chunks = tl.cdiv(N, block)
    for i in range(0, n_chunks):
        offs = (n_chunks - 1 - i) * block + cols
        mask = offs < N
        x = _acc(tl.load(x_row + offs, mask=mask, other=float("-inf")), f64)
        tl.store(y_row + offs, _cast_for(_finish(x, big, total, log), y_ptr), mask=mask)


@triton.jit
def _split_stats_kernel(x_ptr, m_ptr, s_ptr, n_q, sx_q, chunk, split,
                        align: tl.constexpr, f64: tl.constexpr, block: tl.constexpr,
                        offsets_64bit: tl.constexpr):
    """online with split > 1, step 1: (max, sum) of one chunk of one row. chunk is a multiple
    of block."""
    N = n_q * align
    pid = tl.program_id(0)
    row, part = _row_and_part(pid, split, offsets_64bit)
    x_row = x_ptr + row * sx_q * align
    first = part * chunk
    cols = tl.arange(0, block)
    m = _acc(tl.full([block], float("-inf"), tl.float32), f64)
    s = _acc(tl.zeros([block], tl.float32), f64)
    for start in range(0, chunk, block):
        offs = first + start + cols
        x = _acc(tl.load(x_row + offs, mask=offs < N, other=float("-inf")), f64)
        m, s = _online_step(m, s, x)
    big, total = _merge(m, s, 0)
    one = tl.arange(0, 1)
    tl.store(m_ptr + pid + one, big)
    tl.store(s_ptr + pid + one, total)


@triton.jit
def _split_norm_kernel(x_ptr, y_ptr, m_ptr, s_ptr, n_q, sx_q, sy_q, chunk, split,
                       align: tl.constexpr, log: tl.constexpr, f64: tl.constexpr,
                       split_padded: tl.constexpr, block: tl.constexpr,
                       offsets_64bit: tl.constexpr):
    """online with split > 1, step 2: combine the row's chunk statistics, normalise one chunk."""
    N = n_q * align
    # Reverse program order (and reverse chunk order inside): the data the stats kernel read last
    # is still in L2.
    pid = tl.num_programs(0) - 1 - tl.program_id(0)
    row, part = _row_and_part(pid, split, offsets_64bit)
    k = tl.arange(0, split_padded)
    pm = tl.load(m_ptr + row * split + k, mask=k < split, other=float("-inf"))
    ps = tl.load(s_ptr + row * split + k, mask=k < split, other=0.0)
    big, total = _merge(pm, ps, 0)
    x_row = x_ptr + row * sx_q * align
    y_row = y_ptr + row * sy_q * align
    cols = tl.arange(0, block)
    last = part * chunk + chunk - block
    for start in range(0, chunk, block):
        offs = last - start + cols
        mask = offs < N
        x = _acc(tl.load(x_row + offs, mask=mask, other=float("-inf")), f64)
        tl.store(y_row + offs, _cast_for(_finish(x, big, total, log), y_ptr), mask=mask)


@triton.jit
def _coop_fwd_kernel(x_ptr, y_ptr, part_ptr, count_ptr, n_q, sx_q, sy_q, split, rows,
                     align: tl.constexpr, log: tl.constexpr, f64: tl.constexpr,
                     chunk: tl.constexpr, split_padded: tl.constexpr, spin_limit: tl.constexpr,
                     fallback_block: tl.constexpr, offsets_64bit: tl.constexpr,
                     vector: tl.constexpr):
    """online, cooperative: `split` programs share a row, each holding one chunk of it, and its
    exp(x - chunk max), in registers. Each publishes its chunk's (max, sum), waits for the row's
    other chunks, merges and rescales its registers: one read, one write and one exp an element,
    in one launch.

    A row's programs are consecutive, and the GPU starts programs in order, so a program waits
    only for programs that run or start next; at least `split` run at once (split <= SM count).
    If the wait ever outlasts spin_limit polls (another kernel holding the SMs; the interpreter,
    which runs programs one by one), the program reads its row again to compute the statistics
    itself: slower, never wrong, never hung.

    count_ptr holds one arrival counter a row, never reset: each launch adds split_padded to it
    (the row's first program adds split_padded - split + 1, the others 1), so a program's
    arrival returns a count in [base, base + split_padded) with base a multiple of
    split_padded, and the row is complete when the counter reaches base + split_padded. The
    arrival's own answer tells the row's last program that it is last (it does not poll), and
    no program pays a departure or a reset (int32 wrap-around keeps the multiples, a power of
    two dividing 2**32). Launches on the counters' stream never overlap, so no program sees
    another launch's arrivals. (Before, a second counter counted departures and the last
    program zeroed both: 3-16% slower on vocabulary rows, fits/softmax.md, "online: the
    exchange".)

    vector > 0: packed rows off the 16-byte grid, in 16-byte vectors (common._shifted_rows): the
    chunks cut the row from its first whole vector on; the row's first program also takes the
    head before it and writes the tail past the last whole vector."""
    N = n_q * align
    row, part = _row_and_part(tl.program_id(0), split, offsets_64bit)
    x_row = x_ptr + row * sx_q * align
    y_row = y_ptr + row * sy_q * align
    if vector > 0:
        start = row * sx_q * align
        lo, end, hi, cut = _vector_window(start, N, vector)
        offs = lo + part * chunk + tl.arange(0, chunk)
        x = _acc(tl.load(x_ptr + offs, mask=offs < hi, other=float("-inf")), f64)
        x = tl.where(offs < end, x, float("-inf"))
        head = start + tl.arange(0, vector)
        in_head = head < tl.where(part == 0, lo, start)  # (the row's first program only)
        h = _acc(tl.load(x_ptr + head, mask=in_head, other=float("-inf")), f64)
        big = tl.maximum(tl.max(x, axis=0), tl.max(h, axis=0))
    else:
        offs = part * chunk + tl.arange(0, chunk)
        mask = offs < N
        x = _acc(tl.load(x_row + offs, mask=mask, other=float("-inf")), f64)
        big = tl.max(x, axis=0)
    # An all -inf chunk (big = -inf) gets exp(x - 0) = 0 everywhere; NaN stays NaN.
    shift = tl.where(big == float("-inf"), 0.0, big)
    z = x - shift
    e = tl.exp(z)
    total = tl.sum(e, axis=0)
    if vector > 0:
        total += tl.sum(tl.exp(h - shift), axis=0)
    one = tl.arange(0, 1)
    slot = row * split + part
    tl.store(part_ptr + slot + one, big + tl.zeros([1], big.dtype))
    tl.store(part_ptr + rows * split + slot + one, total + tl.zeros([1], total.dtype))
    tl.debug_barrier()  # every thread's stores precede the release below
    arrivals = count_ptr + row
    step = tl.where(part == 0, split_padded - split + 1, 1)
    before = tl.atomic_add(arrivals, step, sem="acq_rel")
    complete = (before & -split_padded) + split_padded  # (wraps with the counter)
    arrived = before + step
    polls = tl.full([], 0, tl.int32)
    while (arrived != complete) & (polls < spin_limit):
        arrived = tl.atomic_add(arrivals, 0, sem="acquire")
        polls += 1
    if arrived == complete:
        k = tl.arange(0, split_padded)
        used = k < split
        pm = tl.load(part_ptr + row * split + k, mask=used, other=float("-inf"),
                     cache_modifier=".cg")
        ps = tl.load(part_ptr + rows * split + row * split + k, mask=used, other=0.0,
                     cache_modifier=".cg")
        row_max, row_sum = _merge(pm, ps, 0)
    else:
        row_max, row_sum = _row_stats(x_row, N, fallback_block, f64)
    if log:
        out = z - ((row_max - shift) + tl.log(row_sum))
    else:
        # exp(x - row max) / sum = e * exp(chunk max - row max) / sum: no second exp an element.
        # A row of -inf gives NaN (row max -inf, sum 0), as torch.
        out = e * (tl.exp(shift - row_max) / row_sum)
    if vector > 0:
        tl.store(y_ptr + offs, _cast_for(out, y_ptr), mask=offs < cut)
        tl.store(y_ptr + head, _cast_for(_finish(h, row_max, row_sum, log), y_ptr), mask=in_head)
        tail = cut + tl.arange(0, vector)
        in_tail = tail < tl.where(part == 0, end, cut)
        t = _acc(tl.load(x_ptr + tail, mask=in_tail, other=0.0), f64)
        tl.store(y_ptr + tail, _cast_for(_finish(t, row_max, row_sum, log), y_ptr), mask=in_tail)
    else:
        tl.store(y_row + offs, _cast_for(out, y_ptr), mask=mask)


@dataclass(frozen=True, eq=False)
class ChunkPlan:
    """One launch that walks rows in chunks of `block` (online's single pass, or the split pass's
    statistics and normalisation): the Launcher's spec and constexpr source. Built by
    chunk_plan, one object per distinct launch."""

    in_dtype: torch.dtype  # of the tensor read
    out_dtype: torch.dtype | None  # of the output (None: the statistics pass writes none)
    ints: tuple  # every integer argument (N / align, strides / align[, chunk, programs per row])
    align: int  # the power of two (<= 16) dividing N and the strides
    log: bool  # log_softmax
    f64: bool  # accumulate in float64
    block: int  # elements of a row per step
    offsets_64bit: bool  # offsets past 2**31 elements
    num_warps: int

    @property
    def split_padded(self) -> int:
        """The programs per row (the last integer argument) padded to a power of two."""
        return next_pow2(self.ints[-1])


@dataclass(frozen=True, eq=False)
class CoopPlan:
    """One cooperative launch (a row's chunks in programs that wait for each other's partial
    statistics): the Launcher's spec and constexpr source."""

    in_dtype: torch.dtype
    out_dtype: torch.dtype
    ints: tuple  # N / align, the row strides / align, programs per row, rows
    align: int
    log: bool
    f64: bool
    chunk: int  # elements of a row per program
    spin_limit: int  # polls of the arrival counter before a program gives up and recomputes
    fallback_block: int  # block of the recomputation when it gives up
    offsets_64bit: bool
    num_warps: int
    vector: int = 0  # elements per 16-byte vector of rows off the grid (heuristics' vector_shift)
    max_registers: int | None = None  # ptxas's cap a thread (None: its own choice)

    @property
    def split_padded(self) -> int:
        """The programs per row padded to a power of two."""
        return next_pow2(self.ints[3])


chunk_plan = functools.lru_cache(maxsize=4096)(ChunkPlan)
coop_plan = functools.lru_cache(maxsize=4096)(CoopPlan)


@dataclass(frozen=True, eq=False)
class OnlinePlan:
    """online's launches for one call under one config: the cooperative kernel, the chunked
    kernel alone (one program a row), or the split pair (the rows' statistics, then the
    normalisation). Each launch runs programs_per_row programs for every row."""

    forward: CoopPlan | LaggedPlan | ChunkPlan  # the launch that writes y (lagged.py's)
    stats: ChunkPlan | None  # the split pair's statistics launch (None: one launch)
    programs_per_row: int

    @property
    def coop(self) -> bool:
        return isinstance(self.forward, CoopPlan)


_ONLINE_FWD = plan_launcher(_online_fwd_kernel)
_SPLIT_STATS = plan_launcher(_split_stats_kernel)
_SPLIT_NORM = plan_launcher(_split_norm_kernel)
_COOP_FWD = plan_launcher(_coop_fwd_kernel, maxnreg="max_registers")


# A cooperative row has at most this many chunks (a program each, all running at once).
COOP_MAX_SPLIT = 64

# 16-bit rows of at most this many chunks of 4096 take 4096 x 4 warps first (coop_configs).
COOP_SHORT_SPLIT = 16


COOP_SPIN_LIMIT = 1 << 20


def coop_split(call: SoftmaxCall, chunk: int) -> int | None:
    """Programs per row of the cooperative kernel with chunks of `chunk`, or None if the row
    needs more than may be relied on to run at once (one per SM; the interpreter runs them one
    by one whatever the count)."""
    split = cdiv(call.n, chunk)
    limit = COOP_MAX_SPLIT if call.info.interpreted else min(COOP_MAX_SPLIT, call.info.sm_count)
    return split if 1 < split <= limit else None


def coop_fwd_plan(call: SoftmaxCall, chunk: int, warps: int, sms: int) -> OnlinePlan:
    """The cooperative forward's launch (a row's programs share their partial maxima and sums,
    one read), or the chunked one's where the row needs more programs than may run at once."""
    _, sx, _ = _reader(call)
    n, rows = call.n, call.outer
    split = coop_split(call, chunk)
    if split is None:
        # A cached config of this shape bucket, for a row this chunk size does not suit.
        block = 2048 if call.f64 else 4096
        return online_fwd_plan(call, block, 8, OnlineBackend.split_for(call, block, sms))
    a = _align(n, sx)
    ints = (n // a, sx // a, n // a, split, rows)
    spin = 1 if call.info.interpreted else COOP_SPIN_LIMIT
    fallback = min(chunk, 64 * 32 * warps // 16)
    i64 = needs_int64(call.numel + chunk, rows * sx + n, 2 * rows * split)
    vector = cost.vector_shift(call)
    return OnlinePlan(coop_plan(_read_dtype(call), call.out_dtype, ints, a, call.log, call.f64,
                                chunk, spin, fallback, i64, warps, vector,
                                coop_registers(chunk, warps, vector, call.f64)),
                      None, split)


# Registers a thread of the cooperative kernel needs beyond one for each element of its chunk
# (the exchange's counters, the addresses, the masks): ptxas's cap is the sum.
COOP_REGISTER_SLACK = 24


def coop_registers(chunk: int, warps: int, vector: int, f64: bool) -> int | None:
    """ptxas's register cap for the cooperative kernel, or None for ptxas's own choice.

    Programs an SM are what the kernel's speed follows (each holds its chunk while it waits for
    the row's others), and ptxas, left alone, takes about 8 registers more than the chunk
    needs: triton 3.6, float32 chunks of 4096 on 8 warps, 48 registers (5 programs an SM)
    where 40 hold it with no spill (6); 8192 on 16 warps, 51 (2) where 40 do (3). The cap is
    set only where it lets one more program in: where it does not (16-bit chunks of 8192 on 8
    warps: 4 programs either way) it cost up to 9% (fits/softmax.md, "online: the exchange").
    Rows off the 16-byte grid (their head and tail) and float64 spill under the cap, so they
    keep ptxas's choice."""
    if vector or f64:
        return None
    cap = chunk // (32 * warps) + COOP_REGISTER_SLACK
    return cap if programs_per_sm(warps, cap) > programs_per_sm(warps, cap + 8) else None


def online_fwd_plan(call: SoftmaxCall, block: int, warps: int, split: int) -> OnlinePlan:
    """The chunked forward's launches: one program a row, or `split` programs a row with the
    row's statistics combined by a second kernel."""
    _, sx, _ = _reader(call)
    n, rows = call.n, call.outer
    block = min(block, next_pow2(n))
    split = max(1, min(split, cdiv(n, block)))
    a = _align(n, sx)
    i64 = needs_int64(call.numel + split * block, rows * sx + n)
    log, f64 = call.log, call.f64
    in_dtype, out_dtype = _read_dtype(call), call.out_dtype
    if split == 1:
        ints = (n // a, sx // a, n // a)
        return OnlinePlan(chunk_plan(in_dtype, out_dtype, ints, a, log, f64, block, i64, warps),
                          None, 1)
    chunk = cdiv(cdiv(n, split), block) * block
    split = cdiv(n, chunk)
    stats = (n // a, sx // a, chunk, split)
    norm = (n // a, sx // a, n // a, chunk, split)
    return OnlinePlan(chunk_plan(in_dtype, out_dtype, norm, a, log, f64, block, i64, warps),
                      chunk_plan(in_dtype, None, stats, a, False, f64, block, i64, warps), split)


def _coop_fwd(plan: OnlinePlan, call: SoftmaxCall):
    """The prepared cooperative forward: a function x -> y of the call's input."""
    read = _reader(call)[0]
    rows, split, device = call.outer, plan.programs_per_row, call.x.device
    ints = plan.forward.ints
    acc = torch.float64 if call.f64 else torch.float32
    launch = _COOP_FWD.bind(plan.forward, (rows * split,), call.info.index)
    new_y = allocator(tuple(call.x.shape), call.out_dtype, device)
    # Per row: the programs' maxima, then their sums; its arrival counter.
    new_partials = allocator((2 * rows * split,), acc, device)
    buffers = per_stream(device, lambda: (new_partials(),
                                          torch.zeros(rows, dtype=torch.int32, device=device)))

    def forward(x: torch.Tensor) -> torch.Tensor:
        if read is not None:
            x = read(x)
        y = new_y()
        partials, counters = buffers()
        launch(x, y, partials, counters, *ints)
        return y

    return forward


def _online_fwd(plan: OnlinePlan, call: SoftmaxCall):
    """The prepared chunked forward (one launch, or the split pair): a function x -> y of the
    call's input."""
    read = _reader(call)[0]
    rows, index = call.outer, call.info.index
    shape, out_dtype, device = tuple(call.x.shape), call.out_dtype, call.x.device
    if plan.stats is None:
        launch = _ONLINE_FWD.bind(plan.forward, (rows,), index)
        return _one_launch(read, launch, plan.forward.ints, shape, out_dtype, device)
    split = plan.programs_per_row
    acc = torch.float64 if call.f64 else torch.float32
    stats, norm = plan.stats.ints, plan.forward.ints
    launch_stats = _SPLIT_STATS.bind(plan.stats, (rows * split,), index)
    launch_norm = _SPLIT_NORM.bind(plan.forward, (rows * split,), index)

    new_y = allocator(shape, out_dtype, device)
    new_stat = allocator((rows * split,), acc, device)

    def split_forward(x: torch.Tensor) -> torch.Tensor:
        if read is not None:
            x = read(x)
        y = new_y()
        m, s = new_stat(), new_stat()
        launch_stats(x, m, s, *stats)
        launch_norm(x, y, m, s, *norm)
        return y

    return split_forward


#: The keys of online's configs: a lagged launch's, a cooperative one's, and a chunked one's.
LAGGED_CONFIG_KEYS = frozenset({"chunk", "num_warps", "lag"})
COOP_CONFIG_KEYS = frozenset({"chunk", "num_warps"})
CONFIG_KEYS = frozenset({"block", "num_warps", "split"})


class OnlineBackend(ForwardBackend):
    name = "online"

    def config_keys(self, config) -> frozenset:
        if "lag" in config:
            return LAGGED_CONFIG_KEYS
        return COOP_CONFIG_KEYS if "chunk" in config else CONFIG_KEYS

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
        """Cooperative rows (one read): chunks of 4K-16K values (the first whose row fits in one
        program per SM is what the cold model runs). 8192 x 8 warps first: it was the fastest
        chunk on vocabulary rows from 64 to 4096 rows, 4096 on fewer rows
        (benchmarks/results/h200/fits/softmax.md, "online: cooperative chunk order"); 4096 x 4
        first for 16-bit rows of at most 16 such chunks, where its register cap lets 9
        programs an SM in (8192 x 50304 fp16: 549 us against 619; 16384 x 32000 bf16: 657
        against 726; "online: the exchange")."""
        wide = 2 if call.f64 else 1
        shapes = [(8192, 8), (4096, 4), (4096, 8), (16384, 16)]  # (chunk, warps)
        if call.x.element_size() == 2 and cdiv(call.n, 4096) <= COOP_SHORT_SPLIT:
            shapes[:2] = shapes[1::-1]
        return [{"chunk": c // wide, "num_warps": w} for c, w in shapes
                if coop_split(call, c // wide)]

    def configs(self, call: SoftmaxCall) -> list[dict]:
        block = 2048 if call.f64 else 4096
        split = self.split_for(call, block, call.info.sm_count)
        cfgs = lagged_configs(call) + self.coop_configs(call) + [
            {"block": block, "num_warps": 8, "split": split},
            {"block": 2 * block, "num_warps": 16, "split": split}]
        if split > 1:
            cfgs.append({"block": block, "num_warps": 8, "split": max(1, split // 2)})
            cfgs.append({"block": block, "num_warps": 8, "split": 2 * split})
        else:
            cfgs.append({"block": block // 2, "num_warps": 4, "split": 1})
        return cfgs

    @staticmethod
    def forward_plan(call: SoftmaxCall, config, sms: int) -> OnlinePlan:
        if "lag" in config:
            plan = lagged_fwd_plan(call, config["chunk"], config["num_warps"], config["lag"])
            if plan is not None:
                return OnlinePlan(plan, None, plan.ints[3])
            # (a cached config of this shape bucket, for a row it does not take)
            return coop_fwd_plan(call, config["chunk"], config["num_warps"], sms)
        if "chunk" in config:
            return coop_fwd_plan(call, config["chunk"], config["num_warps"], sms)
        return online_fwd_plan(call, config["block"], config["num_warps"], config["split"])

    @staticmethod
    def _forward(plan: OnlinePlan, call: SoftmaxCall):
        if isinstance(plan.forward, LaggedPlan):
            return lagged_fwd(plan.forward, call)
        return (_coop_fwd if plan.coop else _online_fwd)(plan, call)

    def cost(self, call: SoftmaxCall, model) -> Estimate:
        lagged = lagged_configs(call)
        if lagged:
            split = lagged_split(call, lagged[0]["chunk"])
            return cost.online(call, model, split=split,
                               lagged=lagged_rows(call, split, lagged[0]["lag"]))
        coop = self.coop_configs(call)
        if coop:
            chunk = coop[0]["chunk"]
            return cost.online(call, model, split=coop_split(call, chunk), cooperative=True,
                               chunk=chunk * (2 if call.f64 else 1))
        cfg = self.configs(call)[0]
        split = max(1, min(self.split_for(call, cfg["block"], model.sm_count),
                           cdiv(call.n, cfg["block"])))
        return cost.online(call, model, split=split)
