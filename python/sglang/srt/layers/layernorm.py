"""RMSNorm, optionally fused with the residual add that precedes it."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """Without `residual`: norm(x). With it: (norm(x + residual), x + residual).
        On CUDA one fused kernel does both, in place (x and residual are this layer's to reuse)."""
        if x.is_cuda:
            return self._forward_cuda(x, residual)
        if residual is not None:
            x = x + residual
            residual = x
        out = rms_norm(x, self.weight, self.variance_epsilon)
        return out if residual is None else (out, residual)

    def _forward_cuda(self, x: torch.Tensor, residual: torch.Tensor | None):
        from sgl_kernel import norm

        shape = x.shape
        x2d = x.reshape(-1, shape[-1])
        if residual is None:
            return norm.rmsnorm(x2d, self.weight, self.variance_epsilon).view(shape)
        residual2d = residual.reshape(-1, shape[-1])
        norm.fused_add_rmsnorm(x2d, residual2d, self.weight, self.variance_epsilon)
        return x2d.view(shape), residual2d.view(shape)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # Statistics in float32 whatever the activation dtype, as the reference models do.
    orig_dtype = x.dtype
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(orig_dtype)
