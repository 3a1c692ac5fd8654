"""PyTorch's own gradient checks (the OpInfo samples and the gradcheck settings PyTorch tests its
ops with) through auto and every backend of opselect's differentiable ops: reverse mode, forward
mode (check_forward_ad), batched gradients (check_batched_grad: vmap over the backward) and
batched forward gradients, wherever torch's OpInfo enables them. Then torch.func's transforms
over every op (vmap, jvp, grad) against torch's own op under the same transform, a dual tensor's
tangent (never dropped), the torch.library ops under forward AD and vmap, and the out= rule.

On the CPU the Triton backends run through the interpreter; marked `gpu`, the same checks run on
CUDA.
"""

from __future__ import annotations

import pytest
import torch
import torch.autograd.forward_ad as fwAD

pytest.importorskip("expecttest")  # torch.testing._internal needs it
from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402

import opselect.library  # noqa: E402,F401  (registers torch.ops.opselect)
from opselect import ops  # noqa: E402
from opselect.dispatch import get_op  # noqa: E402
from opselect.dispatch.device import INTERPRETED  # noqa: E402
from opselect.errors import BackendError  # noqa: E402

#: The differentiable ops: OpInfo name -> (opselect function, dispatcher op).
GRAD_OPS = {"topk": (ops.topk, "topk"), "softmax": (ops.softmax, "softmax"),
            "log_softmax": (ops.log_softmax, "log_softmax"),
            "permute": (ops.permute, "permute"), "transpose": (ops.transpose, "permute")}
INFOS = [o for o in op_db if o.name in GRAD_OPS]
DEVICES = [pytest.param("cpu", marks=pytest.mark.skipif(not INTERPRETED, reason="interpreter")),
           pytest.param("cuda", marks=pytest.mark.gpu)]


def _id(info) -> str:
    return info.name + (f".{info.variant_test_name}" if info.variant_test_name else "")


def _device(device: str) -> None:
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")


def _differentiable(out):
    """The outputs gradcheck differentiates: topk's values (its indices carry no gradient)."""
    return out.values if isinstance(out, torch.return_types.topk) else out


def _with(fn, args, kwargs, backend):
    return lambda x: _differentiable(fn(x, *args, **kwargs, backend=backend))


@pytest.mark.parametrize("info", INFOS, ids=_id)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.slow
def test_gradcheck_every_backend(info, device):
    """gradcheck with the OpInfo's own switches: forward AD, batched grads and batched forward
    grads, in float64, for auto and each backend that takes the sample."""
    _device(device)
    fn, op_name = GRAD_OPS[info.name]
    backends = [None, *get_op(op_name).backend_names]
    ran = {b: 0 for b in backends}
    for sample in info.sample_inputs(device, torch.float64, requires_grad=True):
        if sample.input.numel() > 64 and device == "cpu":
            continue  # the interpreter: every gradcheck evaluation launches the kernels again
        for b in backends:
            f = _with(fn, sample.args, sample.kwargs, b)
            try:
                with torch.no_grad():
                    f(sample.input)
            except BackendError:
                assert b is not None, "auto refused a sample"
                continue
            what = f"{info.name}({tuple(sample.input.shape)}, {sample.args}, {sample.kwargs}, " \
                   f"backend={b})"
            assert torch.autograd.gradcheck(
                f, (sample.input,), fast_mode=True,
                check_forward_ad=info.supports_forward_ad,
                check_batched_grad=info.check_batched_grad,
                check_batched_forward_grad=info.check_batched_forward_grad
                and info.supports_forward_ad), what
            ran[b] += 1
    assert ran[None], "no sample ran"


def _ref(info, x, sample):
    out = info.op(x, *sample.args, **sample.kwargs)
    return _differentiable(out)


