"""Small helpers shared by the kernel modules (host side)."""

from __future__ import annotations

import functools
import inspect
import os
from typing import Callable

import torch
import triton

from .. import switches
from ..dispatch import tuning_mode as _tuning_mode  # (its lookup of the capture check)
from ..errors import InvalidArgument

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


#: A value every tensor from allocator() starts as, or None (uninitialised, as torch.empty). Tests
#: set it, so that an element a kernel forgets to write shows; it is read when an allocator is
#: made (a prepared call's), so they set it before the calls they check.
POISON: float | None = None


def allocator(shape, dtype: torch.dtype, device) -> Callable[[], torch.Tensor]:
    """A function () -> a new tensor of `shape` and `dtype` on `device`: what a prepared call
    allocates its outputs and workspaces with. torch.empty with everything bound and the sizes
    spread as arguments: torch's argument parser takes a tuple of sizes a microsecond slower than
    the same sizes spread, and a torch.Size slower still (on the H200's host: 2.99 us for
    torch.empty((8, 512), ...) against 1.97 for torch.empty(8, 512, ...)), and a partial saves
    the frame of a function around it."""
    sizes = tuple(int(n) for n in shape) or ((),)
    if POISON is not None:
        value = POISON
        return lambda: torch.empty(*sizes, dtype=dtype, device=device).fill_(value)
    return functools.partial(torch.empty, *sizes, dtype=dtype, device=device)


def per_stream(device, make: Callable[[], tuple]) -> Callable[[], tuple]:
    """A function () -> make()'s buffers for the current stream, made once per stream: the
    counters that kernels whose programs wait for each other count arrivals in (zeroed again by
    their last program out, or moved on by a fixed step every launch, so no memset runs per
    call) and scratch written and read within one launch (no allocation per call). One set per
    stream, because launches on one stream never overlap, and launches on two may. While a stream is captured into a CUDA graph every call
    gets a set of its own, which the graph keeps (its replays may run on another stream)."""
    device = torch.device(device)
    index = device.index if device.index is not None else 0
    cuda = device.type == "cuda"
    by_stream: dict[int, tuple] = {}

    def buffers() -> tuple:
        if cuda:
            if _tuning_mode._stream_capturing():
                return make()
            stream = _stream_of(index)
        else:
            stream = 0
        found = by_stream.get(stream)
        if found is None:
            found = by_stream[stream] = make()
        return found

    return buffers


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
            g = grid + (1, 1)
            bound[1](g[0], g[1], g[2], _current_stream(device), args)
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
            self.bound[key] = (compiled, _launch_of(compiled, tuple(named[n] for n in names)))

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
    compiles or binds as usual); later calls find the compiled kernel's launch in a dict of the
    alignments seen (usually one) and launch it at once on the current stream, passing each
    tensor as the address already read for the alignment (Triton's C launcher would otherwise
    call data_ptr() again and ask the driver about the pointer: a microsecond per tensor).
    Triton's own path is taken under the interpreter, while launch hooks are set and while
    Launcher.verify is on, as a Launcher does. A call made while another CUDA device is current
    switches to the tensors' device for the launch (Triton launches on the current device)."""

    __slots__ = ("launcher", "spec", "grid", "g0", "g1", "g2", "device", "pointers", "kernels",
                 "fast")

    def __init__(self, launcher: Launcher, spec, grid: tuple, device: int | None):
        self.launcher, self.spec, self.grid, self.device = launcher, spec, tuple(grid), device
        self.g0, self.g1, self.g2 = (*self.grid, 1, 1)[:3]
        self.pointers: tuple[int, ...] | None = None
        self.kernels: dict[int, Callable] = {}  # misaligned bits -> the compiled kernel's launch
        self.fast = launcher.fast

    def __call__(self, *args) -> None:
        if not (self.fast and Launcher.enabled) or Launcher.verify:
            self.launcher(self.spec, self.grid, args)
            return
        pointers = self.pointers
        if pointers is None:
            pointers = self.pointers = tuple(
                i for i, a in enumerate(args) if isinstance(a, torch.Tensor))
        values = list(args)
        misaligned = 0  # bit b: the b-th tensor argument is not 16-byte aligned
        bit = 1
        for i in pointers:
            address = values[i] = args[i].data_ptr()
            if address & 15:
                misaligned |= bit
            bit <<= 1
        launch = self.kernels.get(misaligned)
        device = _current_device()
        if device != self.device:
            with torch.cuda.device(self.device):
                return self(*args)
        # Launch hooks (a profiler's) make Triton's own path run, which calls them. Read
        # inline: a function call here is a fair part of what is left of a launch's host time.
        try:
            hooked = _RUNTIME_KNOBS.launch_enter_hook.calls or \
                _RUNTIME_KNOBS.launch_exit_hook.calls
        except AttributeError:  # None, or a plain function set in a HookChain's place
            hooked = not _hooks_idle()
        if launch is None or hooked:
            self.launcher(self.spec, self.grid, args)
            found = self.launcher.bound.get((self.spec, device, misaligned))
            if found is not None:
                self.kernels[misaligned] = found[1]
            return
        launch(self.g0, self.g1, self.g2, _stream_of(device), values)


