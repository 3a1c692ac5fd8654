"""Where topk's time goes on vocabulary rows (issue 35: 32K-256K elements, small k). Device
time only (do_bench, L2 flushed), the variants interleaved over rounds (median of the rounds'
medians, and their spread).

This tree's tournament in its configs (fused; `apart`: the selection as a second launch) and
`tourn-pass`, the pass launch alone (stages 1 and 2: the group maxima and the cut). `--before
COMMIT` adds an older, one-kernel tournament cut short: its source is copied to a temporary
module with a constexpr STOP, so `stop1 before` is the pass over the data with the group maxima
stores, `stop2` adds the cut among the maxima, `stop3` the hot groups' selection, `stop4` is its
whole kernel (the row's merge and the outputs). Differences place the time. `read floor` reads
the same chunks with the same programs and keeps a max per lane, nothing else: what the pass
over the data could cost.

    python benchmarks/probe_topk_vocab.py [--rounds 3] [--before HEAD] [--json out.json]
    python benchmarks/probe_topk_vocab.py --configs '{"p1024": {"piece_max": 1024}}'
    python benchmarks/probe_topk_vocab.py --registers 80,88   # under ptxas register caps too
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile

import torch
import triton
import triton.language as tl

from opselect.kernels import topk as K

CASES = [((256, 151936), 40, torch.bfloat16), ((64, 128256), 50, torch.bfloat16),
         ((4096, 32000), 50, torch.bfloat16), ((1024, 50257), 1, torch.float16),
         ((16, 151936), 256, torch.float32), ((8, 128256), 50, torch.bfloat16)]


# ---------------------------------------------------------------------------------------------
# tournament, cut short
# ---------------------------------------------------------------------------------------------
_CUTS = [
    ("    tl.debug_barrier()  # every thread's maxima are stored before any thread reads them\n",
     "after", "    if STOP == 1:\n        return\n"),
    ("    if shared:\n        dest = ws_ptr + off_cand + prog * k\n",
     "before", "    if STOP == 2:\n        tl.store(maxima, n_hot)\n        return\n"),
    ("    tl.debug_barrier()  # the winners written by all threads are visible to all threads\n",
     "before", "    if STOP == 3:\n        return\n"),
]


def _absolute_imports(src: str) -> str:
    """tournament.py's source with its package's relative imports made absolute (loaded as a
    module of its own)."""
    return (src.replace("from ...heuristics", "from opselect.heuristics")
               .replace("from .._common", "from opselect.kernels._common")
               .replace("from .call", "from opselect.kernels.topk.call")
               .replace("from .common", "from opselect.kernels.topk.common"))


def _load(src: str, stem: str):
    path = pathlib.Path(tempfile.mkdtemp()) / f"{stem}_{abs(hash(src))}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = mod
    spec.loader.exec_module(mod)
    return mod


def tournament_capped(registers: int):
    """This tree's tournament module, loaded again (kernels compiled apart from the library's),
    with ptxas's register cap on the fused kernel and the pass: does one more program an SM
    pay? (triton 3.6, 4096 x 32000 bf16 k = 50: 95-96 registers at 4 warps, 5 programs an SM;
    80 holds them with no spill, 6.) Returns the module."""
    from opselect.kernels.topk import tournament

    mod = _load(_absolute_imports(pathlib.Path(tournament.__file__).read_text()),
                f"tournament_r{registers}")
    for launcher in (mod._TOURNAMENT, mod._TOURNAMENT_PASS):
        own = launcher.plan_constexprs
        launcher.plan_constexprs = lambda plan, own=own: {**own(plan), "maxnreg": registers}
    return mod


def tournament_cut_short(stop: int, src: str):
    """The tournament module of the source `src` (one kernel, before 2026-11-29) with its
    kernel ending after stage `stop` (1-3; 4: the whole kernel)."""
    src = _absolute_imports(src)
    for anchor, where, text in _CUTS:
        if anchor not in src:
            raise SystemExit("--before: a one-kernel tournament.py (before 2026-11-29) is cut "
                             f"short at fixed lines, and this one lacks {anchor.strip()!r}")
        src = src.replace(anchor, anchor + text if where == "after" else text + anchor)
    src = src.replace("# Kernels: tournament\n", f"# Kernels: tournament\nSTOP = tl.constexpr({stop})\n", 1)
    return _load(src, f"tournament_stop{stop}").TournamentBackend()


# ---------------------------------------------------------------------------------------------
# the read floor: the same programs and chunks, a NaN-propagating max per lane and nothing else
# ---------------------------------------------------------------------------------------------
@triton.jit
def _read_floor_kernel(x_ptr, out_ptr, N, row_stride, chunk, tile: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    p = tl.program_id(1)
    start = p.to(tl.int64) * chunk
    n_here = tl.minimum(N - start, chunk).to(tl.int32)
    lane = tl.arange(0, tile)
    acc = tl.full([tile], float("-inf"), tl.float32)
    for t in range(n_here // tile):
        x = tl.load(x_ptr + r * row_stride + start + t * tile + lane)
        acc = tl.maximum(acc, x.to(tl.float32), propagate_nan=tl.PropagateNan.ALL)
    tl.store(out_ptr + (r * tl.num_programs(1) + p) * tile + lane, acc)


def read_floor(x, programs_per_row, chunk, tile=8192, num_warps=4):
    R, N = x.shape
    out = torch.empty(R * programs_per_row * tile, device=x.device)
    return lambda: _read_floor_kernel[(R, programs_per_row)](x, out, N, N, chunk, tile=tile,
                                                            num_warps=num_warps)


def pass_alone(module, plan, x, k):
    """The pass launch of tournament's plan (made with the selection apart) on rows x: stages 1
    and 2 alone, on a workspace of its own."""
    R, N = x.shape
    ws = torch.zeros(plan.workspace_elements, dtype=torch.int64, device=x.device)
    values = torch.empty(R, k, dtype=x.dtype, device=x.device)
    indices = torch.empty(R, k, dtype=torch.int64, device=x.device)
    ints = (N, plan.row_stride, k, plan.chunk, plan.programs_per_row, plan.flip)
    launch = module._TOURNAMENT_PASS.bind(plan, (R, plan.programs_per_row), x.device.index)
    return lambda: launch(x, ws, *plan.workspace_offsets, values, indices, *ints)


def _bench(fn) -> float:
    return triton.testing.do_bench(fn, warmup=10, rep=60) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default="")
    ap.add_argument("--cases", default="")
    ap.add_argument("--before", default="",
                    help="a commit, or a file holding an older tournament.py: its kernel too "
                         "(a file where git is absent, as on the lent GPU)")
    ap.add_argument("--only", default="", help="comma list: only the variants named so")
    ap.add_argument("--configs", default="{}",
                    help='JSON {"name": config}: tournament under these configs too')
    ap.add_argument("--registers", default="",
                    help="comma list: tournament, apart and the pass alone again under each of "
                         "these ptxas register caps (rN)")
    args = ap.parse_args()
    capped = {int(r): tournament_capped(int(r)) for r in args.registers.split(",") if r}
    stages = {}
    if args.before:
        if pathlib.Path(args.before).is_file():
            old_src = pathlib.Path(args.before).read_text()
        else:
            old_src = subprocess.run(
                ["git", "show", f"{args.before}:opselect/kernels/topk/tournament.py"],
                capture_output=True, text=True, check=True).stdout
        stages.update({f"{s} before": tournament_cut_short(s, old_src) for s in (1, 2, 3, 4)})
    tournament = K.OP.backend("tournament")
    from opselect.kernels.topk import tournament as tournament_module
    results = {}
    for shape, k, dtype in CASES:
        label = f"{'x'.join(map(str, shape))} {str(dtype)[6:]} k={k}"
        if args.cases and args.cases not in label:
            continue
        x = torch.randn(shape, device="cuda").to(dtype)
        ref = torch.topk(x, k)
        tc = K.prepare(x, k)
        variants = {"amax": lambda: torch.amax(x, -1), "clone": lambda: x.clone(),
                    "torch": lambda: torch.topk(x, k)}
        if tournament.supports(tc) is None:
            variants["tournament"] = lambda: tournament.run(tc, {})
            variants["apart"] = lambda: tournament.run(tc, {"apart": True, "select_warps": 2})
            for name, config in json.loads(args.configs).items():
                if tournament.plan(tc, config).reason is None:
                    variants[name] = lambda config=config: tournament.run(tc, config)
            for s, b in stages.items():
                variants[f"tourn-stop{s}"] = lambda b=b: b.run(tc, {})
            plan = tournament.plan(tc, {})
            variants["tourn-pass"] = pass_alone(tournament_module, tournament.plan(
                tc, {"apart": True}), x, k)
            for r, mod in capped.items():
                b = mod.TournamentBackend()
                variants[f"tournament r{r}"] = lambda b=b: b.run(tc, {})
                variants[f"apart r{r}"] = lambda b=b: b.run(tc, {"apart": True, "select_warps": 2})
                variants[f"tourn-pass r{r}"] = pass_alone(mod, b.plan(tc, {"apart": True}), x, k)
            variants["read floor"] = read_floor(x, plan.programs_per_row, plan.chunk,
                                                plan.tile, plan.num_warps)
        variants["maxima"] = lambda: K.OP.backend("maxima").run(tc, {})
        if args.only:
            variants = {n: f for n, f in variants.items() if n in args.only.split(",")}
        checks = {}
        for name, fn in variants.items():
            # every whole topk (the cut-short stages and other ops leave no answer to check)
            partial = name.startswith("tourn-") and name != "tourn-stop4 before"
            if not (partial or name in ("amax", "clone", "torch", "read floor")):
                vals, idx = fn()
                checks[name] = bool(torch.equal(vals, ref.values)
                                    and torch.equal(x.gather(-1, idx), vals))
        times = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name, fn in variants.items():
                times[name].append(_bench(fn))
        results[label] = {n: {"median_us": statistics.median(t), "spread_us": max(t) - min(t),
                              "correct": checks.get(n)} for n, t in times.items()}
        print(f"\n{label}: {x.numel() * x.element_size() / 1e6:.1f} MB")
        for n, r in results[label].items():
            ok = "" if r["correct"] is None else (" ok" if r["correct"] else " WRONG")
            print(f"  {n:>24} {r['median_us']:8.1f} us  +-{r['spread_us']:5.1f}{ok}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
