"""The fused loss behind enable()'s route of F.cross_entropy (opselect/kernels/softmax/
cross_entropy.py): the loss and the gradient against torch's own cross_entropy in float64, on
every reduction, ignored targets, special values, strided rows and targets; which calls it takes;
its errors. CPU through the interpreter, and the same checks on a GPU at a vocabulary's size."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import opselect
from opselect.kernels import _common
from opselect.kernels.softmax import cross_entropy as ce

POISON = 7.0
#: (rtol, atol) of the loss and the gradient against float64, per dtype of the logits; atol is
#: relative to the largest magnitude of the answer (see close).
TOL = {torch.float32: (2e-5, 2e-6), torch.bfloat16: (1.6e-2, 8e-3), torch.float16: (2e-3, 1e-3)}


@pytest.fixture(autouse=True)
def poisoned(monkeypatch):
    """The kernels' outputs start as POISON: an element a kernel forgets to write shows."""
    monkeypatch.setattr(_common, "POISON", POISON)


def fused_calls() -> int:
    return opselect.stats().get("log_softmax", {}).get("backends", {}).get("fused_loss", 0)


def loss_and_grad(x, target, g=None, routed=False, **kwargs):
    x = x.detach().requires_grad_()
    with opselect.enabled() if routed else _nothing():
        loss = F.cross_entropy(x, target, **kwargs)
    (grad,) = torch.autograd.grad(loss, x, g if g is not None else torch.ones_like(loss))
    return loss, grad


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def check(x, target, g=None, **kwargs):
    """The routed call takes the fused loss once and agrees with torch's cross_entropy of the
    float64 logits (NaN where it has NaN, the same infinities)."""
    opselect.reset_stats()
    got, got_grad = loss_and_grad(x, target, g, routed=True, **kwargs)
    assert fused_calls() == 1, opselect.stats()
    reference = {k: v.double() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    want, want_grad = loss_and_grad(x.double(), target,
                                    None if g is None else g.double(), **reference)
    assert got.dtype == x.dtype and got.shape == want.shape
    assert got_grad.dtype == x.dtype and got_grad.shape == x.shape
    close(got, want, x.dtype)
    close(got_grad, want_grad, x.dtype)
    return got, got_grad


def close(got, want, dtype):
    """got (of dtype) against the float64 want: NaN where it is NaN, the same infinities, and
    elsewhere within TOL, its absolute part relative to want's largest finite magnitude (a mean
    loss's gradient is tiny everywhere)."""
    rtol, atol = TOL[dtype]
    finite = want[torch.isfinite(want)]
    scale = finite.abs().max().item() if finite.numel() else 1.0
    torch.testing.assert_close(got.double(), want, rtol=rtol, atol=atol * scale,
                               equal_nan=True)


def logits(rows, classes, dtype=torch.float32, seed=0, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, classes, generator=g) * scale).to(dtype)


def targets(rows, classes, seed=1, ignored=(), ignore_index=-100):
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(0, classes, (rows,), generator=g)
    for r in ignored:
        t[r] = ignore_index
    return t


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_matches_torch(cpu_triton, dtype, reduction):
    # 37 and 53 classes: several 16-element blocks and a partial last one (the interpreter's
    # block), rows ignored among them.
    for rows, classes in ((5, 37), (9, 53), (3, 16)):
        x = logits(rows, classes, dtype, seed=classes)
        t = targets(rows, classes, ignored=(1,))
        g = torch.randn(rows, dtype=dtype) if reduction == "none" else torch.tensor(
            1.7, dtype=dtype)
        check(x, t, g, reduction=reduction)


def test_special_values(cpu_triton):
    x = logits(8, 40)
    x[0, 3] = float("nan")  # a NaN row: NaN loss and gradient, as torch's
    x[1, :] = float("-inf")  # every class impossible: NaN
    x[2, 7] = float("inf")  # inf - inf: NaN
    x[3, :20] = float("-inf")  # half the row impossible, the target among the rest
    x[4, :] = 0.0  # a flat row: log(40)
    x[5] = torch.linspace(-3e4, 3e4, 40)  # far apart: exp underflows, none overflows
    x[6, 11] = -0.0
    t = torch.tensor([3, 1, 2, 25, 9, 39, 11, 0])
    got, _ = check(x, t, torch.randn(8), reduction="none")
    assert torch.isnan(got[:3]).all() and torch.isfinite(got[3:]).all()
    # a target whose logit is -inf: an infinite loss, as torch's
    x[7, 0] = float("-inf")
    got, _ = check(x[7:].clone(), t[7:], reduction="sum")
    assert got.item() == float("inf")


