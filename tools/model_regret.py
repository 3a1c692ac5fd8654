"""The cost model's picks against a committed benchmark, without a GPU.

For each case of an op's saved results (benchmarks/results/<gpu>/<op>.json), the model's estimate
of every backend (host and device parts), its pick (as the dispatcher makes it: the cheapest, or
torch unless a backend is 7% cheaper: dispatch.op.choose), and the regret of that pick against the best measured
backend; then the regret's geometric mean and 90th percentile, the issue's cold-start measure.

    python tools/model_regret.py topk h200
    python tools/model_regret.py isin h200
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402

from opselect.dispatch import get_op  # noqa: E402
from opselect.heuristics.device_model import known_gpu  # noqa: E402


def main(op_name: str, gpu: str, show: bool = True) -> tuple[float, float]:
    """Print every case's estimates, pick and regret (show=True); return (geomean, p90)."""
    import importlib

    bench = importlib.import_module(f"bench_{op_name}")
    info = known_gpu(gpu)
    op = get_op(op_name)
    rows = {r["case"]: r for r in
            json.loads((ROOT / "benchmarks/results" / gpu / f"{op_name}.json").read_text())["rows"]}
    regrets = []
    for case in bench.suite(False).cases:
        label = case.name
        args, kwargs = case.make(torch.device("meta"))  # shapes and dtypes, no data
        decision = op.what_if(op.prepare(*args, **kwargs), info)  # the dispatcher's choose
        able = [c for c in decision.candidates if c.supported]
        pick = decision.choice
        measured = {b: v for b, v in rows.get(label, {}).get("ms", {}).items()
                    if v and any(c.name == b for c in able)}
        line = f"{label:<40} pick={pick:<10}"
        for c in able:
            host = c.parts.get("launch", 0.0)
            dev = sum(v for key, v in c.parts.items() if key != "launch")
            got = f"/{measured[c.name] * 1e3:.0f}" if c.name in measured else ""
            line += f" {c.name[:4]}={dev * 1e6:.0f}+{host * 1e6:.0f}h{got}"
        if measured and pick in measured:
            regret = measured[pick] / min(measured.values())
            regrets.append(regret)
            line += f" | best={min(measured, key=measured.get)} regret={regret:.2f}"
        if show:
            print(line)
    if not regrets:
        return math.nan, math.nan
    regrets.sort()
    p90 = regrets[min(len(regrets) - 1, math.ceil(0.9 * len(regrets)) - 1)]
    geo = math.exp(sum(map(math.log, regrets)) / len(regrets))
    if show:
        print(f"{len(regrets)} cases: regret geomean {geo:.3f}, p90 {p90:.3f}")
    return geo, p90


if __name__ == "__main__":
    main(*(sys.argv[1:3] if len(sys.argv) > 2 else ("topk", "h200")))
