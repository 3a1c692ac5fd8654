"""Launcher: the bound fast path of kernel launches (kernels/_common.py).

On the CPU the kernels are interpreted and never take the fast path, so these tests drive a
Launcher with a stand-in for a JIT function and its compiled kernel: what is bound, when the
fast path is taken, and what sends a call back to Triton's own path. The GPU test runs real
kernels both ways.
"""

from __future__ import annotations

import pytest
import torch
import triton

from opselect.kernels import _common
from opselect.kernels._common import Launcher


class FakeCompiled:
    """What Triton's launch returns: a compiled kernel with its launcher."""

    def __init__(self, log: list, name: str):
        self.log, self.name = log, name
        self.function, self.packed_metadata = f"fn-{name}", "meta"

    def run(self, gx, gy, gz, stream, function, meta, launch_md, enter, exit_, *args):
        self.log.append(("fast", self.name, (gx, gy, gz), stream, args))


class FakeJit:
    """A kernel (x_ptr, n, flip, BLOCK: constexpr) whose every launch goes through 'Triton'."""

    arg_names = ["x_ptr", "n", "flip", "BLOCK"]
    __name__ = "fake_kernel"

    def __init__(self):
        self.log: list = []
        self.compiled: dict = {}

    def __getitem__(self, grid):
        def launch(*args, num_warps, **constexprs):
            # Triton's specialization, as far as these tests need it: the pointer's dtype and
            # alignment, the integers, the constexprs and the warps.
            x = args[0]
            key = (x.dtype, x.data_ptr() % 16 == 0, args[1:], tuple(constexprs.items()),
                   num_warps)
            kernel = self.compiled.setdefault(key, FakeCompiled(self.log, f"k{len(self.compiled)}"))
            self.log.append(("triton", kernel.name, grid, args))
            return kernel
        return launch


@pytest.fixture
def launcher(monkeypatch):
    monkeypatch.setattr(_common, "_current_device", lambda: 0)
    monkeypatch.setattr(Launcher, "verify", False)
    monkeypatch.setattr(Launcher, "enabled", True)
    monkeypatch.setattr(_common, "_stream_of", lambda device: 77)
    fn = FakeJit()
    lau = Launcher(fn)
    lau.fast = True  # a stand-in for a compiled JIT function
    return fn, lau


def meta():
    return dict(BLOCK=32, num_warps=4)


def test_binds_once_then_launches_directly(launcher):
    fn, lau = launcher
    x = torch.zeros(64)
    built = []

    def constexprs():
        built.append(1)
        return meta()

    lau(("plan", 1), (4,), (x, 64, 0), constexprs)
    lau(("plan", 1), (4, 2), (x, 64, 0), constexprs)
    assert [e[0] for e in fn.log] == ["triton", "fast"]
    kind, name, grid, stream, args = fn.log[1]
    # every argument in declaration order, the constexprs after the runtime ones
    assert (name, grid, stream, args) == ("k0", (4, 2, 1), 77, (x, 64, 0, 32))
    assert len(built) == 1  # a bound launch never builds its constexprs


def test_new_spec_or_alignment_binds_again(launcher):
    fn, lau = launcher
    x = torch.zeros(64)
    lau("a", (1,), (x, 64, 0), meta)
    lau("b", (1,), (x, 65, 0), meta)       # another spec
    lau("a", (1,), (x[1:], 64, 0), meta)   # a pointer off 16 bytes
    assert [e[0] for e in fn.log] == ["triton"] * 3
    lau("a", (1,), (x[1:], 64, 0), meta)
    assert fn.log[-1][:2] == ("fast", "k2")  # the kernel Triton bound for x[1:]
    lau("a", (1,), (x[4:], 64, 0), meta)   # 16 bytes in: aligned again
    assert fn.log[-1][:2] == ("fast", "k0")


def test_verify_catches_a_spec_that_misses_an_argument(launcher, monkeypatch):
    fn, lau = launcher
    x = torch.zeros(64)
    lau("same", (1,), (x, 64, 0), meta)
    monkeypatch.setattr(Launcher, "verify", True)
    lau("same", (1,), (x, 64, 0), meta)  # the bound kernel: fine
    assert [e[0] for e in fn.log] == ["triton", "triton"]
    with pytest.raises(AssertionError, match="spec 'same'"):
        lau("same", (1,), (x, 64, -1), meta)  # flip is not in the spec
    with pytest.raises(AssertionError, match="a tensor's dtype"):
        lau("same", (1,), (x.double(), 64, 0), meta)  # nor is the dtype


