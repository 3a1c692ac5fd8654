"""Cost model of the topk backends: roofline terms per backend, in seconds.

A call is R rows of N elements of s bytes and k results per row. Every backend reads the rows once
at least and writes R * k values and int64 indices; they differ in the passes over the data
(torch's radix passes, a full sort), the arithmetic per element (a bitonic network is ALU-bound)
and the latency of the per-row finishing work (radix: a search over a few thousand survivors and
an in-register sort of the k winners, one program per row).

The constants below started as estimates from instruction counts and latencies and were then fitted
to the H200 benchmark (benchmarks/results/h200/topk.json; tools/model_regret.py shows the fit);
`opselect calibrate` corrects each backend's total through model.scales["topk/<backend>"]. Each
constant's comment says what it stands for and why it has its value; the measurements behind the
values are in benchmarks/results/h200/fits/topk.md, under the heading the comment names.
"""

from __future__ import annotations

import math

from .device_model import BOUND_LAUNCH

OP = "topk"

# Integer instructions per second of one SM (4 schedulers x 32 lanes x ~1.7 GHz).
ALU_PER_SM = 128 * 1.7e9
# Per element of the radix filter: load, key, two compares, the packed count.
FILTER_OPS = 14.0
# Latencies of the radix steps that one program runs alone.
STEP_LATENCY = 0.35e-6      # one 4-ary search step over a register tile (one fused reduction)
TILE_LATENCY = 1.0e-6       # one tile re-read from L2 in the finisher's slow path
SORT_ROUND_LATENCY = 0.02e-6  # one round of the in-register bitonic sort of the k winners
# Warps an SM keeps busy with latency-bound per-row programs (about 128 registers a thread):
# programs of 4 warps overlap four rows per SM, programs of 16 warps none.
WARPS_PER_SM = 16
# tournament's chunk loop (a tile loaded, then reduced) keeps few loads in flight, so its rate
# follows the resident warps, not the chip's bandwidth: each resident warp streams about this
# many bytes a second (fitted on single long rows: fits/topk.md#tournament).
TOURNAMENT_WARP_BANDWIDTH = 0.8e9
# One program streaming its own row (fused mode) reads at about this rate.
PROGRAM_BANDWIDTH = 60e9
# torch.topk (ATen's multi-block radix select, torch 2.11-2.13): each of its digit passes (one
# per key byte) handles about this many elements a second at the H200's bandwidth, and
# proportionally elsewhere; each pass also has a fixed cost (its scan of the digit counts) that
# dominates small calls, and the pass that gathers the winners reads the input at this part of
# copy bandwidth (fits/topk.md#torch).
TORCH_ELEMENTS_PER_S = 2.6e11
TORCH_PASS_FIXED = 12e-6
TORCH_GATHER_EFFICIENCY = 0.3
# Launches of a multi-block call per digit pass (counts, their scan, the digit's pick; six more
# around them): the host's launches bound small multi-block calls (fits/topk.md#torch).
TORCH_LAUNCHES_PER_PASS = 2.5
# One block per slice (ATen's single-block radix select): each digit pass costs about this
# much beyond streaming the slice at TORCH_BLOCK_ELEMENTS_PER_S (fits/topk.md#torch).
TORCH_BLOCK_PASS = 1e-6
TORCH_BLOCK_ELEMENTS_PER_S = 1e9
# The blocks an SM holds at once share it: an SM passes about this many elements a second,
# however many short slices it holds; the per-block rate alone made many short slices several
# times too fast (fits/topk.md#torch).
TORCH_SM_ELEMENTS_PER_S = 0.5e9
# Blocks narrower than this pass fewer elements a second an SM, about as the square root of
# their width (fits/topk.md#torch).
TORCH_SM_FULL_BLOCK = 256
# torch.topk's host time, in torch launches: the op itself, the sort of sorted results (a
# second op) and, for rows of strided elements, the copies in and out (fits/topk.md#host).
TORCH_BLOCK_LAUNCHES = 1.6
TORCH_BLOCK_SORT_LAUNCHES = 0.8
TORCH_STRIDED_LAUNCHES = 2.0
# The Python around a Triton topk (prepare, outputs, reshaping) beyond its launches, fitted on
# tiny calls, where it is most of the time; 10 us or more handed bitonic's short calls of the
# suite to torch (fits/topk.md#host).
TRITON_GLUE_HOST = 9e-6
# maxima's second, programmatic dependent launch costs the host more than a plain one
# (fits/topk.md#host).
MAXIMA_SECOND_LAUNCH_HOST = 8e-6
# torch.topk's sorted results cost about this times k ** 0.4 beyond k = 1 (unsorted results
# save it; fits/topk.md#torch).
TORCH_SORT_K = 1.3e-6
# torch.sort of several rows is a segmented sort: a larger fixed cost and more passes than one
# flat sort of as many keys (fits/topk.md#sort).
SEGMENTED_SORT_FIXED = 90e-6
SEGMENTED_SORT_FACTOR = 1.7
# radix: sampling, the cooperative wait and the one-program finisher cost about this much
# device time whatever the row; most of a long row's call at small k (fits/topk.md#radix).
RADIX_FIXED = 55e-6
# radix's filter streams long rows at about this part of copy bandwidth: it reads each tile,
# ranks and appends its survivors (fits/topk.md#radix).
RADIX_PASS_EFFICIENCY = 0.6
# radix with one program per row (fused): each wave of programs takes about this long beyond
# its reading: the sampling and the finisher, one row a program (fits/topk.md#radix).
RADIX_FUSED_WAVE = 90e-6
# bitonic: one element-round of tl.topk's merge network (partner exchange, compare, select) in a
# 16-warp program that has its SM to itself; a program of w warps takes (w / 16) ** 0.25 of that
# per element-round. A halving (the max of a row's two halves, then a merge of the winners) costs
# about a quarter of a merge round per element. Fitted on device-bound calls rather than counted
# from instructions: an ALU count (10 operations per round, at 128 lanes an SM) was 5-7x under
# at mid k (fits/topk.md#bitonic).
BITONIC_ROUND_S = 3.4e-10
BITONIC_HALVING_WEIGHT = 0.25
# maxima: launch 2's dependent steps (cut, scan, gather, wait, rank) on an idle chip, and per
# winner (the wider search and ranking). The fit is end to end, so MAXIMA_SELECT also holds the
# gap between the two launches (fits/topk.md#maxima).
MAXIMA_SELECT = 12e-6
MAXIMA_PER_K = 6e-9
# Launch 2's programs run about one an SM at a time, each scanning its share of the group
# maxima: a wave costs about this much plus this much per group maxima of a program; without
# the per-group term, calls of a few hundred long rows came out a third of their time
# (fits/topk.md#maxima).
MAXIMA_WAVE = 2e-6
MAXIMA_PER_GROUP = 12e-9
MAXIMA_PASS_EFFICIENCY = 0.85  # of copy bandwidth, reading with evict-first
# Each row's candidates are ranked against each other: about k * k comparisons a row, at this
# many seconds each over the chip (fits/topk.md#maxima).
MAXIMA_RANK_PAIR = 5e-12
# tournament keeps the groups whose maximum reaches the cut: with many equal values (a few
# distinct values in a row) nearly every group does, and a call takes about ten times as long.
# The cold model cannot see the values, so it charges tournament this much for the risk; more
# handed calls that tournament wins to slower backends, and tuning measures the real data
# (fits/topk.md#tournament).
TOURNAMENT_VALUE_RISK = 1.15
# argmax (k = 1): per element a compare or two and two selects, about this many instructions;
# it streams the rows at this part of copy bandwidth, after a fixed cost of about ARGMAX_FIXED
# (the launch's ramp and tail: 4096 x 256 float32 takes 4.3 us on the H200, 8 x 128256
# bfloat16 5.7), and a shared row's last program merges the parts in about ARGMAX_MERGE
# (fits/topk.md#argmax).
ARGMAX_OPS = 6.0
ARGMAX_PASS_EFFICIENCY = 0.85
ARGMAX_FIXED = 4e-6
ARGMAX_MERGE = 1e-6


