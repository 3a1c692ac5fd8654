"""opselect.enable(): a program's own torch calls through opselect, eager and compiled; calls it
does not take reach torch untouched; no recursion; stats."""

from __future__ import annotations

import random
import shutil
import threading

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

import opselect
from opselect.fronts.permute import _view_strides

FORCED = {"softmax": "fused", "log_softmax": "strided", "topk": "bitonic", "isin": "hash",
          "permute": "naive"}


@pytest.fixture(autouse=True)
def _never_left_enabled():
    opselect.reset_stats()
    yield
    while opselect.is_enabled():
        opselect.disable()


def _x(*shape, seed=0, dtype=torch.float32):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _ints(*shape, seed=0, high=40):
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(seed))


def calls(op: str) -> dict:
    return opselect.stats().get(op, {}).get("backends", {})


# Every routed form: (op, fn, make args). fn is what a user program calls.
FORMS = [
    ("softmax", lambda x: torch.softmax(x, -1), lambda: (_x(6, 40),)),
    ("softmax", lambda x: torch.softmax(x, 1, dtype=torch.float64), lambda: (_x(6, 40),)),
    ("softmax", lambda x: F.softmax(x, dim=-1), lambda: (_x(6, 40),)),
    ("softmax", lambda x: F.softmax(x, 1, 3, torch.float32), lambda: (_x(6, 40, dtype=torch.float16),)),
    ("softmax", lambda x: x.softmax(-1), lambda: (_x(6, 40),)),
    ("softmax", lambda x: torch.special.softmax(x, 1), lambda: (_x(6, 40),)),
    ("softmax", lambda x: torch.nn.Softmax(dim=-1)(x), lambda: (_x(6, 40),)),
    ("log_softmax", lambda x: torch.log_softmax(x, 0), lambda: (_x(6, 40),)),
    ("log_softmax", lambda x: F.log_softmax(x, dim=0), lambda: (_x(6, 40),)),
    ("log_softmax", lambda x: x.log_softmax(dim=0), lambda: (_x(6, 40),)),
    ("log_softmax", lambda x: torch.special.log_softmax(x, 0), lambda: (_x(6, 40),)),
    # a language model's loss: log_softmax over the class dim (dim 1), then nll_loss
    ("log_softmax", lambda x, t: F.cross_entropy(x, t), lambda: (_x(2, 40, 3), _ints(2, 3))),
    ("log_softmax", lambda x, t: F.cross_entropy(x, t, None, None, 7, None, "none"),
     lambda: (_x(2, 40, 3), _ints(2, 3))),
    ("log_softmax", lambda x, t, w: torch.nn.CrossEntropyLoss(w, reduction="sum")(x, t),
     lambda: (_x(2, 40, 3), _ints(2, 3), _x(40, seed=2).abs())),
    ("topk", lambda x: torch.topk(x, 5), lambda: (_x(6, 40),)),
    ("topk", lambda x: torch.topk(x, 5, dim=0, largest=False), lambda: (_x(40, 6),)),
    ("topk", lambda x: x.topk(3, -1, True, True), lambda: (_x(6, 40),)),
    ("topk", lambda x: x.topk(k=3, sorted=True), lambda: (_x(6, 40),)),
    ("isin", lambda a, b: torch.isin(a, b), lambda: (_ints(50), _ints(9, seed=1))),
    ("isin", lambda a, b: torch.isin(a, b, invert=True), lambda: (_ints(5, 10), _ints(9, seed=1))),
    ("isin", lambda a, b: torch.isin(elements=a, test_elements=b), lambda: (_ints(50), _ints(9, seed=1))),
    ("permute", lambda x: x.permute(0, 2, 1, 3).contiguous(), lambda: (_x(2, 5, 3, 4),)),
    ("permute", lambda x: x.transpose(1, 2).contiguous(), lambda: (_x(2, 5, 3, 4),)),
    ("permute", lambda x: x.t().contiguous(), lambda: (_x(7, 9),)),
    ("permute", lambda x: x.transpose(1, 2).reshape(2, 3, -1), lambda: (_x(2, 5, 3, 4),)),
    ("permute", lambda x: torch.reshape(x.permute(2, 0, 1), (-1,)), lambda: (_x(2, 5, 3),)),
    ("permute", lambda x: x.transpose(0, 1).reshape([4, 15]), lambda: (_x(5, 4, 3),)),
]


