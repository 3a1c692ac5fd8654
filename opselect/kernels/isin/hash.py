"""isin's hash backend: an open-addressing hash set of the test elements, then one probe per element."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ...heuristics import isin as cost
from .._common import cdiv, needs_int64
from .call import IsinCall, _prepared_call, _reader
from .common import (REPEATS_FOR_CHECK, WIDE_BUCKET, SetPlan, _blocks_per_program, _hash_insert, _hash_probe_blocks,
                     _key_bits, plan_launcher, check_config, table_plan, TritonBackend)


@triton.jit
def _hash_preinsert_kernel(t_ptr, table_ptr, flag_ptr, repeats_ptr, stride, log_t,
                           key_bits: tl.constexpr, bucket_width: tl.constexpr,
                           murmur_mix: tl.constexpr, preinsert_block: tl.constexpr):
    """One program: every stride-th test element into the table, before the build. Where enough
    of them were repeats, repeats_ptr is set to 1, and the build checks for a key before its
    atomics, which skips the copies of the repeated values (_hash_insert)."""
    offs = tl.arange(0, preinsert_block) * stride
    v = tl.load(t_ptr + offs)
    there = _hash_insert(table_ptr, flag_ptr, v, offs >= 0, log_t, key_bits, bucket_width,
                         murmur_mix, False)
    repeats = tl.sum(there.to(tl.int32), axis=0)
    tl.store(repeats_ptr, (repeats >= REPEATS_FOR_CHECK).to(repeats_ptr.dtype.element_ty))


@triton.jit
def _hash_build_kernel(t_ptr, table_ptr, flag_ptr, repeats_ptr, N, log_t,
                       key_bits: tl.constexpr, bucket_width: tl.constexpr,
                       murmur_mix: tl.constexpr, build_block: tl.constexpr):
    """repeats_ptr: 1 when the pre-insert found repeated values (no pre-insert: the empty
    marker, off)."""
    offs = tl.program_id(0) * build_block + tl.arange(0, build_block)
    ok = offs < N
    v = tl.load(t_ptr + offs, mask=ok, other=0)
    _hash_insert(table_ptr, flag_ptr, v, ok, log_t, key_bits, bucket_width, murmur_mix,
                 tl.load(repeats_ptr) == 1)


@triton.jit
def _hash_probe_kernel(x_ptr, table_ptr, flag_ptr, out_ptr, M, log_t,
                       key_bits: tl.constexpr, on_chip_slots: tl.constexpr,
                       invert: tl.constexpr, probe_block: tl.constexpr,
                       blocks_per_program: tl.constexpr, murmur_mix: tl.constexpr,
                       offsets_64bit: tl.constexpr):
    pid = tl.program_id(0)
    if offsets_64bit:
        pid = pid.to(tl.int64)
    _hash_probe_blocks(x_ptr, table_ptr, flag_ptr, out_ptr, M, log_t, pid, key_bits,
                       on_chip_slots, invert, probe_block, blocks_per_program, murmur_mix)


_HASH_PREINSERT = plan_launcher(_hash_preinsert_kernel, num_warps=4)
_HASH_BUILD = plan_launcher(_hash_build_kernel, num_warps=4)
_HASH_PROBE = plan_launcher(_hash_probe_kernel)

#: The keys of a hash config: probe_block, blocks_per_program (the most a program probes, with a
#: table on chip), on_chip (a table of at most 32 KB, read through L1 with lookups bounded by its
#: reach, which each program works out once), slots_per_key (the table's size: at least this
#: many slots per test element), num_warps (of the probing launch).
CONFIG_KEYS = frozenset({"probe_block", "blocks_per_program", "on_chip", "slots_per_key",
                         "num_warps"})


@dataclass(frozen=True, eq=False)
class HashPlan(SetPlan):
    """The two launches of the hash backend (build the set, probe it): the Launchers' spec and
    the cost model's input."""

    murmur_mix: bool  # floats in tables read through L2 go through murmur's finaliser


def _config(probe_block: int, blocks_per_program: int, on_chip: bool, slots_per_key: int,
            num_warps: int) -> dict:
    return {"probe_block": probe_block, "blocks_per_program": blocks_per_program,
            "on_chip": on_chip, "slots_per_key": slots_per_key, "num_warps": num_warps}


