"""Small helpers shared by the kernel modules (host side)."""

from __future__ import annotations

import os

import torch
import triton

from .. import switches

INT32_SAFE = 2**31 - 2**20  # above this, offsets in kernels are computed in 64 bits


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def needs_int64(*numels: int) -> bool:
    """Offsets overflow int32 past 2**31 elements; add margin for block tails."""
    return max(numels, default=0) >= INT32_SAFE


#: Prepared calls kept per op (kernels/<op>/call.py's memo); past this many it starts again.
PREPARED_MAX = 4096


def prepared(memo: dict, key: tuple | None, input: torch.Tensor, prepare, *args):
    """prepare(*args), or the call prepared earlier under `key` (the call module's plain_key of
    the same arguments; None: prepare afresh) made for `input` (Call.for_input). The memo holds
    no tensor: what it keeps is made for None."""
    if key is None:
        return prepare(*args)
    known = memo.get(key)
    if known is not None:
        return known.for_input(input)
    call = prepare(*args)
    if len(memo) >= PREPARED_MAX:
        memo.clear()
    memo[key] = call.for_input(None)
    return call


def flat(t: torch.Tensor) -> torch.Tensor:
    """A contiguous 1-d view of t (a copy only when t is not contiguous)."""
    return t.reshape(-1) if t.is_contiguous() else t.contiguous().view(-1)


FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class Launcher:
    """Launches one @triton.jit kernel; after the first launch of a specialization, straight
    through the compiled kernel.

    Triton's own launch path binds every argument, works out each one's specialization (is it
    1, a multiple of 16, a 16-byte aligned pointer?) and hashes them into a cache key, on every
    call: tens of microseconds for a kernel of thirty arguments, which is more than some of our
    kernels run and pushes a whole call past its device time. A Launcher lets Triton do that
    once per `spec` and keeps the compiled kernel. `spec` is the caller's promise: a hashable
    value that fixes every integer argument, every constexpr, num_warps and the tensors' dtypes
    (in practice the backend's memoized plan, which is made per dtype, and the few facts of
    the call outside it). The launcher adds the device and which pointers are 16-byte aligned.
    Triton's path is taken under the interpreter, while launch hooks are set (profilers read
    them), and for every call while `verify` is on, which also checks that Triton picks the
    very kernel the spec named.

        LAUNCH = Launcher(kernel, lambda plan: dict(BLOCK=plan.block, num_warps=plan.warps))
        LAUNCH(plan, grid, (runtime arguments...))

    The plan (a backend's frozen, memoised plan) is the spec, and the function given with the
    kernel maps it to the kernel's constexprs once, where the kernel is declared: a launch site
    passes the plan and the runtime arguments, nothing twice. Runtime arguments come first in
    the kernel's signature, constexprs after them. The constexprs are built only when Triton's
    own path runs: a bound launch never builds them (at a microsecond or two per dict of
    keywords, they were a fair part of a call's host time). A launch may still pass its own
    `constexprs` function (a spec that is not a plan).

    `Launcher.observer`, when set, is called with the kernel on every launch that goes through
    Triton's path (every launch under the interpreter): tests use it to see which kernels a
    backend really launches.
    """

    verify = bool(os.environ.get("OPSELECT_VERIFY_LAUNCH"))
    enabled = switches.enabled("OPSELECT_FAST_LAUNCH")
    MAX_BOUND = 1024

    observer = None

    __slots__ = ("fn", "bound", "fast", "pointers", "plan_constexprs")

    def __init__(self, fn, plan_constexprs=None):
        self.fn = fn
        self.plan_constexprs = plan_constexprs  # plan -> {constexpr name: value, num_warps: ...}
        self.bound: dict = {}
        self.pointers: tuple[int, ...] | None = None  # positions of the tensor arguments
        # The interpreter's kernels have no compiled launcher.
        self.fast = isinstance(fn, triton.runtime.JITFunction)

    def __call__(self, spec, grid: tuple, args: tuple, constexprs=None) -> None:
        if not (self.fast and Launcher.enabled):
            self._observe()
            self.fn[grid](*args, **self._constexprs(spec, constexprs))
            return
        device = _current_device()
        pointers = self.pointers
        if pointers is None:
            pointers = self.pointers = tuple(
                i for i, a in enumerate(args) if isinstance(a, torch.Tensor))
        misaligned = 0  # bit b: the b-th tensor argument is not 16-byte aligned
        bit = 1
        for i in pointers:
            if args[i].data_ptr() & 15:
                misaligned |= bit
            bit <<= 1
        key = (spec, device, misaligned)
        bound = self.bound.get(key)
        if bound is not None and not Launcher.verify and _hooks_idle():
            compiled, tail = bound
            g = grid + (1, 1)
            compiled.run(g[0], g[1], g[2], _current_stream(device), compiled.function,
                         compiled.packed_metadata, None, None, None, *args, *tail)
            return
        self._observe()
        named = self._constexprs(spec, constexprs)
        compiled = self.fn[grid](*args, **named)
        if bound is not None:
            if compiled is not bound[0]:
                raise AssertionError(
                    f"{self.fn.__name__}: spec {spec!r} named a kernel that Triton compiled "
                    "for other arguments (the spec misses one that Triton specializes on: an "
                    "integer, a constexpr, the warps or a tensor's dtype)")
            return
        names = self.fn.arg_names[len(args):]
        if hasattr(compiled, "packed_metadata") and all(n in named for n in names):
            if len(self.bound) >= self.MAX_BOUND:
                self.bound.clear()
            self.bound[key] = (compiled, tuple(named[n] for n in names))

    def bind(self, spec, grid: tuple, device: int | None) -> "BoundLaunch":
        """This kernel's launch with `spec` and `grid` fixed, for a prepared call (see
        BoundLaunch); `device` is the CUDA device index of the call's tensors."""
        return BoundLaunch(self, spec, grid, device)

    def _constexprs(self, spec, constexprs) -> dict:
        if constexprs is not None:
            return constexprs()
        if self.plan_constexprs is None:
            raise TypeError(f"{self.fn.__name__}: launched without constexprs, and its Launcher "
                            "was declared without a plan -> constexprs function")
        return self.plan_constexprs(spec)

    def _observe(self) -> None:
        if Launcher.observer is not None:
            Launcher.observer(self.fn)