def test_ignored_rows_and_an_ignore_index_of_its_own(cpu_triton):
    x = logits(6, 30, seed=4)
    t = targets(6, 30, ignored=(0, 2, 5), ignore_index=7)
    got, grad = check(x, t, ignore_index=7)
    assert (grad[[0, 2, 5]] == 0).all()  # no gradient for an ignored row
    # every target ignored: 'mean' is 0 / 0 (NaN) and the gradient zero, as torch's
    t = torch.full((6,), 7)
    got, grad = check(x, t, ignore_index=7)
    assert torch.isnan(got) and (grad == 0).all()


def test_strided_rows_and_targets(cpu_triton):
    wide = logits(7, 64, seed=5)
    x = wide[:, 5:50]  # rows 64 apart, 45 classes
    t = targets(14, 45)[::2]  # every other target
    assert x.stride() == (64, 1) and t.stride() == (2,)
    check(x, t)
    check(x, t, torch.randn(7), reduction="none")
    # rows back to back from an element past a 16-byte boundary: read element by element
    flat = logits(1, 1 + 5 * 37, seed=7).flatten()
    x = flat[1:].view(5, 37)
    assert x.data_ptr() % 16 and ce._vector(x) == 1
    check(x, targets(5, 37))
    # back to back from a boundary, off the grid after the first row: whole vectors
    x = flat[:-1].view(5, 37)
    assert ce._vector(x) == 4
    check(x, targets(5, 37))


def test_double_backward_through_torch_ops(cpu_triton):
    x = logits(4, 20, seed=6).double().float().requires_grad_()
    t = targets(4, 20)
    with opselect.enabled():
        loss = F.cross_entropy(x, t)
    (grad,) = torch.autograd.grad(loss, x, create_graph=True)
    (hess_v,) = torch.autograd.grad((grad * grad).sum(), x)
    xd = x.detach().double().requires_grad_()
    (gd,) = torch.autograd.grad(F.cross_entropy(xd, t), xd, create_graph=True)
    (want,) = torch.autograd.grad((gd * gd).sum(), xd)
    torch.testing.assert_close(hess_v.double(), want, rtol=1e-4, atol=1e-6)


def test_a_target_out_of_range_is_refused(cpu_triton):
    x = logits(4, 10)
    for bad in (10, -1, -101):
        t = torch.tensor([1, bad, 2, 3])
        with opselect.enabled(), pytest.raises(IndexError, match=f"target {bad} is out of"):
            F.cross_entropy(x, t)
    with opselect.enabled(), pytest.raises(ValueError, match="reduction"):
        ce.fused_cross_entropy(x, torch.tensor([1, 2, 3, 4]), -100, "average")


def test_which_calls_take_it(cpu_triton):
    """2-D logits with unit column stride, float16/bfloat16/float32, one int64 target a row,
    class weights of their dtype or label smoothing (not both), no forced log_softmax backend;
    everything else keeps the composed route or goes to torch."""
    x, t = logits(4, 12), targets(4, 12)
    taken = [lambda: F.cross_entropy(x, t), lambda: F.cross_entropy(x, t, reduction="sum"),
             lambda: torch.nn.CrossEntropyLoss(ignore_index=3)(x, t),
             lambda: F.cross_entropy(x, t, weight=torch.ones(12)),
             lambda: F.cross_entropy(x, t, label_smoothing=0.2)]
    others = [lambda: F.cross_entropy(x, t, weight=torch.ones(12), label_smoothing=0.1),
              lambda: F.cross_entropy(x, t, weight=torch.ones(12, dtype=torch.float64)),
              lambda: F.cross_entropy(x, t, weight=torch.ones(12, requires_grad=True)),
              lambda: F.cross_entropy(x.double(), t),
              lambda: F.cross_entropy(x.t(), targets(12, 4)),  # column stride 12
              lambda: F.cross_entropy(x.reshape(2, 2, 12).transpose(1, 2), t.reshape(2, 2)),
              lambda: F.cross_entropy(x[0], t[0])]  # one unbatched row
    for fn in taken:
        opselect.reset_stats()
        with opselect.enabled():
            fn()
        assert fused_calls() == 1
    for fn in others:
        opselect.reset_stats()
        with opselect.enabled():
            try:
                fn()
            except RuntimeError as error:  # (torch's own, about the weight)
                assert "scalar type" in str(error) or "not differentiable" in str(error)
        assert fused_calls() == 0, opselect.stats()
    opselect.reset_stats()
    with opselect.enabled(backends={"log_softmax": "fused"}):
        F.cross_entropy(x, t)
    assert fused_calls() == 0 and opselect.stats()["log_softmax"]["backends"] == {"fused": 1}


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_class_weights(cpu_triton, reduction):
    """weight[target] scales each row's loss and gradient; 'mean' divides by the weights' sum
    over the rows that count (ignored rows weigh nothing)."""
    x = logits(9, 53, seed=8)
    t = targets(9, 53, ignored=(2, 5))
    w = torch.rand(53, generator=torch.Generator().manual_seed(9)) + 0.1
    g = torch.randn(9) if reduction == "none" else None
    check(x, t, g, weight=w, reduction=reduction)
    check(x.to(torch.bfloat16), t, g, weight=w.to(torch.bfloat16), reduction=reduction)


