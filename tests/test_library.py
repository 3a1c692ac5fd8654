"""opselect's torch.library ops: opcheck, fake implementations, torch.compile with no graph break,
dynamic shapes, the trace-time rule (aten op or opselect's), autograd, CUDA graphs (gpu)."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.testing import CompileCounterWithBackend
from torch._subclasses.fake_tensor import FakeTensorMode

import opselect
from opselect import library, ops
from opselect.fronts import isin as isin_front
from opselect.dispatch import get_op, tuning
from opselect.dispatch import tuning_mode
from opselect.tune_cache import store

OPS = torch.ops.opselect


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _t(shape, dtype=torch.float32, seed=0, low=0, high=50, device="cpu"):
    g = _gen(seed)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype).to(device)
    return torch.randint(low, high, shape, generator=g).to(dtype).to(device)


# (label, op, args): shapes, dtypes, strides, empty inputs, forced backends (the interpreter runs
# the Triton kernels) and auto (torch's kernel on the CPU).
def opcheck_samples():
    x = _t((5, 40))
    return [
        ("softmax auto", OPS.softmax.default, (x, -1, None, None)),
        ("softmax fused grad", OPS.softmax.default, (x.clone().requires_grad_(), 1, None, "fused")),
        ("softmax transposed float64", OPS.softmax.default, (x.t(), 0, torch.float64, "strided")),
        ("softmax fp16->fp32", OPS.softmax.default, (_t((3, 1100), torch.float16), -1,
                                                      torch.float32, "online")),
        ("softmax bf16 multirow", OPS.softmax.default, (_t((9, 24), torch.bfloat16), 1, None,
                                                         "multirow")),
        ("softmax empty", OPS.softmax.default, (torch.empty(0, 7), -1, None, "fused")),
        ("log_softmax strided grad", OPS.log_softmax.default,
         (_t((3, 4, 5), torch.float16).requires_grad_(), 1, None, "strided")),
        ("log_softmax 0-d", OPS.log_softmax.default, (torch.tensor(2.0), 0, None, None)),
        ("softmax_backward", OPS.softmax_backward.default,
         (torch.softmax(_t((4, 6)), -1), _t((4, 6), seed=1), 1, False, torch.float32)),
        ("log_softmax_backward fp16", OPS.softmax_backward.default,
         (torch.log_softmax(_t((4, 6)), 0), _t((4, 6), seed=2), 0, True, torch.float16)),
        ("topk bitonic", OPS.topk.default, (_t((6, 30)), 4, -1, True, True, "bitonic")),
        ("topk dim0 smallest grad", OPS.topk.default,
         (_t((30, 6)).requires_grad_(), 5, 0, False, True, None)),
        ("topk int32 sort unsorted", OPS.topk.default, (_t((3, 50), torch.int32), 7, 1, True, False, "sort")),
        ("topk non-contiguous radix", OPS.topk.default, (_t((40, 8)).t(), 3, -1, True, True,
                                                         "radix")),
        ("topk k=0", OPS.topk.default, (_t((4, 9)), 0, -1, True, True, None)),
        ("topk empty rows", OPS.topk.default, (torch.empty(0, 9), 2, -1, True, True, "bitonic")),
        ("isin hash", OPS.isin.default, (_t((4, 5), torch.int64), _t((7,), torch.int64, 1),
                                         False, False, "hash")),
        ("isin float invert compare", OPS.isin.default,
         (_t((33,)).round(), _t((5,), seed=3).round(), False, True, "compare")),
        ("isin non-contiguous bitmap", OPS.isin.default,
         (_t((6, 8), torch.int32).t(), _t((3, 4), torch.int32, 4).t(), False, False, "bitmap")),
        ("isin empty", OPS.isin.default, (torch.empty(0, dtype=torch.int64),
                                          _t((3,), torch.int64), False, False, None)),
        ("permute naive", OPS.permute.default, (_t((2, 3, 4)), [2, 0, 1], "naive")),
        ("permute tiled uint8", OPS.permute.default, (_t((16, 24), torch.uint8), [1, 0],
                                                      "tiled")),
        ("permute grad", OPS.permute.default, (_t((2, 3, 4)).requires_grad_(), [1, 2, 0], None)),
        ("permute empty", OPS.permute.default, (torch.empty(2, 0, 3), [2, 1, 0], None)),
        ("softmax_or_aten", OPS.softmax_or_aten.default, (_t((4, 6)), 1, None, None)),
        ("topk_or_aten", OPS.topk_or_aten.default, (_t((4, 6)), 2, -1, True, True, "bitonic")),
        ("isin_or_aten", OPS.isin_or_aten.default, (_t((9,), torch.int64),
                                                    _t((3,), torch.int64), False, False, None)),
        ("permute_or_aten", OPS.permute_or_aten.default, (_t((3, 5)), [1, 0], None)),
    ]


SAMPLES = opcheck_samples()


@pytest.mark.parametrize("index", range(len(SAMPLES)), ids=[s[0] for s in SAMPLES])
@pytest.mark.slow
def test_opcheck(cpu_triton, index):
    _, op, args = SAMPLES[index]
    result = torch.library.opcheck(op, args)
    assert all(v == "SUCCESS" for v in result.values()), result


def _torch_equivalent(name: str, args: tuple):
    """What torch's own op returns for the sample (the layout every backend must match)."""
    if name.startswith("softmax_backward") or name.startswith("log_softmax_backward"):
        y, g, dim, log, dtype = args
        fn = torch._log_softmax_backward_data if log else torch._softmax_backward_data
        return fn(g, y, dim, y.dtype).to(dtype)
    op = name.split()[0]
    if op in ("softmax", "log_softmax"):
        return getattr(torch, op)(args[0].detach(), args[1], dtype=args[2])
    if op == "topk":
        return tuple(torch.topk(args[0].detach(), *args[1:5]))
    if op == "isin":
        return torch.isin(args[0], args[1].reshape(-1), invert=args[3])
    if op == "permute":
        return args[0].detach().permute(args[1]).contiguous()
    return None


