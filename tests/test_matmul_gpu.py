"""matmul / linear kernels on CUDA (the `gpu` tests; skipped elsewhere): tests/test_matmul.py's
checks at real sizes (decode, prefill, square, odd, batched, tf32 on and off), every config, every
kernel launched under checked specs (Launcher.verify) and then through its bound launch, a split-k
call captured in a CUDA graph and replayed, and offsets past 2**31 elements.
"""

from __future__ import annotations

import pytest
import torch

import test_matmul as base
from opselect.kernels.matmul import MATMUL_OP
from opselect.kernels.matmul.splitk import counters_of
from test_matmul import (FLOATS, OPS, TRITON, answer, bits, check, config_calls, every_config,
                         forms_and_layouts, prepare, rand, supported)

pytestmark = pytest.mark.gpu
poisoned, tf32_off = base.poisoned, base.tf32_off  # (its autouse fixtures, here too)


# ---------------------------------------------------------------------------------------------
# on the GPU: real sizes, checked specs, CUDA graphs
# ---------------------------------------------------------------------------------------------
def gpu_cases(device):
    r = lambda *s, dtype=torch.bfloat16: rand(*s, dtype=dtype, device=device)  # noqa: E731
    f16, f32 = torch.float16, torch.float32
    return {
        "square 4096 bf16": ("matmul", (r(4096, 4096), r(4096, 4096))),
        "decode linear 1x4096 @ 11008x4096": ("linear", (r(1, 4096), r(11008, 4096) / 64,
                                                         r(11008))),
        "decode 16 rows, weight layout": ("matmul", (r(16, 4096), r(4096, 4096).t())),
        "prefill linear 2048x4096": ("linear", (r(2, 1024, 4096), r(4096, 4096) / 64, r(4096))),
        "odd 1000x3000x777 fp16": ("matmul", (r(1000, 3000, dtype=f16), r(3000, 777, dtype=f16))),
        "batched 8x512x512 fp32": ("matmul", (r(8, 512, 512, dtype=f32),
                                              r(8, 512, 512, dtype=f32))),
        "broadcast batch fp16": ("matmul", (r(4, 1, 300, 700, dtype=f16),
                                            r(3, 700, 500, dtype=f16))),
        "addmm (1, n) bias": ("addmm", (r(1, 3072), r(1024, 768), r(768, 3072))),
        "transposed A, stepped B": ("matmul", (r(2048, 1000).t(), r(2048, 1500)[:, ::2])),
    }


@pytest.mark.parametrize("tf32", [False, True], ids=["ieee", "tf32"])
def test_gpu_every_backend(cuda, tf32):
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.manual_seed(20)
    for name, (form, args) in gpu_cases(cuda).items():
        for backend in TRITON:
            if not supported(form, args, backend):
                continue
            check(answer(form, args, backend), form, args, f"{backend} {name}", tf32=tf32)
        check(OPS[form].run(prepare(form, args)), form, args, f"auto {name}", tf32=tf32)


@pytest.mark.slow
def test_gpu_every_config(cuda):
    torch.manual_seed(21)
    for name, (form, args) in gpu_cases(cuda).items():
        for backend in TRITON:
            if supported(form, args, backend):
                every_config(form, args, backend, name)
    for backend in TRITON:
        for dtype in FLOATS:
            for form, args, name in config_calls(backend, dtype, cuda):
                every_config(form, args, backend, name)


def test_gpu_forms_layouts_and_values(cuda):
    torch.manual_seed(22)
    for name, (form, args) in forms_and_layouts(cuda).items():
        for backend in TRITON:
            check(answer(form, args, backend), form, args, f"{backend} {name}")
    for dtype in FLOATS:
        a, b = rand(70, 3000, dtype=dtype, device=cuda), rand(3000, 900, dtype=dtype, device=cuda)
        a[1, 7], a[2, 2999], b[20, 3], b[100, 5] = float("nan"), float("inf"), float("-inf"), 0
        for backend in TRITON:
            check(answer("matmul", (a, b), backend), "matmul", (a, b), f"{backend} special")


