"""Probe (issue 35): softmax on many long rows where no program waits for another.

The cooperative kernel (opselect/kernels/softmax/online.py) has each of a row's programs hold
its chunk in registers until the row's other chunks have published their (max, sum);
probe_softmax_coop.py measured that the wait, not the program shape, costs a third of the copy
bandwidth on vocabulary rows. Three designs where nothing waits, timed in turns with torch, a
copy, the cooperative kernel (lib) and flag_gems (fits/softmax.md, "online: lagged", has the
H200's numbers):

- last C/W/B (--last): chunks of C elements on W warps publish their (max, sum) and leave; the
  program whose arrival completes the row (a counter's answer says so) writes the whole row,
  reading x again from L2, in blocks of B (last2: two blocks a step). Lost: one program writes a
  row, and those walks set the time (--diagnose: the walk's writes alone took most of it).
- lag C/W L: program (r, p) publishes chunk p of row r (a counter arrival) and writes chunk p
  of row r - L / split, read again from L2, after an acquire of that row's counter and a load
  of its statistics: two dependent round trips.
- lagtag C/W L: the library's lagged kernel (opselect/kernels/softmax/lagged.py): the row's
  statistics as tagged 64-bit words, loaded with the program's data, so no round trip waits.
  (The JSON in fits was measured with this probe's first form of it, which loaded the words
  into lanes several threads held; the library's loads each word in one thread, see its
  docstring.)

    python benchmarks/probe_softmax_last.py          # on the GPU: a table, JSON under $OUT
    python benchmarks/probe_softmax_last.py 4096x128256  # only these shapes
    python benchmarks/probe_softmax_last.py --last   # also the last-program variants
    python benchmarks/probe_softmax_last.py --diagnose  # also the walk without its exp, the
        # walk's writes alone (no read of x again) and probe_softmax_coop's nosync: wrong answers,
        # to place the time
    python benchmarks/probe_softmax_last.py --smoke  # tiny rows, any device: answers checked
"""

from __future__ import annotations

import functools
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from opselect.kernels.softmax import lagged  # noqa: E402
from opselect.kernels.softmax.common import _merge  # noqa: E402
from probe_softmax_coop import _row_scan, lean, lib, measure, smoke_rows  # noqa: E402
from probe_softmax_coop import wrong as coop_wrong  # noqa: E402
from probe_softmax_vocab import in_turns  # noqa: E402


@triton.jit
def _last(x_ptr, y_ptr, part_ptr, count_ptr, N, split, rows, CHUNK: tl.constexpr,
          BLOCK: tl.constexpr, SP: tl.constexpr, TWO: tl.constexpr, MODE: tl.constexpr = 0):
    pid = tl.program_id(0)
    row = pid // split
    part = pid - row * split
    base = row.to(tl.int64) * N
    offs = part * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(x_ptr + base + offs, mask=offs < N, other=float("-inf")).to(tl.float32)
    big = tl.max(x, axis=0)
    shift = tl.where(big == float("-inf"), 0.0, big)
    total = tl.sum(tl.exp(x - shift), axis=0)
    one = tl.arange(0, 1)
    slot = row * split + part
    tl.store(part_ptr + slot + one, big + tl.zeros([1], tl.float32))
    tl.store(part_ptr + rows * split + slot + one, total + tl.zeros([1], tl.float32))
    tl.debug_barrier()  # every thread's stores precede the release below
    # The row's counter moves on by SP a launch (the first chunk adds SP - split + 1, the others
    # 1): the arrival that reaches the next multiple of SP is the row's last.
    inc = tl.where(part == 0, SP - split + 1, 1)
    old = tl.atomic_add(count_ptr + row, inc, sem="acq_rel")
    if old + inc == (old & (-SP)) + SP:
        k = tl.arange(0, SP)
        pm = tl.load(part_ptr + row * split + k, mask=k < split, other=float("-inf"),
                     cache_modifier=".cg")
        ps = tl.load(part_ptr + rows * split + row * split + k, mask=k < split, other=0.0,
                     cache_modifier=".cg")
        row_max, row_sum = _merge(pm, ps, 0)
        scale = 1.0 / row_sum
        cols = tl.arange(0, BLOCK)
        if TWO:
            for start in range(0, N, 2 * BLOCK):
                o = start + cols
                p = o + BLOCK
                a = tl.load(x_ptr + base + o, mask=o < N, other=float("-inf")).to(tl.float32)
                b = tl.load(x_ptr + base + p, mask=p < N, other=float("-inf")).to(tl.float32)
                tl.store(y_ptr + base + o, (tl.exp(a - row_max) * scale).to(
                    y_ptr.dtype.element_ty), mask=o < N)
                tl.store(y_ptr + base + p, (tl.exp(b - row_max) * scale).to(
                    y_ptr.dtype.element_ty), mask=p < N)
        elif MODE == 0:
            for start in range(0, N, BLOCK):
                o = start + cols
                a = tl.load(x_ptr + base + o, mask=o < N, other=float("-inf")).to(tl.float32)
                tl.store(y_ptr + base + o, (tl.exp(a - row_max) * scale).to(
                    y_ptr.dtype.element_ty), mask=o < N)
        elif MODE == 1:  # diagnostic (a wrong answer): the walk without its exp
            for start in range(0, N, BLOCK):
                o = start + cols
                a = tl.load(x_ptr + base + o, mask=o < N, other=0.0).to(tl.float32)
                tl.store(y_ptr + base + o, (a * scale).to(y_ptr.dtype.element_ty), mask=o < N)
        else:  # diagnostic (a wrong answer): the walk's writes alone, no read of x
            for start in range(0, N, BLOCK):
                o = start + cols
                tl.store(y_ptr + base + o, (scale + tl.zeros([BLOCK], tl.float32)).to(
                    y_ptr.dtype.element_ty), mask=o < N)