def _sizes(call):
    s = call.input.dtype.itemsize
    return call.R, call.N, call.k, s


def _out_bytes(call) -> float:
    return call.R * call.k * (call.input.dtype.itemsize + 8)


def _adjacent(call) -> bool:
    """Whether a row's elements sit next to each other (a unit column stride)."""
    return call.col_stride == 1 or call.N <= 1


def _copy(call, model) -> dict:
    """Backends that need rows of adjacent elements copy other layouts first."""
    if call.viewable and _adjacent(call):
        return {}
    return {"copy": model.stream(2 * call.R * call.N * call.input.dtype.itemsize),
            "copy_host": model.torch_launch}


def _trivial(call, model, backend: str, triton: bool):
    if call.R * call.N == 0 or call.k == 0 or call.nd == 0:
        return model.estimate(OP, backend, triton=triton, launch=2 * model.torch_launch)
    return None


def torch_multiblock(slices: int, slice_size: int) -> bool:
    """Whether ATen's topk (CUDA, torch 2.x with CUB's scan-by-key) gives each slice several
    blocks (should_use_multiblock in TensorTopK.cu): long slices, the fewer the longer."""
    if slices <= 20:
        return slice_size >= 20000
    if slices <= 40:
        return slice_size >= 10000
    if slices <= 80:
        return slice_size >= 8000
    if slices < 200:
        return slice_size >= 5000
    if slices < 800:
        return slice_size >= 3000
    if slices <= 4000:
        return slice_size >= 800
    return slice_size >= 400


