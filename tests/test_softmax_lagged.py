"""softmax's online backend in lagged mode (opselect/kernels/softmax/lagged.py): program (r, p)
publishes chunk p of row r's (max, sum) as one tagged 64-bit word and writes chunk p of row
r - lag_rows; the lagged backward does the same with a row's sum of dy * y. On the interpreter
programs run in order, so every row's words are in before they are read; the paths that wait
(and give up) are reached by slots whose tags disagree, and on the GPU by a spin limit of one
poll."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import triton
import triton.language as tl

from opselect.errors import InvalidArgument
from opselect.kernels import softmax as sm
from opselect.kernels.softmax import lagged, online
from test_softmax import assert_grad, assert_matches, grads, patch_everywhere, run_config, spy
from test_softmax import poisoned  # noqa: F401 (autouse: outputs start poisoned here too)

pytestmark = [
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
]


def special_rows(rows: int, n: int, dtype) -> torch.Tensor:
    """Random rows with whole chunks of -inf after and before finite ones, a NaN, a +inf and a
    row of -inf (NaN out, as torch)."""
    x = torch.randn(rows, n) * 5
    x[1, n // 2:] = float("-inf")
    x[2, :n - 100] = float("-inf")
    x[3, 5] = float("nan")
    x[4, n - 1] = float("inf")
    x[5] = float("-inf")
    return x.to(dtype)


@pytest.mark.parametrize("config", [
    {"chunk": 128, "num_warps": 4, "lag": 1},  # a row of programs behind
    {"chunk": 64, "num_warps": 4, "lag": 20},  # 20 programs: two rows of 10 behind
    {"chunk": 256, "num_warps": 4, "lag": 1 << 16},  # more than the rows: all rows behind
])
@pytest.mark.parametrize("log", [False, pytest.param(True, marks=pytest.mark.slow)],
                         ids=["softmax", "log_softmax"])
@pytest.mark.slow
def test_lagged_matches_torch(cpu_triton, monkeypatch, config, log):
    """Aligned rows (float32 and bfloat16 of 600) and rows off the 16-byte grid (float16 of 601,
    float32 of 597: the head before the first whole vector and the tail past the last),
    twice on the same slots, outputs poisoned first (an element left unwritten or written twice
    fails). The grid is (rows + lag_rows) x split."""
    grids = spy(monkeypatch, "_lagged_fwd_kernel")
    rows = 6
    for dtype, n in ((torch.float32, 600), (torch.bfloat16, 600), (torch.float16, 601),
                     (torch.float32, 597)):
        op = sm.LOG_SOFTMAX_OP if log else sm.SOFTMAX_OP
        call = op.prepare(special_rows(rows, n, dtype), -1)
        plan = op.backend("online").forward_plan(call, config, call.info.sm_count)
        assert isinstance(plan.forward, lagged.LaggedPlan)
        assert (plan.forward.vector > 0) == (n * dtype.itemsize % 16 != 0)
        split = -(-n // config["chunk"])
        lag_rows = max(1, min(rows, -(-config["lag"] // split)))
        assert plan.forward.ints[3:] == (split, rows, lag_rows)
        prepared = op.backend("online").bind(call, config)
        for launch in range(2):
            torch.manual_seed(launch)
            x = special_rows(rows, n, dtype)
            assert_matches(prepared(x), x, -1, log,
                           backend=f"lagged {config} {dtype} n={n} launch {launch}")
        assert grids["_lagged_fwd_kernel"][-1] == ((rows + lag_rows) * split,)


@pytest.mark.slow
def test_lagged_tags_move_on_and_wrap(cpu_triton):
    """Every slot's tag moves on by one a launch (mod 4), whatever it started from: six
    launches on the same slots, each right, each leaving every slot at its old tag + 1."""
    x = special_rows(6, 600, torch.float32)
    call = sm.SOFTMAX_OP.prepare(x, -1)
    plan = lagged.lagged_fwd_plan(call, 128, 4, 7)
    split, rows, lag_rows = plan.ints[3:]
    assert (split, lag_rows) == (5, 2)
    programs = (rows + lag_rows) * split
    launch = lagged._LAGGED_FWD.bind(plan, (programs,), call.info.index)
    slots = torch.full((programs,), 2, dtype=torch.int64)
    for i in range(1, 7):
        torch.manual_seed(i)
        x = special_rows(6, 600, torch.float32)
        y = torch.full_like(x, float("nan"))
        launch(x, y, slots, *plan.ints)
        assert_matches(y, x, -1, False, backend=f"lagged, launch {i}")
        assert ((slots & 3) == (2 + i) % 4).all(), i


@pytest.mark.slow
def test_lagged_layouts_and_casts(cpu_triton):
    """Non-contiguous rows (read in place with their stride), a transposed input (made
    contiguous first), an offset start (off the 16-byte grid) and a widening dtype=."""
    torch.manual_seed(32)
    cfg = {"chunk": 512, "num_warps": 4, "lag": 3}
    wide = torch.randn(6, 2400) * 3
    for x in (wide[:, :1100], wide.t().contiguous().t()[:, :1100],
              torch.randn(6 * 1100 + 1)[1:].view(6, 1100)):
        for log in (False, True):
            assert_matches(run_config(x, -1, log, "online", cfg), x, -1, log,
                           backend="lagged layout")
    h = (torch.randn(6, 1100) * 3).half()
    assert_matches(run_config(h, -1, False, "online", cfg, dtype=torch.float32), h, -1, False,
                   dtype=torch.float32, backend="lagged fp16 -> fp32")


def test_lagged_slots_with_other_tags_wait_and_read_the_row(cpu_triton):
    """Slots whose tags disagree (a program's epoch is its own slot's old tag + 1, so the row
    it writes never shows that tag): the program polls, gives up (the interpreter's spin limit
    is one poll) and reads the row itself for its statistics. Still right; and every slot
    carries this launch's tag after it."""
    torch.manual_seed(33)
    x = special_rows(6, 600, torch.float32)
    call = sm.SOFTMAX_OP.prepare(x, -1)
    plan = lagged.lagged_fwd_plan(call, 128, 4, 5)
    split, rows, lag_rows = plan.ints[3:]
    programs = (rows + lag_rows) * split
    launch = lagged._LAGGED_FWD.bind(plan, (programs,), call.info.index)
    slots = torch.arange(programs, dtype=torch.int64) % 4  # neighbours' tags differ
    old = slots.clone()
    y = torch.full_like(x, float("nan"))
    launch(x, y, slots, *plan.ints)
    assert_matches(y, x, -1, False, backend="lagged, tags that disagree")
    assert torch.equal(slots & 3, (old + 1) % 4)