def _equal(got, want):
    if isinstance(want, torch.Tensor):
        assert got.shape == want.shape and got.dtype == want.dtype
        assert got.stride() == want.stride()
        if want.dtype.is_floating_point:
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        else:
            assert torch.equal(got, want)
    else:
        assert type(got) is type(want)
        _equal(got.values, want.values)  # topk: values equal; indices where values are distinct
        _equal(got.indices, want.indices)


@pytest.mark.parametrize("forced", [False, True], ids=["auto", "kernels"])
@pytest.mark.parametrize("index", range(len(FORMS)))
def test_every_form_is_routed(cpu_triton, index, forced):
    op, fn, make = FORMS[index]
    args = make()
    want = fn(*args)
    with opselect.enabled(backends=FORCED if forced else None):
        got = fn(*args)
    _equal(got, want)
    ran = calls(op)
    assert sum(ran.values()) == 1, opselect.stats()  # exactly once: no recursion, no re-entry
    assert list(ran) == [FORCED[op] if forced else "torch"]
    assert sum(v["calls"] for v in opselect.stats().values()) == 1


# Calls opselect does not take: torch's own function gets them untouched.
PASSED = [
    ("softmax of ints", lambda: torch.softmax(_ints(4, 5), -1)),
    ("implicit softmax dim", lambda: F.softmax(_x(4, 5))),
    ("sparse softmax input", lambda: torch.sparse.softmax(_x(4, 5).to_sparse(), 1)),
    ("topk out=", lambda: torch.topk(_x(4, 9), 2, out=(torch.empty(0), torch.empty(0, dtype=torch.long)))),
    ("topk of bool", lambda: torch.topk(_x(4, 9) > 0, 2)),
    ("isin with a scalar", lambda: torch.isin(_ints(9), 3)),
    ("isin of bool", lambda: torch.isin(_ints(9) > 3, torch.tensor([True]))),
    ("contiguous of a sliced view", lambda: _x(6, 8)[:, ::2].contiguous()),
    ("contiguous already", lambda: _x(6, 8).contiguous()),
    ("channels_last", lambda: _x(2, 3, 4, 5).contiguous(memory_format=torch.channels_last)),
    ("reshape that views", lambda: _x(4, 6).t().reshape(6, 2, 2)),
    ("reshape of contiguous", lambda: _x(4, 6).reshape(-1)),
    ("reshape of a sliced view", lambda: _x(6, 8)[:, ::2].reshape(-1)),
    # repeat_kv's (Llama's grouped attention): an expanded view, which no permute copies
    ("reshape of an expanded view", lambda: _x(2, 2, 3, 4)[:, :, None].expand(2, 2, 3, 3, 4)
     .reshape(2, 6, 3, 4)),
    ("contiguous of an expanded view", lambda: _x(3, 1).expand(3, 4).contiguous()),
    ("contiguous of an empty transposed view", lambda: _x(0, 5).t().contiguous()),
    ("cross_entropy with class weights and label smoothing",
     lambda: F.cross_entropy(_x(4, 5), _ints(4, high=5), _x(5, seed=3).abs(),
                             label_smoothing=0.1)),
    ("cross_entropy with label smoothing past 1",  # (torch's error)
     lambda: F.cross_entropy(_x(4, 5), _ints(4, high=5), label_smoothing=1.5)),
    ("cross_entropy of probabilities", lambda: F.cross_entropy(_x(4, 5), torch.full((4, 5), 0.2))),
    ("cross_entropy of int32 classes",
     lambda: F.cross_entropy(_x(4, 5), _ints(4, high=5).int())),
    ("cross_entropy with size_average",
     lambda: F.cross_entropy(_x(4, 5), _ints(4, high=5), size_average=False)),
    ("cross_entropy with a float ignore_index",  # (torch's error, naming its function)
     lambda: F.cross_entropy(_x(4, 5), _ints(4, high=5), ignore_index=1.5)),
]


