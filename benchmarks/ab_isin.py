"""isin's set backends (hash, bitmap) against an older copy of their kernels, interleaved.

The older hash.py, bitmap.py and common.py are loaded beside the current ones as modules of the
same package (their imports of each other redirected to the older copies), so both run in one
process on the same inputs, taking turns (A B A B, several rounds): a gain is read against the
spread, not against another day's run.

    python benchmarks/ab_isin.py --before COMMIT            # git show COMMIT:opselect/kernels/isin/...
    python benchmarks/ab_isin.py --before DIR               # DIR holds the three older files
    python benchmarks/ab_isin.py --before HEAD --smoke      # tiny inputs, any device: answers checked
    python benchmarks/ab_isin.py --before COMMIT --builds   # large test sets, repeated values
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib
import statistics
import subprocess
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from opselect.dispatch import get_op  # noqa: E402
import opselect.kernels.isin as isin_pkg  # noqa: E402
from probe_isin_onchip import _bench, inputs  # noqa: E402  (do_bench's median; the cases' inputs)

M = 1 << 20  # (as probe_isin_onchip's cases)
# (elements, test values, dtype, values), as in bench_isin: sets held on chip, and one read
# through L2 (4,096 int64) where nothing should change
CASES = [(16 * M, 1024, torch.int64, "wide"), (16 * M, 1024, torch.int32, "wide"),
         (16 * M, 1024, torch.float32, "wide"), (16 * M, 256, torch.int64, "wide"),
         (16 * M, 1024, torch.float32, "narrow"), (64 * M, 1024, torch.int64, "wide"),
         (1 * M, 1024, torch.int64, "wide"), (16 * M, 4096, torch.int64, "wide")]
# --builds: large test sets, where the build matters: distinct values (what the build's checks
# cost) and repeated ones (what they save: atomics on one address serialise). "one": one value
# 90% of the time; "64": 64 distinct values; float16 "narrow" draws past float16's range (inf).
BUILD_CASES = [(1 * M, 1 * M, torch.int32, "wide"), (1 * M, 4 * M, torch.int64, "wide"),
               (16 * M, 1 * M, torch.int32, "narrow"), (1 * M, 1 * M, torch.int32, "one"),
               (1 * M, 1 * M, torch.int64, "one"), (1 * M, 1 * M, torch.int32, "64"),
               (1 * M, 1 * M, torch.float32, "one"), (449724, 1319234, torch.float16, "narrow"),
               (1 * M, 32768, torch.int32, "one")]
MODULES = ("common", "hash", "bitmap")


def build_inputs(op, cases, only: str, device):
    """inputs() for BUILD_CASES: the sampled sets, with repeats written in for "one" and "64"."""
    gen = torch.Generator(device=device).manual_seed(0)
    for m, n, dtype, values in cases:
        label = f"{m / M:g}M in {n} {str(dtype)[6:]} {values}"
        if only and only not in label:
            continue
        kind = values if values in ("wide", "narrow") else "narrow"
        (x, t), _ = op.sample([[m], [n]], dtype, {"values": kind}, device)
        if values == "one":
            t[torch.rand(n, device=device, generator=gen) < 0.9] = t[0].item()
        elif values == "64":
            t = t[torch.randint(0, 64, (n,), device=device, generator=gen)]
        yield label, (m, n, dtype), x, t, torch.isin(x, t), op.prepare(x, t)


def _older_sources(before: str) -> dict[str, str]:
    folder = pathlib.Path(before)
    if folder.is_dir():
        return {m: (folder / f"{m}.py").read_text() for m in MODULES}
    return {m: subprocess.run(["git", "show", f"{before}:opselect/kernels/isin/{m}.py"],
                              capture_output=True, text=True, check=True).stdout for m in MODULES}


def load_older(before: str) -> dict:
    """The older modules, as opselect.kernels.isin._before_<name>; {name: module}."""
    sources = _older_sources(before)
    loaded = {}
    for name in MODULES:  # (common first: the others import it)
        text = sources[name]
        for other in MODULES:
            text = text.replace(f"from .{other} import", f"from ._before_{other} import")
        full = f"{isin_pkg.__name__}._before_{name}"
        path = pathlib.Path(isin_pkg.__file__).parent / f"_before_{name}.py"
        # Triton reads a kernel's source from its file: the text is written beside the package
        # for the run, and removed after import.
        path.write_text(text)
        try:
            spec = importlib.util.spec_from_file_location(full, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[full] = module
            spec.loader.exec_module(module)
        finally:
            path.unlink()
        loaded[name] = module
    return loaded


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default="")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--cases", default="", help="only cases whose label contains this text")
    ap.add_argument("--builds", action="store_true",
                    help="the large test sets (BUILD_CASES) instead of the on-chip ones")
    args = ap.parse_args()
    older = load_older(args.before)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    op = get_op("isin")
    backends = {"hash": (op.backend("hash"), older["hash"].HashBackend()),
                "bitmap": (op.backend("bitmap"), older["bitmap"].BitmapBackend())}
    cases = BUILD_CASES if args.builds else CASES
    if args.smoke:
        cases = [(3000, min(n, 20000), d, v) for _, n, d, v in cases]
    make = build_inputs if args.builds else inputs
    results = {}
    for label, (m, n, dtype), x, t, ref, call in make(op, cases, args.cases, device):
        variants, checks = {}, {}
        for name, (now, before) in backends.items():
            if now.supports(call) is not None:
                continue
            config = dict(now.configs(call)[0])
            # Prepared calls (bound once, as a route's): run() plans and binds its launches on
            # every call, host time that do_bench counts on calls of tens of microseconds.
            for side, b in (("before", before), ("now", now)):
                prepared = b.bind(call, config)
                variants[f"{name} {side}"] = lambda p=prepared: p(x, t)
        variants["torch"] = lambda: torch.isin(x, t)
        for name, fn in variants.items():
            checks[name] = bool(torch.equal(fn(), ref))
        times = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name, fn in variants.items():
                times[name].append(_bench(fn))
        results[label] = {k: {"median_us": statistics.median(v), "spread_us": max(v) - min(v),
                              "correct": checks[k]} for k, v in times.items()}
        print(f"\n{label}: {m * (dtype.itemsize + 1) / 1e6:.0f} MB moved")
        for k, r in results[label].items():
            ok = " ok" if r["correct"] else " WRONG"
            print(f"  {k:>14} {r['median_us']:8.1f} us  +-{r['spread_us']:5.1f}{ok}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
