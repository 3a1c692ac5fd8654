"""isin's hash backend: an open-addressing hash set of the test elements, then one probe per element."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ...dispatch.backend import PlannedBackend
from ...heuristics import isin as cost
from .._common import Launcher, cdiv, needs_int64
from .call import IsinCall, _bindable, _finish, _output, _prepared_call, _reader, _trivial
from .common import (WIDE_BUCKET, SetPlan, _blocks_per_program, _hash_insert,
                     _hash_probe_blocks, _key_bits, table_plan)


@triton.jit
def _hash_build_kernel(t_ptr, table_ptr, flag_ptr, N, log_t,
                       KEY_BITS: tl.constexpr, BUCKET: tl.constexpr,
                       MIX: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < N
    v = tl.load(t_ptr + offs, mask=ok, other=0)
    _hash_insert(table_ptr, flag_ptr, v, ok, log_t, KEY_BITS, BUCKET, MIX)


@triton.jit
def _hash_probe_kernel(x_ptr, table_ptr, flag_ptr, out_ptr, M, log_t,
                       KEY_BITS: tl.constexpr, LOCAL_SLOTS: tl.constexpr,
                       INVERT: tl.constexpr, BLOCK: tl.constexpr,
                       BLOCKS_PER_PROGRAM: tl.constexpr, MIX: tl.constexpr, I64: tl.constexpr):
    pid = tl.program_id(0)
    if I64:
        pid = pid.to(tl.int64)
    _hash_probe_blocks(x_ptr, table_ptr, flag_ptr, out_ptr, M, log_t, pid, KEY_BITS,
                       LOCAL_SLOTS, INVERT, BLOCK, BLOCKS_PER_PROGRAM, MIX)


_HASH_BUILD = Launcher(_hash_build_kernel, lambda p: dict(
    KEY_BITS=p.key_bits, BUCKET=p.bucket_width, MIX=p.murmur_mix, BLOCK=p.build_block,
    num_warps=4))


_HASH_PROBE = Launcher(_hash_probe_kernel, lambda p: dict(
    KEY_BITS=p.key_bits, LOCAL_SLOTS=p.on_chip_slots, INVERT=p.invert, BLOCK=p.probe_block,
    BLOCKS_PER_PROGRAM=p.blocks_per_program, MIX=p.murmur_mix, I64=p.offsets_64bit,
    num_warps=p.warps))


@dataclass(frozen=True, eq=False)
class HashPlan(SetPlan):
    """The two launches of the hash backend (build the set, probe it): the Launchers' spec and
    the cost model's input."""

    murmur_mix: bool  # floats in tables read through L2 go through murmur's finaliser


