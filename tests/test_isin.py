"""isin: every backend against torch.isin, on random and edge inputs, plus torch's argument rules.

CPU tests run the Triton kernels through the interpreter with small shapes; the `gpu` tests repeat
them at real sizes on CUDA. Outputs are poisoned (out= filled with the opposite of the expected
answer) so an element a kernel forgets to write fails the test.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import opselect
from opselect import ops
from opselect.dispatch.device import INTERPRETED, DeviceInfo
from opselect.errors import BackendError, InvalidArgument, UnsupportedDType
from opselect.kernels import isin as isin_mod
from opselect.kernels.isin.call import plain_key

TRITON_BACKENDS = ["compare", "search", "hash", "cuckoo", "bitmap"]
INT_DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
FLOAT_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


def supports(backend: str, dtype: torch.dtype) -> bool:
    return not (backend == "bitmap" and dtype.is_floating_point)


def takes(backend: str, n: int) -> bool:
    """Whether the backend takes a test set of n values (compare and cuckoo have a bound)."""
    from opselect.kernels.isin import compare, cuckoo

    bounds = {"compare": compare.CompareBackend.MAX_N, "cuckoo": cuckoo.CUCKOO_MAX_KEYS}
    return n <= bounds.get(backend, n)


def check(elements, test, backend, *, invert=False, assume_unique=False):
    """Run one backend with a poisoned out= and without out=, compare both with torch.isin."""
    # (torch.isin itself fails on a non-contiguous multi-dimensional test set: give it a flat one)
    expected = torch.isin(elements, test.reshape(-1), invert=invert, assume_unique=assume_unique)
    poisoned = torch.empty_like(expected).copy_(~expected)
    got = ops.isin(elements, test, invert=invert, assume_unique=assume_unique, out=poisoned,
                   backend=backend)
    assert got is poisoned
    _assert_same(got, expected, elements, test, backend)
    plain = ops.isin(elements, test, invert=invert, assume_unique=assume_unique, backend=backend)
    _assert_same(plain, expected, elements, test, backend)


def _assert_same(got, expected, elements, test, backend):
    assert got.dtype == torch.bool and got.shape == expected.shape and got.device == expected.device
    if not torch.equal(got, expected):
        bad = (got != expected).nonzero()[:5].tolist()
        raise AssertionError(f"{backend}: {int((got != expected).sum())} wrong of {got.numel()}, e.g. "
                             f"at {bad}; elements {elements.dtype} {tuple(elements.shape)}, "
                             f"test {tuple(test.shape)}")


def random_values(n, dtype, device, *, lo=None, hi=None, gen=None):
    if dtype.is_floating_point:
        span = 50 if lo is None else hi - lo
        base = 0 if lo is None else lo
        vals = torch.randint(0, max(span, 1), (n,), generator=gen).to(torch.float64) + base
        vals = vals / 4  # quarter steps: fractional values, exact in every float dtype here
        return vals.to(dtype).to(device)
    info = torch.iinfo(dtype)
    lo = info.min if lo is None else max(lo, info.min)
    hi = info.max if hi is None else min(hi, info.max)
    return torch.randint(lo, hi, (n,), dtype=torch.int64, generator=gen).to(dtype).to(device)


# ------------------------------------------------------------------------------------------------
# Random inputs, every backend and dtype (interpreter)
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", TRITON_BACKENDS)
@pytest.mark.parametrize("dtype", INT_DTYPES + FLOAT_DTYPES, ids=str)
def test_random_against_torch(cpu_triton, backend, dtype):
    if not supports(backend, dtype):
        pytest.skip("bitmap takes integers only")
    gen = torch.Generator().manual_seed(hash((backend, str(dtype))) % 2**31)
    for m, n, narrow in ((700, 37, True), (300, 900, False), (1100, 5, True)):
        lo, hi = (0, 2 * n) if narrow else (None, None)
        test = random_values(n, dtype, cpu_triton, lo=lo, hi=hi, gen=gen)
        elements = random_values(m, dtype, cpu_triton, lo=lo, hi=hi, gen=gen)
        # make about half of the elements members
        picks = test[torch.randint(0, n, (m // 2,), generator=gen)]
        elements[: m // 2] = picks
        elements = elements[torch.randperm(m, generator=gen)]
        for invert in (False, True):
            check(elements, test, backend, invert=invert)


@pytest.mark.parametrize("backend", TRITON_BACKENDS)
@pytest.mark.slow
def test_float_specials(cpu_triton, backend):
    if backend == "bitmap":
        pytest.skip("integers only")
    nan, inf = float("nan"), float("inf")
    for dtype in FLOAT_DTYPES:
        elements = torch.tensor([nan, -0.0, 0.0, inf, -inf, 1.5, -1.5, 2.0, nan, 3.0], dtype=dtype)
        for test in ([nan, 0.0, inf, 1.5], [-0.0, -inf, nan], [nan], [nan, nan, 2.0, 2.0]):
            t = torch.tensor(test, dtype=dtype)
            check(elements, t, backend)
            check(elements, t, backend, invert=True)


@pytest.mark.parametrize("backend", TRITON_BACKENDS)
@pytest.mark.parametrize("dtype", INT_DTYPES, ids=str)
def test_integer_extremes(cpu_triton, backend, dtype):
    info = torch.iinfo(dtype)
    specials = [info.min, info.max, info.min + 1, info.max - 1, 0, 1]
    if info.min < 0:
        specials.append(-1)
    elements = torch.tensor(specials * 3 + [5, 7, 9], dtype=dtype)
    # The hash set's empty marker is the key type's minimum: with and without it in the test set.
    for test in ([info.min], [info.max, 0], [info.min, info.max, 7], [1, 5]):
        check(elements, torch.tensor(test, dtype=dtype), backend)
        check(elements, torch.tensor(test, dtype=dtype), backend, invert=True)


def test_bitmap_range_boundaries(cpu_triton):
    """The bitmap holds test values in [min, min + capacity); wider ranges switch to the hash set
    on the device. Both sides of the boundary, and ranges that overflow int64 arithmetic."""
    n = 40
    cap = isin_mod.bitmap_capacity(n, torch.int64)
    lo = -123456789
    for span in (cap - 1, cap, cap + 1, 2**62, 2**63 + 5):
        hi = lo + span - 1 if span < 2**63 else 2**63 - 1
        test = torch.tensor([lo, hi] + list(range(lo, lo + n - 2)), dtype=torch.int64)
        elements = torch.tensor([lo, hi, lo - 1, hi - 1, lo + 3, -(2**63), 2**63 - 1, 0],
                                dtype=torch.int64)
        check(elements, test, "bitmap")


def test_duplicates_heavy(cpu_triton):
    """Many copies of few values: table inserts collide on the same slot."""
    for backend in TRITON_BACKENDS:
        test = torch.tensor([7] * 500 + [3] * 300 + [-2] * 10, dtype=torch.int32)
        elements = torch.tensor([7, 3, -2, 0, 1, 7, 8] * 40, dtype=torch.int32)
        check(elements, test, backend)


# ------------------------------------------------------------------------------------------------
# cuckoo: the kick chains and the stash
# ------------------------------------------------------------------------------------------------
def cuckoo_slots(key: int, log_t: int, key_bits: int) -> tuple[int, int]:
    """kernels/isin/cuckoo.py's _cuckoo_hash in Python: a key's two slots."""
    m32 = 0xFFFFFFFF
    h = key & m32
    if key_bits == 64:
        h ^= (((key >> 32) & m32) * 0x85EBCA6B) & m32
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & m32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & m32
    h ^= h >> 16
    return h >> (32 - log_t), ((h * 0x27D4EB2F) & m32) >> (32 - log_t)


def colliding_keys(count: int, log_t: int, key_bits: int, start: int = 0) -> list[int]:
    """count keys (from `start` up) whose two slots are the same pair: at most two of them fit."""
    by_pair: dict = {}
    key = start
    while True:
        pair = tuple(sorted(cuckoo_slots(key, log_t, key_bits)))
        found = by_pair.setdefault(pair, [])
        found.append(key)
        if len(found) == count:
            return found
        key += 1


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64], ids=str)
@pytest.mark.slow
def test_cuckoo_stash_takes_what_the_table_cannot(cpu_triton, dtype):
    """Five keys with the same two slots: two fit, the kick chains end after MAX_KICKS rounds and
    three go to the stash, which every lookup scans. The table is read back to see that the
    stash was used (and that cuckoo_slots is the kernel's hash); the answers against torch."""
    from opselect.kernels.isin import cuckoo

    key_bits = 64 if dtype == torch.int64 else 32
    n = 8
    log_t = cuckoo.cuckoo_table_log2(n)
    start = -(1 << 40) if key_bits == 64 else -5000
    test = torch.tensor(colliding_keys(5, log_t, key_bits, start) + [11, 12, 13], dtype=dtype)
    empty = torch.iinfo(dtype).min
    table = torch.full(((1 << log_t) + 2 + n,), empty, dtype=dtype)
    cuckoo._cuckoo_build_kernel[(1,)](test, table, n, log_t, key_bits=key_bits, build_block=1024)
    slots = 1 << log_t
    stashed = int(table[slots + 1]) - empty
    assert stashed == 3
    placed = table[:slots][table[:slots] != empty]
    assert sorted(placed.tolist() + table[slots + 2: slots + 2 + stashed].tolist()) == sorted(
        test.tolist())
    elements = torch.cat([test, test + 1, torch.tensor([0, empty, -1], dtype=dtype)])
    check(elements, test, "cuckoo")
    check(elements, test, "cuckoo", invert=True)


def test_cuckoo_short_kick_chains(cpu_triton, monkeypatch):
    """One round before the stash: every key pushed out of its first slot by another ends in the
    stash, on a random set and on one of many copies of a few values."""
    import triton.language as tl

    from opselect.kernels.isin import cuckoo

    monkeypatch.setattr(cuckoo, "MAX_KICKS", tl.constexpr(1))
    gen = torch.Generator().manual_seed(8)
    test = random_values(1500, torch.int64, "cpu", gen=gen)
    elements = torch.cat([test[::3], random_values(900, torch.int64, "cpu", gen=gen)])
    check(elements, test, "cuckoo")
    repeats = torch.tensor([7, -3, 9] * 300, dtype=torch.int32)
    check(torch.arange(-20, 20, dtype=torch.int32), repeats, "cuckoo")


@pytest.mark.slow  # (make test-all: 9 s; make test stays under 5 minutes on two cores)
@pytest.mark.parametrize("kind", ["one value", "64 values", "wide int64", "float16 infs"])
def test_large_test_sets_with_repeats(cpu_triton, kind):
    """Test sets large enough for the pre-insert launch (a strided subset inserted first, then
    the build skips the copies of values already in): one value 90% of the time, 64 values,
    int64 values too wide for the bitmap (its hash set), float16 values past its range (inf).
    Members, non-members and the answers of the values the pre-insert skipped over."""
    from opselect.kernels._common import Launcher

    gen = torch.Generator().manual_seed(11)
    n = isin_mod.common.PREINSERT_FROM + 3001
    if kind == "one value":
        test = torch.randint(-5000, 5000, (n,), generator=gen, dtype=torch.int32)
        test[torch.rand(n, generator=gen) < 0.9] = 77
    elif kind == "64 values":
        test = torch.randint(0, 64, (n,), generator=gen, dtype=torch.int32) * 3
    elif kind == "wide int64":
        test = torch.randint(-2**62, 2**62, (64,), generator=gen)[torch.randint(0, 64, (n,),
                                                                             generator=gen)]
        test[-1] = 12345  # the last element, which the strided subset does not reach
    else:
        test = torch.randint(0, 4 * n, (n,), generator=gen).to(torch.float16)  # mostly inf
    pool = torch.cat([test[torch.randint(0, n, (1500,), generator=gen)], test[-3:],
                      torch.randint(-300, 300, (1500,), generator=gen).to(test.dtype)])
    elements = pool[torch.randperm(len(pool), generator=gen)]
    launched = []
    old, Launcher.observer = Launcher.observer, lambda fn: launched.append(fn.__name__)
    try:
        for backend in ("hash", "bitmap"):
            if supports(backend, test.dtype):
                check(elements, test, backend)
                check(elements, test, backend, invert=True)
    finally:
        Launcher.observer = old
    assert "_hash_preinsert_kernel" in launched


@pytest.mark.parametrize("structure", ["hash", "bitmap", "bitmap's hash set"])
@pytest.mark.parametrize("repeats", [0, 15, 16, 900])
def test_preinsert_turns_the_check_on_at_16_repeats(cpu_triton, structure, repeats):
    """The pre-insert launch counts the repeats among the test elements it inserts (a value met
    c times is c - 1 repeats) and raises the build's check flag at REPEATS_FOR_CHECK (16), and
    leaves it off below; its values are in the structure either way."""
    from opselect.kernels.isin import bitmap as B, common as C, hash as H

    assert C.REPEATS_FOR_CHECK.value == 16
    block, stride = C.PREINSERT_ELEMENTS, 3
    test = torch.randperm(block * stride, generator=torch.Generator().manual_seed(repeats),
                          dtype=torch.int32) * 7
    test[torch.arange(1, repeats + 1) * stride] = int(test[0])  # repeats more copies of one value
    sampled = test[::stride]
    log_t = C._hash_table_log(len(test))
    slots = 1 << log_t
    table = torch.full((slots + 2,), torch.iinfo(torch.int32).min, dtype=torch.int32)
    if structure == "hash":
        H._hash_preinsert_kernel[(1,)](test, table, table[slots:slots + 1], table[slots + 1:],
                                       stride, log_t, key_bits=32, bucket_width=4,
                                       murmur_mix=False, preinsert_block=block)
        flag = int(table[slots + 1])
    else:
        cap = 1 << 16 if structure == "bitmap" else 16  # the range fits, or it does not
        params = torch.tensor([0, int(structure == "bitmap"), 0], dtype=torch.int64)
        bits = torch.zeros(cap // 32 or 1, dtype=torch.int32)
        B._bitmap_preinsert_kernel[(1,)](test, params, bits, table, table[slots:slots + 1],
                                         stride, cap, log_t, key_bits=32, bucket_width=4,
                                         preinsert_block=block)
        flag = int(params[2])
        if structure == "bitmap":
            members = torch.nonzero((bits[:, None] >> torch.arange(32)) & 1).tolist()
            assert sorted(w * 32 + b for w, b in members) == sorted(sampled.unique().tolist())
    assert flag == int(repeats >= 16)
    if structure != "bitmap":
        empty = torch.iinfo(torch.int32).min
        assert sorted(table[:slots][table[:slots] != empty].tolist()) == \
            sorted(sampled.unique().tolist())


def test_hash_collisions(cpu_triton):
    """Keys that differ only above the hash's bits, to lengthen probe chains."""
    test = (torch.arange(300, dtype=torch.int64) << 40) + 11
    elements = torch.cat([test, test + 1, (torch.arange(300, dtype=torch.int64) << 41) + 11])
    for backend in ("hash", "bitmap", "search"):
        check(elements, test, backend)


def _on_chip_home(keys: torch.Tensor, log_t: int) -> torch.Tensor:
    """The home slot that the on-chip hash table gives keys in [0, 2**31) (common._hash with
    Fibonacci hashing; an int64 key of that range folds to itself)."""
    h = keys.to(torch.int64)
    h = h ^ (h >> 16)
    return ((h * 0x9E3779B1) & 0xFFFFFFFF) >> (32 - log_t)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("cluster", [5, 16, 17, 30])
@pytest.mark.slow
def test_on_chip_lookups_reach_the_farthest_key(cpu_triton, dtype, cluster):
    """Test values that share one home slot fill `cluster` slots from it. On-chip lookups read up
    to 16 slots with no search loop when the table's farthest key is within them (cluster <= 16)
    and search on past them otherwise: members and non-members of that home on both sides of
    the bound, and far past it."""
    gen = torch.Generator().manual_seed(cluster)
    n = 200  # the on-chip table: 2048 int32 slots or 1024 int64 slots
    log_t = isin_mod.common.table_plan(n, dtype.itemsize * 8, True)[0]
    pool = torch.randint(0, 2**31 - 1, (1 << 21,), generator=gen).unique()
    homes = _on_chip_home(pool, log_t)
    same = pool[homes == homes[0]]
    assert len(same) > 2 * cluster
    # the other test values live well away from that slot, so the farthest key is the cluster's
    # last (cluster - 1 slots from its home)
    away = (homes - homes[0]) % (1 << log_t)
    others = pool[(away > 2 * cluster + 16) & (away < (1 << log_t) - 16)][: n - cluster]
    test = torch.cat([same[:cluster], others]).to(dtype)
    absent = same[cluster: 2 * cluster]
    elements = torch.cat([same[:cluster], absent, others, pool[-300:]]).to(dtype)
    elements = elements[torch.randperm(len(elements), generator=gen)]
    for backend in ("hash", "bitmap"):
        b = isin_mod.OP.backend(backend)
        call = isin_mod.prepare(elements, test)
        expected = torch.isin(elements, test)
        for cfg in b.configs(call):
            _assert_same(b.run(call, cfg), expected, elements, test, f"{backend} {cfg}")


@pytest.mark.parametrize("backend", TRITON_BACKENDS)
@pytest.mark.slow
def test_every_config(cpu_triton, backend):
    """Forcing a backend runs its first config only; tuning may pick any of them. Test sets on
    both sides of compare's unrolled limit (64) and of a power of two."""
    b = isin_mod.OP.backend(backend)
    gen = torch.Generator().manual_seed(5)
    dtypes = [torch.int32] if backend == "bitmap" else [torch.int32, torch.float32]
    for dtype, n in [(d, n) for d in dtypes for n in (1, 5, 16, 63, 64, 65, 300)]:
        # (floats: hashed by murmur's finaliser in tables read through L2, Fibonacci on chip)
        test = random_values(n, dtype, "cpu", lo=-40, hi=400, gen=gen)
        elements = random_values(700, dtype, "cpu", lo=-40, hi=400, gen=gen)
        for invert in (False, True):
            call = isin_mod.prepare(elements, test, invert=invert)
            expected = torch.isin(elements, test, invert=invert)
            for cfg in b.configs(call):
                _assert_same(b.run(call, cfg), expected, elements, test, f"{backend} {cfg}")


@pytest.mark.parametrize("backend", TRITON_BACKENDS)
def test_shapes_empty_scalar_noncontiguous(cpu_triton, backend):
    base = torch.arange(60, dtype=torch.int32).reshape(3, 4, 5)
    test = torch.tensor([3, 17, 59, 100], dtype=torch.int32)
    check(base, test, backend)  # rank 3
    check(base.transpose(0, 2), test, backend)  # non-contiguous elements
    check(base[:, ::2, 1:], base[0, :, ::3], backend)  # both non-contiguous, 2-d test set
    assert torch.equal(ops.isin(base, base[0, :, ::3], backend="torch"),
                       torch.isin(base, base[0, :, ::3].contiguous()))
    check(torch.tensor(17, dtype=torch.int32), test, backend)  # 0-d elements
    check(base, torch.tensor(17, dtype=torch.int32), backend)  # 0-d test set
    check(torch.empty(0, 3, dtype=torch.int32), test, backend)  # no elements
    check(base, torch.empty(0, dtype=torch.int32), backend)  # no test elements
    check(torch.empty(0, dtype=torch.int32), torch.empty(0, dtype=torch.int32), backend)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    backend=st.sampled_from(TRITON_BACKENDS),
    dtype=st.sampled_from([torch.int8, torch.int32, torch.int64, torch.float32, torch.float16]),
    m=st.integers(0, 200),
    n=st.integers(0, 120),
    span=st.sampled_from([3, 50, 10**6, None]),
    invert=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_property_matches_torch(cpu_triton, backend, dtype, m, n, span, invert, seed):
    if not supports(backend, dtype):
        return
    gen = torch.Generator().manual_seed(seed)
    lo, hi = (None, None) if span is None else (-span // 2, span // 2 + 1)
    elements = random_values(m, dtype, "cpu", lo=lo, hi=hi, gen=gen)
    test = random_values(n, dtype, "cpu", lo=lo, hi=hi, gen=gen)
    check(elements, test, backend, invert=invert)


# ------------------------------------------------------------------------------------------------
# torch's argument rules
# ------------------------------------------------------------------------------------------------
def test_scalars_and_promotion(cpu_triton):
    cases = [
        (torch.tensor([44, -1, 3], dtype=torch.int8), 300),  # 300 wraps to int8 44, as in torch
        (torch.tensor([44, -1, 3], dtype=torch.int8), 255),
        (torch.tensor([1, 2, 3], dtype=torch.int8), 2.5),  # promotes to float: nothing matches
        (torch.tensor([1, 2], dtype=torch.int8), torch.tensor([1.5, 2.0])),
        (torch.tensor([2**31], dtype=torch.int64), torch.tensor([0], dtype=torch.int32)),
        (torch.tensor([1.0], dtype=torch.float16), torch.tensor([1.0], dtype=torch.float64)),
        (torch.tensor([16777217]), 16777217.0),
        (3, torch.tensor([1, 3, 5])),
        (3.5, torch.tensor([1, 3, 5])),
        (300, torch.tensor([44], dtype=torch.int8)),
    ]
    for backend in ["torch", *TRITON_BACKENDS]:
        for e, t in cases:
            expected = torch.isin(e, t)
            try:
                got = ops.isin(e, t, backend=backend)
            except BackendError:
                assert backend == "bitmap"
                continue
            assert got.shape == expected.shape and torch.equal(got, expected), (backend, e, t)


def test_auto_matches_torch_and_keeps_shape(cpu_triton):
    elements = torch.randint(0, 50, (4, 5, 6))
    test = torch.randint(0, 50, (7, 2))
    got = ops.isin(elements, test)
    assert got.shape == (4, 5, 6) and torch.equal(got, torch.isin(elements, test))
    assert torch.equal(ops.isin(elements, test, invert=True), torch.isin(elements, test, invert=True))


def test_runs_on_cpu_without_interpreter(monkeypatch):
    """Without the interpreter, CPU tensors go to torch; Triton backends explain why they can't."""
    monkeypatch.setattr(opselect.dispatch.device, "INTERPRETED", False)
    a, b = torch.tensor([1, 2, 3]), torch.tensor([2])
    d = opselect.explain("isin", a, b, show=False)
    assert d.choice == "torch" and d.source == "only candidate"
    assert "CUDA" in d.candidate("hash").verdict
    assert torch.equal(ops.isin(a, b), torch.isin(a, b))
    assert opselect.explain("isin", a, b, show=False).source == "memo"
    with pytest.raises(BackendError, match="TRITON_INTERPRET=1.*Backends that can: torch"):
        ops.isin(a, b, backend="hash")


def test_python_float_keeps_double_precision(cpu_triton):
    """A Python float is a double: a float64 subnormal (or a value float32 cannot hold) stays
    itself (it was made a float32 tensor first, which flushed 5.6e-309 to 0.0 and matched
    -0.0; tests/test_fuzz.py found it on the GPU)."""
    x = torch.tensor([-0.0, 0.0, 5.562684646268003e-309, 1.0, 1.0 + 2**-40], dtype=torch.float64)
    for value in (5.562684646268003e-309, 1.0 + 2**-40, 1e300):
        want = torch.isin(x, value)
        for b in (None, "torch", "compare", "search", "hash"):
            assert torch.equal(ops.isin(x, value, backend=b), want), (value, b)
            assert torch.equal(ops.isin(value, x, backend=b), torch.isin(value, x)), (value, b)


def _promotion_cases(dev):
    """(name, elements, test) where a 0-d tensor or a Python number meets another dtype: torch
    promotes these differently on the CPU (result_type: a 0-d tensor defers) and on CUDA (both
    tensors flattened first); opselect answers as torch does on the same device."""
    off = (torch.tensor(1.541015625) + 1e-4).to(dev)
    yield "f16 vs 0-d f32", torch.full((20,), 1.541015625, dtype=torch.float16, device=dev), off
    yield "0-d f32 vs f16", off, torch.tensor([1.541015625], dtype=torch.float16, device=dev)
    yield "i32 vs 0-d i64", torch.tensor([5], dtype=torch.int32, device=dev), \
        torch.tensor(2**33 + 5, device=dev)
    yield "u8 vs 0-d i8", torch.tensor([255, 1], dtype=torch.uint8, device=dev), \
        torch.tensor(-1, dtype=torch.int8, device=dev)
    yield "f16 vs python float", torch.tensor([1.0], dtype=torch.float16, device=dev), 1.0001
    yield "i8 vs python int", torch.tensor([44], dtype=torch.int8, device=dev), 300


@pytest.mark.parametrize("dev", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_promotion_as_torch_on_the_device(dev):
    if dev == "cpu":
        if not INTERPRETED:
            pytest.skip("interpreter run")
    elif not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    for name, e, t in _promotion_cases(dev):
        want = torch.isin(e, t)
        for b in (None, "torch", "compare", "search", "hash"):
            assert torch.equal(ops.isin(e, t, backend=b), want), (name, b)


def test_bad_inputs():
    with pytest.raises(UnsupportedDType, match="bool"):
        ops.isin(torch.tensor([True]), torch.tensor([True]))
    with pytest.raises(UnsupportedDType, match="complex64"):
        ops.isin(torch.ones(2, dtype=torch.complex64), torch.ones(2, dtype=torch.complex64))
    with pytest.raises(NotImplementedError, match="UInt16"):  # torch's own error
        ops.isin(torch.ones(2, dtype=torch.uint16), torch.ones(2, dtype=torch.uint16))
    with pytest.raises(UnsupportedDType, match="test_elements is a bool"):
        ops.isin(torch.tensor([1, 2]), True)
    with pytest.raises(InvalidArgument, match="at least one of elements and test_elements"):
        ops.isin(2, 3)
    with pytest.raises(InvalidArgument, match="Python number"):
        ops.isin(torch.tensor([1]), "a")
    with pytest.raises(InvalidArgument, match="same device"):
        ops.isin(torch.ones(2, device="meta"), torch.ones(2))
    with pytest.raises(InvalidArgument, match="out must have dtype torch.bool"):
        ops.isin(torch.ones(2), torch.ones(2), out=torch.empty(2))
    # torch's error types still catch ours
    with pytest.raises(RuntimeError):
        ops.isin(torch.tensor([True]), torch.tensor([True]))
    with pytest.raises(ValueError, match="unknown backend 'nope'; valid names: auto, torch, compare"):
        ops.isin(torch.ones(2), torch.ones(2), backend="nope")


def test_forced_backend_that_cannot(cpu_triton):
    with pytest.raises(BackendError) as info:
        ops.isin(torch.ones(3), torch.ones(2), backend="bitmap")
    msg = str(info.value)
    assert "integer dtypes only" in msg and "Backends that can: torch, compare, search, hash" in msg
    with pytest.raises(BackendError, match="compare is for at most"):
        ops.isin(torch.ones(3), torch.ones(70000), backend="compare")


def test_out_resized_like_torch(cpu_triton):
    out = torch.empty(0, dtype=torch.bool)
    got = ops.isin(torch.tensor([[1, 2], [3, 4]]), torch.tensor([4]), out=out, backend="hash")
    assert got is out and out.shape == (2, 2) and out.tolist() == [[False, False], [False, True]]
    with pytest.warns(UserWarning, match="resizing"):
        ops.isin(torch.tensor([1, 2, 3]), torch.tensor([4]), out=torch.empty(5, dtype=torch.bool))
    # a non-contiguous out is written through a temporary
    big = torch.zeros(4, 2, dtype=torch.bool)
    out = big[:, 0]
    ops.isin(torch.tensor([1, 2, 3, 4]), torch.tensor([2, 4]), out=out, backend="search")
    assert big.tolist() == [[False, False], [True, False], [False, False], [True, False]]


# ------------------------------------------------------------------------------------------------
# Prepared calls (Backend.bind): made once per plain key, then run on every later input of it
# ------------------------------------------------------------------------------------------------
# (layout, isin's flags): each a plain key of its own
PREPARED_CASES = [("plain", {}), ("plain", {"invert": True}), ("strided", {}),
                  ("offset", {"assume_unique": True})]


def _fresh_inputs(layout, dtype, gen):
    """Fresh (elements, test_elements) of one plain key per layout, about half of the elements
    members. plain: (3, 40) elements, 23 test elements, with the values the kernels treat
    specially (NaN, -0.0 and 0.0; the dtype's extremes, the hash set's empty marker among
    them). strided: the elements through a transpose and every other test element, with
    values between them that match nothing (a kernel that read the memory as flat would see
    them). offset: 1-d elements one element into their storage (another alignment), both
    sets free of duplicates, as assume_unique promises."""
    if layout == "offset":
        elements = (torch.randperm(64, generator=gen)[:41] - 32).to(dtype)
        return elements[1:], (torch.randperm(64, generator=gen)[:23] - 32).to(dtype)
    elements = random_values(120, dtype, "cpu", lo=-30, hi=30, gen=gen)
    test = random_values(23, dtype, "cpu", lo=-30, hi=30, gen=gen)
    if dtype.is_floating_point:
        elements[:3] = torch.tensor([float("nan"), -0.0, 0.0])
        test[:2] = torch.tensor([0.0, float("nan")])
    else:
        info = torch.iinfo(dtype)
        elements[:3] = torch.tensor([info.min, info.max, info.min + 1])
        test[:2] = torch.tensor([info.min, info.max - 1])
    elements = elements[torch.randperm(120, generator=gen)]
    if layout == "plain":
        return elements.reshape(3, 40), test
    between = random_values(23, dtype, "cpu", lo=100, hi=120, gen=gen)
    return elements.reshape(40, 3).t(), torch.stack([test, between], 1).reshape(-1)[::2]


def _plain_key(elements, test, flags):
    return plain_key(elements, test, flags.get("assume_unique", False),
                     flags.get("invert", False))


@pytest.mark.parametrize("backend", TRITON_BACKENDS)
@pytest.mark.slow
def test_prepared_call_answers_every_input_of_its_key(cpu_triton, backend):
    """bind(call) once, then the prepared call on fresh inputs of the call's plain key (other
    values, other storage): torch.isin's answer each time, into a new tensor and into a
    contiguous out (run()'s way). Calls with out= or nothing to launch are not prepared."""
    b = isin_mod.OP.backend(backend)
    gen = torch.Generator().manual_seed(11)
    # (int8: bitmap's whole-range bitmap; int64 with its extremes: bitmap's hash set)
    dtypes = [torch.int8, torch.int32, torch.int64]
    if backend != "bitmap":
        dtypes.append(torch.float32)
    for dtype in dtypes:
        for layout, flags in PREPARED_CASES:
            elements, test = _fresh_inputs(layout, dtype, gen)
            key = _plain_key(elements, test, flags)
            call = isin_mod.prepare(elements, test, **flags)
            prepared = b.bind(call, b.configs(call)[0])
            assert prepared is not None, (backend, dtype, layout)
            for _ in range(3):
                elements, test = _fresh_inputs(layout, dtype, gen)
                assert _plain_key(elements, test, flags) == key
                expected = torch.isin(elements, test, **flags)
                what = f"{backend} {layout} {flags}"
                _assert_same(prepared(elements, test), expected, elements, test, what)
                poisoned = (~expected).contiguous()
                assert prepared(elements, test, poisoned) is poisoned
                _assert_same(poisoned, expected, elements, test, what)
    a, t = torch.tensor([1, 2, 3]), torch.tensor([2])
    config = b.configs(isin_mod.prepare(a, t))[0]
    for unprepared in (isin_mod.prepare(a, t, out=torch.empty(3, dtype=torch.bool)),
                       isin_mod.prepare(a, t[:0]), isin_mod.prepare(a[:0], t)):
        assert b.bind(unprepared, config) is None


@pytest.mark.parametrize("backend", TRITON_BACKENDS)
def test_forced_backend_prepares_each_key_once(cpu_triton, backend, monkeypatch):
    """ops.isin(..., backend=name) binds a plain key's call once: later calls of the key, with
    new inputs, are answered by its forced route (Op.forced_routes), with no plan looked up and
    nothing bound again. Another key binds once more; a call with out= runs, binding nothing."""
    cls = type(isin_mod.OP.backend(backend))
    binds, plans = [], []
    real_bind, real_plan = cls.bind, cls.plan

    def counting_bind(self, call, config):
        binds.append(call)
        return real_bind(self, call, config)

    def counting_plan(self, *args, **kwargs):
        plans.append(args)
        return real_plan(self, *args, **kwargs)

    monkeypatch.setattr(cls, "bind", counting_bind)
    monkeypatch.setattr(cls, "plan", counting_plan)
    gen = torch.Generator().manual_seed(12)
    for layout, flags in PREPARED_CASES[:2]:
        for i in range(3):
            elements, test = _fresh_inputs(layout, torch.int32, gen)
            got = ops.isin(elements, test, backend=backend, **flags)
            _assert_same(got, torch.isin(elements, test, **flags), elements, test, backend)
            if i == 0:
                key = (backend, _plain_key(elements, test, flags))
                assert isin_mod.OP.forced_routes[key] is not None
        assert len(binds) == len(plans) == (1 if flags == {} else 2), (binds, plans)
    out = torch.empty(3, 40, dtype=torch.bool)
    assert ops.isin(elements, test, out=out, backend=backend, invert=True) is out
    _assert_same(out, torch.isin(elements, test, invert=True), elements, test, backend)
    assert len(binds) == 2 and len(plans) == 3


# ------------------------------------------------------------------------------------------------
# The same on the GPU, at real sizes
# ------------------------------------------------------------------------------------------------
GPU_SIZES = [(1 << 20, 16), (3_000_001, 1000), (1 << 22, 1 << 16), (1 << 20, 3_000_000)]


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["torch", *TRITON_BACKENDS])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.float32, torch.int16,
                                   torch.bfloat16, torch.float64, torch.uint8], ids=str)
def test_gpu_random(cuda, backend, dtype):
    if not supports(backend, dtype):
        pytest.skip("integers only")
    gen = torch.Generator().manual_seed(1)
    for m, n in GPU_SIZES:
        if not takes(backend, n):
            continue
        for narrow in (True, False):
            lo, hi = (0, 2 * n) if narrow else (None, None)
            test = random_values(n, dtype, "cpu", lo=lo, hi=hi, gen=gen).to(cuda)
            elements = random_values(m, dtype, "cpu", lo=lo, hi=hi, gen=gen).to(cuda)
            elements[: m // 2] = test[torch.randint(0, n, (m // 2,), generator=gen).to(cuda)]
            check(elements, test, backend)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", TRITON_BACKENDS)
def test_gpu_edges(cuda, backend):
    nan, inf = float("nan"), float("inf")
    if backend != "bitmap":
        for dtype in FLOAT_DTYPES:
            e = torch.tensor([nan, -0.0, 0.0, inf, -inf, 1.5, 2.0] * 1000, dtype=dtype, device=cuda)
            check(e, torch.tensor([nan, 0.0, inf, 1.5], dtype=dtype, device=cuda), backend)
    for dtype in INT_DTYPES:
        info = torch.iinfo(dtype)
        e = torch.tensor([info.min, info.max, 0, 1] * 1000, dtype=dtype, device=cuda)
        check(e, torch.tensor([info.min, 1], dtype=dtype, device=cuda), backend)
    base = torch.arange(1 << 16, device=cuda, dtype=torch.int32).reshape(256, 256)
    check(base.t(), torch.tensor([5, 70000, 255], device=cuda, dtype=torch.int32), backend)
    check(torch.empty(0, device=cuda, dtype=torch.int32), base[:8], backend)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", TRITON_BACKENDS)
def test_gpu_bound_launches(cuda, backend, monkeypatch):
    """Every launch of a backend with verify on (Triton binds each call and must pick the very
    kernel the backend's spec names: a spec that misses an argument Triton specializes on fails
    here), then the bound fast path on fresh data of the same calls: dtypes, sizes that are and
    are not multiples of 16, a misaligned input, with and without out=."""
    from opselect.kernels._common import Launcher

    gen = torch.Generator().manual_seed(3)
    cases = [(5000, 16), (4096, 1000), (100_003, 3000), (1 << 20, 70_000)]
    for dtype in (torch.int32, torch.int64, torch.float32, torch.int16, torch.bfloat16):
        if not supports(backend, dtype):
            continue
        for m, n in cases:
            if not takes(backend, n):
                continue
            for offset in (0, 1):  # 1: the elements start off 16 bytes
                def fresh():
                    test = random_values(n, dtype, "cpu", lo=0, hi=2 * n, gen=gen).to(cuda)
                    e = random_values(m + offset, dtype, "cpu", lo=0, hi=2 * n, gen=gen).to(cuda)
                    return e[offset:], test
                for verify in (True, False):
                    monkeypatch.setattr(Launcher, "verify", verify)
                    for _ in range(2):
                        check(*fresh(), backend)  # with a poisoned out= and without


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64], ids=str)
def test_gpu_cuckoo_stash_and_repeats(cuda, dtype):
    """The GPU's build, many lanes exchanging at once: ten keys on one pair of slots (eight
    end in the stash), a set of many copies of a few values, and 16,384 random values (the
    bound) in 3M elements, with and without invert."""
    from opselect.kernels.isin import cuckoo

    key_bits = 64 if dtype == torch.int64 else 32
    gen = torch.Generator().manual_seed(5)
    n = 16
    bad = colliding_keys(10, cuckoo.cuckoo_table_log2(n), key_bits, start=1 << 20)
    test = torch.tensor(bad + list(range(6)), dtype=dtype, device=cuda)
    elements = test[torch.randint(0, n, (1 << 20,), generator=gen).to(cuda)]
    elements[::2] += 1
    check(elements, test, "cuckoo")
    check(elements, test, "cuckoo", invert=True)
    repeats = torch.tensor([7, -3, 9] * 600, dtype=dtype, device=cuda)
    check(torch.arange(-50, 50, dtype=dtype, device=cuda).repeat(1000), repeats, "cuckoo")
    test = random_values(16384, dtype, "cpu", gen=gen).to(cuda)
    elements = random_values(3_000_001, dtype, "cpu", gen=gen).to(cuda)
    elements[::2] = test[torch.randint(0, 16384, (1_500_001,), generator=gen).to(cuda)]
    check(elements, test, "cuckoo")
    check(elements, test, "cuckoo", invert=True)


