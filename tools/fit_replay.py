"""The fitted cold picks of a committed bench_random run, replayed with today's model, on CPU.

bench_random fits the model's per-backend scales on the fit seed's rows and reports the fitted
model's picks on the report seed. This replays both steps with the current code: every row's
prediction is recomputed from its spec (meta tensors, the GPU's default constants), the scales are
fitted by bench_random.fit on the fit rows, and each report row's pick is read against its measured
times. It shows what a change of the model or of the fit does before a GPU confirms it.

    python tools/fit_replay.py benchmarks/results/h200/random_topk_seed2.json H200
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
from opselect.dispatch.op import choose  # noqa: E402
from opselect.heuristics.device_model import defaults_for, known_gpu  # noqa: E402


def _plan(row: dict, info, model):
    spec = row["spec"]
    op = get_op(spec["op"])
    args, kwargs = bench_random.make(spec, torch.device("meta"))
    call = op.prepare(*args, **kwargs)
    call.info = info
    return [c for c in op.plan(call, model, check_device=False) if c.supported]


def replay(path: str, gpu: str) -> list[tuple[str, str, str, float]]:
    result = json.loads(Path(path).read_text())
    info = known_gpu(gpu)
    live = defaults_for(info)
    fit_rows = bench_random.predicted_again(result["fit"]["rows"], info, live)
    fitted, scales, samples = bench_random.fit(fit_rows, live)
    print("scales:", ", ".join(f"{k} {v:.2f} ({samples[k]})" for k, v in scales.items()))
    out = []
    for row in result["report"]["rows"]:
        times = {b: t for b, t in row["s"].items() if t and b in row.get("tuning_measured_s", {})}
        if not times:
            continue
        pick = choose(_plan(row, info, fitted), lambda c: c.predicted_s).name
        best = min(times, key=times.get)
        out.append((row["call"], pick, best, times[pick] / times[best] if pick in times
                    else math.nan))
    return out


def main() -> None:
    path, gpu = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "H100"
    rows = replay(path, gpu)
    for call, pick, best, regret in rows:
        if regret > 1.1:
            print(f"{call[:64]:<64} pick {pick:<10} best {best:<10} x{regret:.2f}")
    regrets = sorted(r for *_, r in rows if not math.isnan(r))
    if regrets:
        p90 = regrets[min(len(regrets) - 1, int(math.ceil(0.9 * len(regrets))) - 1)]
        geo = math.exp(sum(math.log(r) for r in regrets) / len(regrets))
        print(f"{len(regrets)} report calls, fitted: regret geomean {geo:.3f}, p90 {p90:.3f}, "
              f"max {regrets[-1]:.3f}, over 1.1: {sum(r > 1.1 for r in regrets)}")


if __name__ == "__main__":
    main()
