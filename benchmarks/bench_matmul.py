"""matmul and linear benchmark (issue 36): torch (cuBLAS), every backend, auto (cold and warm)
and an autotuned grouped-tile Triton kernel as the peer.

    python benchmarks/bench_matmul.py             # the full suite on the GPU, results committed
    python benchmarks/bench_matmul.py --smoke     # tiny cases, any device (CI checks the script)

Cases, as a language model and attention run them:
  decode    F.linear of 1, 4 and 16 rows with Llama's weights (out x in, row-major: B = weight.T):
            4096 x 4096 (attention), 11008 x 4096 (Llama-2-7B's MLP), 4096 x 14336 (Llama-3-8B's
            MLP down) and 128256 x 4096 (Llama-3's head), bfloat16. They read the weight once:
            memory-bound
  prefill   the same weights for 512 to 8192 rows
  square    torch.matmul of 1024 to 8192 in bfloat16 and float16; 4096 in float32 with tf32
            on and with it off (torch.backends.cuda.matmul.allow_tf32, set by the case)
  odd       1000 x 3000 @ 3000 x 777 (no size a multiple of 16: masked edges)
  batched   32 x (512 x 64 @ 64 x 512) with B transposed (attention's scores), 32 x (512 x 512
            @ 512 x 64) (their product with V), 8 x 2048^3

The table gives each provider's median ms (the harness: do_bench, the best of --repeat medians),
then TFLOP/s, percent of the dtype's dense peak (PEAKS, by GPU name), and for products of at most
16 rows the percent of copy bandwidth at which the weight (B) is read: its bytes over the time,
against the measured copy. The chart draws each provider's percent of the case's roofline (its
FLOPs at the peak or its bytes at the copy bandwidth, whichever takes longer).

The peer, `triton_autotune`, is a grouped-tile kernel of this module with @triton.autotune over a
handful of tile shapes, keyed on M, N, K, B's k stride and the precision: what one gets from
Triton without opselect.

Targets (the issue's): auto never more than 3% slower than cuBLAS on any case; decode products at
80% or more of the copy bandwidth reading B, and at least 1.1x cuBLAS as their geometric mean.
The last lines printed (and of matmul.md) are those three, measured.

GPU time: about 4-5 minutes on an H200 with an empty Triton cache (most of it compiling and
tuning the auto-warm column: every config of every backend, per case); see docs/BENCHMARKS.md.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from harness import Case, Suite, at_least  # noqa: E402

from opselect.dispatch.device import INTERPRETED  # noqa: E402
# Imported by name: this registers the "matmul" and "linear" ops, which opselect.ops may not
# import yet (the harness then calls the Op itself).
from opselect.kernels.matmul import LINEAR_OP, MATMUL_OP  # noqa: E402

OPS = {"matmul": MATMUL_OP, "linear": LINEAR_OP}

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32
SHORT = {BF16: "bf16", F16: "fp16", F32: "fp32"}

# Llama's weights as F.linear holds them, (out_features, in_features) = (N, K)
WEIGHTS = [(4096, 4096), (11008, 4096), (4096, 14336), (128256, 4096)]
# (rows, weight, dtype, bias)
LINEAR = ([(m, w, BF16, False) for m in (1, 4, 16) for w in WEIGHTS] +
          [(512, (4096, 4096), BF16, False), (2048, (11008, 4096), BF16, False),
           (4096, (4096, 14336), BF16, False), (8192, (4096, 4096), BF16, False),
           (2048, (128256, 4096), BF16, False)])
# (input's shape, other's shape, dtype, B transposed, tf32)
MATMUL = ([((n, n), (n, n), BF16, False, False) for n in (1024, 2048, 4096, 8192)] +
          [((n, n), (n, n), F16, False, False) for n in (2048, 8192)] +
          [((4096, 4096), (4096, 4096), F32, False, True),
           ((4096, 4096), (4096, 4096), F32, False, False),
           ((1000, 3000), (3000, 777), F16, False, False),
           ((32, 512, 64), (32, 64, 512), BF16, True, False),
           ((32, 512, 512), (32, 512, 64), BF16, False, False),
           ((8, 2048, 2048), (8, 2048, 2048), BF16, False, False)])
SMOKE_LINEAR = [(1, (96, 64), BF16, False), (2, (32, 288), BF16, False),
                (5, (40, 70), F16, True)]
SMOKE_MATMUL = [((48, 40), (40, 24), F32, False, False), ((32, 48), (48, 40), F32, False, True),
                ((2, 24, 32), (2, 32, 16), BF16, True, False)]

#: Dense peaks in TFLOP/s without sparsity, (16-bit tensor cores, tf32 tensor cores, float32
#: without them), from the vendor's data sheets; the first pattern found in the GPU's name
#: answers. A GPU not listed (and the CPU's interpreter) is measured against an H200's.
PEAKS = [(r"H100.*PCIe", (756.0, 378.0, 51.0)),
         (r"H100.*NVL", (835.0, 418.0, 60.0)),
         (r"H100|H200|GH200", (989.0, 494.0, 67.0)),
         (r"A100", (312.0, 156.0, 19.5))]
DEFAULT_PEAKS = (989.0, 494.0, 67.0)
UNKNOWN_PEAKS = ", an H200's: the GPU is not in PEAKS"

#: A decode product: at most this many rows (its time is the weight's read)
DECODE_ROWS = 16
TARGET_WORST_VS_TORCH = 0.97
TARGET_DECODE_PCT_BW = 80.0
TARGET_DECODE_GEOMEAN = 1.1
AUTO = "auto-warm"
PEER = "triton_autotune"


def peaks_of(device_name: str) -> tuple[tuple[float, float, float], bool]:
    """(16-bit, tf32, float32) peaks for this GPU, and whether its name was in PEAKS."""
    for pattern, peaks in PEAKS:
        if re.search(pattern, device_name, re.I):
            return peaks, True
    return DEFAULT_PEAKS, False


def _device_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu (interpreter)"


def _peak(dtype: torch.dtype, tf32: bool) -> float:
    peaks, _ = peaks_of(_device_name())
    return peaks[0] if dtype != F32 else peaks[1] if tf32 else peaks[2]


def _precision_name(dtype: torch.dtype, tf32: bool) -> str:
    return SHORT[dtype] + ("" if dtype != F32 else " tf32" if tf32 else " ieee")


# ---------------------------------------------------------------------------------------------
# The cases
# ---------------------------------------------------------------------------------------------
def _case(op_name: str, shapes: list, options: dict, dtype: torch.dtype, tf32: bool, name: str,
          batch: int, m: int, n: int, k: int, bias: bool) -> Case:
    op = OPS[op_name]
    esize = dtype.itemsize
    weight = k * n * esize * (batch if len(shapes[1]) > 2 else 1)

    def make(device: torch.device):
        # Every case sets the switch (the float32 ones read it): a tf32 case's setting must not
        # carry over into the cases after it.
        torch.backends.cuda.matmul.allow_tf32 = tf32
        return op.sample([list(s) for s in shapes], dtype, dict(options), device)

    nbytes = batch * m * k * esize + weight + batch * m * n * esize + (n * esize if bias else 0)
    tags = {"form": op_name, "kind": _kind(batch, m, n, k, op_name), "batch": batch, "m": m,
            "n": n, "k": k, "dtype": str(dtype)[6:], "tf32": tf32, "bias": bias,
            "flops": 2 * batch * m * n * k, "weight_bytes": weight,
            "peak_TFLOPs": _peak(dtype, tf32)}
    return Case(name, make, nbytes, tags, op=op_name)


def _kind(batch: int, m: int, n: int, k: int, form: str) -> str:
    if m <= DECODE_ROWS:
        return "decode"
    if form == "linear":
        return "prefill"
    if batch > 1:
        return "batched"
    return "square" if m == n == k else "odd"


def linear_case(m: int, weight: tuple[int, int], dtype: torch.dtype, bias: bool) -> Case:
    n, k = weight
    name = f"linear M={m} W={n}x{k}{' +bias' if bias else ''} {SHORT[dtype]}"
    return _case("linear", [[m, k], [n, k]], {"bias": bias}, dtype, False, name, 1, m, n, k,
                 bias)


def matmul_case(a_shape: tuple, b_shape: tuple, dtype: torch.dtype, transpose_b: bool,
                tf32: bool) -> Case:
    batch = a_shape[0] if len(a_shape) > 2 else 1
    (m, k), n = a_shape[-2:], b_shape[-1]
    if batch == 1 and m == n == k:
        dims = f"{m}^3"
    else:
        dims = f"{'x'.join(map(str, a_shape))} @ {'x'.join(map(str, b_shape))}"
    name = f"matmul {dims}{' B^T' if transpose_b else ''} {_precision_name(dtype, tf32)}"
    options = {"transpose_b": True} if transpose_b else {}
    return _case("matmul", [a_shape, b_shape], options, dtype, tf32, name, batch, m, n, k, False)


def torch_product(*args):
    """torch's op for either form: (input, weight, bias) is F.linear's call (the linear cases
    pass their bias, None included), (input, other) torch.matmul's."""
    if len(args) == 3:
        return torch.nn.functional.linear(*args)
    return torch.matmul(*args)


