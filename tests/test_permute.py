"""permute / transpose: every backend against torch, the simplification on its own, bad arguments.

CPU tests run the Triton kernels through the interpreter on small shapes; `gpu` tests run the same
checks at real sizes (and past 2**31 elements). Results are compared byte for byte (NaN payloads
and all), and every `out=` is poisoned first, so an element a kernel forgets to write is caught.
"""

from __future__ import annotations

import math
import random
import re
import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import opselect
from opselect import ops
from opselect.dispatch.device import DeviceInfo
from opselect.errors import BackendError, InvalidArgument
from opselect.heuristics.device_model import defaults_for
from opselect.kernels import permute as P
from opselect.kernels.permute import naive as P_naive
from opselect.kernels.permute import tiled as P_tiled
from opselect.kernels.permute import vectorized as P_vectorized
from opselect.kernels.permute.call import plain_key

BACKENDS = ("naive", "tiled", "vectorized")
# Every element size the kernels move, and the dtypes with special bytes (bool, complex, float8).
DTYPES = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.uint16, torch.float16,
          torch.bfloat16, torch.int32, torch.uint32, torch.float32, torch.int64, torch.uint64,
          torch.float64, torch.complex64, torch.complex128, torch.float8_e4m3fn,
          torch.float8_e5m2)
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                      HealthCheck.function_scoped_fixture])


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------
def as_bytes(t: torch.Tensor) -> torch.Tensor:
    # (clone: an empty "contiguous" view may keep a stride other than 1, which view() refuses)
    return t.clone(memory_format=torch.contiguous_format).reshape(-1).view(torch.uint8)


def assert_same(got: torch.Tensor, ref: torch.Tensor) -> None:
    assert got.shape == ref.shape, (got.shape, ref.shape)
    assert got.dtype == ref.dtype
    assert got.is_contiguous()
    assert torch.equal(as_bytes(got), as_bytes(ref)), "bytes differ"


def reference(x: torch.Tensor, dims) -> torch.Tensor:
    return x.permute(tuple(dims)).clone(memory_format=torch.contiguous_format)


def poisoned(shape, dtype, device) -> torch.Tensor:
    """A destination whose every byte is 0xA5: whatever a kernel fails to write shows."""
    out = torch.empty(shape, dtype=dtype, device=device)
    if out.numel():
        out.view(-1).view(torch.uint8).fill_(0xA5)
    return out


def make_input(shape, dtype, layout: str, device, seed: int = 0) -> torch.Tensor:
    """A tensor of `shape` in one of several memory layouts."""
    g = random.Random(seed)
    shape = list(shape)
    if layout == "contiguous" or not shape:
        return P.random_tensor(shape, dtype, device)
    if layout == "permuted":  # already a permuted view of a contiguous tensor
        order = list(range(len(shape)))
        g.shuffle(order)
        base = P.random_tensor([shape[d] for d in order], dtype, device)
        return base.permute([order.index(i) for i in range(len(shape))])
    if layout == "sliced":  # a step of 2 along one dim: strides no longer nest
        d = g.randrange(len(shape))
        big = list(shape)
        big[d] = 2 * shape[d]
        index = [slice(None)] * len(shape)
        index[d] = slice(None, None, 2)
        return P.random_tensor(big, dtype, device)[tuple(index)]
    if layout == "offset":  # starts one element into its storage: less alignment to widen with
        n = math.prod(shape)
        return P.random_tensor([n + 1], dtype, device)[1:].view(shape)
    if layout == "expanded":  # stride 0 along one dim
        d = g.randrange(len(shape))
        small = list(shape)
        small[d] = 1
        return P.random_tensor(small, dtype, device).expand(shape)
    raise ValueError(layout)


def check_all(x: torch.Tensor, dims, *, backends=BACKENDS, with_out: bool = True) -> list[str]:
    """Every backend that supports the call, with and without out=, against torch; returns the
    backends that ran (the auto choice included)."""
    ref = reference(x, dims)
    call = P.OP.prepare(x, dims)
    ran = []
    for name in backends:
        if P.OP.backend(name).supports(call) is not None:
            continue
        assert_same(ops.permute(x, dims, backend=name), ref)
        if with_out:
            out = poisoned(ref.shape, x.dtype, x.device)
            got = ops.permute(x, dims, out=out, backend=name)
            assert got is out
            assert_same(out, ref)
        ran.append(name)
    assert_same(ops.permute(x, dims), ref)
    return ran


H200 = DeviceInfo("cuda", 0, "NVIDIA H200", (9, 0), 132, 60 << 20, 141 << 30)


# ---------------------------------------------------------------------------------------------
# the simplification on its own
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape, strides, dims, sizes, out_strides", [
    ((2, 3, 4, 5), (60, 20, 5, 1), (0, 1, 2, 3), [120], [1]),             # identity: one run
    ((2, 3, 4, 5), (60, 20, 5, 1), (0, 2, 3, 1), [2, 20, 3], [60, 1, 20]),  # NCHW -> NHWC
    ((1, 5, 1, 3), (15, 3, 3, 1), (3, 1, 2, 0), [3, 5], [1, 3]),          # size-1 dims drop out
    ((32, 2048, 32, 128), (8388608, 4096, 128, 1), (0, 2, 1, 3),
     [32, 32, 2048, 128], [8388608, 128, 4096, 1]),
    ((4, 6), (12, 2), (1, 0), [6, 4], [2, 12]),                            # a strided view
    ((4, 6), (0, 1), (0, 1), [4, 6], [0, 1]),                              # an expanded view
    ((3, 1, 1), (1, 1, 1), (2, 1, 0), [3], [1]),
    ((), (), (), [], []),
])
def test_simplify_examples(shape, strides, dims, sizes, out_strides):
    assert P.simplify(shape, strides, dims) == (sizes, out_strides)


