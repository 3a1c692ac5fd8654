"""Launching Triton kernels with less host time.

`kernel[grid](*args, **kwargs)` goes through Triton's JIT on every call: it binds the arguments,
computes their specialisation (dtypes, 16-byte alignment, divisibility by 16, == 1) and a cache
key, looks up the compiled kernel, then launches it. On the H200 machine's host that is 15-25 us
of a 25-75 us call (cProfile: jit.run, the binder, compute_cache_key, launch_metadata), which is
most of the cost of a small op. `launch(kernel, grid)(*args, **kwargs)` does the same launch with
a key of its own:

    (kernel, device, for every non-constexpr argument: tensor -> (dtype, 16-byte aligned),
     int -> (== 1, divisible by 16, 32/64-bit), bool, float, None; constexprs and launch
     options by value)

which is at least as fine as Triton's specialisation, so a hit may reuse the compiled kernel
Triton chose for the same key. A miss (and anything unusual: another argument type, the
interpreter, OPSELECT_FAST_LAUNCH=0) goes through Triton's own path, which compiles if needed;
the first launch of each key always does. The compiled kernel is then called as Triton's JIT
calls it (CompiledKernel.run with the bound arguments in signature order, constexprs included:
the same in Triton 3.6 to 3.9).
"""

from __future__ import annotations

import os
from typing import Any, Callable

import torch
from triton import knobs
from triton.runtime import driver
from triton.runtime.jit import JITFunction

from ..dispatch.device import INTERPRETED

ENABLED = os.environ.get("OPSELECT_FAST_LAUNCH", "1") not in ("", "0") and not INTERPRETED

_OPTIONS = frozenset({"num_warps", "num_stages", "num_ctas", "maxnreg"})
_I32 = (-(1 << 31), 1 << 31)


class _Unsupported(Exception):
    pass


class _Signature:
    """A kernel's parameters: names in order, which are constexprs, and defaults."""

    __slots__ = ("names", "constexpr", "defaults", "index")

    def __init__(self, kernel: JITFunction):
        params = kernel.params
        self.names = tuple(p.name for p in params)
        self.constexpr = frozenset(p.name for p in params if p.is_constexpr)
        self.defaults = {p.name: p.default for p in params if p.has_default}
        self.index = {name: i for i, name in enumerate(self.names)}


class _Plan:
    __slots__ = ("compiled", "sig")

    def __init__(self, compiled: Any, sig: _Signature):
        self.compiled = compiled
        self.sig = sig


_signatures: dict[JITFunction, _Signature] = {}
_plans: dict[tuple, _Plan | None] = {}


def launch(kernel: Any, grid: tuple) -> Callable[..., Any]:
    """A launcher of `kernel` over `grid`, called like `kernel[grid]`."""
    if not ENABLED or type(kernel) is not JITFunction:
        return kernel[grid]
    return lambda *args, **kwargs: _launch(kernel, grid, args, kwargs)


def _spec(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return (value.dtype, value.data_ptr() & 15 == 0)
    if isinstance(value, bool):
        return "b"
    if isinstance(value, int):
        wide = 0 if _I32[0] <= value < _I32[1] else (1 if value < (1 << 63) else 2)
        return (value == 1, value & 15 == 0, wide)
    if isinstance(value, float):
        return "f"
    if value is None:
        return "n"
    raise _Unsupported


def _launch(kernel: JITFunction, grid: tuple, args: tuple, kwargs: dict) -> Any:
    sig = _signatures.get(kernel)
    if sig is None:
        sig = _signatures[kernel] = _Signature(kernel)
    try:
        # Keyword arguments: constexprs and options by value, the rest by specialisation.
        named = tuple((k, v if (k in sig.constexpr or k in _OPTIONS) else _spec(v))
                      for k, v in kwargs.items())
        key = (kernel, torch.cuda.current_device(), tuple(map(_spec, args)), named)
        plan = _plans.get(key, False)
    except (_Unsupported, TypeError):  # TypeError: an unhashable constexpr
        return kernel[grid](*args, **kwargs)
    if plan is False:
        compiled = kernel[grid](*args, **kwargs)  # Triton's own path: compiles, launches
        _plans[key] = _Plan(compiled, sig) if _launchable(compiled) else None
        return compiled
    if plan is None:
        return kernel[grid](*args, **kwargs)
    bound = list(args)
    names = sig.names
    for name in names[len(args):]:
        bound.append(kwargs[name] if name in kwargs else sig.defaults[name])
    c = plan.compiled
    device = key[1]
    stream = _stream(device)
    grid_0 = grid[0]
    grid_1 = grid[1] if len(grid) > 1 else 1
    grid_2 = grid[2] if len(grid) > 2 else 1
    hooks = knobs.runtime
    c.run(grid_0, grid_1, grid_2, stream, c.function, c.packed_metadata,
          c.launch_metadata(grid, stream, *bound), hooks.launch_enter_hook,
          hooks.launch_exit_hook, *bound)
    return c


def _stream(device: int) -> Any:
    return driver.active.get_current_stream(device)


def _launchable(compiled: Any) -> bool:
    """Whether this Triton's compiled kernel has the launch interface used above."""
    return all(hasattr(compiled, a) for a in ("run", "function", "packed_metadata",
                                              "launch_metadata"))


def clear() -> None:
    """Forget the launch plans (tests; a changed Triton cache)."""
    _plans.clear()