@pytest.mark.parametrize("index", range(len(SAMPLES)), ids=[s[0] for s in SAMPLES])
def test_fake_and_real_match_torch(cpu_triton, index):
    """Shapes, dtypes and strides: the fake implementation, the real kernel (any backend) and
    torch's own op agree exactly; the values agree too."""
    name, op, args = SAMPLES[index]
    real = op(*args)
    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        fake_args = tuple(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a
                          for a in args)
        fake = op(*fake_args)
    expected = _torch_equivalent(name, args)
    reals = real if isinstance(real, tuple) else (real,)
    fakes = fake if isinstance(fake, tuple) else (fake,)
    refs = expected if isinstance(expected, tuple) else (expected,)
    for r, f, e in zip(reals, fakes, refs):
        assert (r.shape, r.dtype, r.stride()) == (f.shape, f.dtype, f.stride())
        if e is not None:
            assert (r.shape, r.dtype) == (e.shape, e.dtype)
            if r.numel():  # an empty tensor's strides carry no layout (torch may return a view)
                assert r.stride() == e.stride()
            if "unsorted" in name:
                r, e = r.sort(-1).values, e.sort(-1).values
            if r.dtype.is_floating_point:
                torch.testing.assert_close(r.detach(), e, rtol=2e-3, atol=2e-3)
            elif "topk" not in name or r.dtype != torch.int64:  # tied indices may differ (and
                # unsorted ones come in any order)
                assert torch.equal(r, e)


# ---------------------------------------------------------------------------------------------
# torch.compile
# ---------------------------------------------------------------------------------------------
def every_op(x, a, b, m):
    """Every public op with neighbours around it (auto backends)."""
    return (ops.softmax(x * 2, -1) + 1, ops.log_softmax(x, 0), ops.topk(x, 3).values * 2,
            ops.topk(x, 2, dim=0, largest=False).indices, ops.isin(a + 1, b),
            ops.permute(m, (0, 2, 1, 3)) + 1, ops.transpose(m, 1, -1))