class HashBackend(PlannedBackend):
    name = "hash"
    estimate = staticmethod(cost.hash_)

    def configs(self, call: IsinCall) -> list[dict]:
        if table_plan(call.n, _key_bits(call.elements.dtype), True)[1]:
            # The table is copied on chip once per program, so each program takes several blocks;
            # the alternative reads it through L1.
            # (Triton stages the table in shared memory at every gather, so larger blocks amortise
            # that copy better than more blocks per program do.)
            # 2048 x 4 first: tuning chose it on most such calls that take long enough to
            # matter (benchmarks/results/h200/fits/isin.md, "hash: the first configs").
            return [{"BLOCK": 2048, "PER_PROGRAM": 4, "LOCAL": True, "SLOTS": 4, "num_warps": 8},
                    {"BLOCK": 4096, "PER_PROGRAM": 2, "LOCAL": True, "SLOTS": 4, "num_warps": 8},
                    {"BLOCK": 1024, "PER_PROGRAM": 1, "LOCAL": False, "SLOTS": 4, "num_warps": 4},
                    {"BLOCK": 4096, "PER_PROGRAM": 2, "LOCAL": True, "SLOTS": 8, "num_warps": 8}]
        out = [{"BLOCK": 512, "PER_PROGRAM": 1, "LOCAL": False, "SLOTS": 4, "num_warps": 4},
               {"BLOCK": 1024, "PER_PROGRAM": 1, "LOCAL": False, "SLOTS": 4, "num_warps": 4},
               {"BLOCK": 1024, "PER_PROGRAM": 1, "LOCAL": False, "SLOTS": 2, "num_warps": 4},
               {"BLOCK": 2048, "PER_PROGRAM": 1, "LOCAL": False, "SLOTS": 8, "num_warps": 8}]
        # Blocks of 512 first: tuning chose them on most long calls (same heading).
        key_bits = _key_bits(call.elements.dtype)
        table_bytes = (1 << table_plan(call.n, key_bits, False)[0]) * key_bits // 8
        if table_bytes > call.info.l2_bytes and call.elements.dtype.itemsize > 1:
            # A table of 4 slots a key that outgrows L2 is probed in DRAM; at 2 slots a key it
            # fits twice as often, and tuning chose 2 slots on every such call (same heading).
            # 1-byte keys touch at most 256 slots, which stay in L2.
            out.insert(0, out.pop(2))
        return out

    def run(self, call: IsinCall, config) -> torch.Tensor:
        done = _trivial(call)
        if done is not None:
            return done
        return _finish(call, self._prepared(call, config)(call.elements, call.test, _output(call)))

    def bind(self, call: IsinCall, config):
        return self._prepared(call, config) if _bindable(call) else None

    def _prepared(self, call: IsinCall, config):
        """The prepared call (call._prepared_call): a fresh table, then the build and probe
        launches."""
        p = self.plan(call, config)
        key_dtype = torch.int64 if p.key_bits == 64 else torch.int32
        slots, empty, device = 1 << p.table_log2, torch.iinfo(key_dtype).min, call.elements.device
        n, m, log_t = p.test_elements, p.elements, p.table_log2
        build = _HASH_BUILD.bind(p, (cdiv(n, p.build_block),), call.info.index)
        probe = _HASH_PROBE.bind(p, (cdiv(m, p.probe_block * p.blocks_per_program),),
                                 call.info.index)

        def launches(x: torch.Tensor, t: torch.Tensor, out: torch.Tensor) -> None:
            # One slot past the table records whether the empty marker's own value is a member.
            table = torch.full((slots + 1,), empty, dtype=key_dtype, device=device)
            flag = table[slots:]
            build(t, table, flag, n, log_t)
            probe(x, table, flag, out, m, log_t)

        return _prepared_call(call, _reader(call.test), launches)

    def plan_facts(self, call: IsinCall) -> tuple:
        return call.elements.dtype, call.m, call.n, call.invert

    def make_plan(self, call: IsinCall, config, sms: int) -> HashPlan:
        dtype, m = call.elements.dtype, call.m
        key_bits = _key_bits(dtype)
        log_t, local_slots = table_plan(call.n, key_bits, bool(config.get("LOCAL")),
                                        config.get("SLOTS", 4))
        # Floats go through murmur's finaliser in tables read through L2; on-chip tables (up
        # to 1K-4K keys) keep Fibonacci hashing, which measured faster there
        # (benchmarks/results/h200/fits/isin.md, "hash: Fibonacci hashing for on-chip float
        # tables").
        mix = dtype.is_floating_point and not local_slots
        block = config["BLOCK"]
        per = _blocks_per_program(m, block, config["PER_PROGRAM"] if local_slots else 1)
        return HashPlan(dtype=dtype, elements=m, test_elements=call.n, invert=call.invert,
                        key_bits=key_bits, table_log2=log_t, on_chip_slots=local_slots,
                        bucket_width=1 if local_slots else WIDE_BUCKET.value, build_block=1024,
                        probe_block=block, blocks_per_program=per, offsets_64bit=needs_int64(m),
                        warps=config["num_warps"], murmur_mix=mix)
