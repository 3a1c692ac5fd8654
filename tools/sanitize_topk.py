"""The GPU topk sweep of tests/test_topk_sweep.py as a plain script, to run under compute-sanitizer:

    compute-sanitizer --tool memcheck --print-limit 20 python3 tools/sanitize_topk.py [--quick]

Every backend but torch and sort, rows of 1..1100 elements, k across the row, float32 and int32,
largest and smallest, inputs at the end of a NaN-poisoned buffer. Prints one line per failure and a
summary; exits 1 on any failure.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from test_topk_sweep import BACKENDS, _pairs_gpu, check_one  # noqa: E402


def main() -> int:
    quick = "--quick" in sys.argv
    pairs = _pairs_gpu(full=not quick)
    seeds = range(1 if quick else 3)
    runs = failures = 0
    for backend in BACKENDS:
        for seed in seeds:
            for n, k in pairs:
                for dtype in (torch.float32, torch.int32):
                    for largest in (True, False):
                        runs += 1
                        err = check_one(n, k, dtype, largest, backend, "cuda", seed)
                        if err:
                            failures += 1
                            print(err, flush=True)
    torch.cuda.synchronize()
    print(f"sanitize_topk: {runs} calls, {failures} wrong, backends {', '.join(BACKENDS)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
