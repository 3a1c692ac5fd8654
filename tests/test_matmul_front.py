"""matmul's and linear's front: ops.matmul and ops.linear against torch (every form of
torch.matmul, F.linear, out=, every backend forced), the calls only torch takes, the argument
errors, autograd, torch.func (vmap, jvp, jacrev), torch.compile with no graph break, the
library ops (opcheck), routes, and opselect.enable(ops=["matmul"]) on real models (nn.Linear,
Hugging Face's GPT-2 from a tiny config), off by default. The kernels themselves are
tests/test_matmul.py's.

On the CPU the Triton backends run through the interpreter (small shapes); the tests marked
`gpu` run larger shapes on CUDA."""

from __future__ import annotations

import warnings
from unittest import mock

import pytest
import torch
import torch.nn.functional as F

import opselect
from opselect import ops
from opselect.errors import BackendError, InvalidArgument
from opselect.fronts import matmul as front
from opselect.kernels import _common
from opselect.kernels.matmul import LINEAR_OP, MATMUL_OP

TRITON = ["tiled", "persistent"]  # splitk takes k > 256 only: its own cases below
BACKENDS = [None, "torch", *TRITON]
#: (atol, rtol) against torch's product (one rounding of a float32 sum either way)
TOL = {torch.float32: (2e-5, 2e-5), torch.float16: (2e-3, 2e-3),
       torch.bfloat16: (1e-2, 1.6e-2)}

pytestmark = pytest.mark.filterwarnings("ignore:.*bos_token_id.*|.*eos_token_id.*")


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    """Kernel outputs start as NaN (an element a kernel forgets to write shows), the counts
    start from zero, and no test leaves routing on."""
    monkeypatch.setattr(_common, "POISON", float("nan"))
    opselect.reset_stats()
    yield
    while opselect.is_enabled():
        opselect.disable()


def _t(*shape, seed=0, dtype=torch.float32):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape)
    assert got.is_contiguous()
    atol, rtol = TOL.get(want.dtype, (1e-5, 1e-5))
    torch.testing.assert_close(got, want, atol=atol, rtol=rtol)


