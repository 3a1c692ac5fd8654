"""matmul / linear kernels (opselect/kernels/matmul): every Triton backend, every config it offers,
against a float64 reference, through the ops' own entry points (MATMUL_OP, LINEAR_OP and the
addmm form), not the public front.

An answer passes when each element is no farther from the float64 product than torch's own answer
is (times two), plus one rounding to the output dtype and a float32 accumulation's error (and
tf32's rounding of the inputs where it is allowed): "within torch's own matmul tolerances". NaN
must stand where torch's NaN stands, infinities must equal torch's. Every tensor the kernels
allocate (outputs and split-k's partials) starts as NaN (kernels/_common.POISON), so an element a
kernel forgets to write fails.

The tests run the kernels through Triton's interpreter on small shapes; tests/test_matmul_gpu.py
repeats the checks at real sizes on CUDA, tests/test_matmul_calls.py has the argument rules,
keys, routes and the cost model (both share the helpers here).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from opselect.kernels import _common
from opselect.kernels import matmul as MM
from opselect.kernels.matmul import (LINEAR_OP, MATMUL_OP, common as mm_common, plain_key,
                                     prepare_addmm)
from opselect.kernels.matmul.splitk import counters_of

pytestmark = [
    # The interpreter runs the kernels in numpy, which warns on inf - inf and inf * 0.
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
]

FLOATS = (torch.float16, torch.bfloat16, torch.float32)
TRITON = ("tiled", "splitk", "persistent")
OPS = {"matmul": MATMUL_OP, "linear": LINEAR_OP, "addmm": LINEAR_OP}
TORCH = {"matmul": torch.matmul, "linear": F.linear, "addmm": torch.addmm}
#: the float32 accumulator's unit roundoff, and tf32's (10 explicit mantissa bits)
ACC_EPS, TF32_EPS = 2.0 ** -24, 2.0 ** -11


@pytest.fixture(autouse=True)
def poisoned(monkeypatch):
    """Every output and workspace the kernels allocate starts as NaN (set before the test's first
    call: a prepared call makes its allocator once)."""
    monkeypatch.setattr(_common, "POISON", float("nan"))


@pytest.fixture(autouse=True)
def tf32_off():
    """float32 products in full precision unless a test allows tf32; restored afterwards."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = before


# ---------------------------------------------------------------------------------------------
# helpers (tests/test_matmul_calls.py and test_matmul_gpu.py import them)
# ---------------------------------------------------------------------------------------------
def rand(*shape, dtype=torch.float32, device="cpu", scale=1.0):
    """Normal values, rounded to dtype (the float64 reference sees the very same inputs)."""
    return (torch.randn(shape) * scale).to(device=device, dtype=dtype)


def prepare(form: str, args):
    return prepare_addmm(*args) if form == "addmm" else OPS[form].prepare(*args)


def answer(form: str, args, backend, config=None, sms=None):
    """The op's answer with a backend forced (its default config), or one backend under
    `config`; `sms`: the SM count the plan is made for (persistent's grid, split-k's splits)."""
    call = prepare(form, args)
    if sms is not None:
        call.info = dataclasses.replace(call.info, sm_count=sms)
    if config is None:
        return OPS[form].run(call, backend)
    b = OPS[form].backend(backend)
    assert b.supports(call) is None, (backend, b.supports(call))
    return b.run(call, config)


def assert_near(got, want, exact, mag, what: str, tf32: bool = False, k: int = 1) -> None:
    """got no farther from `exact` than twice torch's answer `want` is, plus one rounding to the
    output dtype and the float32 accumulation (tf32: the inputs' rounding) of k products of
    magnitudes `mag` (|A| @ |B| + |bias|). NaN where torch has NaN, torch's infinities."""
    g, w = got.double(), want.double()
    eps = torch.finfo(got.dtype).eps
    # (float32 sums of k random-signed terms err by about ACC_EPS * mag, whatever k: 16 leaves
    # room for the largest of millions of elements. Terms of one sign add their roundings:
    # sqrt(k) of them on average (the H200's fuzz: 100 equal products, 24 ulps off, cuBLAS's
    # tree 1 ulp). A worst-case k * ACC_EPS would let float16 partial sums or tf32 products
    # pass; 4 sqrt(k) stays below both up to k of millions.)
    accumulation = max(16.0, 4.0 * k ** 0.5) * ACC_EPS
    allowed = (2 * (w - exact).abs() + eps * exact.abs() + torch.finfo(got.dtype).tiny
               + (accumulation + (4 * TF32_EPS if tf32 else 0.0)) * mag)
    ok = ((g - exact).abs() <= allowed) | (g.isnan() & w.isnan()) | (g.isinf() & (g == w))
    if not bool(ok.all()):
        bad = ~ok
        where = bad.nonzero()[:4].tolist()
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {bad.numel()} elements off, first at {where}: ours "
            f"{g[bad][:4].tolist()}, torch {w[bad][:4].tolist()}, exact {exact[bad][:4].tolist()}")


