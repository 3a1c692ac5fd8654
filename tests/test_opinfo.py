"""PyTorch's own sample inputs (OpInfo, the samples PyTorch tests its ops with) through auto and
every backend of opselect's ops, compared with torch: isin, topk, softmax and log_softmax (with and
without dtype=), permute and transpose, matmul and linear, in every dtype the OpInfo lists for the
CPU. softmax's
samples also run backward, where they require grad. Forward-mode AD and vmap are
tests/test_opinfo_grad.py's. Under the interpreter topk's samples run every backend for
float32 and int32 and auto for the other dtypes (time: about 25 s per dtype for all backends).

On the CPU the Triton backends run through the interpreter; marked `gpu`, the same samples run on
CUDA.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("expecttest")  # torch.testing._internal needs it
from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402

from opselect import ops  # noqa: E402
from opselect.dispatch import get_op  # noqa: E402
from opselect.dispatch.device import INTERPRETED  # noqa: E402
from opselect.errors import BackendError  # noqa: E402

OURS = {"isin": (ops.isin, "isin"), "topk": (ops.topk, "topk"),
        "softmax": (ops.softmax, "softmax"), "log_softmax": (ops.log_softmax, "log_softmax"),
        "permute": (ops.permute, "permute"), "transpose": (ops.transpose, "permute"),
        "matmul": (ops.matmul, "matmul"), "nn.functional.linear": (ops.linear, "linear")}
#: ops whose float samples are also judged against the float64 answer (as_accurate)
_WIDE_REF = ("softmax", "log_softmax", "matmul", "nn.functional.linear")
_PRODUCTS = ("matmul", "nn.functional.linear")
INFOS = [o for o in op_db if o.name in OURS]
CASES = [(o, d) for o in INFOS for d in sorted(o.supported_dtypes("cpu"), key=str)]
#: On the CPU every topk backend runs these dtypes' samples (the others through auto only); on a
#: GPU every backend runs every dtype.
INTERPRETER_TOPK_DTYPES = (torch.float32, torch.int32)
DEVICES = [pytest.param("cpu", marks=pytest.mark.skipif(not INTERPRETED, reason="interpreter")),
           pytest.param("cuda", marks=pytest.mark.gpu)]


def _id(case) -> str:
    info, dtype = case
    return f"{info.name}{'.' + info.variant_test_name if info.variant_test_name else ''}-" \
           f"{str(dtype)[6:]}"


def _same(got, ref, what: str, exact: torch.Tensor | None = None,
          magnitude: torch.Tensor | None = None) -> None:
    if isinstance(ref, torch.return_types.topk):
        values, indices = got
        torch.testing.assert_close(values, ref.values, rtol=0, atol=0, equal_nan=True, msg=what)
        picked = ref_input_gather(what, indices)
        torch.testing.assert_close(picked, values, rtol=0, atol=0, equal_nan=True, msg=what)
        return
    as_accurate(got, ref, exact, what, magnitude)


def as_accurate(got: torch.Tensor, ref: torch.Tensor, exact: torch.Tensor | None,
                what: str, magnitude: torch.Tensor | None = None) -> None:
    """got equals torch's ref within torch's tolerance for the dtype, or, where it rounds
    otherwise, is as close to the float64 answer `exact` as torch is (twice torch's error, plus
    the dtype's tolerance): a result as accurate as torch's passes, whichever way it rounds.
    A product's tolerance is of `magnitude`, the sum of its terms' sizes (a sum's rounding is
    bounded by them, not by the sum, which may cancel)."""
    try:
        torch.testing.assert_close(got, ref, equal_nan=True, msg=what)
        return
    except AssertionError:
        if exact is None or not got.dtype.is_floating_point:
            raise
    exact = exact.to(torch.float64)
    err_ours = (got.double() - exact).abs()
    err_torch = (ref.double() - exact).abs()
    eps = torch.finfo(got.dtype).eps
    allowed = 2 * err_torch + eps * (1 + (exact.abs() if magnitude is None else magnitude))
    bad = ~((err_ours <= allowed) | (got.isnan() & exact.isnan()))
    assert not bool(bad.any()), (f"{what}: {int(bad.sum())} element(s) farther from the float64 "
                                 f"answer than torch's: ours {err_ours[bad][:4].tolist()}, "
                                 f"torch's {err_torch[bad][:4].tolist()}")


_GATHER = {}


def _wide(kwargs: dict) -> dict:
    """kwargs for the float64 reference: no dtype= (the input is float64 already)."""
    return {k: v for k, v in kwargs.items() if k != "dtype"}


def _wide_args(args, magnitudes: bool = False):
    """args (a tuple or a dict) with their float tensors in float64 (matmul's other, linear's
    weight and bias), for the float64 reference; their magnitudes (abs) where asked."""
    def wide(v):
        if not (isinstance(v, torch.Tensor) and v.is_floating_point()):
            return v
        return v.detach().double().abs() if magnitudes else v.detach().double()

    if isinstance(args, dict):
        return {k: wide(v) for k, v in args.items()}
    return tuple(wide(v) for v in args)


def ref_input_gather(what: str, indices: torch.Tensor) -> torch.Tensor:
    x, dim = _GATHER[what]
    return x.gather(dim if x.dim() else 0, indices) if x.dim() else x.reshape(1)[indices]


@pytest.mark.slow  # (make test-all; see the Makefile)
@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
@pytest.mark.parametrize("device", DEVICES)
def test_samples_as_torch(case, device):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    info, dtype = case
    fn, op_name = OURS[info.name]
    backends = [None, *get_op(op_name).backend_names]
    if device == "cpu" and info.name == "topk" and dtype not in INTERPRETER_TOPK_DTYPES:
        backends = [None]  # the interpreter takes ~25 s per dtype for every topk backend
    grad = info.name in ("softmax", "log_softmax") and dtype.is_floating_point
    ran = 0
    for sample in info.sample_inputs(device, dtype, requires_grad=grad):
        args, kwargs = sample.args, sample.kwargs
        try:
            ref = info.op(sample.input, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - where torch refuses, so must opselect
            for b in backends:
                with pytest.raises(type(exc)):
                    fn(sample.input, *args, **kwargs, backend=b)
            continue
        if info.name == "topk":
            dim = args[1] if len(args) > 1 else kwargs.get("dim", -1)
        else:
            dim = 0
        exact = magnitude = None
        if info.name in _WIDE_REF and sample.input.dtype.is_floating_point:
            exact = info.op(sample.input.detach().double(), *_wide_args(args),
                            **_wide_args(_wide(kwargs)))
            if info.name in _PRODUCTS:
                magnitude = info.op(sample.input.detach().double().abs(),
                                    *_wide_args(args, True), **_wide_args(kwargs, True))
        for b in backends:
            what = f"{info.name}({tuple(sample.input.shape)} {dtype}, {args}, {kwargs}, " \
                   f"backend={b})"
            _GATHER[what] = (sample.input.detach(), dim)
            try:
                got = fn(sample.input, *args, **kwargs, backend=b)
            except BackendError:
                assert b is not None, f"auto refused {what}"
                continue
            if info.name in ("permute", "transpose"):
                assert got.is_contiguous(), what
                ref_cmp = ref.contiguous()
            else:
                ref_cmp = ref
            _same(got, ref_cmp, what, exact, magnitude)
            if grad and sample.input.requires_grad:
                upstream = torch.randn_like(ref)
                (want,) = torch.autograd.grad(ref, sample.input, upstream, retain_graph=True)
                (have,) = torch.autograd.grad(got, sample.input, upstream)
                wide = sample.input.detach().double().requires_grad_()
                (true,) = torch.autograd.grad(info.op(wide, *args, **_wide(kwargs)), wide,
                                              upstream.double())
                as_accurate(have, want, true, f"gradient of {what}")
            ran += 1
    assert ran or info.name == "isin", "no sample ran"
