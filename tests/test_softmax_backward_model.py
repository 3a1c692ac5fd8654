"""softmax's cost model under autograd: every backend's estimate adds the backward it runs.

Tuning times forward + backward when the input requires grad (kernels/softmax/autograd.py,
`_with_backward`), so the model must too: these tests read the estimates the real backends give
for calls on an H200 (meta tensors, the default constants), and check them against the passes the
backward kernels make. The last test runs the backward kernels through the interpreter and checks
that the path the model charges is the one autograd launches.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from opselect import ops
from opselect.dispatch import get_op
from opselect.dispatch.device import DeviceInfo
from opselect.heuristics import softmax as cost
from opselect.heuristics.device_model import defaults_for
from opselect.kernels import softmax as sm
from opselect.kernels._common import Launcher

pytestmark = [
    # The interpreter runs kernels in numpy, which warns on -inf - -inf in padded rows.
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
]

H200 = DeviceInfo("cuda", 0, "NVIDIA H200", (9, 0), 132, 60 << 20, 0)
MODEL = defaults_for(H200)  # no calibration scales: the model's own terms

# Large calls, one per backward path (4K x 4K bf16 is host-bound for Triton under autograd).
LARGE = [
    ((4096, 4096), -1, torch.float32),  # rows in registers
    ((4096, 4096), -1, torch.bfloat16),
    ((1 << 20, 64), -1, torch.float32),  # many short rows, many to a tile
    ((256, 65536), -1, torch.float32),  # many long rows, lagged
    ((256, 1 << 19), -1, torch.float32),  # longer rows, two passes
    ((32, 1 << 20), -1, torch.float32),  # few long rows, split over programs
    ((64, 512, 512), 1, torch.float16),  # strided tiles
    ((8, 8192, 256), 1, torch.float32),  # strided, two passes over the dim
]


def _call(shape, dim=-1, dtype=torch.float32, *, grad: bool, log: bool = False, out=None):
    x = torch.empty(shape, dtype=dtype, device="meta", requires_grad=grad)
    call = (sm.prepare_log_softmax if log else sm.prepare_softmax)(x, dim, dtype=out)
    call.info = H200  # plans read the SM count of the device asked about
    return call


def _estimates(call) -> dict:
    op = get_op("log_softmax" if call.log else "softmax")
    return {b.name: b.cost(call, MODEL) for b in op.backends if b.supports(call) is None}


def _backward_s(est) -> float:
    return sum(v for k, v in est.parts.items() if k.startswith("backward"))


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("shape,dim,dtype", LARGE)
def test_grad_adds_at_least_the_backward_traffic(shape, dim, dtype, log):
    plain = _estimates(_call(shape, dim, dtype, grad=False, log=log))
    grad = _estimates(_call(shape, dim, dtype, grad=True, log=log))
    assert set(plain) == set(grad) and len(grad) >= 2, grad
    numel = torch.Size(shape).numel()
    # Every backward reads y and dy and writes dx at least once.
    traffic = 3 * numel * dtype.itemsize / MODEL.bandwidth
    for name, est in grad.items():
        assert "backward" in est.parts, (name, est.parts)
        assert not any(k.startswith("backward") for k in plain[name].parts), name
        assert any(note.startswith("backward: ") for note in est.notes), (name, est.notes)
        added = est.seconds - plain[name].seconds
        assert added >= traffic, (name, added, traffic)
        # The forward is charged alike with and without grad; the difference is the backward.
        for part, seconds in plain[name].parts.items():
            if part != "launch":
                assert est.parts[part] == pytest.approx(seconds), (name, part)
        device = sum(v for k, v in est.parts.items() if k != "launch")
        plain_device = sum(v for k, v in plain[name].parts.items() if k != "launch")
        assert device - plain_device == pytest.approx(_backward_s(est)), (name, est.parts)


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("shape,dim,dtype", LARGE)
def test_triton_backends_share_one_backward(shape, dim, dtype, log):
    # autograd.backward runs the same kernels whichever Triton backend ran the forward.
    grad = _estimates(_call(shape, dim, dtype, grad=True, log=log))
    triton = [est for name, est in grad.items() if name != "torch"]
    assert triton
    for est in triton[1:]:
        assert {k: v for k, v in est.parts.items() if k.startswith("backward")} == \
               {k: v for k, v in triton[0].parts.items() if k.startswith("backward")}
        assert est.notes == triton[0].notes


def _bwd(shape, dim=-1, dtype=torch.float32, *, log=False, out=None) -> dict:
    """Seconds of each backend's backward parts."""
    return {name: _backward_s(est) for name, est in
            _estimates(_call(shape, dim, dtype, grad=True, log=log, out=out)).items()}