def test_widen_examples():
    # (N, M, 2) fp32 -> (M, N, 2): the 8-byte pairs become the elements of a plain transpose.
    assert P.widen([5, 4, 2], [2, 10, 1], 4, 0, 0) == ([5, 4], [1, 5], 8)
    # 128 fp16 runs widen to 16-byte units.
    assert P.widen([3, 7, 128], [896, 128 * 3, 1], 2, 0, 0) == ([3, 7, 16], [112, 48, 1], 16)
    # A pointer 4 bytes into an allocation allows 4-byte units only.
    assert P.widen([5, 4, 2], [2, 10, 1], 4, 4, 0) == ([5, 4, 2], [2, 10, 1], 4)
    # An odd run cannot widen; a moving last dim is left alone.
    assert P.widen([5, 3], [3, 1], 4, 0, 0) == ([5, 3], [3, 1], 4)
    assert P.widen([5, 3], [1, 5], 4, 0, 0) == ([5, 3], [1, 5], 4)


def _rebuild(x: torch.Tensor, call) -> torch.Tensor:
    """The simplified problem read back with as_strided over x's bytes."""
    raw = x.untyped_storage()
    base = torch.empty(0, dtype=torch.uint8, device=x.device).set_(raw, 0, (raw.nbytes(),), (1,))
    e = call.esize
    start = x.storage_offset() * x.element_size()
    view = base.as_strided([*call.sizes, e], [t * e for t in call.strides] + [1], start)
    return view.contiguous().reshape(-1)


LAYOUTS = ("contiguous", "permuted", "sliced", "offset", "expanded")
shapes = st.lists(st.integers(1, 5), min_size=0, max_size=6)


@settings(max_examples=120, **SETTINGS)
@given(shape=shapes, data=st.data(),
       dtype=st.sampled_from([torch.uint8, torch.float16, torch.float32, torch.complex128]),
       layout=st.sampled_from(LAYOUTS))
def test_simplify_preserves_the_result(shape, data, dtype, layout):
    dims = data.draw(st.permutations(range(len(shape))))
    x = make_input(shape, dtype, layout, "cpu", seed=len(shape))
    call = P.OP.prepare(x, dims)
    assert call.kind in ("keep", "move", "gather")
    assert len(call.sizes) <= max(1, len(shape))
    assert 1 not in call.sizes
    assert torch.equal(_rebuild(x, call), as_bytes(reference(x, dims)))
    if call.tile is not None:  # the tiled form is the same problem with W-unit elements
        w, sizes, strides = call.tile
        assert math.prod(sizes) * w * call.unit == x.numel() * x.element_size()
        assert 1 in strides and strides[-1] != 1


# ---------------------------------------------------------------------------------------------
# every backend against torch
# ---------------------------------------------------------------------------------------------
@settings(max_examples=40, **SETTINGS)
@given(shape=st.lists(st.integers(0, 6), min_size=1, max_size=5), data=st.data(),
       dtype=st.sampled_from([torch.uint8, torch.float16, torch.float32, torch.float64,
                              torch.complex128, torch.bool]),
       layout=st.sampled_from(LAYOUTS))
def test_backends_match_torch(cpu_triton, shape, data, dtype, layout):
    dims = data.draw(st.permutations(range(len(shape))))
    x = make_input(shape, dtype, layout, cpu_triton, seed=sum(shape))
    check_all(x, dims, with_out=data.draw(st.booleans()))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
def test_every_dtype(cpu_triton, dtype):
    # A transpose (tiled), a kept last dim (vectorized, widened), and short 16-byte runs.
    ran = set()
    for shape, dims in (((5, 12), (1, 0)), ((3, 4, 48), (1, 0, 2)), ((4, 6, 2), (1, 0, 2))):
        x = P.random_tensor(shape, dtype, cpu_triton)
        ran |= set(check_all(x, dims))
    assert ran == set(BACKENDS)


@pytest.mark.parametrize("shape, dims", [
    ((0, 4), (1, 0)), ((3, 0, 2), (2, 0, 1)),        # empty
    ((), ()), ((1,), (0,)), ((1, 1, 1), (2, 0, 1)),  # one element
    ((7,), (-1,)), ((1, 9, 1), (2, 1, 0)),           # really a copy
    ((2,) * 8, (7, 3, 5, 1, 6, 0, 4, 2)),            # rank 8
    ((3, 2, 1, 2, 3, 1, 2, 2), (6, 0, 5, 3, 7, 1, 4, 2)),
    ((2, 3, 2, 3, 2, 3), (5, 3, 1, 4, 2, 0)),        # tiled with the full 3 dims per group + batch
    ((33, 17), (1, 0)), ((3, 40), (1, 0)), ((40, 3), (1, 0)),  # ragged tiles
    ((300, 3), (1, 0)),                              # a 3-wide group: the tile widens the other
    ((2, 3, 2, 3, 2), (4, 3, 2, 1, 0)), ((2, 3, 2, 3, 2, 3, 2), (6, 5, 4, 3, 2, 1, 0)),
    ((2, 3, 4, 5), (0, 2, 3, 1)), ((2, 5, 3, 4), (0, 3, 1, 2)),
])
def test_edge_shapes(cpu_triton, shape, dims):
    for dtype in (torch.float32, torch.uint8):
        check_all(P.random_tensor(shape, dtype, cpu_triton), dims)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_layouts(cpu_triton, layout):
    for shape, dims in (((4, 6, 8), (2, 0, 1)), ((4, 6, 8), (1, 0, 2)), ((6, 4, 2), (1, 0, 2))):
        for dtype in (torch.float32, torch.complex128):
            check_all(make_input(shape, dtype, layout, cpu_triton, seed=3), dims)


