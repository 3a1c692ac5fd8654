"""The plug-in API (opselect/extend.py, docs/EXTENDING.md): examples/vector_add.py, a new op from
outside opselect, and examples/isin_broadcast.py, a backend added to isin, on the CPU through the
interpreter. Each example is imported for the tests that use it and unregistered afterwards: an
xdist worker runs other modules' tests before and after these, which must see opselect's own ops
and backends only."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import opselect
from opselect.dispatch.source_hash import backend_roots, closure
from opselect.errors import BackendError, InvalidArgument, UnsupportedDType
from opselect.kernels import _common

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _imported(name: str, unregister):
    """Yield the example module `name`, imported from examples/ (on sys.path, where tuning's
    helper process finds it too); then unregister() what it registered, and forget the module."""
    sys.path.insert(0, str(EXAMPLES))
    try:
        yield importlib.import_module(name)
    finally:
        try:
            unregister()
        finally:
            sys.modules.pop(name, None)
            sys.path.remove(str(EXAMPLES))


@pytest.fixture(scope="module")
def vector_add():
    yield from _imported("vector_add", lambda: opselect.unregister_op("vector_add"))


@pytest.fixture(scope="module")
def broadcast():
    yield from _imported("isin_broadcast", lambda: opselect.remove_backend("isin", "broadcast"))


@pytest.fixture
def poisoned(monkeypatch):
    """Outputs made by opselect.allocator start as NaN: an element a kernel misses shows."""
    monkeypatch.setattr(_common, "POISON", float("nan"))


@pytest.mark.slow
def test_the_example_runs_as_a_program(cpu_triton, tmp_path):
    env = dict(os.environ, TRITON_INTERPRET="1", OPSELECT_CACHE_DIR=str(tmp_path / "cache"))
    out = subprocess.run([sys.executable, str(EXAMPLES / "vector_add.py")], env=env,
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert all(name in out.stdout for name in ("torch", "plain", "persistent")), out.stdout


@pytest.mark.parametrize("backend", [None, "torch", "plain", "persistent"])
@pytest.mark.parametrize("shape, dtype", [((1000,), torch.float32), ((33, 70), torch.float16),
                                          ((5, 4099), torch.bfloat16), ((0, 3), torch.float32)])
def test_every_backend_matches_torch(cpu_triton, vector_add, poisoned, backend, shape, dtype):
    g = torch.Generator().manual_seed(hash((shape, str(dtype))) & 0xFFFF)
    a, b = (torch.randn(shape, generator=g).to(dtype) for _ in range(2))
    got = vector_add.vector_add(a, b, backend=backend)
    assert got.shape == a.shape and got.dtype == dtype
    # Triton's interpreter rounds float32 -> bfloat16 toward zero (a GPU to nearest, as torch
    # does): one bfloat16 ulp apart there, exact everywhere else.
    ulp = 2**-7 if dtype is torch.bfloat16 and backend in ("plain", "persistent") else 0.0
    torch.testing.assert_close(got, a + b, rtol=ulp, atol=0)


def test_non_contiguous_inputs(cpu_triton, vector_add, poisoned):
    a, b = torch.randn(70, 40).t(), torch.randn(40, 140)[:, ::2]
    for backend in ("plain", "persistent"):
        torch.testing.assert_close(vector_add.vector_add(a, b, backend=backend), a + b,
                                   rtol=0, atol=0)


def test_mismatched_calls_name_the_argument(vector_add):
    a = torch.randn(4)
    with pytest.raises(InvalidArgument, match=r"vector_add: b is \(3,\)"):
        vector_add.vector_add(a, torch.randn(3))
    with pytest.raises(InvalidArgument, match="b is .*float64"):
        vector_add.vector_add(a, a.double())
    with pytest.raises(UnsupportedDType, match="a must be a floating-point tensor"):
        vector_add.vector_add(torch.arange(4), a)
    with pytest.raises(BackendError, match="unknown backend 'nope'"):
        vector_add.vector_add(a, a, backend="nope")


def test_explain_lists_every_backend(cpu_triton, vector_add):
    a = torch.randn(300)
    decision = opselect.explain("vector_add", a, a, show=False)
    assert [c.name for c in decision.candidates] == ["torch", "plain", "persistent"]
    assert decision.choice == "torch"  # the interpreter is far slower than torch's CPU add
    assert opselect.explain("vector_add", a, a, backend="plain", show=False).choice == "plain"


@pytest.mark.slow
def test_tuning_records_the_user_op(cpu_triton, vector_add, isolated_cache):
    from opselect.tune_cache import store

    op = opselect.get_op("vector_add")
    a, b = torch.randn(2000), torch.randn(2000)
    with opselect.tuning():
        torch.testing.assert_close(op(a, b), a + b, rtol=0, atol=0)
    call = op.prepare(a, b)
    hashes = {backend.name: backend.source_hash for backend in op.backends}
    timings = store().get_timings("vector_add", call.info, call.key[1:], hashes)
    assert set(timings) == {"torch", "plain", "persistent"}, timings
    assert all(seconds > 0 for seconds, *_ in timings.values())
    opselect.forget()
    assert opselect.explain("vector_add", a, b, show=False).source == "cache"


def test_a_user_backend_is_hashed_from_its_module(cpu_triton, vector_add):
    plain, persistent = (opselect.get_op("vector_add").backend(n) for n in ("plain", "persistent"))
    assert {"vector_add._add_block", "vector_add._add_persistent"} <= set(
        closure(backend_roots(plain)))
    assert len({plain.source_hash, persistent.source_hash}) == 2


def test_editing_a_user_kernel_changes_its_hash(cpu_triton, tmp_path):
    """A plug-in's tune records are trusted only while its kernels are unchanged."""
    source = (EXAMPLES / "vector_add.py").read_text()
    edited = source.replace("offsets < n\n", "offsets < n  # edited\n", 1)
    assert edited != source
    hashes = []
    for text in (source, edited, source):
        path = tmp_path / "plugin_copy.py"
        path.write_text(text.replace('NAME = "vector_add"', 'NAME = "vector_add_copy"'))
        spec = importlib.util.spec_from_file_location("plugin_copy", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules["plugin_copy"] = module
        try:
            spec.loader.exec_module(module)
            hashes.append(module.Plain().source_hash)
        finally:
            sys.modules.pop("plugin_copy", None)
            opselect.unregister_op("vector_add_copy")
    assert hashes[0] != hashes[1] and hashes[0] == hashes[2]


def test_registering_refuses_clashes(vector_add):
    op = opselect.get_op("vector_add")
    with pytest.raises(BackendError, match="'vector_add' is registered already"):
        opselect.register_op(opselect.Op("vector_add", op.prepare, op.backends[:1]))
    with pytest.raises(BackendError, match="'isin' is registered already .*opselect's own"):
        opselect.register_op(opselect.Op("isin", op.prepare, op.backends[:1]))
    with pytest.raises(BackendError, match="plain identifier"):
        opselect.register_op(opselect.Op("vector|add", op.prepare, op.backends[:1]))
    with pytest.raises(BackendError, match="'plain' exists already"):
        opselect.register_op(opselect.Op("other_add", op.prepare,
                                         [op.backends[0], vector_add.Plain(), vector_add.Plain()]))
    assert "other_add" not in {o.name for o in opselect.dispatch.all_ops()}
    with pytest.raises(BackendError, match="one of opselect's own ops"):
        opselect.unregister_op("isin")


def test_a_backend_added_to_isin(cpu_triton, broadcast, poisoned):
    a = torch.randint(-30, 30, (7, 90))
    t = torch.randint(-30, 30, (2, 5))
    for invert in (False, True):
        want = torch.isin(a, t, invert=invert)
        assert torch.equal(opselect.ops.isin(a, t, invert=invert, backend="broadcast"), want)
        assert torch.equal(opselect.ops.isin(a.t(), t, invert=invert, backend="broadcast"),
                           want.t())
    assert torch.equal(opselect.ops.isin(a[:0], t, backend="broadcast"), torch.isin(a[:0], t))
    decision = opselect.explain("isin", a, t, show=False)
    assert decision.candidate("broadcast").supported
    assert decision.candidate("broadcast").predicted_s > 0
    too_wide = opselect.explain("isin", a, torch.arange(100), show=False)
    assert "more than 64" in too_wide.candidate("broadcast").verdict
    with pytest.raises(BackendError, match="cannot take this call.*int32 and int64 only"):
        opselect.ops.isin(a.float(), t.float(), backend="broadcast")


def test_adding_a_clashing_backend_is_refused(broadcast):
    with pytest.raises(BackendError, match="'broadcast' exists already"):
        opselect.add_backend("isin", broadcast.Broadcast())
    hash_named = type("Hash", (broadcast.Broadcast,), {"name": "hash"})
    with pytest.raises(BackendError, match="'hash' exists already"):
        opselect.add_backend("isin", hash_named())
    with pytest.raises(BackendError, match="reserved"):
        opselect.add_backend("isin", type("Auto", (broadcast.Broadcast,), {"name": "auto"})())
    with pytest.raises(BackendError, match="not one a plug-in added"):
        opselect.remove_backend("isin", "hash")


def test_a_backend_without_a_cost_is_left_to_tuning(cpu_triton, broadcast):
    """No estimate: the model knows nothing of it (explain says 'unknown'), so the cold choice
    is another backend's; forcing it works."""
    class Unpriced(broadcast.Broadcast):
        name = "unpriced"
        estimate = None

    opselect.add_backend("isin", Unpriced())
    try:
        a, t = torch.randint(0, 9, (50,)), torch.arange(4)
        decision = opselect.explain("isin", a, t, show=False)
        assert decision.choice != "unpriced"
        assert "unknown" in [row for row in decision.rows() if row[1] == "unpriced"][0]
        assert torch.equal(opselect.ops.isin(a, t, backend="unpriced"), torch.isin(a, t))
    finally:
        opselect.remove_backend("isin", "unpriced")


@pytest.mark.slow
def test_tuning_measures_a_backend_added_to_isin(cpu_triton, broadcast, isolated_cache):
    """Tuning's first runs happen in a helper process, which imports the plug-in's module too
    (it would otherwise lack the backend, and rank it as failed)."""
    from opselect.tune_cache import store

    op = opselect.get_op("isin")
    a, t = torch.randint(0, 40, (256,), dtype=torch.int32), torch.arange(0, 40, 3,
                                                                         dtype=torch.int32)
    with opselect.tuning():
        assert torch.equal(opselect.ops.isin(a, t), torch.isin(a, t))
    call = op.prepare(a, t)
    timings = store().get_timings("isin", call.info, call.key[1:],
                                  {b.name: b.source_hash for b in op.backends})
    assert 0 < timings["broadcast"][0] < float("inf"), timings


def test_an_added_backend_takes_part_in_auto_selection(cpu_triton, broadcast):
    """A choice made before add_backend is dropped: the same call is decided again, with the new
    backend among the candidates (one the model predicts fastest wins)."""
    a, t = torch.randint(0, 9, (60,)), torch.arange(5)
    op = opselect.get_op("isin")
    opselect.ops.isin(a, t)
    assert op.chosen(op.prepare(a, t)).backend.name == "torch"

    class Cheap(broadcast.Broadcast):
        name = "cheap"
        estimate = staticmethod(lambda call, model, plan: opselect.Estimate(1e-12))

    opselect.add_backend("isin", Cheap())
    try:
        assert torch.equal(opselect.ops.isin(a, t), torch.isin(a, t))
        assert op.chosen(op.prepare(a, t)).backend.name == "cheap"
    finally:
        opselect.remove_backend("isin", "cheap")
    assert op.chosen(op.prepare(a, t)) is None  # (removing it dropped the choices too)
