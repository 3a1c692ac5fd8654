"""What several isin backends share: the order-keeping integer key of a value, the hash of a key,
and the open-addressing hash set (insert, lookup, probe blocks) that hash and bitmap both use."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ...dispatch.backend import PlannedBackend
from ...heuristics.isin import PREINSERT_FROM
from .._common import Launcher, cdiv, check_config, plan_launcher  # noqa: F401 (the backends import the last two from here)
from .call import IsinCall, _bindable, _every_answer_invert, _finish, _output


# Tables at most this large are "on chip": they stay in L1, and every program of the probe
# kernel reads one whole to bound its lookups (_probe_reach).
LOCAL_TABLE_BYTES = 32 * 1024


# Slots per bucket of a table read through L2: a lookup reads its bucket in one access (16 bytes
# of int32 keys, one memory sector). On-chip tables use single slots (a window of several
# slots read through L1 measured slower).
WIDE_BUCKET = tl.constexpr(4)


# The most slots an on-chip lookup reads without the search loop (_hash_lookup); random sets of
# up to 1,024 keys at 4 slots a key need at most 11 (CPU simulation of the build); a table that
# needs more keeps the loop for what is left.
BOUNDED_PROBES = tl.constexpr(16)


# Slots a build's lane reads before its atomics, to skip a key already in the table
# (_hash_insert's check_first).
FIRST_LOOKS = tl.constexpr(4)

# Test sets of at least PREINSERT_FROM elements (heuristics/isin.py, which charges the launch)
# get a pre-insert launch (SetPlan.preinsert_stride): one program inserts every stride-th
# element, PREINSERT_ELEMENTS of them. A value repeated r times costs the build about r
# serialised atomics without it; a value the pre-insert missed appears about
# N / PREINSERT_ELEMENTS times at most, a few microseconds.
PREINSERT_ELEMENTS = 1024
# The pre-insert turns the build's check on when at least this many of its elements were
# repeats: a value of at least about 1.5% of the set. Such a value serialises about as much
# time on its slot as the check costs the whole build (0.8 ns an atomic against about 0.011 ns
# an element: 1M distinct int32 values, 60 -> 72 us).
REPEATS_FOR_CHECK = tl.constexpr(16)


# ---------------------------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------------------------
@triton.jit
def _value_key(v):
    """(key, nan): an integer of v's own width, equal for equal values and ordered as the values
    are, made from the bits alone (no float operation, so no flush to zero). Floats: the
    magnitude bits, negated for negative values (so -0.0 and +0.0 are both 0), and the largest
    key for every NaN (torch.sort puts NaN last, whatever its sign); nan says which lanes are NaN,
    which are never members. Integers are their own keys."""
    if v.dtype == tl.float64:
        bits = v.to(tl.int64, bitcast=True)
        mag = bits & 0x7FFFFFFFFFFFFFFF
        nan = mag > 0x7FF0000000000000
        key = tl.where(nan, 0x7FFFFFFFFFFFFFFF, tl.where(bits < 0, -mag, mag))
    elif v.dtype == tl.float32:
        bits = v.to(tl.int32, bitcast=True)
        mag = bits & 0x7FFFFFFF
        nan = mag > 0x7F800000
        key = tl.where(nan, 0x7FFFFFFF, tl.where(bits < 0, -mag, mag))
    elif v.dtype == tl.float16:
        bits = v.to(tl.int16, bitcast=True)
        mag = bits & 0x7FFF
        nan = mag > 0x7C00
        key = tl.where(nan, 0x7FFF, tl.where(bits < 0, -mag, mag)).to(tl.int16)
    elif v.dtype == tl.bfloat16:
        bits = v.to(tl.int16, bitcast=True)
        mag = bits & 0x7FFF
        nan = mag > 0x7F80
        key = tl.where(nan, 0x7FFF, tl.where(bits < 0, -mag, mag)).to(tl.int16)
    else:
        key = v
        nan = v != v  # False: integers have no NaN
    return key, nan


@triton.jit
def _to_key(v, key_bits: tl.constexpr):
    """(key, nan) with the key widened to key_bits (the hash set's slots)."""
    key, nan = _value_key(v)
    # One return statement: the compiler rejects returns of different types in constexpr
    # branches (the interpreter does not).
    if key_bits == 32:
        wide = key.to(tl.int32)
    else:
        wide = key.to(tl.int64)
    return wide, nan


@triton.jit
def _mul32(h, c):
    """h * c mod 2**32 for uint32 h (signed multiply: the same bits, no 64-bit widening)."""
    return (h.to(tl.int32, bitcast=True) * c).to(tl.uint32, bitcast=True)


@triton.jit
def _mix32(key, key_bits: tl.constexpr, murmur_mix: tl.constexpr):
    """A key's 32-bit hash, as uint32, after folding a 64-bit key's high word into the low one.

    Integers: Fibonacci hashing (key * 2**32 / phi, whose top bits _hash takes), which spreads
    consecutive keys (ids, narrow ranges) exactly evenly. Floats (murmur_mix): murmur3's
    finaliser. The bits of floats of small integers differ only in a few high bits, and Fibonacci
    hashing clusters them (mean linear-probing displacement 0.61 slots for 1e6 floats of integers
    below 2e6 at load 1/4, against 0.12 with the finaliser; measured on the CPU)."""
    if key_bits == 64:
        h = key.to(tl.int32) ^ ((key >> 32).to(tl.int32) * -2048144789)  # fold in the high word
    else:
        h = key
    h = h.to(tl.uint32, bitcast=True)
    h = h ^ (h >> 16)
    if murmur_mix:
        h = _mul32(h, -2048144789)  # 0x85EBCA6B
        h = h ^ (h >> 13)
        h = _mul32(h, -1028477387)  # 0xC2B2AE35
        h = h ^ (h >> 16)
    else:
        h = _mul32(h, -1640531535)  # 0x9E3779B1
    return h


@triton.jit
def _hash(key, log_t, key_bits: tl.constexpr, murmur_mix: tl.constexpr):
    """A slot in [0, 2**log_t): the top bits of _mix32."""
    return (_mix32(key, key_bits, murmur_mix) >> (32 - log_t)).to(tl.int32)


@triton.jit
def _hash_insert(table_ptr, flag_ptr, v, ok, log_t,
                 key_bits: tl.constexpr, bucket_width: tl.constexpr, murmur_mix: tl.constexpr,
                 check_first):
    """Insert the values v (where ok) into the linear-probing table of 2**log_t keys; probing
    starts at the first slot of the key's bucket of bucket_width slots. Returns the lanes whose
    key was in the table already (a repeat).

    check_first (a constexpr, or a flag read on the device): a lane whose key one of the first
    FIRST_LOOKS slots already holds is done without an atomic. Atomics on one address serialise
    (about 0.8 ns each on an H200), so a test set that repeats a value many times would queue
    every copy on that value's slot: the pre-insert launch (SetPlan.preinsert_stride) puts such
    values in the table first and raises the flag, and this check lets the build skip their
    copies. Sets without such repeats leave it off: its loads cost a build of 1M distinct int32
    values 19% (H200, benchmarks/results/h200/fits/isin.md, "hash: repeated test values").

    Slots only grow, by atomic max: a key takes an empty slot (the key type's minimum) or pushes
    out a smaller key, which then continues along its own probe sequence. No slot between a key's
    home and its place is ever empty again, so lookups stay correct, and unlike compare-and-swap
    (which has no mask in Triton) only the lanes still inserting touch memory."""
    key, nan = _to_key(v, key_bits)
    empty = -(1 << (key_bits - 1))
    # The empty marker is the key type's minimum. Float keys never reach it (the most negative is
    # -inf's, -(max magnitude)); an integer test set may contain it, which flag_ptr records (any
    # value but the marker).
    tl.store(flag_ptr + tl.zeros(key.shape, dtype=tl.int32), tl.zeros(key.shape, key.dtype),
             mask=ok & (key == empty))
    todo = ok & (key != empty) & ~nan  # NaN is never a member
    slot = (_hash(key, log_t, key_bits, murmur_mix) // bucket_width) * bucket_width
    if check_first:
        # A key found here is in the table for good: a slot's key only moves on when a larger
        # key takes the slot, and the lane that takes it carries the smaller key on.
        look = todo
        for i in tl.static_range(FIRST_LOOKS):
            seen = tl.load(table_ptr + ((slot + i) & ((1 << log_t) - 1)), mask=look, other=empty)
            todo = todo & (seen != key)
            look = look & (seen != key) & (seen != empty)
    there = ok & ~todo & (key != empty) & ~nan
    while tl.max(todo.to(tl.int32), axis=0) > 0:
        old = tl.atomic_max(table_ptr + slot, key, mask=todo, sem="relaxed")
        # old == empty: placed. old == key: already there. old > key: that slot belongs to a
        # larger key, try the next. empty < old < key: placed, and `old` was pushed out.
        there = there | (todo & (old == key))
        pushed = todo & (old != empty) & (old < key)
        key = tl.where(pushed, old, key)
        todo = todo & (old != empty) & (old != key) | pushed
        slot = tl.where(todo, (slot + 1) & ((1 << log_t) - 1), slot)
    return there


@triton.jit
def _search_on(table_ptr, slot, key, found, todo, log_t, empty):
    """Linear probing from `slot` on until the key (a hit) or an empty slot (a miss), for the
    lanes in todo, with masked loads (the table is hot in L1 / L2); a block waits for its
    longest probe. The lanes' `found` after it."""
    while tl.max(todo.to(tl.int32), axis=0) > 0:
        slot = slot & ((1 << log_t) - 1)
        seen = tl.load(table_ptr + slot, mask=todo, other=empty)
        found = found | (todo & (seen == key))
        todo = todo & (seen != key) & (seen != empty)
        slot = slot + 1
    return found


@triton.jit
def _probe_reach(table, log_t, key_bits: tl.constexpr, slots: tl.constexpr,
                 murmur_mix: tl.constexpr):
    """How many slots from its home a lookup in an on-chip table must read: one past the
    farthest any stored key sits from its own home. Linear probing places a key in the first free
    slot it meets (or pushes a smaller key on), so a key that is not within this many slots of
    its home is not in the table."""
    empty = -(1 << (key_bits - 1))
    home = _hash(table, log_t, key_bits, murmur_mix)
    distance = (tl.arange(0, slots) - home) & ((1 << log_t) - 1)
    return tl.max(tl.where(table != empty, distance, -1), axis=0) + 1


@triton.jit
def _hash_lookup(table_ptr, reach, flag_ptr, v, ok, log_t,
                 key_bits: tl.constexpr, on_chip: tl.constexpr, murmur_mix: tl.constexpr):
    """Membership of the values v in the table. on_chip: keys start at their own slot, and
    `reach` is _probe_reach's bound; otherwise at their bucket of WIDE_BUCKET slots."""
    key, nan = _to_key(v, key_bits)
    empty = -(1 << (key_bits - 1))
    # (the flag is loaded as a vector: mixing a scalar bool into vector masks trips the interpreter)
    found = (key == empty) & (tl.load(flag_ptr + tl.zeros(key.shape, tl.int32)) != empty)
    todo = ok & (key != empty)
    if on_chip:
        # As many slots as the table's reach (up to BOUNDED_PROBES), each read through L1 by the
        # lanes still searching: no test of whether a block's lanes are all done. A search loop
        # that waits for its block's longest probe, after a gather from a copy in shared memory,
        # took up to 1.5x as long on 16M elements in 256-1,024 values (H200 and H100:
        # benchmarks/results/h200/fits/isin.md, "hash: on-chip lookups of bounded reach").
        slot = _hash(key, log_t, key_bits, murmur_mix)
        steps = tl.minimum(reach, BOUNDED_PROBES)
        for step in range(steps):
            seen = tl.load(table_ptr + ((slot + step) & ((1 << log_t) - 1)), mask=todo,
                           other=empty)
            found = found | (todo & (seen == key))
            todo = todo & (seen != key) & (seen != empty)
        # A table whose keys cluster past the bound (an adversarial set) keeps the loop below.
        todo = todo & (tl.zeros(key.shape, tl.int32) + reach > BOUNDED_PROBES)
        slot = slot + steps
    else:
        # The key's whole bucket in one 16- or 32-byte load: at load factor <= 1/4 a bucket
        # almost always holds the key or an empty slot.
        home = tl.multiple_of(
            (_hash(key, log_t, key_bits, murmur_mix) // WIDE_BUCKET) * WIDE_BUCKET, WIDE_BUCKET)
        window = tl.load(table_ptr + home[:, None] + tl.arange(0, WIDE_BUCKET)[None, :],
                         mask=todo[:, None], other=empty)
        found = found | (todo & (tl.max((window == key[:, None]).to(tl.int32), axis=1) > 0))
        todo = todo & ~found & (tl.max((window == empty).to(tl.int32), axis=1) == 0)
        slot = home + WIDE_BUCKET
    found = _search_on(table_ptr, slot, key, found, todo, log_t, empty)
    return found & ~nan


@triton.jit
def _hash_probe_blocks(x_ptr, table_ptr, flag_ptr, out_ptr, M, log_t, pid,
                       key_bits: tl.constexpr, on_chip_slots: tl.constexpr,
                       invert: tl.constexpr, probe_block: tl.constexpr,
                       blocks_per_program: tl.constexpr, murmur_mix: tl.constexpr):
    """One program's blocks of elements looked up in the hash set. on_chip_slots > 0: the table
    has that many slots (2**log_t), few enough to stay in L1; the program reads it once to find
    its reach."""
    reach = 0
    if on_chip_slots > 0:
        reach = _probe_reach(tl.load(table_ptr + tl.arange(0, on_chip_slots)), log_t, key_bits,
                             on_chip_slots, murmur_mix)
    for i in range(blocks_per_program):
        offs = (pid * blocks_per_program + i) * probe_block + tl.arange(0, probe_block)
        ok = offs < M
        v = tl.load(x_ptr + offs, mask=ok, other=0)
        found = _hash_lookup(table_ptr, reach, flag_ptr, v, ok, log_t, key_bits,
                             on_chip_slots > 0, murmur_mix)
        tl.store(out_ptr + offs, found != invert, mask=ok)


def _key_bits(dtype: torch.dtype) -> int:
    return 64 if dtype.itemsize == 8 else 32


def _hash_table_log(n: int, slots_per_key: int = 4) -> int:
    """log2 of the table size: at least slots_per_key slots per test element (load factor at most
    1/slots_per_key: short probe chains, and a block waits for its longest), at least 2**4."""
    return max(4, (slots_per_key * n - 1).bit_length())


def table_plan(n: int, key_bits: int, local: bool, slots_per_key: int = 4) -> tuple[int, int]:
    """(log2 of the slots, the slots of an on-chip table or 0). On-chip tables come in two sizes
    only, a quarter of LOCAL_TABLE_BYTES and all of it: the size is a compile-time constant, and a
    few variants keep compilation rare; a roomier table only shortens the probes."""
    log_t = _hash_table_log(n, slots_per_key)
    most = LOCAL_TABLE_BYTES * 8 // key_bits
    if not local or (1 << log_t) > most:
        return log_t, 0
    slots = most // 4 if (1 << log_t) <= most // 4 else most
    return slots.bit_length() - 1, slots


def _blocks_per_program(m: int, block: int, per: int) -> int:
    """Several blocks per program amortise a program's read of a whole table or bitmap, but never
    more blocks than there are."""
    return max(1, min(per, cdiv(m, block)))


@dataclass(frozen=True, eq=False)
class SetPlan:
    """What the plans of the backends that build a set from test_elements and probe it share
    (hash, and bitmap's hash set past the bitmap's range)."""

    dtype: torch.dtype  # of elements and test_elements
    elements: int  # M
    test_elements: int  # N
    invert: bool  # isin(..., invert=True)
    key_bits: int  # 32 or 64: the width of the keys
    table_log2: int  # log2 of the hash set's slots
    on_chip_slots: int  # slots of a table that stays in L1, read whole by each probing program
    #                     for its reach (0: buckets read through L1/L2, searched by the loop)
    bucket_width: int  # slots read at once by a probe of a table read through L2
    build_block: int  # test elements per building program
    probe_block: int  # elements per probing block
    blocks_per_program: int  # probing blocks per program (amortises an on-chip copy)
    offsets_64bit: bool  # offsets past 2**31 elements
    num_warps: int  # of the probing launch

    @property
    def preinsert_stride(self) -> int:
        """The stride of the pre-insert launch over the test elements (0: no such launch)."""
        n = self.test_elements
        return n // PREINSERT_ELEMENTS if n >= PREINSERT_FROM else 0

    @property
    def preinsert_block(self) -> int:
        """The elements the pre-insert launch's one program inserts."""
        return PREINSERT_ELEMENTS


class TritonBackend(PlannedBackend):
    """A Triton backend of isin: its work is `_prepared(plan, call)`, a function of the inputs
    (call._prepared_call) that both a run and a route (bind) call, so the launch arithmetic has
    one code path."""

    def _launch(self, plan, call: IsinCall) -> torch.Tensor:
        if call.n == 0:
            # No test elements: every answer is `invert`. (Not an empty call: each element
            # still gets an answer, which no kernel needs to work out.)
            return _every_answer_invert(call)
        return _finish(call, self._prepared(plan, call)(call.elements, call.test, _output(call)))

    def bind(self, call: IsinCall, config):
        return self._prepared(self.plan(call, config), call) if _bindable(call) else None

    def plan_facts(self, call: IsinCall) -> tuple:
        """What most isin plans depend on (search's adds whether offsets need 64 bits)."""
        return call.elements.dtype, call.m, call.n, call.invert

    def _prepared(self, plan, call: IsinCall):
        """The prepared call of `call` under `plan`: isin(elements, test, out=None)."""
        raise NotImplementedError