class HashBackend(TritonBackend):
    name = "hash"
    estimate = staticmethod(cost.hash_)

    def configs(self, call: IsinCall) -> list[dict]:
        if table_plan(call.n, _key_bits(call.elements.dtype), True)[1]:
            # Each program reads the whole table once (for its reach), so it takes several
            # blocks; the alternative searches a table of buckets through L1 / L2.
            # 2048 x 4 first: tuning chose it on most such calls that take long enough to
            # matter, when the table was gathered from a copy in shared memory
            # (benchmarks/results/h200/fits/isin.md, "hash: the first configs"); not re-tuned
            # since lookups read L1 with a bound.
            return [_config(2048, 4, True, 4, 8), _config(4096, 2, True, 4, 8),
                    _config(1024, 1, False, 4, 4), _config(4096, 2, True, 8, 8)]
        out = [_config(512, 1, False, 4, 4), _config(1024, 1, False, 4, 4),
               _config(1024, 1, False, 2, 4), _config(2048, 1, False, 8, 8)]
        # Blocks of 512 first: tuning chose them on most long calls (same heading).
        key_bits = _key_bits(call.elements.dtype)
        table_bytes = (1 << table_plan(call.n, key_bits, False)[0]) * key_bits // 8
        if table_bytes > call.info.l2_bytes and call.elements.dtype.itemsize > 1:
            # A table of 4 slots a key that outgrows L2 is probed in DRAM; at 2 slots a key it
            # fits twice as often, and tuning chose 2 slots on every such call (same heading).
            # 1-byte keys touch at most 256 slots, which stay in L2.
            out.insert(0, out.pop(2))
        return out

    def _prepared(self, p, call: IsinCall):
        """The prepared call (call._prepared_call): a fresh table, then the pre-insert (large
        test sets), build and probe launches."""
        key_dtype = torch.int64 if p.key_bits == 64 else torch.int32
        slots, empty, device = 1 << p.table_log2, torch.iinfo(key_dtype).min, call.elements.device
        n, m, log_t = p.test_elements, p.elements, p.table_log2
        stride = p.preinsert_stride
        preinsert = _HASH_PREINSERT.bind(p, (1,), call.info.index) if stride else None
        build = _HASH_BUILD.bind(p, (cdiv(n, p.build_block),), call.info.index)
        probe = _HASH_PROBE.bind(p, (cdiv(m, p.probe_block * p.blocks_per_program),),
                                 call.info.index)

        def launches(x: torch.Tensor, t: torch.Tensor, out: torch.Tensor) -> None:
            # Past the table: whether the empty marker's own value is a member, and whether the
            # pre-insert found repeated values (the empty marker: it did not run).
            table = torch.full((slots + 2,), empty, dtype=key_dtype, device=device)
            flag, repeats = table[slots:slots + 1], table[slots + 1:]
            if preinsert is not None:
                preinsert(t, table, flag, repeats, stride, log_t)
            build(t, table, flag, repeats, n, log_t)
            probe(x, table, flag, out, m, log_t)

        return _prepared_call(call, _reader(call.test), launches)

    def make_plan(self, call: IsinCall, config, sms: int) -> HashPlan:
        check_config(f"isin {self.name}", config, CONFIG_KEYS)
        dtype, m = call.elements.dtype, call.m
        key_bits = _key_bits(dtype)
        log_t, local_slots = table_plan(call.n, key_bits, bool(config.get("on_chip")),
                                        config.get("slots_per_key", 4))
        # Floats go through murmur's finaliser in tables read through L2; on-chip tables (up
        # to 1K-4K keys) keep Fibonacci hashing, which measured faster there
        # (benchmarks/results/h200/fits/isin.md, "hash: Fibonacci hashing for on-chip float
        # tables").
        mix = dtype.is_floating_point and not local_slots
        block = config["probe_block"]
        per = _blocks_per_program(m, block, config["blocks_per_program"] if local_slots else 1)
        return HashPlan(dtype=dtype, elements=m, test_elements=call.n, invert=call.invert,
                        key_bits=key_bits, table_log2=log_t, on_chip_slots=local_slots,
                        bucket_width=1 if local_slots else WIDE_BUCKET.value, build_block=1024,
                        probe_block=block, blocks_per_program=per, offsets_64bit=needs_int64(m),
                        num_warps=config["num_warps"], murmur_mix=mix)
