"""Activations of the gated MLP."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SiluAndMul(nn.Module):
    """Input [..., 2 * d] holding [gate ; up]; output silu(gate) * up, [..., d]."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda:
            from sgl_kernel import activation

            return activation.silu_and_mul(x)
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up
