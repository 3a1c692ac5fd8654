"""Routes (Op.routes): an auto call decided before is answered straight from the public
function's plain arguments, without preparing it: by torch's own op where that is the choice, or
by the chosen backend's prepared call (Backend.bind), whose plan, grid, output shape and bound
launches were worked out on the first call. A route may only save time: these tests check that
it answers as the full path does, that it follows every change of the choice it came from, that
arguments the full path rejects are still rejected, and that a repeated call does not work its
plan out again. Also: the choice per regime (eager: max(host, device); under a CUDA graph: the
device time alone)."""

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
    table = {"torch": 5e-3, "compare": 4e-3, "search": 3e-3, "hash": 2e-3, "cuckoo": 2.2e-3,
             "bitmap": 2.5e-3}
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


@pytest.mark.slow
def test_settled_torch_choice_routes_later_calls_to_torch(cpu_triton, monkeypatch):
    op = get_op("isin")
    a, b = _tuned_pair(monkeypatch, "torch")
    assert op.chosen(isin_pkg.prepare(a, b)).source == "tuning"
    assert list(op.routes.values()) == [(None, True, "torch", None)]  # the deciding run adds it: settled
    seen = _count_prepares(monkeypatch)
    for seed in range(1, 4):  # fresh values of the same call: torch's answers, nothing prepared
        a, b = _pair(seed=seed)
        for invert in (False, True):
            got = ops.isin(a, b, invert=invert) if invert else ops.isin(a, b)
            assert torch.equal(got, torch.isin(a, b, invert=invert))
    assert len(seen) == 1  # invert=True is another call: prepared once, then routed


@pytest.mark.parametrize("fastest", ["compare", "search", "hash", "cuckoo", "bitmap"])
def test_triton_choice_routes_to_its_prepared_call(cpu_triton, monkeypatch, fastest):
    """A tuned Triton choice: later calls of the key go to its prepared call (nothing prepared,
    no plan worked out again), and answer as torch does on fresh values."""
    op = get_op("isin")
    a, b = _tuned_pair(monkeypatch, fastest)
    [(prepared, settled, name, _)] = op.routes.values()
    assert callable(prepared) and settled and name == fastest
    seen = _count_prepares(monkeypatch)
    binds = _count_binds(monkeypatch, op.backend(fastest))
    for seed in range(1, 4):
        a, b = _pair(seed=seed)
        assert torch.equal(ops.isin(a, b), torch.isin(a, b))
    assert not seen and not binds


def _count_binds(monkeypatch, backend) -> list:
    seen = []
    real = backend.bind

    def counting(call, config):
        seen.append(1)
        return real(call, config)

    monkeypatch.setattr(backend, "bind", counting)
    return seen


@pytest.mark.parametrize("name, backend, make", [
    ("softmax", "fused", lambda g: torch.randn(6, 33, generator=g)),
    ("softmax", "strided", lambda g: torch.randn(4, 9, 5, generator=g)),
    ("topk", "bitonic", lambda g: torch.randn(5, 40, generator=g)),
    ("permute", "naive", lambda g: torch.randn(3, 4, 5, generator=g)),
])
def test_a_repeated_call_does_not_work_its_plan_out_again(cpu_triton, monkeypatch, name,
                                                          backend, make):
    """The choice pinned to a backend (as tuning pins it): the first call prepares and binds;
    the next ones, with new tensors of the same plain key, only launch."""
    op = get_op(name)
    gen = torch.Generator().manual_seed(3)
    run = {"softmax": (lambda t: ops.softmax(t, 1), lambda t: torch.softmax(t, 1)),
           "topk": (lambda t: ops.topk(t, 4), lambda t: torch.topk(t, 4)),
           "permute": (lambda t: ops.permute(t, (2, 0, 1)),
                       lambda t: t.permute(2, 0, 1).contiguous())}[name]
    x = make(gen)
    call = op.prepare(x, 1) if name == "softmax" else op.prepare(x, 4) if name == "topk" else \
        op.prepare(x, (2, 0, 1))
    chosen = op.backend(backend)
    op._memo[call.key] = Choice(chosen, dict(chosen.configs(call)[0]), "pinned")
    binds = _count_binds(monkeypatch, chosen)
    plans = []
    if hasattr(chosen, "make_plan"):
        real_plan = chosen.make_plan
        monkeypatch.setattr(chosen, "make_plan",
                            lambda *a, **k: plans.append(1) or real_plan(*a, **k))
    for i in range(4):
        x = make(gen)
        got, want = run[0](x), run[1](x)
        if name == "topk":
            assert torch.equal(got.values, want.values) and torch.equal(got.indices, want.indices)
        elif name == "softmax":  # (the interpreter's exp is not torch's to the last bit)
            assert torch.allclose(got, want, rtol=0, atol=1e-6)
        else:
            assert torch.equal(got, want)
        if i == 0:
            assert len(binds) == 1
            plans.clear()
    assert len(binds) == 1 and not plans  # the later calls: the route alone
    [(prepared, settled, chosen_name, _)] = op.routes.values()
    assert callable(prepared) and chosen_name == backend


