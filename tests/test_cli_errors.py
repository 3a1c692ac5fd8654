"""The command line's answer to ordinary mistakes: one line naming the argument and what was
expected, exit 2 for a usage mistake and 1 for a runtime failure, no traceback unless --debug;
Ctrl-C exits 130 and keeps what finished."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from opselect.cli import main
from opselect.tune_cache import reset, store
from opselect.warm import expand, load_spec

ROOT = Path(__file__).resolve().parent.parent


def one_line(capsys, argv: list[str], code: int) -> str:
    """Run the CLI in this process: the exit code, exactly one line on stderr, no traceback."""
    assert main(argv) == code
    out = capsys.readouterr()
    lines = [line for line in out.err.splitlines() if line.strip()]
    assert len(lines) == 1, out.err
    assert "Traceback" not in out.err + out.out
    return lines[0]


def test_missing_spec_file(capsys):
    line = one_line(capsys, ["warm", "/nonexistent.yaml"], 2)
    assert "/nonexistent.yaml" in line and "No such file" in line


def test_yaml_syntax_error(tmp_path, capsys):
    spec = tmp_path / "bad.yaml"
    spec.write_text("- op: topk\n  shapes: [[4, 8]\n  dtypes: [float32]\n")
    line = one_line(capsys, ["warm", str(spec)], 2)
    assert str(spec) in line and "malformed YAML at line" in line


def test_spec_read_by_its_content_whatever_its_name(tmp_path):
    spec = tmp_path / "spec.txt"
    spec.write_text("- op: topk\n  shapes: [[4, 8]]\n  dtypes: float32\n  options: {k: 2}\n")
    items = list(expand(load_spec(spec)))
    # `dtypes: float32` (a string) is one dtype, not the letters f, l, o, ...
    assert [(i.op, i.shapes, i.dtype) for i in items] == [("topk", [[4, 8]], "float32")]


def test_binary_spec_file(tmp_path, capsys):
    spec = tmp_path / "spec.bin"
    spec.write_bytes(b"\xff\xfe\x00junk")
    assert "not a text file" in one_line(capsys, ["warm", str(spec)], 2)


def test_a_dtype_the_op_does_not_take(capsys):
    line = one_line(capsys, ["warm", "--op", "topk", "--shapes", "4x8", "--opt", "k=2",
                             "--dtype", "complex64"], 2)
    assert "complex64" in line


def test_not_a_dtype(capsys):
    line = one_line(capsys, ["warm", "--op", "topk", "--shapes", "4x8", "--opt", "k=2",
                             "--dtype", "float33"], 2)
    assert "float33" in line and "not a torch dtype" in line


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_device_without_cuda(capsys):
    line = one_line(capsys, ["warm", "--op", "topk", "--shapes", "4x8", "--opt", "k=2",
                             "--device", "cuda"], 2)
    assert "--device cuda" in line and "no CUDA device" in line


def test_nonsense_device(capsys):
    line = one_line(capsys, ["explain", "topk", "--shapes", "4x8", "--opt", "k=2",
                             "--device", "nonsense"], 2)
    assert "--device nonsense" in line and "expected cpu, cuda or cuda:N" in line


def test_negative_dims(capsys):
    line = one_line(capsys, ["warm", "--op", "isin", "--shapes=-5;3"], 2)
    assert "--shapes" in line and "dims must be >= 0" in line


def test_a_shape_too_large_to_allocate(capsys):
    line = one_line(capsys, ["explain", "softmax", "--shapes=1000000000000x1000"], 2)
    assert "GiB" in line and "1000000000000x1000" in line


def test_unknown_op_and_backend(capsys):
    assert "unknown op 'nope'" in one_line(capsys, ["explain", "nope", "--shapes", "3"], 2)
    line = one_line(capsys, ["explain", "topk", "--shapes", "4x8", "--opt", "k=2",
                             "--backend", "nope"], 2)
    assert "unknown backend 'nope'" in line


def test_bad_option_syntax(capsys):
    assert "KEY=VALUE" in one_line(capsys, ["explain", "topk", "--shapes", "4x8", "--opt", "k"],
                                   2)
    assert "--what-if H300" in one_line(capsys, ["explain", "topk", "--shapes", "4x8", "--opt",
                                                 "k=2", "--what-if", "H300"], 2)


def test_comma_list_option_means_a_list(capsys):
    # `--opt dims=1,0` is dims=[1, 0]: explain answers instead of failing
    assert main(["explain", "permute", "--shapes", "50x3", "--dtype", "int64",
                 "--opt", "dims=1,0"]) == 0
    assert "permute" in capsys.readouterr().out


def test_export_to_a_missing_directory(capsys):
    line = one_line(capsys, ["export", "/nonexistent_dir/x.json"], 1)
    assert "/nonexistent_dir/x.json" in line


def test_import_of_a_missing_file(capsys):
    assert "/nonexistent.json" in one_line(capsys, ["import", "/nonexistent.json"], 2)


def test_unknown_flag_is_one_line(capsys):
    line = one_line(capsys, ["show", "--limt", "3"], 2)
    assert "--limt" in line and "--help" in line


def test_debug_shows_the_traceback(capsys):
    with pytest.raises(Exception):
        main(["--debug", "warm", "/nonexistent.yaml"])


@pytest.mark.slow
def test_ctrl_c_on_warm_exits_130_and_keeps_what_finished(tmp_path):
    """SIGINT to `opselect warm` after its first record: exit 130, finished records kept."""
    spec = tmp_path / "spec.yaml"
    # Entries that each need tuning: every one its own shape bucket (3-d shapes, each dim in its
    # own power of two). Entries of one bucket after its first are cache hits that warm passes
    # in a millisecond: 3,000 shapes [[n, 3]] fell in 32 buckets, and warm finished them all
    # (exit 0) while this process was still opening the cache to look for the first record.
    sizes = (2, 4, 8, 16, 32, 64)
    entries = len(sizes) ** 3
    spec.write_text("".join(f"- {{op: permute, shapes: [[{a + 1}, {b + 1}, {c + 1}]], "
                            f"dtypes: [float32], options: {{dims: [2, 0, 1]}}}}\n"
                            for a in sizes for b in sizes for c in sizes))
    env = dict(os.environ, OPSELECT_CACHE_DIR=str(tmp_path / "cache"), PYTHONUNBUFFERED="1",
               PYTHONPATH=str(ROOT))
    if not torch.cuda.is_available():
        env["TRITON_INTERPRET"] = "1"
    # SIGINT at its default in the child, whatever this process has: an ignored SIGINT is
    # inherited, and Python then keeps ignoring it (a CI run's warm went on to exit 0 so once).
    proc = subprocess.Popen([sys.executable, "-m", "opselect.cli", "warm", str(spec)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 240
    done = 0
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
            done = _records(tmp_path / "cache")
            if done >= 1:
                break
        assert done >= 1, "no record was written in time"
        # Again until it ends: a SIGINT that lands inside a cache statement is swallowed by
        # sqlite3 (the known bug that tests/test_cache_security.py's xfail test shows).
        # (5 s apart: a second one while warm exits would interrupt its exit)
        for _ in range(24):
            proc.send_signal(signal.SIGINT)
            try:
                out, err = proc.communicate(timeout=5)
                break
            except subprocess.TimeoutExpired:
                continue
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (out.decode()[-2000:], err.decode()[-2000:])
    assert b"Traceback" not in out + err
    assert b"interrupted" in out + err
    kept = _records(tmp_path / "cache")
    assert 1 <= kept < entries  # what finished is kept; the interrupt ended the rest


def _records(directory: Path) -> int:
    """Tune records in the cache at `directory` (read by this process, as another would)."""
    before = os.environ.get("OPSELECT_CACHE_DIR")
    os.environ["OPSELECT_CACHE_DIR"] = str(directory)
    try:
        reset()
        if not (directory / "tune.sqlite3").exists():
            return 0
        return sum(1 for _ in store().records())
    finally:
        reset()
        if before is None:
            os.environ.pop("OPSELECT_CACHE_DIR", None)
        else:
            os.environ["OPSELECT_CACHE_DIR"] = before