def test_backward_ordered_as_the_kernels_passes():
    shape = (4096, 4096)
    soft, log = _bwd(shape), _bwd(shape, log=True)
    # torch's softmax backward forms dy * y first (3 passes), then its kernel reads the product
    # and y and writes dx (3 more); the Triton kernel reads y and dy and writes dx: 3.
    assert soft["torch"] > 1.8 * soft["fused"]
    # log_softmax has no product pass: between the Triton kernel and torch's softmax.
    assert soft["fused"] <= log["torch"] < 0.7 * soft["torch"]
    # Rows in registers: softmax and log_softmax move the same bytes.
    assert soft["fused"] == pytest.approx(log["fused"])
    # Long rows in two passes or split: softmax's sum pass reads y as well as dy.
    for long_rows in ((256, 1 << 19), (32, 1 << 20)):  # (not lagged: 256 chunks a row)
        assert _bwd(long_rows)["online"] > 1.1 * _bwd(long_rows, log=True)["online"]
    # Two passes cost more than one, per byte.
    per_byte = {s: _bwd(s)["online" if s[1] > 32768 else "fused"] / (s[0] * s[1])
                for s in ((4096, 16384), (256, 1 << 19))}
    assert per_byte[(256, 1 << 19)] > 1.2 * per_byte[(4096, 16384)]
    # Over a non-last dim torch's spatial kernel walks the dim serially in every thread.
    strided = _bwd((64, 512, 512), dim=1)
    assert strided["torch"] > 2 * strided["strided"]
    # The walk is longer for a longer dim at the same size: torch's backward grows with it,
    # faster than the strided kernel's (whose tiles then take the dim in two passes).
    longer = _bwd((16, 2048, 512), dim=1)
    assert longer["torch"] > 2.5 * strided["torch"]
    assert longer["torch"] / strided["torch"] > 1.5 * longer["strided"] / strided["strided"]


def test_casts_under_autograd():
    shape = (4096, 4096)
    # A narrowing dtype= is done by torch first (Triton) or by torch's op (torch): the gradient
    # is cast back, once more over the tensor.
    narrow = _estimates(_call(shape, dtype=torch.float32, grad=True, out=torch.bfloat16))
    numel = 4096 * 4096
    for name, est in narrow.items():
        assert est.parts["backward_cast"] == pytest.approx(MODEL.stream(numel * (2 + 4))), name
    # A widening half -> float is fused (the Triton load, torch's half_to_float): dx is written
    # in half directly, with no cast and fewer bytes than a float dx.
    wide = _estimates(_call(shape, dtype=torch.float16, grad=True, out=torch.float32))
    same = _bwd(shape, dtype=torch.float32)
    for name, est in wide.items():
        assert "backward_cast" not in est.parts, name
        assert _backward_s(est) < same[name], name


