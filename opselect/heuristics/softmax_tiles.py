"""Launch shapes of softmax's strided kernels that the cost model and the kernels share: the
tile of a [dim x inner] reduction (strided_plan) and a short dim's warps (single_warps). The
kernels' plans are these functions (kernels/softmax/common.py), and the model's estimates
(softmax.py) read them, so both see one tile."""

from __future__ import annotations


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


#: Dims up to this long (padded to a power of two) held whole in registers take the short-dim
#: tile and warps below (SHORT_DIM_TILE_DIVISOR, single_warps); longer ones the general rule.
SHORT_DIM_MAX = 256
#: A short dim's tile: the general tile over this (forward 4096 elements, backward 2048), at
#: least SHORT_DIM_COLUMNS columns.
SHORT_DIM_TILE_DIVISOR = 4
SHORT_DIM_COLUMNS = 32
#: The forward's short-dim tile is at most this many columns: the quarter tile gives dims of 16
#: or fewer rows 128-512 columns a program, which ran 3-17% slower than 64 (H200, fits/softmax.md
#: "Short dims: the forward at most 64 columns": 64 x 12 x 197 x 197 fp16 over the heads 56.5
#: -> 47.1 us). Not the backward's: 2000 x 7 x 333 fp32 ran its 64 columns 8% slower than 256.
SHORT_FWD_COLUMNS_MAX = 64


def strided_plan(n: int, inner: int, outer: int, itemsize: int, sm_count: int,
                 block_i: int | None = None, tile: int = 16384,
                 short: bool = True, short_most: int = 0) -> tuple[int, int, bool]:
    """(inner_block, dim_block, single) for a [dim x inner] reduction along axis 0: inner_block
    inner columns per program, and the whole dim in registers (single) when dim_block x
    inner_block fits in `tile` (the forward's 16384 elements; the backward's BWD_STRIDED_TILE,
    as it holds y and dy). The kernels' plans (common._strided_plan) are this function.

    A short dim (`short`, padded to at most SHORT_DIM_MAX) takes a quarter of the tile, at least
    SHORT_DIM_COLUMNS columns and at most `short_most` (0: no bound): with the dim across few
    warps the reduction along it stays mostly within threads (H200, fits/softmax.md "Short
    dims": 1000 x 33 x 768 fp16 221 -> 52 us)."""
    pn = _pow2(n)
    # Row segments of 128 bytes (a cache line) by default, at most 2 KB; down to 32 bytes (a
    # sector, still fully used) when that keeps the whole dim in registers or gives every SM work.
    wide_i = max(1, min(_pow2(inner), 128 // itemsize))
    min_i = max(1, min(_pow2(inner), 32 // itemsize))
    if block_i is None:
        if short and pn <= SHORT_DIM_MAX:
            block_i = min(_pow2(inner), max(SHORT_DIM_COLUMNS,
                                            tile // SHORT_DIM_TILE_DIVISOR // pn))
            if short_most:
                block_i = min(block_i, short_most)
        else:
            block_i = min(_pow2(inner), 2048 // itemsize, max(wide_i, tile // pn))
            if pn * block_i > tile and tile // pn >= min_i:
                block_i = tile // pn  # one read instead of two, with shorter segments
        while block_i > min_i and outer * _cdiv(inner, block_i) < 2 * sm_count:
            block_i //= 2
    block_i = max(1, min(block_i, _pow2(inner)))
    if pn * block_i <= tile:
        return block_i, pn, True
    # Chunks of the dim: the loop keeps a running max and sum per lane, so a chunk is a quarter
    # of the tile (state, the chunk and its exponentials share the registers).
    return block_i, max(1, min(pn, tile // (4 * block_i))), False


def single_warps(elements: int, vector: bool, per_thread: int) -> int:
    """Warps of a short dim's single-pass tile (SHORT_DIM_MAX): `per_thread` elements a thread
    where the rows load in 16-byte vectors (`vector`), half as many where they load narrower
    (more threads keep the loads in flight), 2 to 16 warps (one warp lost 10% on a tiny tile of
    few programs, 101 x 323 over dim 0). The forward holds 64, the backward (y and dy) 32."""
    per = per_thread if vector else per_thread // 2
    return max(2, min(16, _pow2(elements) // (32 * per)))
