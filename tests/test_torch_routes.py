"""Torch routes (Op.routes): an auto call whose choice is torch's own op is answered by it
straight from the public function's arguments, without preparing the call, from its second
time on. A route may only save time: these tests check that it answers as torch does, that it
follows every change of the choice it came from, and that arguments the full path rejects are
still rejected."""

from __future__ import annotations

import pytest
import torch

import opselect
from conftest import fake_timing
from opselect import ops
from opselect.dispatch import get_op, tuning
from opselect.dispatch.op import ROUTES_MAX, Choice
from opselect.errors import OpselectError
from opselect.kernels import isin as isin_pkg


def _times(fastest: str):
    """Made-up tuning times for isin's backends with `fastest` ahead of the rest."""
    table = {"torch": 5e-3, "compare": 4e-3, "search": 3e-3, "hash": 2e-3, "bitmap": 2.5e-3}
    table[fastest] = 1e-4
    return table


def _count_prepares(monkeypatch) -> list:
    """Count isin's full path (ops.isin prepares the call through the package's attribute)."""
    seen = []
    real = isin_pkg.prepare

    def counting(*args, **kwargs):
        seen.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(isin_pkg, "prepare", counting)
    return seen


def _tuned_pair(monkeypatch, fastest: str):
    """An isin call decided in tuning mode, with made-up times that put `fastest` ahead."""
    fake_timing(monkeypatch, lambda what: _times(fastest)[what.split("/")[1].split()[0]])
    a, b = _pair()
    with tuning():
        ops.isin(a, b)
    return a, b


def _pair(m=300, n=20, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randint(-50, 50, (m,), generator=gen),
            torch.randint(-50, 50, (n,), generator=gen))


def test_settled_torch_choice_routes_later_calls_to_torch(cpu_triton, monkeypatch):
    op = get_op("isin")
    a, b = _tuned_pair(monkeypatch, "torch")
    assert op.chosen(isin_pkg.prepare(a, b)).source == "tuning"
    assert list(op.routes.values()) == [(None, True)]  # the deciding run adds it: settled
    seen = _count_prepares(monkeypatch)
    for seed in range(1, 4):  # fresh values of the same call: torch's answers, nothing prepared
        a, b = _pair(seed=seed)
        for invert in (False, True):
            got = ops.isin(a, b, invert=invert) if invert else ops.isin(a, b)
            assert torch.equal(got, torch.isin(a, b, invert=invert))
    assert len(seen) == 1  # invert=True is another call: prepared once, then routed


def test_triton_choice_gets_no_route(cpu_triton, monkeypatch):
    op = get_op("isin")
    a, b = _tuned_pair(monkeypatch, "search")
    seen = _count_prepares(monkeypatch)
    for _ in range(3):
        assert torch.equal(ops.isin(a, b), torch.isin(a, b))
    assert not op.routes and len(seen) == 3


def test_any_change_to_the_choices_drops_the_routes(cpu_triton, monkeypatch):
    op = get_op("isin")
    a, b = _pair()
    call = isin_pkg.prepare(a, b)
    # Every way the memos change: a cold choice dropped, the cold memo emptied, forget().
    for change in (lambda: op._cold.pop(call.exact), lambda: op._cold.clear(), opselect.forget):
        ops.isin(a, b)  # the cost model's torch (provisional): a route
        assert list(op.routes.values()) == [(None, False)]
        change()
        assert not op.routes
    # A write into the memo as distributed.sync makes one (rank 0 measured search): the route
    # goes, and the next call runs the agreed backend.
    ops.isin(a, b)
    assert op.routes
    search = op.backend("search")
    op._memo[call.key] = Choice(search, dict(search.configs(call)[0]), "distributed")
    assert not op.routes
    seen = _count_prepares(monkeypatch)
    for _ in range(2):
        assert torch.equal(ops.isin(a, b), torch.isin(a, b))
    assert len(seen) == 2 and not op.routes


def test_cost_model_route_waits_while_tuning(cpu_triton, monkeypatch):
    """A route from the cost model's (provisional) torch is not taken in tuning mode: the call
    is measured, as any provisional choice is, and the winner replaces the route."""
    op = get_op("isin")
    a, b = _pair()
    ops.isin(a, b)
    ops.isin(a, b)
    assert list(op.routes.values()) == [(None, False)]
    measured = []

    def seconds(what):
        measured.append(what)
        return _times("hash")[what.split("/")[1].split()[0]]

    fake_timing(monkeypatch, seconds)
    with tuning():
        assert torch.equal(ops.isin(a, b), torch.isin(a, b))
    assert measured and op.chosen(isin_pkg.prepare(a, b)).backend.name == "hash"
    assert not op.routes