@pytest.mark.slow
def test_tiled_batch_dims(cpu_triton, monkeypatch):
    """Groups of one dim each, so up to 6 dims go to the batch index."""
    monkeypatch.setattr(P_tiled, "GROUP_TARGET", 2)
    x = P.random_tensor((2, 3, 2, 2, 2, 3, 2, 3), torch.float16, cpu_triton)
    for dims in ((7, 6, 5, 4, 3, 2, 1, 0),):
        assert "tiled" in check_all(x, dims, backends=("tiled",), with_out=False)
        plan = P._plan(P.OP.prepare(x, dims))
        assert len(plan.a_dims) == len(plan.b_dims) == 1 and len(plan.batch) == 6


def test_short_runs_that_cannot_be_one_element(cpu_triton):
    # 2 float64 per run, but the other strides are odd: the run cannot become one 16-byte element.
    x = P.random_tensor((4, 5, 3), torch.float64, cpu_triton)[:, :, :2]
    call = P.OP.prepare(x, (1, 0, 2))
    assert call.kind == "keep" and call.tile is None
    check_all(x, (1, 0, 2))
    # 2 float64 per run, 8-byte aligned only, and no other dim is contiguous in runs.
    y = P.random_tensor((81,), torch.float64, cpu_triton)[1:].view(4, 5, 4)[:, :, :2]
    call = P.OP.prepare(y, (1, 0, 2))
    assert call.kind == "keep" and call.tile is None
    check_all(y, (1, 0, 2))


@pytest.mark.parametrize("shape, dims, dtype, side", [
    ((2, 3, 5, 7), (0, 2, 3, 1), torch.float32, "out"),   # NCHW -> NHWC: 3 channels per pixel
    ((2, 5, 7, 3), (0, 3, 1, 2), torch.float32, "in"),    # NHWC -> NCHW
    ((6, 7, 3), (2, 0, 1), torch.uint8, "in"),            # HWC -> CHW
    ((70, 2, 3), (2, 1, 0), torch.int16, "in"),           # a narrow group of two dims
    ((5, 9), (1, 0), torch.uint8, "out"),
])
def test_narrow_tiles(cpu_triton, shape, dims, dtype, side):
    """Groups under 16 bytes take the narrow kernel (one flat chunk + a gather)."""
    x = P.random_tensor(shape, dtype, cpu_triton)
    call = P.OP.prepare(x, dims)
    assert P._plan(call).narrow == side
    tiled = P.OP.backend("tiled")
    for cfg in [c for c in tiled.configs(call) if c.get("narrow")]:
        assert_same(tiled.run(P.OP.prepare(x, dims), cfg), reference(x, dims))
    check_all(x, dims, backends=("tiled",))
    y = make_input(shape, dtype, "permuted", cpu_triton, seed=5)
    call = P.OP.prepare(y, dims)
    if call.tile is not None and P._plan(call).narrow:
        cfg = next(c for c in tiled.configs(call) if c.get("narrow"))
        assert_same(tiled.run(call, cfg), reference(y, dims))
    check_all(y, dims, backends=("tiled",), with_out=False)


@pytest.mark.parametrize("shape, dims, dtype, side, narrow_first", [
    ((2, 1024), (1, 0), torch.uint8, "out", True),          # rows 1024 apart
    ((2, 1001), (1, 0), torch.uint8, "out", False),         # rows 1001 apart: scalar loads
    ((3, 4000), (1, 0), torch.float16, "out", True),
    ((64, 3, 350), (0, 2, 1), torch.float16, "out", False),
    ((1001, 2), (1, 0), torch.uint8, "in", True),           # the input side: any stride
    ((5, 7, 3), (2, 0, 1), torch.uint8, "in", True),
])
def test_first_narrow_config_needs_16_aligned_rows_on_the_output_side(shape, dims, dtype, side,
                                                                       narrow_first):
    """The H200 sweep (tiled.configs()): the narrow tile loses up to 3x where its rows are not
    16-element aligned on the input, so the general tile goes first there."""
    call = P.OP.prepare(torch.empty(shape, dtype=dtype), dims)  # (never run)
    assert P._plan(call).narrow == side
    configs = P.OP.backend("tiled").configs(call)
    assert bool(configs[0].get("narrow")) == narrow_first
    assert any(c.get("narrow") for c in configs) and any("a_block" in c for c in configs)


@pytest.mark.parametrize("shape, dtype, first", [
    ((300, 400), torch.uint8, {"a_block": 64, "b_block": 128, "num_warps": 4}),  # not 128 x 128
    ((300, 400), torch.float16, {"a_block": 64, "b_block": 128, "num_warps": 4}),
    ((8192, 4096), torch.float16, {"a_block": 64, "b_block": 256, "num_warps": 8}),  # 64 MB
    ((300, 400), torch.float32, {"a_block": 64, "b_block": 64, "num_warps": 4}),
    ((300, 400), torch.float64, {"a_block": 16, "b_block": 64, "num_warps": 4}),  # half the rows
    ((4096, 2048), torch.float64, {"a_block": 32, "b_block": 128, "num_warps": 8}),
])
def test_first_tiled_config_follows_the_sweep(shape, dtype, first):
    """The config the cold model runs, as the H200 sweep of every config ordered them
    (benchmarks/results/h200/permute_tiled_sweep.json; tiled.configs())."""
    x = torch.empty(shape, dtype=dtype)  # (never run: only the plan is read)
    cfg = P.OP.backend("tiled").configs(P.OP.prepare(x, (1, 0)))[0]
    assert {key: cfg[key] for key in first} == first