def test_a_triton_route_follows_forget_and_tuning(cpu_triton, monkeypatch):
    op = get_op("isin")
    a, b = _tuned_pair(monkeypatch, "hash")
    assert op.routes
    opselect.forget()
    assert not op.routes and not op.forced_routes
    ops.isin(a, b, backend="search")
    assert op.forced_routes
    opselect.forget()
    assert not op.forced_routes


def test_another_alignment_of_the_same_key_is_still_right(cpu_triton):
    """softmax's key has no alignment (its kernels are bound per alignment at launch): a view
    4 bytes off the one the route was made with answers right."""
    op = get_op("softmax")
    x = torch.randn(4, 32)
    op._memo[op.prepare(x, 1).key] = Choice(op.backend("fused"), dict(
        op.backend("fused").configs(op.prepare(x, 1))[0]), "pinned")
    assert torch.allclose(ops.softmax(x, 1), torch.softmax(x, 1), rtol=0, atol=1e-7)
    flat = torch.randn(4 * 32 + 1)
    off = flat[1:].view(4, 32)
    assert off.stride() == x.stride() and off.data_ptr() % 16 != x.data_ptr() % 16
    assert torch.allclose(ops.softmax(off, 1), torch.softmax(off, 1), rtol=0, atol=1e-7)
    assert len(op.routes) == 1


def test_another_device_is_another_route():
    """The device is part of the key: a meta tensor's call is decided (and routed) apart."""
    op = get_op("softmax")
    x = torch.randn(3, 5)
    meta = ops.softmax(torch.empty(3, 5, device="meta"), 1)
    assert meta.device.type == "meta" and meta.shape == (3, 5)
    assert torch.allclose(ops.softmax(x, 1), torch.softmax(x, 1))
    assert {key[4].type for key in op.routes} == {"meta", "cpu"}


# -- the regimes: eager (max of host and device) and CUDA graphs (device) ---------------------------
def _split_times(monkeypatch, table: dict[str, tuple[float, float]]):
    """Tuning's two stages answer made-up times: stage 1 the device time, stage 2 (host,
    device) per candidate."""
    from opselect.dispatch import tuning_mode

    name = lambda what: what.split("/")[1].split()[0]  # noqa: E731
    monkeypatch.setattr(tuning_mode, "measure_safely",
                        lambda fn, device, what, **kw: table[name(what)][1])
    monkeypatch.setattr(tuning_mode, "time_interleaved",
                        lambda items, device, **kw: [table[name(w)] for w, _ in items])


def test_a_host_heavy_backend_wins_under_graphs_only(cpu_triton, monkeypatch):
    """hash: 2 us of device time and 30 us of host time a call; torch 8 us of both. Eager, torch
    (8 against 30); under a CUDA graph, where only device time counts, hash (2 against 8). The
    record keeps both times; explain shows both choices."""
    _split_times(monkeypatch, {"torch": (8e-6, 8e-6), "compare": (40e-6, 40e-6),
                               "search": (40e-6, 50e-6), "hash": (30e-6, 2e-6),
                               "cuckoo": (40e-6, 40e-6), "bitmap": (40e-6, 60e-6)})
    a, b = _pair()
    with tuning():
        assert torch.equal(ops.isin(a, b), torch.isin(a, b))
    decision = opselect.explain("isin", a, b, show=False)
    assert decision.choice == "torch" and decision.graph_choice == "hash"
    hash_c = decision.candidate("hash")
    assert (hash_c.measured_host_s, hash_c.measured_device_s) == (30e-6, 2e-6)
    assert hash_c.measured_s == 30e-6  # eager: the larger
    assert "under a CUDA graph (device time only): hash" in str(decision)
    opselect.forget()  # from the record: the same two choices, nothing measured
    again = opselect.explain("isin", a, b, show=False)
    assert again.source == "cache" and (again.choice, again.graph_choice) == ("torch", "hash")


