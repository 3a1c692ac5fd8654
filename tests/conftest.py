"""Shared test set-up.

Without a GPU, Triton kernels run on the CPU through Triton's interpreter: TRITON_INTERPRET must be
set before triton is first imported, so it is set here, before anything imports opselect. With a GPU
the kernels are compiled, the CPU-interpreter tests skip themselves, and the tests marked `gpu` run.

Every test gets its own empty tune cache and a clean in-process memo.
"""

from __future__ import annotations

import os

import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

import opselect  # noqa: E402
from opselect.dispatch.device import INTERPRETED  # noqa: E402
from opselect.tune_cache import reset as reset_cache  # noqa: E402


def pytest_addoption(parser):
    parser.addoption("--fuzz-examples", type=int, default=None,
                     help="examples per test in tests/test_fuzz.py (a long local run: 2000)")


def pytest_configure(config):
    n = config.getoption("--fuzz-examples")
    if n:
        os.environ["OPSELECT_FUZZ_EXAMPLES"] = str(n)


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    """A private tune cache directory and a clean memo for every test."""
    monkeypatch.setenv("OPSELECT_CACHE_DIR", str(tmp_path / "tune-cache"))
    monkeypatch.delenv("OPSELECT_TUNE", raising=False)
    reset_cache()
    opselect.forget()
    yield tmp_path / "tune-cache"
    reset_cache()
    opselect.forget()


def interpreter_device() -> str:
    """The device CPU tests run Triton kernels on; skips the test when kernels are compiled."""
    if not INTERPRETED:
        pytest.skip("Triton interpreter tests (run without a GPU, TRITON_INTERPRET=1)")
    return "cpu"


@pytest.fixture
def cpu_triton() -> str:
    return interpreter_device()


@pytest.fixture
def fake_measure(monkeypatch):
    """Tuning without real timing: isin's search is fastest, every backend measured, and the
    records carry the real source hashes."""
    times = {"torch": 5e-3, "compare": 4e-3, "search": 1e-3, "hash": 2e-3, "cuckoo": 2.2e-3,
             "bitmap": 3e-3}
    fake_timing(monkeypatch, lambda what: times[what.split("/")[1].split()[0]])
    return times


def fake_timing(monkeypatch, seconds_of) -> None:
    """Both stages of tuning's measuring (each configuration, then the candidates in turns)
    answer seconds_of(what) ("op/backend {config}") instead of running anything."""
    from opselect.dispatch import tuning_mode

    monkeypatch.setattr(tuning_mode, "measure_safely",
                        lambda fn, device, what, **kw: seconds_of(what))
    monkeypatch.setattr(tuning_mode, "time_interleaved",
                        lambda items, device, **kw: [(seconds_of(what),) * 2 for what, _fn in items])


@pytest.fixture
def cuda() -> str:
    if not HAS_CUDA:
        pytest.skip("needs a CUDA device")
    return "cuda"