# (name, make (input, other)): torch.matmul's forms
MATMUL_FORMS = [
    ("1d@1d", lambda: (_t(7), _t(7, seed=1))),
    ("1d@2d", lambda: (_t(7), _t(7, 5, seed=1))),
    ("2d@1d", lambda: (_t(6, 7), _t(7, seed=1))),
    ("2d@2d", lambda: (_t(6, 7), _t(7, 5, seed=1))),
    ("3d@2d folds", lambda: (_t(2, 6, 7), _t(7, 5, seed=1))),
    ("2d@3d", lambda: (_t(6, 7), _t(3, 7, 5, seed=1))),
    ("1d@3d", lambda: (_t(7), _t(3, 7, 5, seed=1))),
    ("3d@1d", lambda: (_t(3, 6, 7), _t(7, seed=1))),
    ("broadcast batch", lambda: (_t(2, 1, 6, 7), _t(3, 7, 5, seed=1))),
    ("transposed operands", lambda: (_t(7, 6).t(), _t(2, 5, 7, seed=1).transpose(1, 2))),
    ("expanded batch", lambda: (_t(1, 6, 7).expand(3, 6, 7), _t(3, 7, 5, seed=1))),
    ("sliced rows", lambda: (_t(12, 7)[::2], _t(7, 9, seed=1)[:, 1:6])),
    ("float16", lambda: (_t(2, 6, 33, dtype=torch.float16), _t(33, 9, seed=1,
                                                                dtype=torch.float16))),
    ("bfloat16", lambda: (_t(5, 40, dtype=torch.bfloat16), _t(2, 40, 3, seed=1,
                                                               dtype=torch.bfloat16))),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("form", MATMUL_FORMS, ids=[f[0] for f in MATMUL_FORMS])
def test_matmul_as_torch(cpu_triton, form, backend):
    a, b = form[1]()
    want = torch.matmul(a, b)
    close(ops.matmul(a, b, backend=backend), want)
    close(ops.matmul(a, b, backend=backend), want)  # the second call: its route


# (name, make (input, weight, bias))
LINEAR_FORMS = [
    ("1d input", lambda: (_t(7), _t(5, 7, seed=1), _t(5, seed=2))),
    ("2d no bias", lambda: (_t(6, 7), _t(5, 7, seed=1), None)),
    ("3d input", lambda: (_t(2, 3, 7), _t(5, 7, seed=1), _t(5, seed=2))),
    ("one-value bias", lambda: (_t(4, 7), _t(5, 7, seed=1), _t(1, seed=2))),
    ("0-d bias", lambda: (_t(4, 7), _t(5, 7, seed=1), _t(seed=2))),
    ("transposed input and weight", lambda: (_t(2, 7, 4).transpose(1, 2), _t(7, 5, seed=1).t(),
                                             _t(5, seed=2))),
    ("float16", lambda: (_t(3, 40, dtype=torch.float16), _t(9, 40, seed=1, dtype=torch.float16),
                         _t(9, seed=2, dtype=torch.float16))),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("form", LINEAR_FORMS, ids=[f[0] for f in LINEAR_FORMS])
def test_linear_as_torch(cpu_triton, form, backend):
    x, w, bias = form[1]()
    want = F.linear(x, w, bias)
    close(ops.linear(x, w, bias, backend=backend), want)
    close(ops.linear(x, w, bias, backend=backend), want)


def test_splitk(cpu_triton):
    """splitk's calls (k past 256, few rows): matmul and linear with a bias."""
    a, b = _t(3, 300), _t(300, 20, seed=1)
    close(ops.matmul(a, b, backend="splitk"), a @ b)
    w, bias = _t(20, 300, seed=2), _t(20, seed=3)
    close(ops.linear(a, w, bias, backend="splitk"), F.linear(a, w, bias))
    with pytest.raises(BackendError, match="too short to split"):
        ops.matmul(_t(3, 8), _t(8, 4), backend="splitk")


def test_empty_products(cpu_triton):
    for backend in BACKENDS:
        a, b = _t(3, 0), _t(0, 5)  # k = 0: zeros
        assert torch.equal(ops.matmul(a, b, backend=backend), torch.zeros(3, 5))
        x, w, bias = _t(4, 0), _t(5, 0), _t(5)
        assert torch.equal(ops.linear(x, w, bias, backend=backend), bias.expand(4, 5))
        assert ops.matmul(_t(2, 0, 3), _t(3, 4), backend=backend).shape == (2, 0, 4)


# ---------------------------------------------------------------------------------------------
# out=
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", [None, "tiled"])
def test_out(cpu_triton, backend):
    a, b = _t(2, 6, 7), _t(7, 5, seed=1)
    want = a @ b
    out = torch.empty(0)
    assert ops.matmul(a, b, out=out, backend=backend) is out  # resized, as torch does
    close(out, want)
    strided = torch.full((5, 12), float("nan"))[:, ::2].t()  # the right shape, not contiguous
    got = ops.matmul(_t(6, 7), b, out=strided, backend=backend)
    assert got is strided and torch.allclose(strided, _t(6, 7) @ b, atol=2e-5)
    wrong = torch.empty(3)
    with pytest.warns(UserWarning, match="resiz"):
        ops.matmul(a, b, out=wrong, backend=backend)
    close(wrong, want)
    x, m = _t(6, 7, seed=3), _t(7, 7, seed=4)
    want = x @ m
    assert ops.matmul(x, m, out=x, backend=backend) is x  # out is the input: product first
    torch.testing.assert_close(x, want, atol=2e-5, rtol=2e-5)
    assert ops.matmul(a[0], _t(7), out=torch.empty(0), backend=backend).shape == (6,)


def _error_of(fn):
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the error itself is compared
        return type(exc), str(exc)
    return None


def test_out_errors_are_torchs():
    a, b = _t(3, 4), _t(4, 2)
    for out, args in ((torch.empty(3, 2, dtype=torch.float64), (a, b)),
                      (torch.empty(3, 2), (a.clone().requires_grad_(), b))):
        want = _error_of(lambda: torch.matmul(*args, out=out))
        assert want is not None
        assert _error_of(lambda: ops.matmul(*args, out=out)) == want


# ---------------------------------------------------------------------------------------------
# Calls only torch takes, argument errors
# ---------------------------------------------------------------------------------------------
def test_argument_errors_name_the_arguments():
    with pytest.raises(InvalidArgument, match=r"input is \(3, 4\) and other \(5, 2\)"):
        ops.matmul(_t(3, 4), _t(5, 2))
    with pytest.raises(InvalidArgument, match="at least 1D"):
        ops.matmul(torch.tensor(1.0), _t(3))
    with pytest.raises(InvalidArgument, match=r"input's last dim is 4, weight is \(5, 3\)"):
        ops.linear(_t(2, 4), _t(5, 3))
    with pytest.raises(TypeError, match="other must be a tensor"):
        ops.matmul(_t(3, 4), [[1.0]])
    with pytest.raises(BackendError, match="unknown backend 'nope'"):
        ops.matmul(_t(3, 4), _t(4, 2), backend="nope")


@pytest.mark.parametrize("case", [
    ("float64", lambda: (_t(3, 4, dtype=torch.float64), _t(4, 2, dtype=torch.float64))),
    ("int64", lambda: (torch.arange(12).view(3, 4), torch.arange(8).view(4, 2))),
    ("complex", lambda: (_t(3, 4).to(torch.complex64), _t(4, 2).to(torch.complex64))),
], ids=lambda c: c[0])
def test_dtypes_only_torch_takes(cpu_triton, case):
    a, b = case[1]()
    want = torch.matmul(a, b)
    for backend in (None, "torch"):
        got = ops.matmul(a, b, backend=backend)
        assert got.dtype == want.dtype and torch.equal(got, want)
    for backend in TRITON:
        with pytest.raises(BackendError, match="only the torch backend can"):
            ops.matmul(a, b, backend=backend)


def test_linear_calls_only_torch_takes(cpu_triton):
    x, w1 = _t(3, 4), _t(4, seed=1)  # a 1-d weight
    assert torch.equal(ops.linear(x, w1), F.linear(x, w1))
    with pytest.raises(BackendError, match="only the torch backend can"):
        ops.linear(x, w1, backend="tiled")
    mixed = (_t(3, 4), _t(5, 4, dtype=torch.float16))
    assert _error_of(lambda: ops.linear(*mixed)) == _error_of(lambda: F.linear(*mixed))


# ---------------------------------------------------------------------------------------------
# Autograd, torch.func
# ---------------------------------------------------------------------------------------------
GRAD_FORMS = [f for f in MATMUL_FORMS if f[0] in ("1d@1d", "1d@2d", "2d@1d", "3d@2d folds",
                                                    "2d@3d", "1d@3d", "broadcast batch",
                                                    "expanded batch")]


def _grads(fn, tensors, seed=5):
    leaves = [t.detach().clone().requires_grad_() for t in tensors]
    y = fn(*leaves)
    g = _t(*y.shape, seed=seed)
    return y, torch.autograd.grad(y, leaves, g)


@pytest.mark.parametrize("backend", [None, "tiled"])
@pytest.mark.parametrize("form", GRAD_FORMS, ids=[f[0] for f in GRAD_FORMS])
def test_matmul_gradients(cpu_triton, form, backend):
    a, b = form[1]()
    y, got = _grads(lambda p, q: ops.matmul(p, q, backend=backend), (a, b))
    want_y, want = _grads(torch.matmul, (a, b))
    close(y.detach(), want_y)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("backend", [None, "persistent"])
@pytest.mark.parametrize("form", LINEAR_FORMS[:5], ids=[f[0] for f in LINEAR_FORMS[:5]])
def test_linear_gradients(cpu_triton, form, backend):
    tensors = [t for t in form[1]() if t is not None]
    y, got = _grads(lambda *t: ops.linear(*t, backend=backend), tensors)
    _, want = _grads(F.linear, tensors)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)


def test_only_the_needed_gradients_and_double_backward(cpu_triton):
    a = _t(3, 4).requires_grad_()
    b = _t(4, 2, seed=1)
    y = ops.matmul(a, b, backend="tiled")
    assert y.requires_grad and y.grad_fn is not None
    (ga,) = torch.autograd.grad(y.pow(2).sum(), a, create_graph=True)
    (gga,) = torch.autograd.grad(ga.sum(), a)
    a2 = a.detach().clone().requires_grad_()
    (wa,) = torch.autograd.grad((a2 @ b).pow(2).sum(), a2, create_graph=True)
    (wwa,) = torch.autograd.grad(wa.sum(), a2)
    torch.testing.assert_close(ga, wa, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gga, wwa, atol=1e-5, rtol=1e-5)


def test_float64_under_autograd_is_torchs(cpu_triton):
    a = _t(3, 4, dtype=torch.float64).requires_grad_()
    y = ops.matmul(a, _t(4, 2, dtype=torch.float64))
    assert "Mm" in type(y.grad_fn).__name__  # torch's own op recorded it
    assert torch.autograd.gradcheck(lambda p: ops.linear(p, _t(5, 4, dtype=torch.float64)),
                                    (a,))


VMAP_CASES = [
    # (name, fn, in_dims, tensors)
    ("matmul a batched", ops.matmul, (0, None), lambda: (_t(3, 6, 7), _t(7, 5, seed=1))),
    ("matmul b batched at 1", ops.matmul, (None, 1), lambda: (_t(6, 7), _t(7, 3, 5, seed=1))),
    ("matmul both", ops.matmul, (0, 0), lambda: (_t(3, 6, 7), _t(3, 7, 5, seed=1))),
    ("matmul vectors", ops.matmul, (0, None), lambda: (_t(3, 7), _t(7, seed=1))),
    ("matmul vector @ batch", ops.matmul, (None, 0), lambda: (_t(7), _t(3, 2, 7, 5, seed=1))),
    ("matmul batch dims", ops.matmul, (0, 0), lambda: (_t(3, 2, 6, 7), _t(3, 7, 5, seed=1))),
    ("linear input", ops.linear, (0, None, None), lambda: (_t(3, 2, 7), _t(5, 7, seed=1),
                                                          _t(5, seed=2))),
    ("linear weight", ops.linear, (None, 0, None), lambda: (_t(2, 7), _t(3, 5, 7, seed=1),
                                                           _t(5, seed=2))),
    ("linear all", ops.linear, (0, 0, 0), lambda: (_t(3, 7), _t(3, 5, 7, seed=1),
                                                  _t(3, 5, seed=2))),
]


@pytest.mark.parametrize("backend", [None, "tiled"])
@pytest.mark.parametrize("case", VMAP_CASES, ids=[c[0] for c in VMAP_CASES])
def test_vmap(cpu_triton, case, backend):
    _, fn, in_dims, make = case
    tensors = make()
    torch_fn = torch.matmul if fn is ops.matmul else F.linear
    want = torch.func.vmap(torch_fn, in_dims=in_dims)(*tensors)
    got = torch.func.vmap(lambda *t: fn(*t, backend=backend), in_dims=in_dims)(*tensors)
    close(got, want)


def test_jvp_and_forward_ad(cpu_triton):
    a, b, ta, tb = _t(3, 4), _t(4, 5, seed=1), _t(3, 4, seed=2), _t(4, 5, seed=3)
    got = torch.func.jvp(lambda p, q: ops.matmul(p, q, backend="tiled"), (a, b), (ta, tb))
    want = torch.func.jvp(torch.matmul, (a, b), (ta, tb))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)
    w_, bias, tw, tbias = _t(5, 4, seed=4), _t(5, seed=5), _t(5, 4, seed=6), _t(5, seed=7)
    got = torch.func.jvp(ops.linear, (a, w_, bias), (ta, tw, tbias))
    want = torch.func.jvp(F.linear, (a, w_, bias), (ta, tw, tbias))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)
    import torch.autograd.forward_ad as fwad

    with fwad.dual_level():
        y = ops.linear(fwad.make_dual(a, ta), w_, bias, backend="persistent")
        tangent = fwad.unpack_dual(y).tangent
    torch.testing.assert_close(tangent, F.linear(ta, w_), atol=1e-5, rtol=1e-5)


