"""Calls torch answers that once crashed or answered differently, for every backend and auto:
empty dims anywhere, k = 0, subnormal values, and the exception class of every call torch rejects.

Each test runs on the CPU through the interpreter and, marked `gpu`, on CUDA, where float
compares may flush subnormals to zero (the interpreter did that too: it converts bfloat16
subnormals to 0.0, which made 0.0 a member of a test set holding only a subnormal).
"""

from __future__ import annotations

import math

import pytest
import torch

from opselect import ops
from opselect.dispatch import get_op
from opselect.errors import BackendError
from opselect.dispatch.device import INTERPRETED
from opselect.kernels.matmul import LINEAR_OP, MATMUL_OP, prepare_addmm

HAS_CUDA = torch.cuda.is_available()
DEVICES = [pytest.param("cpu", marks=pytest.mark.skipif(not INTERPRETED, reason="interpreter")),
           pytest.param("cuda", marks=pytest.mark.gpu)]
FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


@pytest.fixture(params=DEVICES)
def device(request):
    if request.param == "cuda" and not HAS_CUDA:
        pytest.skip("needs a CUDA device")
    return request.param


def every_backend(op: str) -> list:
    return [None, *get_op(op).backend_names]


def forced(fn, *args, backend, **kwargs):
    """fn with backend=..., or None when that backend refuses the call (it says why)."""
    try:
        return fn(*args, backend=backend, **kwargs)
    except BackendError:
        return None


# -- empty dims ---------------------------------------------------------------------------------
SOFTMAX_EMPTY = [((0, 1100), -1, None), ((3, 0, 1025), -1, torch.bfloat16), ((3, 0, 7), 0, None),
                 ((2, 3, 0), 1, None), ((0,), 0, None), ((4, 0), 0, None)]


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("shape, dim, dtype", SOFTMAX_EMPTY)
def test_softmax_of_an_empty_tensor(device, log, shape, dim, dtype):
    x = torch.randn(shape, dtype=torch.float16, device=device).requires_grad_()
    ours, ref_fn = (ops.log_softmax, torch.log_softmax) if log else (ops.softmax, torch.softmax)
    ref = ref_fn(x, dim, dtype=dtype)
    for backend in every_backend("log_softmax" if log else "softmax"):
        y = forced(ours, x, dim, dtype=dtype, backend=backend)
        if y is None:
            continue
        assert y.shape == ref.shape and y.dtype == ref.dtype and y.device == ref.device, backend
        (g,) = torch.autograd.grad(y.sum(), x)
        assert g.shape == x.shape, backend


TOPK_EMPTY = [((4500, 3, 1), 0, -3), ((5, 1, 600), 0, 2), ((0, 1, 600), 0, -1), ((3, 0), 2, 0),
              ((0,), 0, 0), ((7,), 0, 0), ((2, 0, 5), 3, -1)]


@pytest.mark.parametrize("shape, k, dim", TOPK_EMPTY)
@pytest.mark.parametrize("largest", [True, False])
def test_topk_with_nothing_to_select(device, shape, k, dim, largest):
    x = torch.randn(shape, device=device)
    ref = torch.topk(x, k, dim, largest)
    for backend in every_backend("topk"):
        got = forced(ops.topk, x, k, dim, largest, backend=backend)
        if got is None:
            continue
        for a, b in zip(got, ref):
            assert a.shape == b.shape and a.dtype == b.dtype and a.device == b.device, backend


@pytest.mark.parametrize("shape, dims", [((0, 3, 4), (2, 0, 1)), ((3, 0), (1, 0)),
                                         ((2, 3, 0, 5), (3, 2, 1, 0))])
def test_permute_of_an_empty_tensor(device, shape, dims):
    x = torch.randn(shape, device=device)
    ref = x.permute(dims).contiguous()
    for backend in every_backend("permute"):
        got = forced(ops.permute, x, dims, backend=backend)
        if got is not None:
            assert got.shape == ref.shape and got.is_contiguous(), backend


@pytest.mark.parametrize("m, n", [(0, 5), (0, 0), (6, 0)])
@pytest.mark.parametrize("invert", [False, True])
def test_isin_with_an_empty_side(device, m, n, invert):
    e = torch.arange(m, device=device).reshape(m, 1) if m else torch.empty(0, 4, device=device,
                                                                           dtype=torch.int64)
    t = torch.arange(n, device=device)
    ref = torch.isin(e, t, invert=invert)
    for backend in every_backend("isin"):
        got = forced(ops.isin, e, t, invert=invert, backend=backend)
        if got is not None:
            assert got.shape == ref.shape and torch.equal(got, ref), backend