@pytest.mark.parametrize("name", ["softmax", "log_softmax", "topk", "permute", "isin"])
def test_every_op_routes_and_answers_as_torch(name):
    """Small CPU calls go to torch's op (the cost model's pick under the interpreter, the only
    candidate without it): every op has a route after its first call, and routed answers equal
    torch's on fresh inputs."""
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(6, 9, generator=gen)
    run = {
        "softmax": (lambda t: ops.softmax(t, 1), lambda t: torch.softmax(t, 1)),
        "log_softmax": (lambda t: ops.log_softmax(t, -1, dtype=torch.float64),
                        lambda t: torch.log_softmax(t, -1, dtype=torch.float64)),
        "topk": (lambda t: ops.topk(t, 4, 0, False, True), lambda t: torch.topk(t, 4, 0, False, True)),
        "permute": (lambda t: ops.permute(t, [1, 0]), lambda t: t.permute(1, 0).contiguous()),
        "isin": (lambda t: ops.isin(t, t[0]), lambda t: torch.isin(t, t[0])),
    }[name]
    ours, theirs = run
    if name == "isin":  # a test set of one dim, as routes require
        ours, theirs = (lambda t: ops.isin(t.round(), t[0].round()),
                        lambda t: torch.isin(t.round(), t[0].round()))
    op = get_op(name)
    ours(x)
    assert op.routes, f"{name}: no route after an auto call chose torch"
    for _ in range(3):
        x = torch.randn(6, 9, generator=gen)
        got, want = ours(x), theirs(x)
        if name == "topk":
            assert torch.equal(got.values, want.values) and torch.equal(got.indices, want.indices)
        else:
            assert torch.equal(got, want) and got.is_contiguous()
            assert got.data_ptr() != x.data_ptr()


def test_routes_keep_the_full_paths_errors():
    """Arguments the full path rejects (a float or bool where an int is expected) compare and
    hash equal to the ints of a routed call; they must still be rejected, with opselect's
    errors."""
    x = torch.randn(5, 7)
    ops.permute(x, (1, 0))
    ops.softmax(x, 1)
    ops.topk(x, 3)
    ops.isin(x, x[0])
    for op_name in ("permute", "softmax", "topk", "isin"):
        assert get_op(op_name).routes
    with pytest.raises(OpselectError, match=r"dims\[0\] must be an int, got float"):
        ops.permute(x, (1.0, 0))
    with pytest.raises(OpselectError, match=r"dims\[1\] must be an int, got bool"):
        ops.permute(x, (1, False))
    with pytest.raises(OpselectError, match="dim must be an int, got float"):
        ops.softmax(x, 1.0)
    with pytest.raises(OpselectError, match="k must be an int, got float"):
        ops.topk(x, 3.0)
    with pytest.raises(OpselectError, match="largest must be a bool, got int"):
        ops.topk(x, 3, largest=1)
    # isin's flags follow bool() on the full path (as torch's Python binding does not): a
    # truthy int is True there, and the routed call agrees.
    assert torch.equal(ops.isin(x, x[0], invert=1), torch.isin(x, x[0], invert=True))


def test_other_strides_or_alignment_are_other_calls():
    """A route names the exact geometry: a transposed view or a misaligned slice of the same
    shape is decided (and routed) on its own."""
    op = get_op("permute")
    base = torch.randn(9, 9)
    ops.permute(base, (1, 0))
    assert len(op.routes) == 1
    ops.permute(base.t(), (0, 1))  # (by (1, 0) the view would be contiguous: no copy)
    flat = torch.randn(82)
    ops.permute(flat[1:].view(9, 9), (1, 0))  # same shape and strides, 4 bytes off alignment
    assert len(op.routes) == 3


def test_routes_are_bounded():
    op = get_op("softmax")
    x = torch.randn(3, 4)
    ops.softmax(x, -1)
    assert len(op.routes) == 1
    op.routes.clear()  # (the routes alone: the memo keeps its choice)
    for n in range(ROUTES_MAX):
        op.routes[("filler", n)] = True
    ops.softmax(x, -1)  # a memo hit that adds a route to a full table: it starts again
    assert len(op.routes) == 1 and ("filler", 0) not in op.routes


def test_prepared_permute_calls_serve_each_input(cpu_triton):
    """permute's prepared-call memo (kernels/permute/call.py, keyed like the routes): a memo hit
    is made for the call's own tensor, and alignment separates entries (the vectorized and
    tiled kernels read the pointer's alignment from the plan)."""
    from opselect.kernels.permute import call as permute_call

    permute_call._PREPARED.clear()
    flat = torch.randn(2 * 97 + 1)
    for backend in ("naive", "tiled"):
        for offset in (0, 1, 0, 1):  # 16-byte aligned, then 4 bytes off, twice each
            x = flat[offset:offset + 2 * 97].view(2, 97).clone() if offset == 0 else \
                flat[offset:offset + 2 * 97].view(2, 97)
            x.uniform_(-1, 1)  # fresh values for every call
            got = ops.permute(x, (1, 0), backend=backend)
            assert torch.equal(got, x.t().contiguous()), (backend, offset)
    assert len(permute_call._PREPARED) == 2
    keys = {k[-1] for k in permute_call._PREPARED}
    assert keys == {0, 4}