def test_jacrev_and_grad(cpu_triton):
    a, b = _t(3, 4), _t(4, 2, seed=1)
    got = torch.func.jacrev(lambda p: ops.matmul(p, b))(a)
    torch.testing.assert_close(got, torch.func.jacrev(lambda p: p @ b)(a))
    got = torch.func.grad(lambda w: ops.linear(a, w).pow(2).sum())(b.t().contiguous())
    want = torch.func.grad(lambda w: F.linear(a, w).pow(2).sum())(b.t().contiguous())
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------
# torch.compile, the library ops
# ---------------------------------------------------------------------------------------------
def products(a, b, x, w, bias):
    return ops.matmul(a, b) * 2, ops.linear(x, w, bias) + 1, ops.linear(x, w)


def products_forced(a, b, x, w, bias):
    return (ops.matmul(a, b, backend="tiled") * 2, ops.linear(x, w, bias, backend="persistent")
            + 1, ops.linear(x, w, backend="tiled"))


def _inputs(n=6, seed=0):
    return (_t(2, n, 7, seed=seed), _t(7, 5, seed=seed + 1), _t(n, 7, seed=seed + 2),
            _t(5, 7, seed=seed + 3), _t(5, seed=seed + 4))


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("fn", [products, products_forced], ids=["auto", "forced"])
def test_compile_fullgraph(cpu_triton, backend, fn):
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=backend, fullgraph=True)
    for seed in (0, 10):
        args = _inputs(seed=seed)
        for g, w in zip(compiled(*args), fn(*args)):
            close(g, w)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(fn)(*_inputs())
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    if fn is products_forced:
        assert opselect.stats()["matmul"]["traced"].get("opselect")
        assert opselect.stats()["linear"]["backends"].get("persistent")


