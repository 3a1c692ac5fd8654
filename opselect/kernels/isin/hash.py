"""isin's hash backend: an open-addressing hash set of the test elements, then one probe per element."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...dispatch.backend import Backend, Estimate
from ...heuristics import isin as cost
from .._common import Launcher, cdiv, flat, needs_int64
from .call import IsinCall, _finish, _output, _trivial
from .common import (LOCAL_TABLE_BYTES, WIDE_BUCKET, _blocks_per_program, _hash_insert,
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


_HASH_BUILD = Launcher(_hash_build_kernel)


_HASH_PROBE = Launcher(_hash_probe_kernel)


class HashBackend(Backend):
    name = "hash"

    def configs(self, call: IsinCall) -> list[dict]:
        if table_plan(call.n, _key_bits(call.elements.dtype), True)[1]:
            # The table is copied on chip once per program, so each program takes several blocks;
            # the alternative reads it through L1.
            # (Triton stages the table in shared memory at every gather, so larger blocks amortise
            # that copy better than more blocks per program do.)
            return [{"BLOCK": 4096, "PER_PROGRAM": 2, "LOCAL": True, "SLOTS": 4, "num_warps": 8},
                    {"BLOCK": 2048, "PER_PROGRAM": 4, "LOCAL": True, "SLOTS": 4, "num_warps": 8},
                    {"BLOCK": 1024, "PER_PROGRAM": 1, "LOCAL": False, "SLOTS": 4, "num_warps": 4},
                    {"BLOCK": 4096, "PER_PROGRAM": 2, "LOCAL": True, "SLOTS": 8, "num_warps": 8}]
        return [{"BLOCK": 1024, "PER_PROGRAM": 1, "LOCAL": False, "SLOTS": 4, "num_warps": 4},
                {"BLOCK": 512, "PER_PROGRAM": 1, "LOCAL": False, "SLOTS": 4, "num_warps": 4},
                {"BLOCK": 1024, "PER_PROGRAM": 1, "LOCAL": False, "SLOTS": 2, "num_warps": 4},
                {"BLOCK": 2048, "PER_PROGRAM": 1, "LOCAL": False, "SLOTS": 8, "num_warps": 8}]

    def run(self, call: IsinCall, config) -> torch.Tensor:
        done = _trivial(call)
        if done is not None:
            return done
        x, t = flat(call.elements), flat(call.test)
        key_bits = _key_bits(x.dtype)
        log_t, local_slots = table_plan(call.n, key_bits, bool(config.get("LOCAL")),
                                        config.get("SLOTS", 4))
        key_dtype = torch.int64 if key_bits == 64 else torch.int32
        # One slot past the table records whether the empty marker's own value is a member.
        table = torch.full(((1 << log_t) + 1,), torch.iinfo(key_dtype).min, dtype=key_dtype,
                           device=x.device)
        flag = table[1 << log_t:]
        build_block = 1024
        # Floats go through murmur's finaliser in tables read through L2; on-chip tables (up
        # to 1K-4K keys) keep Fibonacci hashing, which measured better there (16M elements in
        # 1K floats of integers: 0.083 ms against 0.147 ms on the H200).
        is_float = x.dtype.is_floating_point
        mix = is_float and not local_slots
        m, n, invert = call.m, call.n, call.invert
        bucket_width = 1 if local_slots else WIDE_BUCKET.value
        _HASH_BUILD((x.dtype, n, log_t, bucket_width, mix), (cdiv(n, build_block),),
                    (t, table, flag, n, log_t),
                    lambda: dict(KEY_BITS=key_bits, BUCKET=bucket_width,
                                 MIX=mix, BLOCK=build_block, num_warps=4))
        out = _output(call)
        block, warps = config["BLOCK"], config["num_warps"]
        per = _blocks_per_program(m, block, config["PER_PROGRAM"] if local_slots else 1)
        i64 = needs_int64(m)
        _HASH_PROBE((x.dtype, m, log_t, local_slots, invert, block, per, mix, i64, warps),
                    (cdiv(m, block * per),), (x, table, flag, out, m, log_t),
                    lambda: dict(KEY_BITS=key_bits, LOCAL_SLOTS=local_slots,
                                 INVERT=invert, BLOCK=block, BLOCKS_PER_PROGRAM=per, MIX=mix,
                                 I64=i64, num_warps=warps))
        return _finish(call, out)

    def cost(self, call: IsinCall, model) -> Estimate:
        return cost.hash_(call, model, local_table_bytes=LOCAL_TABLE_BYTES)