def every_op_forced(x, a, b, m):
    """The same with Triton backends forced (through the interpreter on the CPU)."""
    return (ops.softmax(x * 2, -1, backend="fused") + 1,
            ops.log_softmax(x, 0, backend="strided"),
            ops.topk(x, 3, backend="bitonic").values * 2,
            ops.topk(x, 2, dim=0, largest=False, backend="sort").indices,
            ops.isin(a + 1, b, backend="hash"),
            ops.permute(m, (0, 2, 1, 3), backend="naive") + 1,
            ops.transpose(m, 1, -1, backend="naive"))


def every_op_inputs(n=6, device="cpu", seed=0):
    return (_t((n, 40), seed=seed, device=device),
            _t((100,), torch.int64, seed + 1, device=device),
            _t((20,), torch.int64, seed + 2, device=device),
            _t((2, 3, n, 5), seed=seed + 3, device=device))


def assert_same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype and g.stride() == w.stride()
        if g.dtype.is_floating_point:
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
        else:
            assert torch.equal(g, w)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("fn", [every_op, every_op_forced], ids=["auto", "forced"])
@pytest.mark.slow
def test_compile_fullgraph(cpu_triton, backend, fn):
    torch._dynamo.reset()
    args = every_op_inputs()
    compiled = torch.compile(fn, backend=backend, fullgraph=True)
    assert_same(compiled(*args), fn(*args))
    fresh = every_op_inputs(seed=10)
    assert_same(compiled(*fresh), fn(*fresh))


@pytest.mark.parametrize("fn", [every_op, every_op_forced], ids=["auto", "forced"])
def test_explain_no_graph_break(cpu_triton, fn):
    torch._dynamo.reset()
    explained = torch._dynamo.explain(fn)(*every_op_inputs())
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1


@pytest.mark.slow
def test_dynamic_no_recompile(cpu_triton):
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(every_op_forced, backend=counter, dynamic=True, fullgraph=True)
    for n in (6, 9, 17):
        args = every_op_inputs(n)
        assert_same(compiled(*args), every_op_forced(*args))
    assert counter.frame_count == 1


@pytest.mark.slow
def test_inductor_cpu(cpu_triton):
    """inductor itself (a C++ compiler generates the CPU kernels around the opaque ops)."""
    torch._dynamo.reset()
    args = every_op_inputs()
    compiled = torch.compile(every_op_forced, fullgraph=True)
    try:
        got = compiled(*args)
    except Exception as exc:  # noqa: BLE001 - only a missing C++ toolchain may skip
        if "C++ compiler" in str(exc) or "CppCompileError" in type(exc).__name__:
            pytest.skip(f"inductor cannot compile C++ here: {exc}")
        raise
    assert_same(got, every_op_forced(*args))


def aot_graphs(fn, *args, dynamic=False):
    """Run fn compiled through AOTAutograd; return its result and its graphs' code."""
    codes: list[str] = []

    def keep(gm, example_inputs):
        codes.append(gm.code)
        return gm.forward

    torch._dynamo.reset()
    backend = aot_autograd(fw_compiler=keep, bw_compiler=keep)
    result = torch.compile(fn, backend=backend, fullgraph=True, dynamic=dynamic)(*args)
    return result, codes


def prefer(op_name: str, call, winner: str) -> None:
    """Tune-cache timings (a real record, as `opselect warm` writes) that make `winner` the
    fastest backend for this call's key."""
    op = get_op(op_name)
    able = [c.name for c in op.plan(call) if c.supported]
    assert winner in able
    store().put_timings(op.name, call.info, call.key[1:], {
        n: (1e-6 if n == winner else 1.0, dict(op.backend(n).configs(call)[0]),
            op.backend(n).source_hash) for n in able})


def test_rule_dispatcher_choice_for_topk(cpu_triton):
    x = _t((8, 64))
    call = get_op("topk").prepare(x, 5)
    # The cost model picks torch on the CPU: the graph keeps aten.topk.
    (values, _), codes = aot_graphs(lambda t: ops.topk(t, 5), x)
    assert "aten.topk" in codes[0] and "opselect" not in codes[0]
    prefer("topk", call, "bitonic")
    opselect.forget()
    opselect.reset_stats()
    (values2, _), codes = aot_graphs(lambda t: ops.topk(t, 5), x)
    assert "opselect.topk" in codes[0] and "aten.topk" not in codes[0]
    assert torch.equal(values, values2)
    assert opselect.stats()["topk"]["backends"] == {"bitonic": 1}
    assert opselect.stats()["topk"]["traced"]["opselect"] >= 1