#: Tolerance relative to |expected| + the rms of the expected output: sums of thousands of
#: products differ between two correct kernels by their order (and cuBLAS may reduce 16-bit
#: partials in 16 bits), and near-zero outputs differ by the scale of the sum, not their own.
TOL = {BF16: 2.0 ** -6, F16: 4e-3}
TOL_TF32, TOL_F32 = 5e-3, 1e-4


def check(got, ref, inputs) -> str | None:
    if got.shape != ref.shape or got.dtype != ref.dtype:
        return (f"shape/dtype {tuple(got.shape)} {got.dtype}, expected {tuple(ref.shape)} "
                f"{ref.dtype}")
    if ref.dtype == F32:
        tol = TOL_TF32 if torch.backends.cuda.matmul.allow_tf32 else TOL_F32
    else:
        tol = TOL[ref.dtype]
    g, r = got.float(), ref.float()
    rms = float(r.pow(2).mean().sqrt()) if r.numel() else 0.0
    err = (g - r).abs()
    bad = int(((err > tol * (r.abs() + rms)) | (g.isnan() != r.isnan())).sum())
    if bad:
        return (f"{bad} of {r.numel()} beyond tolerance {tol:g} of |expected| + rms "
                f"(max error {float(err.nan_to_num(0).max()):.3g}, rms {rms:.3g})")
    return None


