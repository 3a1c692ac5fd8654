"""matmul / linear calls (opselect/kernels/matmul/call.py and the dispatcher around them): torch's
argument rules, calls only torch takes, configs refused, what each backend takes, keys, the
prepared-call memo, routes, the sample and replay functions, and the cost model.

The kernels' numerics are tests/test_matmul.py's, whose helpers these tests share.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from opselect.errors import ArgumentTypeError, BackendError, InvalidArgument, TorchOnlyCall
from opselect.fronts._base import _torch_answers
from opselect.heuristics.device_model import defaults_for, known_gpu
from opselect.kernels.matmul import (CALIBRATION_LINEAR, CALIBRATION_MATMUL, LINEAR_OP,
                                     MATMUL_OP, plain_key, prepare_addmm, replay, sample_linear,
                                     sample_matmul)
from opselect.kernels.matmul.splitk import MAX_TILES

import test_matmul as base
from test_matmul import OPS, TORCH, TRITON, check, prepare, rand

poisoned, tf32_off = base.poisoned, base.tf32_off  # (its autouse fixtures, here too)

H200 = known_gpu("H200")


def meta(*shape, dtype=torch.bfloat16):
    return torch.empty(shape, dtype=dtype, device="meta")


# ---------------------------------------------------------------------------------------------
# torch's argument rules
# ---------------------------------------------------------------------------------------------
BAD = {
    # name: (form, args, error class, words the message names)
    "inner dims": ("matmul", lambda: (rand(3, 4), rand(5, 6)), InvalidArgument,
                   ["input", "other", "(3, 4)", "(5, 6)"]),
    "inner dims, 1-d other": ("matmul", lambda: (rand(3, 4), rand(5)), InvalidArgument,
                              ["input", "other", "only"]),
    "inner dims, batched": ("matmul", lambda: (rand(2, 3, 4), rand(2, 5, 6)), InvalidArgument,
                            ["input", "other"]),
    "batch dims": ("matmul", lambda: (rand(2, 3, 4), rand(3, 4, 5)), InvalidArgument,
                   ["batch dims", "broadcast"]),
    "0-d": ("matmul", lambda: (rand(), rand(3)), InvalidArgument, ["at least 1D", "0D"]),
    "not a tensor": ("matmul", lambda: (rand(3, 4), [[1.0]] * 4), ArgumentTypeError,
                     ["other", "list"]),
    "linear in_features": ("linear", lambda: (rand(3, 4), rand(5, 6), None), InvalidArgument,
                           ["input", "weight", "(5, 6)"]),
    "linear 0-d input": ("linear", lambda: (rand(), rand(5, 1), None), InvalidArgument,
                         ["input", "0-d"]),
    "addmm inner dims": ("addmm", lambda: (rand(6), rand(3, 4), rand(5, 6)), InvalidArgument,
                         ["mat1", "mat2", "(3, 4)", "(5, 6)"]),
    "addmm 3-d": ("addmm", lambda: (rand(6), rand(2, 3, 4), rand(4, 6)), InvalidArgument,
                  ["mat1", "mat2", "2-d"]),
}


@pytest.mark.parametrize("name", list(BAD))
def test_argument_errors_as_torch(name):
    """Where torch raises, the call raises an error of torch's class (InvalidArgument is a
    RuntimeError, ArgumentTypeError a TypeError) whose message names the arguments."""
    form, make, error, words = BAD[name]
    args = make()
    with pytest.raises(Exception) as theirs:
        TORCH[form](*args)
    with pytest.raises(error) as ours:
        prepare(form, args)
    assert isinstance(ours.value, type(theirs.value)), (theirs.value, ours.value)
    for word in words:
        assert word in str(ours.value), (word, str(ours.value))


def only_torch():
    """(name, form, args): calls the kernels do not take, which torch answers."""
    r = rand
    neg = torch._neg_view(r(4, 5))
    assert neg.is_neg()
    return [
        ("float64", "matmul", (r(3, 4).double(), r(4, 5).double())),
        ("int64", "matmul", (torch.arange(12).view(3, 4), torch.arange(20).view(4, 5))),
        ("int32 linear", "linear", (torch.ones(3, 4, dtype=torch.int32),
                                    torch.ones(5, 4, dtype=torch.int32), None)),
        ("complex", "matmul", (r(3, 4).to(torch.complex64), r(4, 5).to(torch.complex64))),
        ("float64 linear", "linear", (r(3, 4).double(), r(5, 4).double(), r(5).double())),
        ("float64 addmm", "addmm", (r(5).double(), r(3, 4).double(), r(4, 5).double())),
        ("a negative view", "matmul", (r(3, 4), neg)),
        ("1-d weight", "linear", (r(3, 4), r(4), None)),
        ("(m, n) addmm input", "addmm", (r(3, 5), r(3, 4), r(4, 5))),
        ("(1, n) linear bias", "linear", (r(3, 4), r(5, 4), r(1, 5))),
    ]


@pytest.mark.parametrize("case", only_torch(), ids=lambda c: c[0])
def test_calls_only_torch_takes(cpu_triton, case):
    """A call the kernels do not take is TorchOnlyCall: the front hands it to torch (auto and a
    forced torch answer as torch does) and refuses a forced Triton backend, saying why."""
    name, form, args = case
    with pytest.raises(TorchOnlyCall) as why:
        prepare(form, args)
    want = TORCH[form](*args)
    op = OPS[form]
    for backend in (None, "auto", "torch"):
        got = _torch_answers(op, backend, why.value, lambda: TORCH[form](*args))
        assert torch.equal(got, want), (name, backend)
    for backend in TRITON:
        with pytest.raises(BackendError, match=re.escape(str(why.value))):
            _torch_answers(op, backend, why.value, lambda: TORCH[form](*args))
    if "float64" in name:
        assert "float64" in str(why.value)


def test_mixed_dtypes_and_addmm_scalars_go_to_torch():
    with pytest.raises(TorchOnlyCall, match="float16"):
        MATMUL_OP.prepare(rand(3, 4), rand(4, 5).half())
    with pytest.raises(TorchOnlyCall, match="beta and alpha"):
        prepare_addmm(rand(5), rand(3, 4), rand(4, 5), beta=0.5)
    with pytest.raises(TorchOnlyCall, match="beta and alpha"):
        prepare_addmm(rand(5), rand(3, 4), rand(4, 5), alpha=2)
    assert prepare_addmm(rand(5), rand(3, 4), rand(4, 5), beta=1.0, alpha=1).n == 5
    assert plain_key("matmul", rand(3, 4), torch._neg_view(rand(4, 5))) is None


@pytest.mark.parametrize("backend", TRITON)
def test_configs_with_unknown_or_missing_keys_are_refused(cpu_triton, backend):
    """A config is data (a tune record, a script): run and bind refuse a key the backend does
    not read, and one without a key it needs (check_config), before any plan."""
    a, b = rand(5, 300), rand(300, 40)
    call = prepare("matmul", (a, b))
    be = MATMUL_OP.backend(backend)
    good = dict(be.configs(call)[0])
    for config, why in (({**good, "BLOCK_M": 64}, "are not this backend's"),
                        ({k: v for k, v in good.items() if k != "block_k"}, "are missing"),
                        ({**good, "programs_per_sm" if backend != "persistent" else "split": 2},
                         "are not this backend's")):
        with pytest.raises(InvalidArgument, match=why):
            be.run(call, config)
        with pytest.raises(InvalidArgument, match=why):
            be.bind(call, config)
    check(be.run(call, good), "matmul", (a, b), backend)


# ---------------------------------------------------------------------------------------------
# what each backend takes
# ---------------------------------------------------------------------------------------------
def test_what_each_backend_takes():
    big_batch = MATMUL_OP.prepare(meta(65536, 2, 16), meta(65536, 16, 2))
    short_k = MATMUL_OP.prepare(meta(4, 255), meta(255, 64))
    many_tiles = MATMUL_OP.prepare(meta(4096, 4096), meta(4096, 4096))
    assert MAX_TILES < (4096 // 16) * (4096 // 32)
    # (tiled folds the batch into its one grid dim: no limit of 65535 entries)
    for call, takes in ((big_batch, {"torch", "tiled", "persistent"}),
                        (short_k, {"torch", "tiled", "persistent"}),
                        (many_tiles, {"torch", "tiled", "persistent"})):
        verdicts = {b.name: b.supports(call) for b in MATMUL_OP.backends}
        assert {n for n, v in verdicts.items() if v is None} == takes, verdicts
    assert "too short" in MATMUL_OP.backend("splitk").supports(big_batch)
    assert "k = 255" in MATMUL_OP.backend("splitk").supports(short_k)
    assert "counters" in MATMUL_OP.backend("splitk").supports(many_tiles)
    # A decode product with a long k is split-k's.
    assert MATMUL_OP.backend("splitk").supports(
        MATMUL_OP.prepare(meta(1, 4096), meta(4096, 11008))) is None


def test_a_forced_backend_that_cannot_take_the_call_says_why(cpu_triton):
    a, b = rand(4, 100), rand(100, 7)
    with pytest.raises(BackendError, match=r"splitk.*k = 100.*Backends that can: torch, tiled, "
                                           r"persistent"):
        MATMUL_OP(a, b, backend="splitk")
    with pytest.raises(BackendError, match="unknown backend 'nope'"):
        MATMUL_OP(a, b, backend="nope")


@pytest.mark.parametrize("first, second", [
    (((65535, 1, 16), (65535, 16, 1)), ((65536, 1, 16), (65536, 16, 1))),
    (((2, 256), (256, 3)), ((2, 255), (255, 3))),
    (((2, 257), (257, 3)), ((2, 512), (512, 3))),
    (((40, 300), (300, 1000)), ((40, 300), (300, 1024))),
    (((16, 4096), (4096, 30000)), ((16, 4096), (4096, 32768))),
    (((3, 100, 300), (300, 200)), ((3, 128, 300), (300, 250))),
], ids=["batch 65535 / 65536", "k 256 / 255", "k 257 / 512", "n 1000 / 1024", "n 30000 / 32768",
        "folded rows 300 / 384"])
def test_a_backend_takes_every_call_of_a_key_or_none(first, second):
    """The dispatcher remembers a forced (and a tuned) choice per call key: a backend must take
    all the calls of one key or none of them, or a later call of the key runs a backend whose
    supports() refuses it (before the limits sat on bucket edges: tiled at a batch of 65536,
    a grid dim past CUDA's 65535; splitk at k = 255)."""
    one = MATMUL_OP.prepare(*(torch.zeros(s, device="meta") for s in first))
    two = MATMUL_OP.prepare(*(torch.zeros(s, device="meta") for s in second))
    assert one.key == two.key
    for be in MATMUL_OP.backends:
        assert (be.supports(one) is None) == (be.supports(two) is None), \
            (be.name, be.supports(one), be.supports(two))


# ---------------------------------------------------------------------------------------------
# keys, the prepared-call memo, routes
# ---------------------------------------------------------------------------------------------
def test_call_facts_and_keys():
    a, b = rand(3, 17, 40), rand(40, 33)
    call = prepare("matmul", (a, b))
    assert (call.batch, call.m, call.n, call.k, call.out_shape) == (1, 51, 33, 40, (3, 17, 33))
    assert call.layout == (True, False) and call.flops == 2 * 51 * 33 * 40
    assert "matmul: (51 x 40) @ (40 x 33) float32" in call.describe()
    weight = prepare("linear", (rand(17, 40), rand(33, 40), rand(33)))
    assert weight.layout == (True, True) and weight.key != call.key  # the layout, the bias
    assert "+ bias" in weight.describe()
    batched = prepare("matmul", (rand(3, 17, 40), rand(3, 40, 33)))
    assert batched.batch == 3 and "3 x (17 x 40)" in batched.describe()
    # Sizes in one bucket share a key; the exact facts (the plan's) differ.
    c1, c2 = prepare("matmul", (rand(3, 300), rand(300, 70))), \
        prepare("matmul", (rand(3, 290), rand(290, 70)))
    assert c1.key == c2.key and c1.exact != c2.exact
    # Strides are facts of the exact call: a transposed B is another plan.
    c3 = prepare("matmul", (rand(3, 300), rand(70, 300).t()))
    assert c3.key != c1.key and c3.exact != c1.exact


def test_the_memo_prepares_a_plain_call_once_and_keeps_no_tensor(cpu_triton):
    from opselect.kernels.matmul import call as mm_call

    a, b = rand(5, 17, 40), rand(40, 33)
    first = prepare("matmul", (a, b))
    a2, b2 = rand(5, 17, 40), rand(40, 33)
    second = prepare("matmul", (a2, b2))
    assert second is not first and second.exact == first.exact
    assert second.a is a2 and second.b is b2 and second.a_src is a2
    check(MATMUL_OP.run(second, "tiled"), "matmul", (a2, b2), "memoised call")
    for kept in mm_call._PREPARED.values():
        assert all(getattr(kept, name) is None for name in ("a", "b", "bias", "a_src", "b_src"))
    # A call that reads a copy is prepared afresh every time (its copy is of these tensors).
    x = rand(4, 3, 5, 40).transpose(0, 1)
    y = rand(3, 4, 40, 6)
    c1 = prepare("matmul", (x, y))
    x2 = rand(4, 3, 5, 40).transpose(0, 1)
    c2 = prepare("matmul", (x2, y))
    assert c1.copied and c2.copied and c2.a_src is not c1.a_src
    check(MATMUL_OP.run(c2, "tiled"), "matmul", (x2, y), "copied call")


def route_cases():
    r = rand
    return [
        ("matmul", lambda: (r(17, 300), r(300, 40))),
        ("matmul", lambda: (r(2, 5, 300), r(300))),
        ("linear", lambda: (r(3, 300), r(40, 300), r(40))),
        ("linear", lambda: (r(300), r(40, 300), None)),
        ("addmm", lambda: (r(1, 40), r(7, 300), r(300, 40))),
    ]


@pytest.mark.parametrize("backend", TRITON)
@pytest.mark.parametrize("case", range(len(route_cases())))
def test_forced_route_answers_new_tensors(cpu_triton, case, backend):
    """A forced backend's first call installs its prepared call under the call's plain key
    (Op.forced_routes); the next call of that key, with new tensors, goes straight through it
    and answers for the new tensors."""
    form, make = route_cases()[case]
    op = OPS[form]

    def plain(args):
        if form == "addmm":
            return plain_key("addmm", args[1], args[2], args[0])
        return plain_key(form, *args)

    args = make()
    key = plain(args)
    check(op.run(prepare(form, args), backend, key), form, args, f"{backend} first call")
    route = op.forced_routes[(backend, key)]
    assert callable(route)
    fresh = make()
    assert plain(fresh) == key
    ordered = (fresh[1], fresh[2], fresh[0]) if form == "addmm" else fresh
    got = route(*[t for t in ordered if t is not None])
    check(got, form, fresh, f"{backend} routed call")


def test_no_route_for_a_copied_call_and_torchs_route_on_the_cpu(cpu_triton):
    x, y = rand(4, 3, 5, 40).transpose(0, 1), rand(3, 4, 40, 6)
    key = plain_key("matmul", x, y)
    check(MATMUL_OP.run(prepare("matmul", (x, y)), "tiled", key), "matmul", (x, y), "copied")
    assert ("tiled", key) not in MATMUL_OP.forced_routes
    # auto on the CPU: torch's op, whose route the front answers itself (None)
    a, b = rand(5, 300), rand(300, 7)
    key = plain_key("matmul", a, b)
    check(MATMUL_OP.run(prepare("matmul", (a, b)), None, key), "matmul", (a, b), "auto")
    assert MATMUL_OP.routes[key] == (None, False, "torch", None)
    # the tf32 switch is part of the key: another route
    torch.backends.cuda.matmul.allow_tf32 = True
    assert plain_key("matmul", a, b) != key


# ---------------------------------------------------------------------------------------------
# sample, replay, calibration shapes
# ---------------------------------------------------------------------------------------------
def test_sample_and_replay(cpu_triton):
    cpu = torch.device("cpu")
    (a, b), kw = sample_matmul([[4, 6], [6, 5]], torch.float16, {"transpose_b": True}, cpu)
    assert kw == {} and a.shape == (4, 6) and b.shape == (6, 5) and b.stride() == (1, 6)
    assert a.dtype == b.dtype == torch.float16
    (x, w, bias), _ = sample_linear([[3, 8], [5, 8]], torch.bfloat16, {}, cpu)
    assert (x.shape, w.shape, bias.shape) == ((3, 8), (5, 8), (5,))
    (_, _, none), _ = sample_linear([[3, 8], [5, 8]], torch.float32, {"bias": False}, cpu)
    assert none is None
    for bad in ({"transpose_c": True},):
        with pytest.raises(InvalidArgument, match="unknown options"):
            sample_matmul([[4, 6], [6, 5]], torch.float32, bad, cpu)
    with pytest.raises(InvalidArgument, match="two shapes"):
        sample_linear([[3, 8]], torch.float32, {}, cpu)
    # replay: the public call (ops.matmul's or ops.linear's arguments) a prepared call came from
    for form, args in (("matmul", (rand(3, 4, 8), rand(8))),
                       ("linear", (rand(3, 8), rand(5, 8), rand(5))),
                       ("addmm", (rand(1, 5), rand(3, 8), rand(8, 5))),
                       ("addmm", (rand(), rand(3, 8), rand(8, 5)))):
        rargs, rkw = replay(prepare(form, args))
        public = torch.matmul if form == "matmul" else F.linear
        assert rkw == {}
        torch.testing.assert_close(public(*rargs), TORCH[form](*args))


def test_calibration_shapes_prepare():
    for op, shapes_list in ((MATMUL_OP, CALIBRATION_MATMUL), (LINEAR_OP, CALIBRATION_LINEAR)):
        assert op.calibration == list(shapes_list)
        for shapes, dtype, options in shapes_list:
            args, kwargs = op.sample(shapes, dtype, dict(options), torch.device("meta"))
            call = op.prepare(*args, **kwargs)
            assert not call.empty and call.dtype == dtype


# ---------------------------------------------------------------------------------------------
# the cost model
# ---------------------------------------------------------------------------------------------
def model_calls():
    f16, f32 = torch.float16, torch.float32
    return {
        "decode linear": (LINEAR_OP, (meta(1, 4096), meta(11008, 4096), meta(11008))),
        "decode 16 rows": (LINEAR_OP, (meta(16, 4096), meta(4096, 4096), None)),
        "prefill linear": (LINEAR_OP, (meta(2048, 4096), meta(4096, 4096), meta(4096))),
        "square": (MATMUL_OP, (meta(4096, 4096), meta(4096, 4096))),
        "odd": (MATMUL_OP, (meta(1000, 3000, dtype=f16), meta(3000, 777, dtype=f16))),
        "batched": (MATMUL_OP, (meta(8, 512, 512, dtype=f32), meta(8, 512, 512, dtype=f32))),
        "broadcast batch": (MATMUL_OP, (meta(8, 1, 128, 64), meta(4, 64, 128))),
        "tiny": (MATMUL_OP, (meta(3, 5), meta(5, 7))),
    }


@pytest.mark.parametrize("name", list(model_calls()))
def test_every_cost_is_finite_and_positive_on_an_h200(name):
    op, args = model_calls()[name]
    call = op.prepare(*args)
    call.info = H200
    model = defaults_for(H200)
    able = 0
    for backend in op.backends:
        if backend.supports(call) is not None:
            continue
        est = backend.cost(call, model)
        assert math.isfinite(est.seconds) and est.seconds > 0, (name, backend.name, est)
        assert all(math.isfinite(v) and v >= 0 for v in est.parts.values()), est.parts
        assert "launch" in est.parts, est.parts
        if backend.name == "splitk":
            assert est.parts["partials"] > 0
        able += 1
    assert able >= 2
    decision = op.what_if(op.prepare(*args), H200)
    able = [c for c in decision.candidates if c.supported]
    chosen = decision.candidate(decision.choice)
    assert chosen in able
    # the fastest predicted, unless torch is within the dispatcher's margin of it
    assert chosen.name == "torch" or chosen.predicted_s == min(c.predicted_s for c in able)
    assert "NVIDIA H200" in decision.call


def test_costs_grow_with_the_work():
    model = defaults_for(H200)

    def seconds(op, args, backend):
        call = op.prepare(*args)
        call.info = H200
        return op.backend(backend).cost(call, model).seconds

    for backend in ("torch", "tiled", "persistent"):
        small = seconds(MATMUL_OP, (meta(2048, 2048), meta(2048, 2048)), backend)
        big = seconds(MATMUL_OP, (meta(8192, 8192), meta(8192, 8192)), backend)
        assert big > 8 * small, (backend, small, big)
    # float32 without tf32 runs on the FMA units: slower than with tf32 at the same size
    f32 = (meta(4096, 4096, dtype=torch.float32), meta(4096, 4096, dtype=torch.float32))
    strict = seconds(MATMUL_OP, f32, "tiled")
    torch.backends.cuda.matmul.allow_tf32 = True
    assert seconds(MATMUL_OP, f32, "tiled") < strict / 2


def test_on_the_cpu_auto_picks_torch(cpu_triton):
    for form, args in (("matmul", (rand(20, 300), rand(300, 40))),
                       ("linear", (rand(2, 20, 64), rand(40, 64), rand(40))),
                       ("addmm", (rand(40), rand(20, 300), rand(300, 40)))):
        call = prepare(form, args)
        decision = OPS[form].decide(call)
        assert decision.choice == "torch", decision.choice
        assert {c.name for c in decision.candidates if c.supported} >= {"torch", "tiled"}
        check(OPS[form].run(call), form, args, "auto")
        assert OPS[form].chosen(call).backend.name == "torch"


_TF32_SWITCHES = """
import os
os.environ["TRITON_INTERPRET"] = "1"
import torch
from opselect.kernels.matmul import MATMUL_OP
a = torch.randn(3, 3)
seen = [MATMUL_OP.prepare(a, a).tf32]
torch.set_float32_matmul_precision("high")  # the legacy switch
seen.append(MATMUL_OP.prepare(a, a).tf32)
torch.set_float32_matmul_precision("highest")
seen.append(MATMUL_OP.prepare(a, a).tf32)
torch.backends.cuda.matmul.fp32_precision = "tf32"  # torch's own switch since 2.9
seen.append(MATMUL_OP.prepare(a, a).tf32)
torch.backends.cuda.matmul.fp32_precision = "ieee"
seen.append(MATMUL_OP.prepare(a, a).tf32)
print(seen)
"""


@pytest.mark.slow
def test_tf32_follows_both_of_torchs_switches():
    """tf32 as torch's float32 matmuls read it, set the legacy way or through the new
    fp32_precision switch (after which torch's legacy getter raises: reading it failed every
    float32 call's key until 00ce469). A process of its own: the switches are global."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, "-c", _TF32_SWITCHES], capture_output=True, text=True,
                         timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-800:]
    assert out.stdout.strip().splitlines()[-1] == "[False, True, False, True, False]"