def test_strided_backward_plan_is_the_kernels():
    # The heuristics cannot import the kernels: the model's copy of the backward's plan, and
    # the limits it reads, must stay the kernels'.
    assert cost.BWD_SINGLE_MAX == sm.autograd.BWD_SINGLE_MAX
    assert cost.BWD_SINGLE_MAX_F64 == sm.autograd.BWD_SINGLE_MAX_F64
    assert cost.BWD_MULTIROW_MAX == sm.common.MULTIROW_MAX
    assert cost.BWD_STRIDED_TILE == sm.common.TILE_MAX // 2
    for n, inner, outer, itemsize, sms in itertools.product(
            (1, 3, 64, 300, 512, 4096, 70000), (2, 7, 48, 512, 65536), (1, 5, 64, 1000),
            (2, 4, 8), (2, 132)):
        kernel = sm._strided_plan(n, inner, outer, itemsize, sms, tile=sm.common.TILE_MAX // 2)
        model = cost.strided_backward_plan(n, inner, outer, itemsize, sms)
        assert model == kernel, (n, inner, outer, itemsize, sms)


@pytest.mark.parametrize("shape,dtype,log,lagged", [
    ((1024, 131072), torch.bfloat16, False, True),
    ((4096, 32000), torch.bfloat16, True, True),
    ((8192, 50257), torch.float16, False, True),  # off the grid: shifted vectors
    ((1024, 151936), torch.float32, False, True),
    ((64, 128256), torch.bfloat16, False, True),  # 2,048 programs
    ((63, 128256), torch.bfloat16, False, False),  # 2,016: split over programs
    ((1024, 16384), torch.bfloat16, False, False),  # rows in registers
    ((2, 1 << 20), torch.float32, False, False),  # 512 chunks a row
    ((512, 65536), torch.float64, False, False),  # float64: two passes
])
def test_model_and_autograd_take_the_lagged_backward_alike(monkeypatch, shape, dtype, log,
                                                          lagged):
    """The model charges the lagged backward exactly where autograd's prepared backward runs it
    (an H200's geometry), at the lagged rate: below the two-pass rows kernel's estimate, which
    re-reads rows from memory (the H200 measured 1.3x; fits/softmax.md, "lagged backward"). Its
    limits are the kernels' (the heuristics cannot import them)."""
    assert (cost.BWD_LAGGED_CHUNK, cost.BWD_LAG) == (sm.lagged.BWD_LAG_SHAPE[0],
                                                     sm.lagged.BWD_LAG_SHAPE[2])
    assert cost.LAGGED_MAX_SPLIT == sm.lagged.LAGGED_MAX_SPLIT
    assert cost.LAGGED_MIN_PROGRAMS == sm.lagged.LAGGED_MIN_PROGRAMS
    monkeypatch.setattr(sm.autograd, "device_info", lambda device: H200)
    y = torch.empty(shape, dtype=dtype, device="meta")
    prepared = sm.autograd.prepare_backward(y, torch.empty_like(y), 1, log, dtype, bound=False)
    assert (prepared.__name__ == "lagged_rows_backward") == lagged, prepared.__name__
    call = _call(shape, -1, dtype, grad=True, log=log)
    est = get_op("log_softmax" if log else "softmax").backend("online").cost(call, MODEL)
    (note,) = [n for n in est.notes if n.startswith("backward: ")]
    assert ("lagged rows" in note) == lagged, note
    if lagged and shape[0] >= H200.sm_count:
        monkeypatch.setattr(cost, "LAGGED_MIN_PROGRAMS", 1 << 40)
        two_pass = get_op("log_softmax" if log else "softmax").backend("online").cost(call, MODEL)
        assert "two passes" in next(n for n in two_pass.notes if n.startswith("backward: "))
        # (log_softmax's sum pass reads dy alone: the H200 measured 1.08x there)
        assert _backward_s(est) < _backward_s(two_pass) / (1.0 if log else 1.15), (shape, dtype)


def test_cold_choice_under_autograd_counts_torchs_backward():
    # 256 x 64 x 1K bf16 over dim 0: the H200 benchmark's cold choice kept torch (426 us forward
    # + backward) where strided took 164 us; the model left out torch's serial spatial backward
    # (without it the defaults put the two within 10%).
    call = _call((256, 64, 1024), 0, torch.bfloat16, grad=True)
    decision = get_op("softmax").what_if(call, H200)
    assert decision.choice == "strided"
    torch_c = next(c for c in decision.candidates if c.name == "torch")
    strided_c = next(c for c in decision.candidates if c.name == "strided")
    # Device work: torch's serial walk costs more than twice strided's tiles (both calls' host
    # time, the autograd.Function's floor for strided, is of the same order).
    assert torch_c.parts["backward"] > 2 * strided_c.parts["backward"]
    assert "backward" in torch_c.parts and any("spatial" in n for n in torch_c.notes)


def test_engine_host_time_decides_eager_not_graph_choices():
    """4096 x 4096 bf16 under autograd on the H200: torch's kernels take 105.5 us, fused's 41.7,
    and fused's forward + backward about 110 us of host time, torch's 84 (with the autograd
    engine's own 40 us in both; fits/softmax.md, "AUTOGRAD_HOST"). Eager, max(host, device):
    torch. Under a CUDA graph, device time alone: fused. Left out of both, the engine's time
    made the model pick fused eager (71 us of host against torch's 100 of device)."""
    call = _call((4096, 4096), -1, torch.bfloat16, grad=True)
    assert get_op("softmax").what_if(call, H200).choice == "torch"
    est = _estimates(call)
    device = {name: sum(v for k, v in e.parts.items() if k != "launch") for name, e in est.items()}
    assert min(device, key=device.get) == "fused" and device["torch"] > 2 * device["fused"]
    assert est["fused"].parts["launch"] >= cost.AUTOGRAD_ENGINE_HOST + cost.AUTOGRAD_HOST
    assert est["torch"].parts["launch"] >= cost.AUTOGRAD_ENGINE_HOST


# The kernels each backward path launches (autograd.backward), the first whose words the note
# holds (a split strided note names its tiles too).
PATH_KERNELS = {
    "rows in registers": {"_rows_bwd_kernel"},
    "two passes per row": {"_rows_bwd_kernel"},
    "rows split over programs": {"_split_bwd_sum_kernel", "_split_bwd_apply_kernel"},
    "lagged rows": {"_lagged_bwd_kernel"},
    "the dim split over programs": {"_strided_split_bwd_kernel"},
    "strided tiles": {"_strided_bwd_kernel"},
}


@pytest.mark.parametrize("shape,dim,backend", [
    ((8, 100), -1, "fused"), ((300, 20), -1, "multirow"), ((1, 16500), -1, "online"),
    ((2, 16500), -1, "online"), ((3, 6, 5), 1, "strided"), ((2, 40, 3), 1, "strided"),
    ((1, 30000, 2), 1, "strided")])  # (one block of columns, fewer than this host's 2 "SMs")
def test_model_charges_the_path_autograd_launches(cpu_triton, shape, dim, backend):
    x = torch.randn(shape, requires_grad=True)
    call = sm.prepare_softmax(x, dim)
    est = get_op("softmax").backend(backend).cost(call, defaults_for(call.info))
    (note,) = [n for n in est.notes if n.startswith("backward: ")]
    expected = next(k for path, k in PATH_KERNELS.items() if path in note)
    y = ops.softmax(x, dim, backend=backend)
    launched: list = []
    previous, Launcher.observer = Launcher.observer, launched.append
    try:
        (dx,) = torch.autograd.grad(y, x, torch.randn_like(y))
    finally:
        Launcher.observer = previous
    assert {k.__name__ for k in launched} == expected, (note, launched)
    assert dx.shape == x.shape


@pytest.mark.parametrize("shape,dim,dtype,log", [
    ((239, 63263, 4), 1, torch.bfloat16, False),  # blocks >= SMs, the walk sets the time: split
    ((133, 40000, 8), 1, torch.bfloat16, True),
    ((32000, 64), 0, torch.bfloat16, False),  # few blocks: split
    ((34312, 8), 0, torch.float32, True),
    ((512, 8192, 8), 1, torch.float32, False),  # the memory sets the time: two passes
    ((8192, 8192), 0, torch.bfloat16, False),
    ((478, 63263, 4), 1, torch.bfloat16, False),
    ((64, 512, 512), 1, torch.float16, False),  # the dim in registers
])
def test_model_and_autograd_split_the_strided_backward_alike(monkeypatch, shape, dim, dtype,
                                                            log):
    """The model charges the strided backward split over the dim exactly where autograd's
    prepared backward splits it (on an H200's geometry and bandwidth)."""
    monkeypatch.setattr(sm.autograd, "device_info", lambda device: H200)
    y = torch.empty(shape, dtype=dtype, device="meta")
    prepared = sm.autograd.prepare_backward(y, torch.empty_like(y), dim, log, dtype, bound=False)
    call = _call(shape, dim, dtype, grad=True, log=log)
    est = get_op("log_softmax" if log else "softmax").backend("strided").cost(call, MODEL)
    (note,) = [n for n in est.notes if n.startswith("backward: ")]
    assert ("split over programs" in note) == (prepared.__name__ == "split_columns"), note
    assert ("split" in note) == (shape[0] not in (512, 8192, 478, 64)), note


@pytest.mark.parametrize("shape,dim,dtype,forward,backward", [
    # (shape, dim, dtype, (inner_block, num_warps) forward, the same backward)
    ((1000, 33, 768), 1, torch.float16, (64, 2), (32, 2)),  # 16-byte rows: 64 / 32 a thread
    ((1000, 33, 777), 1, torch.float16, (64, 4), (32, 4)),  # rows off the grid: half as many
    ((30, 200, 3000), 1, torch.float16, (32, 4), (32, 8)),  # 256 rows: at least 32 columns
    ((101, 323), 0, torch.float32, (8, 2), (8, 2)),  # few programs: blocks halved, 2 warps
    ((64, 12, 197, 197), 1, torch.float16, (64, 2), (128, 4)),  # 16 rows or fewer: the
    ((2000, 7, 333), 1, torch.float32, (64, 2), (256, 4)),  # forward at most 64 columns
    ((64, 512, 512), 1, torch.float16, (32, 16), (16, 16)),  # past SHORT_DIM_MAX: as before
])
def test_short_dims_take_a_quarter_tile_and_few_warps(monkeypatch, shape, dim, dtype, forward,
                                                      backward):
    """A dim held whole in registers up to SHORT_DIM_MAX long takes a quarter of the tile and
    the warps of cost.single_warps, forward (strided's first config) and backward (autograd's
    plan), on an H200's geometry; longer dims keep the general rule (fits/softmax.md, "Short
    dims": the general rule's 16 warps ran 1000 x 33 x 768 fp16 at 221 us, the short one at 52)."""
    call = _call(shape, dim, dtype, grad=False)
    strided = get_op("softmax").backend("strided")
    plan = strided.forward_plan(call, strided.configs(call)[0], H200.sm_count)
    assert (plan.inner_block, plan.num_warps) == forward
    monkeypatch.setattr(sm.autograd, "device_info", lambda device: H200)
    plans = []
    real = sm.autograd.strided_launch_plan
    monkeypatch.setattr(sm.autograd, "strided_launch_plan",
                        lambda *args: plans.append(real(*args)) or plans[-1])
    y = torch.empty(shape, dtype=dtype, device="meta")
    sm.autograd.prepare_backward(y, torch.empty_like(y), dim, False, dtype, bound=False)
    (bwd,) = plans
    assert (bwd.inner_block, bwd.num_warps, bwd.single) == (*backward, True)


def test_transposed_rows_keep_the_general_strided_rule():
    """Rows of a transposed matrix (columns written as rows) are not the short-dim layout: the
    rule was measured on dims of x's own layout only."""
    x = torch.empty(37, 5000, dtype=torch.float16, device="meta").t()  # 5000 rows of 37
    call = sm.prepare_softmax(x, -1)
    call.info = H200
    assert call.columns is not None
    strided = get_op("softmax").backend("strided")
    plan = strided.forward_plan(call, strided.configs(call)[0], H200.sm_count)
    general = sm._strided_plan(37, 5000, 1, 2, H200.sm_count, short=False)[0]
    assert plan.inner_block in (general, general // 2)  # (_blocks may halve it for columns)
    assert plan.num_warps == sm.common._warps(plan.inner_block * plan.dim_block)