def torch_(call, model, plan=None):
    done = _trivial(call, model, "torch", False)
    if done is not None:
        return done
    R, N, k, s = _sizes(call)
    # A radix select: one pass per key byte over every slice, then a gather of the winners
    # and the sort of the k results.
    passes = s
    on_gpu = model.triton_slowdown == 1.0  # (on the CPU torch.topk is one call, no passes)
    if on_gpu and not torch_multiblock(R, N):
        # One block per slice runs every pass itself: one launch (and one for the sort of
        # the results), waves of blocks as the slice's width lets them share an SM.
        threads = min(1024, -(-N // 32) * 32)
        resident = max(1, model.sm_count) * max(1, min(32, 2048 // threads))
        waves = -(-R // resident)
        parts = dict(launch=(TORCH_BLOCK_LAUNCHES + TORCH_BLOCK_SORT_LAUNCHES
                             * (call.sorted and k > 1)) * model.torch_launch,
                     passes=passes * max(
                         waves * (TORCH_BLOCK_PASS + N / TORCH_BLOCK_ELEMENTS_PER_S),
                         R * N / (max(1, model.sm_count) * TORCH_SM_ELEMENTS_PER_S
                                  * min(1.0, threads / TORCH_SM_FULL_BLOCK) ** 0.5)),
                     out=model.stream(_out_bytes(call)))
    else:
        speed = TORCH_ELEMENTS_PER_S * model.bandwidth / 4.1e12
        fixed = TORCH_PASS_FIXED if on_gpu else 0.0
        # Several kernels per digit pass (counts, their scan, the digit's pick) and a few
        # around them: the host's launches bound small multi-block calls.
        launches = TORCH_LAUNCHES_PER_PASS * passes + 6 if on_gpu else passes + 3
        parts = dict(launch=launches * model.torch_launch,
                     digits=passes * (fixed + R * N / speed),
                     gather=model.stream(R * N * s) / TORCH_GATHER_EFFICIENCY,
                     out=model.stream(_out_bytes(call)))
    if call.sorted and k > 1:
        parts["sort_k"] = max(TORCH_SORT_K * k ** 0.4, model.sort(R * k, s, 8) * 0.5)
    if on_gpu and not _adjacent(call):
        # Rows of strided elements: ATen copies the input to a contiguous layout and back for
        # the results (fits/topk.md#torch).
        parts["launch"] += TORCH_STRIDED_LAUNCHES * model.torch_launch
        parts["copy"] = model.stream(2 * R * N * s)
    return model.estimate(OP, "torch", triton=False, **parts)


def sort(call, model, plan=None):
    done = _trivial(call, model, "sort", False)
    if done is not None:
        return done
    R, N, k, s = _sizes(call)
    # torch.sort, then the two slices made contiguous: host-bound for small rows.
    parts = dict(sort=_torch_sort(model, R, N, s), launch=8 * model.torch_launch,
                 slice=model.stream(2 * _out_bytes(call)))
    if not _contiguous_rows(call):
        # torch.sort copies rows that are not dense first (fits/topk.md#sort).
        parts["launch"] += model.torch_launch
        parts["copy"] = model.stream(2 * R * N * s)
    return model.estimate(OP, "sort", triton=False, **parts)


def _contiguous_rows(call) -> bool:
    return call.viewable and _adjacent(call) and (call.R <= 1 or call.row_stride == call.N)


def _torch_sort(model, rows: int, n: int, s: int) -> float:
    """torch.sort of `rows` rows of n keys (with int64 indices) along the last dim."""
    flat = model.sort(rows * n, s, 8)
    if rows <= 1:
        return flat
    return SEGMENTED_SORT_FIXED + SEGMENTED_SORT_FACTOR * max(0.0, flat - model.sort_fixed)


def _search_steps(key_bits: int, survivors: bool) -> float:
    # A 4-ary search over the key range: log4 of it; survivors above a threshold span a narrower
    # range than a whole row.
    full = key_bits / 2
    return max(4.0, full - 2.0) if survivors else full


def _alloc(n: int, model) -> float:
    """Host time of n torch.empty calls (no kernel: about half an ATen op each)."""
    return 0.5 * n * model.torch_launch


def _finisher(plan, key_bits: int, survivors: float) -> float:
    """Device time of one row's finishing program: search, collect, in-register sort."""
    steps = _search_steps(key_bits, plan.mode != "direct")
    if survivors <= plan.finish_tile:
        t = steps * STEP_LATENCY
    else:
        t = (steps + 3) * math.ceil(survivors / plan.finish_tile) * TILE_LATENCY
    if plan.sort_in_kernel:
        t += _sort_latency(plan.k_padded)
    return t


def _sort_latency(kp: int) -> float:
    """One program's in-register bitonic sort of kp (a power of two) winners."""
    lk = max(1, kp.bit_length() - 1)
    return lk * (lk + 1) / 2 * SORT_ROUND_LATENCY * max(1.0, kp / 1024)


def radix(call, model, plan):
    done = _trivial(call, model, "radix", True)
    if done is not None:
        return done
    R, N, k, s = _sizes(call)
    sms = max(1, model.sm_count)
    key_bits = 64 if s == 8 else 32
    parts = _copy(call, model)
    host = parts.pop("copy_host", 0.0)
    memory = model.stream(R * N * s + _out_bytes(call))
    alu = R * N * FILTER_OPS / (sms * ALU_PER_SM)
    finish = _finisher(plan, key_bits, plan.expected_survivors)
    notes: tuple[str, ...] = ()
    waves = _waves(R, sms, plan.num_warps)
    if plan.mode == "direct":
        host += BOUND_LAUNCH + _alloc(2, model)
        parts["memory"] = memory
        # Its search reduces over the whole row at every step (fits/topk.md#radix).
        parts["finish"] = waves * finish * max(1.0, N / 1024)
        notes = ("one program per row selects from the whole row",)
    elif plan.mode == "fused":
        host += BOUND_LAUNCH + _alloc(3, model)
        # Each program streams its own row: many rows fill the chip, few leave it idle.
        parts["memory"] = max(memory, alu, waves * N * s / PROGRAM_BANDWIDTH)
        parts["finish"] = waves * (finish + RADIX_FUSED_WAVE)
    else:
        launches = 1 if plan.mode == "coop" else 2
        host += launches * BOUND_LAUNCH + _alloc(3, model)
        if plan.mode == "coop":
            host += 0.5 * model.torch_launch  # the zeroed workspace (a memset)
        parts["memory"] = max(memory / RADIX_PASS_EFFICIENCY, alu)
        parts["sample"] = RADIX_FIXED + model.stream(R * plan.sampled_elements * 32)
        # The last program of each row finishes it; rows finish in parallel.
        parts["finish"] = finish
    if plan.sort_after:
        parts["sort_k"] = _torch_sort(model, R, k, s)
        host += 2 * model.torch_launch
    host += _glue_host(call, model)
    return model.estimate(OP, "radix", triton=True, notes=notes, launch=host, **parts)


def _waves(programs: int, sms: int, num_warps: int) -> int:
    """Rounds of `programs` latency-bound programs of num_warps warps over the chip's SMs (each
    SM keeps WARPS_PER_SM warps busy)."""
    return math.ceil(programs / (sms * max(1, WARPS_PER_SM // num_warps)))


def _one_launch(call, model) -> tuple[dict, float]:
    """(parts, host) of a backend of one launch: the copy of rows of strided elements, and the
    host's launch, the two outputs and the glue; its workspace is the stream's, kept between
    calls (tickets zeroed by the kernel)."""
    parts = _copy(call, model)
    host = parts.pop("copy_host", 0.0) + BOUND_LAUNCH + _alloc(2, model)
    return parts, host + _glue_host(call, model)


def tournament(call, model, plan):
    done = _trivial(call, model, "tournament", True)
    if done is not None:
        return done
    R, N, k, s = _sizes(call)
    sms = max(1, model.sm_count)
    parts, host = _one_launch(call, model)
    if plan.apart:
        host += BOUND_LAUNCH  # the selection's launch (its device time is left in the one model)
    programs = R * plan.programs_per_row
    waves = _waves(programs, sms, plan.num_warps)
    # The input once, the group maxima written and read back (through L2, often not DRAM),
    # at the rate the resident warps stream it.
    memory = model.stream(R * N * s + _out_bytes(call) + 2 * programs * plan.group_maxima_slots * 4)
    # Warps streaming an SM. A row that is one program streams with all its warps however few
    # the rows (the programs' average share of an SM made a few short rows many times too
    # slow). Rows split over several programs keep that average, on which the rate was fitted
    # (whole SMs made single rows of 1e5-1e6 too fast: fits/topk.md#tournament).
    busy = programs / sms if plan.programs_per_row > 1 else max(1.0, programs / sms)
    resident = min(busy, max(1, WARPS_PER_SM // plan.num_warps)) * plan.num_warps
    streamed = R * N * s / (min(programs, sms) * resident * TOURNAMENT_WARP_BANDWIDTH)
    parts["memory"] = max(memory, streamed)
    # Per program: the cut among the maxima, the hot groups re-read, their k largest.
    steps = _search_steps(32, True)
    sort_k = _sort_latency(plan.k_padded) if call.sorted else 0.0
    per_program = 2 * steps * STEP_LATENCY + TILE_LATENCY
    parts["select"] = waves * (per_program + (sort_k if plan.programs_per_row == 1 else 0.0))
    if plan.programs_per_row > 1:
        # The last program of each row selects from the programs_per_row lists of winners.
        parts["finish"] = steps * STEP_LATENCY + TILE_LATENCY + sort_k
    est = model.estimate(OP, "tournament", triton=True, launch=host, **parts)
    # Scaled as the model's own calibration scales: the parts with the total.
    est.seconds *= TOURNAMENT_VALUE_RISK
    est.parts = {name: v * TOURNAMENT_VALUE_RISK for name, v in est.parts.items()}
    est.notes = (*est.notes, f"x{TOURNAMENT_VALUE_RISK} for the risk of tied values")
    return est


def maxima(call, model, plan):
    done = _trivial(call, model, "maxima", True)
    if done is not None:
        return done
    R, N, k, s = _sizes(call)
    key_bits = 64 if s == 8 else 32
    parts = _copy(call, model)
    host = (parts.pop("copy_host", 0.0) + 2 * BOUND_LAUNCH + MAXIMA_SECOND_LAUNCH_HOST
            + _alloc(3, model))
    host += _glue_host(call, model)
    # Launch 1 streams the rows and writes the group and supergroup maxima.
    maxima_bytes = R * (plan.group_row_stride + plan.supergroup_row_stride) * key_bits / 8
    parts["memory"] = model.stream(R * N * s + maxima_bytes) / MAXIMA_PASS_EFFICIENCY
    # Launch 2: every program searches the cut among its row's supergroup maxima, scans its
    # share of the group maxima (from L2), gathers its hot groups, waits for the row's other
    # programs and ranks a share of the candidates: dependent steps, then the queue of
    # programs where there are many rows.
    waves = -(-R * plan.select_programs_per_row // max(1, model.sm_count))
    parts["select"] = (MAXIMA_SELECT + MAXIMA_PER_K * k
                       + waves * (MAXIMA_WAVE + MAXIMA_PER_GROUP * plan.groups_per_program)
                       + MAXIMA_RANK_PAIR * R * k * k
                       + model.stream(_out_bytes(call)))
    if plan.sort_after:
        parts["sort_k"] = _torch_sort(model, R, k, s)
        host += 2 * model.torch_launch
    return model.estimate(OP, "maxima", triton=True, launch=host, **parts)


def argmax(call, model, plan):
    done = _trivial(call, model, "argmax", True)
    if done is not None:
        return done
    R, N, k, s = _sizes(call)
    sms = max(1, model.sm_count)
    parts, host = _one_launch(call, model)
    programs = -(-R // plan.block_rows) * plan.programs_per_row
    waves = _waves(programs, sms, plan.num_warps)
    # One read of the rows, at the chip's rate where its programs fill it, at a program's own
    # rate where they are few; the keys' arithmetic where it is longer.
    alone = waves * plan.block_rows * min(plan.chunk, N) * s / PROGRAM_BANDWIDTH
    parts["memory"] = max(model.stream(R * N * s + _out_bytes(call)) / ARGMAX_PASS_EFFICIENCY,
                          R * N * ARGMAX_OPS / (sms * ALU_PER_SM), alone)
    parts["fixed"] = ARGMAX_FIXED
    if plan.programs_per_row > 1:
        parts["merge"] = ARGMAX_MERGE
    return model.estimate(OP, "argmax", triton=True, launch=host, **parts)


def _glue_host(call, model) -> float:
    """Host time of a Triton topk beyond its launches and allocations: the Python around them
    and, for a dim other than the last, the results moved into torch's layout (two copies)."""
    reshape = 0.0 if call.dim == max(call.nd, 1) - 1 else 2 * model.torch_launch
    return TRITON_GLUE_HOST + reshape


def bitonic_rounds(n_pow2: int, k_pow2: int) -> float:
    """Element-rounds of tl.topk(x[n], k) (tl.sort when k == n), in merge rounds: log2(k) merge
    stages over all n, then each halving (a max, then a log2(k)-round merge on what is left) at
    BITONIC_HALVING_WEIGHT."""
    ln = max(0, n_pow2.bit_length() - 1)
    lk = max(0, k_pow2.bit_length() - 1)
    rounds = n_pow2 * lk * (lk + 1) / 2
    size = n_pow2
    for _ in range(lk, ln):
        size //= 2
        rounds += BITONIC_HALVING_WEIGHT * (size * (lk + 1) + size)
    return rounds


def bitonic(call, model, plan):
    done = _trivial(call, model, "bitonic", True)
    if done is not None:
        return done
    R, N, k, s = _sizes(call)
    npow = 1 << max(0, (N - 1).bit_length())
    kpow = 1 << max(0, (k - 1).bit_length())
    sms = max(1, model.sm_count)
    per_row = bitonic_rounds(npow, kpow) * BITONIC_ROUND_S * (plan.num_warps / 16) ** 0.25
    # A program's rows run on one SM: few rows leave most of the chip idle, far from the
    # whole chip's share of the work (fits/topk.md#bitonic).
    rows = plan.rows_per_program
    programs = -(-R // rows)
    network = max(R * per_row / sms, -(-programs // sms) * rows * per_row)
    host = BOUND_LAUNCH + _alloc(2, model) + _glue_host(call, model)
    parts = dict(memory=model.stream(R * N * s + _out_bytes(call)), network=network)
    if not call.viewable:
        copy = _copy(call, model)
        host += copy.pop("copy_host")
        parts.update(copy)
    elif not _adjacent(call):
        parts["memory"] *= 1.3  # strided rows are read in place, a little less efficiently
    return model.estimate(OP, "bitonic", triton=True, launch=host, **parts)
