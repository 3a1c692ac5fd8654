"""The fused loss behind enable()'s route of F.cross_entropy (class indices over rows of logits).

torch's cross_entropy composes log_softmax and nll_loss, and moves the N x C matrix six times:
log_softmax writes logp, nll_loss's backward writes a zero matrix and scatters into it,
log_softmax's backward reads that and logp and writes dx. Here the forward reads the logits once
(each row's logsumexp and its target's logit) and the backward reads them once more and writes
dx = g * (softmax(x) - onehot(target)) in the same pass: three passes, and no N x C tensor kept
between forward and backward but the logits themselves (which the graph holds anyway)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .._common import allocator, cdiv, plan_launcher
from .common import _cast_for

#: Elements of a row a forward program reads per step (the next step's load in flight), and its
#: warps; the backward's programs take one block of one row each.
FORWARD_BLOCK, FORWARD_WARPS = 4096, 8
BACKWARD_BLOCK, BACKWARD_WARPS = 4096, 8
#: The interpreter's (CPU tests reach every step and the partial last block on short rows).
INTERPRETED_BLOCK = 16
#: nll_loss's reductions, the ones the fused loss gives.
REDUCTIONS = ("mean", "sum", "none")


@triton.jit
def _row_window(row, row_stride, C, vector: tl.constexpr):
    """Row `row`'s first element a, one past its last, and the window [a0, hi) of whole 16-byte
    vectors (`vector` elements) that holds it: rows off the 16-byte grid (GPT-2's 50257
    columns) are read a vector at a time all the same, the elements outside the row masked
    after the load. (a0 and hi are multiples of vector that the compiler can see, so a mask
    `offset < hi` is constant over each vector.) vector 1: the row itself."""
    a = row * row_stride
    end = a + C
    if vector > 1:
        a0 = (a // vector) * vector
        hi = ((end + vector - 1) // vector) * vector
    else:
        a0 = a
        hi = end
    return a, end, a0, hi


@triton.jit
def _ce_forward_kernel(x_ptr, target_ptr, lse_ptr, loss_ptr, C, x_row_stride, target_stride,
                       ignore_index, smoothing, block: tl.constexpr, vector: tl.constexpr,
                       smoothed: tl.constexpr):
    """Program r: row r's logsumexp (float32) and its loss, lse - x[target] (0 where the target
    is ignore_index); smoothed: lse - (1 - smoothing) x[target] - smoothing mean(x), torch's
    label smoothing ((1 - e) of the target's -log p, e of the mean -log p over the classes).
    One running maximum (a block's maximum, one reduction a step) and a sum per lane, rescaled
    when the maximum grows: one exp an element. (A maximum per lane needed two, exp(m - m_new)
    of every lane as well: bfloat16 rows of 128256 ran at the exp unit's rate, 2x the forward's
    read.)"""
    row = tl.program_id(0).to(tl.int64)
    a, end, a0, hi = _row_window(row, x_row_stride, C, vector)
    x_row = x_ptr + a
    # Offsets from the window's start in int32 (the window is a row and two vectors at most):
    # half the registers of int64 offsets an element.
    window = x_ptr + a0
    lead = (a - a0).to(tl.int32)
    width = (hi - a0).to(tl.int32)
    j = tl.arange(0, block)
    m = tl.full([], float("-inf"), tl.float32)
    s = tl.zeros([block], tl.float32)
    total = tl.zeros([block], tl.float32)  # (smoothed: the row's sum)
    x = tl.load(window + j, mask=j < width, other=float("-inf")).to(tl.float32)
    for start in range(0, width, block):
        nxt = j + (start + block)
        x_next = tl.load(window + nxt, mask=nxt < width, other=float("-inf")).to(tl.float32)
        at = j + start
        in_row = (at >= lead) & (at < lead + C)
        x = tl.where(in_row, x, float("-inf"))  # (the window's others)
        if smoothed:
            total += tl.where(in_row, x, 0.0)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        # exp(-inf - -inf) and exp(inf - inf) would be NaN: an unchanged maximum scales by 1,
        # a -inf element adds 0. A NaN element makes its lane's sum NaN for good (as torch's
        # log_softmax makes the row NaN), whether or not the block's maximum saw it.
        scale = tl.where(m == m_new, 1.0, tl.exp(m - m_new))
        s = s * scale + tl.where(x == float("-inf"), 0.0, tl.exp(x - m_new))
        m = m_new
        x = x_next
    lse = m + tl.log(tl.sum(s, axis=0))  # (an all -inf row: -inf, and its loss NaN, as torch's)
    t = tl.load(target_ptr + row * target_stride)
    valid = t != ignore_index
    # Targets out of range are refused before the launch (fused_cross_entropy); the mask only
    # keeps this load inside the row whatever it is given.
    x_t = tl.load(x_row + t, mask=valid & (t >= 0) & (t < C), other=0.0).to(tl.float32)
    if smoothed:
        loss = lse - (1.0 - smoothing) * x_t - smoothing * (tl.sum(total, axis=0) / C)
    else:
        loss = lse - x_t
    tl.store(lse_ptr + row, lse)
    tl.store(loss_ptr + row, tl.where(valid, loss, 0.0))


@triton.jit
def _ce_backward_kernel(x_ptr, target_ptr, lse_ptr, g_ptr, dx_ptr, C, x_row_stride,
                        dx_row_stride, target_stride, g_stride, ignore_index, smoothing,
                        block: tl.constexpr, vector: tl.constexpr, smoothed: tl.constexpr):
    """Program (r, b): block b of row r's gradient, g_r * (exp(x - lse_r) - [col == target_r])
    (smoothed: g_r * (exp(x - lse_r) - (1 - smoothing) [col == target_r] - smoothing / C));
    g_r is the row's upstream gradient (g_stride 0: one for every row), 0 where the target is
    ignore_index (torch's nll_loss gives such rows no gradient).

    vector > 1 (rows off the 16-byte grid, x and dx with the same row stride): blocks of the
    row's window of whole vectors (_row_window); the row's whole vectors are stored a vector at
    a time, its head and tail (fewer than `vector` elements each, in the first and last blocks)
    element by element."""
    row = tl.program_id(0).to(tl.int64)
    b = tl.program_id(1)
    a, end, a0, hi = _row_window(row, x_row_stride, C, vector)
    # int32 offsets from the window's start (see _ce_forward_kernel)
    lead = (a - a0).to(tl.int32)
    width = (hi - a0).to(tl.int32)
    j = b * block + tl.arange(0, block)
    t = tl.load(target_ptr + row * target_stride)
    g = tl.load(g_ptr + row * g_stride).to(tl.float32)
    g = tl.where(t != ignore_index, g, 0.0)
    lse = tl.load(lse_ptr + row)
    x = tl.load(x_ptr + a0 + j, mask=j < width, other=0.0).to(tl.float32)
    if smoothed:
        dx = (tl.exp(x - lse) - smoothing / C) * g - tl.where(j - lead == t,
                                                              (1.0 - smoothing) * g, 0.0)
    else:
        dx = tl.exp(x - lse) * g - tl.where(j - lead == t, g, 0.0)
    dx = _cast_for(dx, dx_ptr)
    if vector > 1:
        # dx's element of x's offset o is o itself (equal row strides): the row's whole
        # vectors [lo, cut) a vector at a time, its head and tail element by element.
        lo = ((lead + vector - 1) // vector) * vector
        cut = ((lead + C) // vector) * vector
        out = dx_ptr + a0
        tl.store(out + j, dx, mask=(j >= lo) & (j < cut))
        first = b * block
        if (first < lo) | ((first < lead + C) & (first + block > cut)):  # (a block with either)
            tl.store(out + j, dx, mask=(j >= lead) & (j < lead + C) & ((j < lo) | (j >= cut)))
    else:
        tl.store(dx_ptr + row * dx_row_stride + j, dx, mask=j < C)


@dataclass(frozen=True, eq=False)  # (a launch's spec; memoised below, so hashed by identity)
class CrossEntropyPlan:
    dtype: torch.dtype  # of the logits
    C: int  # classes (the row's length)
    x_row_stride: int
    target_stride: int
    ignore_index: int
    block: int
    num_warps: int
    vector: int  # elements per 16-byte vector where rows are read in whole vectors (_row_window)
    smoothed: bool  # label smoothing (its amount is a runtime argument)
    dx_row_stride: int = 0  # (backward)
    g_stride: int = 0  # (backward: 0 where one gradient serves every row)


cross_entropy_plan = functools.lru_cache(maxsize=1024)(CrossEntropyPlan)
_FORWARD = plan_launcher(_ce_forward_kernel)
_BACKWARD = plan_launcher(_ce_backward_kernel)


def _block(x: torch.Tensor, block: int) -> int:
    return INTERPRETED_BLOCK if x.device.type == "cpu" else block


def _vector(x: torch.Tensor) -> int:
    """Elements per 16-byte vector where the rows start off the 16-byte grid (x's row stride not
    a multiple of it, x at a 16-byte boundary) and dx can share x's offsets (x's rows back to
    back, as dx's are); else 1 (aligned rows, which Triton vectorises by itself, or strided
    ones)."""
    per_vector = 16 // x.element_size()
    C = x.shape[1]
    if x.stride(0) % per_vector == 0 or x.stride(0) != C or x.data_ptr() % 16 or C < 2 * per_vector:
        return 1
    return per_vector


def _check_targets(target: torch.Tensor, classes: int, ignore_index: int) -> None:
    """torch's nll_loss refuses a target outside [0, classes) that is not ignore_index (on a GPU
    with a device-side assertion): the same, without waiting for the device."""
    if target.numel():
        ok = ((target >= 0) & (target < classes)) | (target == ignore_index)
        if target.device.type == "cpu":
            if not bool(ok.all()):
                bad = target[~ok][0].item()
                raise IndexError(f"cross_entropy: target {bad} is out of bounds for "
                                 f"{classes} classes")
        else:
            torch._assert_async(ok.all())


def _on_the_tensors_device(x: torch.Tensor, launch) -> None:
    """launch() with x's GPU current: Triton launches on the current device, not the tensors'."""
    if x.is_cuda and x.device.index != torch.cuda.current_device():
        with torch.cuda.device(x.device):
            launch()
    else:
        launch()


def forward_rows(x: torch.Tensor, target: torch.Tensor, ignore_index: int,
                 smoothing: float = 0.0):
    """(lse, loss) of each row of x (N x C, unit column stride), float32."""
    N, C = x.shape
    _check_targets(target, C, ignore_index)
    lse = allocator((N,), torch.float32, x.device)()
    loss = allocator((N,), torch.float32, x.device)()
    if N:
        plan = cross_entropy_plan(x.dtype, C, x.stride(0), target.stride(0), ignore_index,
                                  _block(x, FORWARD_BLOCK), FORWARD_WARPS, _vector(x),
                                  smoothing != 0)
        _on_the_tensors_device(x, lambda: _FORWARD(
            plan, (N,), (x, target, lse, loss, C, x.stride(0), target.stride(0), ignore_index,
                         float(smoothing))))
    return lse, loss


def backward_rows(x: torch.Tensor, target: torch.Tensor, lse: torch.Tensor, g: torch.Tensor,
                  ignore_index: int, smoothing: float = 0.0) -> torch.Tensor:
    """dx (x's dtype, contiguous) from each row's upstream gradient g (N of them, or one)."""
    N, C = x.shape
    dx = allocator((N, C), x.dtype, x.device)()
    if N and C:
        g_stride = g.stride(0) if g.dim() else 0
        block, vector = _block(x, BACKWARD_BLOCK), _vector(x)
        plan = cross_entropy_plan(x.dtype, C, x.stride(0), target.stride(0), ignore_index, block,
                                  BACKWARD_WARPS, vector, smoothing != 0, C, g_stride)
        # (a row's window of whole vectors reaches up to a vector before and after it; the
        # blocks past a row's window mask everything)
        blocks = cdiv(C + 2 * (vector - 1), block)
        _on_the_tensors_device(x, lambda: _BACKWARD(
            plan, (N, blocks), (x, target, lse, g, dx, C, x.stride(0), C, target.stride(0),
                                g_stride, ignore_index, float(smoothing))))
    return dx


def _row_weights(weight, target: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """Each row's class weight (weight[target]; 0 where the target is ignored), float32."""
    valid = target != ignore_index
    return weight.to(torch.float32)[torch.where(valid, target, 0)] * valid


def _reduce(rows: torch.Tensor, target: torch.Tensor, weights, ignore_index: int,
            reduction: str):
    """nll_loss's reductions of the per-row losses: 'mean' over the rows whose target counts
    (their weights' sum with class weights; NaN where nothing counts, as torch's), with the
    divisor for the backward."""
    if weights is not None:
        rows = rows * weights
    if reduction == "none":
        return rows, None
    if reduction == "sum":
        return rows.sum(), None
    if weights is not None:
        count = weights.sum()
    else:
        count = (target != ignore_index).sum().to(torch.float32)
    return rows.sum() / count, count


class FusedCrossEntropy(torch.autograd.Function):
    """F.cross_entropy(x, target, weight, ignore_index=..., reduction=..., label_smoothing=...)
    for x of N x C floats with unit column stride, target N int64 class indices; class weights
    (weight) and label smoothing not both."""

    @staticmethod
    def forward(ctx, x, target, weight, ignore_index: int, reduction: str, smoothing: float,
                loss_dtype):
        lse, rows = forward_rows(x, target, ignore_index, smoothing)
        weights = None if weight is None else _row_weights(weight, target, ignore_index)
        loss, count = _reduce(rows, target, weights, ignore_index, reduction)
        ctx.save_for_backward(x, target, lse, count, weights)
        ctx.ignore_index, ctx.reduction, ctx.smoothing = ignore_index, reduction, smoothing
        return loss.to(loss_dtype if loss_dtype is not None else x.dtype)

    @staticmethod
    def backward(ctx, g):
        x, target, lse, count, weights = ctx.saved_tensors
        g = g.to(torch.float32)
        if ctx.reduction == "mean":
            g = g / count
        if weights is not None:
            g = g * weights  # (one a row)
        if torch.is_grad_enabled():
            # A graph of the gradient is wanted (double backward): torch's differentiable ops.
            dx = _backward_by_torch(x, target, g, ctx.ignore_index, ctx.smoothing)
        else:
            dx = backward_rows(x, target, lse, g, ctx.ignore_index, ctx.smoothing)
        return dx, None, None, None, None, None, None


def _backward_by_torch(x, target, g, ignore_index: int, smoothing: float) -> torch.Tensor:
    valid = target != ignore_index
    g_rows = g.expand(target.shape) * valid
    p = torch.softmax(x.to(torch.float32), 1)
    onehot = F.one_hot(torch.where(valid, target, 0), x.shape[1]).to(torch.float32)
    if smoothing:
        onehot = onehot * (1.0 - smoothing) + smoothing / x.shape[1]
    return ((p - onehot) * g_rows[:, None]).to(x.dtype)


def fused_cross_entropy(x: torch.Tensor, target: torch.Tensor, ignore_index: int,
                        reduction: str, loss_dtype: torch.dtype | None = None, *,
                        weight: torch.Tensor | None = None,
                        smoothing: float = 0.0) -> torch.Tensor:
    """The loss in loss_dtype (default: x's, as torch's; float32 under autocast, which casts
    the logits first) and, under autograd, the gradient in x's dtype."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"{reduction} is not a valid value for reduction")
    if weight is not None and smoothing:
        raise ValueError("fused_cross_entropy: class weights with label smoothing are torch's")
    return FusedCrossEntropy.apply(x, target, weight, ignore_index, reduction, float(smoothing),
                                   loss_dtype)