def test_gather_kind_only_naive(cpu_triton):
    x = make_input((6, 8), torch.float32, "contiguous", cpu_triton)[:, ::2]  # no stride-1 dim
    call = P.OP.prepare(x, (1, 0))
    assert call.kind == "gather"
    assert check_all(x, (1, 0)) == ["naive"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_config_and_tail(cpu_triton, backend):
    """All configs, plus tiny tiles with several tiles per program."""
    b = P.OP.backend(backend)
    cases = (((9, 37), (1, 0)), ((5, 7, 6), (1, 0, 2)), ((3, 5, 7, 2), (2, 1, 0, 3)),
             ((4, 5, 64), (1, 0, 2)), ((50, 3), (1, 0)), ((3, 70), (1, 0)))
    for shape, dims in cases:
        x = P.random_tensor(shape, torch.float32, cpu_triton)
        call = P.OP.prepare(x, dims)
        if b.supports(call) is not None:
            continue
        ref = reference(x, dims)
        configs = list(b.configs(call))
        if backend == "tiled":
            configs.append({"a_block": 4, "b_block": 8, "num_warps": 4, "tiles_per_program": 4})
            configs.append({"narrow": True, "tile_bytes": 64, "num_warps": 4,
                            "tiles_per_program": 4})
        elif backend == "vectorized":
            configs.append({"tile_bytes": 64, "num_warps": 4, "tiles_per_program": 4})
        else:
            configs.append({"block": 16, "num_warps": 4})
        for cfg in configs:
            assert_same(b.run(P.OP.prepare(x, dims), cfg), ref)


def test_int64_offsets(cpu_triton, monkeypatch):
    """The 64-bit index path (taken past 2**31 elements) on small tensors."""
    for module in (P_naive, P_tiled, P_vectorized):  # each backend asks for itself
        monkeypatch.setattr(module, "needs_int64", lambda *n: True)
    for shape, dims in (((6, 10), (1, 0)), ((3, 4, 8), (1, 0, 2)), ((2, 3, 4, 5), (3, 1, 0, 2)),
                        ((20, 3), (1, 0)), ((3, 20), (1, 0))):
        for dtype in (torch.float32, torch.complex128):
            check_all(make_input(shape, dtype, "permuted", cpu_triton, seed=1), dims)


def test_result_is_a_new_tensor(cpu_triton):
    """A permutation that moves elements gives a new tensor, from every backend and from auto's
    torch route (the second auto call)."""
    x = P.random_tensor((4, 5), torch.float32, cpu_triton)
    for name in ("torch", "naive", "tiled", None, None):
        y = ops.permute(x, (1, 0), backend=name)
        assert y.data_ptr() != x.data_ptr() and y.is_contiguous()
        assert_same(y, x.t())


@pytest.mark.parametrize("shape, layout, dims", [
    ((4, 5), None, (0, 1)),                 # the identity
    ((35, 1, 37), None, (1, 0, 2)),         # a dim of size 1 moved
    ((2003, 1, 61), None, (0, 2, 1)),
    ((1, 80), None, (1, 0)),
    ((6, 7, 8), (2, 0, 1), (2, 0, 1)),      # the input's own permutation undone
    ((0, 3, 4), None, (2, 0, 1)),           # empty
    ((1, 1, 1), None, (2, 1, 0)),           # one element
])
def test_result_aliases_as_torchs_contiguous(cpu_triton, shape, layout, dims):
    """Where x.permute(dims) is contiguous already, torch's contiguous() returns that view (no
    copy), and so does ops.permute (auto and the torch backend); a forced Triton backend runs
    its copy. The values and strides are torch's."""
    if layout is None:
        x = P.random_tensor(shape, torch.float32, cpu_triton)
    else:
        base = P.random_tensor([shape[d] for d in layout], torch.float32, cpu_triton)
        x = base.permute([layout.index(i) for i in range(len(layout))])
    ref = x.permute(dims).contiguous()
    assert ref.data_ptr() == x.data_ptr()  # (the case is one torch does not copy)
    for name in (None, "torch", None):
        y = ops.permute(x, dims, backend=name)
        assert y.data_ptr() == x.data_ptr() and y.is_contiguous(), name
        assert y.shape == ref.shape and y.stride() == ref.stride(), name
        assert_same(y, ref)
    if x.numel() > 1:
        y = ops.permute(x, dims, backend="naive")
        assert y.data_ptr() != x.data_ptr() and y.is_contiguous()
        assert_same(y, ref)
    # out= always writes out; autograd records a copy
    out = torch.full(ref.shape, float("nan"), device=cpu_triton)
    assert ops.permute(x, dims, out=out) is out
    assert_same(out, ref)
    g = ops.permute(x.clone().requires_grad_(), dims)
    assert_same(g.detach(), ref)
    # The layout's route (installed by an auto call) gives each input its own view.
    ops.permute(x, dims)
    assert P.OP.routes.get(plain_key(x, dims)) is not None
    other = x.clone() if layout is None else (
        base.clone().permute([layout.index(i) for i in range(len(layout))]))
    assert other.stride() == x.stride()
    y = ops.permute(other, dims)
    assert y.data_ptr() == other.data_ptr() and y.stride() == ref.stride()
    assert_same(y, ref)


# ---------------------------------------------------------------------------------------------
# out=
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ("torch",) + BACKENDS)
def test_out_variants(cpu_triton, backend):
    x = P.random_tensor((4, 6, 8), torch.float32, cpu_triton)
    dims = (1, 0, 2) if backend != "tiled" else (2, 1, 0)
    ref = reference(x, dims)
    # A non-contiguous out (written through a temporary).
    base = poisoned((ref.shape[2], ref.shape[1], ref.shape[0]), torch.float32, cpu_triton)
    out = base.permute(2, 1, 0)
    assert ops.permute(x, dims, out=out, backend=backend) is out
    assert torch.equal(out, ref)
    # A wrong shape is resized, with torch's warning when it held elements.
    out = torch.empty(5, dtype=torch.float32)
    with pytest.warns(UserWarning, match="resizing"):
        assert ops.permute(x, dims, out=out, backend=backend) is out
    assert_same(out, ref)
    out = torch.empty(0, dtype=torch.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ops.permute(x, dims, out=out, backend=backend)
    assert_same(out, ref)


def test_out_errors():
    x = torch.randn(3, 4)
    with pytest.raises(InvalidArgument, match="is on meta"):
        ops.permute(x, (1, 0), out=torch.empty(4, 3, device="meta"))
    with pytest.raises(InvalidArgument, match="strided"):
        ops.permute(x, (1, 0), out=torch.zeros(4, 3).to_sparse())
    with pytest.raises(InvalidArgument, match="dtype"):
        ops.permute(x, (1, 0), out=torch.empty(4, 3, dtype=torch.float64))
    with pytest.raises(InvalidArgument, match="shares memory"):
        ops.permute(x, (1, 0), out=x.view(4, 3))
    with pytest.raises(TypeError, match="out must be a tensor"):
        ops.permute(x, (1, 0), out=[0] * 12)
    # Disjoint parts of one storage are fine.
    buf = torch.zeros(24)
    src = buf[:12].view(3, 4).copy_(x)
    assert_same(ops.permute(src, (1, 0), out=buf[12:].view(4, 3)), x.t())


# ---------------------------------------------------------------------------------------------
# bad arguments raise as torch does
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dims, error, match", [
    ((0, 1), RuntimeError, "3 dimensions"),
    ((0, 1, 2, 0), RuntimeError, "4 entries"),
    ((0, 1, 1), RuntimeError, "more than once"),
    ((0, 2, -1), RuntimeError, "more than once"),
    ((0, 1, 3), IndexError, r"dims\[2\] = 3 is out of range"),
    ((0, 1, -4), IndexError, r"\[-3, 2\]"),
    ((0, 1.0, 2), TypeError, r"dims\[1\] must be an int"),
    ((0, "1", 2), TypeError, r"dims\[1\] must be an int"),
    ((True, 0, 2), TypeError, "must be an int"),
    (0, TypeError, "tuple or list"),
    (torch.tensor([2, 1, 0]), TypeError, "tuple or list"),
])
def test_bad_dims(dims, error, match):
    x = torch.randn(2, 3, 4)
    with pytest.raises(error):
        torch.permute(x, dims)  # torch raises the same class
    with pytest.raises(error, match=match):
        ops.permute(x, dims)