def test_rule_inductor_keeps_softmax_and_permute(cpu_triton, monkeypatch):
    x = _t((8, 64))
    prefer("softmax", get_op("softmax").prepare(x, -1), "fused")
    prefer("permute", get_op("permute").prepare(x, (1, 0)), "naive")

    def fn(t):
        return ops.softmax(t, -1) * 2, ops.permute(t, (1, 0)) + 1

    want = fn(x)
    got, codes = aot_graphs(fn, x)
    assert "opselect" not in codes[0] and "aten._softmax" in codes[0]
    assert_same(got, want)
    # "dispatcher": opselect's op wherever the dispatcher picks a Triton backend.
    monkeypatch.setattr(library, "COMPILED_RULE", "dispatcher")
    got, codes = aot_graphs(fn, x)
    assert "opselect.softmax.default" in codes[0] and "opselect.permute.default" in codes[0]
    assert_same(got, want)
    monkeypatch.setattr(library, "COMPILED_RULE", "aten")
    got, codes = aot_graphs(lambda t: ops.topk(t, 3, backend="bitonic").values, x)
    assert "opselect.topk" in codes[0]  # a forced backend is kept under every rule


def timings(op_name: str, call, seconds: dict) -> None:
    """Tune-cache timings for this call's key: `seconds` per backend, 1 s for the others."""
    op = get_op(op_name)
    able = [c.name for c in op.plan(call) if c.supported]
    store().put_timings(op.name, call.info, call.key[1:], {
        n: (seconds.get(n, 1.0), dict(op.backend(n).configs(call)[0]), op.backend(n).source_hash)
        for n in able})


@pytest.mark.parametrize("test_size, unique, seconds, placed", [
    # Below 10 * M**0.145 (M = 4096: 33) inductor compares all pairs: `compare` stands in.
    (16, False, {"hash": 0.95e-3, "compare": 1e-3}, False),  # not faster by TORCH_MARGIN
    (16, False, {"hash": 0.5e-3, "compare": 1e-3}, True),
    # Above it inductor sorts the test set and binary-searches: `search` stands in.
    (600, False, {"search": 0.5e-3, "hash": 0.9e-3}, False),  # the choice is inductor's algorithm
    (600, False, {"hash": 0.95e-3, "search": 1e-3}, False),
    (600, False, {"hash": 0.5e-3, "search": 1e-3}, True),
    (600, False, {"hash": 0.5e-3, "search": 1e-3, "compare": 0.4e-3}, True),  # compare: no
    # assume_unique: inductor sorts elements and test set together, as torch does.
    (600, True, {"hash": 0.5e-3, "search": 0.1e-3, "torch": 1e-3}, True),  # search chosen
    (600, True, {"hash": 0.5e-3, "search": 2e-3, "torch": 1e-3}, True),
    (600, True, {"hash": 0.95e-3, "search": 2e-3, "torch": 1e-3}, False),
])
def test_rule_isin_against_inductor(cpu_triton, test_size, unique, seconds, placed):
    """opselect.isin is placed only where the dispatcher's choice beats inductor's own kernels
    (estimated by the backend doing their work) by TORCH_MARGIN; measured times here."""
    a = _t((4096,), torch.int64, high=5000)
    b = _t((test_size,), torch.int64, 1, high=5000)
    timings("isin", get_op("isin").prepare(a, b, assume_unique=unique), seconds)
    opselect.forget()
    want = torch.isin(a, b, assume_unique=unique) if not unique else None
    got, codes = aot_graphs(lambda p, q: ops.isin(p, q, assume_unique=unique), a, b)
    assert ("opselect.isin" in codes[0]) == placed, codes[0]
    if want is not None:
        assert torch.equal(got, want)