MATMUL_EMPTY = [((0, 5), (5, 3)), ((3, 0), (0, 4)), ((2, 3, 0), (0, 4)), ((0,), (0,)),
                ((4, 300), (300, 0)), ((0, 2, 3), (3, 4)), ((3, 0), (2, 0, 5))]


@pytest.mark.parametrize("a_shape, b_shape", MATMUL_EMPTY)
def test_matmul_with_nothing_to_compute(device, a_shape, b_shape):
    # (MATMUL_OP itself: the kernels' op, until ops.matmul calls it)
    a = torch.randn(a_shape, device=device, dtype=torch.bfloat16)
    b = torch.randn(b_shape, device=device, dtype=torch.bfloat16)
    ref = torch.matmul(a, b)
    for backend in every_backend("matmul"):
        got = forced(MATMUL_OP, a, b, backend=backend)
        assert got is not None, backend  # (an empty call: every backend answers it)
        assert got.shape == ref.shape and got.dtype == ref.dtype and got.device == ref.device
        assert torch.equal(got, ref), backend


@pytest.mark.parametrize("x_shape", [(3, 0), (0,), (2, 4, 0), (0, 7)])
def test_linear_and_addmm_with_nothing_to_compute(device, x_shape):
    k = x_shape[-1]
    x = torch.randn(x_shape, device=device)
    w, bias = torch.randn(5, k, device=device), torch.randn(5, device=device)
    for b in (bias, None, bias[:1].reshape(())):
        ref = torch.nn.functional.linear(x, w, b)
        for backend in every_backend("linear"):
            got = forced(LINEAR_OP, x, w, b, backend=backend)
            assert got is not None and got.shape == ref.shape, backend
            assert torch.equal(got, ref), (backend, b)
    if len(x_shape) == 2:
        for b in (bias, bias.view(1, 5)):
            ref = torch.addmm(b, x, w.t())
            for backend in every_backend("linear"):
                got = LINEAR_OP.run(prepare_addmm(b, x, w.t()), backend)
                assert got.shape == ref.shape and torch.equal(got, ref), backend


# -- subnormal values ---------------------------------------------------------------------------
def smallest_subnormal(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).smallest_normal * torch.finfo(dtype).eps


def special_values(dtype: torch.dtype) -> torch.Tensor:
    s = smallest_subnormal(dtype)
    tiny = torch.finfo(dtype).smallest_normal
    vals = [0.0, -0.0, s, -s, 2 * s, tiny / 2, tiny, -tiny, 1.0, 2.0, math.inf, -math.inf,
            math.nan]
    return torch.tensor(vals, dtype=torch.float64).to(dtype)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


@pytest.mark.parametrize("dtype", FLOATS)
def test_subnormals_are_their_own_values_in_isin(device, dtype):
    values = special_values(dtype)
    assert bits(values[2]).item() == 1, "the smallest subnormal must not have been flushed"
    elements = values.repeat(40)[torch.randperm(40 * values.numel())].reshape(20, -1).to(device)
    tests = [values[2:3], values[3:4], values[0:1], values[1:2], values[4:6], values[2:7],
             values[:1].reshape(())]
    s = smallest_subnormal(dtype)
    for test in tests:
        test = test.to(device)
        ref = torch.isin(elements, test)
        for backend in every_backend("isin"):
            got = forced(ops.isin, elements, test, backend=backend)
            if got is not None:
                assert torch.equal(got, ref), (backend, test.tolist(), int((got != ref).sum()))
        # the call: a subnormal 0-d test value, 0.0 among the elements
    got = ops.isin(elements, torch.tensor(s, dtype=dtype, device=device))
    assert not bool(got[elements == 0].any())


@pytest.mark.parametrize("dtype", FLOATS)
def test_subnormals_order_in_topk(device, dtype):
    values = special_values(dtype)
    x = values[torch.randperm(values.numel())].to(device)
    for largest in (True, False):
        ref = torch.topk(x, 9, largest=largest)
        for backend in every_backend("topk"):
            got = forced(ops.topk, x, 9, largest=largest, backend=backend)
            if got is not None:
                same = dict(rtol=0, atol=0, equal_nan=True, msg=f"{backend}, largest={largest}")
                torch.testing.assert_close(got.values, ref.values, **same)
                torch.testing.assert_close(x[got.indices], got.values, **same)