def test_lagged_configs_and_limits(cpu_triton):
    """Lagged configs go first where the grid has LAGGED_MIN_PROGRAMS programs and a row 2 to
    128 chunks, never for float64; a config of another row (one chunk, too many) falls back to
    the cooperative or chunked plan; a lag that is no int in range is refused."""
    def gpu_call(rows, n, dtype=torch.bfloat16):
        call = sm.prepare_softmax(torch.empty(rows, n, dtype=dtype), -1)
        call.info = dataclasses.replace(call.info, type="cuda", index=0, sm_count=132)
        return call

    backend = sm.SOFTMAX_OP.backend("online")
    assert backend.configs(gpu_call(4096, 128256))[0] == {"chunk": 4096, "num_warps": 4,
                                                          "lag": 1024}
    assert backend.configs(gpu_call(1024, 151936, torch.float32))[0] == {
        "chunk": 2048, "num_warps": 4, "lag": 1024}
    assert [c.get("lag") for c in lagged.lagged_configs(gpu_call(64, 128256))] == [1024, 512]
    assert lagged.lagged_configs(gpu_call(63, 128256)) == []  # 2,016 programs
    assert lagged.lagged_configs(gpu_call(4096, 128256, torch.float64)) == []
    assert lagged.lagged_configs(gpu_call(64, 1200000)) == []  # 147 chunks of 8192
    assert "lag" not in backend.configs(gpu_call(8, 128256))[0]  # cooperative: few rows
    one_chunk = gpu_call(4096, 4000)
    plan = backend.forward_plan(one_chunk, {"chunk": 4096, "num_warps": 4, "lag": 512}, 132)
    assert not isinstance(plan.forward, lagged.LaggedPlan)
    call = gpu_call(4096, 32000)
    for lag in (0, -1, 1 << 17, 2.0, "8", None, True):
        with pytest.raises(InvalidArgument, match="lag"):
            backend.forward_plan(call, {"chunk": 4096, "num_warps": 4, "lag": lag}, 132)
    with pytest.raises(InvalidArgument, match="keys"):
        backend.plan(call, {"chunk": 4096, "lag": 512})


