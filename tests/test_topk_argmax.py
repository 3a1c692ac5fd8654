"""topk's argmax backend (k = 1) against torch.topk: every dtype, both directions, every config
(shared rows, several rows a program, rows off the 16-byte grid), NaN, infinities, -0.0, the
integer extremes, ties. Outputs and the workspace start poisoned (kernels/_common.POISON)."""

from __future__ import annotations

import pytest
import torch

from opselect import ops
from opselect.errors import BackendError
from opselect.kernels import _common
from opselect.kernels import topk as K

from test_topk import DTYPES, check, random_input, same_values, special_row

POISON = 77.0  # a value no input below holds, in every dtype's range; an invalid index


@pytest.fixture
def poisoned(monkeypatch):
    monkeypatch.setattr(_common, "POISON", POISON)


def run_every_config(x: torch.Tensor, largest: bool = True, dim: int = -1) -> list:
    """argmax under each of its configs against torch.topk(x, 1): values equal (NaN for NaN),
    each index in range and pointing at its value. Returns the plans."""
    backend = K.OP.backend("argmax")
    call = K.prepare(x, 1, dim, largest, True)
    assert backend.supports(call) is None
    ref = torch.topk(x, 1, dim, largest)
    plans = []
    for config in backend.configs(call):
        values, indices = backend.run(call, config)
        assert values.shape == ref.values.shape and indices.dtype == torch.int64
        assert same_values(values, ref.values), (config, values, ref.values)
        n = x.shape[dim] if x.dim() else 1
        assert bool((indices >= 0).all() & (indices < n).all()), (config, indices)
        assert same_values(torch.gather(x, dim, indices), values), config
        plans.append(backend.plan(call, config))
    return plans


# Four dtypes in make test, the rest in make test-all (make test stays under its 5 minutes)
QUICK = (torch.float32, torch.float16, torch.bfloat16, torch.int64)


@pytest.mark.parametrize("dtype", [d if d in QUICK else pytest.param(d, marks=pytest.mark.slow)
                                   for d in DTYPES])
def test_argmax_every_dtype(cpu_triton, poisoned, dtype):
    # (3, 301): rows off the 16-byte grid, shared by two programs in the first config;
    # (6, 7): several short rows a program.
    long_rows = random_input((3, 301), dtype, seed=dtype.itemsize)
    for largest in (True, False):
        plans = run_every_config(long_rows, largest)
        assert plans[0].programs_per_row > 1 and plans[0].vector > 0
        assert plans[1].programs_per_row == 1 and plans[1].chunk > plans[1].tile
        short = run_every_config(random_input((6, 7), dtype, seed=1), largest)
        assert short[0].block_rows > 1


@pytest.mark.parametrize("largest", [True, False])
def test_argmax_special_values(cpu_triton, poisoned, largest):
    x = torch.stack([special_row(301, s) for s in range(4)])
    run_every_config(x, largest)
    run_every_config(x.half(), largest)
    # a row of NaN only, NaN last, the same value throughout, +-0.0 only, -inf only
    rows = torch.randn(5, 301)
    rows[0] = float("nan")
    rows[1, -1] = float("nan")
    rows[2] = 3.0
    rows[3] = torch.where(torch.arange(301) % 2 == 0, 0.0, -0.0)
    rows[4] = float("-inf") if largest else float("inf")
    run_every_config(rows, largest)
    # (not bfloat16: the interpreter reads a bfloat16 NaN's bits as -0.0's; the GPU test has it)
    run_every_config(rows.half(), largest)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int8, torch.uint8])
def test_argmax_integer_extremes(cpu_triton, poisoned, dtype):
    # Every key the lowest there is (the smallest integer for largest=True, the largest for
    # largest=False): no lane ever takes a key, and the answer is the chunk's first element.
    info = torch.iinfo(dtype)
    for largest, value in ((True, info.min), (False, info.max)):
        x = torch.full((3, 301), value, dtype=dtype)
        run_every_config(x, largest)
        x[1, 150] = info.max if largest else info.min
        x[2, -1] = info.max if largest else info.min
        run_every_config(x, largest)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.int64])
