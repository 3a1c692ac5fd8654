"""Probe (issue 35): softmax over vocabulary rows, kernel variants timed in turns on one GPU.

Not a benchmark of the library: it compares candidate kernels written here before one of them
becomes a backend. Variants:
- coop: the library's cooperative kernel (opselect/kernels/softmax/online.py) at each chunk and
  warps: a row's chunks in programs that exchange (max, sum) through global memory, one read,
  one write and one exp an element. (The probe first compared it written here with chunks handed
  out by ticket against launch order: fits/softmax.md, "online: cooperative chunk order".)
- twopass: one program per row, a blockwise online (max, sum), then a normalising pass in reverse
  (the row's tail still in L2).
- flat: a contiguous tensor taken as one flat array cut in chunks of CHUNK elements (CHUNK <= the
  row's length), so every chunk starts on 16 bytes whatever the row's length (GPT-2's 50257:
  the row-wise kernels read such rows an element at a time). A chunk holds the end of one row
  and the start of the next at most: it publishes both parts' (max, sum), waits for each row's
  other chunks, as the cooperative kernel does, and writes its chunk in one vector store.

    python benchmarks/probe_softmax_vocab.py          # on the GPU: a table, JSON under $OUT
    python benchmarks/probe_softmax_vocab.py --smoke  # tiny rows, any device: answers checked
    python benchmarks/probe_softmax_vocab.py --shift  # rows off the 16-byte grid: the library's
                                                      # kernels with and without shifted vectors
"""

from __future__ import annotations

import json
import os
import statistics
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from opselect.kernels.softmax.common import _merge, _online_step  # noqa: E402