@pytest.mark.parametrize("test_size, choice, keeps", [
    (16, "compare", True),  # inductor's all-pairs compare, fused
    (1024, "search", True),  # inductor's sort and binary search, fused
    (1_000_000, "hash", False),  # a hash set against a sort of 1e6 and 20-step searches
])
def test_rule_isin_from_the_cost_model(test_size, choice, keeps):
    """With no measured times the cost model's estimates are compared (an H100's defaults,
    16M int64 elements in narrow test sets)."""
    from opselect.dispatch.device import DeviceInfo
    from opselect.heuristics.device_model import defaults_for

    op = get_op("isin")
    model = defaults_for(DeviceInfo("cuda", 0, "NVIDIA H100", (9, 0), 132, 50 << 20, 0))
    args, kwargs = op.sample([[16 << 20], [test_size]], torch.int64, {}, torch.device("meta"))
    call = op.prepare(*args, **kwargs)
    candidates = op.plan(call, model, check_device=False)
    assert isin_front.isin_inductor_keeps(call, choice, candidates, model) is keeps


def test_rule_dynamic_shapes(cpu_triton):
    def fn(t):
        return ops.topk(t, 3).values, ops.softmax(t, -1)

    x = _t((8, 64))
    torch._dynamo.mark_dynamic(x, 0)
    got, codes = aot_graphs(fn, x)
    assert "opselect.topk" in codes[0] and "aten._softmax" in codes[0]
    assert_same(got, fn(x))


def test_compiled_softmax_backward_is_opselects(cpu_triton):
    x = _t((6, 40)).requires_grad_()
    g = _t((6, 40), seed=5)

    def fn(t):
        return ops.softmax(t * 2, -1, backend="fused") * 3, ops.log_softmax(t, 0, backend="strided")

    (y, ly), codes = aot_graphs(fn, x)
    (y * g).sum().add((ly * g).sum()).backward()
    got = x.grad.clone()
    x.grad = None
    ey, ely = fn(x)
    (ey * g).sum().add((ely * g).sum()).backward()
    torch.testing.assert_close(got, x.grad, rtol=1e-5, atol=1e-6)
    backward = [c for c in codes if "tangents" in c]
    assert backward and backward[0].count("opselect.softmax_backward") == 2


@pytest.mark.slow
def test_compiled_topk_and_permute_gradients(cpu_triton):
    x = _t((6, 40)).requires_grad_()

    def fn(t):
        v = ops.topk(t, 4, dim=0, backend="bitonic").values
        return (v * v).sum() + (ops.permute(t.view(2, 3, 40), (2, 0, 1)) * 3).sum()

    (out,), _ = (fn(x),), None
    out.backward()
    want = x.grad.clone()
    x.grad = None
    torch._dynamo.reset()
    torch.compile(fn, backend="aot_eager", fullgraph=True)(x).backward()
    torch.testing.assert_close(x.grad, want)


def test_compiled_errors_name_the_argument(cpu_triton):
    x = _t((4, 8))
    torch._dynamo.reset()
    with pytest.raises(Exception, match="nope"):
        torch.compile(lambda t: ops.softmax(t, -1, backend="nope"), backend="eager",
                      fullgraph=True)(x)
    torch._dynamo.reset()
    with pytest.raises(Exception, match="out of range"):
        torch.compile(lambda t: ops.topk(t, 3, dim=5), backend="aot_eager", fullgraph=True)(x)


def test_capturing_is_false_off_cuda():
    from opselect.dispatch.device import device_info

    assert not tuning_mode.capturing(device_info(torch.device("cpu")))


# ---------------------------------------------------------------------------------------------
# GPU: inductor, dynamic shapes, reduce-overhead, CUDA graphs
# ---------------------------------------------------------------------------------------------
GPU_MODES = [dict(), dict(fullgraph=True), dict(dynamic=True, fullgraph=True),
             dict(mode="reduce-overhead", fullgraph=True)]


@pytest.mark.gpu
@pytest.mark.parametrize("options", GPU_MODES, ids=["default", "fullgraph", "dynamic",
                                                    "reduce-overhead"])
