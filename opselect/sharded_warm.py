"""`opselect warm --shards N` (alias --gpus N): a spec warmed by N processes, one per GPU.

The spec's items are dealt round-robin to N worker processes (`opselect warm` on a shard of
the items; with CUDA each sees one GPU through CUDA_VISIBLE_DEVICES). Each worker writes its
measurements to a private cache directory as it goes, so nothing contends for the user's cache;
when the workers end (or are interrupted: Ctrl-C stops them and keeps what finished), this
process exports every private cache and imports it into the user's cache, each file validated as
`opselect import` validates it: one process writes. Shard 0's progress is shown; the others' go
to their logs, named if a worker fails.

Under torchrun (`torchrun --nproc-per-node N -m opselect.cli warm spec.yaml`, WORLD_SIZE > 1),
each rank warms its own shard on its local GPU into a private cache, then the ranks' exports are
gathered (JSON text over torch.distributed, no pickle) and rank 0 imports them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .errors import CacheError, UsageError


def item_entry(item: Any) -> dict[str, Any]:
    """A warm item as a one-item spec entry."""
    return {"op": item.op, "shapes": item.shapes, "dtypes": [item.dtype],
            "options": dict(item.options)}


def _import_private(directory: Path, work: Path, label: str) -> int:
    """Export the private cache at directory and import it into the user's cache."""
    from .tune_cache import store
    from .tune_cache.storage import TuneStore
    from .tune_cache.transfer import export_file

    if not directory.exists():
        return 0
    private = TuneStore(directory, read_only=True)
    exported = work / f"{label}.json"
    try:
        n = export_file(private, exported)
    finally:
        private.close()
    if n == 0:
        return 0
    imported, _skipped = store().local.patient().import_(exported)
    return imported


def run_shards(items: list[Any], shards: int, device: str | None, console: Any) -> int:
    """Warm items over `shards` worker processes; returns the exit code."""
    import torch

    if shards < 1:
        raise UsageError(f"--shards: expected a whole number >= 1, got {shards}")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device not in (None, "cpu") and gpus and shards > gpus:
        raise UsageError(f"--shards {shards}: this machine has {gpus} GPU(s)")
    work = Path(tempfile.mkdtemp(prefix="opselect-warm-"))
    procs: list[tuple[int, subprocess.Popen, Path]] = []
    started = time.monotonic()
    interrupted = False
    try:
        for i in range(shards):
            part = items[i::shards]
            if not part:
                continue
            spec = work / f"shard{i}.json"
            spec.write_text(json.dumps([item_entry(it) for it in part]))
            env = dict(os.environ, OPSELECT_CACHE_DIR=str(work / f"cache{i}"))
            cmd = [sys.executable, "-m", "opselect.cli", "warm", str(spec)]
            if gpus and device != "cpu":
                env["CUDA_VISIBLE_DEVICES"] = str(i % gpus)
                cmd += ["--device", "cuda"]
            elif device:
                cmd += ["--device", device]
            log = work / f"shard{i}.log"
            out = None if i == 0 else open(log, "w")  # shard 0 shows its progress
            procs.append((i, subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT
                                              if out else None), log))
        failed = []
        for i, proc, log in procs:
            if proc.wait() not in (0,):
                failed.append((i, proc.returncode, log))
    except KeyboardInterrupt:
        interrupted = True
        for _i, proc, _log in procs:
            proc.terminate()
        for _i, proc, _log in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        failed = []
    took = time.monotonic() - started
    total = 0
    for i, _proc, _log in procs:
        try:
            total += _import_private(work / f"cache{i}", work, f"shard{i}")
        except (CacheError, UsageError) as exc:
            console.print(f"[red]shard {i}: its records could not be imported: {exc}[/red]")
            failed.append((i, 1, work / f"shard{i}.log"))
    console.print(f"{len(procs)} shard(s) warmed {len(items)} item(s) in {took:.1f} s; "
                  f"{total} record(s) imported into the cache")
    for i, code, log in failed:
        console.print(f"[red]shard {i} exited with {code}; its log: {log}[/red]")
    if interrupted:
        return 130
    return 1 if failed else 0


def run_torchrun(items: list[Any], device: str | None, console: Any) -> int:
    """This rank's share of a torchrun warm; rank 0 imports every rank's records."""
    import torch
    import torch.distributed as dist

    from .distributed import _all_gather_text
    from .tune_cache.storage import TuneStore
    from .tune_cache.transfer import export_file

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    if torch.cuda.is_available() and device != "cpu":
        torch.cuda.set_device(local % torch.cuda.device_count())
    from .warm import parse_device, warm_item

    here = parse_device(device) if device else (
        torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available()
        else torch.device("cpu"))
    work = Path(tempfile.mkdtemp(prefix=f"opselect-warm-rank{rank}-"))
    own = os.environ.get("OPSELECT_CACHE_DIR")
    os.environ["OPSELECT_CACHE_DIR"] = str(work / "cache")
    from .tune_cache import reset

    reset()
    part = items[rank::world]
    started = time.monotonic()
    for n, item in enumerate(part, 1):
        warm_item(item, here)
        if rank == 0:
            console.print(f"rank 0: {n}/{len(part)} {item.label()}")
    reset()
    private = TuneStore(work / "cache", read_only=True)
    exported = work / "export.json"
    try:
        export_file(private, exported)
    finally:
        private.close()
    texts = _all_gather_text(exported.read_text(), None)
    if own is None:
        os.environ.pop("OPSELECT_CACHE_DIR", None)
    else:
        os.environ["OPSELECT_CACHE_DIR"] = own
    reset()
    if rank == 0:
        from .tune_cache import store

        total = 0
        for r, text in enumerate(texts):
            path = work / f"rank{r}.json"
            path.write_text(text)
            total += store().local.patient().import_(path)[0]
        console.print(f"{world} rank(s) warmed {len(items)} item(s) in "
                      f"{time.monotonic() - started:.1f} s; {total} record(s) imported")
    dist.barrier()
    return 0
