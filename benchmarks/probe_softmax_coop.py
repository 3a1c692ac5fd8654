"""Probe (issue 35): where the cooperative softmax's time goes on vocabulary rows, and the
rewrites of its exchange that were tried, timed in turns on one GPU.

The library's cooperative kernel (opselect/kernels/softmax/online.py) holds a row's chunk, and its
exp, in registers: one read and one write an element. Its programs wait for the row's other
chunks' (max, sum) before they write. Variants (fits/softmax.md, "online: the exchange", has the
numbers):

- lib: the library's kernel at a chunk / warps, with its register cap; lib-free: the same
  without the cap (ptxas's own register count).
- before (--before FILE): the kernel of an earlier online.py, loaded from its source.
- nosync: the same program shape without the exchange (each chunk normalised by its own
  statistics: a wrong answer, the floor of the shape). It runs at the copy's speed where the
  library ran at 66%: the exchange, not the shape, costs the third.

With --tried, the variants that lost:
- lean: the exchange as the library now has it (the arrival's answer tells the last program it
  is last; the counter moves on by a power of two a launch, never reset), written here; leandep:
  lean with the old departure counter and reset.
- tagged: no atomics: each program's (max, sum) one 64-bit word, the launch's tag in the sum's
  two lowest bits, polled until every word of the row carries it.
- pipe / ptag: lean / tagged in persistent programs, groups of a row's programs walking the rows,
  each loading the group's next row's chunk before it waits.
- reread: programs that hold no chunk: a pass over it, the exchange, a second pass from L2.
(A first run also had 16-bit rows held as int32 pairs: ptxas gave them as many registers, 63
against 64, and they were slower everywhere; the variant is gone, its data in
fits/softmax_coop_probe_pairs_pipe.json.)

    python benchmarks/probe_softmax_coop.py          # on the GPU: a table, JSON under $OUT
    python benchmarks/probe_softmax_coop.py --tried  # also the variants that lost
    python benchmarks/probe_softmax_coop.py --before old_online.py  # and an earlier kernel
    python benchmarks/probe_softmax_coop.py --smoke  # tiny rows, any device: answers checked
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import pathlib
import statistics
import sys
import tempfile

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from opselect.kernels.softmax.common import _merge, _online_step  # noqa: E402
from probe_softmax_vocab import in_turns  # noqa: E402  (variants in turns, A B C A B C ...)


@triton.jit
def _row_scan(x_ptr, row, N, FALLBACK: tl.constexpr):
    """A row's (max, sum), each of shape [1], read from the row itself: where a wait gives up."""
    cols = tl.arange(0, FALLBACK)
    m = tl.full([FALLBACK], float("-inf"), tl.float32)
    t = tl.zeros([FALLBACK], tl.float32)
    for start in range(0, N, FALLBACK):
        o = start + cols
        v = tl.load(x_ptr + tl.cast(row, tl.int64) * N + o, mask=o < N,
                    other=float("-inf")).to(tl.float32)
        m, t = _online_step(m, t, v)
    return _merge(m, t, 0)


@triton.jit
def _exchange(part_ptr, count_ptr, x_ptr, row, part, split, rows, N, big, total,
              SP: tl.constexpr, SPIN: tl.constexpr, FALLBACK: tl.constexpr):
    """Publish this chunk's (max, sum), wait for the row's other chunks, return the row's.

    Each launch adds SP (a power of two >= split) to the row's counter: the row's first chunk
    adds SP - split + 1, the others 1. A program's arrival returns the count before it, so the
    launch's target is the next multiple of SP, and the counter never needs a reset (the next
    launch on the stream starts after this one ends; int32 wrap-around keeps the multiples)."""
    slot = row * split + part
    one = tl.arange(0, 1)
    tl.store(part_ptr + slot + one, big + tl.zeros([1], tl.float32))
    tl.store(part_ptr + rows * split + slot + one, total + tl.zeros([1], tl.float32))
    tl.debug_barrier()
    inc = tl.where(part == 0, SP - split + 1, 1)
    old = tl.atomic_add(count_ptr + row, inc, sem="acq_rel")
    target = (old & (-SP)) + SP
    arrived = old + inc
    polls = tl.full([], 0, tl.int32)
    while (arrived != target) & (polls < SPIN):
        arrived = tl.atomic_add(count_ptr + row, 0, sem="acquire")
        polls += 1
    if arrived == target:
        k = tl.arange(0, SP)
        pm = tl.load(part_ptr + row * split + k, mask=k < split, other=float("-inf"),
                     cache_modifier=".cg")
        ps = tl.load(part_ptr + rows * split + row * split + k, mask=k < split, other=0.0,
                     cache_modifier=".cg")
        row_max, row_sum = _merge(pm, ps, 0)
    else:  # the wait gave up (the interpreter runs programs one by one): read the row again
        row_max, row_sum = _row_scan(x_ptr, row, N, FALLBACK)
    return row_max, row_sum