def _outcome(make):
    try:
        result = make()
    except Exception as exc:  # noqa: BLE001 - the error itself is what is compared
        return None, (type(exc), str(exc))
    if isinstance(result, tuple) and not hasattr(result, "values"):
        result = result[0]
    return result, None


@pytest.mark.parametrize("case", PASSED, ids=[p[0] for p in PASSED])
def test_other_calls_reach_torch_untouched(case):
    """Torch's result, or torch's own error, and opselect counts nothing."""
    _, make = case
    want, want_error = _outcome(make)
    with opselect.enabled():
        got, error = _outcome(make)
    assert error == want_error
    if want_error is None:
        _equal(got, want)
    assert opselect.stats() == {}


def test_reshape_view_keeps_aliasing():
    x = _x(4, 6)
    with opselect.enabled():
        view = x.t().reshape(6, 2, 2)
        same = x.contiguous()
    assert view.data_ptr() == x.data_ptr() and same is x
    assert opselect.stats() == {}


def test_view_strides_agree_with_torch():
    gen = torch.Generator().manual_seed(0)
    checked = 0
    for _ in range(400):
        rank = int(torch.randint(1, 5, (1,), generator=gen))
        shape = [int(v) for v in torch.randint(1, 4, (rank,), generator=gen)]
        x = torch.empty(shape).permute(*torch.randperm(rank, generator=gen).tolist())
        sizes = list(x.shape)
        # a random regrouping of the elements into a new shape
        new = [v for s in sizes for v in ((s,) if s < 2 or torch.rand(1, generator=gen) < .5
                                           else (1, s))]
        if len(new) > 1 and torch.rand(1, generator=gen) < 0.5:
            i = int(torch.randint(0, len(new) - 1, (1,), generator=gen))
            new[i:i + 2] = [new[i] * new[i + 1]]
        mine = _view_strides(tuple(x.shape), x.stride(), tuple(new))
        try:
            theirs = list(x.view(new).stride())
        except RuntimeError:
            theirs = None
        assert mine == theirs or (mine is not None and theirs is not None and all(
            a == b or n == 1 for a, b, n in zip(mine, theirs, new))), (x.shape, x.stride(), new)
        checked += theirs is None
    assert checked > 10  # both outcomes were exercised


def test_enable_disable_round_trip(cpu_triton):
    x = _x(4, 30)
    assert not opselect.is_enabled()
    opselect.enable(ops=["softmax"])
    assert opselect.is_enabled()
    torch.softmax(x, -1)
    torch.topk(x, 2)  # not among the routed ops
    opselect.enable(ops=["topk"], backends={"topk": "bitonic"})  # reconfigures
    torch.softmax(x, -1)
    torch.topk(x, 2)
    opselect.disable()
    opselect.disable()  # a no-op now
    assert not opselect.is_enabled()
    torch.softmax(x, -1)
    torch.topk(x, 2)
    assert opselect.stats()["softmax"]["calls"] == 1
    assert opselect.stats()["topk"]["backends"] == {"bitonic": 1}


def test_enabled_nests_and_restores(cpu_triton):
    x = _x(4, 30)
    with opselect.enabled(ops=["softmax"]):
        with opselect.enabled(ops=["topk"], backends={"topk": "sort"}):
            torch.topk(x, 2)
            torch.softmax(x, -1)
        torch.topk(x, 2)
        torch.softmax(x, -1)
    assert not opselect.is_enabled()
    assert opselect.stats()["topk"]["backends"] == {"sort": 1}
    assert opselect.stats()["softmax"]["calls"] == 1


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown op 'conv2d'"):
        opselect.enable(ops=["conv2d"])
    with pytest.raises(opselect.errors.BackendError, match="nope"):
        opselect.enable(backends={"softmax": "nope"})
    with pytest.raises(ValueError, match="not among the routed ops"):
        opselect.enable(ops=["topk"], backends={"softmax": "fused"})
    assert not opselect.is_enabled()