def test_compile_dynamic_and_gradients(cpu_triton):
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(products_forced, backend=counter, dynamic=True, fullgraph=True)
    for n in (6, 9, 13):
        for g, w in zip(compiled(*_inputs(n)), products_forced(*_inputs(n))):
            close(g, w)
    assert counter.frame_count == 1
    leaves = [t.requires_grad_() for t in _inputs()]
    torch._dynamo.reset()
    sum(t.sum() for t in torch.compile(products_forced, backend="aot_eager",
                                       fullgraph=True)(*leaves)).backward()
    got = [t.grad.clone() for t in leaves]
    for t in leaves:
        t.grad = None
    sum(t.sum() for t in products(*leaves)).backward()
    for g, t in zip(got, leaves):
        torch.testing.assert_close(g, t.grad, atol=1e-4, rtol=1e-4)


def test_rule_places_dynamic_shapes_and_keeps_inductors_autotuned_gemm(cpu_triton):
    """The trace-time rule: static shapes on the CPU keep the aten op (torch's is the choice
    there); a symbolic size is opselect's op, which chooses per call at run time; inductor's
    max-autotune keeps its own GEMM."""
    from torch._dynamo.backends.common import aot_autograd

    from opselect.fronts._matmul_rules import inductor_gemm

    def graph_of(x):
        codes: list = []

        def keep(gm, example_inputs):
            codes.append(gm.code)
            return gm.forward

        torch._dynamo.reset()
        w = _t(5, 7, seed=1)
        got = torch.compile(lambda t: ops.linear(t, w), backend=aot_autograd(fw_compiler=keep),
                            fullgraph=True)(x)
        close(got, F.linear(x, w))
        return codes[0]

    assert "opselect" not in graph_of(_t(6, 7))
    x = _t(6, 7)
    torch._dynamo.mark_dynamic(x, 0)
    assert "opselect.linear" in graph_of(x)
    import torch._inductor.config as inductor_config

    assert not inductor_gemm(None, "tiled")
    with inductor_config.patch(max_autotune=True):  # (torch's own switch; restored after)
        assert inductor_gemm(None, "tiled")
    assert not inductor_gemm(None, "tiled")


