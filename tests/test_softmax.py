"""softmax / log_softmax: every backend and the backward against torch, on random and edge inputs,
plus torch's argument rules and the dispatcher's selection.

CPU tests run the Triton kernels through the interpreter with small shapes (module constants are
lowered where a path needs long rows); the `gpu` tests repeat them at real sizes on CUDA. Every
tensor the kernels write is poisoned first (filled with 7.0, which neither softmax <= 1 nor
log_softmax <= 0 can produce), and every element is compared with a float64 reference, so an
element a kernel forgets to write fails the test.
"""

from __future__ import annotations

import dataclasses
import importlib
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import opselect
from opselect import ops
from opselect.dispatch import get_op
from opselect.dispatch.op import MEASURED_TORCH_MARGIN
from opselect.errors import ArgumentTypeError, BackendError, InvalidArgument
from opselect.heuristics.device_model import known_gpu
from opselect.kernels import softmax as sm
from opselect.kernels import _common

SOFTMAX_MODULES = [importlib.import_module(f"opselect.kernels.softmax.{name}") for name in
                   ("call", "common", "autograd", "fused", "multirow", "online", "lagged",
                    "strided")]

pytestmark = [
    # The interpreter runs kernels in numpy, which warns on -inf - -inf (NaN rows are expected).
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:divide by zero encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:All-NaN slice encountered:RuntimeWarning"),
]

TRITON = ["fused", "online", "multirow", "strided"]
FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
POISON = 7.0
# (atol, rtol) of an output of this dtype against the float64 reference.
TOL = {torch.float16: (1e-3, 2e-3), torch.bfloat16: (8e-3, 1.6e-2), torch.float32: (2e-6, 2e-5),
       torch.float64: (1e-12, 1e-10)}


@pytest.fixture(autouse=True)
def poisoned(monkeypatch):
    """Kernel outputs (and workspaces) start as POISON instead of whatever memory held. Set
    before the test's first call: a prepared call makes its allocator once."""
    monkeypatch.setattr(_common, "POISON", POISON)


def patch_everywhere(monkeypatch, name: str, value) -> None:
    """Replace `name` in every module of the softmax package that holds it (each module imports
    the helpers it uses by name)."""
    holders = [module for module in SOFTMAX_MODULES if hasattr(module, name)]
    assert holders, f"no module of the softmax package holds {name}"
    for module in holders:
        monkeypatch.setattr(module, name, value)


def fn(log: bool):
    return ops.log_softmax if log else ops.softmax


def reference(x, dim, log, dtype=None):
    """torch's op in float64 on the (cast) input, as the exact answer."""
    src = x.detach().to(dtype) if dtype is not None else x.detach()
    t = torch.log_softmax if log else torch.softmax
    return t(src.double(), dim)


def assert_matches(got, x, dim, log, dtype=None, backend=""):
    out_dtype = dtype or x.dtype
    assert got.dtype == out_dtype, f"{backend}: dtype {got.dtype}, expected {out_dtype}"
    assert got.shape == x.shape, f"{backend}: shape {tuple(got.shape)}, expected {tuple(x.shape)}"
    assert got.device == x.device
    # torch's answer rounded once to the output dtype (log_softmax of huge values overflows there)
    ref = reference(x, dim, log, dtype).to(out_dtype).double()
    atol, rtol = TOL[out_dtype]
    if log:
        # log_softmax values grow with the spread of the row; compare relative to magnitude too.
        atol = atol * 8
    torch.testing.assert_close(got.double(), ref, atol=atol, rtol=rtol, equal_nan=True,
                               msg=lambda m: f"{backend} {'log_' if log else ''}softmax of "
                                             f"{tuple(x.shape)} {x.dtype} dim {dim}: {m}")


def supported(backend, shape, dim, dtype=torch.float32):
    """Whether a backend takes a call (its supports(), on a meta tensor: no memory)."""
    call = sm.prepare_softmax(torch.empty(shape, dtype=dtype, device="meta"), dim)
    return get_op("softmax").backend(backend).supports(call) is None


def spy(monkeypatch, *names):
    """Record the grid of every launch of these kernels of the module (by name): each kernel's
    Launcher gets a stand-in that notes the grid and launches the real kernel. On a GPU the
    launcher then takes its plain path (Triton's own launch): its bound launches would skip the
    stand-in, and it has no argument names to bind with."""
    grids = {name: [] for name in names}
    for name in names:
        launcher = sm.LAUNCHERS[name]
        kernel = launcher.fn

        class Watch:
            __name__ = name

            def __getitem__(self, grid, kernel=kernel, name=name):
                grids[name].append(tuple(grid))
                return kernel[grid]

        monkeypatch.setattr(launcher, "fn", Watch())
        monkeypatch.setattr(launcher, "fast", False)
    return grids


def set_sm_count(monkeypatch, count):
    """Pretend the device has `count` SMs (the launchers size grids and splits by it)."""
    real = sm.call.device_info
    patch_everywhere(monkeypatch, "device_info",
                     lambda dev: dataclasses.replace(real(dev), sm_count=count))


def run_config(x, dim, log, backend, config, dtype=None):
    """Run one backend with an explicit configuration (paths the default config does not take at
    test sizes)."""
    op = sm.LOG_SOFTMAX_OP if log else sm.SOFTMAX_OP
    call = op.prepare(x, dim, dtype=dtype)
    b = op.backend(backend)
    assert b.supports(call) is None
    return b.run(call, config)


# ---------------------------------------------------------------------------------------------
# Forward, every backend, on the interpreter
# ---------------------------------------------------------------------------------------------
CASES = {
    "fused": [((7, 37), -1), ((3, 1000), 1), ((2, 3, 64), 2), ((1, 1), -1), ((5,), 0)],
    "multirow": [((33, 7), -1), ((70, 1), 1), ((9, 256), -1), ((4, 5, 3), -1), ((3, 100), 1)],
    "online": [((3, 1500), -1), ((2, 2, 1025), -1)],
    "strided": [((4, 6, 5), 1), ((5, 3, 7), 0), ((3, 40), 0), ((2, 3, 4, 5), 1), ((9, 2), 0)],
}


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("backend", TRITON)
def test_backend_matches_torch(cpu_triton, backend, log):
    torch.manual_seed(1)
    for shape, dim in CASES[backend]:
        x = torch.randn(shape) * 3
        assert_matches(fn(log)(x, dim, backend=backend), x, dim, log, backend=backend)


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("backend", TRITON)
def test_dtypes(cpu_triton, backend, dtype):
    torch.manual_seed(2)
    shape, dim = CASES[backend][0]
    x = (torch.randn(shape) * 4).to(dtype)
    for log in (False, True):
        assert_matches(fn(log)(x, dim, backend=backend), x, dim, log, backend=backend)