def test_other_torch_function_mode_and_disable():
    """A TorchFunctionMode of the program's own, entered after enable(), sees the routed call
    (once: opselect's op runs with routing off) and does not stop disable()."""
    seen = []

    class Other(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(getattr(func, "__name__", ""))
            return func(*args, **(kwargs or {}))

    x = _x(4, 30)
    opselect.enable()
    with Other():
        got = torch.softmax(x, -1)
        opselect.disable()
        assert not opselect.is_enabled()
        torch.softmax(x, -1)
    torch.testing.assert_close(got, torch.softmax(x, -1))
    assert calls("softmax") == {"torch": 1}
    assert seen.count("softmax") == 2, seen


def test_per_thread(cpu_triton):
    seen = []

    def work():
        torch.softmax(_x(3, 5), -1)
        seen.append(opselect.is_enabled())

    with opselect.enabled():
        thread = threading.Thread(target=work)
        thread.start()
        thread.join()
    assert seen == [False] and opselect.stats() == {}


def test_autograd_through_routed_softmax(cpu_triton):
    x = _x(5, 40).requires_grad_()
    g = _x(5, 40, seed=1)
    (torch.softmax(x, -1) * g).sum().backward()
    want = x.grad.clone()
    x.grad = None
    with opselect.enabled(backends={"softmax": "fused"}):
        (F.softmax(x, dim=-1) * g).sum().backward()
    torch.testing.assert_close(x.grad, want)
    assert calls("softmax") == {"fused": 1}


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_through_the_routed_log_softmax(cpu_triton, reduction):
    """F.cross_entropy over rows (N, C) and one unbatched row (C,): opselect's log_softmax (a
    forced fused, whose backward is the library's) then torch's nll_loss; the loss and the
    gradient as torch's, with weights and an ignored class. Once each: no recursion."""
    for shape, target_shape in (((6, 40), (6,)), ((40,), ())):
        x = _x(*shape).requires_grad_()
        t = _ints(*target_shape, high=40) if target_shape else torch.tensor(5)
        if target_shape:
            t[0] = 3  # the ignored class
        w = _x(40, seed=3).abs()
        kwargs = dict(weight=w, ignore_index=3, reduction=reduction)
        want = F.cross_entropy(x, t, **kwargs)
        (want_grad,) = torch.autograd.grad(want.sum(), x)
        opselect.reset_stats()
        with opselect.enabled(backends={"log_softmax": "fused"}):
            got = F.cross_entropy(x, t, **kwargs)
        (got_grad,) = torch.autograd.grad(got.sum(), x)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got_grad, want_grad, rtol=1e-5, atol=1e-6)
        assert calls("log_softmax") == {"fused": 1}, (shape, opselect.stats())


def every_torch_op(x, a, b, m):
    return (F.softmax(x * 2, dim=-1) + 1, torch.log_softmax(x, 0), x.topk(3).values * 2,
            torch.isin(a + 1, b), m.permute(0, 2, 1, 3).contiguous() + 1,
            m.transpose(1, -1).reshape(2, -1))


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.slow
def test_compiled_under_enable(cpu_triton, backend):
    args = (_x(6, 40), _ints(100), _ints(20, seed=1), _x(2, 3, 6, 5, seed=2))
    want = every_torch_op(*args)
    torch._dynamo.reset()
    with opselect.enabled(backends=FORCED):
        got = torch.compile(every_torch_op, backend=backend, fullgraph=True)(*args)
        torch._dynamo.reset()
        explained = torch._dynamo.explain(every_torch_op)(*args)
    for g, w in zip(got, want):
        _equal(g, w)
    assert explained.graph_break_count == 0
    stats = opselect.stats()
    for op in ("softmax", "log_softmax", "topk", "isin", "permute"):
        # Dynamo leaves a Tensor method call (x.topk, .contiguous(), .reshape) in its graph:
        # AOTAutograd's trace routes it; backend="eager" runs it through the wrapper eagerly.
        method_only = op in ("topk", "permute")
        if not (backend == "eager" and method_only):
            assert stats[op]["traced"].get("opselect"), (op, stats)
        assert stats[op]["backends"] == {FORCED[op]: stats[op]["calls"]}, (op, stats)
        assert stats[op]["calls"] > 0, (op, stats)


# ---------------------------------------------------------------------------------------------
# The entry points: patched while some thread routes, the exact originals back afterwards
# ---------------------------------------------------------------------------------------------
from opselect import routing as _routing  # noqa: E402