def check(got, form: str, args, what: str, tf32: bool = False) -> None:
    """got is torch's answer of the form to `args`, within torch's own error (assert_near)."""
    want = TORCH[form](*args)
    wide = [None if t is None else t.double() for t in args]
    exact = TORCH[form](*wide)
    mag = TORCH[form](*[None if t is None else t.abs() for t in wide])
    assert isinstance(got, torch.Tensor), what
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)}, torch {tuple(want.shape)}"
    assert got.dtype == want.dtype and got.device == want.device, (what, got.dtype, got.device)
    assert got.is_contiguous(), what
    k = args[1].shape[-1] if form == "addmm" else args[0].shape[-1]
    assert_near(got, want, exact, mag, what, tf32, k)


def supported(form: str, args, backend: str) -> bool:
    return OPS[form].backend(backend).supports(prepare(form, args)) is None


def every_config(form: str, args, backend: str, what: str = "", sms=None, tf32=False) -> int:
    """Run every config the backend offers for the call (planned for `sms` SMs), each checked;
    returns how many ran."""
    call = prepare(form, args)
    if sms is not None:
        call.info = dataclasses.replace(call.info, sm_count=sms)
    configs = OPS[form].backend(backend).configs(call)
    assert configs, (backend, what)
    for cfg in configs:
        got = answer(form, args, backend, cfg, sms=sms)
        check(got, form, args, f"{backend} {what} {cfg}", tf32=tf32)
        if backend == "splitk":
            assert not bool(counters_of(got.device).any()), f"{what} {cfg}: counters left set"
    return len(configs)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({2: torch.int16, 4: torch.int32}[t.element_size()])


# ---------------------------------------------------------------------------------------------
# every backend, every config
# ---------------------------------------------------------------------------------------------
def config_calls(backend: str, dtype, device="cpu"):
    """(form, args, name) of calls reaching each tile list of the backend (decode-sized, up to
    64 rows and more rows), with and without a bias; sizes multiples of no tile."""
    r = lambda *s: rand(*s, dtype=dtype, device=device)  # noqa: E731
    if backend == "splitk":  # (k > 256)
        return [("matmul", (r(3, 300), r(300, 70)), "decode"),
                ("linear", (r(40, 520), r(33, 520), r(33)), "<=64 rows"),
                ("addmm", (r(1, 45), r(130, 260), r(260, 45)), "rows")]
    return [("matmul", (r(3, 70), r(70, 130)), "decode"),
            ("linear", (r(2, 9, 100), r(37, 100), r(37)), "<=64 rows"),
            ("matmul", (r(130, 40), r(40, 70)), "rows")]


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("backend", TRITON)
def test_every_config(cpu_triton, backend, dtype):
    torch.manual_seed(1)
    ran = 0
    for form, args, name in config_calls(backend, dtype):
        ran += every_config(form, args, backend, name)
    assert ran >= 6


@pytest.mark.parametrize("backend", TRITON)
def test_every_config_planned_for_a_gpu(cpu_triton, backend):
    """The configs and plans a 132-SM GPU gets (split-k's larger splits, persistent's grid)."""
    torch.manual_seed(2)
    a, b = rand(5, 1100), rand(1100, 100)
    assert every_config("matmul", (a, b), backend, "132 SMs", sms=132) >= 1