def test_dims_accept_index_types():
    x = torch.randn(2, 3, 4)
    ref = reference(x, (2, 0, 1))
    assert_same(ops.permute(x, [2, 0, 1]), ref)
    assert_same(ops.permute(x, (-1, 0, -2)), ref)
    assert_same(ops.permute(x, (torch.tensor(2), 0, 1)), ref)
    assert_same(ops.permute(x, torch.Size([2, 0, 1])), ref)


def test_bad_input():
    with pytest.raises(TypeError, match="input must be a tensor"):
        ops.permute([1, 2], (0,))
    with pytest.raises(TypeError, match="input must be a tensor"):
        ops.transpose(3.0, 0, 0)


def test_transpose(cpu_triton):
    x = P.random_tensor((3, 4, 5), torch.float32, cpu_triton)
    for a, b in ((0, 1), (1, 2), (0, 2), (-1, 0), (2, -3), (1, 1)):
        ref = x.transpose(a, b).contiguous()
        assert_same(ops.transpose(x, a, b), ref)
        assert_same(ops.transpose(x, a, b, backend="naive"), ref)
    out = poisoned((5, 4, 3), torch.float32, cpu_triton)
    assert ops.transpose(x, 0, 2, out=out, backend="tiled") is out
    assert_same(out, x.transpose(0, 2))
    s = torch.tensor(2.5)
    assert_same(ops.transpose(s, 0, -1), s)
    for a, b in ((0, 3), (-4, 0)):
        with pytest.raises(IndexError, match="out of range"):
            ops.transpose(x, a, b)
    with pytest.raises(IndexError, match=r"\[-1, 0\]"):
        ops.transpose(s, 0, 1)
    with pytest.raises(TypeError, match="dim1 must be an int"):
        ops.transpose(x, 0, 1.5)


# ---------------------------------------------------------------------------------------------
# selection
# ---------------------------------------------------------------------------------------------
def test_forced_backend_that_cannot_take_the_call(cpu_triton):
    t = torch.randn(8, 16)
    with pytest.raises(BackendError, match="vectorized.*last dim moves"):
        ops.permute(t, (1, 0), backend="vectorized")
    k = torch.randn(8, 16, 32)
    with pytest.raises(BackendError, match="tiled.*stays contiguous"):
        ops.permute(k, (1, 0, 2), backend="tiled")
    with pytest.raises(BackendError, match="tiled.*no dim of the input is contiguous"):
        ops.permute(t[:, ::2], (1, 0), backend="tiled")
    with pytest.raises(BackendError, match="unknown backend"):
        ops.permute(t, (1, 0), backend="fastest")


def test_auto_on_cpu_picks_torch():
    x = torch.randn(64, 64)
    d = opselect.explain("permute", x, (1, 0), show=False)
    assert d.choice == "torch"
    assert_same(ops.permute(x, (1, 0)), x.t())


def test_other_inputs(cpu_triton):
    # More than 8 dims left after simplification: torch only.
    x = P.random_tensor((2,) * 9, torch.float32, cpu_triton)
    dims = tuple(range(8, -1, -1))
    assert_same(ops.permute(x, dims), reference(x, dims))
    with pytest.raises(BackendError, match="at most 8"):
        ops.permute(x, dims, backend="naive")
    # Quantized tensors: torch only.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantized dtypes are deprecated in recent torch
        q = torch.quantize_per_tensor(torch.randn(3, 4), 0.1, 0, torch.quint8)
    assert torch.equal(ops.permute(q, (1, 0)).int_repr(), q.int_repr().t())
    with pytest.raises(BackendError, match="quantized"):
        ops.permute(q, (1, 0), backend="naive")
    # Sparse tensors: torch cannot make them contiguous either.
    with pytest.raises(InvalidArgument, match="strided"):
        ops.permute(torch.zeros(3, 4).to_sparse(), (1, 0))