@pytest.mark.gpu
def test_gpu_devices_like_torch(cuda):
    """A 0-d CPU tensor next to a CUDA tensor, and truly mixed devices: do what torch does."""
    a = torch.arange(10, device=cuda)
    for other in (torch.tensor(3), torch.tensor([3])):
        try:
            expected = torch.isin(a, other)
        except RuntimeError:
            with pytest.raises(RuntimeError):
                ops.isin(a, other)
        else:
            assert torch.equal(ops.isin(a, other), expected)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", TRITON_BACKENDS)
def test_gpu_more_than_2_31_elements(cuda, backend):
    free, _ = torch.cuda.mem_get_info()
    m = 2**31 + 4097
    if free < 3 * m + (1 << 30):
        pytest.skip("not enough GPU memory")
    elements = torch.empty(m, dtype=torch.int8, device=cuda)
    elements[: 1 << 20].random_(-128, 127)
    elements[1 << 20:] = 5
    elements[-3:] = torch.tensor([7, -3, 5], dtype=torch.int8, device=cuda)
    test = torch.tensor([7, -100], dtype=torch.int8, device=cuda)
    out = torch.ones(m, dtype=torch.bool, device=cuda)  # poison: every element should be False
    ops.isin(elements, test, out=out, backend=backend)
    assert out[-3:].tolist() == [True, False, False]
    assert int(out[1 << 20: -3].sum()) == 0
    assert torch.equal(out[: 1 << 20], torch.isin(elements[: 1 << 20], test))
    del elements, out
    torch.cuda.empty_cache()