@pytest.mark.parametrize("dtype", FLOATS)
def test_subnormals_copied_bit_exact_by_permute(device, dtype):
    values = special_values(dtype)
    x = values.repeat(6)[: 6 * 12].reshape(6, 12).to(device)
    for backend in every_backend("permute"):
        got = forced(ops.permute, x, (1, 0), backend=backend)
        if got is not None:
            assert torch.equal(bits(got), bits(x.t().contiguous())), backend


@pytest.mark.parametrize("dtype", FLOATS)
def test_subnormal_inputs_of_softmax(device, dtype):
    s = smallest_subnormal(dtype)
    x = torch.tensor([[s, -s, 0.0, 2 * s], [s, 1.0, -1.0, 0.0]], dtype=dtype, device=device)
    for backend in every_backend("softmax"):
        got = forced(ops.softmax, x, -1, backend=backend)
        if got is not None:
            torch.testing.assert_close(got, torch.softmax(x, -1), msg=backend)


@pytest.mark.parametrize("dtype", FLOATS[:3])
def test_subnormals_in_matmul(device, dtype):
    """Subnormal inputs times exact factors (+-1, 2, 0): their products and sums are exact, so
    the answer is torch's bit for bit; on CUDA a kernel may flush a subnormal result to zero
    (the hardware's choice), nothing else."""
    s = smallest_subnormal(dtype)
    tiny = torch.finfo(dtype).smallest_normal
    a = torch.tensor([[s, -s, 2 * s, 0.0], [tiny / 2, 1.0, -1.0, s], [tiny, -tiny, s, -0.0]],
                     dtype=torch.float64).to(dtype).to(device)
    b = torch.tensor([[1.0, 2.0, 0.0], [0.0, 1.0, -1.0], [1.0, 0.0, 1.0], [2.0, 0.0, 0.0]],
                     dtype=torch.float64).to(dtype).to(device)
    assert bits(a[0, 0]).item() == 1, "the smallest subnormal must not have been flushed"
    ref = torch.matmul(a, b)
    flushed = None
    if device == "cpu" and dtype == torch.bfloat16:
        # (Triton's interpreter reads bfloat16 subnormals as 0.0: its kernels see those inputs)
        def flush(t):
            return torch.where(t.abs() < tiny, torch.zeros_like(t), t)

        flushed = torch.matmul(flush(a), flush(b))
    for backend in every_backend("matmul"):
        got = forced(MATMUL_OP, a, b, backend=backend)
        if got is None:
            continue
        same = got == ref
        if flushed is not None and backend != "torch":
            same |= got == flushed
        if device == "cuda":
            same |= (got == 0) & (ref.abs() < tiny)
        assert bool(same.all()), (backend, got.tolist(), ref.tolist())


# -- lazy negative views ------------------------------------------------------------------------
def _negated(t: torch.Tensor, strided: bool = False) -> torch.Tensor:
    """A view of -t that holds t's bits with the negative bit set: what z.conj().imag returns
    (strided; a kernel that copies it first resolves the bit) or autograd's contiguous kind."""
    view = torch.complex(torch.zeros_like(t), t).conj().imag if strided else torch._neg_view(t)
    assert view.is_neg()
    return view


@pytest.mark.parametrize("strided", [False, True])
@pytest.mark.parametrize("case", ["isin elements", "isin test", "topk", "softmax",
                                  "log_softmax", "permute"])
@pytest.mark.slow
def test_lazy_negative_views_are_read_as_their_values(device, case, strided):
    # The kernels read memory, where a negative view keeps its values un-negated: every backend
    # once answered for the un-negated values. Each call runs twice: the second takes the
    # memoised call (and the torch route, where auto chose torch).
    torch.manual_seed(0)
    x = torch.randn(6, 40, device=device)
    if case == "isin test":
        x[0, :3] = -x[1, :3]  # members of the negated test set
    neg, plain = _negated(x, strided), -x
    op, calls = {
        "isin elements": ("isin", lambda v, backend: ops.isin(v, x[:, :5].reshape(-1),
                                                              backend=backend)),
        "isin test": ("isin", lambda v, backend: ops.isin(x, v[:, :5].reshape(-1),
                                                          backend=backend)),
        "topk": ("topk", lambda v, backend: ops.topk(v, 3, backend=backend)),
        "softmax": ("softmax", lambda v, backend: ops.softmax(v, -1, backend=backend)),
        "log_softmax": ("log_softmax", lambda v, backend: ops.log_softmax(v, 0, backend=backend)),
        "permute": ("permute", lambda v, backend: ops.permute(v, (1, 0), backend=backend)),
    }[case]
    for backend in every_backend(op):
        for _ in range(2):
            # A call that would read the un-negated values first, to fill the memos.
            forced(calls, x, backend=backend)
            got = forced(calls, neg, backend=backend)
            if got is None:
                continue
            want = calls(plain, backend="torch")
            if case == "topk":
                assert torch.equal(got.values, want.values), backend
            else:
                torch.testing.assert_close(got, want, msg=backend)


