"""enable() under torch.autocast: a routed call gives what torch's own op gives under autocast.

On CUDA autocast runs softmax and log_softmax without dtype= as dtype=float32 and casts
cross_entropy's logits to float32 (a float16 loss overflows GradScaler's scaling: 65504); it
casts a product's inputs down (matmul, linear). On the CPU its lists differ, and the routes leave
every such call to torch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import opselect

CALLS = {
    "softmax": lambda x, t, w: torch.softmax(x, -1),
    "F.softmax": lambda x, t, w: F.softmax(x, dim=-1),
    "Tensor.log_softmax": lambda x, t, w: x.log_softmax(-1),
    "softmax with dtype=": lambda x, t, w: F.softmax(x, -1, dtype=torch.float16),
    "cross_entropy": lambda x, t, w: F.cross_entropy(x, t),
    "cross_entropy, rows": lambda x, t, w: F.cross_entropy(x, t, reduction="none"),
    "linear": lambda x, t, w: F.linear(x, w),
    "matmul": lambda x, t, w: x @ w.t(),
}


def inputs(device, rows=64, classes=96, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(rows, classes, generator=g) * 3).to(dtype).to(device)
    t = torch.randint(0, classes, (rows,), generator=g).to(device)
    w = torch.randn(32, classes, generator=g).to(dtype).to(device)
    return x, t, w


def both(fn, device_type, dtype, args, backends=None):
    """(torch's result, the routed result, what opselect ran), each under autocast."""
    with torch.autocast(device_type, dtype=dtype):
        want = fn(*args)
        opselect.reset_stats()
        with opselect.enabled(ops=["softmax", "log_softmax", "matmul"], backends=backends):
            got = fn(*args)
    return want, got, opselect.stats()


@pytest.mark.parametrize("name", list(CALLS))
def test_cpu_autocast_leaves_the_calls_to_torch(cpu_triton, name):
    # (backends forced: without autocast each of these calls would run a kernel)
    forced = {"softmax": "fused", "log_softmax": "fused", "matmul": "tiled", "linear": "tiled"}
    want, got, ran = both(CALLS[name], "cpu", torch.bfloat16, inputs(cpu_triton), forced)
    assert got.dtype == want.dtype, (name, got.dtype, want.dtype)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert all(set(op["backends"]) <= {"torch"} for op in ran.values()), ran


@pytest.mark.gpu
def test_gpu_autocast_keeps_torchs_dtypes(cuda):
    """Rows big enough for opselect's kernels (a Triton backend or the fused loss runs): the
    result has torch's dtype under autocast and its values; the gradient of the fused loss comes
    back in the logits' own dtype."""
    x, t, w = inputs(cuda, rows=8192, classes=32000, dtype=torch.float16)  # (500 MB of logits)
    for name, fn in CALLS.items():
        want, got, ran = both(fn, "cuda", torch.float16, (x, t, w))
        assert got.dtype == want.dtype, (name, got.dtype, want.dtype)
        tol = dict(rtol=2e-3, atol=2e-5) if got.dtype == torch.float32 else {}
        torch.testing.assert_close(got, want, **tol)
        if name.startswith(("softmax", "F.softmax", "Tensor", "cross")):
            assert any(b != "torch" for op in ran.values() for b in op["backends"]), (name, ran)
    xg = x.detach().requires_grad_()
    with torch.autocast("cuda", dtype=torch.float16), opselect.enabled():
        loss = F.cross_entropy(xg, t)
    (grad,) = torch.autograd.grad(loss, xg)
    xd = x.detach().double().requires_grad_()
    (want_grad,) = torch.autograd.grad(F.cross_entropy(xd, t), xd)
    assert loss.dtype == torch.float32 and grad.dtype == torch.float16
    torch.testing.assert_close(grad.double(), want_grad, rtol=2e-3,
                               atol=2e-3 * want_grad.abs().max().item())