def test_persistent_programs_walk_several_tiles(cpu_triton, monkeypatch):
    """One or two programs per SM on a 1-SM device: each walks several tiles, over batch
    entries too, the last round partly empty."""
    grids = []
    real = MM.persistent._PERSISTENT

    def spy(plan, grid, args):
        grids.append((grid, plan.tiles))
        return real(plan, grid, args)

    monkeypatch.setattr(MM.PersistentBackend, "launch", lambda self, plan, call, a, b, bias, c:
                        spy(plan, (plan.programs,), (a, b, bias, c, *plan.ints)))
    torch.manual_seed(3)
    for form, args in (("matmul", (rand(3, 17, 40), rand(3, 40, 150))),
                       ("linear", (rand(70, 33), rand(300, 33), rand(300)))):
        ran = every_config(form, args, "persistent", "1 SM", sms=1)
        assert len(grids) == ran
        for (programs,), tiles in grids:
            assert programs <= 2 and programs < tiles, (programs, tiles)
        grids.clear()


# ---------------------------------------------------------------------------------------------
# forms: torch.matmul's 1-d to n-d, F.linear, torch.addmm
# ---------------------------------------------------------------------------------------------
K = 257  # (split-k takes k > 256; a multiple of no block_k)


def forms(device="cpu"):
    r = lambda *s: rand(*s, device=device)  # noqa: E731
    return {
        "2d": ("matmul", (r(17, K), r(K, 33))),
        "batched": ("matmul", (r(3, 17, K), r(3, K, 33))),
        "BMK@KN": ("matmul", (r(3, 5, K), r(K, 33))),
        "MK@BKN": ("matmul", (r(17, K), r(2, K, 33))),
        "B11MK@B2KN": ("matmul", (r(2, 1, 5, K), r(3, K, 33))),
        "1d@1d": ("matmul", (r(K), r(K))),
        "2d@1d": ("matmul", (r(17, K), r(K))),
        "1d@2d": ("matmul", (r(K), r(K, 33))),
        "1d@3d": ("matmul", (r(K), r(2, K, 33))),
        "3d@1d": ("matmul", (r(2, 5, K), r(K))),
        "4d@4d": ("matmul", (r(2, 3, 5, K), r(2, 3, K, 33))),
        "4d@3d": ("matmul", (r(2, 3, 5, K), r(3, K, 33))),
        "4d@2d": ("matmul", (r(2, 3, 5, K), r(K, 33))),
        "linear": ("linear", (r(17, K), r(33, K), r(33))),
        "linear no bias": ("linear", (r(17, K), r(33, K), None)),
        "linear 1d": ("linear", (r(K), r(33, K), r(33))),
        "linear 3d": ("linear", (r(2, 9, K), r(33, K), r(33))),
        "linear 0-d bias": ("linear", (r(17, K), r(33, K), r())),
        "linear (1,) bias": ("linear", (r(17, K), r(33, K), r(1))),
        "linear one output": ("linear", (r(17, K), r(1, K), r(1))),
        "addmm (n,)": ("addmm", (r(33), r(17, K), r(K, 33))),
        "addmm (1, n)": ("addmm", (r(1, 33), r(17, K), r(K, 33))),
        "addmm (1, 1)": ("addmm", (r(1, 1), r(17, K), r(K, 33))),
    }


def test_batch_that_is_no_single_dim_is_copied(cpu_triton):
    """(B1, 1, M, K) @ (B2, K, N) broadcasts A over a batch whose dims cannot be one stride:
    the call reads a contiguous copy (copied); the folds and views of the other forms do not."""
    r = rand
    copied = {"B11MK@B2KN", "4d@3d"}
    for name, (form, args) in forms().items():
        assert prepare(form, args).copied == (name in copied), name
    assert prepare("linear", (r(2, 8, 9)[:, :4], r(5, 9), None)).copied  # rows: no one run
    assert not prepare("linear", (r(2, 8, 9)[:, ::2], r(5, 9), None)).copied  # a run, stepped
    call = prepare("matmul", (r(3, 5, 9), r(9, 4)))
    assert (call.batch, call.m) == (1, 15), "(B, M, K) @ (K, N) is one product of B * M rows"