# ---------------------------------------------------------------------------------------------
# The peer: a grouped-tile kernel that @triton.autotune tunes
# ---------------------------------------------------------------------------------------------
#: Shared memory a config may fill (an H100's is 227 KB a block).
PEER_SMEM = 220 * 1024


def _peer_configs() -> list:
    """(block_m, block_n, block_k, warps, stages): four tiles for products of many rows, three
    16-row ones for decode products (tl.dot's smallest m)."""
    shapes = [(128, 256, 64, 8, 3), (128, 128, 64, 8, 4), (64, 128, 64, 4, 4), (64, 64, 64, 4, 4),
              (16, 64, 128, 4, 4), (16, 128, 128, 4, 4), (16, 32, 256, 4, 3)]
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8},
                          num_warps=w, num_stages=s) for bm, bn, bk, w, s in shapes]


def _peer_prune(configs, named_args, **kwargs):
    """The configs worth timing for this call: 16-row tiles for decode products and only there;
    float32 tiles that would not fit in shared memory take half the k per step."""
    decode = named_args["M"] <= DECODE_ROWS
    esize = named_args["a"].element_size()
    kept = []
    for cfg in configs:
        meta = dict(cfg.kwargs)
        if (meta["BLOCK_M"] == 16) != decode:
            continue
        while cfg.num_stages * (meta["BLOCK_M"] + meta["BLOCK_N"]) * meta["BLOCK_K"] * esize \
                > PEER_SMEM:
            meta["BLOCK_K"] //= 2
        kept.append(triton.Config(meta, num_warps=cfg.num_warps, num_stages=cfg.num_stages))
    return kept


def _peer_bench(fn, quantiles):
    """The autotuner's timing of one config: do_bench, shorter than its default (25 + 100 ms a
    config) to keep the suite's time; the wall clock of one run on the CPU's interpreter."""
    if torch.cuda.is_available():
        return triton.testing.do_bench(fn, warmup=10, rep=40, quantiles=quantiles)
    start = time.perf_counter()
    fn()
    return [(time.perf_counter() - start) * 1e3] * len(quantiles)


@triton.autotune(configs=_peer_configs(), key=["M", "N", "K", "s_bk", "PRECISION"],
                 prune_configs_by={"early_config_prune": _peer_prune}, do_bench=_peer_bench)
