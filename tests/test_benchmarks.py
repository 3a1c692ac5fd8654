"""Every benchmark script runs (tiny --smoke cases through the interpreter): scripts that only run
on the GPU machine must not rot between GPU sessions."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted(p.name for p in (ROOT / "benchmarks").glob("bench_*.py"))


@pytest.mark.parametrize("script", SCRIPTS)
def test_benchmark_script_smoke(script, tmp_path, cpu_triton):
    env = {**os.environ, "TRITON_INTERPRET": "1", "OPSELECT_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": str(ROOT), "OUT": str(tmp_path)}
    args = [sys.executable, str(ROOT / "benchmarks" / script), "--smoke"]
    if script != "bench_dispatch.py":
        args.append("--no-save")
    result = subprocess.run(args, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "!!" not in result.stdout, result.stdout[-3000:]  # a provider was wrong or failed
    assert list(tmp_path.glob("*.json")), "the script wrote no JSON under $OUT"