def test_torch_only_inputs(cpu_triton):
    x = torch.randn(3, 4, requires_grad=True)
    y = ops.permute(x, (1, 0))
    assert y.grad_fn is not None
    y.sum().backward()
    assert torch.equal(x.grad, torch.ones(3, 4))
    # A Triton backend records autograd too (through transforms.py's autograd.Function).
    y = ops.permute(x, (1, 0), backend="naive")
    assert y.grad_fn is not None and torch.equal(y, x.detach().t())
    with torch.no_grad():
        assert_same(ops.permute(x, (1, 0), backend="naive"), x.detach().t())
    c = torch.randn(3, 4, dtype=torch.complex64).conj()  # a lazy conjugate view
    assert torch.equal(ops.permute(c, (1, 0)), c.resolve_conj().t())
    with pytest.raises(BackendError, match="conjugate"):
        ops.permute(c, (1, 0), backend="tiled")


def test_key_and_describe():
    x = torch.randn(16, 64, 64, 16)
    a = P.OP.prepare(x, (0, 2, 1, 3))
    b = P.OP.prepare(torch.randn(16, 64, 64, 16), (0, 2, 1, 3))
    assert a.key == b.key and hash(a.key)
    assert a.key != P.OP.prepare(x, (3, 2, 1, 0)).key
    assert "simplified" in a.describe() and "16-byte" in a.describe()


def test_cost_model_prefers_the_right_kernel():
    model = defaults_for(H200)

    def costs(x, dims):
        call = P.OP.prepare(x, dims)
        call.info = H200
        out = {}
        for b in P.OP.backends:
            if b.name == "torch" or b.supports(call) is None:
                est = b.cost(call, model)
                assert math.isfinite(est.seconds) and est.seconds > 0
                out[b.name] = est.seconds
        return out

    big_t = costs(torch.empty(4096, 4096), (1, 0))
    assert min(big_t, key=big_t.get) == "tiled"
    heads = costs(torch.empty(32, 512, 32, 128, dtype=torch.float16), (0, 2, 1, 3))
    assert min(heads, key=heads.get) == "vectorized"
    tiny = costs(torch.empty(8, 8), (1, 0))
    assert min(tiny, key=tiny.get) == "torch"
    assert costs(torch.empty(0, 8), (1, 0))["tiled"] > 0
    meta = torch.device("meta")
    # 1.45M 13x3 byte transposes: one tiny narrow tile per program made tiled 9x slower than
    # naive on the H200 (950 us against 103); the grid's size is a cost of its own.
    batch = costs(torch.empty(1447769, 3, 13, dtype=torch.uint8, device=meta).permute(1, 0, 2),
                  (1, 2, 0))
    assert batch["tiled"] > 3 * min(batch["naive"], batch["torch"])
    # 2 of every 3 bf16 (a sliced input): the tile reads the rows' whole span in one piece
    # (86 us on the H200, torch 173); not 4-byte segments.
    sliced = costs(torch.empty(31833846, 3, dtype=torch.bfloat16, device=meta)[:, :2], (1, 0))
    assert min(sliced, key=sliced.get) == "tiled"


def test_sample():
    (x, dims), kw = P.sample([[4, 5, 6]], torch.float16, {"dims": [2, 0, 1]}, torch.device("cpu"))
    assert x.shape == (4, 5, 6) and dims == [2, 0, 1] and kw == {}
    (x, dims), _ = P.sample([[4, 5, 6]], torch.uint8, {"layout": "permuted",
                                                        "layout_dims": [2, 0, 1]}, "cpu")
    assert x.shape == (4, 5, 6) and not x.is_contiguous() and dims == [2, 1, 0]
    assert x.permute(2, 0, 1).is_contiguous()
    for dtype in DTYPES:
        assert P.random_tensor((3, 2), dtype, "cpu").dtype == dtype
    with pytest.raises(InvalidArgument):
        P.sample([[2], [3]], torch.float32, {}, "cpu")
    with pytest.raises(InvalidArgument, match="layout"):
        P.sample([[2]], torch.float32, {"layout": "weird"}, "cpu")


# ---------------------------------------------------------------------------------------------
# prepared calls (Backend.bind): everything the plain key decides, worked out once
# ---------------------------------------------------------------------------------------------
def same_key_input(shape, dtype, layout: str) -> torch.Tensor:
    """A new tensor (new values, new storage) whose plain key depends on the arguments alone.
    "moved" is a view whose stride-1 dim is its first (the kernels see it through its storage)."""
    if layout == "moved":
        base = P.random_tensor(list(shape[1:]) + [shape[0]], dtype, "cpu")
        return base.permute(len(shape) - 1, *range(len(shape) - 1))
    return make_input(shape, dtype, layout, "cpu", seed=3)  # (the geometry follows the seed)


# (shape, dims): a transpose, a kept last dim (widened), 16-byte runs the tiled kernel takes as
# one element, a narrow group of 3, and a kept run of the "moved" input.
PREPARED_CASES = (((5, 12), (1, 0)), ((3, 4, 6), (1, 0, 2)), ((4, 6, 2), (1, 0, 2)),
                  ((6, 7, 3), (2, 0, 1)), ((16, 4, 6), (2, 1, 0)))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.slow
