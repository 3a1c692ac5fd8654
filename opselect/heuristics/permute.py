"""Cost model of the permute backends: roofline terms per backend, in seconds.

Every backend reads and writes each byte once (2 * numel * itemsize bytes); they differ in how well
those bytes are packed into DRAM transactions and in the index arithmetic per element:

  * a contiguous segment of S bytes per access pattern runs at `segment(S)` of the copy bandwidth
    (a 32-byte sector alone reaches about a third of it, 256 bytes and more all of it);
  * a read that strides through the input (the last dim moves) uses one element per sector, and
    only L2 reuse between neighbouring programs recovers part of the waste;
  * div/mod pairs by runtime sizes cost about 25 integer instructions each (75 in 64 bits).

The call's simplified problem (call.sizes, call.strides, call.esize, call.kind) is what is modelled,
so a 5-d permute that merges into a 2-d transpose costs what the transpose costs.

A constant or rule fitted to measured calls names its heading in
benchmarks/results/h200/fits/permute.md (as `fits/permute.md, "HEADING"`), which keeps the
measurements.
"""

from __future__ import annotations

import math

from .device_model import ALLOCATION, BOUND_LAUNCH

OP = "permute"

#: Efficiency of DRAM traffic made of contiguous segments of this many bytes (log-interpolated).
_SEGMENT = ((16, 0.2), (32, 0.35), (64, 0.6), (128, 0.85), (256, 1.0))
#: Integer instructions of one div/mod pair by a runtime divisor, 32 and 64 bits, as they cost
#: next to the memory traffic they partly overlap: fewer than the ~25 (75) issued, since a
#: div/mod-heavy measured call took about half the time the issued count gives
#: (fits/permute.md, "DIVMOD_OPS").
DIVMOD_OPS = {False: 12.0, True: 36.0}
#: Integer instructions per SM per second (64 lanes x ~1.6 GHz on Hopper).
INT_OPS_PER_SM = 64 * 1.6e9
#: Fraction of the copy bandwidth each backend reaches at its best (measured order of magnitude).
PEAK = {"tiled": 0.9, "vectorized": 0.95, "naive": 0.85}
#: torch's strided copy (TensorIterator, one element per access, 4 per thread): efficiency by
#: element size when the last dim stays (reads and writes coalesced) and when it moves.
TORCH_KEEP = {1: 0.3, 2: 0.45, 4: 0.6, 8: 0.65, 16: 0.65}
TORCH_MOVE = {1: 0.08, 2: 0.13, 4: 0.22, 8: 0.3, 16: 0.35}


def segment(nbytes: float) -> float:
    if nbytes <= _SEGMENT[0][0]:
        return _SEGMENT[0][1] * max(nbytes, 1) / _SEGMENT[0][0]
    for (x0, y0), (x1, y1) in zip(_SEGMENT, _SEGMENT[1:]):
        if nbytes <= x1:
            f = math.log(nbytes / x0) / math.log(x1 / x0)
            return y0 + f * (y1 - y0)
    return 1.0


