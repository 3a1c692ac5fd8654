"""What a routed call costs on the host inside a model, where it is called: between the layers'
other work, with the interpreter's and torch's caches cold (bench_routing.py times calls back to
back, warm, which reads several times less).

After each decode step of a tiny Llama (Hugging Face, random weights, eager attention), one call
of each case is timed, routing off and on in turns; reported per case: the median host time off,
on, and the difference (cold), and the same for a second call right after (warm). The cases are
the calls a transformer layer makes of the routed entry points: the attention's softmax (with a
dtype, as Llama's of bfloat16 scores, and without, as GPT-2's), the sampling's top-k, the copy of a transposed
view (the heads' merge, by contiguous() and by reshape()), repeat_kv's reshape of an expanded
view (grouped-query attention: never routed, answered by the wrapper) and contiguous() of a
contiguous tensor.

    python benchmarks/host_routed_in_model.py                  # this tree (JSON into $OUT)
    python benchmarks/host_routed_in_model.py --trees old,.    # another tree (a directory
                                                               # holding an opselect package)
                                                               # against this one, processes
                                                               # in turns, --processes each
    python benchmarks/host_routed_in_model.py --variants 'auto:;torch:permute=torch'
                                                               # routed variants in turns
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


def measure(rounds: int, backends: dict | None = None,
            variants: dict[str, dict] | None = None) -> dict:
    """`variants` (name -> forced backends) are timed routed in turns with the unrouted calls,
    each against those; without it, the one routed variant of `backends`."""
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, str(HERE))
    import bench_model
    import opselect

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = bench_model.build("llama3-8b", None, True, device, torch.float32)
    step = bench_model.workload(model, "decode-topk", 8, 16, device)
    scores = torch.randn(8, 256, device=device)
    # Llama's attention: bfloat16 scores, a float32 softmax (torch casts, then a softmax)
    half_scores = torch.randn(1, 4, 16, 16, device=device, dtype=torch.bfloat16)
    heads = torch.randn(2, 4, 16, 8, device=device).transpose(1, 2)
    kv = torch.randn(2, 2, 16, 16, device=device)[:, :, None].expand(2, 2, 2, 16, 16)
    cases = {
        "topk(scores, 50)": lambda: torch.topk(scores, 50),
        "F.softmax(scores, -1, dtype=float32)": lambda: F.softmax(scores, dim=-1,
                                                                  dtype=torch.float32),
        "F.softmax(scores, -1)": lambda: F.softmax(scores, dim=-1),
        "F.softmax(half_scores, -1, dtype=float32)": lambda: F.softmax(half_scores, dim=-1,
                                                                       dtype=torch.float32),
        "heads.contiguous() (transposed)": lambda: heads.contiguous(),
        "heads.reshape(2, 16, -1) (copies)": lambda: heads.reshape(2, 16, -1),
        "kv.reshape(2, 4, 16, 16) (expanded)": lambda: kv.reshape(2, 4, 16, 16),
        "scores.contiguous() (contiguous)": lambda: scores.contiguous(),
    }
    if variants is None:
        variants = {"on": backends or {}}
    clock = time.perf_counter_ns
    times: dict[tuple, list[int]] = {}
    names = [None, *variants]  # None: routing off
    for r in range(rounds):
        shift = r % len(names)
        for variant in names[shift:] + names[:shift]:
            with (opselect.enabled(backends=variants[variant]) if variant is not None
                  else nullcontext()):
                for name, call in cases.items():
                    step()
                    start = clock()
                    call()
                    cold = clock() - start
                    start = clock()
                    call()
                    warm = clock() - start
                    times.setdefault((name, variant, "cold"), []).append(cold)
                    times.setdefault((name, variant, "warm"), []).append(warm)
    chosen = {}
    for variant, forced in variants.items():
        with opselect.enabled(backends=forced):
            opselect.reset_stats()
            for call in cases.values():
                call()
            chosen[variant] = {op: sorted(v["backends"]) for op, v in opselect.stats().items()}
    result = {"opselect": str(Path(opselect.__file__).parent), "device": str(device),
              "rounds": rounds, "variants": variants, "chosen": chosen, "us": {}}
    for name in cases:
        row = {}
        for when in ("cold", "warm"):
            off = statistics.median(times[(name, None, when)]) / 1e3
            row[when] = {"off": round(off, 2)}
            for variant in variants:
                on = statistics.median(times[(name, variant, when)]) / 1e3
                row[when][variant] = round(on, 2)
                row[when][f"{variant} extra"] = round(on - off, 2)
            if list(variants) == ["on"]:  # the --trees summary reads "extra"
                row[when]["extra"] = row[when]["on extra"]
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
    p.add_argument("--variants", default="",
                   help="name:op=backend,...;name:... routed variants timed in turns in one "
                        "process (an empty list after the colon: the dispatcher's choice)")
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
        variants = None
        if args.variants:
            variants = {}
            for part in args.variants.split(";"):
                name, _, forced = part.partition(":")
                variants[name] = dict(kv.split("=") for kv in forced.split(",") if kv)
        result = measure(rounds, dict(kv.split("=") for kv in args.backends.split(",") if kv),
                         variants)
        if args.json:
            print(json.dumps(result))
            return  # (a process of --trees: its caller saves)
        print(f"opselect at {result['opselect']}, {result['device']}, {rounds} rounds; chosen "
              f"{result['chosen']}; host us, median, routing off and each variant")
        names = list(result["variants"])
        for when in ("cold", "warm"):
            print(f"  {when:40s} {'off':>8}" + "".join(f" {n[:12]:>12}" for n in names))
            for name, row in result["us"].items():
                r = row[when]
                print(f"  {name:40s} {r['off']:8.2f}" + "".join(f" {r[n]:12.2f}" for n in names))
    if not args.smoke and os.environ.get("OUT"):
        Path(os.environ["OUT"], "host_routed_in_model.json").write_text(json.dumps(result,
                                                                                  indent=1))


if __name__ == "__main__":
    main()
