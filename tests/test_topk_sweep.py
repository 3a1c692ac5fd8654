"""topk swept over row lengths and k across the row, for every backend.

The tournament backend once read slots of its candidate lists that no program wrote when a chunk
was shorter than k (n = 256, k = 131: a segfault under the interpreter, garbage indices on a GPU
whose plan cut rows that short). Such faults hide at particular (n, k) pairs, so this sweeps them:
on the CPU (interpreter) a sample of pairs chosen to cross every plan boundary of the small
interpreter configurations; on a GPU many more, with the input at the end of a larger buffer
whose head is poisoned with NaN (the largest key: a read before the row shows up as a wrong
value) and outputs poisoned before the call. tools/sanitize_topk.py runs the GPU sweep alone,
for compute-sanitizer.
"""

from __future__ import annotations

import pytest
import torch

from opselect import ops
from opselect.dispatch import get_op
from opselect.errors import BackendError

BACKENDS = [b for b in get_op("topk").backend_names if b not in ("torch", "sort")]


def _pairs_cpu() -> list[tuple[int, int]]:
    pairs = [(256, k) for k in (1, 64, 128, 129, 130, 131, 145, 160, 161, 200, 255, 256)]
    pairs += [(300, 255), (300, 150), (257, 200), (1000, 160), (1000, 256)]
    for n in (1, 2, 3, 17, 64, 100, 127, 513, 1100):
        pairs += [(n, k) for k in sorted({1, max(1, n // 2), max(1, n - 1), n})]
    return pairs


def _pairs_gpu(full: bool = False) -> list[tuple[int, int]]:
    """Pairs for a GPU: each new row length or k is a new compiled variant of some kernels
    (seconds each), so the test takes lengths around the powers of two and k across the row;
    full=True (tools/sanitize_topk.py) takes every k from n/2 to n in steps of n/16 for n =
    256..1000, and more lengths."""
    pairs = set()
    lengths = [1, 2, 3, 5, 8, 17, 31, 64, 100, 128, 129, 255, 256, 257, 300, 511, 512, 513, 777,
               1000, 1024, 1100]
    if full:
        lengths += list(range(4, 64, 3)) + list(range(64, 1101, 13))
        for n in range(256, 1001, 37):
            for k in range(n // 2, n + 1, max(1, n // 16)):
                pairs.add((n, k))
    for n in lengths:
        for k in {1, 2, n // 3, n // 2, n // 2 + 1, 3 * n // 4, n - 1, n}:
            if 1 <= k <= n:
                pairs.add((n, k))
    return sorted(pairs)


def place_at_end(values: torch.Tensor, head: int = 4096) -> torch.Tensor:
    """values copied to the end of a buffer whose first `head` elements are poison (NaN for
    floats, the dtype's maximum for integers): a read before the row returns the largest key."""
    if values.dtype.is_floating_point:
        poison = float("nan")
    else:
        poison = torch.iinfo(values.dtype).max
    buf = torch.full((head + values.numel(),), poison, dtype=values.dtype, device=values.device)
    out = buf[head:]
    out.copy_(values)
    return out


def check_one(n: int, k: int, dtype: torch.dtype, largest: bool, backend: str,
              device: str, seed: int) -> str | None:
    g = torch.Generator().manual_seed(seed * 1_000_003 + n * 1009 + k)
    if dtype.is_floating_point:
        data = torch.randn(n, generator=g).to(dtype)
    else:
        data = torch.randint(-1000, 1000, (n,), generator=g, dtype=dtype)
    x = place_at_end(data.to(device))
    try:
        got = ops.topk(x, k, largest=largest, backend=backend)
    except BackendError:
        return None  # the backend does not take this call (its supports() said why)
    ref = torch.topk(data.to(device), k, largest=largest)
    where = f"topk(n={n}, k={k}, {dtype}, largest={largest}, backend={backend!r}, seed={seed})"
    if got.indices.shape != (k,) or got.values.shape != (k,):
        return f"{where}: shapes {tuple(got.values.shape)} / {tuple(got.indices.shape)}"
    if not torch.equal(got.values.cpu(), ref.values.cpu()):
        return f"{where}: values differ from torch.topk"
    idx = got.indices.cpu()
    if bool((idx < 0).any()) or bool((idx >= n).any()):
        return f"{where}: an index out of the row: {idx.min().item()}..{idx.max().item()}"
    if idx.unique().numel() != k:
        return f"{where}: an index appears twice"
    if not torch.equal(data[idx], got.values.cpu()):
        return f"{where}: values are not the input at the returned indices"
    return None


@pytest.mark.slow  # (make test-all; see the Makefile)
@pytest.mark.parametrize("backend", BACKENDS)
def test_sweep_interpreter(backend, cpu_triton):
    failures = []
    for i, (n, k) in enumerate(_pairs_cpu()):
        dtype = (torch.float32, torch.int32)[i % 2]
        largest = (i // 2) % 2 == 0
        err = check_one(n, k, dtype, largest, backend, cpu_triton, seed=0)
        if err:
            failures.append(err)
    assert not failures, "\n".join(failures[:20])


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_sweep_gpu(backend, cuda):
    failures = []
    for i, (n, k) in enumerate(_pairs_gpu()):
        for seed in range(3):
            dtype = (torch.float32, torch.int32)[(i + seed) % 2]
            err = check_one(n, k, dtype, seed % 2 == 0, backend, cuda, seed)
            if err:
                failures.append(err)
    torch.cuda.synchronize()
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:20])
