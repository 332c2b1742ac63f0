"""Rotary position embedding (neox / rotate-half layout), with Llama 3 and linear scaling."""

from __future__ import annotations

import math

import torch
from torch import nn


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, max_position: int, rope_params: dict):
        super().__init__()
        self.head_dim = head_dim
        inv_freq = compute_inv_freq(head_dim, rope_params)
        positions = torch.arange(max_position, dtype=torch.float32)
        freqs = torch.outer(positions, inv_freq)
        # [max_position, head_dim]: cos | sin halves, kept in float32 for accuracy.
        self.register_buffer("cos_sin_cache", torch.cat((freqs.cos(), freqs.sin()), dim=-1), persistent=False)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        """q: [tokens, heads, head_dim], k: [tokens, kv_heads, head_dim]; returns rotated (q, k), in
        torch (the CPU path; on CUDA the model rotates and stores KV in one kernel, rotate_and_store)."""
        cos, sin = self.cos_sin_cache[positions].unsqueeze(1).chunk(2, dim=-1)
        return _rotate(q, cos, sin), _rotate(k, cos, sin)

    def rotate_and_store(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         k_cache: torch.Tensor, v_cache: torch.Tensor, loc: torch.Tensor) -> None:
        """CUDA only: q [tokens, heads, head_dim] and k [tokens, kv_heads, head_dim] rotated in
        place (views into the projection output are fine), then k and v written to the cache's
        slots `loc`, in one kernel."""
        from sgl_kernel import rotary

        rotary.apply_rotary_and_store_kv_(positions, q, k, v, self.cos_sin_cache, k_cache, v_cache, loc)

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
    raise ValueError(f"rope type {rope_type!r} is not supported (supported: default, linear, llama3)")


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