ENTRY_POINTS = [(owner, name) for _, owner, name, *_ in _routing._ENTRY_POINTS]


def _snapshot():
    return [(getattr(owner, name), name in vars(owner)) for owner, name in ENTRY_POINTS]


def test_round_trip_restores_the_exact_objects():
    before = _snapshot()
    tag = torch.compiler.config.cache_key_tag
    add, view = torch.add, torch.Tensor.view
    opselect.enable(ops=_routing.OPS)  # (every op: those off by default install only when named)
    during = _snapshot()
    assert all(now is not then for (now, _), (then, _) in zip(during, before))
    assert all(now.__wrapped__ is then for (now, _), (then, _) in zip(during, before))
    assert torch.add is add and torch.Tensor.view is view  # nothing else is touched
    assert "opselect routing" in torch.compiler.config.cache_key_tag
    opselect.disable()
    after = _snapshot()
    for (now, own), (then, was_own), (owner, name) in zip(after, before, ENTRY_POINTS):
        assert now is then and own == was_own, (owner, name)
    assert "topk" not in vars(torch.Tensor)  # a C method again, not a copy of it
    assert torch.compiler.config.cache_key_tag == tag


def test_entry_points_stay_while_any_thread_routes(cpu_triton):
    before = _snapshot()
    ready, stop = threading.Event(), threading.Event()

    def other():
        opselect.enable(ops=["topk"])
        ready.set()
        stop.wait(30)
        # this thread ends without disable(): its lease goes with it

    thread = threading.Thread(target=other)
    thread.start()
    ready.wait(30)
    try:
        assert _snapshot() != before
        assert not opselect.is_enabled()  # routing is per thread
        torch.topk(_x(4, 9), 2)
        assert opselect.stats() == {}
        opselect.enable()
        opselect.disable()
        assert _snapshot() != before  # the other thread still routes
    finally:
        stop.set()
        thread.join()
    import gc

    gc.collect()
    assert _snapshot() == before


def test_a_wrapper_replaced_by_someone_else_is_left_in_place():
    original = torch.isin

    def theirs(*args, **kwargs):
        return original(*args, **kwargs)

    opselect.enable()
    torch.isin = theirs
    try:
        with pytest.warns(RuntimeWarning, match="torch.isin"):
            opselect.disable()
        assert torch.isin is theirs
        assert torch.softmax is torch._C._VariableFunctions.softmax
    finally:
        torch.isin = original


@pytest.mark.slow
def test_enable_before_dynamo_is_imported(tmp_path):
    """Dynamo builds its tables of torch's functions by name when it is first imported: enable()
    imports it first, so a compiled function still finds torch's own functions (an explicit
    torch.Tensor.topk(x, k) traces the wrapper, which calls the original method)."""
    import subprocess
    import sys

    code = """
import sys, torch, opselect
assert "torch._dynamo" not in sys.modules
opselect.enable(backends={"topk": "sort"})
from torch._dynamo.trace_rules import get_tensor_method, get_torch_obj_rule_map
assert torch.softmax.__wrapped__ in get_torch_obj_rule_map()
assert torch.Tensor.topk.__wrapped__ in get_tensor_method()
def fn(x):
    return torch.softmax(x, -1) + torch.Tensor.topk(x, 40).values
x = torch.randn(3, 40)
got = torch.compile(fn, backend="aot_eager", fullgraph=True)(x)
opselect.disable()
torch.testing.assert_close(got, fn(x))
assert opselect.stats()["topk"]["backends"] == {"sort": 1}, opselect.stats()
print("ok")
"""
    env = {**__import__("os").environ, "TRITON_INTERPRET": "1",
           "OPSELECT_CACHE_DIR": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]


def test_compiled_function_recompiles_when_routing_changes(cpu_triton):
    """Dynamo guards on the patched functions and on this thread's routing."""
    def fn(x):
        return F.softmax(x, dim=-1) * 2, torch.topk(x, 3).values

    x = _x(5, 40)
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    with opselect.enabled(backends={"softmax": "fused", "topk": "sort"}):
        compiled(x)
    assert calls("softmax") == {"fused": 1} and calls("topk") == {"sort": 1}
    opselect.reset_stats()
    compiled(x)  # routing off: torch's ops
    assert opselect.stats() == {}
    with opselect.enabled(ops=["softmax"], backends={"softmax": "fused"}):
        got = compiled(x)
    assert calls("softmax") == {"fused": 1} and calls("topk") == {}
    for g, w in zip(got, fn(x)):
        torch.testing.assert_close(g, w)


