"""isin's cuckoo backend: test sets of up to CUCKOO_MAX_KEYS values in a cuckoo hash table, so
that every lookup reads at most two slots, with no loop. Tables of up to 4,096 values (128 KB)
stay in L1; larger ones are read partly through L2.

A key lives in one of its two slots, h1(key) or h2(key). The hash backend's linear probing reads
as many slots as its table's reach (3-8 on sets of 1,024 random values), and each of those steps
is paid by every lane of a block; here a lookup reads h1, and h2 only where h1 did not hold the
key, which is what sets the time once the stream of elements is paid for.

The build is parallel: every lane swaps its key into its first slot (atomic exchange) and
carries whatever it pushed out on to that key's other slot, until it pushes out nothing (an empty
slot) or its own key (a copy already placed: test sets may repeat values). A key is always in
the table at one of its two slots or carried by a lane, so nothing is lost. After
MAX_KICKS rounds, a lane still carrying a key appends it to the stash, a list that every lookup
compares against in full. Random sets at a quarter load never get there; a set built to collide
(many keys with the same two slots) does, and stays correct, only slower (the stash is a linear
scan). The stash has room for every test value (a lane appends at most once), so it cannot
overflow. No host sync: the stash's length is read on the device.

The buffer (keys, the key type's minimum as the empty marker): [table | flag | stash length |
stash]. flag: whether the marker's own value is a member; stash length: counted up from the
marker (the buffer's fill), so no separate zeroing launch."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ...heuristics import isin as cost
from .._common import cdiv, needs_int64
from .call import IsinCall, _prepared_call, _reader
from .common import (TritonBackend, _blocks_per_program, _key_bits, _mix32, _mul32, _to_key,
                     check_config, plan_launcher)

#: The most test values the backend takes (a table of 65,536 slots, 512 KB of 64-bit keys): on
#: the H200 cuckoo was faster than hash up to here (16M elements in 16,384 values: 196 against
#: 231 us for int64, 120 against 158 for int32), and mixed at 65,536 values (fits/isin.md,
#: "cuckoo").
CUCKOO_MAX_KEYS = 16384
#: Slots per test value, at least (load at most 1/4: a random set almost never needs a kick
#: chain longer than a few, let alone the stash).
CUCKOO_SLOTS_PER_KEY = 4
#: Rounds of the build's exchange loop before a lane gives up and stashes its key.
MAX_KICKS = tl.constexpr(32)
#: Test values per building program: a program runs as many rounds as its longest kick chain,
#: each an atomic's round trip, so small programs spread over SMs finish sooner.
CUCKOO_BUILD_BLOCK = 128


@triton.jit
def _cuckoo_hash(key, log_t, key_bits: tl.constexpr):
    """A key's two slots in [0, 2**log_t): the top bits of its murmur3 hash (h1) and of that hash
    times a second odd constant (h2). Murmur's finaliser, for integers too: what matters here is
    that the two slots are independent, not that consecutive keys spread evenly."""
    h = _mix32(key, key_bits, True)
    h1 = (h >> (32 - log_t)).to(tl.int32)
    h2 = (_mul32(h, 668265263) >> (32 - log_t)).to(tl.int32)  # 0x27D4EB2F
    return h1, h2


@triton.jit
def _cuckoo_build_kernel(t_ptr, table_ptr, N, log_t, key_bits: tl.constexpr,
                         build_block: tl.constexpr):
    offs = tl.program_id(0) * build_block + tl.arange(0, build_block)
    ok = offs < N
    key, nan = _to_key(tl.load(t_ptr + offs, mask=ok, other=0), key_bits)
    empty = -(1 << (key_bits - 1))
    slots = 1 << log_t
    zero = tl.zeros(key.shape, tl.int32)
    # The marker's own value (an integer set may hold it) is recorded in the flag, past the table.
    tl.store(table_ptr + slots + zero, tl.zeros(key.shape, key.dtype), mask=ok & (key == empty))
    todo = ok & (key != empty) & ~nan  # NaN is never a member
    slot, _ = _cuckoo_hash(key, log_t, key_bits)
    rounds = 0
    while tl.max(todo.to(tl.int32), axis=0) > 0:
        old = tl.atomic_xchg(table_ptr + slot, key, mask=todo, sem="relaxed")
        # old == empty: placed. old == key: a copy was there; the slot holds the key either way.
        # Otherwise `old` was pushed out, and this lane carries it to its other slot.
        todo = todo & (old != empty) & (old != key)
        key = tl.where(todo, old, key)
        h1, h2 = _cuckoo_hash(key, log_t, key_bits)
        slot = tl.where(todo, tl.where(slot == h1, h2, h1), slot)
        rounds += 1
        if rounds >= MAX_KICKS:
            # The stash: its length (counted up from the marker) sits past the flag.
            at = tl.atomic_add(table_ptr + slots + 1 + zero, tl.full(key.shape, 1, key.dtype),
                               mask=todo, sem="relaxed") - empty
            tl.store(table_ptr + slots + 2 + at, key, mask=todo)
            todo = todo & (zero != 0)


@triton.jit
def _cuckoo_probe_kernel(x_ptr, table_ptr, out_ptr, M, log_t, key_bits: tl.constexpr,
                         invert: tl.constexpr, probe_block: tl.constexpr,
                         blocks_per_program: tl.constexpr, both_at_once: tl.constexpr,
                         offsets_64bit: tl.constexpr):
    pid = tl.program_id(0)
    if offsets_64bit:
        pid = pid.to(tl.int64)
    empty = -(1 << (key_bits - 1))
    slots = 1 << log_t
    stashed = tl.load(table_ptr + slots + 1) - empty
    for i in range(blocks_per_program):
        offs = (pid * blocks_per_program + i) * probe_block + tl.arange(0, probe_block)
        ok = offs < M
        key, nan = _to_key(tl.load(x_ptr + offs, mask=ok, other=0), key_bits)
        h1, h2 = _cuckoo_hash(key, log_t, key_bits)
        real = ok & (key != empty)
        # (the flag is loaded as a vector: a scalar bool in vector masks trips the interpreter)
        found = (key == empty) & (tl.load(table_ptr + slots + tl.zeros(key.shape, tl.int32))
                                  != empty)
        if both_at_once:
            # Both slots read at once: twice the L1 traffic, one load's latency.
            first = tl.load(table_ptr + h1, mask=real, other=empty)
            second = tl.load(table_ptr + h2, mask=real, other=empty)
            found = found | (real & ((first == key) | (second == key)))
        else:
            # The second slot only where the first did not hold the key.
            first = tl.load(table_ptr + h1, mask=real, other=empty)
            found = found | (real & (first == key))
            second = tl.load(table_ptr + h2, mask=real & ~found, other=empty)
            found = found | (real & (second == key))
        if stashed > 0:
            for j in range(0, stashed):
                found = found | (real & (key == tl.load(table_ptr + slots + 2 + j)))
        found = found & ~nan
        tl.store(out_ptr + offs, found != invert, mask=ok)


_CUCKOO_BUILD = plan_launcher(_cuckoo_build_kernel, num_warps=4)
_CUCKOO_PROBE = plan_launcher(_cuckoo_probe_kernel)

#: The keys of a cuckoo config: probe_block, blocks_per_program, both_at_once (read a key's two
#: slots together rather than the second only after a miss in the first), num_warps.
CONFIG_KEYS = frozenset({"probe_block", "blocks_per_program", "both_at_once", "num_warps"})


@dataclass(frozen=True, eq=False)
class CuckooPlan:
    """The two launches of the cuckoo backend (build, probe): the Launchers' spec and the cost
    model's input."""

    dtype: torch.dtype  # of elements and test_elements
    elements: int  # M
    test_elements: int  # N
    invert: bool  # isin(..., invert=True)
    key_bits: int  # 32 or 64
    table_log2: int  # log2 of the table's slots
    build_block: int  # test elements per building program
    probe_block: int  # elements per probing block
    blocks_per_program: int
    both_at_once: bool
    offsets_64bit: bool  # offsets past 2**31 elements
    num_warps: int  # of the probing launch