def _launch_of(compiled, tail: tuple) -> Callable:
    """launch(g0, g1, g2, stream, args): `compiled` launched with the runtime arguments `args`
    (tensors or their addresses) and its constexprs `tail`.

    Where this Triton's CUDA launcher is one we know (triton 3.6 to 3.9) and the kernel needs no
    scratch memory, straight into its C function: the launcher's Python wrapper works out, on
    every call, scratch allocations our kernels never have (about two microseconds on a slow
    host). Elsewhere through the wrapper, as Triton's own launches go."""
    run = compiled.run
    direct = _c_launch(compiled, tail)
    if direct is not None:
        return direct
    function, metadata = compiled.function, compiled.packed_metadata

    def launch(g0, g1, g2, stream, args):
        run(g0, g1, g2, stream, function, metadata, None, None, None, *args, *tail)

    return launch


def _launcher_abi() -> int:
    """How Triton's CudaLauncher hands a launch to its C function: 1 as triton 3.6 does (a
    module compiled per kernel, the kernel's arguments spread), 2 as 3.7 to 3.9 do (one generic
    function: the arguments' annotations, the signature and the arguments as a tuple), 0 for a
    Triton whose launcher we do not know (its Python wrapper is used)."""
    try:
        from triton.backends.nvidia.driver import CudaLauncher
        version = tuple(int(part) for part in triton.__version__.split(".")[:2])
        wrapper = CudaLauncher.__call__.__code__
    except Exception:  # no NVIDIA backend, an odd version string: the wrapper it is
        return 0
    if version == (3, 6) and wrapper.co_argcount == 6:
        return 1
    if (3, 7) <= version <= (3, 9) and wrapper.co_argcount == 10:
        return 2
    return 0


_LAUNCHER_ABI: int | None = None


def _c_launch(compiled, tail: tuple) -> Callable | None:
    global _LAUNCHER_ABI
    if _LAUNCHER_ABI is None:
        _LAUNCHER_ABI = _launcher_abi()
    run = compiled.run
    if (_LAUNCHER_ABI == 0 or type(run).__name__ != "CudaLauncher"
            or getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1)
            or getattr(run, "gsan_enabled", False)):
        return None
    c_launch, function, metadata = run.launch, compiled.function, compiled.packed_metadata
    cooperative, pdl = run.launch_cooperative_grid, run.launch_pdl
    if _LAUNCHER_ABI == 1:
        def launch(g0, g1, g2, stream, args):
            c_launch(g0, g1, g2, stream, function, cooperative, pdl, None, None, metadata, None,
                     None, None, *args, *tail)
        return launch
    annotations, signature = run.arg_annotations, run.kernel_signature

    def launch(g0, g1, g2, stream, args):
        c_launch(g0, g1, g2, stream, function, cooperative, pdl, metadata, None, None, None,
                 None, None, annotations, signature, (*args, *tail))

    return launch


def _current_stream(device: int) -> int:
    return _stream_of(device)


def _stream_of(device: int) -> int:
    """The current stream's handle, through the driver's function (looked up on first use:
    the driver is chosen lazily), which then takes this name's place."""
    global _stream_of
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


def plan_launcher(kernel, num_warps: "str | int" = "num_warps", **options: str) -> Launcher:
    """The Launcher of a kernel whose spec is its backend's plan: each constexpr parameter is
    the plan's field (or property) of the same name, the name a config gives it too (one name
    from the tune cache to the kernel). num_warps is the plan field named here, or a fixed
    count; any other launch option (launch_pdl) the plan field named for it."""
    names = tuple(name for name, param in inspect.signature(kernel.fn).parameters.items()
                  if "constexpr" in str(param.annotation))

    def constexprs(plan) -> dict:
        out = {name: getattr(plan, name) for name in names}
        out["num_warps"] = num_warps if isinstance(num_warps, int) else getattr(plan, num_warps)
        out.update((option, getattr(plan, field)) for option, field in options.items())
        return out

    return Launcher(kernel, constexprs)


def check_config(backend: str, config, keys: frozenset, *, complete: bool = False) -> None:
    """Refuse a config with a key its backend does not read (and, complete, one without a key
    it needs). A config is data from the tune cache (perhaps written by an older opselect, under
    older names) or from a script; a plan that read defaults in an unknown key's place would
    have a timing filed under a config that never ran. `backend`: "<op> <backend>"."""
    unknown = set(config) - keys
    missing = keys - set(config) if complete else set()
    wrong = ([f"keys {sorted(unknown)} are not this backend's"] if unknown else []) + (
        [f"keys {sorted(missing)} are missing"] if missing else [])
    if wrong:
        raise InvalidArgument(f"{backend}: config {'; '.join(wrong)} (it reads "
                              f"{', '.join(sorted(keys))})")