@pytest.mark.parametrize("config", [
    {"block": 256, "num_warps": 4, "split": 1},   # several chunks, two passes in one program
    {"block": 128, "num_warps": 4, "split": 3},   # split rows: stats, then combine + normalise
    {"block": 64, "num_warps": 4, "split": 40},   # more parts than needed: clamped
])
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.slow
def test_online_chunked_and_split(cpu_triton, monkeypatch, config, log):
    grids = spy(monkeypatch, "_online_fwd_kernel", "_split_stats_kernel", "_split_norm_kernel")
    torch.manual_seed(3)
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        x = (torch.randn(3, 1100) * 5).to(dtype)
        x[1, 700:] = float("-inf")  # whole chunks of -inf, after finite ones
        x[2, :900] = float("-inf")  # whole chunks of -inf, before finite ones
        got = run_config(x, -1, log, "online", config)
        assert_matches(got, x, -1, log, backend=f"online {config}")
    split = config["split"] > 1
    assert len(grids["_online_fwd_kernel"]) == (0 if split else 3)
    assert len(grids["_split_stats_kernel"]) == (3 if split else 0)
    assert len(grids["_split_norm_kernel"]) == (3 if split else 0)
    if split:  # 1100 elements in chunks of whole blocks: never more parts than blocks
        parts = grids["_split_stats_kernel"][0][0] // 3
        assert 1 < parts <= -(-1100 // config["block"])


@pytest.mark.parametrize("chunk", [256, 128])
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.slow
def test_online_cooperative(cpu_triton, monkeypatch, chunk, log):
    """Programs sharing a row. The interpreter runs programs one by one, so only the
    last program of a row finds its siblings arrived (it merges their statistics); the others give
    up waiting at once and read the whole row: both paths run."""
    grids = spy(monkeypatch, "_coop_fwd_kernel")
    torch.manual_seed(4)
    for dtype in (torch.float32, torch.float16, torch.float64):
        x = (torch.randn(3, 1100) * 5).to(dtype)
        x[1, 700:] = float("-inf")  # whole chunks of -inf, after finite ones
        x[2, :900] = float("-inf")  # whole chunks of -inf, before finite ones
        got = run_config(x, -1, log, "online", {"chunk": chunk, "num_warps": 4})
        assert_matches(got, x, -1, log, backend=f"online coop {chunk}")
    assert grids["_coop_fwd_kernel"] == [(3 * -(-1100 // chunk),)] * 3
    # non-contiguous rows, a row of NaN and a row of +inf
    x = torch.randn(4, 2400)[:, ::2].clone()[:, :1100]
    x[1, 5] = float("nan")
    x[2, 1000] = float("inf")
    assert_matches(run_config(x.t().contiguous().t(), -1, log, "online",
                              {"chunk": chunk, "num_warps": 4}), x, -1, log,
                   backend="online coop")


@pytest.mark.slow
def test_cooperative_counters_move_on_and_wrap(cpu_triton):
    """The arrival counters are never reset: each launch moves every row's counter on by the
    padded programs per row, and a row is complete at the next multiple of it. Five launches in
    a row from 0, from just below int32's wrap-around and from -8 (crossing 0): each right, each
    counter moved on by exactly that much. (A counter off its multiples, or a completion never
    seen, would leave rows waiting: on the interpreter they reread their rows, so the answers
    alone would not tell.)"""
    from opselect.kernels.softmax import online

    x = torch.randn(3, 1100) * 5
    x[1, 700:] = float("-inf")
    call = sm.SOFTMAX_OP.prepare(x, -1)
    plan = online.coop_fwd_plan(call, 256, 4, call.info.sm_count)
    coop, split = plan.forward, plan.programs_per_row
    step = coop.split_padded
    assert (split, step) == (5, 8)
    launch = online._COOP_FWD.bind(coop, (3 * split,), call.info.index)
    for start in (0, (1 << 31) - 2 * step, -step):
        counters = torch.full((3,), start, dtype=torch.int32)
        partials = torch.empty(2 * 3 * split)
        for i in range(1, 6):
            y = torch.full_like(x, float("nan"))
            launch(x, y, partials, counters, *coop.ints)
            assert_matches(y, x, -1, False, backend=f"coop from {start}, launch {i}")
            moved = (start + i * step + (1 << 31)) % (1 << 32) - (1 << 31)  # int32 arithmetic
            assert counters.tolist() == [moved] * 3, (start, i)


def test_cooperative_split_limits(cpu_triton, monkeypatch):
    """A row is shared by at most min(64, SMs) programs: more could not be relied on to run at
    once (the wait would give up and reread rows)."""
    def gpu_call(n, sms):
        call = sm.prepare_softmax(torch.empty(2, n), -1)
        call.info = dataclasses.replace(call.info, type="cuda", index=0, sm_count=sms)
        return call

    call = gpu_call(1 << 20, 132)
    assert sm.coop_split(call, 16384) == 64 and sm.coop_split(call, 8192) is None
    assert [c["chunk"] for c in sm.OnlineBackend.coop_configs(call)] == [16384]
    call = gpu_call(1 << 20, 16)
    assert sm.OnlineBackend.coop_configs(call) == []
    assert "chunk" not in sm.OP.backend("online").configs(call)[0]
    assert sm.coop_split(gpu_call(50257, 132), 8192) == 7
    assert sm.coop_split(gpu_call(16384, 132), 16384) is None  # one chunk: that is fused's job
    # The cold model runs chunks of 8192 with 8 warps first (fits/softmax.md).
    assert sm.OnlineBackend.coop_configs(gpu_call(66117, 132))[0] == {"chunk": 8192,
                                                                      "num_warps": 8}
    assert sm.OP.backend("online").configs(gpu_call(66117, 132))[0]["chunk"] == 8192


def test_cooperative_register_cap_and_first_chunk(cpu_triton):
    """ptxas's register cap goes only where it lets one more program onto an SM (a chunk's
    elements a thread + 24, against the 8 more ptxas takes alone), never on rows off the grid
    or float64; 16-bit rows of at most 16 chunks of 4096 run 4096 x 4 warps first."""
    from opselect.kernels.softmax import online

    assert online.coop_registers(4096, 8, 0, False) == 40  # 6 programs an SM, not 5
    assert online.coop_registers(8192, 16, 0, False) == 40  # 3, not 2
    assert online.coop_registers(4096, 4, 0, False) == 56  # 9, not 8
    assert online.coop_registers(8192, 8, 0, False) is None  # 4 either way
    assert online.coop_registers(16384, 16, 0, False) is None  # 2 either way
    assert online.coop_registers(4096, 8, 8, False) is None  # shifted vectors spill
    assert online.coop_registers(4096, 8, 0, True) is None  # float64 spills

    def first(n, dtype):
        call = sm.prepare_softmax(torch.empty(2, n, dtype=dtype), -1)
        call.info = dataclasses.replace(call.info, type="cuda", index=0, sm_count=132)
        return sm.OnlineBackend.coop_configs(call)[0]

    assert first(32000, torch.bfloat16) == {"chunk": 4096, "num_warps": 4}
    assert first(65536, torch.float16) == {"chunk": 4096, "num_warps": 4}
    assert first(65537, torch.float16) == {"chunk": 8192, "num_warps": 8}  # 17 chunks
    assert first(32000, torch.float32) == {"chunk": 8192, "num_warps": 8}
    assert first(128256, torch.bfloat16) == {"chunk": 8192, "num_warps": 8}


def test_cooperative_config_outside_its_limits(cpu_triton, monkeypatch):
    """A cached config from the same shape bucket may not suit this row: plain online runs."""
    grids = spy(monkeypatch, "_coop_fwd_kernel", "_online_fwd_kernel", "_split_stats_kernel")
    x = torch.randn(2, 1500)
    got = run_config(x, -1, False, "online", {"chunk": 2048, "num_warps": 4})  # one chunk
    assert_matches(got, x, -1, False, backend="online")
    assert not grids["_coop_fwd_kernel"] and (grids["_online_fwd_kernel"]
                                              or grids["_split_stats_kernel"])


def _vector_of(backend, call, config) -> int:
    """The shifted access's elements per vector in the plan a backend runs a call under."""
    plan = sm.OP.backend(backend).forward_plan(call, config, call.info.sm_count)
    return getattr(plan, "forward", plan).vector


@pytest.mark.parametrize("log", [False, pytest.param(True, marks=pytest.mark.slow)],
                         ids=["softmax", "log_softmax"])  # (log_softmax's: make test-all)
@pytest.mark.slow
def test_rows_off_the_vector_grid(cpu_triton, log):
    """Packed rows whose length is no multiple of a 16-byte vector start off the grid; the
    multirow and cooperative kernels read them from their first whole vector on, with the head before it
    and the tail after the last whole vector written element-wise. Heads and tails of every size
    (row lengths around two vectors, the shortest taken), with -inf, +inf and NaN in them, and
    rows wholly in the head and tail's reach: an element written twice or not at all (poisoned
    outputs) fails."""
    torch.manual_seed(11)
    cases = [("multirow", torch.float16, 17, None), ("multirow", torch.float16, 16 + 3, None),
             ("multirow", torch.bfloat16, 251, None), ("multirow", torch.float32, 9, None),
             ("multirow", torch.float64, 5, None), ("multirow", torch.float16, 201, torch.float32),
             ("multirow", torch.float32, 201, torch.float16),
             ("multirow", torch.float16, 37, None), ("multirow", torch.float32, 11, None),
             # (the interpreter's last program of a row merges the others' statistics: its
             # chunk holds elements whatever the head's size, so part 0's head counts)
             ("online", torch.bfloat16, 2069, {"chunk": 512, "num_warps": 4}),
             ("online", torch.float32, 1035, {"chunk": 256, "num_warps": 4})]
    for backend, dtype, n, extra in cases:
        out_dtype = extra if isinstance(extra, torch.dtype) else None
        x = (torch.randn(9, n) * 4).to(dtype)
        x[0, :3] = float("-inf")  # in the head of some rows
        x[1, -2:] = float("inf")  # the tail
        x[2, 0] = float("nan")
        x[3] = float("-inf")  # a row of -inf: NaN, as torch
        x[4, n // 2:] = float("-inf")
        op = sm.LOG_SOFTMAX_OP if log else sm.SOFTMAX_OP
        call = op.prepare(x, -1, dtype=out_dtype)
        config = extra if isinstance(extra, dict) else op.backend(backend).configs(call)[0]
        assert _vector_of(backend, call, config) == 16 // min(
            dtype.itemsize, (out_dtype or dtype).itemsize), (backend, dtype, n)
        got = run_config(x, -1, log, backend, config, dtype=out_dtype)
        assert_matches(got, x, -1, log, dtype=out_dtype, backend=f"{backend} {dtype} n={n}")
        # the same rows starting one element past the grid (the tensor's own address)
        shifted = torch.cat([x.reshape(-1)[:1], x.reshape(-1)])[1:].view(9, n)
        assert_matches(run_config(shifted, -1, log, backend, config, dtype=out_dtype), x, -1,
                       log, dtype=out_dtype, backend=f"{backend} {dtype} n={n} offset 1")
    # Aligned, short (fewer than two vectors) and strided rows keep element-wise access; so do
    # fused's rows (one a program: as fast element by element on the H200, or faster).
    for shape, dtype in (((4, 64), torch.float16), ((4, 15), torch.float16), ((4, 7), torch.float32)):
        call = sm.prepare_softmax(torch.randn(shape).to(dtype), -1)
        assert _vector_of("multirow", call, sm.OP.backend("multirow").configs(call)[0]) == 0
    strided = torch.randn(4, 2 * 201)[:, :201]
    call = sm.prepare_softmax(strided, -1)
    assert call.fast
    assert _vector_of("multirow", call, sm.OP.backend("multirow").configs(call)[0]) == 0
    assert_matches(ops.softmax(strided, -1, backend="multirow"), strided, -1, False)
    call = sm.prepare_softmax(torch.randn(4, 1001).half(), -1)
    assert _vector_of("fused", call, sm.OP.backend("fused").configs(call)[0]) == 0


@pytest.mark.parametrize("config", [
    {"inner_block": 4, "tile": 32, "warp_scale": 1},   # the dim in chunks of 2: two passes
    {"inner_block": 2, "tile": 1024, "warp_scale": 2},  # narrow column blocks, whole dim at once
    {"inner_block": 64, "tile": 64, "warp_scale": 1},   # block wider than inner: clamped
    # the dim split over programs: chunks of 14 rows (tiles of 2), a short last chunk
    {"inner_block": 4, "tile": 32, "warp_scale": 1, "splits": 3},
    {"inner_block": 2, "tile": 1024, "warp_scale": 2, "splits": 8},  # 5 chunks of 8 rows
])
@pytest.mark.slow
def test_strided_configs(cpu_triton, config):
    torch.manual_seed(4)
    x = torch.randn(3, 37, 5) * 3
    x[1, :, 2] = float("-inf")
    x[2, :20, 0] = float("-inf")
    for log in (False, True):
        assert_matches(run_config(x, 1, log, "strided", config), x, 1, log, backend="strided")
        # The same tile over the rows of a transposed tensor, read in place as its columns and
        # written as rows (the output contiguous, as torch's is).
        xc = x.permute(0, 2, 1)
        got = run_config(xc, -1, log, "strided", config)
        assert got.is_contiguous()
        assert_matches(got, xc, -1, log, backend="strided columns")
    if "splits" in config:
        plan = sm.strided.strided_split_fwd_plan(sm.prepare_softmax(x, 1), config["inner_block"],
                                                 config["tile"], 1, config["splits"])
        n, chunk, splits = plan.ints[0], plan.ints[5], plan.ints[6]
        assert chunk % plan.dim_block == 0 and (splits - 1) * chunk < n <= splits * chunk
        return
    bi, bn, single = sm._strided_plan(37, 5, 3, 4, 2, config["inner_block"], config["tile"])
    assert single == (config["tile"] >= 64 * bi) and bi <= 8 and (single or bn < 37)


def test_columns_edges_and_gradient(cpu_triton):
    """Rows of a transposed tensor through strided, read in place as its columns: special
    values (NaN, +-inf, a row all -inf, -0.0), float16 widened to float32, and the gradient
    under autograd (the backward runs on the forward's output, whose rows are contiguous)."""
    torch.manual_seed(8)
    m = torch.randn(33, 6) * 4
    m[3, 0] = float("nan")
    m[:, 1] = float("-inf")
    m[7, 2], m[8, 2], m[9, 3] = float("inf"), float("inf"), -0.0
    x = m.t()  # 6 rows of 33, elements 6 apart
    assert sm.prepare_softmax(x, -1).columns == (1, 6, 0)
    # The first config (the cold pick's) takes half the default columns a program.
    first, default = get_op("softmax").backend("strided").configs(sm.prepare_softmax(x, -1))[:2]
    assert 2 * first["inner_block"] == default["inner_block"], (first, default)
    for log in (False, True):
        assert_matches(ops.softmax(x, -1, backend="strided") if not log else
                       ops.log_softmax(x, -1, backend="strided"), x, -1, log, backend="strided")
        # the same rows with the dim split over programs (4 chunks of up to 10): a row of -inf
        # in every chunk, a NaN and two +inf in the first chunks of theirs, merged across chunks
        split = {"inner_block": 4, "tile": 32, "warp_scale": 1, "splits": 4}
        assert_matches(run_config(x, -1, log, "strided", split), x, -1, log, backend="split")
        xh = x.half()
        assert_matches(fn(log)(xh, -1, dtype=torch.float32, backend="strided"), xh, -1, log,
                       dtype=torch.float32, backend="strided")
        xg = (torch.randn(4, 30, 7) * 2).transpose(1, 2)
        got, ref = grads(xg, -1, log, "strided", torch.randn(4, 7, 30))
        assert_grad(got, ref, torch.float32, "strided columns")


def _h200_configs(x, dim):
    call = sm.prepare_softmax(x, dim)
    call.info = known_gpu("H200")
    return get_op("softmax").backend("strided").configs(call)


def test_strided_split_first_for_few_long_columns():
    """A dim that takes two passes over fewer column blocks than SMs is split over programs
    first (chunks of about SPLIT_ROWS rows, at least two programs an SM); the unsplit configs
    stay for tuning. Calls with blocks enough, or a dim held whole in registers, get no split."""
    from opselect.heuristics.softmax import SPLIT_ROWS, SPLIT_ROWS_MIN, SPLITS_MAX

    few_long = _h200_configs(torch.empty(32000, 64, dtype=torch.bfloat16, device="meta").t(),
                             -1)  # 4 blocks of 16 columns
    assert few_long[0] == {"inner_block": 16, "tile": 16384, "warp_scale": 1, "splits": 66}
    assert any("splits" not in c for c in few_long)
    assert all(2 <= c.get("splits", 2) <= min(SPLITS_MAX, -(-32000 // SPLIT_ROWS_MIN))
               for c in few_long)
    # dim=0 of a tall matrix is the same reduction: 1 block of 8 float32 columns, 34312 rows.
    tall = _h200_configs(torch.empty(34312, 8, device="meta"), 0)
    assert tall[0]["splits"] == min(SPLITS_MAX, max(-(-34312 // SPLIT_ROWS), 2 * 132))
    # Many rows of the dim per block and splits to spare: segments of 64 bytes, not 32.
    wide = _h200_configs(torch.empty(17555, 730, dtype=torch.bfloat16, device="meta"), 0)
    assert wide[0]["inner_block"] == 32 and wide[0]["splits"] == -(-17555 // SPLIT_ROWS)
    many = _h200_configs(torch.empty(4096, 4096, device="meta").t(), -1)
    assert not any("splits" in c for c in many)
    # A short walk unsplit (8 tiles of 2048 x 2 columns): a second launch would cost more.
    short = _h200_configs(torch.empty(6517, 3, dtype=torch.bfloat16, device="meta").t(), -1)
    assert not any("splits" in c for c in short)
    assert not any("splits" in c for c in _h200_configs(torch.empty(64, 1000, 3, device="meta"), 1))


def test_strided_split_where_the_walk_sets_the_time():
    """Column blocks as many as SMs or more are split only where their walks, not the memory,
    set the time (all blocks together move less in a step than the memory could), into fewer
    chunks than SPLIT_ROWS gives: at most SPLIT_PROGRAMS_PER_SM programs an SM in all."""
    from opselect.heuristics.softmax import SPLIT_PROGRAMS_PER_SM

    def first(shape, dim, dtype):
        return _h200_configs(torch.empty(shape, dtype=dtype, device="meta"), dim)[0]
    # 239 blocks of 4 bfloat16 columns, each walking 63263 rows (measured: split 124 us against
    # 143 unsplit); 133 blocks of 8.
    walk_bound = first((239, 63263, 4), 1, torch.bfloat16)
    assert walk_bound["splits"] == -(-SPLIT_PROGRAMS_PER_SM * 132 // 239) == 9
    assert first((133, 40000, 8), 1, torch.bfloat16)["splits"] == 16
    # As many blocks of float32 (twice the bytes a step) or more blocks: the memory sets the
    # time, and the split lost 1.1-1.3x (512 x 8192 x 8, 400 x 16384 x 4, 8192 x 8192 over 0).
    for shape, dim, dtype in (((512, 8192, 8), 1, torch.float32),
                              ((400, 16384, 4), 1, torch.float32),
                              ((8192, 8192), 0, torch.bfloat16),
                              ((239 * 2, 63263, 4), 1, torch.bfloat16)):
        assert "splits" not in first(shape, dim, dtype), shape
    # Few blocks: chunks of SPLIT_ROWS, up to the programs' cap (42 blocks of 16 columns).
    capped = first((3, 99727, 224), 1, torch.float32)
    assert capped["splits"] == -(-SPLIT_PROGRAMS_PER_SM * 132 // 42) < -(-99727 // 1024)


def test_strided_columns_first_block():
    """Columns written as rows take half the default columns a program first where the dim takes
    two passes or blocks are fewer than SMs; not where the dim fits in registers and blocks are
    plenty (a batch of transposed 1024 x 1024)."""
    two_pass = _h200_configs(torch.empty(4096, 4096, dtype=torch.bfloat16, device="meta").t(), -1)
    assert two_pass[0]["inner_block"] == two_pass[1]["inner_block"] // 2
    batched = _h200_configs(
        torch.empty(32, 1024, 1024, dtype=torch.float16, device="meta").transpose(-1, -2), -1)
    assert batched[0]["inner_block"] == 16 and batched[0]["warp_scale"] == 1
    few = _h200_configs(torch.empty(831, 512, dtype=torch.bfloat16, device="meta").t(), -1)
    assert few[0]["inner_block"] == 8


def test_strided_split_estimate():
    """The model charges a split call its second launch and its merge, and a long unsplit walk
    its steps: for few long columns the split's estimate is far below the unsplit first
    config's."""
    from opselect.heuristics import softmax as cost
    from opselect.kernels.softmax.strided import StridedBackend
    op = get_op("softmax")
    call = op.prepare(torch.empty(32000, 64, dtype=torch.bfloat16, device="meta"), 0)
    decision = op.what_if(call, known_gpu("H200"))
    assert decision.choice == "strided" and "splits" in decision.config
    est = next(c for c in decision.candidates if c.name == "strided")
    assert est.parts["split_merge"] == cost.STRIDED_SPLIT_FIXED_S
    call.info = known_gpu("H200")
    assert StridedBackend._splits(call, 132)[0] == 66
    # The same reduction unsplit (8 columns a program, tiles of 512 rows): its walk is long.
    from opselect.dispatch.op import _device_models
    model = _device_models["defaults_for"](known_gpu("H200"))
    unsplit = cost.strided(call, model, block_i=8, single=False, view=(1, 64, 1),
                           steps=2 * 32000 // 512, warps=8, block_n=512)
    assert unsplit.parts["walk"] > 4 * est.predicted_s


def test_multirow_configs(cpu_triton):
    torch.manual_seed(5)
    x = torch.randn(37, 12)
    for cfg in ({"rows_per_tile": 8, "num_warps": 4, "pipeline_stages": 2},
                {"rows_per_tile": 1024, "num_warps": 8, "pipeline_stages": 1}):
        assert_matches(run_config(x, -1, False, "multirow", cfg), x, -1, False, backend="multirow")


#: Configs as tune records written before issue 34 stored them (the kernels' old constexpr names).
OLD_CONFIGS = {
    "fused": ((4, 300), {"num_warps": 4, "NUM_STAGES": 2}),
    "multirow": ((4, 300 // 3), {"BLOCK_R": 8, "num_warps": 4, "NUM_STAGES": 2}),
    "online": ((2, 1500), {"BLOCK_N": 256, "num_warps": 4, "SPLIT": 1}),
    "strided": ((3, 5, 7), {"BLOCK_I": 4, "TILE": 64, "WARP_SCALE": 1}),
}


def test_configs_under_old_names_are_measured_again_never_misread(cpu_triton, monkeypatch):
    """A tune record under the old config keys (BLOCK_R, NUM_STAGES, SPLIT, BLOCK_I, TILE...),
    even filed under today's source hash, holds a config the backend does not offer: it is
    ignored with a warning, the model decides until tuning measures again, and no kernel runs
    with it; run and bind refuse the old keys outright (InvalidArgument), as they refuse a
    config missing a key, instead of reading defaults in their place."""
    from opselect.dispatch import op as dispatch_op
    from opselect.errors import CacheWarning
    from opselect.tune_cache import store

    monkeypatch.setattr(dispatch_op, "_foreign_configs_told", set())
    torch.manual_seed(34)
    old_coop = {"COOP_CHUNK": 256, "num_warps": 4}
    for name, (shape, old) in OLD_CONFIGS.items():
        x = torch.randn(shape)
        dim = 1 if name == "strided" else -1
        call = sm.OP.prepare(x, dim)
        backend = sm.OP.backend(name)
        assert backend.supports(call) is None
        store().put_timings("softmax", call.info, call.key[1:],
                            {name: (1e-9, old, backend.source_hash)})
        with pytest.warns(CacheWarning, match="that the backend does not offer") as told:
            decision = sm.OP.decide(call)
        assert any(f"config of softmax/{name} " in str(w.message) for w in told), name
        assert decision.candidate(name).measured_s is None, name
        assert decision.source == "model"
        assert decision.config in [dict(c) for c in sm.OP.backend(decision.choice).configs(call)]
        today = backend.configs(call)[0]
        refused = [(old, "are not this backend's"),
                   (dict(list(today.items())[1:]), "are missing")]
        if name == "online":
            refused.append((old_coop, "are not this backend's"))
        for config, why in refused:
            with pytest.raises(InvalidArgument, match=why):
                backend.run(call, config)
            with pytest.raises(InvalidArgument, match=why):
                backend.bind(call, config)
        # Today's names run.
        assert_matches(backend.run(call, today), x, dim, False, backend=name)


def test_many_tiles_per_program(cpu_triton, monkeypatch):
    """The persistent-style loop: each program takes several tiles, the last one partly empty."""
    patch_everywhere(monkeypatch, "WAVES", 1)
    patch_everywhere(monkeypatch, "_resident", lambda *a: 2)
    grids = spy(monkeypatch, "_rows_fwd_kernel")
    torch.manual_seed(6)
    x = torch.randn(23, 9)
    for log in (False, True):
        assert_matches(fn(log)(x, backend="fused"), x, -1, log, backend="fused")
        assert_matches(run_config(x, -1, log, "multirow", {"rows_per_tile": 2, "num_warps": 4,
                                                           "pipeline_stages": 2}),
                       x, -1, log, backend="multirow")
    # fused: 23 one-row tiles over 2 programs' worth; multirow: 12 two-row tiles
    assert grids["_rows_fwd_kernel"] == [(3,), (2,)] * 2


# ---------------------------------------------------------------------------------------------
# Layouts: any dim, any rank, non-contiguous inputs
# ---------------------------------------------------------------------------------------------
def layouts():
    torch.manual_seed(7)
    base = torch.randn(4, 6, 10)
    return {
        "transposed": (base.transpose(0, 2), -1),          # the dim has stride 24: copied
        "row-slice": (base[:, :, 1:8], -1),                 # rows with a gap: read in place
        "every-other-row": (base[:, ::2], -1),              # rows with a gap of one row
        "strided-outer": (base[::2, :5], -1),                # outer dims that do not collapse
        "broadcast": (torch.randn(1, 10).expand(5, 10), 1),  # row stride 0
        "permuted-mid": (base.permute(1, 0, 2), 1),          # strided over dim 1
        "inner-slice": (base[:, :, :7], 1),                  # strided, inner rows with a gap
        "channels-last": (torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last), 1),
        "columns": (torch.randn(10, 24).t(), -1),            # rows of a transposed matrix
        "batched-columns": (base.transpose(1, 2), -1),       # ... of each of 4 matrices
        "columns-sliced": (torch.randn(12, 40)[:, 3:30].t(), -1),  # ... of a slice
    }


@pytest.mark.parametrize("name", list(layouts()))
def test_non_contiguous(cpu_triton, name):
    x, dim = layouts()[name]
    call = sm.prepare_softmax(x, dim)
    able = [b for b in TRITON if get_op("softmax").backend(b).supports(call) is None]
    assert able
    for backend in able:
        for log in (False, True):
            assert_matches(fn(log)(x, dim, backend=backend), x, dim, log, backend=backend)


def test_layout_analysis():
    """Which inputs the kernels read in place (no copy): the fast flag of the call."""
    base = torch.randn(4, 6, 10)
    assert sm.prepare_softmax(base, -1).fast
    assert sm.prepare_softmax(base[:, :, 1:8], -1).fast
    assert sm.prepare_softmax(base[:, ::2], -1).fast
    assert not sm.prepare_softmax(base[::2, :5], -1).fast  # outer dims do not collapse
    assert sm.prepare_softmax(base.permute(1, 0, 2), 1).fast
    assert sm.prepare_softmax(base[:, :, :7], 1).fast
    assert not sm.prepare_softmax(base.transpose(0, 2), -1).fast
    assert not sm.prepare_softmax(base.transpose(0, 1), -1).fast  # outer dims do not collapse
    assert not sm.prepare_softmax(base.transpose(1, 2), 0).fast   # inner dims do not collapse
    assert not sm.prepare_softmax(base, -1, dtype=torch.float16).fast  # narrowing cast first
    assert sm.prepare_softmax(base.half(), -1, dtype=torch.float32).fast  # widening: fused
    c = sm.prepare_softmax(base, 1)
    assert (c.outer, c.n, c.inner) == (4, 6, 10)
    # Rows whose elements lie apart, read in place by strided as columns: (outer, inner, outer
    # stride) with the dims before the softmax dim as inner; a key of their own.
    assert sm.prepare_softmax(torch.randn(10, 24).t(), -1).columns == (1, 24, 0)
    c = sm.prepare_softmax(base.transpose(1, 2), -1)
    assert (c.columns, c.sn, c.key[6]) == ((4, 10, 60), 10, "columns")
    assert sm.prepare_softmax(torch.randn(12, 40)[:, 3:30].t(), -1).columns == (1, 27, 0)
    assert sm.prepare_softmax(base.transpose(0, 2), -1).columns is None  # inner dims reversed
    assert sm.prepare_softmax(base.transpose(1, 2), -1, dtype=torch.float16).columns is None
    assert sm.prepare_softmax(base, -1).columns is None
    assert sm.prepare_softmax(torch.randn(5, 1).t(), -1).columns is None  # rows of one


@settings(max_examples=25, deadline=None)
@given(shape=st.lists(st.integers(0, 9), min_size=1, max_size=4),
       dim_seed=st.integers(0, 100), log=st.booleans(), transpose=st.booleans(),
       data=st.data())
@pytest.mark.slow
def test_property_any_shape(shape, dim_seed, log, transpose, data):
    from opselect.dispatch.device import INTERPRETED

    if not INTERPRETED:  # (the cpu_triton fixture cannot be used with @given)
        pytest.skip("Triton interpreter tests (run without a GPU, TRITON_INTERPRET=1)")
    x = torch.randn(shape) * 4
    if transpose and x.dim() >= 2:
        x = x.transpose(0, -1)
    dim = dim_seed % x.dim() - (x.dim() if dim_seed % 2 else 0)
    call = sm.prepare_softmax(x, dim)
    able = [b for b in TRITON if get_op("softmax").backend(b).supports(call) is None]
    backend = data.draw(st.sampled_from(able or ["torch"]))
    assert_matches(fn(log)(x, dim, backend=backend), x, dim, log, backend=backend)


# ---------------------------------------------------------------------------------------------
# Edge values, casts, empty and 0-d inputs
# ---------------------------------------------------------------------------------------------
def edge_rows(dtype):
    big = torch.finfo(dtype).max
    tiny = torch.finfo(dtype).tiny
    inf, nan = float("inf"), float("nan")
    rows = [
        [-inf] * 8,                                   # all -inf: NaN, as torch
        [-inf, 0, -inf, 1, -inf, -inf, 2, -inf],      # some -inf: exact zeros there
        [inf, 0, 1, 2, 3, 4, 5, 6],                   # +inf: NaN row
        [nan, 0, 1, 2, 3, 4, 5, 6],                   # NaN: NaN row
        [big, big, -big, 0, big / 2, -big, 1, big],   # huge values: no overflow of x - max
        [tiny, -tiny, tiny * 2, 0, tiny, tiny, 0, 0],  # tiny values: uniform
        [0, -100, -200, -1000, 0, 5, -1e4, 3],        # exp underflows to 0, log stays finite
        [1, 1, 1, 1, 1, 1, 1, 1],
    ]
    return torch.tensor(rows, dtype=torch.float64).to(dtype)  # every value is exact in dtype


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: str(d)[6:])
def test_edge_values(cpu_triton, dtype):
    x = edge_rows(dtype)
    assert x.isnan().any() and x.isinf().any()
    for log in (False, True):
        for backend in ("fused", "multirow"):
            assert_matches(fn(log)(x, -1, backend=backend), x, -1, log, backend=backend)
        # the same rows as columns: strided
        xt = x.t().contiguous()
        assert_matches(fn(log)(xt, 0, backend="strided"), xt, 0, log, backend="strided")
        # and long rows through online (pad each row with -inf to 1100 elements)
        pad = torch.full((8, 1092), float("-inf"), dtype=dtype)
        xl = torch.cat([x, pad], 1)
        got = run_config(xl, -1, log, "online", {"block": 128, "num_warps": 4, "split": 2})
        assert_matches(got, xl, -1, log, backend="online")


def test_exact_zero_and_nan_positions(cpu_triton):
    x = torch.tensor([[float("-inf"), 0.0, float("-inf"), 0.0], [float("-inf")] * 4])
    for backend in ("fused", "multirow"):
        y = ops.softmax(x, backend=backend)
        assert torch.equal(y[0], torch.tensor([0.0, 0.5, 0.0, 0.5]))
        assert y[1].isnan().all()
        ly = ops.log_softmax(x, backend=backend)
        assert ly[0, 0] == float("-inf") and ly[1].isnan().all()


@pytest.mark.parametrize("src,dst", [
    (torch.float16, torch.float32), (torch.bfloat16, torch.float32), (torch.float32, torch.float64),
    (torch.float32, torch.float16), (torch.float64, torch.bfloat16),
    (torch.float16, torch.bfloat16),
    (torch.int64, torch.float32), (torch.bool, torch.float32), (torch.float32, torch.float32),
], ids=lambda d: str(d)[6:])
def test_dtype_argument(cpu_triton, src, dst):
    torch.manual_seed(8)
    x = (torch.randn(5, 33) * 8).to(src)
    x3 = (torch.randn(3, 4, 6) * 8).to(src)
    for log in (False, True):
        for backend in ("fused", "multirow"):
            got = fn(log)(x, -1, dtype=dst, backend=backend)
            assert_matches(got, x, -1, log, dtype=dst, backend=backend)
        got = fn(log)(x3, 1, dtype=dst, backend="strided")
        assert_matches(got, x3, 1, log, dtype=dst, backend="strided")


@pytest.mark.parametrize("shape,dim", [((0, 5), 0), ((0, 5), 1), ((5, 0), 1), ((5, 0), 0),
                                       ((3, 0, 4), 1), ((3, 0, 4), 2), ((0,), 0)])
def test_empty(cpu_triton, shape, dim):
    x = torch.randn(shape)
    call = sm.prepare_softmax(x, dim)
    able = [b for b in TRITON if get_op("softmax").backend(b).supports(call) is None]
    for backend in ["torch", *able]:
        for log in (False, True):
            y = fn(log)(x, dim, backend=backend)
            assert y.shape == x.shape and y.dtype == x.dtype
            xg = x.clone().requires_grad_()
            y = fn(log)(xg, dim, backend=backend)
            y.sum().backward()
            assert xg.grad.shape == x.shape


def test_zero_dim(cpu_triton):
    for v in (3.0, float("-inf"), float("nan")):
        x = torch.tensor(v)
        for dim in (0, -1):
            for backend in ("fused", "multirow"):
                for log in (False, True):
                    assert_matches(fn(log)(x, dim, backend=backend), x, dim, log, backend=backend)
    xg = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
    ops.softmax(xg, 0, backend="fused").backward()
    assert xg.grad.item() == 0.0


# ---------------------------------------------------------------------------------------------
# Backward
# ---------------------------------------------------------------------------------------------
def grads(x, dim, log, backend, upstream, dtype=None):
    """(ours, torch's) gradient of sum(out * upstream) w.r.t. x; torch's in float64."""
    xa = x.detach().clone().requires_grad_()
    out = fn(log)(xa, dim, dtype=dtype, backend=backend)
    assert out.requires_grad
    out.backward(upstream.to(out.dtype))
    xr = x.detach().double().requires_grad_()
    src = xr.to(dtype).double() if dtype is not None else xr
    (torch.log_softmax if log else torch.softmax)(src, dim).backward(upstream.double())
    return xa.grad, xr.grad


def assert_grad(got, ref, dtype, what):
    assert got.dtype == dtype, what
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(got.double(), ref, atol=atol * 10, rtol=rtol * 4, equal_nan=True,
                               msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("backend", TRITON)
def test_backward(cpu_triton, backend, log):
    torch.manual_seed(9)
    for shape, dim in CASES[backend][:3]:
        for dtype in (torch.float32, torch.bfloat16):
            x = (torch.randn(shape) * 2).to(dtype)
            g = torch.randn(shape)
            got, ref = grads(x, dim, log, backend, g)
            assert_grad(got, ref, dtype, f"{backend} {shape} dim {dim} {dtype}")


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.slow
def test_backward_paths(cpu_triton, monkeypatch, log):
    """The backward's own paths at small sizes: rows in two passes, split rows, strided chunks,
    a non-contiguous upstream gradient, and a widening dtype= (dx in the input's dtype)."""
    patch_everywhere(monkeypatch, "BWD_SINGLE_MAX", 64)
    patch_everywhere(monkeypatch, "BWD_SINGLE_MAX_F64", 64)
    from opselect.heuristics import softmax as cost
    grids = spy(monkeypatch, "_rows_bwd_kernel", "_split_bwd_sum_kernel",
                "_split_bwd_apply_kernel", "_strided_bwd_kernel", "_strided_split_bwd_kernel")
    torch.manual_seed(10)
    # rows longer than BWD_SINGLE_MAX, more rows than SMs: the rows kernel, two passes
    set_sm_count(monkeypatch, 2)
    x = torch.randn(3, 300)
    got, ref = grads(x, -1, log, "fused", torch.randn(x.shape))
    assert_grad(got, ref, torch.float32, "rows two-pass")
    assert len(grids["_rows_bwd_kernel"]) == 1 and not grids["_split_bwd_sum_kernel"]
    # one long row on a device with many SMs: split over programs
    set_sm_count(monkeypatch, 8)
    x = torch.randn(1, 5000, dtype=torch.float64)
    got, ref = grads(x, -1, log, "online", torch.randn(x.shape))
    assert_grad(got, ref, torch.float64, "split rows")
    assert len(grids["_split_bwd_sum_kernel"]) == len(grids["_split_bwd_apply_kernel"]) == 1
    assert grids["_split_bwd_sum_kernel"][0][0] > 1
    # strided with the dim in chunks (a walk too short to split)
    patch_everywhere(monkeypatch, "TILE_MAX", 64)
    monkeypatch.setattr(cost, "SPLIT_MIN_TILES", 10 ** 6)
    x = torch.randn(2, 50, 6)
    got, ref = grads(x, 1, log, "strided", torch.randn(x.shape))
    assert_grad(got, ref, torch.float32, "strided chunks")
    assert len(grids["_strided_bwd_kernel"]) == 1 and not grids["_strided_split_bwd_kernel"]
    assert not sm._strided_plan(50, 6, 2, 4, 8, tile=32)[2]
    # few long columns: the dim split over programs too (partial sums per chunk, then dx), a
    # short last chunk; bfloat16 columns with dy transposed in memory
    monkeypatch.setattr(cost, "SPLIT_MIN_TILES", 2)
    monkeypatch.setattr(cost, "SPLIT_ROWS", 8)
    monkeypatch.setattr(cost, "SPLIT_ROWS_MIN", 4)
    # (shapes of their own: the backward is kept per shape and dy's strides)
    for x, g, what in ((torch.randn(2, 26, 6), torch.randn(2, 26, 6), "strided split"),
                       (torch.randn(1, 27, 5).bfloat16(), torch.randn(5, 27, 1).permute(2, 1, 0),
                        "strided split, bfloat16, transposed upstream")):
        before = len(grids["_strided_split_bwd_kernel"])
        got, ref = grads(x, 1, log, "strided", g)
        assert_grad(got, ref, x.dtype, what)
        launches = grids["_strided_split_bwd_kernel"][before:]
        assert len(launches) == 2 and launches[0] == launches[1], what  # two phases, one grid
    assert len(grids["_strided_bwd_kernel"]) == 1
    # upstream gradient with stride 0 (from expand) and transposed
    x = torch.randn(4, 9)
    got, ref = grads(x, -1, log, "multirow", torch.randn(1, 9).expand(4, 9))
    assert_grad(got, ref, torch.float32, "expanded upstream")
    got, ref = grads(x, -1, log, "fused", torch.randn(9, 4).t())
    assert_grad(got, ref, torch.float32, "transposed upstream")
    # dtype=float32 of a float16 input: the grad comes back in float16
    x = torch.randn(4, 9).half()
    got, ref = grads(x, -1, log, "fused", torch.randn(4, 9), dtype=torch.float32)
    assert_grad(got, ref, torch.float16, "widening dtype")
    # a narrowing dtype= goes through torch's cast, whose backward widens again
    x = torch.randn(4, 9)
    got, ref = grads(x, -1, log, "fused", torch.randn(4, 9), dtype=torch.float16)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), ref, atol=2e-2, rtol=2e-2)


@pytest.mark.slow
def test_gradcheck(cpu_triton):
    torch.manual_seed(11)
    for backend, shape, dim in (("fused", (2, 5), -1), ("strided", (2, 3, 2), 1)):
        for log in (False, True):
            x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
            assert torch.autograd.gradcheck(lambda t: fn(log)(t, dim, backend=backend), (x,))


@pytest.mark.slow
def test_double_backward(cpu_triton):
    """create_graph=True: the backward is built from differentiable ops."""
    torch.manual_seed(12)
    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    for log in (False, True):
        assert torch.autograd.gradgradcheck(lambda t: fn(log)(t, -1, backend="multirow"), (x,))


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_grad_calls_take_a_route_with_its_backwards(cpu_triton, log):
    """A call under autograd is prepared once (a route) like any other: later calls of its
    layout run the same forward inside the autograd.Function, and each upstream layout's
    backward is planned once in the route's memo. Every gradient still matches torch's, the
    memo's second layout (a transposed upstream) and a forward under no_grad included."""
    from opselect.kernels.softmax.autograd import BackwardMemo

    torch.manual_seed(13)
    op = sm.LOG_SOFTMAX_OP if log else sm.SOFTMAX_OP
    x = torch.randn(6, 40)
    contiguous_up, transposed_up = torch.randn(6, 40), torch.randn(40, 6).t()
    for upstream in (contiguous_up, contiguous_up, transposed_up, transposed_up):
        got, ref = grads(x, -1, log, "fused", upstream)
        assert_grad(got, ref, torch.float32, "through the route")
    routes = [r for key, r in op.forced_routes.items() if key[0] == "fused"]
    assert len(routes) == 1 and callable(routes[0]), "a grad call is bound as a route"
    # the route's memo holds the two upstream layouts' prepared backwards
    memo = routes[0].backwards
    assert isinstance(memo, BackwardMemo)
    assert sorted(memo) == sorted({(contiguous_up.stride(), torch.float32),
                                   (transposed_up.stride(), torch.float32)})
    with torch.no_grad():  # another key: the plain forward, no graph
        y = fn(log)(x.clone().requires_grad_(), -1, backend="fused")
    assert y.grad_fn is None
    assert_matches(y, x, -1, log, backend="fused")


def test_no_graph_without_grad(cpu_triton):
    x = torch.randn(3, 5, requires_grad=True)
    with torch.no_grad():
        y = ops.softmax(x, backend="fused")
    assert not y.requires_grad
    y = ops.softmax(x.detach(), backend="fused")
    assert y.grad_fn is None


# ---------------------------------------------------------------------------------------------
# Argument rules and selection
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_errors(log):
    f = fn(log)
    x = torch.randn(3, 4)
    with pytest.raises(IndexError, match="dim 2 is out of range"):
        f(x, 2)
    with pytest.raises(IndexError, match=r"\[-2, 1\]"):
        f(x, -3)
    with pytest.raises(IndexError):
        f(torch.tensor(1.0), 1)
    with pytest.raises(TypeError, match="dim must be an int"):
        f(x, 0.5)
    with pytest.raises(TypeError, match="dim must be an int"):
        f(x, None)
    with pytest.raises(TypeError, match="input must be a tensor"):
        f([1.0, 2.0], 0)
    with pytest.raises(TypeError, match="dtype must be a torch.dtype"):
        f(x, 0, dtype="float32")
    # Dtypes the kernels do not take go to torch, which raises its own error (or answers).
    for args, kwargs in (((torch.arange(4), 0), {}), ((x, 0), {"dtype": torch.int32}),
                         ((torch.randn(3, dtype=torch.complex64), 0), {})):
        with pytest.raises(Exception) as theirs:
            getattr(torch, "log_softmax" if log else "softmax")(*args, **kwargs)
        with pytest.raises(type(theirs.value)):
            f(*args, **kwargs)
    with pytest.raises(ArgumentTypeError):  # torch raises TypeError
        f("x", 0)


def test_backend_errors(cpu_triton):
    x = torch.randn(3, 4, 5)
    with pytest.raises(BackendError, match="unknown backend 'nope'"):
        ops.softmax(x, backend="nope")
    with pytest.raises(BackendError,
                       match="fused.*not the innermost.*Backends that can: torch, strided"):
        ops.softmax(x, 1, backend="fused")
    with pytest.raises(BackendError, match="strided.*is the innermost"):
        ops.log_softmax(x, -1, backend="strided")
    with pytest.raises(BackendError, match="multirow.*at most 256"):
        ops.softmax(torch.randn(2, 300), backend="multirow")
    with pytest.raises(BackendError, match="online is for rows longer"):
        ops.softmax(torch.randn(2, 300), backend="online")
    with pytest.raises(BackendError, match="fused takes at most 32768"):
        ops.softmax(torch.empty(1, 40000), backend="fused")


def test_cpu_without_interpreter_uses_torch(monkeypatch):
    """A CPU tensor without the interpreter: only torch can run it, and auto picks it."""
    info = sm.call.device_info(torch.device("cpu"))
    monkeypatch.setattr(type(info), "runs_triton", property(lambda self: False))
    x = torch.randn(4, 8)
    d = opselect.explain("softmax", x, show=False)
    assert d.choice == "torch"
    torch.testing.assert_close(ops.softmax(x), torch.softmax(x, -1))
    with pytest.raises(BackendError, match="Triton kernels need a CUDA tensor"):
        ops.softmax(x, backend="fused")


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_auto_and_tuning(cpu_triton, log):
    torch.manual_seed(13)
    x = torch.randn(6, 20)
    name = "log_softmax" if log else "softmax"
    d = opselect.explain(name, x, show=False)
    assert d.candidate(d.choice).supported
    assert {c.name for c in d.candidates if c.supported} == {"torch", "fused", "multirow"}
    assert_matches(fn(log)(x), x, -1, log, backend="auto")
    with opselect.tuning():
        y = fn(log)(x)
    assert_matches(y, x, -1, log, backend="auto-tuned")
    tuned = opselect.explain(name, x, show=False)
    assert all(c.measured_s is not None for c in tuned.candidates if c.supported)
    # The fastest measured backend, unless torch is within the dispatcher's margin of it.
    fastest = min((c for c in tuned.candidates if c.supported), key=lambda c: c.measured_s)
    torch_s = tuned.candidate("torch").measured_s
    expected = "torch" if fastest.measured_s > MEASURED_TORCH_MARGIN * torch_s else fastest.name
    assert tuned.choice == expected


def test_sample():
    for opts, expect_dim in (({}, -1), ({"dim": 1}, 1), ({"dim": 0, "out_dtype": "float32"}, 0)):
        args, kwargs = sm.sample([[4, 5, 6]], torch.float16, dict(opts), torch.device("cpu"))
        assert args[0].shape == (4, 5, 6) and args[0].dtype == torch.float16
        assert kwargs["dim"] == expect_dim
        y = ops.softmax(*args, backend="torch", **kwargs)
        assert y.dtype == (torch.float32 if "out_dtype" in opts else torch.float16)
    with pytest.raises(InvalidArgument, match="unknown options"):
        sm.sample([[4]], torch.float32, {"k": 3}, torch.device("cpu"))
    with pytest.raises(InvalidArgument, match="one shape"):
        sm.sample([[4], [5]], torch.float32, {}, torch.device("cpu"))
    # transposed: the same logical shape, the last two dims swapped in memory (read as columns)
    (x,), _ = sm.sample([[3, 4, 5]], torch.float32, {"transposed": True}, torch.device("cpu"))
    assert x.shape == (3, 4, 5) and x.stride() == (20, 1, 4)
    assert sm.prepare_softmax(x, -1).columns == (3, 4, 20)
    for bad in ({"transposed": "yes"}, {"transposed": 1.5}):
        with pytest.raises(InvalidArgument, match="transposed must be true or false"):
            sm.sample([[3, 4]], torch.float32, bad, torch.device("cpu"))
    with pytest.raises(InvalidArgument, match="two dims or more"):
        sm.sample([[4]], torch.float32, {"transposed": True}, torch.device("cpu"))


def test_cost_model_prefers_sensible_backends():
    """The cold choice on an H200 (default constants) for the issue's typical cases."""
    from opselect.dispatch.device import DeviceInfo
    from opselect.heuristics.device_model import defaults_for

    info = DeviceInfo("cuda", 0, "NVIDIA H200", (9, 0), 132, 60 << 20, 0)
    model = defaults_for(info)
    op = get_op("softmax")

    def costs(shape, dim=-1, dtype=torch.float32):
        call = sm.prepare_softmax(torch.empty(shape, dtype=dtype, device="meta"), dim)
        call.info = info
        return {b.name: b.cost(call, model).seconds for b in op.backends
                if b.supports(call) is None}

    c = costs((1048576, 64))
    assert c["multirow"] < c["fused"] and c["multirow"] < c["torch"]
    c = costs((4096, 16384))
    assert c["fused"] < c["torch"] and c["fused"] < c["online"]  # torch reads 16K fp32 rows 3x
    c = costs((32, 1048576))
    assert set(c) == {"torch", "online"} and c["online"] < c["torch"]
    c = costs((64, 512, 512), dim=1, dtype=torch.float16)
    assert set(c) == {"torch", "strided"}
    assert all(v > 0 and math.isfinite(v) for v in c.values())


# ---------------------------------------------------------------------------------------------
# GPU: real sizes
# ---------------------------------------------------------------------------------------------
GPU_CASES = [
    ("fused", (4096, 1000), -1), ("fused", (2048, 4096), -1), ("fused", (512, 32768), -1),
    ("multirow", (65536, 64), -1), ("multirow", (10000, 7), -1), ("multirow", (4096, 256), -1),
    ("online", (64, 131072), -1), ("online", (4, 1 << 20), -1), ("online", (300, 50257), -1),
    ("strided", (64, 512, 512), 1), ("strided", (512, 64, 512), 0), ("strided", (8, 4096, 48), 1),
    # rows off the 16-byte grid (the shifted vector access)
    ("multirow", (4000, 37), -1), ("multirow", (3000, 201), -1), ("online", (96, 100003), -1),
]


@pytest.mark.gpu
@pytest.mark.parametrize("backend,shape,dim", GPU_CASES)
@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: str(d)[6:])
def test_gpu_forward(cuda, backend, shape, dim, dtype):
    if not supported(backend, shape, dim, dtype):
        pytest.skip(f"{backend} does not take {shape} {dtype}")
    torch.manual_seed(20)
    x = (torch.randn(shape, device=cuda) * 4).to(dtype)
    for log in (False, True):
        assert_matches(fn(log)(x, dim, backend=backend), x, dim, log, backend=backend)
    if dtype in (torch.float16, torch.bfloat16):
        assert_matches(ops.softmax(x, dim, dtype=torch.float32, backend=backend), x, dim, False,
                       dtype=torch.float32, backend=backend)


@pytest.mark.gpu
@pytest.mark.parametrize("backend,shape,dim", GPU_CASES)
def test_gpu_backward(cuda, backend, shape, dim):
    torch.manual_seed(21)
    for dtype in (torch.float32, torch.bfloat16):
        x = (torch.randn(shape, device=cuda) * 2).to(dtype)
        for log in (False, True):
            got, ref = grads(x, dim, log, backend, torch.randn(shape, device=cuda))
            assert_grad(got, ref, dtype, f"{backend} {shape} {dtype}")


@pytest.mark.gpu
def test_gpu_bound_launches(cuda, monkeypatch):
    """Every kernel's launches with verify on (Triton binds each call and must pick the very
    kernel the spec names: a spec that misses an argument Triton specializes on fails here),
    then the bound fast path on fresh data of the same calls: forward in every config,
    backward, both dtypes, and inputs that start off 16 bytes."""
    from opselect.kernels._common import Launcher

    seed = 30
    for backend, shape, dim in GPU_CASES[::2] + [("online", (4, 1 << 20), -1)]:
        for dtype, offset in ((torch.float32, 0), (torch.bfloat16, 1)):
            if not supported(backend, shape, dim, dtype):
                continue
            for verify in (True, False):
                monkeypatch.setattr(Launcher, "verify", verify)
                for _ in range(2):
                    seed += 1
                    torch.manual_seed(seed)
                    n = math.prod(shape)
                    x = (torch.randn(n + offset, device=cuda) * 2).to(dtype)[offset:].view(shape)
                    for log in (False, True):
                        op = sm.LOG_SOFTMAX_OP if log else sm.SOFTMAX_OP
                        b = op.backend(backend)
                        for cfg in b.configs(op.prepare(x, dim)):
                            assert_matches(run_config(x, dim, log, backend, cfg), x, dim, log,
                                           backend=f"{backend} {cfg}")
                        got, ref = grads(x, dim, log, backend, torch.randn(shape, device=cuda))
                        assert_grad(got, ref, dtype, f"{backend} {shape} {dtype}")


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(64, 131072), (4, 1 << 20), (300, 50257), (3, 3 << 20)])
def test_gpu_online_every_config(cuda, shape):
    """Tuning may pick any config: cooperative rows and the two-pass paths, at real sizes."""
    torch.manual_seed(23)
    backend = sm.SOFTMAX_OP.backend("online")
    for dtype in (torch.float32, torch.bfloat16):
        x = (torch.randn(shape, device=cuda) * 4).to(dtype)
        x[0, 1000:] = float("-inf")
        for log in (False, True):
            op = sm.LOG_SOFTMAX_OP if log else sm.SOFTMAX_OP
            call = op.prepare(x, -1)
            for cfg in backend.configs(call):
                assert_matches(backend.run(call, cfg), x, -1, log, backend=f"online {cfg}")


@pytest.mark.gpu
def test_gpu_cooperative_gives_up_waiting(cuda, monkeypatch):
    """With a spin limit of one poll most programs stop waiting and reread their row: slower,
    still right (the path that keeps a starved launch from hanging)."""
    patch_everywhere(monkeypatch, "COOP_SPIN_LIMIT", 1)
    x = torch.randn(64, 131072, device=cuda) * 3
    for log in (False, True):
        got = run_config(x, -1, log, "online", {"chunk": 8192, "num_warps": 8})
        assert_matches(got, x, -1, log, backend="online coop, no waiting")


@pytest.mark.gpu
def test_gpu_edges_and_layouts(cuda):
    for dtype in FLOATS:
        x = edge_rows(dtype).to(cuda).repeat(16, 200)  # 128 rows of 1600
        for log in (False, True):
            for backend in ("fused", "online"):
                assert_matches(fn(log)(x, -1, backend=backend), x, -1, log, backend=backend)
            xt = x.t().contiguous()
            assert_matches(fn(log)(xt, 0, backend="strided"), xt, 0, log, backend="strided")
    base = torch.randn(64, 96, 130, device=cuda)
    for x, dim in ((base.transpose(0, 2), -1), (base[:, :, 3:120], -1), (base[::3], -1),
                   (base.permute(1, 0, 2), 1), (base[:, :, :77], 1), (base.transpose(1, 2), -1),
                   (base[0].t(), -1), (base[:, 5:90, 7].t(), -1),
                   (torch.randn(3000, 40000, device=cuda, dtype=torch.bfloat16).t(), -1)):
        for backend in TRITON:
            call = sm.prepare_softmax(x, dim)
            if get_op("softmax").backend(backend).supports(call) is None:
                assert_matches(ops.softmax(x, dim, backend=backend), x, dim, False, backend=backend)


@pytest.mark.gpu
def test_gpu_strided_split(cuda):
    """strided's split configs (the dim over programs too) at real sizes: few long columns of a
    transposed matrix, a softmax over dim 1 of few columns, and one of as many column blocks as
    SMs or more whose walks set the time: every offered split config."""
    torch.manual_seed(23)
    for x, dim in ((torch.randn(32000, 64, device=cuda, dtype=torch.bfloat16).t(), -1),
                   (torch.randn(2, 50000, 3, device=cuda) * 8, 1),
                   (torch.randn(1, 40000, 24, device=cuda, dtype=torch.float16), 1),
                   (torch.randn(239, 20000, 4, device=cuda, dtype=torch.bfloat16), 1)):
        call = sm.prepare_softmax(x, dim)
        splits = [c for c in get_op("softmax").backend("strided").configs(call) if "splits" in c]
        assert splits, "no split config offered"
        for config in splits:
            for log in (False, True):
                assert_matches(run_config(x, dim, log, "strided", config), x, dim, log,
                               backend=f"strided {config}")


@pytest.mark.gpu
def test_gpu_strided_split_backward(cuda, monkeypatch):
    """The strided backward split over the dim at real sizes (few long columns: dim 0 of a tall
    matrix, dim 1 of few columns; 239 blocks of columns whose walks set the time), forward and
    backward against float64 torch."""
    grids = spy(monkeypatch, "_strided_split_bwd_kernel")
    torch.manual_seed(24)
    for shape, dim, dtype in (((32000, 64), 0, torch.bfloat16), ((4, 100000, 16), 1, torch.float32),
                              ((13677, 20), 0, torch.float16), ((239, 20000, 4), 1, torch.bfloat16)):
        x = (torch.randn(shape, device=cuda) * 2).to(dtype)
        for log in (False, True):
            before = len(grids["_strided_split_bwd_kernel"])
            got, ref = grads(x, dim, log, "strided", torch.randn(shape, device=cuda))
            assert_grad(got, ref, dtype, f"strided split backward {shape} {dtype}")
            assert len(grids["_strided_split_bwd_kernel"]) == before + 2


@pytest.mark.gpu
def test_gpu_auto_never_wrong(cuda):
    torch.manual_seed(22)
    for shape, dim in ((4096, 4096), -1), ((1 << 20, 64), -1), ((16, 256, 256), 0):
        x = torch.randn(shape, device=cuda, dtype=torch.bfloat16)
        assert_matches(ops.softmax(x, dim), x, dim, False, backend="auto")
        with opselect.tuning():
            assert_matches(ops.log_softmax(x, dim), x, dim, True, backend="auto-tuned")


@pytest.mark.gpu
def test_gpu_int64_offsets(cuda):
    """More than 2**31 elements: 64-bit offsets (about 8.6 GB of float16 in and out), rows,
    a strided dim, and a strided dim split over programs."""
    free, _ = torch.cuda.mem_get_info()
    if free < 12 * 2**30:
        pytest.skip("needs ~12 GB of free GPU memory")
    x = torch.randn(65537, 32768, device=cuda, dtype=torch.float16)
    y = ops.softmax(x, -1, backend="fused")
    tail = slice(-3, None)
    ref = torch.softmax(x[tail].float(), -1)
    torch.testing.assert_close(y[tail].float(), ref, atol=1e-3, rtol=2e-3)
    del y
    y = ops.softmax(x.view(65537, 64, 512), 1, backend="strided")
    ref = torch.softmax(x.view(65537, 64, 512)[tail].float(), 1)
    torch.testing.assert_close(y[tail].float(), ref, atol=1e-3, rtol=2e-3)
    del y
    # dim 0 of a tall matrix of 16 columns: strided splits the dim (128 chunks of 2**20 rows).
    # log_softmax: a softmax of 2**27 rows is below float16's smallest number everywhere.
    tall = x.view(-1, 16)
    call = sm.prepare_log_softmax(tall, 0)
    assert "splits" in get_op("log_softmax").backend("strided").configs(call)[0]
    y = ops.log_softmax(tall, 0, backend="strided")
    lse = torch.logsumexp(tall[:, ::15].double(), 0)  # columns 0 and 15, whole
    for rows in (slice(0, 3), slice(-3, None)):
        ref = tall[rows, ::15].double() - lse
        torch.testing.assert_close(y[rows, ::15].double(), ref, atol=2e-2, rtol=2e-3)


def test_prepared_calls_are_reused_only_for_the_same_layout_and_grad_mode():
    """prepare keeps the facts of a (shape, strides, dtype, device, dim, dtype=, grad) and hands
    them to the next tensor like it: that call is about the new tensor, and anything that
    changes the facts (a transposed layout, grad mode, a bad dim) is worked out afresh."""
    first, second = torch.randn(4, 6), torch.randn(4, 6)
    a, b = sm.prepare_softmax(first, 1), sm.prepare_softmax(second, 1)
    assert b.x is second and a.x is first and (a.key, a.exact) == (b.key, b.exact)
    assert torch.equal(ops.softmax(second, 1), torch.softmax(second, 1))
    transposed = torch.randn(6, 4).t()
    assert sm.prepare_softmax(transposed, 1).fast is False and b.fast is True
    assert torch.equal(ops.softmax(transposed, 1), torch.softmax(transposed, 1))
    leaf = torch.randn(4, 6, requires_grad=True)
    assert sm.prepare_softmax(leaf, 1).grad
    with torch.no_grad():
        assert not sm.prepare_softmax(leaf, 1).grad
    assert sm.prepare_log_softmax(second, 1).log and not sm.prepare_softmax(second, 1).log
    assert sm.prepare_softmax(second, 1, dtype=torch.float64).out_dtype == torch.float64
    with pytest.raises(Exception, match="out of range"):
        sm.prepare_softmax(second, 2)


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_cooperative_counters_are_zero_again_after_each_call(cpu_triton, monkeypatch, log):
    """The cooperative kernel's counters are not zeroed per call: the last program out of a row
    zeroes them. A prepared call run again on the same counters, with its workspace poisoned,
    must give the same answer (counters left over would let a program merge statistics its row's
    programs have not written yet)."""
    from opselect.kernels import _common
    monkeypatch.setattr(_common, "POISON", float("nan"))
    op = sm.LOG_SOFTMAX_OP if log else sm.SOFTMAX_OP
    x = torch.randn(3, 1100) * 4
    call = op.prepare(x, -1)
    prepared = op.backend("online").bind(call, {"chunk": 256, "num_warps": 4})
    for _ in range(3):
        x = torch.randn(3, 1100) * 4
        assert_matches(prepared(x), x, -1, log, backend="online coop, again")


@pytest.mark.gpu
def test_cooperative_softmax_on_two_streams_at_once_and_in_a_graph(cuda):
    """The cooperative kernel keeps its counters and partial sums in one set per stream (no
    memset, no allocation per call). Two streams running the same prepared call at once must
    not share a set, nor a CUDA graph's replay (on another stream) the set of eager calls on the
    stream it was captured on."""
    from opselect.kernels.softmax import SOFTMAX_OP
    torch.manual_seed(0)
    x = torch.randn(96, 50000, device=cuda)
    call = SOFTMAX_OP.prepare(x, -1)
    forward = SOFTMAX_OP.backend("online").bind(call, {"chunk": 8192, "num_warps": 8})
    xs = [torch.randn_like(x) * (j + 1) for j in range(2)]
    expected = [torch.softmax(v, -1) for v in xs]
    streams = [torch.cuda.Stream() for _ in range(2)]
    outs: list[list] = [[], []]
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())
    for _ in range(20):
        for j, s in enumerate(streams):
            with torch.cuda.stream(s):
                outs[j].append(forward(xs[j]))
    torch.cuda.synchronize()
    for j in range(2):
        for y in outs[j]:
            torch.testing.assert_close(y, expected[j])
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        forward(xs[0])  # the side stream's own set, made before the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        captured = forward(xs[0])
    eager = []
    for _ in range(10):
        graph.replay()  # on the current stream, while the side stream runs eager calls
        with torch.cuda.stream(side):
            eager.append(forward(xs[1]))
    torch.cuda.synchronize()
    torch.testing.assert_close(captured, expected[0])
    for y in eager:
        torch.testing.assert_close(y, expected[1])
