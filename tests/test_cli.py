"""The `opselect` command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import opselect
from conftest import fake_timing
from opselect import warm as warm_mod
from opselect.cli import main

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def fake_measure(monkeypatch):
    times = {"torch": 5e-3, "compare": 4e-3, "search": 1e-3, "hash": 2e-3, "cuckoo": 2.2e-3,
             "bitmap": 3e-3}
    fake_timing(monkeypatch, lambda what: times.get(what.split("/")[1].split()[0], 1.0))
    return times


def run_cli(capsys, *argv) -> tuple[int, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out + out.err


@pytest.mark.parametrize("sub", ["", "warm", "show", "explain", "calibrate", "clear", "export",
                                 "import", "demo"])
def test_help_reads_well(sub, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([sub, "--help"] if sub else ["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert "usage: opselect" in text and len(text) > 200
    if not sub:
        for cmd in ("warm", "show", "explain", "calibrate", "clear", "export", "import", "demo"):
            assert cmd in text


@pytest.mark.slow
def test_warm_from_spec_files_then_show_export_import_clear(tmp_path, capsys, cpu_triton,
                                                            fake_measure, monkeypatch):
    spec_yaml = tmp_path / "spec.yaml"
    spec_yaml.write_text(
        "- op: isin\n"
        "  cases: [[[300], [16]], [[2000], [40]]]\n"
        "  dtypes: [int32, int64]\n"
        "  options: {values: narrow}\n")
    spec_json = tmp_path / "spec.json"
    spec_json.write_text(json.dumps([{"op": "isin", "shapes": [[100], [8]], "dtype": "float32"}]))
    code, out = run_cli(capsys, "warm", str(spec_yaml), str(spec_json))
    assert code == 0
    assert "isin 300 16 int32 values=narrow" in out and "search" in out and "5.00x" in out
    code, out = run_cli(capsys, "show")
    assert code == 0 and "5 tune record(s)" in out
    assert opselect.explain("isin", torch.arange(300, dtype=torch.int32),
                            torch.arange(16, dtype=torch.int32), show=False).source == "cache"
    exported = tmp_path / "tuned.json"
    assert run_cli(capsys, "export", str(exported))[0] == 0
    code, out = run_cli(capsys, "clear", "--yes")
    assert code == 0 and "deleted 5 entries" in out
    code, out = run_cli(capsys, "import", str(exported))
    assert code == 0 and "imported 5 entries" in out
    code, out = run_cli(capsys, "clear", "--op", "isin", "-y")
    assert "deleted 5" in out


def test_warm_from_flags(capsys, cpu_triton, fake_measure):
    code, out = run_cli(capsys, "warm", "--op", "isin", "--shapes", "500;10", "--shapes", "64;3",
                        "--dtype", "int16", "--opt", "invert=true")
    assert code == 0 and "isin 500 10 int16 invert=True" in out and "isin 64 3" in out


def test_warm_interrupted_keeps_what_finished(tmp_path, capsys, cpu_triton, fake_measure,
                                              monkeypatch):
    real = warm_mod.warm_item
    calls = []

    def flaky(item, device=None):
        calls.append(item)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(item, device)

    monkeypatch.setattr(warm_mod, "warm_item", flaky)
    code, out = run_cli(capsys, "warm", "--op", "isin", "--shapes", "300;16", "--shapes",
                        "3000;16", "--dtype", "int32")
    assert code == 130 and "interrupted: 1 of 2" in out  # 128 + SIGINT, as a shell reports
    assert run_cli(capsys, "show")[1].count("tune record(s)") == 1
    assert "1 tune record(s)" in run_cli(capsys, "show")[1]


def test_bad_specs_give_clear_errors(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"op": "nope", "shapes": [[3]]}]))
    code, out = run_cli(capsys, "warm", str(bad))
    assert code == 2 and "unknown op 'nope'" in out
    bad.write_text(json.dumps([{"op": "isin", "shape": [[3]]}]))
    code, out = run_cli(capsys, "warm", str(bad))
    assert code == 2 and "unknown keys ['shape']" in out
    bad.write_text(json.dumps([{"op": "isin", "shapes": [[3], [4]], "dtypes": ["int33"]}]))
    code, out = run_cli(capsys, "warm", str(bad))
    assert code == 2 and "dtype 'int33': not a torch dtype" in out
    code, out = run_cli(capsys, "warm", "--op", "isin", "--shapes", "3xq")
    assert code == 2 and "bad shape '3xq'" in out


def test_explain_and_what_if(capsys, cpu_triton):
    code, out = run_cli(capsys, "explain", "isin", "--shapes", "1000;30", "--dtype", "int64")
    assert code == 0 and "choice:" in out and "bitmap" in out
    code, out = run_cli(capsys, "explain", "isin", "--shapes", "16777216;1024", "--dtype", "int32",
                        "--what-if", "H200")
    assert code == 0 and "H200" in out and "choice: " in out
    assert "choice: torch" not in out  # a GPU would not pick torch for this


@pytest.mark.slow  # (make test-all; see the Makefile)
def test_demo_runs_as_a_new_user_would(tmp_path):
    env = {**os.environ, "TRITON_INTERPRET": "1", "OPSELECT_CACHE_DIR": str(tmp_path / "c"),
           "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-m", "opselect.cli", "demo"], env=env,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-2000:]
    for part in ("1. Automatic choice", "2. A forced backend", "3. A forced backend that cannot",
                 "4. Tuning", "5. What the cost model picks on an H200", "decided earlier by tuning"):
        assert part in result.stdout, part