@triton.jit
def _lag(x_ptr, y_ptr, part_ptr, count_ptr, N, split, rows, lag_rows, CHUNK: tl.constexpr,
         SP: tl.constexpr, SPIN: tl.constexpr, FALLBACK: tl.constexpr):
    """Program (r, p) publishes chunk p of row r's (max, sum), then writes chunk p of row
    r - lag_rows, whose statistics are complete by then (its programs started lag_rows * split
    programs earlier) and whose x is read again from L2. The grid has lag_rows rows of
    programs past the last row (they only write); every program arrives on its own row's
    counter, so all learn the launch's base."""
    pid = tl.program_id(0)
    row = pid // split
    part = pid - row * split
    offs = part * CHUNK + tl.arange(0, CHUNK)
    own = row < rows
    a = tl.load(x_ptr + row.to(tl.int64) * N + offs, mask=offs < tl.where(own, N, 0),
                other=float("-inf")).to(tl.float32)
    q = row - lag_rows
    later = q >= 0
    b = tl.load(x_ptr + q.to(tl.int64) * N + offs, mask=offs < tl.where(later, N, 0),
                other=float("-inf")).to(tl.float32)
    big = tl.max(a, axis=0)
    shift = tl.where(big == float("-inf"), 0.0, big)
    total = tl.sum(tl.exp(a - shift), axis=0)
    one = tl.arange(0, 1)
    slot = row * split + part
    live = one < tl.where(own, 1, 0)
    tl.store(part_ptr + slot + one, big + tl.zeros([1], tl.float32), mask=live)
    tl.store(part_ptr + (rows + lag_rows) * split + slot + one,
             total + tl.zeros([1], tl.float32), mask=live)
    tl.debug_barrier()
    inc = tl.where(part == 0, SP - split + 1, 1)
    old = tl.atomic_add(count_ptr + row, inc, sem="acq_rel")
    if later:
        target = (old & (-SP)) + SP
        seen = tl.atomic_add(count_ptr + q, 0, sem="acquire")
        polls = tl.full([], 0, tl.int32)
        while (seen != target) & (polls < SPIN):
            seen = tl.atomic_add(count_ptr + q, 0, sem="acquire")
            polls += 1
        if seen == target:
            k = tl.arange(0, SP)
            pm = tl.load(part_ptr + q * split + k, mask=k < split, other=float("-inf"),
                         cache_modifier=".cg")
            ps = tl.load(part_ptr + (rows + lag_rows) * split + q * split + k, mask=k < split,
                         other=0.0, cache_modifier=".cg")
            row_max, row_sum = _merge(pm, ps, 0)
        else:
            row_max, row_sum = _row_scan(x_ptr, q, N, FALLBACK)
        tl.store(y_ptr + q.to(tl.int64) * N + offs,
                 (tl.exp(b - row_max) * (1.0 / row_sum)).to(y_ptr.dtype.element_ty),
                 mask=offs < N)


def lagtag(x, chunk, warps, lag_programs, spin=None):
    """The library's lagged kernel (opselect/kernels/softmax/lagged.py) at this chunk, warps and
    lag, prepared once per input; spin: its spin limit (None: the library's)."""
    from opselect.kernels.softmax import SOFTMAX_OP
    call = SOFTMAX_OP.prepare(x, -1)
    saved = lagged.SPIN_LIMIT
    if spin is not None:
        lagged.SPIN_LIMIT = spin
    try:
        plan = lagged.lagged_fwd_plan(call, chunk, warps, lag_programs)
    finally:
        lagged.SPIN_LIMIT = saved
    return functools.partial(lagged.lagged_fwd(plan, call), x)


def lag(x, chunk, warps, lag_programs, spin=1 << 20):
    rows, n = x.shape
    split = triton.cdiv(n, chunk)
    lag_rows = max(1, min(rows, triton.cdiv(lag_programs, split)))
    total = rows + lag_rows
    part = torch.empty(2 * total * split, device=x.device, dtype=torch.float32)
    count = torch.zeros(total, device=x.device, dtype=torch.int32)
    sp = triton.next_power_of_2(max(split, 2))

    def run():
        y = torch.empty_like(x)
        _lag[(total * split,)](x, y, part, count, n, split, rows, lag_rows, CHUNK=chunk, SP=sp,
                               SPIN=spin, FALLBACK=1024, num_warps=warps)
        return y
    return run