def cuckoo_table_log2(n: int) -> int:
    return max(4, (CUCKOO_SLOTS_PER_KEY * n - 1).bit_length())


def _config(probe_block: int, blocks_per_program: int, both_at_once: bool, num_warps: int) -> dict:
    return {"probe_block": probe_block, "blocks_per_program": blocks_per_program,
            "both_at_once": both_at_once, "num_warps": num_warps}


class CuckooBackend(TritonBackend):
    name = "cuckoo"
    estimate = staticmethod(cost.cuckoo)

    def supports(self, call: IsinCall) -> str | None:
        if call.n > CUCKOO_MAX_KEYS:
            return (f"test_elements has {call.n} elements; cuckoo is for at most "
                    f"{CUCKOO_MAX_KEYS}")
        return None

    def configs(self, call: IsinCall) -> list[dict]:
        return [_config(1024, 2, False, 4), _config(2048, 1, False, 8),
                _config(2048, 1, True, 8), _config(4096, 1, False, 8)]

    def _prepared(self, p, call: IsinCall):
        """The prepared call (call._prepared_call): a fresh buffer (table, flag, stash length,
        stash), then the build and probe launches."""
        key_dtype = torch.int64 if p.key_bits == 64 else torch.int32
        size = (1 << p.table_log2) + 2 + p.test_elements
        empty, device = torch.iinfo(key_dtype).min, call.elements.device
        n, m, log_t = p.test_elements, p.elements, p.table_log2
        build = _CUCKOO_BUILD.bind(p, (cdiv(n, p.build_block),), call.info.index)
        probe = _CUCKOO_PROBE.bind(p, (cdiv(m, p.probe_block * p.blocks_per_program),),
                                   call.info.index)

        def launches(x: torch.Tensor, t: torch.Tensor, out: torch.Tensor) -> None:
            table = torch.full((size,), empty, dtype=key_dtype, device=device)
            build(t, table, n, log_t)
            probe(x, table, out, m, log_t)

        return _prepared_call(call, _reader(call.test), launches)

    def make_plan(self, call: IsinCall, config, sms: int) -> CuckooPlan:
        check_config(f"isin {self.name}", config, CONFIG_KEYS)
        m, block = call.m, config["probe_block"]
        return CuckooPlan(dtype=call.elements.dtype, elements=m, test_elements=call.n,
                          invert=call.invert, key_bits=_key_bits(call.elements.dtype),
                          table_log2=cuckoo_table_log2(call.n), build_block=CUCKOO_BUILD_BLOCK,
                          probe_block=block,
                          blocks_per_program=_blocks_per_program(m, block,
                                                                 config["blocks_per_program"]),
                          both_at_once=bool(config["both_at_once"]),
                          offsets_64bit=needs_int64(m), num_warps=config["num_warps"])