# ---------------------------------------------------------------------------------------------
# layouts: operands read through their strides
# ---------------------------------------------------------------------------------------------
def layouts(device="cpu"):
    r = lambda *s: rand(*s, device=device)  # noqa: E731
    return {
        "transposed A": ("matmul", (r(K, 17).t(), r(K, 33))),
        "transposed B": ("matmul", (r(17, K), r(33, K).t())),
        "batched, both transposed": ("matmul", (r(3, K, 17).transpose(1, 2),
                                                r(3, 33, K).transpose(1, 2))),
        "stepped slices": ("matmul", (r(34, 2 * K)[::2, ::2], r(K, 99)[:, 1::3])),
        "stepped batch": ("matmul", (r(6, 5, K)[::2], r(3, K, 33))),
        "batch not one dim": ("matmul", (r(4, 3, 5, K).transpose(0, 1), r(3, 4, K, 33))),
        "expanded A batch": ("matmul", (r(1, 5, K).expand(3, 5, K), r(3, K, 33))),
        "expanded B batch": ("matmul", (r(3, 5, K), r(K, 33).expand(3, K, 33))),
        "expanded rows": ("matmul", (r(1, K).expand(17, K), r(K, 33))),
        "expanded k": ("matmul", (r(17, 1).expand(17, K), r(K, 33))),
        "offset storage": ("matmul", (r(17 * K + 5)[5:].view(17, K),
                                      r(K * 33 + 1)[1:].view(K, 33))),
        "linear weight transposed": ("linear", (r(17, K), r(K, 33).t(), r(33))),
        "linear stepped input rows": ("linear", (r(2, 10, K)[:, ::2], r(33, K), r(33))),
        "linear rows not one run": ("linear", (r(2, 10, K)[:, :5], r(33, K), r(33))),
        "linear stepped bias": ("linear", (r(17, K), r(33, K), r(66)[::2])),
        "linear expanded bias": ("linear", (r(17, K), r(33, K), r(1).expand(33))),
        "linear offset weight, bias": ("linear", (r(17, K), r(33 * K + 3)[3:].view(33, K),
                                                  r(34)[1:])),
        "addmm transposed mat2": ("addmm", (r(1, 33), r(17, K), r(33, K).t())),
        "addmm stepped bias": ("addmm", (r(1, 66)[:, ::2], r(17, K), r(K, 33))),
    }


def forms_and_layouts(device="cpu"):
    return {**forms(device), **layouts(device)}


@pytest.mark.parametrize("backend", TRITON)
@pytest.mark.parametrize("name", list(forms_and_layouts()))
def test_forms_and_layouts(cpu_triton, name, backend):
    torch.manual_seed(4)
    form, args = forms_and_layouts()[name]
    check(answer(form, args, backend), form, args, f"{backend} {name}")


# ---------------------------------------------------------------------------------------------
# sizes, dtypes and special values
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["tiled", "persistent"])
def test_sizes_no_tile_divides(cpu_triton, backend):
    """Edges of every tile in m, n and k, k shorter than block_k; integer inputs, whose sums
    are exact in float32 (and in float16's range): the answer is torch's, bit for bit."""
    torch.manual_seed(6)
    for m, k, n in ((1, 1, 1), (3, 3, 17), (17, 33, 1), (33, 17, 130), (130, 3, 33),
                    (1, 130, 33), (65, 1, 129)):
        for dtype in (torch.float32, torch.float16):
            a = torch.randint(-3, 4, (m, k)).to(dtype)
            b = torch.randint(-3, 4, (k, n)).to(dtype)
            got = answer("matmul", (a, b), backend)
            assert torch.equal(got, torch.matmul(a, b)), (backend, m, k, n, dtype)


def test_splitk_sizes(cpu_triton):
    torch.manual_seed(7)
    for m, k, n in ((1, 257, 1), (3, 258, 17), (17, 300, 33), (70, 1000, 3)):
        for dtype in (torch.float32, torch.float16):
            a = torch.randint(-3, 4, (m, k)).to(dtype)
            b = torch.randint(-3, 4, (k, n)).to(dtype)
            assert torch.equal(answer("matmul", (a, b), "splitk"), torch.matmul(a, b)), (m, k, n)


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("backend", TRITON)
def test_dtypes_on_each_form(cpu_triton, backend, dtype):
    torch.manual_seed(8)
    for name in ("batched", "2d@1d", "linear 3d", "addmm (1, n)", "4d@3d"):
        form, args = forms()[name]
        args = tuple(None if t is None else (t * 4).to(dtype) for t in args)
        check(answer(form, args, backend), form, args, f"{backend} {name} {dtype}")


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: str(d)[6:])
def test_nan_and_inf_as_torch(cpu_triton, dtype):
    """A NaN in A makes its row NaN, an inf its row +-inf (NaN where it meets a 0 of B), one
    in B its column; inf - inf is NaN. Positions and signs as torch's."""
    torch.manual_seed(9)
    a, b = rand(5, 300, dtype=dtype), rand(300, 40, dtype=dtype)
    a[1, 7] = float("nan")
    a[2, 299] = float("inf")   # in the last, partial k step
    a[3, 100] = float("-inf")
    b[100, 5] = 0.0            # -inf * 0: NaN in row 3
    b[20, 3] = float("inf")    # a column of +-inf
    b[21, 9] = float("inf")    # with a[4, 22] = -inf: inf - inf
    b[22, 9] = float("inf")
    a[4, 22] = float("-inf")
    bias = rand(40, dtype=dtype)
    bias[11] = float("nan")
    want = torch.matmul(a, b)
    assert want.isnan().any() and want.isinf().any()
    for backend in TRITON:
        check(answer("matmul", (a, b), backend), "matmul", (a, b), f"{backend} {dtype}")
        args = (a, b.t(), bias)
        check(answer("linear", args, backend), "linear", args, f"{backend} linear {dtype}")