@pytest.mark.slow  # (make test-all; see the Makefile)
@pytest.mark.parametrize("info", INFOS, ids=_id)
@pytest.mark.parametrize("device", DEVICES)
def test_dual_tangent_never_dropped(info, device):
    """A dual tensor (torch.autograd.forward_ad) keeps its tangent through every backend, equal
    to torch's."""
    _device(device)
    fn, op_name = GRAD_OPS[info.name]
    for sample in info.sample_inputs(device, torch.float32, requires_grad=False):
        x = sample.input
        tangent = torch.randn_like(x)
        with fwAD.dual_level():
            want = fwAD.unpack_dual(_ref(info, fwAD.make_dual(x, tangent), sample)).tangent
        for b in [None, *get_op(op_name).backend_names]:
            with fwAD.dual_level():
                try:
                    out = _with(fn, sample.args, sample.kwargs, b)(fwAD.make_dual(x, tangent))
                except BackendError:
                    continue
                have = fwAD.unpack_dual(out).tangent
            what = f"{info.name}({tuple(x.shape)}, {sample.args}, {sample.kwargs}, backend={b})"
            assert have is not None, f"{what}: the tangent was dropped"
            torch.testing.assert_close(have, want, msg=what)


@pytest.mark.slow  # (make test-all; see the Makefile)
@pytest.mark.parametrize("info", INFOS, ids=_id)
@pytest.mark.parametrize("device", DEVICES)
def test_torch_func_transforms(info, device):
    """torch.func.vmap (batch dim 0 and last), jvp and grad over every backend equal torch's op
    under the same transform."""
    _device(device)
    fn, op_name = GRAD_OPS[info.name]
    torch.manual_seed(0)
    for sample in info.sample_inputs(device, torch.float64, requires_grad=False):
        x = sample.input
        if x.numel() > 256:
            continue
        batch = torch.stack([x, torch.randn_like(x)], dim=-1 if x.dim() else 0)
        bdim = x.dim() if x.dim() else 0
        tangent = torch.randn_like(x)

        def ref(t):
            return _ref(info, t, sample)

        want_vmap = torch.func.vmap(ref, in_dims=bdim)(batch)
        _, want_jvp = torch.func.jvp(ref, (x,), (tangent,))
        want_grad = torch.func.grad(lambda t: ref(t).sin().sum())(x)
        for b in [None, *get_op(op_name).backend_names]:
            f = _with(fn, sample.args, sample.kwargs, b)
            try:
                with torch.no_grad():
                    f(x)
            except BackendError:
                continue
            what = f"{info.name}({tuple(x.shape)}, {sample.args}, {sample.kwargs}, backend={b})"
            torch.testing.assert_close(torch.func.vmap(f, in_dims=bdim)(batch), want_vmap,
                                       msg=f"vmap of {what}")
            _, have_jvp = torch.func.jvp(f, (x,), (tangent,))
            torch.testing.assert_close(have_jvp, want_jvp, msg=f"jvp of {what}")
            have_grad = torch.func.grad(lambda t: f(t).sin().sum())(x)
            torch.testing.assert_close(have_grad, want_grad, msg=f"grad of {what}")


@pytest.mark.parametrize("device", DEVICES)
def test_isin_vmap(device):
    """isin under vmap: a batched elements tensor, a batched test set (each batch against its
    own), both, and an empty batch, through every backend."""
    _device(device)
    gen = torch.Generator().manual_seed(1)
    e = torch.randint(0, 12, (3, 5, 4), generator=gen).to(device)
    t = torch.randint(0, 12, (3, 6), generator=gen).to(device)
    for b in [None, *get_op("isin").backend_names]:
        def f(a, s):
            return ops.isin(a, s, backend=b)

        try:
            f(e[0], t[0])
        except BackendError:
            continue
        want_both = torch.stack([torch.isin(e[i], t[i]) for i in range(3)])
        assert torch.equal(torch.func.vmap(f)(e, t), want_both), b
        assert torch.equal(torch.func.vmap(f, in_dims=(0, None))(e, t[0]),
                           torch.isin(e, t[0])), b
        assert torch.equal(torch.func.vmap(f, in_dims=(None, 0))(e[0], t),
                           torch.stack([torch.isin(e[0], t[i]) for i in range(3)])), b
        assert torch.equal(torch.func.vmap(f, in_dims=(2, None))(e, t[0]),
                           torch.isin(e, t[0]).movedim(2, 0)), b


