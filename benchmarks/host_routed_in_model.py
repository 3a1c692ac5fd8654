"""What a routed call costs on the host inside a model, where it is called: between the layers'
other work, with the interpreter's and torch's caches cold (bench_routing.py times calls back to
back, warm, which reads several times less).

After each decode step of a tiny Llama (Hugging Face, random weights, eager attention), one call
of each case is timed, routing off and on in turns; reported per case: the median host time off,
on, and the difference (cold), and the same for a second call right after (warm). The cases are
the calls a transformer layer makes of the routed entry points: the attention's softmax (with a
dtype), the sampling's top-k, the copy of a transposed view (the heads' merge, by contiguous()
and by reshape()), repeat_kv's reshape of an expanded view (grouped-query attention: never
routed, answered by the wrapper) and contiguous() of a contiguous tensor.

    python benchmarks/host_routed_in_model.py                  # this tree (JSON into $OUT)
    python benchmarks/host_routed_in_model.py --trees old,.    # another tree (a directory
                                                               # holding an opselect package)
                                                               # against this one, processes
                                                               # in turns, --processes each
    python benchmarks/host_routed_in_model.py --smoke          # a few rounds (CI)

Needs transformers (the `hf` extra). Host time only: on a GPU the model runs on the device,
the calls are timed without a sync (what the host spends issuing them).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from contextlib import nullcontext
from pathlib import Path

HERE = Path(__file__).resolve().parent


def measure(rounds: int, backends: dict | None = None) -> dict:
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, str(HERE))
    import bench_model
    import opselect

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = bench_model.build("llama3-8b", None, True, device, torch.float32)
    step = bench_model.workload(model, "decode-topk", 8, 16, device)
    scores = torch.randn(8, 256, device=device)
    heads = torch.randn(2, 4, 16, 8, device=device).transpose(1, 2)
    kv = torch.randn(2, 2, 16, 16, device=device)[:, :, None].expand(2, 2, 2, 16, 16)
    cases = {
        "topk(scores, 50)": lambda: torch.topk(scores, 50),
        "F.softmax(scores, -1, dtype=float32)": lambda: F.softmax(scores, dim=-1,
                                                                  dtype=torch.float32),
        "heads.contiguous() (transposed)": lambda: heads.contiguous(),
        "heads.reshape(2, 16, -1) (copies)": lambda: heads.reshape(2, 16, -1),
        "kv.reshape(2, 4, 16, 16) (expanded)": lambda: kv.reshape(2, 4, 16, 16),
        "scores.contiguous() (contiguous)": lambda: scores.contiguous(),
    }
    clock = time.perf_counter_ns
    times: dict[tuple, list[int]] = {}
    for r in range(rounds):
        for routed in ((False, True) if r % 2 else (True, False)):
            with opselect.enabled(backends=backends) if routed else nullcontext():
                for name, call in cases.items():
                    step()
                    start = clock()
                    call()
                    cold = clock() - start
                    start = clock()
                    call()
                    warm = clock() - start
                    times.setdefault((name, routed, "cold"), []).append(cold)
                    times.setdefault((name, routed, "warm"), []).append(warm)
    with opselect.enabled(backends=backends):
        opselect.reset_stats()
        for call in cases.values():
            call()
        chosen = {op: sorted(v["backends"]) for op, v in opselect.stats().items()}
    result = {"opselect": str(Path(opselect.__file__).parent), "device": str(device),
              "rounds": rounds, "backends": backends or {}, "chosen": chosen, "us": {}}
    for name in cases:
        row = {}
        for when in ("cold", "warm"):
            off = statistics.median(times[(name, False, when)]) / 1e3
            on = statistics.median(times[(name, True, when)]) / 1e3
            row[when] = {"off": round(off, 2), "on": round(on, 2), "extra": round(on - off, 2)}
        result["us"][name] = row
    return result


def in_turns(trees: list[str], processes: int, rounds: int) -> dict:
    """Each tree's measure() in its own process, the trees taking turns (A B B A ...)."""
    runs: dict[str, list[dict]] = {tree: [] for tree in trees}
    for p in range(processes):
        for tree in (trees if p % 2 == 0 else trees[::-1]):
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(
                [str(Path(tree).resolve())] + [p for p in os.environ.get("PYTHONPATH", "").split(
                    os.pathsep) if p]))
            out = subprocess.run([sys.executable, __file__, "--rounds", str(rounds), "--json"],
                                 env=env, capture_output=True, text=True, check=True).stdout
            runs[tree].append(json.loads(out.strip().splitlines()[-1]))
    summary = {}
    for tree, found in runs.items():
        summary[tree] = {"opselect": found[0]["opselect"], "us": {}}
        for name in found[0]["us"]:
            summary[tree]["us"][name] = {
                when: {"extra": round(statistics.median(r["us"][name][when]["extra"]
                                                        for r in found), 2),
                       "extra_runs": [r["us"][name][when]["extra"] for r in found]}
                for when in ("cold", "warm")}
    return {"processes": processes, "rounds": rounds, "trees": summary}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=150)
    p.add_argument("--trees", default="", help="comma list of trees, measured in turns")
    p.add_argument("--processes", type=int, default=3, help="with --trees: processes per tree")
    p.add_argument("--backends", default="",
                   help="op=backend,... forced while routed (default: the dispatcher's choice)")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--json", action="store_true", help="print the result as one JSON line only")
    args = p.parse_args()
    rounds = 4 if args.smoke else args.rounds
    if args.trees:
        result = in_turns(args.trees.split(","), 1 if args.smoke else args.processes, rounds)
        for tree, found in result["trees"].items():
            print(f"{tree} ({found['opselect']}): extra us, cold [runs] / warm")
            for name, row in found["us"].items():
                print(f"  {name:40s} {row['cold']['extra']:7.2f} {row['cold']['extra_runs']}"
                      f"  / {row['warm']['extra']:6.2f}")
    else:
        result = measure(rounds, dict(kv.split("=") for kv in args.backends.split(",") if kv))
        if args.json:
            print(json.dumps(result))
            return  # (a process of --trees: its caller saves)
        print(f"opselect at {result['opselect']}, {result['device']}, {rounds} rounds, backends "
              f"{result['chosen']}; host us")
        print(f"  {'call':40s} {'cold off':>9} {'on':>7} {'extra':>7} | {'warm off':>9} {'on':>7}"
              f" {'extra':>7}")
        for name, row in result["us"].items():
            c, w = row["cold"], row["warm"]
            print(f"  {name:40s} {c['off']:9.2f} {c['on']:7.2f} {c['extra']:7.2f} | "
                  f"{w['off']:9.2f} {w['on']:7.2f} {w['extra']:7.2f}")
    if not args.smoke and os.environ.get("OUT"):
        Path(os.environ["OUT"], "host_routed_in_model.json").write_text(json.dumps(result,
                                                                                  indent=1))


if __name__ == "__main__":
    main()