@pytest.mark.gpu
def test_gpu_auto_and_tuning(cuda):
    a = torch.randint(0, 10**6, (1 << 22,), device=cuda)
    b = torch.randint(0, 10**6, (5000,), device=cuda)
    assert torch.equal(ops.isin(a, b), torch.isin(a, b))
    with opselect.tuning():
        assert torch.equal(ops.isin(a, b), torch.isin(a, b))
    d = opselect.explain("isin", a, b, show=False)
    assert d.source == "memo" and all(
        c.measured_s is not None and math.isfinite(c.measured_s) for c in d.candidates if c.supported)


@pytest.mark.parametrize("m,n,dtype,backend,first", [
    # a table copied on chip: 2048 x 4
    (8_000_000, 1000, torch.int32, "hash",
     {"probe_block": 2048, "blocks_per_program": 4, "on_chip": True}),
    # a table in L2: blocks of 512
    (8_000_000, 100_000, torch.int32, "hash", {"probe_block": 512, "slots_per_key": 4}),
    # a table of 4 slots a key past the H200's 60 MB of L2 (4M int32 keys: 64 MB): 2 slots a key
    (1_000_000, 4_000_000, torch.int32, "hash", {"probe_block": 1024, "slots_per_key": 2}),
    (1_000_000, 1_600_000, torch.int64, "hash", {"probe_block": 1024, "slots_per_key": 2}),
    # 256 values at most
    (1_000_000, 4_000_000, torch.uint8, "hash", {"probe_block": 512, "slots_per_key": 4}),
    (8_000_000, 1000, torch.int64, "bitmap", {"probe_block": 1024, "blocks_per_program": 1}),
])
def test_first_config_follows_the_h200_tuning(m, n, dtype, backend, first):
    """The config a cold pick runs, as the H200's tuning of bench_random's calls chose (see
    configs() in hash.py and bitmap.py)."""
    op = isin_mod.OP
    call = op.prepare(torch.empty(m, dtype=dtype, device="meta"),
                      torch.empty(n, dtype=dtype, device="meta"))
    call.info = DeviceInfo("cuda", 0, "NVIDIA H200", (9, 0), 132, 60 << 20, 141 << 30)
    cfg = op.backend(backend).configs(call)[0]
    assert {key: cfg[key] for key in first} == first