@triton.jit
def _lean(x_ptr, y_ptr, part_ptr, count_ptr, N, split, rows, CHUNK: tl.constexpr,
          SP: tl.constexpr, SPIN: tl.constexpr, FALLBACK: tl.constexpr, SYNC: tl.constexpr,
          DEPART: tl.constexpr = False):
    pid = tl.program_id(0)
    row = pid // split
    part = pid - row * split
    offs = part * CHUNK + tl.arange(0, CHUNK)
    mask = offs < N
    base = row.to(tl.int64) * N
    raw = tl.load(x_ptr + base + offs, mask=mask, other=float("-inf"))
    big, shift, e, total = _chunk_exp(raw)
    if SYNC:
        row_max, row_sum = _exchange(part_ptr, count_ptr, x_ptr, row, part, split, rows, N,
                                     big, total, SP, SPIN, FALLBACK)
    else:
        row_max, row_sum = big, total
    out = e * (tl.exp(shift - row_max) / row_sum)
    tl.store(y_ptr + base + offs, out.to(y_ptr.dtype.element_ty), mask=mask)
    if DEPART:  # the library's old tail: a departure counter, the last program zeroes both
        if tl.atomic_add(count_ptr + rows + row, 1, sem="acq_rel") == split - 1:
            tl.atomic_xchg(count_ptr + row, 0, sem="relaxed")
            tl.atomic_xchg(count_ptr + rows + row, 0, sem="relaxed")


@triton.jit
def _chunk_exp(raw):
    """A chunk's max, the shift its exp takes (0 for a chunk of -inf), the exp and its sum."""
    x = raw.to(tl.float32)
    big = tl.max(x, axis=0)
    shift = tl.where(big == float("-inf"), 0.0, big)
    e = tl.exp(x - shift)
    return big, shift, e, tl.sum(e, axis=0)


@triton.jit
def _first_of_group(x_ptr, N, split, CHUNK: tl.constexpr):
    """A persistent program's group, part, the groups, its chunk's offsets and mask, and the
    chunk of the group's first row."""
    pid = tl.program_id(0)
    group = pid // split
    part = pid - group * split
    offs = part * CHUNK + tl.arange(0, CHUNK)
    raw = tl.load(x_ptr + group.to(tl.int64) * N + offs, mask=offs < N, other=float("-inf"))
    return group, part, tl.num_programs(0) // split, offs, offs < N, raw


@triton.jit
def _pipe(x_ptr, y_ptr, part_ptr, count_ptr, N, split, rows, CHUNK: tl.constexpr,
          SP: tl.constexpr, SPIN: tl.constexpr, FALLBACK: tl.constexpr):
    """lean, persistent: num_programs / split groups of a row's programs, each group walking
    rows group, group + groups, ...; the next row's chunk is loaded before the wait for this
    row's other chunks, so the wait overlaps the group's next read."""
    group, part, groups, offs, mask, raw = _first_of_group(x_ptr, N, split, CHUNK)
    for row in range(group, rows, groups):
        big, shift, e, total = _chunk_exp(raw)
        nxt = row + groups
        raw = tl.load(x_ptr + tl.cast(nxt, tl.int64) * N + offs,
                      mask=offs < tl.where(nxt < rows, N, 0), other=float("-inf"))
        row_max, row_sum = _exchange(part_ptr, count_ptr, x_ptr, row, part, split, rows, N,
                                     big, total, SP, SPIN, FALLBACK)
        out = e * (tl.exp(shift - row_max) / row_sum)
        tl.store(y_ptr + tl.cast(row, tl.int64) * N + offs, out.to(y_ptr.dtype.element_ty),
                 mask=mask)