def test_decompositions_inner_calls_are_not_routed(cpu_triton):
    """torch._decomp's matmul reshapes a permuted operand while it is traced: torch's call,
    not the program's, so it stays torch's (only the program's own calls are routed)."""
    a = _x(2, 8, 2, 16).transpose(1, 2)
    b = _x(16, 5, seed=1)
    torch._dynamo.reset()
    with opselect.enabled(backends={"permute": "naive"}):
        got = torch.compile(torch.matmul, backend="aot_eager", fullgraph=True)(a, b)
    torch.testing.assert_close(got, torch.matmul(a, b))
    assert "permute" not in opselect.stats(), opselect.stats()


@pytest.mark.skipif(not (shutil.which("g++") or shutil.which("c++")),
                    reason="inductor on the CPU needs a C++ compiler")
@pytest.mark.slow
def test_compiled_inductor_cpu(cpu_triton):
    """Inductor (on the CPU) under enable(): one graph; the rule keeps softmax and permute as
    aten ops and places a forced topk backend; the same results as torch."""
    def fn(x, m):
        return (F.softmax(x * 2, dim=-1) + 1, torch.topk(x, 3).values * 2, x.topk(2).indices,
                m.transpose(0, 1).contiguous() + 1, torch.reshape(m.t(), (-1,)))

    args = (_x(6, 40), _x(5, 7, seed=1))
    want = fn(*args)
    torch._dynamo.reset()
    with opselect.enabled(backends={"topk": "sort"}):
        got = torch.compile(fn, backend="inductor", fullgraph=True)(*args)
    for g, w in zip(got, want):
        _equal(g, w)
    stats = opselect.stats()
    assert stats["topk"]["backends"] == {"sort": 2}, stats  # torch.topk and x.topk
    assert set(stats["softmax"]["traced"]) == {"aten"} and not stats["softmax"]["calls"]
    assert set(stats["permute"]["traced"]) == {"aten"} and not stats["permute"]["calls"]