def test_negative_zero_inputs(cpu_triton):
    """-0.0 is a zero: products of -0.0 sum to a zero (no NaN, no sign trouble in the sums)."""
    a = torch.tensor([[-0.0, 1.0, -0.0], [-0.0, -0.0, -0.0]])
    b = torch.tensor([[1.0, -0.0], [2.0, 3.0], [-0.0, -0.0]])
    for backend in TRITON:
        if not supported("matmul", (a, b), backend):
            continue
        got = answer("matmul", (a, b), backend)
        assert torch.equal(got, torch.matmul(a, b)), backend  # (-0.0 == 0.0)
        got = answer("linear", (a, b.t(), torch.tensor([-0.0, 0.0])), backend)
        assert torch.equal(got, F.linear(a, b.t(), torch.tensor([-0.0, 0.0]))), backend


@pytest.mark.parametrize("backend", ["torch", *TRITON])
def test_tf32_switch(cpu_triton, backend):
    """allow_tf32 is read per call: a float32 call's key (and plan) says which; both run and
    answer within tf32's rounding; half-precision calls do not depend on it."""
    torch.manual_seed(10)
    a, b = rand(20, 300), rand(300, 30)
    strict = prepare("matmul", (a, b))
    torch.backends.cuda.matmul.allow_tf32 = True
    loose = prepare("matmul", (a, b))
    assert (strict.tf32, loose.tf32) == (False, True)
    assert strict.key != loose.key and strict.exact != loose.exact
    check(answer("matmul", (a, b), backend), "matmul", (a, b), backend, tf32=True)
    if backend != "torch":
        assert MATMUL_OP.backend(backend).plan(loose).tf32
        assert not MATMUL_OP.backend(backend).plan(strict).tf32
    half = prepare("matmul", (a.half(), b.half()))
    half_route = plain_key("matmul", a.half(), b.half())
    loose_route = plain_key("matmul", a, b)
    torch.backends.cuda.matmul.allow_tf32 = False
    assert prepare("matmul", (a.half(), b.half())).key == half.key and not half.tf32
    # the route keys (ops.matmul's memo of prepared calls) follow the switch for float32 only
    assert plain_key("matmul", a.half(), b.half()) == half_route
    assert plain_key("matmul", a, b) != loose_route
    check(answer("matmul", (a, b), backend), "matmul", (a, b), backend)


# ---------------------------------------------------------------------------------------------
# nothing to compute: k = 0, m, n or the batch 0
# ---------------------------------------------------------------------------------------------
def empties():
    r = rand
    return {
        "k = 0": ("matmul", (r(3, 0), r(0, 4))),
        "k = 0, batched": ("matmul", (r(2, 3, 0), r(2, 0, 4))),
        "1d@1d, k = 0": ("matmul", (r(0), r(0))),
        "m = 0": ("matmul", (r(0, 5), r(5, 3))),
        "n = 0": ("matmul", (r(3, 300), r(300, 0))),
        "batch 0": ("matmul", (r(0, 3, 5), r(5, 4))),
        "batch 0 of B": ("matmul", (r(3, 5), r(0, 5, 4))),
        "linear k = 0 + bias": ("linear", (r(3, 0), r(4, 0), r(4))),
        "linear k = 0, 0-d bias": ("linear", (r(2, 3, 0), r(4, 0), r())),
        "linear m = 0": ("linear", (r(0, 5), r(4, 5), r(4))),
        "addmm k = 0 + (1, n)": ("addmm", (r(1, 4), r(3, 0), r(0, 4))),
    }