# (name, our library op, torch's, backends to force, row length on a GPU). Rows are 7 long
# under the interpreter (gradcheck runs a call per element); topk's are 32 long on a GPU:
# maxima needs 1.25 k supergroups of at least 8 elements there (the interpreter's plans take
# groups of 2), so a row of 7 is a call it rightly refuses.
LIBRARY = [("softmax", lambda x, b: torch.ops.opselect.softmax(x, 1, None, b),
            lambda x: torch.softmax(x, 1), ("fused", "multirow", None), 7),
           ("log_softmax", lambda x, b: torch.ops.opselect.log_softmax(x, 0, None, b),
            lambda x: torch.log_softmax(x, 0), ("strided", None), 7),
           ("topk", lambda x, b: torch.ops.opselect.topk(x, 3, 1, True, True, b)[0],
            lambda x: torch.topk(x, 3, 1).values, ("radix", "maxima", None), 32),
           ("permute", lambda x, b: torch.ops.opselect.permute(x, [1, 0], b),
            lambda x: x.permute(1, 0).contiguous(), ("naive", "tiled", None), 7)]


@pytest.mark.slow  # (make test-all; see the Makefile)
@pytest.mark.parametrize("case", LIBRARY, ids=[c[0] for c in LIBRARY])
@pytest.mark.parametrize("device", DEVICES)
def test_library_ops_forward_ad_and_vmap(case, device):
    """The torch.library ops (what compiled graphs run) carry a dual tensor's tangent, batch
    under vmap with their own rules (no per-sample fallback loop) and pass gradcheck's batched
    checks; torch.func's grad / jvp get a clear error naming the eager op."""
    _device(device)
    name, ours, theirs, backends, gpu_columns = case
    columns = gpu_columns if device == "cuda" else 7
    x = torch.randn(3, columns, dtype=torch.float64, device=device)
    t = torch.randn_like(x)
    with fwAD.dual_level():
        want = fwAD.unpack_dual(theirs(fwAD.make_dual(x, t))).tangent
    batch = torch.randn(4, 3, columns, dtype=torch.float64, device=device)
    for b in backends:
        with fwAD.dual_level():
            have = fwAD.unpack_dual(ours(fwAD.make_dual(x, t), b)).tangent
        assert have is not None, f"{name} backend={b}: tangent dropped"
        torch.testing.assert_close(have, want)
        torch.testing.assert_close(torch.func.vmap(lambda v: ours(v, b))(batch),
                                   torch.func.vmap(theirs)(batch))
        assert torch.autograd.gradcheck(lambda v: ours(v, b), (x.clone().requires_grad_(),),
                                        check_forward_ad=True, check_batched_grad=True,
                                        check_batched_forward_grad=True)
        with pytest.raises(NotImplementedError, match=f"opselect.ops.{name.split('_')[-1]}"):
            torch.func.jvp(lambda v: ours(v, b), (x,), (t,))


@pytest.mark.parametrize("device", DEVICES)
def test_out_and_requires_grad_as_torch(device):
    """torch's permute_copy(out=): refused while out requires grad (functions with out= do not
    support autograd), otherwise written and never recorded by autograd, also from an input
    that requires grad. opselect does the same, for every backend (every combination of input
    and out requiring grad, with grad mode on and off)."""
    _device(device)
    for x_grad in (False, True):
        for out_grad in (False, True):
            for grad_mode in (True, False):
                x = torch.randn(4, 6, device=device, requires_grad=x_grad)

                def fresh():
                    return torch.full((6, 4), float("nan"), device=device,
                                      requires_grad=out_grad)

                with torch.set_grad_enabled(grad_mode):
                    try:
                        torch.permute_copy(x, (1, 0), out=fresh())
                        torch_raises = False
                    except RuntimeError:
                        torch_raises = True
                    for b in [None, *get_op("permute").backend_names]:
                        what = f"x grad {x_grad}, out grad {out_grad}, grad mode " \
                               f"{grad_mode}, backend={b}"
                        for call in (lambda o: ops.permute(x, (1, 0), out=o, backend=b),
                                     lambda o: ops.transpose(x, 0, 1, out=o, backend=b)):
                            out = fresh()
                            if torch_raises:
                                with pytest.raises(RuntimeError, match="out="):
                                    call(out)
                                continue
                            try:
                                result = call(out)
                            except BackendError:
                                assert b is not None, what
                                continue
                            assert result is out, what
                            assert torch.equal(out.detach(), x.detach().t()), what
                            assert out.grad_fn is None, what