def test_gpu_checked_specs_then_bound_launches(cuda, monkeypatch):
    """Every kernel launched with verify on (Triton binds each call and must pick the very
    kernel the plan names: a plan that misses an argument Triton specializes on fails here),
    then the bound fast path on fresh tensors of the same calls, one of them 2 bytes off 16."""
    from opselect.kernels._common import Launcher

    torch.manual_seed(23)
    for offset in (0, 1):
        def fresh(*shape, dtype=torch.bfloat16):
            n = 1
            for s in shape:
                n *= s
            return rand(n + offset, dtype=dtype, device=cuda)[offset:].view(shape)

        for form, shapes in (("matmul", ((16, 4096), (4096, 1024))),
                             ("matmul", ((3, 300, 520), (3, 520, 260))),
                             ("linear", ((500, 2048), (1000, 2048), (1000,)))):
            for backend in TRITON:
                args = tuple(fresh(*s) for s in shapes)
                if not supported(form, args, backend):
                    continue
                for cfg in OPS[form].backend(backend).configs(prepare(form, args)):
                    monkeypatch.setattr(Launcher, "verify", True)
                    for _ in range(2):  # (the second launch is checked against the first's)
                        args = tuple(fresh(*s) for s in shapes)
                        check(answer(form, args, backend, cfg), form, args, f"{backend} verify")
                    monkeypatch.setattr(Launcher, "verify", False)
                    for _ in range(2):
                        args = tuple(fresh(*s) for s in shapes)
                        check(answer(form, args, backend, cfg), form, args, f"{backend} bound")
                        call = prepare(form, args)
                        product = OPS[form].backend(backend).bind(call, cfg)
                        check(product(*call.inputs()), form, args, f"{backend} prepared")


def test_gpu_splitk_in_a_cuda_graph(cuda):
    """A prepared split-k call captured in a CUDA graph, replayed twice with new values in the
    inputs and the output spoiled between replays: the counters the graph holds are 0 again
    after each replay, or the second replay would leave tiles unwritten."""
    torch.manual_seed(24)
    a, w = rand(4, 4096, device=cuda), rand(4096, 2048, device=cuda) / 64
    call = prepare("matmul", (a, w))
    backend = MATMUL_OP.backend("splitk")
    cfg = backend.configs(call)[0]
    product = backend.bind(call, cfg)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        warm = product(a, w)  # (compiled and bound before the capture)
        torch.cuda.synchronize()
        assert not bool(counters_of(a.device).any())  # (this stream's counters)
    torch.cuda.current_stream().wait_stream(stream)
    check(warm, "matmul", (a, w), "eager split-k")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = product(a, w)
    for step in range(3):
        a.copy_(rand(4, 4096, device=cuda))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check(out, "matmul", (a, w), f"graph replay {step}")
    eager = product(a, w)
    torch.cuda.synchronize()
    assert not bool(counters_of(a.device).any())
    assert torch.equal(bits(eager), bits(out)), "graph and eager split-k differ"


@pytest.mark.slow
def test_gpu_offsets_past_2_to_the_31(cuda):
    """A (600000 x 4096) bfloat16 A (2.46e9 elements, 4.9 GB) times a narrow B: the wide
    plans; checked against torch on row blocks at the start, middle and end."""
    free, _ = torch.cuda.mem_get_info()
    if free < 16 << 30:
        pytest.skip("needs 16 GB of free GPU memory")
    torch.manual_seed(25)
    a = torch.empty(600_000, 4096, dtype=torch.bfloat16, device=cuda).normal_()
    b = rand(4096, 48, dtype=torch.bfloat16, device=cuda) / 64
    call = prepare("matmul", (a, b))
    for backend in TRITON:
        if not supported("matmul", (a, b), backend):
            continue
        assert MATMUL_OP.backend(backend).plan(call).wide, backend
        got = answer("matmul", (a, b), backend)
        for rows in (slice(0, 1000), slice(300_000, 301_000), slice(599_000, 600_000)):
            part = (a[rows], b)
            check(got[rows].contiguous(), "matmul", part, f"{backend} rows {rows}")
        del got