@triton.jit
def _twopass(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * N
    y_row = y_ptr + row * N
    cols = tl.arange(0, BLOCK)
    m = tl.full([], float("-inf"), tl.float32)
    s = tl.zeros([], tl.float32)
    for start in range(0, N, BLOCK):
        o = start + cols
        x = tl.load(x_row + o, mask=o < N, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
        m = m_new
    r = 1.0 / s
    n_blocks = tl.cdiv(N, BLOCK)
    for i in range(0, n_blocks):
        o = (n_blocks - 1 - i) * BLOCK + cols
        x = tl.load(x_row + o, mask=o < N, other=float("-inf")).to(tl.float32)
        tl.store(y_row + o, (tl.exp(x - m) * r).to(y_ptr.dtype.element_ty), mask=o < N)


@triton.jit
def _flat_stats(part_ptr, row, N, CHUNK: tl.constexpr, SPAN: tl.constexpr):
    """A row's (max, sum), each of shape [1], from the parts its chunks published: chunk c holds
    the row as its first part when the row is the one c starts in, else as its second."""
    first = (row * N) // CHUNK
    last = ((row + 1) * N - 1) // CHUNK
    c = first + tl.arange(0, SPAN)
    used = c <= last
    second = ((c * CHUNK) // N != row).to(tl.int64)
    m = tl.load(part_ptr + 4 * c + 2 * second, mask=used, other=float("-inf"), cache_modifier=".cg")
    s = tl.load(part_ptr + 4 * c + 2 * second + 1, mask=used, other=0.0, cache_modifier=".cg")
    return _merge(m, s, 0)


@triton.jit
def _flat_scan(x_ptr, row, N, BLOCK: tl.constexpr):
    """A row's (max, sum) read from the row itself: the fallback of a wait that lasts too long
    (the interpreter runs programs one at a time)."""
    cols = tl.arange(0, BLOCK)
    m = tl.full([BLOCK], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK], tl.float32)
    for start in range(0, N, BLOCK):
        o = start + cols
        x = tl.load(x_ptr + row * N + o, mask=o < N, other=float("-inf")).to(tl.float32)
        m, s = _online_step(m, s, x)
    return _merge(m, s, 0)


@triton.jit
def _flat_wait(count_ptr, row, N, CHUNK: tl.constexpr, SPIN: tl.constexpr):
    """Whether all of the row's chunks arrived within SPIN polls."""
    expected = ((row + 1) * N - 1) // CHUNK - (row * N) // CHUNK + 1
    arrived = tl.atomic_add(count_ptr + row, 0, sem="acquire")
    polls = tl.full([], 0, tl.int32)
    while (arrived < expected) & (polls < SPIN):
        arrived = tl.atomic_add(count_ptr + row, 0, sem="acquire")
        polls += 1
    return arrived >= expected


@triton.jit
def _flat_leave(count_ptr, rows, row, N, CHUNK: tl.constexpr):
    """The last chunk to leave a row sets its counters back to 0 (no memset between calls)."""
    expected = ((row + 1) * N - 1) // CHUNK - (row * N) // CHUNK + 1
    if tl.atomic_add(count_ptr + rows + row, 1, sem="acq_rel") == expected - 1:
        tl.atomic_xchg(count_ptr + row, 0, sem="relaxed")
        tl.atomic_xchg(count_ptr + rows + row, 0, sem="relaxed")


@triton.jit
def _flat_coop(x_ptr, y_ptr, part_ptr, count_ptr, N, rows, CHUNK: tl.constexpr,
               SPAN: tl.constexpr, SPIN: tl.constexpr, FALLBACK: tl.constexpr):
    total = rows * N
    start = tl.program_id(0).to(tl.int64) * CHUNK
    offs = start + tl.arange(0, CHUNK)
    inside = offs < total
    x = tl.load(x_ptr + offs, mask=inside, other=float("-inf")).to(tl.float32)
    r0 = start // N
    first_part = offs < (r0 + 1) * N  # the rest of the chunk is row r0 + 1's
    straddles = (r0 + 1) * N < tl.minimum(start + CHUNK, total)
    m0 = tl.max(tl.where(first_part, x, float("-inf")), axis=0)
    m1 = tl.max(tl.where(first_part, float("-inf"), x), axis=0)
    # An all -inf part (its max -inf) gets exp(x - 0) = 0; NaN stays NaN.
    sh0 = tl.where(m0 == float("-inf"), 0.0, m0)
    sh1 = tl.where(m1 == float("-inf"), 0.0, m1)
    e = tl.exp(x - tl.where(first_part, sh0, sh1))
    s0 = tl.sum(tl.where(first_part, e, 0.0), axis=0)
    s1 = tl.sum(tl.where(first_part, 0.0, e), axis=0)
    slot = part_ptr + 4 * tl.program_id(0).to(tl.int64) + tl.arange(0, 4)
    k = tl.arange(0, 4)
    tl.store(slot, tl.where(k == 0, m0, tl.where(k == 1, s0, tl.where(k == 2, m1, s1))))
    tl.debug_barrier()  # every thread's stores precede the releases below
    tl.atomic_add(count_ptr + r0, 1, sem="release")
    if straddles:
        tl.atomic_add(count_ptr + r0 + 1, 1, sem="release")
    if _flat_wait(count_ptr, r0, N, CHUNK, SPIN):
        big0, sum0 = _flat_stats(part_ptr, r0, N, CHUNK, SPAN)
    else:
        big0, sum0 = _flat_scan(x_ptr, r0, N, FALLBACK)
    big1, sum1 = big0, sum0
    if straddles:
        if _flat_wait(count_ptr, r0 + 1, N, CHUNK, SPIN):
            big1, sum1 = _flat_stats(part_ptr, r0 + 1, N, CHUNK, SPAN)
        else:
            big1, sum1 = _flat_scan(x_ptr, r0 + 1, N, FALLBACK)
    scale0 = tl.exp(sh0 - big0) / sum0
    scale1 = tl.exp(sh1 - big1) / sum1
    y = e * tl.where(first_part, scale0, scale1)
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=inside)
    _flat_leave(count_ptr, rows, r0, N, CHUNK)
    if straddles:
        _flat_leave(count_ptr, rows, r0 + 1, N, CHUNK)


def flat(x, chunk, warps, spin=20000):
    """The flat cooperative softmax of a contiguous 2-d x over its last dim (chunk <= row)."""
    rows, n = x.shape
    assert chunk <= n and x.is_contiguous()
    programs = triton.cdiv(rows * n, chunk)
    part = torch.empty(4 * programs, device=x.device, dtype=torch.float32)
    count = torch.zeros(2 * rows, device=x.device, dtype=torch.int32)
    span = triton.next_power_of_2(triton.cdiv(n, chunk) + 1)

    def run():
        y = torch.empty_like(x)
        _flat_coop[(programs,)](x, y, part, count, n, rows, CHUNK=chunk, SPAN=span, SPIN=spin,
                                FALLBACK=1024, num_warps=warps)
        return y
    return run


def coop(x, chunk, warps):
    """The library's cooperative softmax with this chunk and warps, prepared once per input."""
    from opselect.kernels.softmax import SOFTMAX_OP
    call = SOFTMAX_OP.prepare(x, -1)
    prepared = SOFTMAX_OP.backend("online").bind(call, {"chunk": chunk, "num_warps": warps})
    return lambda: prepared(x)


def twopass(x, block, warps):
    y = torch.empty_like(x)
    _twopass[(x.shape[0],)](x, y, x.shape[1], BLOCK=block, num_warps=warps)
    return y


def wrong(variants: dict, ref, skip=("clone",)) -> dict:
    """The variants whose answer (each run twice: the cooperative counters must come back to
    zero) is off torch's by 2e-2 or more: name -> largest error."""
    bad = {}
    for name, fn in variants.items():
        if name in skip:
            continue
        fn()
        err = (fn().float() - ref).abs().max().item()
        if not err < 2e-2:
            bad[name] = err
    return bad


def in_turns(variants: dict, rep: int, rounds: int = 3) -> dict:
    """do_bench ms of every variant, each once a round (A B C A B C ...): name -> [ms]."""
    times = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            times[name].append(triton.testing.do_bench(fn, warmup=5, rep=rep))
    return times


SHAPES = [((4096, 128256), torch.bfloat16), ((8192, 50257), torch.float16),
          ((16384, 32000), torch.bfloat16), ((1024, 151936), torch.float32),
          ((256, 151936), torch.bfloat16), ((64, 128256), torch.bfloat16),
          ((8, 128256), torch.bfloat16)]


SMOKE_SHAPES = [((5, 1000), torch.float32), ((3, 777), torch.bfloat16), ((4, 301), torch.float16)]


def smoke() -> None:
    """Tiny rows (any device, the interpreter on a CPU): every flat variant against torch, rows
    whose length is and is not a multiple of the chunk, with -inf, +inf and NaN in some rows."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for shape, dtype in SMOKE_SHAPES:
        x = (torch.randn(shape) * 3).to(dtype).to(device)
        x[0, :7] = float("-inf")
        if shape[0] > 2:
            x[1, 3] = float("inf")
            x[2, 5] = float("nan")
        ref = torch.softmax(x.float(), -1)
        for chunk in (64, 256):
            for spin in (0, 4):  # 0: every wait gives up, the rows are read again
                y = flat(x, chunk, 4, spin)()
                y = flat(x, chunk, 4, spin)()  # twice: the counters come back to zero
                ok = torch.allclose(y.float(), ref, atol=1e-2, equal_nan=True)
                print(f"flat {shape} {dtype} chunk {chunk} spin {spin}: "
                      f"{'ok' if ok else 'WRONG'}", flush=True)


def main() -> None:
    from opselect import ops
    out = os.environ.get("OUT", ".")
    copy_bw = None
    results = []
    for shape, dtype in SHAPES:
        x = torch.randn(shape, device="cuda", dtype=dtype) * 3
        ref = torch.softmax(x.float(), -1)
        wide = 2 if dtype == torch.float32 else 1
        variants = {"torch": lambda: torch.softmax(x, -1), "clone": lambda: x.clone(),
                    "ours": lambda: ops.softmax(x, -1)}
        for chunk in (4096, 8192, 16384):
            for warps in (4, 8, 16):
                if chunk // (warps * 32) > 64 // wide or chunk // (warps * 32) < 4:
                    continue
                variants[f"coop {chunk}/{warps}"] = coop(x, chunk, warps)
        for block in (2048, 4096, 8192):
            variants[f"twopass {block}"] = lambda b=block: twopass(x, b, 8)
        for chunk in (4096, 8192):
            for warps in (4, 8):
                variants[f"flat {chunk}/{warps}"] = flat(x, chunk, warps)
        bad = wrong(variants, ref)
        times = in_turns(variants, rep=20)
        traffic = 2 * x.numel() * x.element_size()
        med = {name: statistics.median(t) for name, t in times.items()}
        spread = {name: (max(t) - min(t)) / statistics.median(t) for name, t in times.items()}
        if copy_bw is None:
            copy_bw = copy_tb_s()
        best = min((n for n in med if n not in ("clone",) and n not in bad), key=med.get)
        row = {"shape": list(shape), "dtype": str(dtype), "ms": med, "spread": spread,
               "bad": bad, "best": best,
               "pct_copy": {n: 100 * traffic / (t * 1e-3) / (copy_bw * 1e12) for n, t in med.items()}}
        results.append(row)
        print(f"{shape} {dtype}: best {best} {med[best]*1e3:.1f}us "
              f"({row['pct_copy'][best]:.0f}%), torch {med['torch']*1e3:.1f} "
              f"({row['pct_copy']['torch']:.0f}%), ours {med['ours']*1e3:.1f} "
              f"({row['pct_copy']['ours']:.0f}%), clone {row['pct_copy']['clone']:.0f}%, bad {bad}",
              flush=True)
        for n in sorted(med, key=med.get)[:8]:
            print(f"    {n:20s} {med[n]*1e3:8.1f} us {row['pct_copy'][n]:5.0f}%  "
                  f"spread {100*spread[n]:.0f}%")
        torch.cuda.empty_cache()
    ceiling = permute_ceiling()
    with open(os.path.join(out, "probe_softmax_vocab.json"), "w") as f:
        json.dump({"copy_tb_s": copy_bw, "results": results, "permute": ceiling}, f, indent=1)


SHIFT_SHAPES = [((8192, 50257), torch.float16), ((4096, 50257), torch.bfloat16),
                ((1205, 55691), torch.bfloat16), ((64, 50257), torch.bfloat16),
                ((30582, 1395), torch.float32), ((4096, 1001), torch.float16),
                ((16384, 4099), torch.bfloat16), ((65536, 37), torch.float16)]


def bound(backend: str, x, config, vector: bool):
    """The library's prepared call of one backend and config, its rows read through shifted
    16-byte vectors (vector) or element by element (the kernels before the shift)."""
    from opselect.heuristics import softmax as cost
    from opselect.kernels import softmax as sm
    from opselect.kernels.softmax import common, online
    call = sm.SOFTMAX_OP.prepare(x, -1)
    rule = cost.vector_shift
    b = sm.SOFTMAX_OP.backend(backend)
    try:
        if not vector:
            common.vector_shift = online.cost.vector_shift = lambda call: 0
        b.__dict__.pop("_plans", None)  # (plans are memoized per call and config)
        prepared = b.bind(call, config)
    finally:
        common.vector_shift = online.cost.vector_shift = rule
        b.__dict__.pop("_plans", None)
    return lambda: prepared(x)


def copy_tb_s() -> float:
    """The copy bandwidth (read + write), TB/s, of a 256 MB clone."""
    src = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")
    return 2 * src.numel() / triton.testing.do_bench(lambda: src.clone(), rep=50) / 1e9


def shift_ab() -> None:
    """Rows off the 16-byte grid: each backend's configs with the shifted vector access against
    the same kernels element by element, torch and auto cold, in turns."""
    from opselect import ops
    from opselect.kernels import softmax as sm
    out = os.environ.get("OUT", ".")
    copy_bw = copy_tb_s()
    rows = []
    for shape, dtype in SHIFT_SHAPES:
        x = torch.randn(shape, device="cuda", dtype=dtype) * 3
        ref = torch.softmax(x.float(), -1)
        call = sm.SOFTMAX_OP.prepare(x, -1)
        variants = {"torch": lambda: torch.softmax(x, -1), "auto": lambda: ops.softmax(x, -1)}
        for name in ("fused", "multirow", "online"):
            b = sm.SOFTMAX_OP.backend(name)
            if b.supports(call) is not None:
                continue
            for i, cfg in enumerate(b.configs(call)[:3]):
                for vector in (True, False):
                    variants[f"{name}#{i} {'vec' if vector else 'elem'}"] = bound(
                        name, x, cfg, vector)
        bad = wrong(variants, ref, skip=())
        times = in_turns(variants, rep=25)
        med = {n: statistics.median(t) * 1e3 for n, t in times.items()}
        traffic = x.numel() * x.element_size() * 2
        pct = {n: 100 * traffic / (t * 1e-6) / (copy_bw * 1e12) for n, t in med.items()}
        best_vec = min((n for n in med if n.endswith("vec") and n not in bad), key=med.get,
                       default=None)
        best_elem = min((n for n in med if n.endswith("elem") and n not in bad), key=med.get,
                        default=None)
        rows.append({"shape": list(shape), "dtype": str(dtype), "us": med, "pct_copy": pct,
                     "bad": bad, "spread": {n: (max(t) - min(t)) / statistics.median(t)
                                            for n, t in times.items()}})
        print(f"{shape} {str(dtype)[6:]}: torch {med['torch']:.1f} ({pct['torch']:.0f}%), auto "
              f"{med['auto']:.1f} ({pct['auto']:.0f}%), best vec {best_vec} {med.get(best_vec, 0):.1f}"
              f" ({pct.get(best_vec, 0):.0f}%), best elem {best_elem} {med.get(best_elem, 0):.1f}"
              f" ({pct.get(best_elem, 0):.0f}%), bad {bad}", flush=True)
        for n in sorted(med, key=med.get):
            print(f"    {n:22s} {med[n]:9.1f} us {pct[n]:5.0f}%")
        torch.cuda.empty_cache()
    with open(os.path.join(out, "probe_softmax_shift.json"), "w") as f:
        json.dump({"copy_tb_s": copy_bw, "results": rows}, f, indent=1)


def permute_ceiling() -> list:
    """The copy of the same bytes as the issue's permute cases (a ceiling at that size)."""
    from opselect import ops
    cases = [((1500, 8, 16, 64), torch.float16, (1, 2, 0, 3)),
             ((64, 197, 12, 64), torch.float16, (0, 2, 1, 3)),
             ((2, 577, 16, 64), torch.bfloat16, (0, 2, 1, 3)),
             ((32, 224, 224, 3), torch.uint8, (0, 3, 1, 2)),
             ((3, 1080, 1920, 4), torch.uint8, (0, 3, 1, 2))]
    rows = []
    for shape, dtype, dims in cases:
        x = (torch.randn(shape, device="cuda") * 50).to(dtype)
        fns = {"clone": lambda: x.clone(), "torch": lambda: x.permute(dims).contiguous(),
               "ours": lambda: ops.permute(x, dims)}
        t = in_turns(fns, rep=20)
        med = {n: statistics.median(v) * 1e3 for n, v in t.items()}
        rows.append({"shape": shape, "dtype": str(dtype), "us": med})
        print(f"permute {shape} {dtype}: " + ", ".join(f"{n} {v:.1f} us" for n, v in med.items()),
              flush=True)
    return rows


if __name__ == "__main__":
    if "--smoke" in sys.argv[1:]:
        smoke()
    elif sys.argv[1:] == ["--shift"]:
        shift_ab()
    elif sys.argv[1:] == ["--permute"]:
        with open(os.path.join(os.environ.get("OUT", "."), "probe_permute_ceiling.json"), "w") as f:
            json.dump(permute_ceiling(), f, indent=1, default=str)
    else:
        sys.exit(main())