@pytest.mark.parametrize("name", list(empties()))
def test_nothing_to_compute(cpu_triton, name):
    """Every backend (and auto) answers as torch does: zeros, plus the bias where k = 0."""
    form, args = empties()[name]
    want = TORCH[form](*args)
    call = prepare(form, args)
    assert call.empty
    for backend in (None, "torch", *TRITON):
        got = OPS[form].run(prepare(form, args), backend)
        assert got.shape == want.shape and got.dtype == want.dtype, (name, backend)
        assert torch.equal(got, want), (name, backend)


def test_k0_keeps_a_negative_zero_bias(cpu_triton):
    x, w = torch.randn(3, 0), torch.randn(4, 0)
    bias = torch.tensor([-0.0, 1.0, -0.0, 2.0])
    want = F.linear(x, w, bias)
    assert torch.signbit(want[:, 0]).all()
    for backend in TRITON:
        got = LINEAR_OP(x, w, bias, backend=backend)
        assert torch.equal(bits(got), bits(want)), (backend, got[0])


# ---------------------------------------------------------------------------------------------
# split-k: every split, counters, determinism
# ---------------------------------------------------------------------------------------------
def spy_splitk(monkeypatch) -> list:
    """The (grid, plan) of every split-k launch."""
    launches = []
    real = MM.splitk._SPLITK

    class Spy:
        def __call__(self, plan, grid, args):
            launches.append((tuple(grid), plan))
            return real(plan, grid, args)

        def bind(self, plan, grid, index):
            launches.append((tuple(grid), plan))
            return real.bind(plan, grid, index)

    monkeypatch.setattr(MM.splitk, "_SPLITK", Spy())
    return launches