@triton.jit
def _peer_kernel(a, b, c, bias, M, N, K, s_ab, s_am, s_ak, s_bb, s_bk, s_bn, s_bias,
                 HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 GROUP_M: tl.constexpr):
    # Program p computes one output tile. Tiles are numbered down a column within groups of
    # GROUP_M row blocks, so the programs resident together read the same few column blocks of
    # B and GROUP_M row blocks of A, which then come from L2.
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    p = tl.program_id(0)
    per_group = GROUP_M * tiles_n
    first = (p // per_group) * GROUP_M
    rows = tl.minimum(tiles_m - first, GROUP_M)
    tile_m = first + (p % per_group) % rows
    tile_n = (p % per_group) // rows
    entry = tl.program_id(1).to(tl.int64)  # the batch entry (64 bits: batch * M * N may be big)
    a += entry * s_ab
    b += entry * s_bb
    c += entry * M * N
    om = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    on = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = tl.arange(0, BLOCK_K)
    m_in = om[:, None] < M
    n_in = on[None, :] < N
    pa = a + om[:, None] * s_am + ok[None, :] * s_ak
    pb = b + ok[:, None] * s_bk + on[None, :] * s_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_in = ok < K - k0  # the last step of a k that is no multiple of BLOCK_K
        x = tl.load(pa, mask=m_in & k_in[None, :], other=0.0)
        y = tl.load(pb, mask=k_in[:, None] & n_in, other=0.0)
        if UPCAST:  # the interpreter's dot of 16-bit tiles sums wrongly; float32 tiles do not
            x = x.to(tl.float32)
            y = y.to(tl.float32)
        acc = tl.dot(x, y, acc, input_precision=PRECISION)
        pa += BLOCK_K * s_ak
        pb += BLOCK_K * s_bk
    if HAS_BIAS:
        acc += tl.load(bias + on * s_bias, mask=on < N, other=0.0).to(tl.float32)[None, :]
    tl.store(c + om[:, None] * N + on[None, :], acc.to(c.dtype.element_ty), mask=m_in & n_in)


def triton_autotune(*args):
    """The peer on either form: (input, weight, bias) as F.linear (B = weight.T, read through
    its strides), (input, other) as torch.matmul of 2-d operands or equal batches of 3-d ones."""
    bias = None
    if len(args) == 3:
        x, weight, bias = args
        a, b = x.reshape(-1, x.shape[-1]), weight.t()
        out_shape = (*x.shape[:-1], weight.shape[0])
    else:
        a, b = args
        out_shape = None
    if a.dim() == 2 and b.dim() == 2:
        batch, sa, sb = 1, (0, *a.stride()), (0, *b.stride())
    elif a.dim() == 3 and b.dim() == 3 and a.shape[0] == b.shape[0]:
        batch, sa, sb = a.shape[0], a.stride(), b.stride()
    else:
        raise NotImplementedError(f"the peer takes 2-d products or equal batches, not "
                                  f"{tuple(a.shape)} @ {tuple(b.shape)}")
    (m, k), n = a.shape[-2:], b.shape[-1]
    c = torch.empty((batch, m, n), dtype=a.dtype, device=a.device)
    tf32 = a.dtype == F32 and torch.backends.cuda.matmul.allow_tf32
    bias_row = None if bias is None else bias.reshape(-1)

    def grid(meta):
        return (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]), batch)

    _peer_kernel[grid](a, b, c, c if bias_row is None else bias_row, m, n, k, *sa, *sb,
                       0 if bias_row is None or bias_row.numel() == 1 else bias_row.stride(0),
                       HAS_BIAS=bias is not None, PRECISION="tf32" if tf32 else "ieee",
                       UPCAST=INTERPRETED)
    if out_shape is not None:
        return c.view(out_shape)
    return c.view(a.shape[:-1] + (n,)) if batch > 1 else c.view(m, n)