def test_prepared_call_answers_every_input_of_its_key(cpu_triton, backend):
    """bind() of a plain call gives a function that permutes any input of the call's plain key
    (new values, new storage) into a new contiguous tensor: contiguous inputs, misaligned slices
    (their own key), strided views, every element size, under every config."""
    b = P.OP.backend(backend)
    bound = 0
    for shape, dims in PREPARED_CASES:
        for layout in ("contiguous", "offset", "moved"):
            for dtype in (torch.bool, torch.uint8, torch.float16, torch.float32,
                          torch.complex128):
                x = same_key_input(shape, dtype, layout)
                call = P.OP.prepare(x, dims)
                if b.supports(call) is not None:
                    continue
                key = plain_key(x, dims)
                configs = b.configs(call) if dtype == torch.float16 else b.configs(call)[:1]
                for config in configs:
                    permuted = b.bind(call, config)
                    assert permuted is not None, (shape, dims, layout, dtype, config)
                    results = []  # (kept alive: each result is a tensor of its own)
                    for _ in range(3):
                        y = same_key_input(shape, dtype, layout)
                        assert plain_key(y, dims) == key
                        got = permuted(y)
                        assert_same(got, reference(y, dims))
                        assert got.data_ptr() not in [r.data_ptr() for r in results + [y]]
                        results.append(got)
                    bound += 1
    assert bound >= 10


def test_calls_that_are_not_prepared(cpu_triton):
    """out=, autograd, empty calls and the inputs only torch takes go through run()."""
    x = P.random_tensor((5, 12), torch.float32, cpu_triton)
    for name in BACKENDS:
        b = P.OP.backend(name)
        dims = (1, 0) if name != "vectorized" else (0, 1)
        config = b.configs(P.OP.prepare(x, dims))[0]
        assert b.bind(P.OP.prepare(x, dims), config) is not None
        assert b.bind(P.OP.prepare(x, dims, out=torch.empty(0)), config) is None
        assert b.bind(P.OP.prepare(x.clone().requires_grad_(), dims), config) is None
        assert b.bind(P.OP.prepare(x[:0], dims), config) is None
        z = P.random_tensor((5, 12), torch.complex64, cpu_triton).conj()
        assert b.bind(P.OP.prepare(z, dims), b.configs(P.OP.prepare(z, dims))[0]) is None


#: Configs as tune records stored them before issue 34 (one name per tunable).
OLD_CONFIGS = {
    ((40, 60), (1, 0)): {"naive": {"BLOCK": 512, "num_warps": 4},
                         "tiled": {"BA": 32, "BB": 64, "num_warps": 4, "TPP": 2}},
    ((6, 7, 3), (2, 0, 1)): {"tiled": {"NARROW": True, "TILE_BYTES": 16384, "num_warps": 4,
                                       "TPP": 1}},
    ((3, 4, 64), (1, 0, 2)): {"vectorized": {"TILE_BYTES": 8192, "num_warps": 4, "TPP": 2}},
}


@pytest.mark.parametrize("shape, dims", list(OLD_CONFIGS))
def test_configs_under_old_names_are_measured_again_never_misread(cpu_triton, monkeypatch,
                                                                  shape, dims):
    """A tune record under the old config keys (BLOCK, BA, BB, TPP, TILE_BYTES, NARROW) is not
    a config the backend offers: ignored with a warning, the model decides until tuning
    measures again; run() refuses the old keys (InvalidArgument) rather than reading defaults in
    their place, and today's names run."""
    from opselect.dispatch import op as dispatch_op
    from opselect.errors import CacheWarning
    from opselect.tune_cache import store

    old = OLD_CONFIGS[(shape, dims)]
    monkeypatch.setattr(dispatch_op, "_foreign_configs_told", set())
    x = P.random_tensor(shape, torch.float32, cpu_triton)
    call = P.OP.prepare(x, dims)
    able = [c.name for c in P.OP.plan(call) if c.supported]
    assert set(old) <= set(able)
    store().put_timings("permute", call.info, call.key[1:], {
        name: (1e-9, cfg, P.OP.backend(name).source_hash) for name, cfg in old.items()})
    with pytest.warns(CacheWarning, match="that the backend does not offer") as told:
        decision = P.OP.decide(call)
    warned = {re.search(r"config of permute/(\w+) ", str(w.message))[1] for w in told}
    unmeasured = {name for name in old if decision.candidate(name).measured_s is None}
    assert warned == unmeasured == set(old) and decision.source == "model"
    assert decision.config in [dict(c) for c in P.OP.backend(decision.choice).configs(call)]
    for name, cfg in old.items():
        backend = P.OP.backend(name)
        with pytest.raises(InvalidArgument, match="are not this backend's"):
            backend.run(P.OP.prepare(x, dims), cfg)
        # Today's names run: the config of the same kind (narrow or not) the model would take.
        today = next(c for c in backend.configs(call)
                     if bool(c.get("narrow")) == bool(cfg.get("NARROW")))
        assert_same(backend.run(P.OP.prepare(x, dims), today), reference(x, dims))


@pytest.mark.parametrize("backend, shape, dims, dtype, builders", [
    ("naive", (5, 12), (1, 0), torch.float32, (P_naive, "naive_plan")),
    ("tiled", (5, 12), (1, 0), torch.float32, (P_tiled, "tiled_launch_plan")),
    ("tiled", (6, 7, 3), (2, 0, 1), torch.uint8, (P_tiled, "narrow_launch_plan")),
    ("vectorized", (3, 4, 6), (1, 0, 2), torch.float16, (P_vectorized, "runs_plan")),
])
def test_forced_route_works_its_plan_out_once(cpu_triton, monkeypatch, backend, shape, dims,
                                              dtype, builders):
    """A forced call through ops.permute binds once per plain key; later calls of the key (new
    tensors) are answered by the forced route, with no plan, no bind and no prepare."""
    b = P.OP.backend(backend)
    counts = {"bind": 0, "prepare": 0, "launch plan": 0}

    def counting(what, fn):
        def counted(*args, **kwargs):
            counts[what] += 1
            return fn(*args, **kwargs)
        return counted

    module, builder = builders
    b.forget_plans()  # (plans are memoised per backend: an earlier test may have made this one)
    monkeypatch.setattr(b, "bind", counting("bind", b.bind))
    monkeypatch.setattr(b, "_prepared", counting("prepare", b._prepared))
    monkeypatch.setattr(module, builder, counting("launch plan", getattr(module, builder)))
    for layout, binds in (("contiguous", 1), ("offset", 2)):  # a misaligned slice: its own key
        for _ in range(3):
            x = same_key_input(shape, dtype, layout)
            assert_same(ops.permute(x, dims, backend=backend), reference(x, dims))
            assert counts == {"bind": binds, "prepare": binds, "launch plan": binds}
            assert (backend, plain_key(x, dims)) in P.OP.forced_routes


