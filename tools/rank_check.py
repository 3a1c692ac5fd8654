"""Two ranks, tuning on, real measurements: do they choose alike before and after sync()?

    torchrun --nproc-per-node 2 tools/rank_check.py [--out results.json]

Each rank tunes the same 24 calls (isin, softmax, permute, topk) on its own GPU with its own tune
cache, then counts the keys the ranks chose differently, calls opselect.distributed.sync() and
assert_consistent(). Rank 0 prints a summary and writes it as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import torch
import torch.distributed as dist


def calls(device):
    g = torch.Generator(device=device).manual_seed(0)
    for m in (1000, 30000, 200000, 1_000_000):
        for n in (16, 1000):
            yield "isin", (torch.randint(0, 10 * n, (m,), device=device, generator=g),
                           torch.randint(0, 10 * n, (n,), device=device, generator=g)), {}
    for rows, cols in ((64, 512), (2048, 3000), (8, 32000), (4096, 1024), (1, 100000),
                       (512, 4096)):
        yield "softmax", (torch.randn(rows, cols, device=device, generator=g), -1), {}
    for shape, dims in (((64, 197, 12, 64), (0, 2, 1, 3)), ((2048, 2048), (1, 0)),
                        ((32, 224, 224, 3), (0, 3, 1, 2)), ((50000, 3), (1, 0))):
        yield "permute", (torch.randn(shape, device=device, generator=g), dims), {}
    for rows, cols, k in ((64, 32000, 50), (1, 1 << 20, 64), (4096, 1024, 8), (16, 4096, 256),
                          (256, 128000, 1), (8, 65536, 1024)):
        yield "topk", (torch.randn(rows, cols, device=device, generator=g), k), {}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "ranks.json"))
    args = p.parse_args()
    rank = int(os.environ["RANK"])
    os.environ["OPSELECT_CACHE_DIR"] = tempfile.mkdtemp(prefix=f"rank{rank}-")
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dist.init_process_group("nccl")
    import opselect
    from opselect import distributed, ops

    device = torch.device("cuda", torch.cuda.current_device())
    started = time.monotonic()
    with opselect.tuning():
        for name, a, kw in calls(device):
            getattr(ops, name)(*a, **kw)
    torch.cuda.synchronize()
    tuned_s = time.monotonic() - started
    keys = sum(len(v) for v in distributed.decisions().values())
    try:
        distributed.assert_consistent()
        before = "consistent"
    except distributed.InconsistentChoices as exc:
        before = str(exc)
    agreed = distributed.sync()
    distributed.assert_consistent()
    after = distributed.decisions()
    if rank == 0:
        summary = {"gpus": dist.get_world_size(), "device": torch.cuda.get_device_name(),
                   "keys": keys, "agreed": agreed, "before_sync": before, "tuning_s": tuned_s,
                   "after_sync": after}
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=1)
        print(f"keys {keys}, agreed {agreed}; before sync: {before[:400]}")
        print("after sync: assert_consistent passed")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
