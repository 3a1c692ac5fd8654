"""Probe (issue 35): softmax over vocabulary rows, kernel variants timed in turns on one GPU.

Not a benchmark of the library: it compares candidate kernels written here before one of them
becomes a backend. Variants:
- coop: the library's cooperative kernel (opselect/kernels/softmax/online.py) at each chunk and
  warps: a row's chunks in programs that exchange (max, sum) through global memory, one read,
  one write and one exp an element. (The probe first compared it written here with chunks handed
  out by ticket against launch order: fits/softmax.md, "online: cooperative chunk order".)
- twopass: one program per row, a blockwise online (max, sum), then a normalising pass in reverse
  (the row's tail still in L2).

    python benchmarks/probe_softmax_vocab.py          # on the GPU: a table, JSON under $OUT
"""

from __future__ import annotations

import json
import os
import statistics
import sys

import torch
import triton
import triton.language as tl


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


SHAPES = [((4096, 128256), torch.bfloat16), ((8192, 50257), torch.float16),
          ((16384, 32000), torch.bfloat16), ((1024, 151936), torch.float32),
          ((256, 151936), torch.bfloat16), ((64, 128256), torch.bfloat16),
          ((8, 128256), torch.bfloat16)]


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
        bad = {}
        for name, fn in variants.items():
            if name == "clone":
                continue
            for _ in range(2):  # twice: the counters must come back to zero
                y = fn()
            err = (y.float() - ref).abs().max().item()
            if not err < 2e-2:
                bad[name] = err
        times = {name: [] for name in variants}
        for _ in range(3):
            for name, fn in variants.items():
                times[name].append(triton.testing.do_bench(fn, warmup=5, rep=20))
        traffic = 2 * x.numel() * x.element_size()
        med = {name: statistics.median(t) for name, t in times.items()}
        spread = {name: (max(t) - min(t)) / statistics.median(t) for name, t in times.items()}
        if copy_bw is None:
            big = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")
            copy_bw = 2 * big.numel() / triton.testing.do_bench(lambda: big.clone(), rep=50) / 1e9
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
        t = {n: [] for n in fns}
        for _ in range(3):
            for n, fn in fns.items():
                t[n].append(triton.testing.do_bench(fn, warmup=5, rep=20))
        med = {n: statistics.median(v) * 1e3 for n, v in t.items()}
        rows.append({"shape": shape, "dtype": str(dtype), "us": med})
        print(f"permute {shape} {dtype}: " + ", ".join(f"{n} {v:.1f} us" for n, v in med.items()),
              flush=True)
    return rows


if __name__ == "__main__":
    if sys.argv[1:] == ["--permute"]:
        with open(os.path.join(os.environ.get("OUT", "."), "probe_permute_ceiling.json"), "w") as f:
            json.dump(permute_ceiling(), f, indent=1, default=str)
    else:
        sys.exit(main())