@triton.jit
def _tagged_exchange(slot_ptr, x_ptr, row, part, split, N, big, total, epoch,
                     SP: tl.constexpr, SPIN: tl.constexpr, FALLBACK: tl.constexpr):
    """The exchange without atomics or fences: each program stores its (max, sum) as one 64-bit
    word (single-copy atomic), the sum's two lowest bits replaced by the launch's tag (its
    slot's old tag + 1, mod 4); the others poll the row's words until every tag is this
    launch's. (The max cannot carry the tag: a shift off by 3 ulps of 1e30 overflows exp.)"""
    one = tl.arange(0, 1)
    sbits = (total.to(tl.int32, bitcast=True) & -4) | epoch
    word = (big.to(tl.int32, bitcast=True).to(tl.int64) << 32) | (sbits.to(tl.int64) & 4294967295)
    tl.store(slot_ptr + row * split + part + one, word + tl.zeros([1], tl.int64))
    k = tl.arange(0, SP)
    used = k < split
    words = tl.load(slot_ptr + row * split + k, mask=used, other=0, volatile=True)
    late = tl.sum(tl.where(used & ((words & 3).to(tl.int32) != epoch), 1, 0), axis=0)
    polls = tl.full([], 0, tl.int32)
    while (late > 0) & (polls < SPIN):
        words = tl.load(slot_ptr + row * split + k, mask=used, other=0, volatile=True)
        late = tl.sum(tl.where(used & ((words & 3).to(tl.int32) != epoch), 1, 0), axis=0)
        polls += 1
    if late == 0:
        pm = tl.where(used, (words >> 32).to(tl.int32).to(tl.float32, bitcast=True),
                      float("-inf"))
        ps = tl.where(used, words.to(tl.int32).to(tl.float32, bitcast=True), 0.0)
        row_max, row_sum = _merge(pm, ps, 0)
    else:
        row_max, row_sum = _row_scan(x_ptr, row, N, FALLBACK)
    return row_max, row_sum


