"""The models' linear layers: x @ weight.T (+ bias).

A CUDA decode step at small batch multiplies a few rows by every weight, and its time is the time
to stream the weights from memory. Where `sgl_kernel.skinny_gemm` reads them faster than cuBLAS's
split-K kernels (one row, or the logits of up to 16; `faster_than_cublas`) the product goes
through it (bf16 / fp16); everything else (prefill, larger batches, fp32, the CPU) through torch.
SGLANG_DISABLE_SKINNY_GEMM=1 sends every product through torch (for comparisons).
"""

from __future__ import annotations

import os

import torch
from torch import nn

SKINNY_GEMM_ENV = "SGLANG_DISABLE_SKINNY_GEMM"
skinny_gemm_enabled = os.environ.get(SKINNY_GEMM_ENV, "0").lower() not in ("1", "true", "yes", "on")


_kernel_module = None


def _skinny():
    """sgl_kernel.skinny_gemm, imported on first use (triton is not a CPU dependency)."""
    global _kernel_module
    if _kernel_module is None:
        from sgl_kernel import skinny_gemm as module

        _kernel_module = module
    return _kernel_module


def uses_skinny_gemm(x: torch.Tensor, weight: torch.Tensor) -> bool:
    if not (skinny_gemm_enabled and x.is_cuda and x.dtype in (torch.bfloat16, torch.float16)
            and weight.dtype == x.dtype and weight.dim() == 2 and weight.stride(-1) == 1 and x.shape[-1] > 0):
        return False
    return _skinny().faster_than_cublas(x.numel() // x.shape[-1], *weight.shape)  # rows <= MAX_ROWS included


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    if uses_skinny_gemm(x, weight):
        return _skinny().skinny_gemm(x, weight, bias)
    return torch.nn.functional.linear(x, weight, bias)


class Linear(nn.Linear):
    """nn.Linear (same parameters and checkpoint names) whose product goes through `linear`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)
