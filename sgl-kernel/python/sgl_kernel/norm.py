"""RMSNorm, alone or fused with the residual add before it; one program per token row."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sgl_kernel._interpreter import fix_interpreter

fix_interpreter()


@triton.jit
def _rmsnorm_row(x_row, weight, hidden, eps, BLOCK: tl.constexpr):
    """weight * (x / rms(x)), with the statistics in float32 and the normalized value
    rounded to x's dtype before the weight multiplies it (as the reference models do)."""
    cols = tl.arange(0, BLOCK)
    col_ok = cols < hidden
    x = x_row.to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(x * x, 0) / hidden + eps)
    normed = (x * inv_rms).to(x_row.dtype).to(tl.float32)
    w = tl.load(weight + cols, mask=col_ok, other=0.0).to(tl.float32)
    return w * normed


@triton.jit
def _rmsnorm_kernel(x, out, weight, hidden, eps, stride_x, stride_out, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    col_ok = cols < hidden
    x_row = tl.load(x + t * stride_x + cols, mask=col_ok, other=0.0)
    y = _rmsnorm_row(x_row, weight, hidden, eps, BLOCK)
    tl.store(out + t * stride_out + cols, y.to(out.dtype.element_ty), mask=col_ok)


@triton.jit
def _fused_add_rmsnorm_kernel(x, residual, weight, hidden, eps, stride_x, stride_r, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    col_ok = cols < hidden
    x_row = tl.load(x + t * stride_x + cols, mask=col_ok, other=0.0).to(tl.float32)
    r_row = tl.load(residual + t * stride_r + cols, mask=col_ok, other=0.0).to(tl.float32)
    summed = (x_row + r_row).to(residual.dtype.element_ty)
    tl.store(residual + t * stride_r + cols, summed, mask=col_ok)
    y = _rmsnorm_row(summed, weight, hidden, eps, BLOCK)
    tl.store(x + t * stride_x + cols, y.to(x.dtype.element_ty), mask=col_ok)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, out: torch.Tensor | None = None) -> torch.Tensor:
    """x: [T, hidden] -> weight * rmsnorm(x), in x's dtype."""
    _check(x, weight)
    out = torch.empty_like(x) if out is None else out
    assert out.shape == x.shape and out.stride(-1) == 1
    if x.shape[0]:
        _rmsnorm_kernel[(x.shape[0],)](x, out, weight, x.shape[1], eps, x.stride(0), out.stride(0), **_launch(x))
    return out


def fused_add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> None:
    """In place: residual += x, then x = weight * rmsnorm(residual)."""
    _check(x, weight)
    if residual.shape != x.shape or residual.dtype != x.dtype or residual.stride(-1) != 1:
        raise ValueError(f"residual {tuple(residual.shape)} {residual.dtype} must match x {tuple(x.shape)} {x.dtype}")
    if x.shape[0]:
        _fused_add_rmsnorm_kernel[(x.shape[0],)](
            x, residual, weight, x.shape[1], eps, x.stride(0), residual.stride(0), **_launch(x)
        )


def _check(x: torch.Tensor, weight: torch.Tensor) -> None:
    if x.dim() != 2 or x.stride(-1) != 1 or weight.shape != (x.shape[1],) or not weight.is_contiguous():
        raise ValueError(
            f"x must be [T, hidden] with a contiguous last dimension and weight [hidden], "
            f"got {tuple(x.shape)} and {tuple(weight.shape)}"
        )


def _launch(x: torch.Tensor) -> dict:
    block = triton.next_power_of_2(x.shape[1])
    return dict(BLOCK=block, num_warps=min(max(block // 512, 1), 16))


def rmsnorm_ref(
    x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, out: torch.Tensor | None = None
) -> torch.Tensor:
    x32 = x.float()
    normed = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    result = (weight * normed).to(x.dtype)
    return result if out is None else out.copy_(result)


def fused_add_rmsnorm_ref(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> None:
    residual.copy_((x.float() + residual.float()).to(x.dtype))
    x.copy_(rmsnorm_ref(residual, weight, eps))