_NEGATIVE_NAN_BITS = {torch.float16: (torch.int16, -512), torch.bfloat16: (torch.int16, -64),
                      torch.float32: (torch.int32, -4194304),
                      torch.float64: (torch.int64, -2251799813685248)}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", list(_NEGATIVE_NAN_BITS), ids=str)
def test_search_with_a_negative_nan_in_the_test_set(cuda, dtype):
    """torch.sort on CUDA puts a NaN with its sign bit set first (torch's own float -> bfloat16
    copy makes them); search's table needs every NaN last, or elements equal to the smallest
    test value are missed."""
    bits, value = _NEGATIVE_NAN_BITS[dtype]
    nan = torch.tensor([value], dtype=bits, device=cuda).view(dtype)
    assert torch.isnan(nan).all() and (nan.view(bits) < 0).all()
    test = torch.cat([torch.tensor([3.0, -1.0, 7.0, 2.0], device=cuda, dtype=dtype), nan, nan])
    gen = torch.Generator(device=cuda).manual_seed(0)
    picks = torch.tensor([3.0, -1.0, 7.0, 2.0, 5.0, float("nan")], device=cuda, dtype=dtype)
    elements = picks[torch.randint(0, 6, (4096,), device=cuda, generator=gen)]
    want = torch.isin(elements, test)
    assert want[elements == -1.0].all()
    for backend in ("search", "compare", "hash"):
        got = ops.isin(elements, test, backend=backend)
        assert torch.equal(got, want), backend