# ---------------------------------------------------------------------------------------------
# Derived numbers, the table's extra columns, the report and the targets
# ---------------------------------------------------------------------------------------------
def derive(row: dict, bw: float) -> None:
    """TFLOP/s, percent of the dtype's peak and of the roofline per provider; for decode
    products the percent of copy bandwidth at which the weight is read."""
    done = {k: v for k, v in row["ms"].items() if v is not None and k != "copy"}
    peak = row["peak_TFLOPs"]
    row["TFLOPs"] = {k: row["flops"] / (v / 1e3) / 1e12 for k, v in done.items()}
    row["pct_peak"] = {k: 100 * t / peak for k, t in row["TFLOPs"].items()}
    floor_s = max(row["flops"] / (peak * 1e12), row["bytes"] / bw)
    row["roofline_ms"] = floor_s * 1e3
    row["bound"] = "memory" if row["bytes"] / bw > row["flops"] / (peak * 1e12) else "compute"
    row["pct_roofline"] = {k: 100 * floor_s / (v / 1e3) for k, v in done.items()}
    if row["m"] <= DECODE_ROWS:
        row["pct_weight_bw"] = {k: 100 * row["weight_bytes"] / (v / 1e3) / bw
                                for k, v in done.items()}


def _cell(value: float | None, fmt: str = "{:.0f}") -> str:
    return "-" if value is None else fmt.format(value)


def _tflops(value: float | None) -> str:
    """TFLOP/s to three digits (decode products run at a few, large ones at hundreds)."""
    return "-" if value is None else f"{value:.0f}" if value >= 100 else f"{value:.3g}"


COLUMNS = [
    ("torch TFLOP/s", lambda r: _tflops(r.get("TFLOPs", {}).get("torch"))),
    ("auto TFLOP/s", lambda r: _tflops(r.get("TFLOPs", {}).get(AUTO))),
    ("auto %peak", lambda r: _cell(r.get("pct_peak", {}).get(AUTO), "{:.1f}")),
    ("auto %B bw", lambda r: _cell(r.get("pct_weight_bw", {}).get(AUTO), "{:.1f}")),
]


def _providers(rows: list[dict]) -> list[str]:
    """The providers of any row in a fixed order: torch, the backends, auto, the peer (the
    harness's table has them in the order the first rows gave)."""
    seen = {k for r in rows for k in r["ms"] if k != "copy" and "#" not in k}
    order = ["torch", *(b.name for b in MATMUL_OP.backends[1:]), "auto-cold", AUTO, PEER]
    return [n for n in order if n in seen] + sorted(seen - set(order))


def report(result: dict) -> str:
    """Per provider: TFLOP/s with percent of peak, and the decode products' percent of copy
    bandwidth reading B; then the issue's targets, last."""
    rows = result["rows"]
    names = _providers(rows)
    peaks, known = peaks_of(str(result.get("device", "")))
    out = ["## Throughput", "",
           f"TFLOP/s (percent of the dense peak: 16-bit {peaks[0]:g}, tf32 {peaks[1]:g}, "
           f"float32 {peaks[2]:g} TFLOP/s{'' if known else UNKNOWN_PEAKS}"
           "). `bound`: what the roofline says limits the case.", "",
           "| case | bound | " + " | ".join(names) + " |", "|---" * (len(names) + 2) + "|"]
    for r in rows:
        cells = [_tflops(r.get("TFLOPs", {}).get(n)) +
                 _cell(r.get("pct_peak", {}).get(n), " ({:.0f}%)") if n in r.get("TFLOPs", {})
                 else "-" for n in names]
        out.append(f"| {r['case']} | {r.get('bound', '-')} | " + " | ".join(cells) + " |")
    decode = [r for r in rows if "pct_weight_bw" in r]
    if decode:
        out += ["", f"Decode products (at most {DECODE_ROWS} rows): percent of the copy "
                "bandwidth at which each provider reads B (its bytes over the time).", "",
                "| case | B MB | " + " | ".join(names) + " |", "|---" * (len(names) + 2) + "|"]
        for r in decode:
            cells = [_cell(r["pct_weight_bw"].get(n), "{:.1f}") for n in names]
            out.append(f"| {r['case']} | {r['weight_bytes'] / 1e6:.1f} | " + " | ".join(cells)
                       + " |")
    s = result["summary"]
    met = s.get("targets_met", {})

    def verdict(key: str) -> str:
        return {True: "yes", False: "NO", None: "not measured"}[met.get(key)]

    worst = s.get("target_auto_never_3pct_slower_than_torch_worst_ratio")
    low = s.get("target_decode_80pct_copy_bw_min")
    geo = s.get("target_decode_1.1x_torch_geomean")
    out += ["", "## Targets (issue 36; auto = auto-warm, cuBLAS = torch)", "",
            "| target | measured | met |", "|---|---|---|",
            f"| auto never more than 3% slower than cuBLAS | worst {_cell(worst, '{:.3f}')}x "
            f"({s.get('worst_case_vs_torch') or '-'}) | {verdict('never_3pct_slower_than_torch')} |",
            f"| decode at >= 80% of copy bandwidth reading B | min {_cell(low, '{:.1f}')}% "
            f"({s.get('worst_decode_case') or '-'}) | {verdict('decode_80pct_copy_bw')} |",
            f"| decode geomean speed-up over cuBLAS >= 1.1x | {_cell(geo, '{:.3f}')}x | "
            f"{verdict('decode_1.1x_torch_geomean')} |"]
    return "\n".join(out) + "\n"