def read_locality(call, block: int = 1024) -> float:
    """Useful fraction of the 32-byte sectors a program reads when it copies `block` consecutive
    output elements of a moving problem: the output's inner dims, walked outwards until they
    cover the block, span some bytes of the input, which come in whole sectors. A transpose whose
    output-inner dim strides far through the input uses one element a sector (esize / 32); a batch
    of tiny transposes (1.45M 13x3 uint8 blocks, 39 bytes each) reads every byte of its sectors,
    as a plain copy does."""
    e = call.esize
    covered, span = 1, e
    for n, t in zip(reversed(call.sizes), reversed(call.strides)):
        take = min(n, -(-block // covered))
        span += (take - 1) * abs(t) * e
        covered *= take
        if covered >= block:
            break
    sectors = min(covered * -(-e // 32), -(-span // 32) + 1)
    return min(1.0, covered * e / (32.0 * sectors))


def _next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _traffic(call) -> float:
    return 2.0 * call.numel * call.input.element_size()


def _int_time(n_divmods: float, model, wide: bool) -> float:
    return n_divmods * DIVMOD_OPS[wide] / (INT_OPS_PER_SM * max(1, model.sm_count))


def _wide(call) -> bool:
    n = call.numel * call.input.element_size()
    return n >= 2**31 or call.span * call.esize >= 2**31


def _elements(call) -> float:
    return call.numel * call.input.element_size() / call.esize


#: Host seconds of a Triton backend's call beyond its launch and the output's allocation (the
#: public function's checks, key and lookup, the layout handling): what repeated naive and tiled
#: calls took beyond them (fits/permute.md, "TRITON_GLUE_HOST").
TRITON_GLUE_HOST = 6.5e-6


#: Device seconds a program (CTA) costs beyond its bytes, per SM: its launch, prologue and the
#: latency of its first load, which the SM's other resident programs only partly hide. Matters
#: when the grid has far more programs than the data needs (a tile of a few bytes a program);
#: the value is what such a measured grid paid a program (fits/permute.md, "PROGRAM_SECONDS").
PROGRAM_SECONDS = 85e-9


def _programs(n: float, model) -> float:
    return n * PROGRAM_SECONDS / max(1, model.sm_count)


#: Host seconds torch's permute adds to its copy's launch per dim of the simplified problem past
#: the first (the view, and TensorIterator's setup of each dim): a 2-d transpose took 10.8 us and
#: a 4-d (0, 2, 1, 3) permute 16.9 on the H200's host (fits/permute.md, "TRITON_GLUE_HOST").
TORCH_DIM_HOST = 2e-6


#: enable()'s eager copies of a view (contiguous(), reshape()) that torch's copy answers before
#: any key is made (fronts/permute.py): at most TORCH_COPY_DIMS dims (torch's host time grows
#: with them: past 4 a Triton call wins its host time on the A100's figures) and at most
#: TORCH_COPY_NUMEL elements, no forced backend, tuning off. Below these the model's eager
#: choice is torch on every GPU it knows: over random such views the least with another choice
#: had 303,744 elements (A100, complex128), 836,000 on the H200; tests/test_cost_model.py
#: checks the bound on random views.
TORCH_COPY_DIMS = 4
TORCH_COPY_NUMEL = 1 << 17


def _host(model, triton: bool, call=None) -> float:
    """Host seconds of one call: a bound Triton launch plus the output's allocation and the
    Python around them, or torch's permute view plus its copy (the model takes the longer of
    host and device time)."""
    if triton:
        return TRITON_GLUE_HOST + BOUND_LAUNCH + ALLOCATION
    torch_launch = getattr(model, "torch_launch", model.launch)
    dims = len(call.sizes) if call is not None and call.sizes else 2
    return torch_launch + TORCH_DIM_HOST * max(1, dims - 1)


def _trivial(call, model, backend: str, triton: bool):
    if call.numel == 0 or call.kind == "other":
        return model.estimate(OP, backend, triton=triton, launch=_host(model, False, call))
    return None


def torch_(call, model, plan=None):
    if call.numel == 0:
        return model.estimate(OP, "torch", triton=False, launch=_host(model, False, call))
    s = call.input.element_size()
    if call.kind == "keep" or call.kind == "other":
        run = (call.sizes[-1] if call.sizes else 1) * call.esize
        eff = TORCH_KEEP.get(s, 0.5) * segment(run)
        if call.span * call.esize <= 0.5 * model.l2_bytes:
            # Short runs of an input that fits in L2 come from DRAM about once, so the copy is
            # not bound by the sectors its runs touch; a transpose is, whatever the size
            # (fits/permute.md, "torch: short runs of an input that fits in L2").
            eff = max(eff, 0.5 * TORCH_KEEP.get(s, 0.5))
    else:
        # Strided reads; when the output's inner dims sit close together in the input they
        # fill their sectors and the copy runs as a kept one does.
        eff = max(TORCH_MOVE.get(s, 0.2), TORCH_KEEP.get(s, 0.5) * read_locality(call))
    return model.estimate(OP, "torch", triton=False, launch=_host(model, False, call),
                          memory=model.stream(_traffic(call)) / eff)


def naive(call, model, plan=None):
    done = _trivial(call, model, "naive", True)
    if done is not None:
        return done
    e = call.esize
    if call.kind == "keep":
        eff = PEAK["naive"] * segment(call.sizes[-1] * e if call.sizes else e)
    else:
        # One element per sector read, L2 catching part of the neighbours' reuse; unless the
        # output's inner dims sit close together in the input (read_locality).
        eff = PEAK["naive"] * max(TORCH_MOVE.get(e, 0.35) * 1.2, read_locality(call))
    nd = max(1, len(call.sizes))
    memory = model.stream(_traffic(call)) / eff
    index = _int_time(_elements(call) * (nd - 1), model, _wide(call))
    # The index arithmetic runs while other warps wait on memory: a call costs the longer of
    # the two, not their sum (fits/permute.md, "naive: index arithmetic overlaps memory").
    return model.estimate(OP, "naive", triton=True, launch=_host(model, True),
                          memory=memory, index=max(0.0, index - memory))


def vectorized(call, model, plan=None):
    done = _trivial(call, model, "vectorized", True)
    if done is not None:
        return done
    e = call.esize
    run = (call.sizes[-1] if call.sizes else 1) * e
    rows = _elements(call) / (call.sizes[-1] if call.sizes else 1)
    nd = max(0, len(call.sizes) - 1)
    # Reads come in runs of `run` bytes; writes are one contiguous stream.
    memory = 0.5 * model.stream(_traffic(call)) * (1 / segment(run) + 1) / PEAK["vectorized"]
    # A tile spans a power of two of units along the run: runs of 85 float32 leave a third of
    # its lanes masked, bytes the tile does not keep in flight (fits/permute.md, "vectorized:
    # masked lanes of a tile").
    unit = min(e, 8)
    units = max(1, run // unit)
    block = min(_next_pow2(units), 16384 // unit)
    if units % block and (units & -units) * unit >= 256:
        block = units & -units
    memory /= units / (-(-units // block) * block)
    return model.estimate(OP, "vectorized", triton=True, launch=_host(model, True),
                          memory=memory, index=_int_time(rows * max(0, nd - 1), model, _wide(call)))


def tiled(call, model, tiled_plan):
    """tiled_plan: the backend's TiledPlan of the call's first config (kernels/permute/tiled.py)."""
    done = _trivial(call, model, "tiled", True)
    if done is not None:
        return done
    plan = tiled_plan.geometry
    elem = call.unit * plan.w
    half = 0.5 * model.stream(_traffic(call))
    if tiled_plan.narrow:
        # One side moves a contiguous chunk of n x bw elements, the other rows of bw elements.
        n, m = (plan.A, plan.B) if plan.narrow == "in" else (plan.B, plan.A)
        bw = tiled_plan.wide_block
        memory = (half / segment(n * min(bw, m) * elem) + half / segment(min(bw, m) * elem))
        tiles = plan.n_batch * math.ceil(m / bw)
        per_tile = tiled_plan.narrow_padded * (len(plan.a_dims if plan.narrow == "in" else
                                                    plan.b_dims) + 1) + len(plan.batch) + 2
        return model.estimate(OP, "tiled", triton=True, launch=_host(model, True),
                              memory=memory / PEAK["tiled"],
                              index=_int_time(tiles * per_tile, model, _wide(call)),
                              programs=_programs(tiles, model))
    ba, bb = tiled_plan.a_block, tiled_plan.b_block
    # A contiguous input segment is a row of the tile along A, or several rows when A is short and
    # the B rows lie back to back in the input (the (N, 3) -> (3, N) case); likewise the output.
    seg_in = min(ba, plan.A) * elem
    use_in = 1.0  # fraction of the input bytes read that the tile keeps
    gap = plan.b_dims[0][1]  # input stride of the B rows, in elements
    if plan.A <= ba and gap == plan.A:
        seg_in *= min(bb, plan.B)
    elif plan.A <= ba and plan.A < gap and gap * elem <= 64:
        # Rows of a sliced input, a few bytes apart (2 of every 3 bf16): the tile reads their
        # whole span in one piece and drops the gaps.
        seg_in = min(bb, plan.B) * gap * elem
        use_in = plan.A / gap
    seg_out = min(bb, plan.B) * elem
    if plan.B <= bb and plan.a_dims[0][1] == plan.B:
        seg_out *= min(ba, plan.A)
    memory = (half / (segment(seg_in) * use_in) + half / segment(seg_out)) / PEAK["tiled"]
    # Lanes past the end of a short group move nothing but still take their slot.
    waste = (ba * bb) / (min(ba, plan.A) * min(bb, plan.B))
    tiles = plan.n_batch * math.ceil(plan.A / ba) * math.ceil(plan.B / bb)
    # Per tile: the cross offsets of A and B (vectors of ba and bb lanes, one div/mod pair per
    # extra dim of the group) and the scalar batch decomposition.
    per_tile = ba * (len(plan.a_dims) - 1) + bb * (len(plan.b_dims) - 1) + len(plan.batch) + 2
    index = _int_time(tiles * per_tile, model, _wide(call))
    return model.estimate(OP, "tiled", triton=True, launch=_host(model, True),
                          memory=memory * (1 + 0.1 * (waste - 1)), index=index,
                          programs=_programs(tiles, model))