@pytest.mark.slow
def test_the_route_asks_for_the_regime_when_the_choices_differ(cpu_triton, monkeypatch):
    """Where eager and graph choices differ, the route runs the graph's choice while the current
    stream captures (here: the capture check answering yes), torch's op otherwise: the eager
    side is the route's plain None (torch's op straight from the public function, as any torch
    route; a prepared closure around it cost 0.7-1.0 us a call on the H200's host), the graph's
    choice in the route's regime slot."""
    from opselect.dispatch import tuning_mode

    _split_times(monkeypatch, {"torch": (8e-6, 8e-6), "compare": (40e-6, 40e-6),
                               "search": (40e-6, 50e-6), "hash": (30e-6, 2e-6),
                               "cuckoo": (40e-6, 40e-6), "bitmap": (40e-6, 60e-6)})
    op = get_op("isin")
    a, b = _pair()
    with tuning():
        ops.isin(a, b)
    [(prepared, _, name, (graph, info))] = op.routes.values()
    assert prepared is None and name == "torch" and callable(graph) and info.type == "cpu"
    ran = []
    hash_backend = op.backend("hash")
    real_bind = hash_backend.bind

    def watched(call, config):
        fn = real_bind(call, config)
        return lambda *t: ran.append("hash") or fn(*t)

    monkeypatch.setattr(hash_backend, "bind", watched)
    op.routes.clear()
    ops.isin(a, b)  # a new route, with the watched hash
    [(prepared, _, _, _)] = op.routes.values()
    assert torch.equal(ops.isin(a, b), torch.isin(a, b)) and not ran  # eager: torch's op
    monkeypatch.setattr(tuning_mode, "capturing", lambda info: True)
    assert torch.equal(ops.isin(a, b), torch.isin(a, b)) and ran == ["hash"]
    # enable()'s wrappers read routes through _route: the same per regime.
    want = torch.isin(a, b)
    with opselect.enabled(ops=["isin"]):
        got = torch.isin(a, b)
    assert torch.equal(got, want) and ran == ["hash", "hash"]
    monkeypatch.setattr(tuning_mode, "capturing", lambda info: False)
    with opselect.enabled(ops=["isin"]):
        got = torch.isin(a, b)
    assert torch.equal(got, want) and ran == ["hash", "hash"]  # eager: torch's own entry point


def test_any_change_to_the_choices_drops_the_routes(cpu_triton, monkeypatch):
    op = get_op("isin")
    a, b = _pair()
    call = isin_pkg.prepare(a, b)
    # Every way the memos change: a cold choice dropped, the cold memo emptied, forget().
    for change in (lambda: op._cold.pop(call.exact), lambda: op._cold.clear(), opselect.forget):
        ops.isin(a, b)  # the cost model's torch (provisional): a route
        assert list(op.routes.values()) == [(None, False, "torch", None)]
        change()
        assert not op.routes
    # A write into the memo as distributed.sync makes one (rank 0 measured search): the route
    # goes, and the next call runs the agreed backend, then routes to its prepared call.
    ops.isin(a, b)
    assert op.routes
    search = op.backend("search")
    op._memo[call.key] = Choice(search, dict(search.configs(call)[0]), "distributed")
    assert not op.routes
    seen = _count_prepares(monkeypatch)
    for _ in range(2):
        assert torch.equal(ops.isin(a, b), torch.isin(a, b))
    [(prepared, settled, name, _)] = op.routes.values()
    assert len(seen) == 1 and callable(prepared) and settled and name == "search"


def test_cost_model_route_waits_while_tuning(cpu_triton, monkeypatch):
    """A route from the cost model's (provisional) torch is not taken in tuning mode: the call
    is measured, as any provisional choice is, and the winner replaces the route."""
    op = get_op("isin")
    a, b = _pair()
    ops.isin(a, b)
    ops.isin(a, b)
    assert list(op.routes.values()) == [(None, False, "torch", None)]
    measured = []

    def seconds(what):
        measured.append(what)
        return _times("hash")[what.split("/")[1].split()[0]]

    fake_timing(monkeypatch, seconds)
    with tuning():
        assert torch.equal(ops.isin(a, b), torch.isin(a, b))
    assert measured and op.chosen(isin_pkg.prepare(a, b)).backend.name == "hash"
    [(prepared, settled, name, _)] = op.routes.values()  # the tuned choice's own route
    assert callable(prepared) and settled and name == "hash"


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


@pytest.mark.gpu
@pytest.mark.parametrize("name, backend, make, run", [
    ("softmax", "fused", lambda d: torch.randn(64, 1024, device=d),
     lambda x, b: ops.softmax(x, backend=b)),
    ("softmax", "online", lambda d: torch.randn(2, 151936, device=d),
     lambda x, b: ops.softmax(x, backend=b)),
    ("topk", "radix", lambda d: torch.randn(16, 4096, device=d),
     lambda x, b: ops.topk(x, 32, backend=b).values),
    ("topk", "maxima", lambda d: torch.randn(16, 4096, device=d),
     lambda x, b: ops.topk(x, 32, backend=b).values),
    ("permute", "tiled", lambda d: torch.randn(256, 384, device=d),
     lambda x, b: ops.permute(x, (1, 0), backend=b)),
    ("isin", "compare", lambda d: torch.randint(0, 50, (4096,), device=d).float(),
     lambda x, b: ops.isin(x, torch.arange(0, 50, 3, device=x.device).float(), backend=b)),
])
def test_a_prepared_call_runs_on_the_current_stream(cuda, name, backend, make, run):
    """A route's prepared call (every launch of it) goes to the stream current at the call,
    not the one of the call that made it: on a side stream, its input is written only after a
    sleep there, so a kernel launched on any other stream reads the NaNs the input held."""
    x = make(cuda)
    expected = run(x, backend).clone()
    run(x, backend)  # the route is made: this and later calls take the prepared call
    torch.cuda.synchronize()
    late = torch.full_like(x, float("nan"))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(20_000_000)
        late.copy_(x)
        got = run(late, backend)
    side.synchronize()
    assert torch.equal(got, expected), (name, backend)