OPS = torch.ops.opselect
OPCHECK = [
    ("matmul auto", OPS.matmul.default, (_t(2, 3, 4), _t(4, 5, seed=1), None)),
    ("matmul tiled grad", OPS.matmul.default, (_t(3, 4).requires_grad_(), _t(4, 5, seed=1),
                                               "tiled")),
    ("matmul vector", OPS.matmul.default, (_t(4), _t(3, 4, 5, seed=1), "persistent")),
    ("matmul float64", OPS.matmul.default, (_t(3, 4, dtype=torch.float64),
                                            _t(4, 2, dtype=torch.float64), None)),
    ("matmul empty", OPS.matmul.default, (_t(0, 4), _t(4, 5, seed=1), "tiled")),
    ("linear bias grad", OPS.linear.default, (_t(2, 3, 4), _t(5, 4, seed=1).requires_grad_(),
                                              _t(5, seed=2).requires_grad_(), "tiled")),
    ("linear no bias", OPS.linear.default, (_t(3, 4), _t(5, 4, seed=1), None, None)),
    ("matmul_or_aten", OPS.matmul_or_aten.default, (_t(3, 4), _t(4, 5, seed=1), "tiled")),
    ("linear_or_aten", OPS.linear_or_aten.default, (_t(3, 4), _t(5, 4, seed=1), None, None)),
]


@pytest.mark.parametrize("index", range(len(OPCHECK)), ids=[c[0] for c in OPCHECK])
def test_opcheck(cpu_triton, index):
    _, op, args = OPCHECK[index]
    result = torch.library.opcheck(op, args)
    assert all(v == "SUCCESS" for v in result.values()), result


def test_library_ops_vmap_and_forced_refusal(cpu_triton):
    a, b = _t(3, 2, 4), _t(4, 5, seed=1)
    got = torch.vmap(lambda p: OPS.matmul(p, b, "tiled"))(a)
    close(got, a @ b)
    torch._dynamo.reset()
    with pytest.raises(Exception, match="only the torch backend can"):
        torch.compile(lambda p, q: ops.matmul(p, q, backend="tiled"), backend="aot_eager",
                      fullgraph=True)(a.double(), b.double())