def test_lagged_cost_model(cpu_triton):
    """The cold model's online estimate is the lagged one where lagged goes first: on the
    H200's defaults, below the cooperative estimate of the same rows (the cooperative kernel
    measured 1.26x slower on 4096 x 128256 bf16), and the cold choice is online on rows too
    long for fused."""
    from opselect.heuristics import softmax as cost
    from opselect.heuristics.device_model import defaults_for, known_gpu

    for rows, n in ((4096, 128256), (16384, 32000), (1024, 131072)):
        meta = torch.empty(rows, n, dtype=torch.bfloat16, device="meta")
        call = sm.prepare_softmax(meta, -1)
        call.info = known_gpu("H200")
        model = defaults_for(call.info)
        lag = sm.SOFTMAX_OP.backend("online").cost(call, model)
        coop = cost.online(call, model, split=online.coop_split(call, 8192), cooperative=True,
                           chunk=8192)
        assert lag.seconds < coop.seconds, (rows, n)
        if n > 32768:
            choice = sm.SOFTMAX_OP.what_if(sm.prepare_softmax(meta, -1), known_gpu("H200"))
            assert (choice.choice, choice.config.get("lag")) == ("online", 1024), (rows, n)


@pytest.mark.gpu
def test_gpu_lagged_gives_up_waiting(cuda, monkeypatch):
    """A lag of one program and a spin limit of one poll: programs find the row they write
    still being read, stop waiting and read it themselves. Slower, still right."""
    patch_everywhere(monkeypatch, "SPIN_LIMIT", 1)
    for dtype in (torch.float32, torch.bfloat16):
        x = (torch.randn(256, 50257, device=cuda) * 3).to(dtype)
        for log in (False, True):
            got = run_config(x, -1, log, "online", {"chunk": 4096, "num_warps": 4, "lag": 1})
            assert_matches(got, x, -1, log, backend=f"online lagged {dtype}, no waiting")


@triton.jit
def _tag_and_read(big_ptr, total_ptr, out_ptr, epoch):
    i = tl.program_id(0)
    one = tl.arange(0, 1)
    big = tl.load(big_ptr + i + one)
    total = tl.load(total_ptr + i + one)
    word = lagged.tagged_word(big, total, epoch)
    used = one < 1
    row_max, row_sum = lagged.words_stats(word, used)
    tl.store(out_ptr + 2 * i + one, row_max)
    tl.store(out_ptr + 2 * i + 1 + one, row_sum)


def test_tagged_words_keep_nan_and_round_sums(cpu_triton):
    """A chunk's (max, sum) through its tagged word: the max exact, the sum within 2 units in
    the last place of 4 (rounded, not cut), and NaN sums of every bit pattern still NaN (the
    GPU's canonical NaN, 0x7FFFFFFF, once rounded into a tiny negative number: the row's NaN
    was lost)."""
    nan_bits = torch.tensor([0x7FFFFFFF, 0x7FC00000, 0x7F800001, -1, -4194304],
                            dtype=torch.int32)
    sums = torch.cat([torch.tensor([1.0, 3.0000002, 4096.0, 1e-30, 0.0]),
                      nan_bits.view(torch.float32)])
    maxima = torch.tensor([0.0, -5.5, 1e30, 0.0, float("-inf"), 1.0, 2.0, 3.0, 4.0, 5.0])
    for epoch in range(4):
        out = torch.full((2 * len(sums),), 7.0)
        _tag_and_read[(len(sums),)](maxima, sums, out, epoch)
        got_max, got_sum = out[0::2], out[1::2]
        assert torch.equal(got_max[maxima > float("-inf")], maxima[maxima > float("-inf")])
        finite = sums[:5]
        assert torch.allclose(got_sum[:5][finite > 0], finite[finite > 0], rtol=2.5e-7, atol=0)
        assert torch.isnan(got_sum[5:]).all(), (epoch, got_sum[5:])


