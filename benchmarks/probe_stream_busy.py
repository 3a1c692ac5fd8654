"""Could an eager routed call tell, from the stream, whether its host time counts? At every
softmax and copying contiguous() of two eager Hugging Face models (Llama-3-8B's shape with 8
layers, GPT-2), per phase: the share of calls that find the stream still busy (cudaStreamQuery:
the device behind the host, so a call's host time would be hidden), what the query costs the
host there, and the phase's host time to issue against its wall time (host-bound where they
match). Routing is off: this reads the program, not opselect. GPU only.

    python benchmarks/probe_stream_busy.py      # $OUT/stream_busy_probe.json
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_model  # noqa: E402

PHASES = (("forward", 1), ("forward", 8), ("forward", 64), ("decode-topk", 1),
          ("decode-topk", 64), ("forward-long", 8))
CALLS_PER_PHASE = 5


class Probe:
    """F.softmax and Tensor.contiguous (of a view that copies) replaced by versions that first
    ask the current stream whether it is still busy."""

    def __init__(self) -> None:
        self.busy: list[bool] = []
        self.query_ns: list[int] = []
        self.softmax, self.contiguous = F.softmax, torch.Tensor.contiguous

    def _ask(self) -> None:
        stream = torch.cuda.current_stream()
        start = time.perf_counter_ns()
        done = stream.query()
        self.query_ns.append(time.perf_counter_ns() - start)
        self.busy.append(not done)

    def __enter__(self) -> "Probe":
        softmax, contiguous = self.softmax, self.contiguous

        def probed_softmax(*args, **kwargs):
            self._ask()
            return softmax(*args, **kwargs)

        def probed_contiguous(tensor, *args, **kwargs):
            if not tensor.is_contiguous():
                self._ask()
            return contiguous(tensor, *args, **kwargs)

        F.softmax, torch.Tensor.contiguous = probed_softmax, probed_contiguous
        return self

    def __exit__(self, *exc) -> None:
        F.softmax, torch.Tensor.contiguous = self.softmax, self.contiguous


def main() -> None:
    device = torch.device("cuda")
    found = {}
    for kind, dtype in (("llama3-8b", torch.bfloat16), ("gpt2", torch.float16)):
        model = bench_model.build(kind, 8 if kind == "llama3-8b" else None, False, device, dtype)
        for phase, batch in PHASES:
            call = bench_model.workload(model, phase, batch, 128, device)
            call()
            call()
            torch.cuda.synchronize()
            with Probe() as probe:
                start = time.perf_counter()
                for _ in range(CALLS_PER_PHASE):
                    call()
                host = (time.perf_counter() - start) / CALLS_PER_PHASE
                torch.cuda.synchronize()
                wall = (time.perf_counter() - start) / CALLS_PER_PHASE
            row = {"busy": round(sum(probe.busy) / max(1, len(probe.busy)), 3),
                   "calls": len(probe.busy) // CALLS_PER_PHASE,
                   "query_us": round(statistics.median(probe.query_ns) / 1e3, 2),
                   "host_ms": round(host * 1e3, 2), "wall_ms": round(wall * 1e3, 2)}
            found[f"{kind} b{batch} {phase}"] = row
            print(f"{kind} b{batch} {phase}", row, flush=True)
        del model
        torch.cuda.empty_cache()
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "stream_busy_probe.json").write_text(json.dumps(found, indent=1))


if __name__ == "__main__":
    main()
