"""permute benchmark: torch, every backend, auto (cold and warm), flag_gems.

    python benchmarks/bench_permute.py             # the full suite on the GPU, results committed
    python benchmarks/bench_permute.py --smoke     # tiny cases, any device (CI checks the script)

Transposes of 1- to 16-byte elements (2-d, batched, NCHW <-> NHWC, HWC -> CHW, 5-d reversed),
permutations that keep the last dim (attention heads, long and short runs), an already-permuted
input. Traffic is read + write of the whole tensor; `%bw` compares it with the device's copy.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Case, Suite, at_least, at_most, main_guard  # noqa: E402

from opselect.dispatch import get_op  # noqa: E402

f16, bf16, f32, f64 = torch.float16, torch.bfloat16, torch.float32, torch.float64
FULL = [
    # (shape, dtype, dims, sample options)
    ((32, 2048, 32, 128), f16, (0, 2, 1, 3), {}),             # split attention heads
    ((32, 32, 2048, 128), f16, (0, 2, 1, 3), {}),             # merge them back
    ((8192, 8192), f32, (1, 0), {}),
    ((8192, 8192), f16, (1, 0), {}),
    ((8192, 8192), torch.uint8, (1, 0), {}),
    ((4096, 4096), f64, (1, 0), {}),
    ((4096, 4096), torch.complex128, (1, 0), {}),             # 16-byte elements
    ((8192, 4096), torch.bool, (1, 0), {}),
    ((64, 512, 512), f32, (0, 2, 1), {}),                     # batched transpose
    ((64, 128, 4096), bf16, (0, 2, 1), {}),
    ((16, 64, 64, 64, 16), f32, (4, 3, 2, 1, 0), {}),         # 5-d reversed
    ((256, 256, 256), f32, (2, 1, 0), {}),
    ((8, 64, 64, 64, 64), f16, (0, 2, 4, 3, 1), {}),
    ((128, 3, 224, 224), f32, (0, 2, 3, 1), {}),              # NCHW -> NHWC
    ((128, 224, 224, 3), f32, (0, 3, 1, 2), {}),              # NHWC -> NCHW
    ((64, 3, 512, 512), torch.uint8, (0, 2, 3, 1), {}),
    ((4096, 4096, 3), torch.uint8, (2, 0, 1), {}),            # HWC -> CHW
    ((4096, 4096, 2), f32, (1, 0, 2), {}),                    # 8-byte pairs: a plain transpose
    ((2048, 2048, 4), f32, (1, 0, 2), {}),                    # 16-byte runs
    ((1024, 1024, 64), f32, (1, 0, 2), {}),                   # 256-byte runs
    ((64, 1024, 1024), f16, (1, 0, 2), {}),                   # 2 KB runs
    ((64, 512, 512), f32, (0, 2, 1), {"layout": "permuted", "layout_dims": [1, 0, 2]}),
    # Attention heads with odd sequence lengths (issue 35): Whisper's 1500, ViT's 197 and 577
    ((1500, 8, 16, 64), f16, (1, 2, 0, 3), {}),
    ((64, 197, 12, 64), f16, (0, 2, 1, 3), {}),              # split heads
    ((64, 12, 197, 64), bf16, (0, 2, 1, 3), {}),             # merge them back
    ((2, 577, 16, 64), bf16, (0, 2, 1, 3), {}),
    ((32, 577, 16, 64), f32, (0, 2, 1, 3), {}),
    # 1-byte images (issue 35)
    ((32, 224, 224, 3), torch.uint8, (0, 3, 1, 2), {}),       # NHWC -> NCHW
    ((32, 3, 224, 224), torch.uint8, (0, 2, 3, 1), {}),       # NCHW -> NHWC
    ((3, 1080, 1920, 4), torch.uint8, (0, 3, 1, 2), {}),
]
SMOKE = [
    ((4, 8, 16), f32, (2, 0, 1), {}),
    ((2, 3, 4, 32), f16, (0, 2, 1, 3), {}),
    ((40, 3), torch.uint8, (1, 0), {}),
    ((6, 5, 4), f32, (1, 0, 2), {"layout": "permuted", "layout_dims": [2, 0, 1]}),
]


def _case(shape, dtype, dims, options) -> Case:
    op = get_op("permute")

    def make(device: torch.device):
        (x, d), _ = op.sample([list(shape)], dtype, {"dims": list(dims), **options}, device)
        return (x, tuple(d)), {}

    n = math.prod(shape)
    name = f"{'x'.join(map(str, shape))} {str(dtype)[6:]} {''.join(map(str, dims))}"
    if options.get("layout") == "permuted":
        name += f" (input {''.join(map(str, options['layout_dims']))})"
    return Case(name, make, nbytes=2 * n * dtype.itemsize,
                tags={"shape": list(shape), "dtype": str(dtype)[6:], "dims": list(dims)})


def torch_permute(x: torch.Tensor, dims) -> torch.Tensor:
    return x.permute(dims).contiguous()


def check(got, ref, inputs) -> str | None:
    if got.shape != ref.shape or got.dtype != ref.dtype:
        return (f"shape/dtype {tuple(got.shape)} {got.dtype}, "
                f"expected {tuple(ref.shape)} {ref.dtype}")
    if not got.is_contiguous():
        return "the result is not contiguous"
    a = got.reshape(-1).view(torch.uint8)
    b = ref.contiguous().reshape(-1).view(torch.uint8)
    wrong = int((a != b).sum())
    return f"{wrong} of {b.numel()} bytes wrong" if wrong else None


def targets(rows: list[dict], summary: dict) -> dict:
    """The issue's targets on an H200, each with its measured value."""
    pcts = {r["case"]: r["pct_copy_bw"].get("auto-warm") for r in rows}
    best = {r["case"]: max((v for k, v in r["pct_copy_bw"].items()
                            if k not in ("torch", "flag_gems", "auto-cold", "auto-warm")),
                           default=None) for r in rows}
    worst = summary.get("auto-warm_worst_vs_torch")
    below = sorted(k for k, v in pcts.items() if v is None or v < 85.0)
    out = {
        "target_every_case_85pct_copy_bw_min": min(filter(None, pcts.values()), default=None),
        "cases_below_85pct_copy_bw": below,
        "best_kernel_pct_copy_bw": best,
        "target_auto_2.5x_torch_geomean": summary.get("auto-warm_geomean_speedup_vs_torch"),
        "target_never_slower_than_torch_worst_ratio": worst,
        "target_cold_regret_p90_within_15pct": summary.get("auto-cold_regret_p90"),
    }
    out["targets_met"] = {
        "85pct_copy_bw_every_case": bool(rows) and not below,
        "2.5x_torch": at_least(out["target_auto_2.5x_torch_geomean"], 2.5),
        "never_slower_than_torch": at_least(worst, 1.0),
        "cold_p90_15pct": at_most(out["target_cold_regret_p90_within_15pct"], 1.15),
    }
    return out




def suite(smoke: bool) -> Suite:
    peers = {}
    try:
        from flag_gems.ops import contiguous as gems_contiguous

        def gems_permute(x, dims):
            return gems_contiguous(x.permute(dims))

        peers["flag_gems"] = gems_permute
    except Exception:  # noqa: BLE001 - the peer is optional
        pass
    return Suite("permute", [_case(*c) for c in (SMOKE if smoke else FULL)], torch_permute, check,
                 peers=peers, targets=targets)


if __name__ == "__main__":
    main_guard(suite)
