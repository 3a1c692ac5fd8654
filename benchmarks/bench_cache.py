"""The tune cache's command line at scale: import, show, show --op and export of N records.

A host-side benchmark (no GPU): the same command line a user runs (`python -m opselect.cli`, a
fresh process each, so the times include starting Python and importing torch), on a fresh cache
directory with N tune records of six backends each, as `warm` would leave them. Also the call
path's first cache read (a fresh process's first plain call).

    python benchmarks/bench_cache.py [--records 200000] [--smoke] [--no-save]

Writes benchmarks/results/host/cache.{json,md} (not with --smoke or --no-save) and, when $OUT is
set, $OUT/cache.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "host"
BACKENDS = ("torch", "radix", "tournament", "maxima", "sort", "bitonic")


def export_file(path: Path, n: int) -> int:
    """An export of n topk/isin records of six backends each; returns its size in bytes."""
    sys.path.insert(0, str(ROOT))
    import torch

    from opselect.dispatch import device_info
    from opselect.tune_cache.fingerprint import current
    from opselect.tune_cache.records import Timing, TuneRecord
    from opselect.tune_cache.storage import tune_key

    fp = current(device_info(torch.device("cpu")))
    timings = {name: Timing(seconds=1e-5 * (i + 1), config={"BLOCK": 1024, "num_warps": 4},
                            source_hash="0123456789abcdef")
               for i, name in enumerate(BACKENDS)}
    with open(path, "w") as out:
        out.write('{"opselect_export": 1, "entries": [')
        for i in range(n):
            op = ("topk", "isin")[i % 2]
            rec = TuneRecord(op=op, key=repr((("torch.float32",), (64, 1024 + i), 50)),
                             fingerprint=fp, timings=timings)
            key = tune_key(op, fp.device, rec.key)
            out.write(("\n" if i == 0 else ",\n")
                      + f'{{"key": {json.dumps(key)}, "record": {rec.model_dump_json()}}}')
        out.write("\n]}\n")
    return path.stat().st_size


#: `opselect ARGS` that reports its own peak memory at exit (VmHWM: ru_maxrss would keep the
#: parent's peak across fork and exec)
CLI = ("import atexit, sys\n"
       "def peak():\n"
       "    kib = [l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')]\n"
       "    print('MAXRSS', kib[0], file=sys.stderr)\n"
       "atexit.register(peak)\n"
       "from opselect.cli import main\n"
       "sys.exit(main(sys.argv[1:]))")


def run(argv: list[str], env: dict) -> tuple[float, float, str]:
    """Seconds and peak memory (MiB) of one command-line run, and its last line."""
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", CLI, *argv], env=env, capture_output=True,
                         text=True, timeout=3600)
    seconds = time.perf_counter() - start
    if out.returncode != 0:
        raise SystemExit(f"opselect {' '.join(argv)} failed:\n{out.stderr[-2000:]}")
    peak = int(out.stderr.rsplit("MAXRSS", 1)[1].split()[0]) / 1024
    lines = [line for line in out.stdout.splitlines() if line.strip()]
    return seconds, peak, lines[-1] if lines else ""


FIRST_CALL = """
import time, torch
from opselect import ops
x = torch.randn(4, 256)
start = time.perf_counter(); ops.topk(x, 8); first = time.perf_counter() - start
start = time.perf_counter(); ops.topk(x, 8); again = time.perf_counter() - start
print(first, again)
"""


def host() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                if line.startswith("model name")), "?") if os.path.exists("/proc/cpuinfo") else "?"
    return f"{os.cpu_count()} cores of {cpu}, Python {sys.version.split()[0]}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=200_000)
    p.add_argument("--smoke", action="store_true", help="2,000 records: checks the script")
    p.add_argument("--no-save", action="store_true", help="do not write benchmarks/results/")
    args = p.parse_args()
    n = 2_000 if args.smoke else args.records
    rows = []
    with tempfile.TemporaryDirectory(prefix="opselect-bench-cache-") as tmp:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OPSELECT_CACHE_DIR": f"{tmp}/cache",
               "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET", "1")}
        size = export_file(Path(tmp, "in.json"), n)
        base, _, _ = run(["--help"], env)
        steps = [("import", ["import", f"{tmp}/in.json"]), ("show", ["show"]),
                 ("show --op topk", ["show", "--op", "topk"]),
                 ("show --limit 0 --op isin", ["show", "--limit", "0", "--op", "isin"]),
                 ("export", ["export", f"{tmp}/out.json"]), ("clear -y", ["clear", "-y"])]
        if args.smoke:
            steps = steps[:3] + steps[4:]
        for name, argv in steps:
            seconds, peak, last = run(argv, env)
            rows.append({"step": name, "seconds": round(seconds, 2), "peak_mib": round(peak),
                         "last_line": last[:120]})
            print(f"{name:28s} {seconds:7.2f} s  (peak {peak:5.0f} MiB)  {last[:90]}")
        out = subprocess.run([sys.executable, "-c", FIRST_CALL], env=env, capture_output=True,
                             text=True, timeout=600, check=True).stdout.split()
        first_ms, again_ms = 1e3 * float(out[0]), 1e3 * float(out[1])
    print(f"(starting python and importing opselect: {base:.2f} s of each step; "
          f"the first plain topk call: {first_ms:.1f} ms, the next {again_ms:.3f} ms)")
    result = {"records": n, "export_bytes": size, "host": host(), "startup_s": round(base, 2),
              "steps": rows,
              "first_call_ms": round(first_ms, 1), "second_call_ms": round(again_ms, 3)}
    text = json.dumps(result, indent=1)
    if not args.no_save and not args.smoke:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "cache.json").write_text(text)
        md = [f"# The tune cache's command line with {n} records ({size >> 20} MiB export)", "",
              f"Each step is one `python -m opselect.cli` process (starting Python and importing "
              f"opselect: {base:.2f} s), on {host()}. The first plain call of a fresh process "
              f"(`ops.topk(torch.randn(4, 256), 8)`, reading the cache once): {first_ms:.0f} ms; "
              f"the next: {1e3 * again_ms:.0f} us.", "",
              "| step | seconds | peak MiB | last line |",
              "|---|---|---|---|"]
        md += [f"| {r['step']} | {r['seconds']} | {r['peak_mib']} | {r['last_line']} |"
               for r in rows]
        (RESULTS / "cache.md").write_text("\n".join(md) + "\n")
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "cache.json").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