@pytest.mark.parametrize("smoothing", [0.1, 0.5, 1.0])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_label_smoothing(cpu_triton, smoothing, reduction):
    """torch's label smoothing: (1 - e) of the target's -log p and e of the mean -log p over the
    classes, the gradient softmax - ((1 - e) onehot + e / C); ignored rows count for nothing."""
    x = logits(9, 53, seed=10)
    t = targets(9, 53, ignored=(4,))
    g = torch.randn(9) if reduction == "none" else None
    check(x, t, g, label_smoothing=smoothing, reduction=reduction)
    x[1, 7] = float("-inf")  # an impossible class: an infinite smoothing term, as torch's
    got, _ = check(x, t, g, label_smoothing=smoothing, reduction=reduction)
    assert not torch.isfinite(got).all()


def test_empty_batch(cpu_triton):
    x = torch.empty(0, 9)
    t = torch.empty(0, dtype=torch.int64)
    got, grad = loss_and_grad(x, t, routed=True, reduction="sum")
    assert got.item() == 0 and grad.shape == (0, 9)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_gpu_fused_loss_over_a_vocabulary(cuda, dtype):
    """A language model's loss at a real size (float32 as Hugging Face upcasts, bfloat16), a
    seventh of the tokens ignored: the fused loss runs, and agrees with torch in float64."""
    for tokens, vocab in ((4096, 50257), (2048, 128256)):  # (past FUSED_LOSS_MIN_BYTES)
        torch.manual_seed(vocab)
        x = (torch.randn(tokens, vocab, device=cuda) * 2).to(dtype)
        t = torch.randint(0, vocab, (tokens,), device=cuda)
        t[::7] = -100
        for reduction in ("mean", "none"):
            g = (torch.randn(tokens, device=cuda, dtype=dtype) if reduction == "none"
                 else None)
            check(x, t, g, reduction=reduction)
        check(x, t, label_smoothing=0.1)
        w = torch.rand(vocab, device=cuda).to(dtype) + 0.5
        check(x, t, weight=w, reduction="sum")


@pytest.mark.gpu
def test_gpu_logits_on_another_device(cuda, monkeypatch):
    """Logits on the second GPU while the first is current: both kernels launch with the logits'
    device current (Triton launches on the current device's stream; with peer access the
    other device's would even give the right numbers, unordered with the logits' stream), and
    the loss and gradient are right."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    current = []
    for name in ("_FORWARD", "_BACKWARD"):
        launcher = getattr(ce, name)
        monkeypatch.setattr(ce, name, lambda *a, launcher=launcher: (
            current.append(torch.cuda.current_device()), launcher(*a)))
    assert torch.cuda.current_device() == 0
    x = (torch.randn(4096, 32000) * 2).to("cuda:1")
    t = torch.randint(0, 32000, (4096,)).to("cuda:1")
    got, grad = check(x, t)
    assert got.device == grad.device == x.device
    assert current == [1, 1] and torch.cuda.current_device() == 0


@pytest.mark.gpu
def test_gpu_logits_past_2_to_the_31_elements(cuda):
    """A batch whose logits pass 2**31 elements (17,000 tokens of Llama 3's 128,256): the rows
    past that offset get their own losses and gradients (64-bit row offsets), checked against
    torch on those rows alone."""
    tokens, vocab = 17000, 128256
    assert tokens * vocab > 2**31
    x = torch.empty(tokens, vocab, device=cuda, dtype=torch.bfloat16).normal_(0, 2)
    t = torch.randint(0, vocab, (tokens,), device=cuda)
    g = torch.randn(tokens, device=cuda, dtype=torch.bfloat16)
    xg = x.requires_grad_()
    with opselect.enabled():
        loss = F.cross_entropy(xg, t, reduction="none")
    (grad,) = torch.autograd.grad(loss, xg, g)
    tail = slice(tokens - 64, tokens)  # rows wholly past element 2**31
    assert (tokens - 64) * vocab > 2**31
    xd = x[tail].detach().double().requires_grad_()
    want = F.cross_entropy(xd, t[tail], reduction="none")
    (want_grad,) = torch.autograd.grad(want, xd, g[tail].double())
    close(loss[tail], want, torch.bfloat16)
    close(grad[tail], want_grad, torch.bfloat16)
    del x, xg, grad