# ---------------------------------------------------------------------------------------------
# Routes: a repeated call is answered from its key's route
# ---------------------------------------------------------------------------------------------
def _count_runs(monkeypatch, op) -> mock.Mock:
    """op.run, watched: its call_count is the calls that were not answered by a route."""
    watched = mock.Mock(wraps=op.run)
    monkeypatch.setattr(op, "run", watched)
    return watched


@pytest.mark.parametrize("backend", [None, "tiled"])
def test_repeat_calls_take_the_route(cpu_triton, monkeypatch, backend):
    runs = _count_runs(monkeypatch, MATMUL_OP)
    a, b = _t(4, 7), _t(7, 5, seed=1)
    ops.matmul(a, b, backend=backend)
    key = front.route_key("matmul", a, b)
    table = MATMUL_OP.routes if backend is None else MATMUL_OP.forced_routes
    assert (key if backend is None else (backend, key)) in table
    for seed in range(2, 5):  # fresh values, the same key: no run, no prepare
        a2 = _t(4, 7, seed=seed)
        close(ops.matmul(a2, b, backend=backend), a2 @ b)
    assert runs.call_count == 1
    # nn.Linear's Parameters are keyed as the plain tensors they are
    layer = torch.nn.Linear(7, 3)
    linear_runs = _count_runs(monkeypatch, LINEAR_OP)
    with torch.no_grad():
        for seed in range(3):
            x = _t(4, 7, seed=seed)
            close(ops.linear(x, layer.weight, layer.bias, backend=backend), layer(x))
    assert linear_runs.call_count == 1


def test_a_route_made_without_autograd_does_not_answer_a_call_under_it(cpu_triton):
    a, b = _t(4, 7), _t(7, 5, seed=1)
    ops.matmul(a, b, backend="tiled")  # the route: a product with no graph
    y = ops.matmul(a.clone().requires_grad_(), b, backend="tiled")
    assert y.grad_fn is not None


# ---------------------------------------------------------------------------------------------
# opselect.enable(ops=["matmul"])
# ---------------------------------------------------------------------------------------------
def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(),
                               torch.nn.Linear(32, 8)).eval()


def test_enable_without_ops_leaves_matmul_alone(cpu_triton):
    matmul, linear, addmm, mm_method = torch.matmul, F.linear, torch.addmm, \
        torch.Tensor.__matmul__
    model, x = _mlp(), _t(4, 16)
    with torch.no_grad(), opselect.enabled():
        # not even wrapped: a program that does not name them pays nothing on its products
        assert torch.matmul is matmul and F.linear is linear and torch.addmm is addmm
        assert torch.Tensor.__matmul__ is mm_method
        model(x)
        x @ _t(16, 3)
    assert opselect.stats() == {}
    with pytest.raises(ValueError, match="not among the routed ops"):
        opselect.enable(backends={"matmul": "tiled"})


def test_enable_linear_alone(cpu_triton):
    model, x = _mlp(), _t(4, 16)
    with torch.no_grad(), opselect.enabled(ops=["linear"]):
        model(x)
        torch.matmul(x, _t(16, 3))
    assert set(opselect.stats()) == {"linear"}


@pytest.mark.parametrize("forced", [False, True], ids=["auto", "kernels"])
def test_enable_routes_nn_linear(cpu_triton, forced):
    model, x = _mlp(), _t(4, 16)
    with torch.no_grad():
        want = model(x)
    backends = {"linear": "tiled", "matmul": "persistent"} if forced else None
    with torch.no_grad(), opselect.enabled(ops=["matmul"], backends=backends):
        got = model(x)
        again = model(_t(4, 16))  # (its routes)
        product = got @ _t(8, 3)
    if forced:
        close(got, want)
    else:
        assert torch.equal(got, want)
    assert again.shape == (4, 8) and product.shape == (4, 3)
    stats = opselect.stats()
    name = "tiled" if forced else "torch"
    assert stats["linear"]["backends"] == {name: 4}, stats
    assert stats["matmul"]["backends"] == {"persistent" if forced else "torch": 1}, stats


def test_enable_under_autograd(cpu_triton):
    """Training through routed nn.Linear: the same gradients, each call counted once."""
    model, x = _mlp().train(), _t(4, 16)
    model(x).pow(2).sum().backward()
    want = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    with opselect.enabled(ops=["matmul"], backends={"linear": "tiled"}):
        model(x).pow(2).sum().backward()
    for p, w in zip(model.parameters(), want):
        torch.testing.assert_close(p.grad, w, atol=1e-5, rtol=1e-5)
    assert opselect.stats()["linear"]["backends"] == {"tiled": 2}


