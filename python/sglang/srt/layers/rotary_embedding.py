"""Rotary position embedding (neox / rotate-half layout), with Llama 3, linear and YaRN scaling."""

from __future__ import annotations

import math

import torch
from torch import nn


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, max_position: int, rope_params: dict):
        super().__init__()
        self.head_dim = head_dim
        # A YaRN config without its pre-training length extends from the table's own length.
        rope_params = {"original_max_position_embeddings": max_position, **rope_params}
        inv_freq = compute_inv_freq(head_dim, rope_params)
        positions = torch.arange(max_position, dtype=torch.float32)
        freqs = torch.outer(positions, inv_freq)
        # YaRN's attention factor multiplies cos and sin, hence both rotated q and k.
        scale = attention_scaling(rope_params)
        # [max_position, head_dim]: cos | sin halves, kept in float32 for accuracy.
        self.register_buffer("cos_sin_cache", torch.cat((freqs.cos(), freqs.sin()), dim=-1) * scale, persistent=False)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        """q: [tokens, heads, head_dim], k: [tokens, kv_heads, head_dim]; returns rotated (q, k), in
        torch (the CPU path; on CUDA the model rotates and stores KV in one kernel, rotate_and_store)."""
        cos, sin = self.cos_sin_cache[positions].unsqueeze(1).chunk(2, dim=-1)
        return _rotate(q, cos, sin), _rotate(k, cos, sin)

    def rotate_and_store(
        self,
        positions: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        loc: torch.Tensor,
        k_scale: float = 1.0,
        v_scale: float = 1.0,
        q_norm: torch.Tensor | None = None,
        k_norm: torch.Tensor | None = None,
        norm_eps: float = 1e-6,
    ) -> None:
        """CUDA only: q [tokens, heads, head_dim] and k [tokens, kv_heads, head_dim] rotated in
        place (views into the projection output are fine), then k and v written to the cache's
        slots `loc`, in one kernel (an FP8 cache gets k / k_scale and v / v_scale, saturated).
        q_norm, k_norm: per-head RMSNorm weights [head_dim] (Qwen3's), applied first in the same kernel."""
        from sgl_kernel import rotary

        rotary.apply_rotary_and_store_kv_(
            positions, q, k, v, self.cos_sin_cache, k_cache, v_cache, loc, k_scale, v_scale, q_norm, k_norm, norm_eps
        )


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.float().chunk(2, dim=-1)
    out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return out.to(x.dtype)


def compute_inv_freq(head_dim: int, rope_params: dict) -> torch.Tensor:
    base = float(rope_params.get("rope_theta", 10000.0))
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    rope_type = rope_params.get("rope_type", "default")
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        return inv_freq / float(rope_params["factor"])
    if rope_type == "llama3":
        return _llama3_scale(inv_freq, rope_params)
    if rope_type == "yarn":
        return _yarn_scale(inv_freq, head_dim, base, rope_params)
    raise ValueError(f"rope type {rope_type!r} is not supported (supported: default, linear, llama3, yarn)")


def attention_scaling(rope_params: dict) -> float:
    """The factor YaRN multiplies cos and sin by (1 for the other types)."""
    if rope_params.get("rope_type", "default") != "yarn":
        return 1.0
    if rope_params.get("attention_factor") is not None:
        return float(rope_params["attention_factor"])
    factor = float(rope_params["factor"])
    mscale, mscale_all_dim = rope_params.get("mscale"), rope_params.get("mscale_all_dim")
    if mscale and mscale_all_dim:
        return _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
    return _yarn_mscale(factor)


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _yarn_scale(inv_freq: torch.Tensor, head_dim: int, base: float, p: dict) -> torch.Tensor:
    """YaRN (arXiv 2309.00071): dimensions that turn fewer than `beta_slow` times over the original
    context are interpolated (divided by `factor`), those turning more than `beta_fast` times are
    kept, and a linear ramp blends the dimensions between."""
    factor, old_len = float(p["factor"]), float(p["original_max_position_embeddings"])
    beta_fast, beta_slow = float(p.get("beta_fast") or 32), float(p.get("beta_slow") or 1)

    def dim_turning(turns: float) -> float:  # the (fractional) dimension index making `turns` rotations
        return head_dim * math.log(old_len / (turns * 2 * math.pi)) / (2 * math.log(base))

    low, high = dim_turning(beta_fast), dim_turning(beta_slow)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # a zero-width ramp would divide by zero
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    # ramp 0: fast dimension (kept); ramp 1: slow dimension (interpolated).
    return inv_freq * (1 - ramp) + (inv_freq / factor) * ramp


def _llama3_scale(inv_freq: torch.Tensor, p: dict) -> torch.Tensor:
    """Llama 3.1's frequency-dependent scaling: long wavelengths are divided by `factor`,
    short ones kept, and the band between them interpolated smoothly."""
    factor, low, high = float(p["factor"]), float(p["low_freq_factor"]), float(p["high_freq_factor"])
    old_len = float(p["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    smooth = (old_len / wavelen - low) / (high - low)
    interpolated = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    is_medium = (wavelen <= old_len / low) & (wavelen >= old_len / high)
    return torch.where(is_medium, interpolated, scaled)
