"""Rotary position embedding, neox (rotate-half) layout, applied in place to q and k.

The cos/sin table is precomputed per position (Llama 3 or linear scaling already folded
in), so the kernel only gathers a row per token and rotates. A second kernel also writes the
rotated k and v into the paged KV cache at the tokens' slots: one launch per layer instead of
three (rotate, store K, store V), which matters where a decode step is latency bound. Into an
FP8 cache it stores k / k_scale and v / v_scale, saturated to the format's finite range. Given
per-head RMSNorm weights (Qwen3's q_norm and k_norm), it normalizes each head of q and k first,
rounded as the separate norm kernel rounds, so a Qwen3 layer's two norms (each a copy of the
strided head view and a norm launch) fold into the same launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sgl_kernel._interpreter import fix_interpreter

fix_interpreter()


@triton.jit
def _rotate_heads(
    x,
    t,
    stride_t,
    stride_h,
    num_heads,
    cos,
    sin,
    norm_weight,
    eps,
    HEADS_POW2: tl.constexpr,
    HALF: tl.constexpr,
    HAS_NORM: tl.constexpr,
):
    """Rotates all heads of token t of x in place: [x1, x2] -> [x1 cos - x2 sin, x2 cos + x1 sin],
    each head first RMS-normalized and scaled by norm_weight [2 * HALF] where HAS_NORM. Returns the
    two rotated halves, [HEADS_POW2, HALF] in x's dtype (masked heads are zeros)."""
    heads = tl.arange(0, HEADS_POW2)
    halves = tl.arange(0, HALF)
    first = x + t * stride_t + heads[:, None] * stride_h + halves[None, :]
    head_ok = (heads < num_heads)[:, None]
    x1 = tl.load(first, mask=head_ok, other=0.0).to(tl.float32)
    x2 = tl.load(first + HALF, mask=head_ok, other=0.0).to(tl.float32)
    if HAS_NORM:  # as norm.rmsnorm: the normalized value, then its product with the weight, in x's dtype
        dtype = x.dtype.element_ty
        inv_rms = tl.rsqrt((tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / (2 * HALF) + eps)[:, None]
        w1 = tl.load(norm_weight + halves).to(tl.float32)[None, :]
        w2 = tl.load(norm_weight + HALF + halves).to(tl.float32)[None, :]
        x1 = (w1 * (x1 * inv_rms).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
        x2 = (w2 * (x2 * inv_rms).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
    r1 = (x1 * cos - x2 * sin).to(x.dtype.element_ty)
    r2 = (x2 * cos + x1 * sin).to(x.dtype.element_ty)
    tl.store(first, r1, mask=head_ok)
    tl.store(first + HALF, r2, mask=head_ok)
    return r1, r2


@triton.jit
def _rotary_kernel(
    positions,
    q,
    k,
    cos_sin_cache,
    num_q_heads,
    num_k_heads,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_cache,
    Q_HEADS_POW2: tl.constexpr,
    K_HEADS_POW2: tl.constexpr,
    HALF: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions + t).to(tl.int64)
    halves = tl.arange(0, HALF)
    cos = tl.load(cos_sin_cache + pos * stride_cache + halves)[None, :]
    sin = tl.load(cos_sin_cache + pos * stride_cache + HALF + halves)[None, :]
    _rotate_heads(q, t, stride_qt, stride_qh, num_q_heads, cos, sin, q, 0.0, Q_HEADS_POW2, HALF, False)
    _rotate_heads(k, t, stride_kt, stride_kh, num_k_heads, cos, sin, k, 0.0, K_HEADS_POW2, HALF, False)


@triton.jit
def _rotary_store_kernel(
    positions,
    q,
    k,
    v,
    cos_sin_cache,
    k_cache,
    v_cache,
    loc,
    num_q_heads,
    num_k_heads,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cache,
    stride_kct,
    stride_kch,
    stride_vct,
    stride_vch,
    stride_pos,
    stride_loc,
    k_inv_scale,
    v_inv_scale,
    q_norm,
    k_norm,
    norm_eps,
    Q_HEADS_POW2: tl.constexpr,
    K_HEADS_POW2: tl.constexpr,
    HALF: tl.constexpr,
    FP8_MAX: tl.constexpr,  # the cache's largest finite value if it is FP8, else 0
    HAS_NORM: tl.constexpr,  # q_norm and k_norm [head_dim] normalize each head first
):
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions + t * stride_pos).to(tl.int64)
    slot = tl.load(loc + t * stride_loc).to(tl.int64)
    halves = tl.arange(0, HALF)
    cos = tl.load(cos_sin_cache + pos * stride_cache + halves)[None, :]
    sin = tl.load(cos_sin_cache + pos * stride_cache + HALF + halves)[None, :]
    _rotate_heads(q, t, stride_qt, stride_qh, num_q_heads, cos, sin, q_norm, norm_eps, Q_HEADS_POW2, HALF, HAS_NORM)
    # k: rotated in place and into its cache slot; v: copied into its slot.
    r1, r2 = _rotate_heads(
        k, t, stride_kt, stride_kh, num_k_heads, cos, sin, k_norm, norm_eps, K_HEADS_POW2, HALF, HAS_NORM
    )
    heads = tl.arange(0, K_HEADS_POW2)
    head_ok = (heads < num_k_heads)[:, None]
    cached = k_cache + slot * stride_kct + heads[:, None] * stride_kch + halves[None, :]
    tl.store(cached, _to_cache(r1, k_inv_scale, k_cache, FP8_MAX), mask=head_ok)
    tl.store(cached + HALF, _to_cache(r2, k_inv_scale, k_cache, FP8_MAX), mask=head_ok)
    dims = tl.arange(0, 2 * HALF)
    values = tl.load(v + t * stride_vt + heads[:, None] * stride_vh + dims[None, :], mask=head_ok, other=0.0)
    tl.store(
        v_cache + slot * stride_vct + heads[:, None] * stride_vch + dims[None, :],
        _to_cache(values, v_inv_scale, v_cache, FP8_MAX),
        mask=head_ok,
    )


@triton.jit
def _to_cache(x, inv_scale, cache, FP8_MAX: tl.constexpr):
    """x in the cache's dtype: a plain cast, or for FP8 x * inv_scale saturated then rounded."""
    if FP8_MAX > 0:
        x = tl.clamp(x.to(tl.float32) * inv_scale, -FP8_MAX, FP8_MAX)
    return x.to(cache.dtype.element_ty)


def apply_rotary_and_store_kv_(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    loc: torch.Tensor,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    q_norm: torch.Tensor | None = None,
    k_norm: torch.Tensor | None = None,
    norm_eps: float = 1e-6,
) -> None:
    """As apply_rotary_embedding_, and then k_cache[loc] = k (rotated) and v_cache[loc] = v:
    v [T, KV, D]; k_cache, v_cache [slots, KV, D] (cast to their dtype; an FP8 cache stores
    k / k_scale and v / v_scale, saturated); loc [T] slot indices. With q_norm and k_norm (each
    [D]), every head of q and k is first RMS-normalized (eps norm_eps) and scaled by them."""
    _check(positions, q, k, cos_sin_cache)
    _check_norms(q, q_norm, k_norm)
    if v.shape != k.shape or v.stride(-1) != 1:
        raise ValueError(f"v {tuple(v.shape)} must match k {tuple(k.shape)} with a contiguous last dimension")
    if k_cache.dim() != 3 or k_cache.shape[1:] != k.shape[1:] or v_cache.shape != k_cache.shape:
        raise ValueError(f"KV cache {tuple(k_cache.shape)} / {tuple(v_cache.shape)} does not hold k {tuple(k.shape)}")
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("the KV cache needs a contiguous last dimension")
    if loc.shape != (q.shape[0],):
        raise ValueError(f"loc {tuple(loc.shape)} must hold one slot per token ({q.shape[0]})")
    tokens, head_dim = q.shape[0], q.shape[2]
    if tokens:
        _rotary_store_kernel[(tokens,)](
            positions,
            q,
            k,
            v,
            cos_sin_cache,
            k_cache,
            v_cache,
            loc,
            q.shape[1],
            k.shape[1],
            q.stride(0),
            q.stride(1),
            k.stride(0),
            k.stride(1),
            v.stride(0),
            v.stride(1),
            cos_sin_cache.stride(0),
            k_cache.stride(0),
            k_cache.stride(1),
            v_cache.stride(0),
            v_cache.stride(1),
            positions.stride(0),
            loc.stride(0),
            1.0 / k_scale,
            1.0 / v_scale,
            q if q_norm is None else q_norm,
            k if k_norm is None else k_norm,
            norm_eps,
            Q_HEADS_POW2=triton.next_power_of_2(q.shape[1]),
            K_HEADS_POW2=triton.next_power_of_2(k.shape[1]),
            HALF=head_dim // 2,
            FP8_MAX=_fp8_max(k_cache.dtype),
            HAS_NORM=q_norm is not None,
            num_warps=4,
        )


def _check_norms(q: torch.Tensor, q_norm: torch.Tensor | None, k_norm: torch.Tensor | None) -> None:
    if (q_norm is None) != (k_norm is None):
        raise ValueError("q_norm and k_norm come together (per-head norms of both q and k) or not at all")
    for name, weight in (("q_norm", q_norm), ("k_norm", k_norm)):
        if weight is not None and (weight.shape != (q.shape[-1],) or not weight.is_contiguous()):
            raise ValueError(f"{name} must be a contiguous [head_dim] = [{q.shape[-1]}], got {tuple(weight.shape)}")


def _fp8_max(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).max if dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else 0.0


def apply_rotary_and_store_kv_ref(
    positions,
    q,
    k,
    v,
    cos_sin_cache,
    k_cache,
    v_cache,
    loc,
    k_scale=1.0,
    v_scale=1.0,
    q_norm=None,
    k_norm=None,
    norm_eps=1e-6,
) -> None:
    _check_norms(q, q_norm, k_norm)
    if q_norm is not None:
        from sgl_kernel.norm import rmsnorm_ref

        for x, weight in ((q, q_norm), (k, k_norm)):
            x.copy_(rmsnorm_ref(x.reshape(-1, x.shape[-1]), weight, norm_eps).view(x.shape))
    apply_rotary_embedding_ref(positions, q, k, cos_sin_cache)
    for x, cache, scale in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        limit = _fp8_max(cache.dtype)
        cache[loc] = (x.float() * (1.0 / scale)).clamp(-limit, limit).to(cache.dtype) if limit else x.to(cache.dtype)


def apply_rotary_embedding_(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor
) -> None:
    """positions [T]; q [T, H, D] and k [T, KV, D] rotated in place; cos_sin_cache [max_pos, D] float32."""
    _check(positions, q, k, cos_sin_cache)
    tokens, head_dim = q.shape[0], q.shape[2]
    if tokens:
        _rotary_kernel[(tokens,)](
            positions,
            q,
            k,
            cos_sin_cache,
            q.shape[1],
            k.shape[1],
            q.stride(0),
            q.stride(1),
            k.stride(0),
            k.stride(1),
            cos_sin_cache.stride(0),
            Q_HEADS_POW2=triton.next_power_of_2(q.shape[1]),
            K_HEADS_POW2=triton.next_power_of_2(k.shape[1]),
            HALF=head_dim // 2,
            num_warps=4,
        )


def _check(positions, q, k, cos_sin_cache) -> None:
    head_dim = q.shape[-1]
    if q.dim() != 3 or k.dim() != 3 or k.shape[0] != q.shape[0] or k.shape[2] != head_dim:
        raise ValueError(f"q [T, H, D] and k [T, KV, D] expected, got {tuple(q.shape)} and {tuple(k.shape)}")
    if head_dim < 2 or (head_dim // 2) & (head_dim // 2 - 1):
        raise ValueError(f"head_dim must be twice a power of two, got {head_dim}")
    if cos_sin_cache.shape[-1] != head_dim or cos_sin_cache.stride(-1) != 1 or positions.shape != (q.shape[0],):
        raise ValueError(
            f"cos_sin_cache {tuple(cos_sin_cache.shape)} / positions {tuple(positions.shape)} do not fit q"
        )
    if q.stride(-1) != 1 or k.stride(-1) != 1:
        raise ValueError("q and k need a contiguous last dimension")


def apply_rotary_embedding_ref(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor
) -> None:
    cos, sin = cos_sin_cache[positions].float().unsqueeze(1).chunk(2, dim=-1)
    for x in (q, k):
        x1, x2 = x.float().chunk(2, dim=-1)
        x.copy_(torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1))