def test_enable_routes_every_entry_point_once(cpu_triton):
    """No recursion: the torch backend's own torch.matmul / F.linear / addmm reach torch."""
    a, b, w, bias = _t(3, 4), _t(4, 5, seed=1), _t(5, 4, seed=2), _t(5, seed=3)
    calls = [lambda: torch.matmul(a, b), lambda: a.matmul(b), lambda: a @ b,
             lambda: torch.matmul(input=a, other=b), lambda: F.linear(a, w, bias),
             lambda: F.linear(a, w), lambda: torch.addmm(bias, a, b.t().contiguous().t()),
             lambda: torch.addmm(bias.view(1, 5), a, w.t(), beta=1, alpha=1.0)]
    wants = [c() for c in calls]
    for forced in ({"matmul": "torch", "linear": "torch"}, None):
        opselect.reset_stats()
        with opselect.enabled(ops=["matmul"], backends=forced):
            for c, want in zip(calls, wants):
                got = c()
                assert torch.equal(got, want)
        stats = opselect.stats()
        assert stats["matmul"]["calls"] == 4 and stats["linear"]["calls"] == 4, stats


PASSED = [
    ("float64", lambda: torch.matmul(_t(3, 4).double(), _t(4, 2).double())),
    ("int64", lambda: torch.arange(6).view(2, 3) @ torch.arange(6).view(3, 2)),
    ("out=", lambda: torch.matmul(_t(3, 4), _t(4, 2), out=torch.empty(3, 2))),
    ("mixed dtypes", lambda: torch.matmul(_t(3, 4), _t(4, 2, dtype=torch.float16))),
    ("mismatched", lambda: torch.matmul(_t(3, 4), _t(5, 2))),
    ("a subclass", lambda: torch.matmul(_t(3, 4).as_subclass(_Sub), _t(4, 2))),
    ("linear of float64", lambda: F.linear(_t(3, 4).double(), _t(2, 4).double())),
    ("linear 1-d weight", lambda: F.linear(_t(3, 4), _t(4))),
    ("addmm beta", lambda: torch.addmm(_t(2), _t(3, 4), _t(4, 2), beta=2)),
    ("addmm full input", lambda: torch.addmm(_t(3, 2), _t(3, 4), _t(4, 2))),
    ("addmm out=", lambda: torch.addmm(_t(2), _t(3, 4), _t(4, 2), out=torch.empty(3, 2))),
    ("addmm mismatched", lambda: torch.addmm(_t(2), _t(3, 4), _t(5, 2))),
    ("vmap watching", lambda: torch.vmap(torch.matmul)(_t(2, 3, 4), _t(2, 4, 5))),
]


class _Sub(torch.Tensor):
    pass


@pytest.mark.parametrize("case", PASSED, ids=[p[0] for p in PASSED])
def test_other_calls_reach_torch_untouched(cpu_triton, case):
    want = _error_of(case[1]) or case[1]()
    with opselect.enabled(ops=["matmul"], backends={"matmul": "tiled", "linear": "tiled"}):
        got = _error_of(case[1]) or case[1]()
    if isinstance(want, tuple):
        assert got == want
    else:
        assert type(got) is type(want) and torch.equal(got, want)
    assert opselect.stats() == {}


def _tiny_gpt2():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=64,
                                  vocab_size=128, bos_token_id=1, eos_token_id=2,
                                  pad_token_id=0, attn_implementation="eager")
    return transformers.GPT2LMHeadModel(cfg).eval()


