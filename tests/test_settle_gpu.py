"""Issue 16's table, replayed on the GPU: for each permute and softmax call there, tuning (both
stages, on the real kernels) settles on a choice no slower, timed in turns, than the cold choice it
replaces (torch kept only within MEASURED_TORCH_MARGIN), the answer is torch's, and the cold
choice is the same whichever call of its bucket comes first."""

from __future__ import annotations

import pytest
import torch

import opselect
from opselect import ops
from opselect.dispatch import get_op, tuning
from opselect.dispatch.op import MEASURED_TORCH_MARGIN

pytestmark = pytest.mark.gpu

PERMUTES = [((2, 3, 4, 5, 6, 7, 8, 9), torch.float32, tuple(range(7, -1, -1))),
            ((50000, 3), torch.int64, (1, 0)),
            ((3, 1080, 1920, 4), torch.uint8, (0, 3, 1, 2)),
            ((32, 224, 224, 3), torch.uint8, (0, 3, 1, 2)),
            ((1500, 8, 16, 64), torch.float16, (1, 2, 0, 3))]
SOFTMAXES = [((2048, 3000), torch.float32), ((2, 151936), torch.float32),
             ((4096, 128256), torch.bfloat16)]


def _cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")


def _check_settled(name: str, run, want: torch.Tensor, *args, **kwargs) -> None:
    opselect.forget()
    cold = opselect.explain(name, *args, show=False, **kwargs)
    assert cold.source == "model", cold.source
    with tuning():
        got = run()
    torch.testing.assert_close(got, want, rtol=0, atol=0) if not want.is_floating_point() \
        else torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=1e-5)
    opselect.forget()
    tuned = opselect.explain(name, *args, show=False, **kwargs)
    assert tuned.source == "cache", tuned.source
    times = {c.name: c.measured_s for c in tuned.candidates if c.supported}
    assert all(t is not None for t in times.values()), times
    assert times[cold.choice] < float("inf"), f"the cold choice {cold.choice} was not timed"
    limit = times[cold.choice] / (MEASURED_TORCH_MARGIN if tuned.choice == "torch" else 1.0)
    assert times[tuned.choice] <= limit, (tuned.choice, cold.choice, times)
    assert times[tuned.choice] <= times["torch"], (tuned.choice, times)


@pytest.mark.parametrize("shape, dtype, dims", PERMUTES, ids=[str(p[0]) for p in PERMUTES])
def test_table_permutes_settle_no_slower_than_cold(isolated_cache, shape, dtype, dims):
    _cuda()
    x = (torch.randint(0, 255, shape, dtype=torch.uint8, device="cuda").to(dtype)
         if dtype == torch.uint8 else torch.randn(shape, device="cuda").to(dtype))
    _check_settled("permute", lambda: ops.permute(x, dims), x.permute(dims).contiguous(),
                   x, dims)


@pytest.mark.parametrize("shape, dtype", SOFTMAXES, ids=[str(s[0]) for s in SOFTMAXES])
def test_table_softmaxes_settle_no_slower_than_cold(isolated_cache, shape, dtype):
    _cuda()
    x = torch.randn(shape, device="cuda", dtype=dtype)
    _check_settled("softmax", lambda: ops.softmax(x, -1), torch.softmax(x, -1), x, -1)


def test_cold_choices_do_not_depend_on_the_order_of_calls(isolated_cache):
    """Softmax rows of 2049 to 4096 share a bucket; the cold choice of each is the same whether
    it is the first of its bucket or not."""
    _cuda()
    op = get_op("softmax")
    xs = [torch.randn(2048, n, device="cuda") for n in (2100, 3000, 4000)]
    choices = []
    for order in (xs, xs[::-1]):
        opselect.forget()
        for x in order:
            ops.softmax(x, -1)
        choices.append({x.shape[1]: op.chosen(op.prepare(x, -1)).backend.name for x in xs})
    assert choices[0] == choices[1]