@triton.jit
def _tagged(x_ptr, y_ptr, slot_ptr, N, split, CHUNK: tl.constexpr, SP: tl.constexpr,
            SPIN: tl.constexpr, FALLBACK: tl.constexpr):
    pid = tl.program_id(0)
    row = pid // split
    part = pid - row * split
    # This launch's tag: the slot's last one + 1 (every slot of a row moves on together).
    epoch = ((tl.load(slot_ptr + pid, volatile=True).to(tl.int32) & 3) + 1) & 3
    offs = part * CHUNK + tl.arange(0, CHUNK)
    mask = offs < N
    base = row.to(tl.int64) * N
    big, shift, e, total = _chunk_exp(tl.load(x_ptr + base + offs, mask=mask,
                                              other=float("-inf")))
    row_max, row_sum = _tagged_exchange(slot_ptr, x_ptr, row, part, split, N, big, total, epoch,
                                        SP, SPIN, FALLBACK)
    out = e * (tl.exp(shift - row_max) / row_sum)
    tl.store(y_ptr + base + offs, out.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _pipe_tagged(x_ptr, y_ptr, slot_ptr, N, split, rows, CHUNK: tl.constexpr, SP: tl.constexpr,
                 SPIN: tl.constexpr, FALLBACK: tl.constexpr):
    """pipe with the tagged exchange: no fence waits for the next row's loads in flight."""
    group, part, groups, offs, mask, raw = _first_of_group(x_ptr, N, split, CHUNK)
    old = tl.load(slot_ptr + group * split + part, volatile=True)
    for row in range(group, rows, groups):
        epoch = ((old.to(tl.int32) & 3) + 1) & 3
        big, shift, e, total = _chunk_exp(raw)
        nxt = row + groups
        raw = tl.load(x_ptr + tl.cast(nxt, tl.int64) * N + offs,
                      mask=offs < tl.where(nxt < rows, N, 0), other=float("-inf"))
        old = tl.load(slot_ptr + tl.minimum(nxt, rows - 1) * split + part, volatile=True)
        row_max, row_sum = _tagged_exchange(slot_ptr, x_ptr, row, part, split, N, big, total,
                                            epoch, SP, SPIN, FALLBACK)
        out = e * (tl.exp(shift - row_max) / row_sum)
        tl.store(y_ptr + tl.cast(row, tl.int64) * N + offs, out.to(y_ptr.dtype.element_ty),
                 mask=mask)


@triton.jit
def _reread(x_ptr, y_ptr, part_ptr, count_ptr, N, split, rows, CHUNK: tl.constexpr,
            BLOCK: tl.constexpr, SP: tl.constexpr, SPIN: tl.constexpr,
            FALLBACK: tl.constexpr):
    pid = tl.program_id(0)
    row = pid // split
    part = pid - row * split
    base = row.to(tl.int64) * N
    first = part * CHUNK
    cols = tl.arange(0, BLOCK)
    m = tl.full([BLOCK], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK], tl.float32)
    for start in range(0, CHUNK, BLOCK):
        o = first + start + cols
        x = tl.load(x_ptr + base + o, mask=o < N, other=float("-inf")).to(tl.float32)
        # One exp an element: the smaller of (x, m) scaled by the larger.
        d = x - m
        g = tl.where(x == float("-inf"), 0.0, tl.exp(-tl.abs(d)))
        s = tl.where(d > 0, s * g + 1.0, s + g)
        m = tl.maximum(m, x)
    big, total = _merge(m, s, 0)
    big = tl.max(big, axis=0)
    total = tl.sum(total, axis=0)
    row_max, row_sum = _exchange(part_ptr, count_ptr, x_ptr, row, part, split, rows, N, big,
                                 total, SP, SPIN, FALLBACK)
    scale = 1.0 / row_sum
    for i in range(0, CHUNK // BLOCK):
        o = first + CHUNK - BLOCK - i * BLOCK + cols
        x = tl.load(x_ptr + base + o, mask=o < N, other=float("-inf")).to(tl.float32)
        tl.store(y_ptr + base + o, (tl.exp(x - row_max) * scale).to(y_ptr.dtype.element_ty),
                 mask=o < N)


def _buffers(x, chunk):
    rows, n = x.shape
    split = triton.cdiv(n, chunk)
    part = torch.empty(2 * rows * split, device=x.device, dtype=torch.float32)
    count = torch.zeros(rows, device=x.device, dtype=torch.int32)
    return rows, n, split, part, count


def lean(x, chunk, warps, sync=True, spin=1 << 20, depart=False):
    rows, n, split, part, count = _buffers(x, chunk)
    count = torch.zeros(2 * rows, device=x.device, dtype=torch.int32)
    sp = triton.next_power_of_2(max(split, 2))

    def run():
        y = torch.empty_like(x)
        _lean[(rows * split,)](x, y, part, count, n, split, rows, CHUNK=chunk, SP=sp, SPIN=spin,
                               FALLBACK=1024, SYNC=sync, DEPART=depart, num_warps=warps)
        return y
    return run


def pipe(x, chunk, warps, resident, spin=1 << 20, sms=132):
    """The persistent lean kernel with `resident` programs an SM: groups of a row's programs."""
    rows, n, split, part, count = _buffers(x, chunk)
    sp = triton.next_power_of_2(max(split, 2))
    groups = max(1, min(rows, sms * resident // split))

    def run():
        y = torch.empty_like(x)
        _pipe[(groups * split,)](x, y, part, count, n, split, rows, CHUNK=chunk, SP=sp,
                                 SPIN=spin, FALLBACK=1024, num_warps=warps)
        return y
    return run


def tagged(x, chunk, warps, spin=1 << 20):
    rows, n = x.shape
    split = triton.cdiv(n, chunk)
    slots = torch.zeros(rows * split, device=x.device, dtype=torch.int64)
    sp = triton.next_power_of_2(max(split, 2))

    def run():
        y = torch.empty_like(x)
        _tagged[(rows * split,)](x, y, slots, n, split, CHUNK=chunk, SP=sp, SPIN=spin,
                                 FALLBACK=1024, num_warps=warps)
        return y
    return run


def pipe_tagged(x, chunk, warps, resident, spin=1 << 20, sms=132):
    rows, n = x.shape
    split = triton.cdiv(n, chunk)
    slots = torch.zeros(rows * split, device=x.device, dtype=torch.int64)
    sp = triton.next_power_of_2(max(split, 2))
    groups = max(1, min(rows, sms * resident // split))

    def run():
        y = torch.empty_like(x)
        _pipe_tagged[(groups * split,)](x, y, slots, n, split, rows, CHUNK=chunk, SP=sp,
                                        SPIN=spin, FALLBACK=1024, num_warps=warps)
        return y
    return run


def reread(x, chunk, block, warps, spin=1 << 20):
    rows, n, split, part, count = _buffers(x, chunk)
    sp = triton.next_power_of_2(max(split, 2))

    def run():
        y = torch.empty_like(x)
        _reread[(rows * split,)](x, y, part, count, n, split, rows, CHUNK=chunk, BLOCK=block,
                                 SP=sp, SPIN=spin, FALLBACK=1024, num_warps=warps)
        return y
    return run


def lib(x, chunk, warps, registers=0):
    """The library's cooperative softmax with this chunk and warps, prepared once per input;
    registers: ptxas's cap a thread (0: the library's rule, None: none)."""
    import dataclasses
    from opselect.kernels.softmax import SOFTMAX_OP, online
    call = SOFTMAX_OP.prepare(x, -1)
    if registers == 0:
        prepared = SOFTMAX_OP.backend("online").bind(call, {"chunk": chunk, "num_warps": warps})
        return lambda: prepared(x)
    plan = online.coop_fwd_plan(call, chunk, warps, call.info.sm_count)
    plan = dataclasses.replace(plan, forward=dataclasses.replace(plan.forward,
                                                                 max_registers=registers))
    return functools.partial(online._coop_fwd(plan, call), x)


BEFORE = None  # --before FILE: an earlier opselect/kernels/softmax/online.py, loaded by path


def load_before(path: str):
    """The online module of an earlier source, its package imports made absolute."""
    src = pathlib.Path(path).read_text()
    for rel, pkg in (("from ...", "from opselect."), ("from ..", "from opselect.kernels."),
                     ("from .", "from opselect.kernels.softmax.")):
        src = src.replace(rel, pkg)
    target = pathlib.Path(tempfile.mkdtemp()) / "online_before.py"
    target.write_text(src)
    spec = importlib.util.spec_from_file_location("online_before", target)
    module = importlib.util.module_from_spec(spec)
    sys.modules["online_before"] = module
    spec.loader.exec_module(module)
    return module


def before(x, chunk, warps):
    """The earlier source's cooperative kernel, this chunk and warps."""
    from opselect.kernels.softmax import SOFTMAX_OP
    call = SOFTMAX_OP.prepare(x, -1)
    plan = BEFORE.coop_fwd_plan(call, chunk, warps, call.info.sm_count)
    return functools.partial(BEFORE._coop_fwd(plan, call), x)


def variants_for(x, tried: bool) -> dict:
    """lib and lean at chunks of 8 to 32 elements a thread (the registers a program holds set how
    many programs an SM keeps, and so the bytes in flight), nosync at the library's chunk; with
    `tried`, the variants that lost (pipe, tagged, ptag, reread) as well."""
    wide = x.element_size() == 4
    n = x.shape[1]
    v = {"torch": lambda: torch.softmax(x, -1), "clone": lambda: x.clone()}
    for chunk, warps in ((8192, 8), (4096, 4), (16384, 16), (4096, 8), (8192, 16)):
        c = chunk // 2 if wide else chunk
        if not 1 < triton.cdiv(n, c) <= 132:
            continue
        if triton.cdiv(n, c) <= 64:  # the library's limit (COOP_MAX_SPLIT)
            v[f"lib {c}/{warps}"] = lib(x, c, warps)
            v[f"lib-free {c}/{warps}"] = lib(x, c, warps, None)
            if BEFORE is not None:
                v[f"before {c}/{warps}"] = before(x, c, warps)
        if tried:
            v[f"lean {c}/{warps}"] = lean(x, c, warps)
            v[f"leandep {c}/{warps}"] = lean(x, c, warps, depart=True)
        if (chunk, warps) == (8192, 8):
            v[f"nosync {c}/{warps}"] = lean(x, c, warps, sync=False)
        if tried and chunk // warps in (1024, 2048):
            v[f"tagged {c}/{warps}"] = tagged(x, c, warps)
            for resident in (2, 4):
                v[f"pipe {c}/{warps} r{resident}"] = pipe(x, c, warps, resident)
                v[f"ptag {c}/{warps} r{resident}"] = pipe_tagged(x, c, warps, resident)
    if tried:
        for chunk, block, warps in ((16384, 2048, 4), (32768, 4096, 8)):
            if triton.cdiv(n, chunk) <= 132:
                v[f"reread {chunk}/{block}/{warps}"] = reread(x, chunk, block, warps)
    return v


def wrong(variants: dict, ref, skip=("nosync",)) -> dict:
    """Variants whose answer (each run five times: the counters must carry over, the tags wrap
    around mod 4) is off torch's; those named from `skip` are wrong by design."""
    bad = {}
    for name, fn in variants.items():
        if name == "clone" or name.split()[0] in skip:
            continue
        for _ in range(5):
            y = fn()
        err = (y.float() - ref).abs().max().item()
        if not err < 2e-2:
            bad[name] = err
    return bad


SHAPES = [((4096, 128256), torch.bfloat16), ((8192, 50304), torch.float16),
          ((16384, 32000), torch.bfloat16), ((1024, 151936), torch.float32),
          ((256, 151936), torch.bfloat16), ((64, 128256), torch.bfloat16),
          ((8, 128256), torch.bfloat16)]


def smoke_rows():
    """Tiny rows (any device: the interpreter on a CPU) with -inf runs, +inf (or a large value)
    and NaN, and torch's float32 answer for each: (x, ref) pairs."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for shape, dtype in (((3, 1000), torch.float32), ((2, 777), torch.bfloat16)):
        x = (torch.randn(shape) * 3).to(dtype).to(device)
        x[0, :7] = float("-inf")
        x[-1, 500:] = float("-inf")
        x[1, 3] = float("inf") if dtype == torch.float32 else 30.0
        x[-1, 600] = float("nan")
        yield x, torch.softmax(x.float(), -1)


def smoke() -> None:
    for x, ref in smoke_rows():
        for name, fn in {"lean": lean(x, 256, 4, spin=2), "nospin": lean(x, 256, 4, spin=0),
                         "pipe": pipe(x, 256, 4, 1, spin=2, sms=2),
                         "pipe0": pipe(x, 256, 4, 2, spin=0, sms=2),
                         "tagged": tagged(x, 256, 4, spin=2),
                         "ptag": pipe_tagged(x, 256, 4, 1, spin=2, sms=2),
                         "ptag0": pipe_tagged(x, 128, 4, 3, spin=0, sms=2),
                         "tagged0": tagged(x, 128, 4, spin=0),
                         "reread": reread(x, 512, 128, 4, spin=2)}.items():
            for _ in range(6):  # the tags wrap around (mod 4)
                y = fn()
            ok = torch.allclose(y.float(), ref, atol=1e-2, equal_nan=True)
            print(f"{name} {tuple(x.shape)} {x.dtype}: {'ok' if ok else 'WRONG'}", flush=True)


def summary(times: dict, traffic: int, copy_bw: float, label: str, **facts) -> dict:
    """Median us, spread and % of the copy's rate of each variant's times (us, in turns), printed
    fastest first under `label`; the JSON row, with `facts` (its shape, dtype, bad, ...)."""
    med = {n: statistics.median(t) for n, t in times.items()}
    spread = {n: (max(t) - min(t)) / statistics.median(t) for n, t in times.items()}
    pct = {n: 100 * traffic / (t * 1e-6) / (copy_bw * 1e12) for n, t in med.items()}
    print(f"{label}: bad {facts.get('bad')}", flush=True)
    for n in sorted(med, key=med.get):
        print(f"    {n:24s} {med[n]:8.1f} us {pct[n]:5.0f}%  spread {100 * spread[n]:.0f}%",
              flush=True)
    return {**facts, "us": med, "spread": spread, "pct_copy": pct}


def measure(shapes, variants_for, wrong, name: str, only=()) -> None:
    """Each shape's variants (variants_for(x)) checked (wrong(variants, ref)) and timed in
    turns; a table per shape, and JSON under $OUT as <name>.json (also probe_softmax_last's)."""
    out = os.environ.get("OUT", ".")
    src = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")
    copy_bw = 2 * src.numel() / triton.testing.do_bench(src.clone, rep=50) / 1e9
    results = []
    for shape, dtype in shapes:
        if only and f"{shape[0]}x{shape[1]}" not in only:
            continue
        x = torch.randn(shape, device="cuda", dtype=dtype) * 3
        ref = torch.softmax(x.float(), -1)
        variants = variants_for(x)
        bad = wrong(variants, ref)
        times = {n: [ms * 1e3 for ms in t] for n, t in in_turns(variants, rep=25).items()}
        results.append(summary(times, 2 * x.numel() * x.element_size(), copy_bw,
                               f"{shape} {str(dtype)[6:]}", shape=list(shape), dtype=str(dtype),
                               bad=bad))
        del x, ref, variants
        torch.cuda.empty_cache()
    with open(os.path.join(out, f"{name}.json"), "w") as f:
        json.dump({"copy_tb_s": copy_bw, "results": results}, f, indent=1)


def main(tried: bool) -> None:
    measure(SHAPES, lambda x: variants_for(x, tried), wrong, "probe_softmax_coop")


if __name__ == "__main__":
    if "--before" in sys.argv[1:]:
        BEFORE = load_before(sys.argv[sys.argv.index("--before") + 1])
    smoke() if "--smoke" in sys.argv[1:] else main("--tried" in sys.argv[1:])