#: (name, ours, torch's) for a dual tensor that also requires grad.
DUAL_AND_GRAD = [("softmax", lambda v: ops.softmax(v, 1), lambda v: torch.softmax(v, 1)),
                 ("log_softmax", lambda v: ops.log_softmax(v, 0, dtype=torch.float32),
                  lambda v: torch.log_softmax(v, 0, dtype=torch.float32)),
                 ("topk", lambda v: ops.topk(v, 2, 1).values, lambda v: torch.topk(v, 2, 1).values),
                 ("permute", lambda v: ops.permute(v, (1, 0)), lambda v: v.permute(1, 0))]


@pytest.mark.parametrize("case", DUAL_AND_GRAD, ids=[c[0] for c in DUAL_AND_GRAD])
@pytest.mark.parametrize("device", DEVICES)
def test_dual_tensor_that_requires_grad(case, device):
    """A dual tensor that also requires grad goes through the op's autograd.Function (the eager
    path of a watched call): the tangent is carried and the backward recorded, both as torch's.
    softmax's backward runs its fused kernels there (no graph of the backward is wanted and the
    gradient is a plain tensor)."""
    _device(device)
    _, ours, theirs = case
    x = torch.randn(3, 5, dtype=torch.float64, device=device)
    t, g = torch.randn_like(x), torch.randn(x.numel(), dtype=torch.float64, device=device)
    results = []
    for fn in (ours, theirs):
        leaf = x.clone().requires_grad_()
        with fwAD.dual_level():
            primal, tangent = fwAD.unpack_dual(fn(fwAD.make_dual(leaf, t)))
            upstream = g[:primal.numel()].view(primal.shape).to(primal.dtype)
            (dx,) = torch.autograd.grad(primal, leaf, upstream)
        results.append((primal.detach(), tangent, dx))
    for have, want in zip(*results):
        torch.testing.assert_close(have, want)


@pytest.mark.parametrize("device", DEVICES)
def test_permute_records_autograd_through_every_backend(device):
    """A permute that requires grad runs the chosen kernel (not only torch's) and its gradient
    is the upstream gradient permuted back."""
    _device(device)
    x = torch.randn(3, 4, 5, device=device, requires_grad=True)
    g = torch.randn(5, 3, 4, device=device)
    for b in get_op("permute").backend_names:
        try:
            y = ops.permute(x, (2, 0, 1), backend=b)
        except BackendError:
            continue
        assert y.is_contiguous() and torch.equal(y, x.detach().permute(2, 0, 1)), b
        (dx,) = torch.autograd.grad(y, x, g)
        assert torch.equal(dx, g.permute(1, 2, 0)), b


@pytest.mark.parametrize("device", DEVICES)
def test_quantized_and_other_dtypes_go_to_torch(device):
    """A dtype opselect's kernels do not take (a quantized tensor here) goes to torch's own op
    untouched under auto; a forced Triton backend is refused naming why."""
    _device(device)
    if device == "cuda":
        pytest.skip("quantized tensors are CPU tensors")
    q = torch.quantize_per_tensor(torch.tensor([0.5, -1.0, 2.0, 0.25]), 0.25, 0, torch.qint8)
    got = ops.topk(q, 2)
    want = torch.topk(q, 2)
    assert torch.equal(got.values.int_repr(), want.values.int_repr())
    assert torch.equal(got.indices, want.indices)
    assert torch.equal(ops.topk(q, 2, backend="torch").indices, want.indices)
    with pytest.raises(BackendError, match="radix.*qint8"):
        ops.topk(q, 2, backend="radix")
    with pytest.raises(NotImplementedError):  # torch's own error: it has no kernel either
        ops.softmax(q, 0)