# ---------------------------------------------------------------------------------------------
# GPU: the same checks at real sizes
# ---------------------------------------------------------------------------------------------
GPU_CASES = [
    ((32, 512, 32, 128), torch.float16, (0, 2, 1, 3)),
    ((4096, 4096), torch.float32, (1, 0)),
    ((4096, 4095), torch.float16, (1, 0)),
    ((64, 512, 512), torch.float32, (0, 2, 1)),
    ((16, 64, 64, 64, 16), torch.float32, (4, 3, 2, 1, 0)),
    ((32, 3, 224, 224), torch.float32, (0, 2, 3, 1)),
    ((1024, 1024, 3), torch.uint8, (2, 0, 1)),
    ((1024, 1024, 4), torch.float32, (1, 0, 2)),
    ((512, 512), torch.complex128, (1, 0)),
    ((256, 256, 2), torch.complex128, (1, 0, 2)),
    ((2, 3, 4, 5, 6, 7, 8, 9), torch.bool, (7, 6, 5, 4, 3, 2, 1, 0)),
    ((1000, 999), torch.int8, (1, 0)),
]


@pytest.mark.gpu
@pytest.mark.parametrize("shape, dtype, dims", GPU_CASES, ids=lambda v: str(v))
def test_gpu_backends(cuda, shape, dtype, dims):
    torch.manual_seed(0)
    for layout in ("contiguous", "permuted", "offset"):
        x = make_input(shape, dtype, layout, cuda, seed=1)
        check_all(x, dims)
    torch.cuda.synchronize()


@pytest.mark.gpu
def test_gpu_bound_launches(cuda, monkeypatch):
    """Every backend's launches with verify on (Triton binds each call and must pick the very
    kernel the spec names: a spec that misses an argument Triton specializes on fails here),
    then the bound fast path on fresh tensors of the same calls, from aligned and offset
    storage, with and without out=."""
    from opselect.kernels._common import Launcher

    cases = [((300, 257), torch.float32, (1, 0)), ((64, 48, 2), torch.float16, (1, 0, 2)),
             ((96, 3, 40), torch.uint8, (0, 2, 1)), ((32, 3, 64, 64), torch.float32, (0, 2, 3, 1)),
             ((2, 3, 4, 5, 6, 7, 8, 9), torch.bool, (7, 6, 5, 4, 3, 2, 1, 0)),
             ((1000, 999), torch.int8, (1, 0)), ((256, 256, 2), torch.complex128, (1, 0, 2))]
    seed = 10
    for shape, dtype, dims in cases:
        for layout in ("contiguous", "offset"):
            for verify in (True, False):
                monkeypatch.setattr(Launcher, "verify", verify)
                for _ in range(2):
                    seed += 1
                    check_all(make_input(shape, dtype, layout, cuda, seed=seed), dims)


GPU_SHAPES = (((300, 257), (1, 0)), ((17, 33, 64), (1, 0, 2)), ((64, 48, 2), (1, 0, 2)),
              ((96, 3, 40), (0, 2, 1)))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
def test_gpu_every_dtype(cuda, dtype):
    for shape, dims in GPU_SHAPES:
        check_all(P.random_tensor(shape, dtype, cuda), dims)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", (torch.uint8, torch.float16, torch.float32, torch.complex128),
                         ids=lambda d: str(d)[6:])
def test_gpu_every_config(cuda, dtype):
    for shape, dims in GPU_SHAPES:
        x = P.random_tensor(shape, dtype, cuda)
        ref = reference(x, dims)
        call = P.OP.prepare(x, dims)
        for name in BACKENDS:
            b = P.OP.backend(name)
            if b.supports(call) is None:
                for cfg in b.configs(call):
                    assert_same(b.run(P.OP.prepare(x, dims), cfg), ref)


@pytest.mark.gpu
@settings(max_examples=30, **SETTINGS)
@given(shape=st.lists(st.integers(0, 40), min_size=1, max_size=8), data=st.data(),
       dtype=st.sampled_from([torch.uint8, torch.float16, torch.float32, torch.complex128]),
       layout=st.sampled_from(LAYOUTS))
def test_gpu_random(cuda, shape, data, dtype, layout):
    if math.prod(shape) > 1 << 22:
        shape = [min(s, 6) for s in shape]
    dims = data.draw(st.permutations(range(len(shape))))
    check_all(make_input(shape, dtype, layout, cuda, seed=len(shape)), dims)


@pytest.mark.gpu
def test_gpu_past_2_31_elements(cuda):
    """Offsets past 2**31 units: a uint8 transpose (tiled, naive) and 3-byte runs (vectorized)."""
    free, _ = torch.cuda.mem_get_info()
    if free < 12 * 2**30:
        pytest.skip("needs 12 GiB of free GPU memory")
    x = torch.randint(0, 256, (2**16 + 3, 2**15 + 1), dtype=torch.uint8, device=cuda)
    assert x.numel() > 2**31
    ref = x.t().contiguous()
    for name in ("tiled", "naive"):
        got = ops.permute(x, (1, 0), backend=name)
        assert torch.equal(got, ref), name
        del got
    del x, ref
    y = torch.randint(0, 256, (2**15, 2**15 + 1, 3), dtype=torch.uint8, device=cuda)
    assert y.numel() > 2**31
    ref = y.permute(1, 0, 2).contiguous()
    for name in ("vectorized", "naive"):
        got = ops.permute(y, (1, 0, 2), backend=name)
        assert torch.equal(got, ref), name
        del got
