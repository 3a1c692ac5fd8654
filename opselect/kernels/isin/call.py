"""isin's calls: torch's argument rules (promotion, Python numbers, out=), outputs, the torch
fallback, and the inputs warm and tuning make (sample / replay)."""

from __future__ import annotations

import math
import warnings
from typing import Callable

import torch

from ...dispatch.device import device_info
from ...dispatch.op import Call
from ...dispatch.signature import bucket
from ...errors import InvalidArgument, TorchOnlyCall, UnsupportedDType
from .._common import FLOAT_DTYPES, allocator, flat


SUPPORTED_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                    *FLOAT_DTYPES)


# ---------------------------------------------------------------------------------------------
# The call: torch.isin's argument rules
# ---------------------------------------------------------------------------------------------
class IsinCall(Call):
    __slots__ = ("elements", "test", "invert", "assume_unique", "m", "n", "out")

    @property
    def empty(self) -> bool:
        return self.m == 0  # (no test elements is not empty: every answer is False, or True)

    def empty_result(self) -> torch.Tensor:
        return _every_answer_invert(self)

    def inputs(self) -> tuple:
        return (self.elements, self.test)

    def for_input(self, elements, test) -> "IsinCall":
        """This call's facts for other tensors of the same plain key (no out)."""
        c = IsinCall.__new__(IsinCall)
        c.info, c.key, c.exact, c.elements, c.test, c.out = (self.info, self.key, self.exact,
                                                             elements, test, None)
        c.invert, c.assume_unique, c.m, c.n = self.invert, self.assume_unique, self.m, self.n
        return c

    def describe(self) -> str:
        e, t = self.elements, self.test
        return (f"elements {tuple(e.shape)} {str(e.dtype)[6:]}, test_elements {tuple(t.shape)}"
                f"{', invert' if self.invert else ''} on {e.device}")