@pytest.mark.parametrize("forced", [False, True], ids=["auto", "kernels"])
def test_enable_routes_gpt2(cpu_triton, forced):
    """Hugging Face's GPT-2 (Conv1D's torch.addmm, the attention's torch.matmul, the head's
    nn.Linear) under enable(ops=["matmul"]): the same logits; every product was opselect's."""
    model = _tiny_gpt2()
    ids = torch.randint(3, 128, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(ids).logits
        backends = {"matmul": "tiled", "linear": "tiled"} if forced else None
        with opselect.enabled(ops=["matmul"], backends=backends):
            got = model(ids).logits
    if forced:
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    else:
        assert torch.equal(got, want)
    stats = opselect.stats()
    # per layer: 4 Conv1D (addmm) and 2 attention products; the head's nn.Linear
    name = "tiled" if forced else "torch"
    assert stats["linear"]["backends"] == {name: 9}, stats
    assert stats["matmul"]["backends"] == {name: 4}, stats


@pytest.mark.slow
def test_compiled_gpt2_under_enable(cpu_triton):
    model = _tiny_gpt2()
    ids = torch.randint(3, 128, (2, 8), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        eager = model(ids).logits
        torch._dynamo.reset()
        with opselect.enabled(ops=["matmul"], backends={"matmul": "tiled", "linear": "tiled"}):
            got = torch.compile(model, backend="aot_eager", fullgraph=True)(ids).logits
    torch.testing.assert_close(got, eager, atol=1e-5, rtol=1e-5)
    stats = opselect.stats()
    assert stats["linear"]["traced"].get("opselect") and stats["linear"]["calls"] == 9, stats
    assert stats["matmul"]["calls"] == 4, stats


# ---------------------------------------------------------------------------------------------
# GPU: larger shapes (run on the lent GPU machine)
# ---------------------------------------------------------------------------------------------
GPU_SHAPES = [((512, 1024), (1024, 768)), ((8, 4096), (4096, 4096)), ((4, 256, 512), (512, 384)),
              ((16, 128, 64), (16, 64, 128)), ((1000, 3000), (3000, 777))]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("shapes", GPU_SHAPES)
def test_gpu_backends(cuda, shapes, dtype):
    gen = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(shapes[0], device="cuda", generator=gen).to(dtype)
    b = torch.randn(shapes[1], device="cuda", generator=gen).to(dtype) / 32
    want = (a.double() @ b.double())
    scale = want.abs().max().item()
    for backend in (None, "torch", "tiled", "splitk", "persistent"):
        try:
            got = ops.matmul(a, b, backend=backend)
        except BackendError:
            assert backend == "splitk"
            continue
        err = (got.double() - want).abs().max().item() / scale
        assert err < (2e-2 if dtype == torch.bfloat16 else 5e-3), (backend, err)
        w = b.mT.contiguous() if b.dim() == 2 else None
        if w is not None:
            bias = torch.randn(w.shape[0], device="cuda", generator=gen).to(dtype)
            got = ops.linear(a, w, bias, backend=backend)
            ref = F.linear(a.double(), w.double(), bias.double())
            assert (got.double() - ref).abs().max().item() / scale < 2e-2, backend


@pytest.mark.gpu
def test_gpu_routed_gpt2(cuda):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=4, n_head=12, n_embd=768, vocab_size=50257,
                                  attn_implementation="eager", pad_token_id=0)
    model = transformers.GPT2LMHeadModel(cfg).cuda().eval().half()
    ids = torch.randint(3, 50257, (4, 64), device="cuda")
    with torch.no_grad():
        want = model(ids).logits.float()
        with opselect.enabled(ops=["matmul"]):
            got = model(ids).logits.float()
        with opselect.enabled(ops=["matmul"], backends={"linear": "tiled", "matmul": "tiled"}):
            forced = model(ids).logits.float()
    torch.testing.assert_close(got, want, atol=5e-2, rtol=5e-2)
    torch.testing.assert_close(forced, want, atol=5e-2, rtol=5e-2)
    assert opselect.stats()["linear"]["calls"] > 0


@pytest.mark.gpu
def test_gpu_compiled_inductor(cuda):
    args = tuple(t.to("cuda") for t in _inputs(64))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch._dynamo.reset()
        got = torch.compile(products_forced, fullgraph=True)(*args)
    for g, w in zip(got, products(*args)):
        torch.testing.assert_close(g, w, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compiled_at_operator_is_routed(cpu_triton, backend):
    """`a @ b` stays operator.matmul in Dynamo's graph; AOTAutograd's trace runs it as an FX
    Interpreter's call_function, which reaches the wrapper directly: the program's own call,
    routed as torch.matmul is. The matmul torch's decomposition of a 3-d @ 2-d product makes
    inside (a reshape and mm) is not the program's and is not counted twice."""
    def fn(a, b, c):
        return (a @ b) * 2, c @ b.t().contiguous().t() + 1

    args = (_t(2, 6, 7), _t(7, 5, seed=1), _t(4, 7, seed=2))
    want = fn(*args)
    torch._dynamo.reset()
    opselect.reset_stats()
    with opselect.enabled(ops=["matmul"], backends={"matmul": "tiled"}):
        got = torch.compile(fn, backend=backend, fullgraph=True)(*args)
    torch._dynamo.reset()
    for g, w in zip(got, want):
        close(g, w)
    stats = opselect.stats()["matmul"]
    if backend == "aot_eager":  # (AOTAutograd traces a graph more than once)
        assert set(stats["traced"]) == {"opselect"}, stats
    assert stats["backends"] == {"tiled": 2}, stats