@pytest.mark.parametrize("split", [3, 5, 40])
@pytest.mark.slow
def test_splitk_every_split(cpu_triton, monkeypatch, split):
    """Any split: chunks of whole block_k steps, the last one shorter (k = 1000), a split past
    k's steps clamped to one step a chunk (no empty chunk), several tiles and a batch; the
    counters are 0 again after every launch; two calls give the same bits."""
    launches = spy_splitk(monkeypatch)
    torch.manual_seed(11)
    cfg = {"block_m": 16, "block_n": 32, "block_k": 64, "group_m": 2, "num_warps": 4,
           "num_stages": 2, "split": split}
    for form, args in (("matmul", (rand(2, 20, 1000), rand(2, 1000, 40))),
                       ("linear", (rand(3, 1000), rand(40, 1000), rand(40)))):
        first = answer(form, args, "splitk", cfg)
        check(first, form, args, f"split {split}")
        assert not bool(counters_of(first.device).any())
        if form == "matmul":
            again = answer(form, args, "splitk", cfg)
            assert torch.equal(bits(first), bits(again)), "split-k is not deterministic"
        grid, plan = launches[-1]
        chunk = plan.ints[-1]
        # chunks of whole steps, as even as whole steps allow (16 steps of 64: a split of 5
        # is 4 chunks of 4 steps), never more chunks than asked nor an empty one
        assert chunk == -(-(-(-1000 // split)) // 64) * 64, (split, chunk)
        assert plan.split == grid[1] == -(-1000 // chunk) <= split, (plan.split, grid)
        assert (plan.split - 1) * chunk < 1000 <= plan.split * chunk
    assert len({plan for _, plan in launches}) == 2


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: str(d)[6:])
@pytest.mark.slow
def test_splitk_offers_several_splits_and_each_is_right(cpu_triton, dtype):
    """Planned for a 16-SM GPU, a decode product gets several splits (about two programs per
    SM, halved and doubled): every split offered answers right, rounded once."""
    torch.manual_seed(12)
    args = (rand(5, 1100, dtype=dtype), rand(300, 1100, dtype=dtype), rand(300, dtype=dtype))
    call = prepare("linear", args)
    call.info = dataclasses.replace(call.info, sm_count=16)
    splits = {cfg["split"] for cfg in LINEAR_OP.backend("splitk").configs(call)}
    assert len(splits) >= 2 and max(splits) >= 4, splits
    every_config("linear", args, "splitk", "decode", sms=16)


def test_splitk_prepared_call_is_deterministic_and_resets_counters(cpu_triton):
    """The bound (prepared) split-k call: workspaces from its allocator (poisoned), the
    counters 0 between calls, bit-identical answers."""
    torch.manual_seed(13)
    a, b = rand(4, 3, 600), rand(600, 50)
    call = prepare("matmul", (a, b))
    backend = MATMUL_OP.backend("splitk")
    product = backend.bind(call, backend.configs(call)[0])
    first = product(a, b)
    check(first, "matmul", (a, b), "bound splitk")
    assert not bool(counters_of(first.device).any())
    assert torch.equal(bits(product(a, b)), bits(first))
    a2 = rand(4, 3, 600)
    check(product(a2, b), "matmul", (a2, b), "bound splitk, new tensors")


# ---------------------------------------------------------------------------------------------
# plans: the grouped tile order, 64-bit offsets
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["tiled", "persistent"])
@pytest.mark.slow
def test_grouped_order_with_a_partial_group(cpu_triton, backend):
    """group_m row blocks a group, the last group shorter: every tile is computed once."""
    torch.manual_seed(14)
    extra = {"programs_per_sm": 1} if backend == "persistent" else {}
    a, b = rand(90, 40), rand(40, 70)  # 6 x 5 tiles of 16 x 16
    for group_m in (1, 4, 8):
        cfg = {"block_m": 16, "block_n": 16, "block_k": 16, "group_m": group_m,
               "num_warps": 4, "num_stages": 2, **extra}
        check(answer("matmul", (a, b), backend, cfg, sms=3), "matmul", (a, b),
              f"{backend} group_m {group_m}")


@pytest.mark.parametrize("backend", TRITON)
def test_64_bit_offsets(cpu_triton, monkeypatch, backend):
    """The wide path (offsets in int64, past 2**31 elements) on small tensors: every plan is
    made wide."""
    monkeypatch.setattr(mm_common, "needs_int64", lambda *spans: True)
    for op in (MATMUL_OP, LINEAR_OP):
        op.backend(backend).forget_plans()
    try:
        torch.manual_seed(15)
        for form, args in (("matmul", (rand(3, 17, 300), rand(3, 300, 40))),
                           ("linear", (rand(2, 5, 300), rand(33, 300), rand(33)))):
            call = prepare(form, args)
            assert OPS[form].backend(backend).plan(call).wide
            check(answer(form, args, backend), form, args, f"{backend} wide")
    finally:
        for op in (MATMUL_OP, LINEAR_OP):
            op.backend(backend).forget_plans()


def test_wide_offsets_follow_the_spans():
    meta = lambda *s: torch.empty(s, dtype=torch.bfloat16, device="meta")  # noqa: E731
    narrow = MATMUL_OP.prepare(meta(4096, 4096), meta(4096, 4096))
    assert not mm_common.wide_offsets(narrow)
    assert mm_common.wide_offsets(MATMUL_OP.prepare(meta(600_000, 4096), meta(4096, 64)))
    assert mm_common.wide_offsets(MATMUL_OP.prepare(meta(64, 4096), meta(4096, 600_000)))
    assert mm_common.wide_offsets(MATMUL_OP.prepare(meta(16, 65536, 64), meta(16, 64, 4096)))
    # A broadcast operand spans its one copy only.
    assert not mm_common.wide_offsets(MATMUL_OP.prepare(meta(8, 64, 4096),
                                                        meta(4096, 4096).expand(8, 4096, 4096)))


def test_launchers_take_their_constexprs_from_the_plan(cpu_triton):
    """Each Launcher's plan -> constexprs gives exactly the kernel's constexpr parameters, and
    the launch options (num_warps, num_stages) of the config."""
    import inspect

    a, b = rand(20, 300), rand(300, 40)
    call = prepare("matmul", (a, b))
    launchers = {"tiled": MM.tiled._TILED, "splitk": MM.splitk._SPLITK,
                 "persistent": MM.persistent._PERSISTENT}
    assert set(MM.LAUNCHERS.values()) == set(launchers.values())
    for name, launcher in launchers.items():
        params = inspect.signature(launcher.fn.fn).parameters
        wanted = {p for p, v in params.items() if "constexpr" in str(v.annotation)}
        backend = MATMUL_OP.backend(name)
        cfg = backend.configs(call)[0]
        got = launcher.plan_constexprs(backend.plan(call, cfg))
        assert set(got) == wanted | {"num_warps", "num_stages"}, name
        assert (got["num_warps"], got["num_stages"]) == (cfg["num_warps"], cfg["num_stages"])