class BoundLaunch:
    """One launch of a Launcher with its spec, grid and device fixed: what a prepared call keeps
    (Backend.bind) and calls with the runtime arguments alone.

    The first call of each alignment of the tensor arguments goes through the Launcher (which
    compiles or binds as usual); later calls find the compiled kernel in a dict of the
    alignments seen (usually one) and launch it at once on the current stream. Triton's own
    path is taken under the interpreter, while launch hooks are set and while Launcher.verify
    is on, as a Launcher does. A call made while another CUDA device is current switches to
    the tensors' device for the launch (Triton launches on the current device)."""

    __slots__ = ("launcher", "spec", "grid", "g0", "g1", "g2", "device", "pointers", "kernels")

    def __init__(self, launcher: Launcher, spec, grid: tuple, device: int | None):
        self.launcher, self.spec, self.grid, self.device = launcher, spec, tuple(grid), device
        self.g0, self.g1, self.g2 = (*self.grid, 1, 1)[:3]
        self.pointers: tuple[int, ...] | None = None
        self.kernels: dict[int, tuple] = {}  # misaligned bits -> (compiled kernel, constexprs)

    def __call__(self, *args) -> None:
        launcher = self.launcher
        if not (launcher.fast and Launcher.enabled):
            launcher(self.spec, self.grid, args)
            return
        pointers = self.pointers
        if pointers is None:
            pointers = self.pointers = tuple(
                i for i, a in enumerate(args) if isinstance(a, torch.Tensor))
        misaligned = 0
        bit = 1
        for i in pointers:
            if args[i].data_ptr() & 15:
                misaligned |= bit
            bit <<= 1
        kernel = self.kernels.get(misaligned)
        device = _current_device()
        if device != self.device:
            with torch.cuda.device(self.device):
                return self(*args)
        if kernel is None or Launcher.verify or not _hooks_idle():
            launcher(self.spec, self.grid, args)
            found = launcher.bound.get((self.spec, device, misaligned))
            if found is not None:
                self.kernels[misaligned] = found
            return
        compiled, tail = kernel
        compiled.run(self.g0, self.g1, self.g2, _current_stream(device), compiled.function,
                     compiled.packed_metadata, None, None, None, *args, *tail)


_stream_of = None  # the driver's current-stream function, looked up on first use


def _current_stream(device: int) -> int:
    global _stream_of
    if _stream_of is None:
        _stream_of = triton.runtime.driver.active.get_current_stream
    return _stream_of(device)


# torch.cuda.current_device() less its lazy-init check (a Launcher's tensors are on the GPU, so
# CUDA is initialised).
_current_device = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)
_RUNTIME_KNOBS = triton.knobs.runtime


def _hooks_idle() -> bool:
    """No launch hooks are installed (profilers such as proton install them): the fast path
    passes none to the launcher. Hooks are HookChains from triton 3.6 on (a plain function
    set in their place counts as installed)."""
    enter, exit_ = _RUNTIME_KNOBS.launch_enter_hook, _RUNTIME_KNOBS.launch_exit_hook
    return ((enter is None or not getattr(enter, "calls", True))
            and (exit_ is None or not getattr(exit_, "calls", True)))
