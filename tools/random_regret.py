"""The cost model's cold picks against a committed bench_random run, without a GPU.

Each row of benchmarks/results/<gpu>/random*.json (fit and report seeds) is rebuilt on the meta
device from its spec, the model of that GPU (its default constants, as dispatch.op.what_if asks)
picks, and the pick's regret is read off the row's measured times: what a change of the model
does to the cold choices of calls drawn at random, before a GPU confirms it.

    python tools/random_regret.py benchmarks/results/h100/random_softmax.json H100
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

import bench_random  # noqa: E402
from opselect.dispatch import get_op  # noqa: E402
from opselect.heuristics.device_model import known_gpu  # noqa: E402


def replay(path: str, gpu: str) -> list[tuple[str, str, str, float]]:
    result = json.loads(Path(path).read_text())
    info = known_gpu(gpu)
    out = []
    for row in result["fit"]["rows"] + result["report"]["rows"]:
        spec, s = row["spec"], row["s"]
        times = {b: t for b, t in s.items() if t and b in row.get("tuning_measured_s", {})}
        if not times:
            continue
        op = get_op(spec["op"])
        args, kwargs = bench_random.make(spec, torch.device("meta"))
        pick = op.what_if(op.prepare(*args, **kwargs), info).choice
        best = min(times, key=times.get)
        regret = times[pick] / times[best] if pick in times else math.nan
        out.append((row["call"], pick, best, regret))
    return out


def main() -> None:
    path, gpu = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "H100"
    rows = replay(path, gpu)
    for call, pick, best, regret in rows:
        flag = "  <-" if regret > 1.1 else ""
        print(f"{call[:64]:<64} pick {pick:<10} best {best:<10} x{regret:.2f}{flag}")
    regrets = sorted(r for *_, r in rows if not math.isnan(r))
    if regrets:
        p90 = regrets[min(len(regrets) - 1, int(0.9 * len(regrets)))]
        geo = math.exp(sum(math.log(r) for r in regrets) / len(regrets))
        print(f"{len(regrets)} calls: regret geomean {geo:.3f}, p90 {p90:.3f}, "
              f"max {regrets[-1]:.3f}, over 1.1: {sum(r > 1.1 for r in regrets)}")


if __name__ == "__main__":
    main()
