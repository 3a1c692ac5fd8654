"""isin benchmark: torch, every backend, auto (cold and warm), flag_gems.

    python benchmarks/bench_isin.py             # the full suite on the GPU, results committed
    python benchmarks/bench_isin.py --smoke     # tiny cases, any device (CI checks the script)

Elements from 1e3 to 6.7e7, test sets from 16 to 1.6e7, int32 / int64 / float32, values drawn from
a narrow range ([0, 2N)) or the whole range; half the elements are members.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Case, Suite, at_least, at_most, main_guard  # noqa: E402

from opselect.dispatch import get_op  # noqa: E402

K, M = 1024, 1 << 20
FULL = [
    # (elements, test_elements, dtype, values)
    (1000, 16, torch.int32, "wide"),
    (100_000, 16, torch.int32, "wide"),
    (16 * M, 16, torch.int32, "wide"),
    (64 * M, 16, torch.int32, "wide"),
    (1000, 1024, torch.int32, "narrow"),
    (1_000_000, 1024, torch.int32, "wide"),
    (16 * M, 1024, torch.int32, "wide"),
    (16 * M, 1024, torch.int32, "narrow"),
    (16 * M, 64 * K, torch.int32, "wide"),
    (100_000, 100_000, torch.int32, "wide"),
    (1_000_000, 100_000, torch.int32, "narrow"),
    (16 * M, 1_000_000, torch.int32, "wide"),
    (16 * M, 1_000_000, torch.int32, "narrow"),
    (64 * M, 1_000_000, torch.int32, "wide"),
    (64 * M, 1_000_000, torch.int32, "narrow"),
    (1_000_000, 16_000_000, torch.int32, "wide"),
    (16 * M, 16_000_000, torch.int32, "wide"),
    (16 * M, 16_000_000, torch.int32, "narrow"),
    (10_000, 10_000, torch.int64, "wide"),
    (16 * M, 16, torch.int64, "wide"),
    (16 * M, 1024, torch.int64, "wide"),
    (16 * M, 1024, torch.int64, "narrow"),
    (16 * M, 1_000_000, torch.int64, "wide"),
    (16 * M, 1_000_000, torch.int64, "narrow"),
    (64 * M, 64 * K, torch.int64, "wide"),
    (1_000_000, 16_000_000, torch.int64, "wide"),
    (1000, 1000, torch.float32, "wide"),
    (16 * M, 16, torch.float32, "wide"),
    (16 * M, 1024, torch.float32, "wide"),
    (16 * M, 1024, torch.float32, "narrow"),
    (16 * M, 1_000_000, torch.float32, "wide"),
    (16 * M, 1_000_000, torch.float32, "narrow"),
    (64 * M, 1_000_000, torch.float32, "wide"),
    (1_000_000, 16_000_000, torch.float32, "wide"),
    # Up to 1,024 wide test values (issue 35): a set small enough to hold on chip
    (16 * M, 256, torch.int64, "wide"),
    (4 * M, 512, torch.int64, "wide"),
    (64 * M, 1024, torch.int64, "wide"),
    (1_000_000, 1024, torch.int64, "wide"),
]
SMOKE = [(300, 16, torch.int32, "wide"), (500, 200, torch.int64, "narrow"),
         (400, 30, torch.float32, "wide")]


def _case(m: int, n: int, dtype: torch.dtype, values: str) -> Case:
    op = get_op("isin")

    def make(device: torch.device):
        return op.sample([[m], [n]], dtype, {"values": values}, device)

    name = f"{_num(m)} in {_num(n)} {str(dtype)[6:]} {values}"
    return Case(name, make, nbytes=(m + n) * dtype.itemsize + m,
                tags={"elements": m, "test_elements": n, "dtype": str(dtype)[6:], "values": values})


def _num(n: int) -> str:
    for unit, size in (("M", M), ("K", K)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return f"{n:.0e}".replace("+0", "") if n >= 10_000 and n % 1000 == 0 else str(n)


def check(got, ref, inputs) -> str | None:
    if got.dtype != torch.bool or got.shape != ref.shape:
        return f"dtype/shape {got.dtype} {tuple(got.shape)}, expected bool {tuple(ref.shape)}"
    wrong = int((got != ref).sum())
    return f"{wrong} of {ref.numel()} wrong" if wrong else None


def targets(rows: list[dict], summary: dict) -> dict:
    """The issue's targets, each with its measured value."""
    def pct(r):
        return r["pct_copy_bw"].get("auto-warm")

    big_small = [pct(r) for r in rows if r["elements"] >= 16_000_000 and r["test_elements"] <= 1024]
    big_mid = [pct(r) for r in rows
               if r["elements"] >= 16_000_000 and 1024 < r["test_elements"] <= 1_000_000]
    worst = summary.get("auto-warm_worst_vs_torch")
    out = {
        "target_auto_5x_torch_geomean": summary.get("auto-warm_geomean_speedup_vs_torch"),
        "target_auto_2x_flag_gems_geomean": summary.get("auto-warm_geomean_speedup_vs_flag_gems"),
        "target_never_3pct_slower_than_torch_worst_ratio": worst,
        "target_30pct_bw_big_elements_small_test_min": min(filter(None, big_small), default=None),
        "target_10pct_bw_big_elements_1e6_test_min": min(filter(None, big_mid), default=None),
        "target_cold_regret_p90_within_15pct": summary.get("auto-cold_regret_p90"),
        "target_warm_regret_geomean_within_3pct": summary.get("auto-warm_regret_geomean"),
    }
    out["targets_met"] = {
        "5x_torch": at_least(out["target_auto_5x_torch_geomean"], 5.0),
        "2x_flag_gems": at_least(out["target_auto_2x_flag_gems_geomean"], 2.0),
        "never_3pct_slower": at_least(worst, 0.97),
        "30pct_bw": at_least(out["target_30pct_bw_big_elements_small_test_min"], 30.0),
        "10pct_bw": at_least(out["target_10pct_bw_big_elements_1e6_test_min"], 10.0),
        "cold_p90_15pct": at_most(out["target_cold_regret_p90_within_15pct"], 1.15),
        "warm_geomean_3pct": at_most(out["target_warm_regret_geomean_within_3pct"], 1.03),
    }
    return out




def suite(smoke: bool) -> Suite:
    peers = {}
    try:
        import flag_gems

        def gems_isin(elements, test_elements, **kw):
            return flag_gems.isin(elements, test_elements, **kw)

        peers["flag_gems"] = gems_isin
    except Exception:  # noqa: BLE001 - the peer is optional
        pass
    return Suite("isin", [_case(*c) for c in (SMOKE if smoke else FULL)], torch.isin, check,
                 peers=peers, targets=targets)


if __name__ == "__main__":
    main_guard(suite)