@pytest.mark.parametrize("fn", [every_op, every_op_forced], ids=["auto", "forced"])
def test_gpu_inductor(cuda, options, fn):
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("inductor")
    if "mode" in options:
        compiled = torch.compile(fn, **options)
    else:
        compiled = torch.compile(fn, backend=counter, **options)
    sizes = (64, 96, 160) if options.get("dynamic") else (64, 64, 64)
    for i, n in enumerate(sizes):
        args = every_op_inputs(n, device="cuda", seed=i)  # new values (and sizes) each call
        got = compiled(*args)
        got = tuple(t.clone() for t in got)  # reduce-overhead reuses its output buffers
        assert_same(got, fn(*args))
    if "mode" not in options:
        assert counter.frame_count == 1
    torch._dynamo.reset()
    assert torch._dynamo.explain(fn)(*every_op_inputs(64, "cuda")).graph_break_count == 0


def _gpu_cases():
    """(name, fn, make inputs) of one call per op on the GPU."""
    def x(shape, dtype=torch.float32):
        return lambda: torch.randn(shape, device="cuda", dtype=dtype)

    return [
        ("softmax", lambda t: ops.softmax(t, -1), x((256, 3000))),
        ("log_softmax dim0", lambda t: ops.log_softmax(t, 0), x((300, 64, 9), torch.bfloat16)),
        ("topk", lambda t: ops.topk(t, 50).values, x((64, 32000))),
        ("topk long row", lambda t: ops.topk(t, 16).values, x((1, 1 << 20))),
        ("isin", lambda t: ops.isin(t, torch.arange(0, 1 << 20, 7, device="cuda")),
         lambda: torch.randint(0, 1 << 20, (1 << 20,), device="cuda")),
        ("permute", lambda t: ops.permute(t, (0, 2, 1, 3)), x((8, 128, 12, 64), torch.float16)),
    ]


@pytest.mark.gpu
@pytest.mark.parametrize("first_seen", [False, True], ids=["decided-before", "first-seen"])
@pytest.mark.parametrize("case", _gpu_cases(), ids=lambda c: c[0])
def test_gpu_cuda_graph_capture(cuda, case, first_seen, monkeypatch):
    """Capture a call, replay it with new input values. A key first seen during capture is
    decided from the cache or the model: tuning mode is on, yet nothing is measured."""
    name, fn, make = case
    static = make()
    if not first_seen:
        fn(static)  # decided (and its kernels compiled) before capture
    torch.cuda.synchronize()
    measured = []
    original = tuning_mode.measure_all

    def watch(items, device, **kw):  # the real measure_all, watched
        measured.append([what for what, _ in items])
        return original(items, device, **kw)

    monkeypatch.setattr(tuning_mode, "measure_all", watch)
    graph = torch.cuda.CUDAGraph()
    with tuning(), torch.cuda.graph(graph):
        out = fn(static)
    assert measured == []
    for _ in range(2):
        fresh = make()
        static.copy_(fresh)
        graph.replay()
        torch.cuda.synchronize()
        ref = _reference(name, fresh)
        if ref.dtype.is_floating_point:
            torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=1e-5)
        else:
            assert torch.equal(out, ref)
    call_of = {"softmax": "softmax", "log_softmax dim0": "log_softmax", "topk": "topk",
               "topk long row": "topk", "isin": "isin", "permute": "permute"}
    if first_seen:
        op = get_op(call_of[name])
        assert all(c.source in ("model", "cache+model", "only candidate")
                   for c in [*op._memo.values(), *op._cold.values()])


def _reference(name: str, t: torch.Tensor) -> torch.Tensor:
    if name == "softmax":
        return torch.softmax(t, -1)
    if name == "log_softmax dim0":
        return torch.log_softmax(t, 0)
    if name == "topk":
        return torch.topk(t, 50).values
    if name == "topk long row":
        return torch.topk(t, 16).values
    if name == "isin":
        return torch.isin(t, torch.arange(0, 1 << 20, 7, device="cuda"))
    return t.permute(0, 2, 1, 3).contiguous()