@pytest.mark.gpu
def test_gpu_lagged_special_values(cuda):
    """Rows of -inf, NaN and +inf, and chunks wholly -inf, at a size the lagged configs take,
    every lagged config, aligned and off the 16-byte grid (a NaN sum once lost its NaN in the
    tagged word on the GPU, whose NaN is 0x7FFFFFFF; the interpreter's is not)."""
    torch.manual_seed(34)
    for n, dtype in ((8200, torch.float32), (16401, torch.bfloat16)):
        x = special_rows(512, n, torch.float32).to(cuda)
        x[6:, :] = torch.randn(506, n, device=cuda) * 5
        x[7, 100] = float("nan")
        x[8, n // 3:] = float("-inf")
        x = x.to(dtype)
        for log in (False, True):
            op = sm.LOG_SOFTMAX_OP if log else sm.SOFTMAX_OP
            configs = lagged.lagged_configs(op.prepare(x, -1))
            assert configs
            for cfg in configs:
                assert_matches(run_config(x, -1, log, "online", cfg), x, -1, log,
                               backend=f"lagged {cfg} {dtype}")


# ---------------------------------------------------------------------------------------------
# The lagged backward
# ---------------------------------------------------------------------------------------------
def backward_reference(y, g, log):
    yd, gd = y.double(), g.double()
    if log:
        return gd - yd.exp() * gd.sum(-1, keepdim=True)
    return yd * (gd - (gd * yd).sum(-1, keepdim=True))


def backward_inputs(rows, n, dtype, log, g_stride=None, g_dtype=None):
    """y of special_rows (rows 3-5 NaN, row 1 zeros past its middle, row 2 mostly zeros) and a
    dy of rows g_stride apart (a view of wider rows), both of n columns."""
    x = special_rows(rows, n, torch.float64)
    y = (torch.log_softmax if log else torch.softmax)(x, -1).to(dtype)
    g = (torch.randn(rows, g_stride or n) * 2).to(g_dtype or dtype)[:, :n]
    g[0, 7] = 1e4  # a term far above the rest of its row's sum
    return y, g


def lagged_backward_of(y, g, log, shape, dx_dtype=None):
    """The prepared lagged backward of y and g (unbound launches), at any grid size."""
    from opselect.kernels._common import allocator

    dx_dtype = dx_dtype or y.dtype
    align = sm.common._align(y.shape[-1], g.stride(0))
    return lagged.lagged_backward(lambda launcher, plan, grid: lambda *a: launcher(plan, grid, a),
                                  y, g.stride(0), g.dtype, dx_dtype, log, align,
                                  allocator(y.shape, dx_dtype, y.device), True, shape)


@pytest.mark.parametrize("shape", [
    (512, 4, 1), (512, 4, 20),  # a row behind; several rows (float32: 5 chunks, 4 rows)
    pytest.param((1024, 4, 1 << 16), marks=pytest.mark.slow)],  # every row behind
    ids=["lag 1", "lag 20", "lag past the rows"])
@pytest.mark.parametrize("log", [False, pytest.param(True, marks=pytest.mark.slow)],
                         ids=["softmax", "log_softmax"])
@pytest.mark.slow
def test_lagged_backward_matches_torch(cpu_triton, monkeypatch, shape, log):
    """The lagged backward through autograd.backward (rows past BWD_SINGLE_MAX and the grid's
    minimum lowered): aligned rows, rows off the 16-byte grid in shifted vectors (float16 of
    601, float32 of 597: head, window and tail), dy of its own stride read in place (off the
    grid: no vectors), a float32 y and dy with a float16 dx; each twice on the same slots (the
    tags move on), outputs poisoned, against float64. The grid is (rows + lag_rows) x split."""
    patch_everywhere(monkeypatch, "BWD_SINGLE_MAX", 64)
    monkeypatch.setattr(lagged, "LAGGED_MIN_PROGRAMS", 1)
    monkeypatch.setattr(lagged, "BWD_LAG_SHAPE", shape)
    grids = spy(monkeypatch, "_lagged_bwd_kernel")
    plans = []
    make_plan = lagged.lagged_backward_plan
    monkeypatch.setattr(lagged, "lagged_backward_plan",
                        lambda *args: plans.append(make_plan(*args)) or plans[-1])
    rows = 6
    for dtype, n, g_stride, dx_dtype, vector in (
            (torch.float32, 600, None, None, 0), (torch.bfloat16, 600, None, None, 0),
            (torch.float16, 601, None, None, 8), (torch.float32, 597, None, None, 4),
            (torch.float32, 600, 650, None, 0), (torch.float16, 601, 700, None, 0),
            (torch.float32, 601, None, torch.float16, 8)):
        for launch in range(2):
            torch.manual_seed(launch)
            y, g = backward_inputs(rows, n, dtype, log, g_stride)
            got = sm.autograd.backward(y, g, 1, log, dx_dtype or dtype)
            what = f"lagged backward {shape} {dtype} n={n} dy stride {g.stride(0)} #{launch}"
            assert_grad(got, backward_reference(y, g, log), dx_dtype or dtype, what)
            assert plans[-1].vector == vector, what
            split = -(-n // (shape[0] // dtype.itemsize))
            lag_rows = max(1, min(rows, -(-shape[2] // split)))
            assert plans[-1].ints[2:] == (split, rows, lag_rows), what
            assert grids["_lagged_bwd_kernel"][-1] == ((rows + lag_rows) * split,), what


@pytest.mark.slow
def test_lagged_backward_under_autograd(cpu_triton, monkeypatch):
    """A route's backward (ops.softmax under autograd, whichever backend ran the forward: its
    prepared backward kept in the route's memo) runs the lagged kernel on long rows, twice, as
    torch's gradient."""
    patch_everywhere(monkeypatch, "BWD_SINGLE_MAX", 64)
    monkeypatch.setattr(lagged, "LAGGED_MIN_PROGRAMS", 1)
    monkeypatch.setattr(lagged, "BWD_LAG_SHAPE", (512, 4, 7))
    grids = spy(monkeypatch, "_lagged_bwd_kernel")
    torch.manual_seed(35)
    for i in range(2):
        x = (torch.randn(5, 1000) * 3).to(torch.bfloat16)
        for log in (False, True):
            got, ref = grads(x, -1, log, "fused", torch.randn(x.shape))
            assert_grad(got, ref, torch.bfloat16, f"lagged backward under autograd #{i}")
    assert len(grids["_lagged_bwd_kernel"]) == 4


def test_lagged_backward_slots_that_disagree_wait_and_read_the_row(cpu_triton):
    """Slots whose tags disagree: programs poll, give up (one poll on the interpreter) and sum
    the row themselves; still right, and every slot carries its old tag + 1 after it."""
    torch.manual_seed(36)
    y, g = backward_inputs(6, 600, torch.float32, False)
    plan = lagged.lagged_backward_plan(torch.float32, torch.float32, torch.float32,
                                       (600, 600, 5, 6, 2), 1, False, 128, 1, 128, False, 4)
    programs = (6 + 2) * 5
    slots = (torch.arange(programs, dtype=torch.int64) % 4) << 32
    slots[3] |= 0x7FC00000  # (the low half is the sum: a tag never reads it)
    old = slots.clone()
    dx = torch.full_like(y, 7.0)
    lagged._LAGGED_BWD(plan, (programs,), (y, g, dx, slots, *plan.ints))
    assert_grad(dx, backward_reference(y, g, False), torch.float32, "tags that disagree")
    assert torch.equal((slots >> 32) & 3, ((old >> 32) + 1) % 4)


def test_lagged_backward_takes_its_rows(cpu_triton):
    """The lagged backward takes rows of 2 to LAGGED_MAX_SPLIT chunks on a grid of
    LAGGED_MIN_PROGRAMS, never float64; vectors only where dy is packed as y."""
    def takes(rows, n, dtype=torch.bfloat16, g_stride=None):
        y = torch.empty(rows, n, dtype=dtype, device="meta")
        g = torch.empty(rows, g_stride or n, dtype=dtype, device="meta")[:, :n]
        return lagged_backward_of(y, g, False, None) is not None

    assert takes(64, 128256) and not takes(63, 128256)  # 2,048 and 2,016 programs
    assert takes(1024, 4097) and not takes(1024, 4096)  # two chunks of 8 KB, one
    assert takes(4096, 128 * 4096) and not takes(4096, 128 * 4096 + 1)
    assert not takes(4096, 32000, torch.float64)
    assert takes(4096, 32000, g_stride=32768)


@pytest.mark.gpu
def test_gpu_lagged_backward(cuda, monkeypatch):
    """At sizes the lagged backward takes, softmax and log_softmax with special rows: aligned
    bfloat16 rows, float16 rows off the 16-byte grid (shifted vectors), float32 rows of 75
    chunks, dy of its own stride; three launches each (the tags move on); then a lag of one
    program and a spin limit of one poll (programs find the row they write still being read,
    stop waiting and sum it themselves): slower, still right."""
    grids = spy(monkeypatch, "_lagged_bwd_kernel")
    cases = ((512, 32000, torch.bfloat16, None), (256, 50257, torch.float16, None),
             (64, 151936, torch.float32, None), (300, 40000, torch.bfloat16, 40960))
    for spin, shape in ((lagged.SPIN_LIMIT, None), (1, (8192, 4, 1))):
        monkeypatch.setattr(lagged, "SPIN_LIMIT", spin)
        monkeypatch.setattr(lagged, "BWD_LAG_SHAPE", shape or lagged.BWD_LAG_SHAPE)
        for rows, n, dtype, g_stride in cases:
            for log in (False, True):
                torch.manual_seed(rows + log)
                y, g = backward_inputs(rows, n, dtype, log, g_stride)
                y, g = y.to(cuda), g.to(cuda)
                ref = backward_reference(y, g, log)
                before = len(grids["_lagged_bwd_kernel"])
                for launch in range(3):
                    got = sm.autograd.backward(y, g, 1, log, dtype)
                    assert_grad(got, ref, dtype, f"lagged backward {rows}x{n} {dtype} "
                                f"log={log} spin={spin} #{launch}")
                assert len(grids["_lagged_bwd_kernel"]) == before + 3


@pytest.mark.gpu
def test_gpu_lagged_backward_under_autograd(cuda, monkeypatch):
    """ops.softmax under autograd on vocabulary rows: the route's bound lagged backward, twice
    (the second on fresh data), as torch's float64 gradient."""
    grids = spy(monkeypatch, "_lagged_bwd_kernel")
    torch.manual_seed(37)
    for i in range(2):
        x = (torch.randn(1024, 32000, device=cuda) * 3).to(torch.bfloat16)
        for log in (False, True):
            # (dy in bfloat16 for both: float32 dy rounded for ours alone moves log_softmax's
            # sum of 32,000 terms by a few tenths, beyond the tolerance where a row's max is big)
            upstream = torch.randn(x.shape, device=cuda).to(torch.bfloat16)
            got, ref = grads(x, -1, log, "online", upstream)
            assert_grad(got, ref, torch.bfloat16, f"lagged backward under autograd #{i}")
    assert len(grids["_lagged_bwd_kernel"]) == 4