def targets(rows: list[dict], summary: dict) -> dict:
    """The issue's targets, each with its measured value, and the cases that miss them."""
    def auto(r):
        return r["speedup_vs_torch"].get(AUTO)

    ratios = {r["case"]: auto(r) for r in rows if auto(r) is not None}
    worst_case = min(ratios, key=ratios.get) if ratios else None
    decode = [r for r in rows if r["m"] <= DECODE_ROWS]
    read = {r["case"]: r.get("pct_weight_bw", {}).get(AUTO) for r in decode}
    measured = {k: v for k, v in read.items() if v is not None}
    low_case = min(measured, key=measured.get) if measured else None
    geo = harness._geomean([auto(r) for r in decode])
    peer = harness._geomean([r["ms"][PEER] / r["ms"][AUTO] for r in rows
                             if r["ms"].get(PEER) and r["ms"].get(AUTO)])
    out = {
        "target_auto_never_3pct_slower_than_torch_worst_ratio": ratios.get(worst_case),
        "worst_case_vs_torch": worst_case,
        "cases_more_than_3pct_slower_than_torch": {
            k: v for k, v in ratios.items() if v < TARGET_WORST_VS_TORCH},
        "target_decode_80pct_copy_bw_min": measured.get(low_case),
        "worst_decode_case": low_case,
        "decode_below_80pct_copy_bw": {
            k: v for k, v in read.items() if v is None or v < TARGET_DECODE_PCT_BW},
        "target_decode_1.1x_torch_geomean": geo,
        f"auto-warm_geomean_speedup_vs_{PEER}": peer,
    }
    out["targets_met"] = {
        "never_3pct_slower_than_torch": at_least(out[
            "target_auto_never_3pct_slower_than_torch_worst_ratio"], TARGET_WORST_VS_TORCH),
        "decode_80pct_copy_bw": None if not decode else (
            bool(measured) and not out["decode_below_80pct_copy_bw"]),
        "decode_1.1x_torch_geomean": at_least(geo, TARGET_DECODE_GEOMEAN),
    }
    return out


CHART = {"metric": "pct_roofline",
         "label": "% of the roofline (FLOPs at the dense peak or bytes at the copy bandwidth)",
         "line": "roofline (100%)", "targets": [TARGET_DECODE_PCT_BW],
         "target_label": "decode target {t:g}%"}


def suite(smoke: bool) -> Suite:
    cases = ([linear_case(*c) for c in (SMOKE_LINEAR if smoke else LINEAR)] +
             [matmul_case(*c) for c in (SMOKE_MATMUL if smoke else MATMUL)])
    return Suite("matmul", cases, torch_product, check, peers={PEER: triton_autotune},
                 targets=targets, derive=derive, columns=COLUMNS, report=report, chart=CHART)


#: The full suite starts no case after this many seconds unless --deadline-s says otherwise
#: (0: no limit): it is meant to end within about 6 minutes of GPU time (a GPU session's command
#: may get 10), and a run on a cold machine (Triton's cache empty, a slow host compiling) saves
#: what it measured and names the cases left, to run with --filter ... --merge.
DEADLINE_S = 300.0


def main(argv: list[str]) -> dict:
    args = harness.parse_args(argv)
    if not args.smoke and not any(a.startswith("--deadline-s") for a in argv):
        argv = [*argv, "--deadline-s", str(DEADLINE_S)]
    tf32 = torch.backends.cuda.matmul.allow_tf32
    try:
        return harness.run(suite(args.smoke), argv)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32  # (the cases set it)


if __name__ == "__main__":
    main(sys.argv[1:])
