"""Rotary position embedding, neox (rotate-half) layout, applied in place to q and k.

The cos/sin table is precomputed per position (Llama 3 or linear scaling already folded
in), so the kernel only gathers a row per token and rotates.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sgl_kernel._interpreter import fix_interpreter

fix_interpreter()


@triton.jit
def _rotate_heads(x, t, stride_t, stride_h, num_heads, cos, sin, HEADS_POW2: tl.constexpr, HALF: tl.constexpr):
    """Rotates all heads of token t of x in place: [x1, x2] -> [x1 cos - x2 sin, x2 cos + x1 sin]."""
    heads = tl.arange(0, HEADS_POW2)
    halves = tl.arange(0, HALF)
    first = x + t * stride_t + heads[:, None] * stride_h + halves[None, :]
    head_ok = (heads < num_heads)[:, None]
    x1 = tl.load(first, mask=head_ok, other=0.0).to(tl.float32)
    x2 = tl.load(first + HALF, mask=head_ok, other=0.0).to(tl.float32)
    tl.store(first, (x1 * cos - x2 * sin).to(x.dtype.element_ty), mask=head_ok)
    tl.store(first + HALF, (x2 * cos + x1 * sin).to(x.dtype.element_ty), mask=head_ok)


@triton.jit
def _rotary_kernel(
    positions, q, k, cos_sin_cache, num_q_heads, num_k_heads,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_cache,
    Q_HEADS_POW2: tl.constexpr, K_HEADS_POW2: tl.constexpr, HALF: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions + t).to(tl.int64)
    halves = tl.arange(0, HALF)
    cos = tl.load(cos_sin_cache + pos * stride_cache + halves)[None, :]
    sin = tl.load(cos_sin_cache + pos * stride_cache + HALF + halves)[None, :]
    _rotate_heads(q, t, stride_qt, stride_qh, num_q_heads, cos, sin, Q_HEADS_POW2, HALF)
    _rotate_heads(k, t, stride_kt, stride_kh, num_k_heads, cos, sin, K_HEADS_POW2, HALF)


def apply_rotary_embedding_(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor) -> None:
    """positions [T]; q [T, H, D] and k [T, KV, D] rotated in place; cos_sin_cache [max_pos, D] float32."""
    _check(positions, q, k, cos_sin_cache)
    tokens, head_dim = q.shape[0], q.shape[2]
    if tokens:
        _rotary_kernel[(tokens,)](
            positions, q, k, cos_sin_cache, q.shape[1], k.shape[1],
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos_sin_cache.stride(0),
            Q_HEADS_POW2=triton.next_power_of_2(q.shape[1]), K_HEADS_POW2=triton.next_power_of_2(k.shape[1]),
            HALF=head_dim // 2, num_warps=4,
        )


def _check(positions, q, k, cos_sin_cache) -> None:
    head_dim = q.shape[-1]
    if q.dim() != 3 or k.dim() != 3 or k.shape[0] != q.shape[0] or k.shape[2] != head_dim:
        raise ValueError(f"q [T, H, D] and k [T, KV, D] expected, got {tuple(q.shape)} and {tuple(k.shape)}")
    if head_dim < 2 or (head_dim // 2) & (head_dim // 2 - 1):
        raise ValueError(f"head_dim must be twice a power of two, got {head_dim}")
    if cos_sin_cache.shape[-1] != head_dim or cos_sin_cache.stride(-1) != 1 or positions.shape != (q.shape[0],):
        raise ValueError(f"cos_sin_cache {tuple(cos_sin_cache.shape)} / positions {tuple(positions.shape)} do not fit q")
    if q.stride(-1) != 1 or k.stride(-1) != 1:
        raise ValueError("q and k need a contiguous last dimension")


def apply_rotary_embedding_ref(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor) -> None:
    cos, sin = cos_sin_cache[positions].float().unsqueeze(1).chunk(2, dim=-1)
    for x in (q, k):
        x1, x2 = x.float().chunk(2, dim=-1)
        x.copy_(torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1))