def test_hooks_interpreter_and_switch_take_tritons_path(launcher, monkeypatch):
    fn, lau = launcher
    x = torch.zeros(64)
    lau("s", (1,), (x, 64, 0), meta)
    hook = triton.knobs.runtime.launch_enter_hook  # a HookChain from triton 3.6 on

    def probe(*args):
        pass

    hook.add(probe)
    try:
        assert not _common._hooks_idle()
        lau("s", (1,), (x, 64, 0), meta)
    finally:
        hook.remove(probe)
    assert _common._hooks_idle()
    monkeypatch.setattr(Launcher, "enabled", False)
    lau("s", (1,), (x, 64, 0), meta)
    assert [e[0] for e in fn.log] == ["triton"] * 3


def test_the_interpreter_never_binds():
    from opselect.kernels import topk

    if isinstance(topk.maxima._maxima_pass_kernel, triton.runtime.JITFunction):
        pytest.skip("kernels are compiled here")
    assert not topk.maxima._MAXIMA_PASS.fast


def test_a_bound_launch_passes_addresses_once_bound(launcher):
    """A BoundLaunch hands Triton's launcher the addresses it read for the alignment check
    (ints), not the tensors: Triton's C launcher would call data_ptr() again and ask the driver
    about each pointer."""
    fn, _ = launcher
    lau = Launcher(fn, lambda spec: meta())
    lau.fast = True
    bound = lau.bind("s", (3,), 0)
    x = torch.zeros(64)
    bound(x, 64, 0)
    bound(x, 64, 0)
    assert [e[0] for e in fn.log] == ["triton", "fast"]
    assert fn.log[1][1:] == ("k0", (3, 1, 1), 77, (x.data_ptr(), 64, 0, 32))
    bound(x[1:], 64, 0)  # another alignment: Triton's path binds it
    bound(x[1:], 64, 0)
    assert [e[0] for e in fn.log][2:] == ["triton", "fast"]
    assert fn.log[3][1:3] == ("k1", (3, 1, 1))
    hook = triton.knobs.runtime.launch_exit_hook

    def probe(*args):
        pass

    hook.add(probe)  # a profiler's hook: Triton's own path, which calls it
    try:
        bound(x, 64, 0)
    finally:
        hook.remove(probe)
    bound(x, 64, 0)
    assert [e[0] for e in fn.log][4:] == ["triton", "fast"]


def test_the_launcher_abi_is_known_for_the_tritons_we_support():
    """Triton 3.6 to 3.9 each get a direct C launch (1: 3.6's compiled module per kernel, 2: the
    generic launcher of 3.7 on); a Triton we do not know goes through its Python wrapper."""
    version = tuple(int(p) for p in triton.__version__.split(".")[:2])
    abi = _common._launcher_abi()
    if version == (3, 6):
        assert abi == 1
    elif (3, 7) <= version <= (3, 9):
        assert abi == 2
    else:
        assert abi == 0


@pytest.mark.gpu
def test_a_repeated_call_launches_through_the_c_launcher():
    from opselect import ops

    x = torch.randn(8, 512, device="cuda")
    seen = []
    original = _common.BoundLaunch.__call__

    def spy(self, *args):
        seen.append(self)
        return original(self, *args)

    for _ in range(3):
        ops.softmax(x, backend="fused")
    _common.BoundLaunch.__call__ = spy
    try:
        y = ops.softmax(x, backend="fused")
    finally:
        _common.BoundLaunch.__call__ = original
    torch.testing.assert_close(y, torch.softmax(x, -1))
    launch = seen[-1].kernels[0]
    assert launch.__qualname__.startswith("_c_launch"), launch.__qualname__


@pytest.mark.parametrize("package", ["softmax", "matmul"])
def test_a_package_names_every_launcher_it_has(package):
    """A kernels package's LAUNCHERS (what tests watch and launch under checked specs) holds
    every Launcher its modules define, each under its kernel's name."""
    import importlib
    import pkgutil

    root = importlib.import_module(f"opselect.kernels.{package}")
    found = {}
    for info in pkgutil.walk_packages(root.__path__, root.__name__ + "."):
        for value in vars(importlib.import_module(info.name)).values():
            if isinstance(value, Launcher):
                found[value.fn.__name__] = value
    assert found, package
    assert set(root.LAUNCHERS) == set(found), sorted(set(root.LAUNCHERS) ^ set(found))
    assert all(root.LAUNCHERS[name] is found[name] for name in found)
