"""SiLU-and-mul of the gated MLP: [T, 2d] holding [gate | up] -> silu(gate) * up, [T, d]."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sgl_kernel._interpreter import fix_interpreter

fix_interpreter()

BLOCK = 1024


@triton.jit
def _silu_and_mul_kernel(x, out, d, stride_x, stride_out, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    col_ok = cols < d
    gate = tl.load(x + t * stride_x + cols, mask=col_ok, other=0.0).to(tl.float32)
    up = tl.load(x + t * stride_x + d + cols, mask=col_ok, other=0.0).to(tl.float32)
    y = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(out + t * stride_out + cols, y.to(out.dtype.element_ty), mask=col_ok)


def silu_and_mul(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """x: [T, 2d] -> [T, d], computed in float32 and stored in x's dtype."""
    if x.dim() != 2 or x.shape[1] % 2 or x.stride(-1) != 1:
        raise ValueError(f"x must be [T, 2d] with a contiguous last dimension, got {tuple(x.shape)}")
    tokens, d = x.shape[0], x.shape[1] // 2
    out = torch.empty((tokens, d), dtype=x.dtype, device=x.device) if out is None else out
    assert out.shape == (tokens, d) and out.stride(-1) == 1
    if tokens and d:
        _silu_and_mul_kernel[(tokens, triton.cdiv(d, BLOCK))](
            x, out, d, x.stride(0), out.stride(0), BLOCK=BLOCK, num_warps=4
        )
    return out


def silu_and_mul_ref(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    gate, up = x.float().chunk(2, dim=-1)
    result = (torch.nn.functional.silu(gate) * up).to(x.dtype)
    return result if out is None else out.copy_(result)