@pytest.mark.parametrize("op", ["softmax", "topk"])
def test_gradient_through_a_lazy_negative_view(device, op):
    x = torch.randn(4, 40, device=device, dtype=torch.float64)
    for backend in every_backend(op):
        a = x.clone().requires_grad_()
        b = x.clone().requires_grad_()
        fn = ((lambda v, backend: ops.softmax(v, -1, backend=backend)) if op == "softmax" else
              (lambda v, backend: ops.topk(v, 5, backend=backend).values))
        got = forced(fn, _negated(a), backend=backend)
        if got is None:
            continue
        want = fn(-b, backend="torch")
        g = torch.randn_like(want)
        got.backward(g)
        want.backward(g)
        torch.testing.assert_close(a.grad, b.grad, msg=backend)


# -- the exception torch raises -----------------------------------------------------------------
def _sample(dtype: torch.dtype, n: int = 6) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.tensor([True, False] * (n // 2))
    if dtype.is_complex:
        return torch.randn(n, dtype=dtype)
    if dtype.is_floating_point:
        return torch.randn(n).to(dtype)
    return torch.arange(n).to(dtype)


ODD_DTYPES = [torch.bool, torch.uint8, torch.int64, torch.uint16, torch.uint32, torch.uint64,
              torch.complex64, torch.float8_e4m3fn, torch.float8_e5m2]
REJECTS = {
    "isin": lambda d: ((torch.isin, ops.isin), (_sample(d), _sample(d)), {}),
    "isin with int64": lambda d: ((torch.isin, ops.isin), (_sample(d), _sample(torch.int64)), {}),
    "isin of a scalar": lambda d: ((torch.isin, ops.isin), (_sample(d), True), {}),
    # torch answers an empty `elements` before it promotes, whatever the other dtype
    "empty isin with int64": lambda d: ((torch.isin, ops.isin),
                                        (_sample(d)[:0], _sample(torch.int64)), {}),
    "isin with an empty int64": lambda d: ((torch.isin, ops.isin),
                                           (_sample(d), _sample(torch.int64)[:0]), {}),
    "empty isin of an int": lambda d: ((torch.isin, ops.isin), (_sample(d)[:0], 3), {}),
    "topk": lambda d: ((torch.topk, ops.topk), (_sample(d), 2), {}),
    "softmax": lambda d: ((torch.softmax, ops.softmax), (_sample(d), 0), {}),
    "log_softmax": lambda d: ((torch.log_softmax, ops.log_softmax), (_sample(d), 0), {}),
    "softmax to dtype": lambda d: ((torch.softmax, ops.softmax), (torch.randn(4), 0),
                                   {"dtype": d}),
}


@pytest.mark.parametrize("case", sorted(REJECTS))
@pytest.mark.parametrize("dtype", ODD_DTYPES, ids=str)
def test_rejected_as_torch_rejects(case, dtype):
    """Where torch raises, opselect raises an instance of the same class (NotImplementedError for
    a dtype torch has no kernel for, RuntimeError for an unsupported input type), with its own
    message; where torch answers, so does opselect."""
    (torch_fn, ours), args, kwargs = REJECTS[case](dtype)
    try:
        torch_fn(*args, **kwargs)
        torch_error = None
    except Exception as exc:  # noqa: BLE001 - whatever torch raises is the reference
        torch_error = exc
    if torch_error is None:
        want, got = torch_fn(*args, **kwargs), ours(*args, **kwargs)
        for w, g in zip(*(x if isinstance(x, tuple) else (x,) for x in (want, got)),
                        strict=True):
            assert g.dtype == w.dtype and g.shape == w.shape
            assert torch.equal(g, w)
        return
    with pytest.raises(type(torch_error)):
        ours(*args, **kwargs)