def last(x, chunk, warps, block, two=False, mode=0):
    rows, n = x.shape
    split = triton.cdiv(n, chunk)
    part = torch.empty(2 * rows * split, device=x.device, dtype=torch.float32)
    count = torch.zeros(rows, device=x.device, dtype=torch.int32)
    sp = triton.next_power_of_2(max(split, 2))

    def run():
        y = torch.empty_like(x)
        _last[(rows * split,)](x, y, part, count, n, split, rows, CHUNK=chunk, BLOCK=block,
                               SP=sp, TWO=two, MODE=mode, num_warps=warps)
        return y
    return run


def variants_for(x) -> dict:
    wide = x.element_size() == 4
    n = x.shape[1]
    v = {"torch": lambda: torch.softmax(x, -1), "clone": lambda: x.clone()}
    try:
        import flag_gems
        v["flag_gems"] = lambda: flag_gems.ops.softmax(x, -1)
    except Exception:  # noqa: BLE001 - the peer is optional
        pass
    for chunk, warps in ((8192, 8), (4096, 4)):
        c = chunk // 2 if wide else chunk
        if 1 < triton.cdiv(n, c) <= 64:
            v[f"lib {c}/{warps}"] = lib(x, c, warps)
    if LAST:
        for chunk, warps, block in ((8192, 8, 4096), (8192, 8, 8192), (4096, 4, 4096),
                                    (16384, 8, 4096), (4096, 8, 4096)):
            c = chunk // 2 if wide else chunk
            v[f"last {c}/{warps}/{block}"] = last(x, c, warps, block)
        for chunk, warps, block in ((8192, 8, 4096), (4096, 4, 2048)):
            c = chunk // 2 if wide else chunk
            v[f"last2 {c}/{warps}/{block}"] = last(x, c, warps, block, two=True)
    for chunk, warps in ((8192, 8), (4096, 4), (2048, 4), (4096, 8)):
        c = chunk // 2 if wide else chunk
        for lag_programs in (256, 512, 1024):
            if (chunk, warps) in ((8192, 8), (4096, 4)) and lag_programs > 256:
                v[f"lag {c}/{warps} {lag_programs}"] = lag(x, c, warps, lag_programs)
            v[f"lagtag {c}/{warps} {lag_programs}"] = lagtag(x, c, warps, lag_programs)
    if DIAGNOSE:
        c = 4096 if wide else 8192
        v[f"noexp {c}/8/8192"] = last(x, c, 8, 8192, mode=1)
        v[f"noread {c}/8/8192"] = last(x, c, 8, 8192, mode=2)
        v[f"nosync {c}/8"] = lean(x, c, 8, sync=False)
    return v


DIAGNOSE = "--diagnose" in sys.argv[1:]
LAST = "--last" in sys.argv[1:]


def wrong(variants: dict, ref) -> dict:
    """Variants whose answer is off torch's (the diagnostics' are wrong by design)."""
    return coop_wrong(variants, ref, skip=("nosync", "noexp", "noread"))


SHAPES = [((4096, 128256), torch.bfloat16), ((8192, 50304), torch.float16),
          ((16384, 32000), torch.bfloat16), ((1024, 151936), torch.float32),
          ((1024, 131072), torch.bfloat16), ((256, 151936), torch.bfloat16),
          ((64, 128256), torch.bfloat16)]


def smoke() -> None:
    for x, ref in smoke_rows():
        for name, fn in {"last": last(x, 256, 4, 128), "last2": last(x, 128, 4, 64, True),
                         "last1": last(x, 1024, 4, 512), "lag": lag(x, 256, 4, 3),
                         "lag1": lag(x, 128, 4, 1), "lagspin0": lag(x, 256, 4, 2, spin=0),
                         "lagspin1": lag(x, 256, 4, 100, spin=1),
                         "lagtag": lagtag(x, 256, 4, 3), "lagtag1": lagtag(x, 128, 4, 1),
                         "lagtag0": lagtag(x, 256, 4, 2, spin=0)}.items():
            for _ in range(6):  # the tags wrap around (mod 4)
                y = fn()
            ok = torch.allclose(y.float(), ref, atol=1e-2, equal_nan=True)
            print(f"{name} {tuple(x.shape)} {x.dtype}: {'ok' if ok else 'WRONG'}", flush=True)


def main() -> None:
    only = [a for a in sys.argv[1:] if not a.startswith("--")]
    measure(SHAPES, variants_for, wrong, "probe_softmax_last", only)


if __name__ == "__main__":
    smoke() if "--smoke" in sys.argv[1:] else main()