#: Configs as tune records stored them before issue 34 (one name per tunable).
OLD_CONFIGS = {"compare": {"BLOCK": 1024, "TILE_N": 1, "num_warps": 4},
               "search": {"BLOCK": 512, "num_warps": 4},
               "hash": {"BLOCK": 1024, "PER_PROGRAM": 1, "LOCAL": False, "SLOTS": 4,
                        "num_warps": 4},
               "bitmap": {"BLOCK": 1024, "PER_PROGRAM": 1, "num_warps": 4}}


def test_configs_under_old_names_are_measured_again_never_misread(cpu_triton, monkeypatch):
    """A tune record under the old config keys (BLOCK, TILE_N, PER_PROGRAM, LOCAL, SLOTS) is not
    a config the backend offers: the dispatcher warns once per backend and the model decides
    until tuning measures again. A plan refuses the old keys (InvalidArgument) instead of
    running defaults in their place; today's names run."""
    from opselect.dispatch import op as dispatch_op
    from opselect.errors import CacheWarning
    from opselect.tune_cache import store

    op = isin_mod.OP
    monkeypatch.setattr(dispatch_op, "_foreign_configs_told", set())
    gen = torch.Generator().manual_seed(3)
    a = torch.randint(0, 60, (3000,), generator=gen, dtype=torch.int32)
    t = torch.randint(0, 60, (40,), generator=gen, dtype=torch.int32)
    call = op.prepare(a, t)
    assert all(op.backend(name).supports(call) is None for name in OLD_CONFIGS)
    hashes = {name: op.backend(name).source_hash for name in OLD_CONFIGS}
    store().put_timings("isin", call.info, call.key[1:],
                        {name: (1e-9, old, hashes[name]) for name, old in OLD_CONFIGS.items()})
    with pytest.warns(CacheWarning, match="that the backend does not offer") as told:
        decision = op.decide(call)
    assert sorted(str(w.message).split("config of isin/")[1].split()[0] for w in told) == \
        sorted(OLD_CONFIGS)
    assert decision.source == "model" and not any(
        decision.candidate(name).measured_s is not None for name in OLD_CONFIGS)
    assert decision.config in [dict(c) for c in op.backend(decision.choice).configs(call)]
    want = torch.isin(a, t)
    for name, old in OLD_CONFIGS.items():
        backend = op.backend(name)
        with pytest.raises(InvalidArgument, match="are not this backend's"):
            backend.run(op.prepare(a, t), old)
        assert torch.equal(backend.run(op.prepare(a, t), backend.configs(call)[0]), want), name