@pytest.mark.gpu
@pytest.mark.parametrize("forced", [False, True], ids=["auto", "kernels"])
def test_gpu_compiled_inductor_under_enable(cuda, forced):
    """Inductor on the GPU under enable(): one graph, torch's results; with kernels forced,
    every op ran opselect's backend (function and method forms alike)."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    args = (torch.randn(64, 4000, device="cuda", generator=gen),
            torch.randint(0, 1000, (100_000,), device="cuda", generator=gen),
            torch.randint(0, 1000, (300,), device="cuda", generator=gen),
            torch.randn(8, 64, 12, 32, device="cuda", generator=gen))
    want = every_torch_op(*args)
    torch._dynamo.reset()
    with opselect.enabled(backends=FORCED if forced else None):
        got = torch.compile(every_torch_op, fullgraph=True)(*args)
    for g, w in zip(got, want):
        if g.dtype.is_floating_point:
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
        else:
            assert torch.equal(g, w)
    stats = opselect.stats()
    if forced:
        for op in ("softmax", "log_softmax", "topk", "isin", "permute"):
            assert stats[op]["backends"] == {FORCED[op]: stats[op]["calls"]}, (op, stats)
            assert stats[op]["calls"] > 0, (op, stats)
    else:  # the rule: softmax and permute stay inductor's
        for op in ("softmax", "log_softmax", "permute"):
            assert set(stats[op]["traced"]) == {"aten"}, (op, stats)


@pytest.mark.gpu
def test_gpu_small_calls_reach_torch_before_any_key(cuda):
    """Under enable(), small softmax rows and small copies of views on the GPU are answered by
    torch's op with no key and no route (the model's eager choice for such calls on every GPU it
    knows: test_cost_model checks the bounds), counted as torch; a dtype, a forced backend,
    tuning and larger calls still reach the dispatcher."""
    from opselect.kernels.permute import OP as PERMUTE_OP
    from opselect.kernels.softmax import SOFTMAX_OP

    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = torch.randn(8, 12, 16, 64, device="cuda", generator=gen)  # 98,304 elements
    heads = torch.randn(2, 4, 16, 8, device="cuda", generator=gen).transpose(1, 2)
    want = (torch.softmax(rows, -1), heads.contiguous(), heads.reshape(2, 16, -1))
    opselect.forget()
    opselect.reset_stats()
    with opselect.enabled():
        got = (F.softmax(rows, dim=-1), heads.contiguous(), heads.reshape(2, 16, -1))
        assert not SOFTMAX_OP.routes and not PERMUTE_OP.routes
        assert opselect.stats()["softmax"]["backends"] == {"torch": 1}
        assert opselect.stats()["permute"]["backends"] == {"torch": 2}
        F.softmax(rows, dim=-1, dtype=torch.float32)  # a dtype: keyed
        assert len(SOFTMAX_OP.routes) == 1
        F.softmax(torch.randn(64, 8192, device="cuda"), dim=-1)  # rows past the bound: keyed
        assert len(SOFTMAX_OP.routes) == 2
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    opselect.reset_stats()
    with opselect.enabled(backends={"softmax": "fused", "permute": "tiled"}):
        got = (F.softmax(rows, dim=-1), heads.contiguous())
    assert opselect.stats()["softmax"]["backends"] == {"fused": 1}
    assert opselect.stats()["permute"]["backends"] == {"tiled": 1}
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-6)
    assert torch.equal(got[1], want[1])
    opselect.forget()
    with opselect.tuning(), opselect.enabled():
        heads.contiguous()
    assert PERMUTE_OP.routes or PERMUTE_OP._memo  # decided by the dispatcher, not passed by


def test_eager_density_check_agrees_with_the_walk():
    """The layout entries' eager path asks torch whether a view is dense (one C call); the walk
    over sorted strides is what traced calls use. Both must say the same of every non-empty view,
    overlapping ones (as_strided, expand) included."""
    from opselect.fronts.permute import _dense_eager, _dense_permuted

    rng = random.Random(0)
    seen = {True: 0, False: 0}
    for _ in range(3000):
        rank = rng.randint(0, 5)
        x = torch.empty([rng.choice([1, 2, 3, 4]) for _ in range(rank)])
        if rank:
            x = x.permute(*rng.sample(range(rank), rank))
        for _ in range(rng.randint(0, 3)):
            kind, rank = rng.random(), x.dim()
            if kind < 0.25:
                d = rng.randrange(rank + 1)
                x = x.unsqueeze(d)
                size = list(x.shape)
                size[d] = rng.choice([1, 2, 3])
                x = x.expand(size)
            elif kind < 0.5 and rank and x.shape[0] > 1:
                x = x[::2] if rng.random() < 0.5 else x[1:]
            elif kind < 0.7 and rank >= 2:
                x = x.transpose(0, rank - 1)
            elif kind < 0.85:
                x = x.unsqueeze(rng.randrange(rank + 1))
            else:
                x = torch.empty(64).as_strided((2, 3, 2), rng.choice(
                    [(6, 2, 1), (1, 2, 6), (3, 1, 6), (1, 1, 1), (6, 1, 3), (2, 4, 1)]))
        want = _dense_permuted(x)
        assert _dense_eager(x) == want, (tuple(x.shape), x.stride())
        seen[want] += 1
    assert min(seen.values()) > 300  # both answers drawn often
    assert not _dense_eager(torch.empty(0, 5).t())  # empty: torch calls it dense; not routed


GRAD_COPIES = [
    ("contiguous", lambda t: t.transpose(0, 1).contiguous()),
    ("reshape", lambda t: t.transpose(0, 1).reshape(-1, 3)),
]


@pytest.mark.parametrize("forced", [False, True], ids=["auto", "forced"])
@pytest.mark.parametrize("parameter", [False, True], ids=["tensor", "parameter"])
@pytest.mark.parametrize("form", GRAD_COPIES, ids=[g[0] for g in GRAD_COPIES])
def test_routed_copy_of_a_view_keeps_autograd(cpu_triton, form, parameter, forced):
    """A routed copy of a view that requires grad is recorded by autograd, also after a call of
    the same layout under no_grad made its route (a route is keyed by layout alone, and a
    prepared kernel records nothing: the copy once came back with no grad_fn, so the training
    step's gradient never reached the input)."""
    _, copy = form
    values = _x(4, 6, 3)
    leaf = torch.nn.Parameter(values.clone()) if parameter else values.clone().requires_grad_()
    weight = _x(*copy(values).shape, seed=1)
    want_out = copy(values)
    with opselect.enabled(backends=FORCED if forced else None):
        with torch.no_grad():
            copy(values.clone())  # the layout's route, made without autograd
        out = copy(leaf)
        assert out.grad_fn is not None
        (out * weight).sum().backward()
    _equal(out.detach(), want_out)
    reference = values.clone().requires_grad_()
    (copy(reference) * weight).sum().backward()
    torch.testing.assert_close(leaf.grad, reference.grad)
    assert sum(calls("permute").values()) == 2
    assert list(calls("permute")) == ([FORCED["permute"]] if forced else ["torch"])


@pytest.mark.gpu
def test_gpu_cross_entropy_over_a_vocabulary(cuda):
    """A language model's loss on real sizes (float32 logits, as Hugging Face's loss upcasts
    them; bfloat16; targets with ignored tokens): the route runs the fused loss (rows enough to
    fill the GPU) forward and backward, and the loss and the gradient are torch's in float64.
    (torch's own bfloat16 gradient is further off: exp of a rounded log-probability.)"""
    for tokens, vocab, dtype in ((4096, 32000, torch.float32), (4096, 50257, torch.bfloat16)):
        torch.manual_seed(vocab)
        logits = (torch.randn(tokens, vocab, device=cuda) * 2).to(dtype)
        target = torch.randint(0, vocab, (tokens,), device=cuda)
        target[::7] = -100
        x = logits.detach().requires_grad_()
        xd = x.detach().double().requires_grad_()
        want = F.cross_entropy(xd, target)
        (want_grad,) = torch.autograd.grad(want, xd)
        opselect.reset_stats()
        with opselect.enabled():
            got = F.cross_entropy(x, target)
        (got_grad,) = torch.autograd.grad(got, x)
        # (the gradient's absolute tolerance relative to its largest element: a mean loss's
        # gradient is tiny everywhere)
        rtol = 1e-5 if dtype == torch.float32 else 1.6e-2
        torch.testing.assert_close(got.double(), want, rtol=rtol, atol=0)
        torch.testing.assert_close(got_grad.double(), want_grad, rtol=rtol,
                                   atol=rtol * want_grad.abs().max().item())
        assert calls("log_softmax") == {"fused_loss": 1}, (tokens, vocab, calls("log_softmax"))


@pytest.mark.gpu
def test_gpu_every_op_on_another_device(cuda):
    """Tensors on the second GPU while the first is current, at sizes the kernels take: each
    routed op answers as torch does (Triton launches on the current device; the routes switch
    to the tensors')."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    assert torch.cuda.current_device() == 0
    dev = "cuda:1"
    torch.manual_seed(0)
    x = torch.randn(4096, 8192, device=dev)
    logits = torch.randn(64, 128000, device=dev)
    a = torch.randint(0, 1 << 20, (1 << 22,), device=dev)
    b = torch.randint(0, 1 << 20, (1000,), device=dev)
    m = torch.randn(32, 577, 16, 64, device=dev)
    calls = [lambda: torch.softmax(x, -1), lambda: torch.topk(logits, 50).values,
             lambda: torch.isin(a, b), lambda: m.permute(0, 2, 1, 3).contiguous()]
    kernels = 0
    for fn in calls:
        want = fn()
        opselect.reset_stats()
        with opselect.enabled():
            got = fn()
        assert got.device == want.device
        torch.testing.assert_close(got, want)
        kernels += sum(n for op in opselect.stats().values()
                       for backend, n in op["backends"].items() if backend != "torch")
    assert torch.cuda.current_device() == 0
    assert kernels >= 3  # (the cold choices of these calls are opselect's kernels)
