"""Rank-consistent choices: a real two-process torch.distributed job (gloo, the CPU, the Triton
interpreter), each rank with its own tune cache and its own measurements."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from opselect.dispatch.device import INTERPRETED

HERE = Path(__file__).resolve().parent


@pytest.mark.slow  # (make test-all; see the Makefile)
@pytest.mark.skipif(not INTERPRETED, reason="interpreter run (ranks on the CPU)")
def test_two_ranks_agree_after_sync(tmp_path):
    init = tmp_path / "init"
    procs = []
    for rank in range(2):
        env = dict(os.environ, OPSELECT_CACHE_DIR=str(tmp_path / f"cache-{rank}"),
                   TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join(
                       [str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
        procs.append(subprocess.Popen(
            [sys.executable, str(HERE / "distributed_worker.py"), str(rank), "2", str(init),
             str(tmp_path / f"out-{rank}.json")], env=env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True))
    for p in procs:
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0, out[-3000:]
    r0, r1 = (json.loads((tmp_path / f"out-{r}.json").read_text()) for r in range(2))
    # Before: rank 0 chose search, rank 1 hash, for the same key; assert_consistent names it.
    assert not r0["consistent_before"] and not r1["consistent_before"]
    assert "rank 0 search" in r0["message"] and "rank 1 hash" in r0["message"]
    # After: the same choices everywhere, the slowest-rank times deciding (search: worst 1.0 ms,
    # hash: worst 1.2 ms), and rank 0 knows the key only rank 1 saw.
    assert r0["after"] == r1["after"]
    assert r0["agreed"] == r1["agreed"] == 2
    assert r0["runs"] == r1["runs"] == "search"
    assert len(r0["after"]["isin"]) == 2 and len(r0["before"]["isin"]) == 1
    assert r0["ok"] and r1["ok"]


@pytest.mark.slow  # (make test-all; see the Makefile)
@pytest.mark.skipif(not INTERPRETED, reason="interpreter run (shards on the CPU)")
def test_sharded_warm_imports_every_shard(tmp_path):
    """`opselect warm --shards 2`: two worker processes, each with its share of the items and a
    private cache; the parent imports both into the user's cache (validated) and says so."""
    spec = tmp_path / "spec.yaml"
    spec.write_text("- op: isin\n  cases: [[[100], [8]], [[200], [9]], [[300], [5]]]\n"
                    "  dtypes: [int32]\n")
    env = dict(os.environ, OPSELECT_CACHE_DIR=str(tmp_path / "cache"), TRITON_INTERPRET="1",
               PYTHONPATH=os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, "-m", "opselect.cli", "warm", "--shards", "2",
                          str(spec)], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "2 shard(s) warmed 3 item(s)" in run.stdout and "3 record(s) imported" in run.stdout
    show = subprocess.run([sys.executable, "-m", "opselect.cli", "show"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert "3 tune record(s)" in show.stdout
    bad = subprocess.run([sys.executable, "-m", "opselect.cli", "warm", "--shards", "0",
                          str(spec)], env=env, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "--shards" in bad.stderr


_LAZY_CHECK = """
import sys
import torch
before = set(sys.modules)  # (a plain `import torch` may import torch.distributed itself)
import opselect
added = sorted(m for m in set(sys.modules) - before
               if m == "torch.distributed" or m.startswith("torch.distributed."))
assert not added, f"import opselect imported {added}"
assert "opselect.distributed" not in sys.modules and "opselect.cli" not in sys.modules
assert {"cli", "distributed"} <= set(dir(opselect))
assert callable(opselect.distributed.assert_consistent) and callable(opselect.distributed.sync)
assert callable(opselect.cli.main)
assert sys.modules["opselect.distributed"] is opselect.distributed
try:
    opselect.no_such_submodule
except AttributeError:
    pass
else:
    raise AssertionError("opselect.no_such_submodule did not raise AttributeError")
print("ok")
"""


@pytest.mark.slow
def test_submodules_are_attributes_imported_on_first_access(tmp_path):
    """`import opselect; opselect.distributed.assert_consistent(...)` works without an import of
    opselect.distributed, and `import opselect` itself imports neither it nor torch.distributed
    (beyond what `import torch` imports): a fresh interpreter, so no other test's import counts."""
    env = dict(os.environ, OPSELECT_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, "-c", _LAZY_CHECK], env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stdout + run.stderr