@pytest.mark.slow
def test_argmax_rows_off_the_vector_grid_keep_their_neighbours_out(cpu_triton, poisoned, dtype):
    # Even rows hold the extreme value at their first and last elements; odd rows, read from
    # the vector their first element is in to the one their last is in, share those vectors
    # with the even rows' edges, which must stay out of their answer. Also a view one element
    # into its storage (the first row starts inside a vector).
    for largest in (True, False):
        for n in (301, 297):
            x = random_input((5, n), dtype, seed=n)
            edge = 100 if largest else -100
            x[::2, 0] = edge
            x[::2, -1] = edge
            assert run_every_config(x, largest)[0].vector > 0
            run_every_config(torch.cat([x.flatten(), x.flatten()[:1]])[1:].view(5, n), largest)


def test_argmax_parts_merge_to_the_row_answer(cpu_triton, poisoned):
    # Shared rows: the extreme in the first, a middle and the last program's part, and ties
    # spread over every part (the value is torch's, the index any of the tied).
    x = torch.randn(4, 600)
    x[0, 0] = 9.0
    x[1, 333] = 9.0
    x[2, -1] = 9.0
    x[3] = 1.0
    for row in x:  # one row a call: the interpreter's few "SMs" split it most
        assert run_every_config(row)[0].programs_per_row >= 3
        run_every_config(-row, largest=False)


@pytest.mark.slow
def test_argmax_layouts_and_dims(cpu_triton, poisoned):
    x = torch.randn(40, 6, 3)
    run_every_config(x, dim=0)  # rows of strided elements: a contiguous copy first
    run_every_config(x.transpose(0, 2), dim=-1)
    run_every_config(torch.randn(301), dim=0)  # one row
    run_every_config(torch.randn(7, 1))  # rows of one element
    check(torch.randn(3, 5, 301), 1, dim=1, backend="argmax")
    check(torch.tensor(2.5), 1, backend="argmax")  # 0-d
    check(torch.randn(0, 301), 1, backend="argmax")
    check(torch.randn(4, 301), 0, backend="argmax")


def test_argmax_refuses_k_other_than_one(cpu_triton):
    with pytest.raises(BackendError, match=r"k=2; argmax selects one value a row"):
        ops.topk(torch.randn(3, 50), 2, backend="argmax")
    reason = K.OP.backend("argmax").supports(K.prepare(torch.randn(3, 50), 5))
    assert reason and "k=5" in reason


# ---------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------
GPU_CASES = [((1024, 50257), torch.float16), ((64, 128000), torch.bfloat16),
             ((8, 128256), torch.bfloat16), ((1, 16_000_000), torch.float32),
             ((4096, 256), torch.float32), ((3000, 7), torch.int8), ((5, 1001), torch.float64),
             ((300, 151936), torch.bfloat16), ((2, 3_000_001), torch.int64)]


@pytest.mark.gpu
@pytest.mark.parametrize("shape, dtype", GPU_CASES, ids=[str(c[0]) for c in GPU_CASES])
def test_gpu_argmax(cuda, monkeypatch, shape, dtype):
    monkeypatch.setattr(_common, "POISON", POISON)
    x = random_input(shape, dtype, seed=shape[-1]).to(cuda)
    for largest in (True, False):
        run_every_config(x, largest)
        if dtype.is_floating_point:
            # specials scattered, and the neighbours' edges extreme (rows off the grid)
            y = x.clone()
            y[:, ::97] = special_row(y[:, ::97].shape[-1], 3, dtype).to(cuda)
            run_every_config(y, largest)
            y = x.clone()
            y[::2, 0] = y[::2, -1] = 1e4 if largest else -1e4
            run_every_config(y, largest)