def _as_tensor(value, name: str, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    if isinstance(value, bool):
        raise UnsupportedDType(f"isin: {name} is a bool; expected an integer or floating value "
                               "(torch.isin does not accept bool)")
    if not isinstance(value, (int, float)):
        raise InvalidArgument(f"isin: {name} must be a tensor or a Python number, "
                              f"got {type(value).__name__}")
    # torch casts a Python number to the promoted dtype with wrap-around (300 -> int8 44). A
    # float is a double: made in float64 first (torch.tensor's default, float32, flushed the
    # float64 subnormal 5.6e-309 to 0.0, which then matched -0.0; found by tests/test_fuzz.py).
    wide = torch.float64 if isinstance(value, float) else torch.int64
    return torch.tensor(value, dtype=wide, device=device).to(dtype)


def plain_key(elements, test_elements, assume_unique, invert) -> tuple | None:
    """A key of everything the choice for a plain call and its prepared call (Backend.bind)
    read: two strided tensors of one dtype, a test set of at most one dim (which torch.isin
    takes as it is), their shapes and strides (whether the kernels read an input in place or a
    contiguous copy of it), devices and the bool flags; None for any other arguments. ops.py
    keys its routes by it."""
    if (type(elements) is torch.Tensor and type(test_elements) is torch.Tensor
            and type(invert) is bool and type(assume_unique) is bool):
        test_shape = test_elements.shape
        dtype = elements.dtype
        if len(test_shape) <= 1 and test_elements.dtype is dtype and not (
                elements.is_neg() or test_elements.is_neg()):
            try:
                return (elements.shape, elements.stride(), test_shape, test_elements.stride(),
                        dtype, elements.device, test_elements.device, invert, assume_unique)
            except RuntimeError:  # a sparse tensor has no strides: the full path takes it
                return None
    return None


def prepare(elements, test_elements, *, assume_unique: bool = False, invert: bool = False,
            out: torch.Tensor | None = None) -> IsinCall:
    # The common case (two tensors of one supported dtype on one device) takes a handful of
    # attribute reads; everything else goes through _normalise.
    if (type(elements) is not torch.Tensor or type(test_elements) is not torch.Tensor
            or test_elements.dtype is not elements.dtype or elements.dtype not in _SUPPORTED
            or test_elements.device != elements.device or elements.is_neg()
            or test_elements.is_neg()):
        elements, test_elements = _normalise(elements, test_elements)
    dev = elements.device
    if out is not None:
        _check_out(out, elements)
    call = IsinCall()
    call.elements, call.test, call.out = elements, test_elements, out
    invert, assume_unique = bool(invert), bool(assume_unique)
    m, n = elements.numel(), test_elements.numel()
    call.invert, call.assume_unique, call.m, call.n = invert, assume_unique, m, n
    call.info = device_info(dev)
    call.key = (dev, elements.dtype, bucket(m), bucket(n), invert, assume_unique)
    call.exact = (dev, elements.dtype, m, n, invert, assume_unique)
    return call


_SUPPORTED = frozenset(SUPPORTED_DTYPES)


def _normalise(elements, test_elements) -> tuple[torch.Tensor, torch.Tensor]:
    """torch.isin's rules: Python numbers, dtype promotion, devices, accepted dtypes."""
    e_is_t = isinstance(elements, torch.Tensor)
    t_is_t = isinstance(test_elements, torch.Tensor)
    for value, name, is_t in ((elements, "elements", e_is_t),
                              (test_elements, "test_elements", t_is_t)):
        # torch.isin refuses bool and complex in either argument, whatever the promotion gives
        # (RuntimeError "Unsupported input type"), Python scalars included.
        if is_t:
            bad = value.dtype == torch.bool or value.dtype.is_complex
            what = f"a {str(value.dtype)[6:]} tensor"
        else:
            bad = isinstance(value, (bool, complex))
            what = f"a {type(value).__name__}"
        if bad:
            raise UnsupportedDType(f"isin: {name} is {what}; torch.isin takes integers and "
                                   "floats, not bool or complex")
    if (e_is_t and elements.is_quantized) or (t_is_t and test_elements.is_quantized):
        raise TorchOnlyCall("isin: a quantized argument; opselect's kernels take plain tensors")
    if e_is_t and t_is_t:
        dtype = elements.dtype
        if test_elements.dtype is not dtype and elements.numel() == 0:
            # torch answers an empty `elements` with an empty result before promoting, so a pair
            # it cannot promote (uint16-64 or float8 against another dtype) is no error there.
            raise TorchOnlyCall("isin: elements is empty; torch answers without promoting")
        if test_elements.dtype is not dtype:
            if elements.device.type == "cuda":
                # torch's CUDA isin flattens both tensors before comparing: a 0-d tensor
                # promotes as a dimensioned one (float16 elements against a 0-d float32 test
                # value compare in float32). Its CPU kernels take result_type, where a 0-d
                # tensor defers to a dimensioned one of its category (they compare in float16).
                # Measured with torch 2.11 (scratch probe, H200) and 2.13 (CPU).
                dtype = torch.promote_types(elements.dtype, test_elements.dtype)
            else:
                dtype = torch.result_type(elements, test_elements)
        if elements.device != test_elements.device:
            elements, test_elements = _same_device(elements, test_elements)
    elif e_is_t or t_is_t:
        ref = elements if e_is_t else test_elements
        other = test_elements if e_is_t else elements
        if isinstance(other, bool) or not isinstance(other, (int, float)):
            _as_tensor(other, "test_elements" if e_is_t else "elements", ref.dtype, ref.device)
        if e_is_t and ref.numel() == 0:
            raise TorchOnlyCall("isin: elements is empty; torch answers without promoting")
        dtype = torch.result_type(ref, other)
        if e_is_t:
            test_elements = _as_tensor(other, "test_elements", dtype, ref.device)
        else:
            elements = _as_tensor(other, "elements", dtype, ref.device)
    else:
        raise InvalidArgument("isin: at least one of elements and test_elements must be a tensor "
                              f"(got {type(elements).__name__} and {type(test_elements).__name__})")
    if dtype not in _SUPPORTED:
        # uint16-64, float8, ...: torch answers (on devices with a kernel) or raises its own
        # NotImplementedError.
        raise TorchOnlyCall(f"isin: the promoted dtype is {dtype}; opselect's kernels take "
                            f"{', '.join(str(d)[6:] for d in SUPPORTED_DTYPES)}")
    if elements.dtype is not dtype:
        elements = elements.to(dtype)
    if test_elements.dtype is not dtype:
        test_elements = test_elements.to(dtype)
    # A lazy negative view (z.conj().imag) holds the values un-negated in memory; the kernels
    # read memory, so they get the values materialised.
    return elements.resolve_neg(), test_elements.resolve_neg()


def _check_out(out, elements: torch.Tensor) -> None:
    if not isinstance(out, torch.Tensor):
        raise InvalidArgument(f"isin: out must be a tensor, got {type(out).__name__}")
    if out.dtype != torch.bool:
        raise InvalidArgument(f"isin: out must have dtype torch.bool, got {out.dtype}")
    if out.device != elements.device:
        raise InvalidArgument(f"isin: out is on {out.device} but elements is on {elements.device}")
    if out.shape != elements.shape:
        if out.numel() != 0:
            warnings.warn(f"isin: out has shape {tuple(out.shape)}, resizing it to "
                          f"{tuple(elements.shape)} (as torch does; pass an empty tensor to avoid "
                          "this warning)", UserWarning, stacklevel=4)
        out.resize_(elements.shape)


def _same_device(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # torch.isin takes no exception for 0-d CPU tensors (unlike its elementwise ops).
    raise InvalidArgument(f"isin: expected all tensors to be on the same device, but elements is "
                          f"on {a.device} and test_elements on {b.device}")


# ---------------------------------------------------------------------------------------------
# Backends
# ---------------------------------------------------------------------------------------------
def _torch_isin(call: IsinCall) -> torch.Tensor:
    # torch.isin .view()s a multi-dimensional test set and fails on non-contiguous ones (torch
    # 2.11-2.13); its shape does not matter, so hand it over flat.
    test = call.test if call.test.dim() <= 1 else flat(call.test)
    if call.out is not None:
        return torch.isin(call.elements, test, assume_unique=call.assume_unique,
                          invert=call.invert, out=call.out)
    return torch.isin(call.elements, test, assume_unique=call.assume_unique, invert=call.invert)


def _output(call: IsinCall) -> torch.Tensor:
    """Where the kernel writes: the caller's `out` when it is contiguous, else a new tensor."""
    if call.out is not None and call.out.is_contiguous():
        return call.out
    return torch.empty(call.elements.shape, dtype=torch.bool, device=call.elements.device)


def _bindable(call: IsinCall) -> bool:
    """A call a Triton backend prepares (bind): out= goes through run(), which writes it; a
    call without elements or without test elements has nothing to launch
    (_every_answer_invert answers it)."""
    return call.out is None and call.m != 0 and call.n != 0


def _reader(t: torch.Tensor):
    """What a prepared call does to an input laid out as t (its plain key fixes the layout)
    before the kernels read it as a flat array: nothing (None) when t is contiguous, whose
    memory already is that array whatever its shape, else a contiguous copy."""
    return None if t.is_contiguous() else torch.Tensor.contiguous


def _prepared_call(call: IsinCall, read_test, launches) -> Callable[..., torch.Tensor]:
    """A Triton backend's prepared call, for `call` and every later call of its plain key:
    isin(elements, test, out=None) reads the elements as _reader decides here, once, and the
    test set through read_test (None: as it is), makes the output unless run() hands over a
    contiguous `out` (_output), and runs launches(x, t, out): the backend's work, with all
    that depends on the key alone worked out when the backend made `launches`."""
    read_elements = _reader(call.elements)
    new_out = allocator(call.elements.shape, torch.bool, call.elements.device)

    def isin(elements: torch.Tensor, test: torch.Tensor,
             out: torch.Tensor | None = None) -> torch.Tensor:
        if read_elements is not None:
            elements = read_elements(elements)
        if read_test is not None:
            test = read_test(test)
        if out is None:
            out = new_out()
        launches(elements, test, out)
        return out

    return isin


def _finish(call: IsinCall, result: torch.Tensor) -> torch.Tensor:
    if call.out is not None and result is not call.out:
        call.out.copy_(result)
        return call.out
    return result


def _every_answer_invert(call: IsinCall) -> torch.Tensor:
    """The answer of a call with no elements (an empty call) or no test elements: `invert` for
    every element, without a launch."""
    return _finish(call, _output(call).fill_(call.invert))


def sample(shapes, dtype: torch.dtype, options: dict, device: torch.device):
    """Inputs for warming and benchmarks. options: values = "wide" (the test set drawn from the
    dtype's whole range) or "narrow" (from [0, 2 * N)); half the elements are drawn from the test
    set, so about half are members; invert, assume_unique as for isin."""
    if len(shapes) != 2:
        raise InvalidArgument(f"isin sample: expected two shapes (elements, test_elements), got {shapes}")
    values = options.pop("values", "wide")
    if values not in ("wide", "narrow"):
        raise InvalidArgument(f"isin sample: values must be 'wide' or 'narrow', got {values!r}")
    m, n = math.prod(shapes[0]), math.prod(shapes[1])
    test = _random_values(n, dtype, device, narrow=values == "narrow")
    elements = _random_values(m, dtype, device, narrow=values == "narrow", hi_hint=2 * n)
    if n and m:
        hits = torch.rand(m, device=device) < 0.5
        picks = test[torch.randint(0, n, (m,), device=device)]
        elements = torch.where(hits, picks, elements)
    return (elements.reshape(shapes[0]), test.reshape(shapes[1])), options


def _random_values(n: int, dtype: torch.dtype, device, *, narrow: bool, hi_hint: int = 0):
    if dtype.is_floating_point:
        if narrow:
            return torch.randint(0, max(16, hi_hint or 2 * n), (n,), device=device).to(dtype)
        return (torch.randn(n, device=device) * 1e3).to(dtype)
    info = torch.iinfo(dtype)
    if narrow:
        hi = min(info.max, max(16, hi_hint or 2 * n))
        return torch.randint(0, hi, (n,), device=device, dtype=torch.int64).to(dtype)
    return torch.randint(info.min, info.max, (n,), device=device, dtype=dtype)


def replay(call: IsinCall) -> tuple[tuple, dict]:
    """The public call a prepared one came from (tuning's first runs; without out=)."""
    return (call.elements, call.test), {"assume_unique": call.assume_unique,
                                        "invert": call.invert}
