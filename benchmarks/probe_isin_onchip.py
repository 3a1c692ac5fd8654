"""Where isin's time goes when the test set is held on chip (up to 1,024 wide values).

Each variant is the hash backend's probe kernel with parts left out or swapped, timed interleaved
(A B C A B C, several rounds) on the same inputs and the same hash table:

    floor        load the elements, store a bool: the stream alone
    key+hash     ... plus each element's key and slot (no table read)
    1 gather     ... plus the first probe, from the on-chip copy (answers may be wrong)
    1 load       ... the first probe read through L1 instead (answers may be wrong)
    gather+loop  the first probe a gather, the rest a loop of L1 loads (what hash runs)
    N gathers    N unrolled gathers before the loop
    N loads      N unrolled L1 loads before the loop
    reach loads  a fixed number of L1 loads (the table's reach), no search loop
    reach masked ... each masked to the lanes still searching (the hash backend's lookup)
    reach murmur the same on a table hashed by murmur's finaliser
    reach gathers  ... gathers instead
    N g+reach ld N unrolled gathers, then L1 loads up to the reach
    hash         the backend itself (build included), and torch

    python benchmarks/probe_isin_onchip.py [--rounds 3] [--json out.json]
    python benchmarks/probe_isin_onchip.py --smoke   # tiny inputs, any device: the answers checked
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from opselect.dispatch import get_op  # noqa: E402
from opselect.kernels.isin import hash as H  # noqa: E402
from opselect.kernels.isin.common import _hash, _hash_lookup, _search_on, _to_key  # noqa: E402

M = 1 << 20
# (elements, test values, dtype, values: "wide" (the whole range) or "narrow" ([0, 2N)), as in
# bench_isin; narrow floats are floats of integers, which Fibonacci hashing clusters)
CASES = [(16 * M, 1024, torch.int64, "wide"), (16 * M, 1024, torch.int32, "wide"),
         (16 * M, 1024, torch.float32, "wide"), (16 * M, 256, torch.int64, "wide"),
         (16 * M, 1024, torch.float32, "narrow"), (16 * M, 1024, torch.int32, "narrow")]


@triton.jit
def _probe_reach(table, log_t, key_bits: tl.constexpr, slots: tl.constexpr,
                 murmur_mix: tl.constexpr):
    """Slots from its home a lookup must read in a table of single-slot homes (the layout
    before bucketed on-chip tables): one past the farthest any key sits from its home."""
    empty = -(1 << (key_bits - 1))
    home = _hash(table, log_t, key_bits, murmur_mix)
    distance = (tl.arange(0, slots) - home) & ((1 << log_t) - 1)
    return tl.max(tl.where(table != empty, distance, -1), axis=0) + 1


@triton.jit
def _variant_kernel(x_ptr, table_ptr, out_ptr, M, log_t, key_bits: tl.constexpr,
                    slots: tl.constexpr, block: tl.constexpr, per: tl.constexpr,
                    variant: tl.constexpr, unrolled: tl.constexpr, mix: tl.constexpr):
    pid = tl.program_id(0)
    table = tl.load(table_ptr + tl.arange(0, slots))
    empty = -(1 << (key_bits - 1))
    for i in range(per):
        offs = (pid * per + i) * block + tl.arange(0, block)
        ok = offs < M
        v = tl.load(x_ptr + offs, mask=ok, other=0)
        if variant == 0:
            found = v == 0
        else:
            key, nan = _to_key(v, key_bits)
            slot = _hash(key, log_t, key_bits, False)
            if variant == 1:
                found = slot == 0
            else:
                found = key != key
                todo = ok
                for u in tl.static_range(unrolled):  # (0 for the variants of the reach alone)
                    if variant == 2 or variant == 4 or variant == 8:
                        seen = tl.gather(table, (slot + u) & ((1 << log_t) - 1), 0)
                    else:
                        seen = tl.load(table_ptr + ((slot + u) & ((1 << log_t) - 1)))
                    found = found | (todo & (seen == key))
                    todo = todo & (seen != key) & (seen != empty)
                if variant == 9:
                    # the hash backend's lookup (bounded reach, L1 loads masked to the lanes still
                    # searching), without its build
                    reach = _probe_reach(table, log_t, key_bits, slots, mix)
                    found = _hash_lookup(table_ptr, reach, table_ptr + slots, v, ok, log_t,
                                         key_bits, True, mix)
                elif variant >= 6:
                    # bounded reach: 6 a runtime loop of L1 loads, 7 of gathers, 8 `unrolled`
                    # gathers then L1 loads up to the reach
                    reach = _probe_reach(table, log_t, key_bits, slots, False)
                    first = unrolled if variant == 8 else 0
                    for step in range(first, reach):
                        where = (slot + step) & ((1 << log_t) - 1)
                        if variant == 7:
                            seen = tl.gather(table, where, 0)
                        else:
                            seen = tl.load(table_ptr + where)
                        found = found | (todo & (seen == key))
                        todo = todo & (seen != key) & (seen != empty)
                elif variant >= 4:
                    found = _search_on(table_ptr, slot + unrolled, key, found, todo, log_t, empty)
                found = found & ~nan
        tl.store(out_ptr + offs, found, mask=ok)


@triton.jit
def _reach_kernel(table_ptr, out_ptr, log_t, key_bits: tl.constexpr, slots: tl.constexpr,
                  mix: tl.constexpr):
    table = tl.load(table_ptr + tl.arange(0, slots))
    tl.store(out_ptr, _probe_reach(table, log_t, key_bits, slots, mix))


def inputs(op, cases, only: str, device):
    """(label, (elements, test values, dtype), x, t, torch's answer, the call) of each case
    whose label contains `only`."""
    for m, n, dtype, values in cases:
        label = f"{m / M:g}M in {n} {str(dtype)[6:]} {values}"
        if only and only not in label:
            continue
        (x, t), _ = op.sample([[m], [n]], dtype, {"values": values}, device)
        yield label, (m, n, dtype), x, t, torch.isin(x, t), op.prepare(x, t)


def _bench(fn) -> float:
    if not torch.cuda.is_available():  # --smoke on the CPU: one call, the answers checked
        fn()
        return 0.0
    return triton.testing.do_bench(fn, warmup=10, rep=60) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default="")
    ap.add_argument("--warps", type=int, default=8)
    ap.add_argument("--block", type=int, default=2048)
    ap.add_argument("--per", type=int, default=4)
    ap.add_argument("--smoke", action="store_true", help="tiny cases on any device")
    ap.add_argument("--only", default="", help="comma list: only the variants named so")
    ap.add_argument("--cases", default="", help="only cases whose label contains this text")
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cases = [(3000, n, d, v) for _, n, d, v in CASES] if args.smoke else CASES
    op, backend = get_op("isin"), H.HashBackend()
    results = {}
    for label, (m, n, dtype), x, t, ref, call in inputs(op, cases, args.cases, device):
        plan = backend.plan(call, {"probe_block": args.block, "blocks_per_program": args.per,
                                   "on_chip": True, "slots_per_key": 4, "num_warps": args.warps})
        key_bits, log_t, slots = plan.key_bits, plan.table_log2, plan.on_chip_slots
        key_dtype = torch.int64 if key_bits == 64 else torch.int32
        # the variants' tables: single-slot homes, Fibonacci hashing (as the hash backend's
        # on-chip tables), and murmur's finaliser for "reach murmur"; "hash" builds its own
        tables = {}
        for mix in (False, True):
            table = torch.full((slots + 2,), torch.iinfo(key_dtype).min, dtype=key_dtype,
                               device=device)
            H._hash_build_kernel[(triton.cdiv(n, 1024),)](
                t, table, table[slots:slots + 1], table[slots + 1:], n, log_t, key_bits=key_bits, bucket_width=1,
                murmur_mix=mix, build_block=1024)
            tables[mix] = table
        out = torch.empty(m, dtype=torch.bool, device=device)
        grid = (triton.cdiv(m, args.block * args.per),)

        def variant(v, u=1, mix=False):
            # (triton 3.6 takes no conditional expression as static_range's bound: the variants
            # of the reach alone get 0 unrolled probes from here)
            u = 0 if v in (6, 7, 9) else u
            return lambda: _variant_kernel[grid](x, tables[mix], out, m, log_t, key_bits=key_bits,
                                                 slots=slots, block=args.block, per=args.per,
                                                 variant=v, unrolled=u, mix=mix,
                                                 num_warps=args.warps)
        variants = {"clone": lambda: x.clone(), "floor": variant(0), "key+hash": variant(1),
                    "1 gather": variant(2), "1 load": variant(3), "gather+loop": variant(4, 1),
                    "2 gathers": variant(4, 2), "4 gathers": variant(4, 4),
                    "1 load+loop": variant(5, 1), "2 loads": variant(5, 2),
                    "4 loads": variant(5, 4),
                    "reach loads": variant(6), "reach masked": variant(9),
                    "reach murmur": variant(9, mix=True), "reach gathers": variant(7),
                    "4 g+reach ld": variant(8, 4), "8 g+reach ld": variant(8, 8),
                    "hash": lambda: backend.run(call, plan_config(args)),
                    "torch": lambda: torch.isin(x, t)}
        if args.only:
            variants = {k: f for k, f in variants.items() if k in args.only.split(",")}
        checks = {}
        for name in ("gather+loop", "2 gathers", "4 gathers", "1 load+loop", "2 loads", "4 loads",
                     "reach loads", "reach masked", "reach murmur", "reach gathers",
                     "4 g+reach ld", "8 g+reach ld"):
            if name not in variants:
                continue
            out.fill_(True)
            variants[name]()
            checks[name] = bool(torch.equal(out, ref))
        if "hash" in variants:
            checks["hash"] = bool(torch.equal(variants["hash"](), ref))
        times = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name, fn in variants.items():
                times[name].append(_bench(fn))
        reach = []
        for mix in (False, True):
            reach_out = torch.zeros(1, dtype=torch.int32, device=device)
            _reach_kernel[(1,)](tables[mix], reach_out, log_t, key_bits=key_bits, slots=slots,
                                mix=mix)
            reach.append(int(reach_out))
        results[label] = {k: {"median_us": statistics.median(v), "spread_us": max(v) - min(v),
                              "correct": checks.get(k)} for k, v in times.items()}
        results[label]["reach"], results[label]["reach_murmur"] = reach
        print(f"\n{label}: table 2^{log_t} slots of {key_bits} bits, reach {reach[0]} "
              f"(murmur {reach[1]}), "
              f"{m * (dtype.itemsize + 1) / 1e6:.0f} MB moved")
        for k, r in results[label].items():
            if not isinstance(r, dict):
                continue
            ok = "" if r["correct"] is None else (" ok" if r["correct"] else " WRONG")
            print(f"  {k:>12} {r['median_us']:8.1f} us  +-{r['spread_us']:5.1f}{ok}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=1))


def plan_config(args) -> dict:
    return {"probe_block": args.block, "blocks_per_program": args.per, "on_chip": True,
            "slots_per_key": 4, "num_warps": args.warps}


if __name__ == "__main__":
    main()
