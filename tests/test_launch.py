"""The fast launcher (kernels/_launch.py): which calls reuse a compiled kernel, and that the
arguments reach it as Triton's JIT passes them. The GPU tests of every op run through it for real;
here Triton's JIT and the compiled kernel are stand-ins that record what they are given."""

from __future__ import annotations

import pytest
import torch
import triton.language as tl
from triton.runtime.jit import JITFunction

from opselect.kernels import _launch as L


def _kernel(x_ptr, n, flag, scale, BLOCK: tl.constexpr, MODE: tl.constexpr = 3):
    pass


@pytest.fixture
def recorder(monkeypatch):
    calls = []

    class Compiled:
        function, packed_metadata = "function", "metadata"

        def launch_metadata(self, grid, stream, *args):
            return ("md", grid)

        def run(self, g0, g1, g2, stream, function, packed, md, enter, exit_, *args):
            calls.append(("fast", (g0, g1, g2), stream, args))

    compiled = Compiled()

    def jit_run(self, *args, grid, warmup, **kwargs):
        calls.append(("jit", grid, args, kwargs))
        return compiled

    monkeypatch.setattr(JITFunction, "run", jit_run)
    monkeypatch.setattr(L, "ENABLED", True)
    monkeypatch.setattr(L.torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(L, "_stream", lambda device: 1234)
    L.clear()
    yield calls
    L.clear()


def test_second_launch_of_a_key_skips_the_jit(recorder):
    k = JITFunction(_kernel)
    x = torch.zeros(64)
    L.launch(k, (4,))(x, 32, True, 0.5, BLOCK=64, num_warps=4)
    L.launch(k, (5, 2))(x, 48, False, 2.0, BLOCK=64, num_warps=4)
    assert [c[0] for c in recorder] == ["jit", "fast"]
    # every parameter in signature order, constexprs and defaults included; no launch options
    assert recorder[1] == ("fast", (5, 2, 1), 1234, (x, 48, False, 2.0, 64, 3))


@pytest.mark.parametrize("change", [
    lambda x: ((x[1:], 32, True, 0.5), {"BLOCK": 64}),        # pointer not 16-byte aligned
    lambda x: ((x, 33, True, 0.5), {"BLOCK": 64}),            # int not divisible by 16
    lambda x: ((x, 1, True, 0.5), {"BLOCK": 64}),             # int == 1 (a constant to Triton)
    lambda x: ((x, 2**40, True, 0.5), {"BLOCK": 64}),         # 64-bit int
    lambda x: ((x.double(), 32, True, 0.5), {"BLOCK": 64}),   # another dtype
    lambda x: ((x, 32, True, 0.5), {"BLOCK": 128}),           # another constexpr
    lambda x: ((x, 32, True, 0.5), {"BLOCK": 64, "MODE": 4}),  # a default overridden
    lambda x: ((x, 32, 7, 0.5), {"BLOCK": 64}),               # int where a bool was
    lambda x: ((x, 32, True, None), {"BLOCK": 64}),           # None where a float was
], ids=["misaligned", "not-div-16", "one", "int64", "dtype", "constexpr", "default", "bool-int",
        "none"])
def test_what_triton_specialises_on_goes_through_the_jit(recorder, change):
    k = JITFunction(_kernel)
    x = torch.zeros(64)
    L.launch(k, (4,))(x, 32, True, 0.5, BLOCK=64, num_warps=4)
    args, kwargs = change(x)
    L.launch(k, (4,))(*args, **kwargs, num_warps=4)
    assert [c[0] for c in recorder] == ["jit", "jit"]


def test_other_options_and_types(recorder):
    k = JITFunction(_kernel)
    x = torch.zeros(64)
    L.launch(k, (4,))(x, 32, True, 0.5, BLOCK=64, num_warps=4)
    L.launch(k, (4,))(x, 32, True, 0.5, BLOCK=64, num_warps=8)  # another launch option
    L.launch(k, (4,))(x, 32, True, "text", BLOCK=64, num_warps=4)  # a type it does not key
    L.launch(k, (4,))(x, 32, True, "text", BLOCK=64, num_warps=4)
    assert [c[0] for c in recorder] == ["jit", "jit", "jit", "jit"]


def test_disabled_or_not_a_jit_function(monkeypatch, recorder):
    x = torch.zeros(64)
    seen = []

    class Spy:  # what the tests put in place of a kernel
        def __getitem__(self, grid):
            return lambda *a, **kw: seen.append(grid)

    L.launch(Spy(), (3,))(x)
    assert seen == [(3,)]
    monkeypatch.setattr(L, "ENABLED", False)
    k = JITFunction(_kernel)
    for _ in range(2):
        L.launch(k, (4,))(x, 32, True, 0.5, BLOCK=64, num_warps=4)
    assert [c[0] for c in recorder] == ["jit", "jit"]
