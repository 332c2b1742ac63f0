"""FusedMoE: a layer's routed experts, their weights stacked into two parameters,
`w13_weight` [E, 2 * I, H] (each expert's gate rows, then its up rows) and `w2_weight` [E, H, I].

Under tensor parallelism every rank holds every expert, split along the intermediate dimension:
its I / tp rows of gate and up, the matching columns of down; the ranks' partial outputs are
summed (one all-reduce), as in a row-parallel linear layer.

A block-wise FP8 checkpoint's experts (`quantize`, layers/quantization/fp8.Fp8MoEMethod) are held
in e4m3 with `w13_weight_scale_inv` [E, 2 * ceil(I/128), ceil(H/128)] and `w2_weight_scale_inv`
[E, ceil(H/128), ceil(I/128)] beside them.

On CUDA the experts run as `sgl_kernel.fused_experts` (grouped GEMMs over the experts with tokens,
no host synchronisation, so CUDA graphs capture them); on the CPU as the torch reference.
"""

from __future__ import annotations

import torch
from torch import nn

from sglang.srt.distributed.parallel_state import tensor_model_parallel_all_reduce, tensor_parallel
from sglang.srt.layers.moe.fused_moe import fused_experts_reference


def uses_fused_kernel(hidden: torch.Tensor) -> bool:
    """Whether the experts run as the Triton kernel (on CUDA) rather than the torch reference; a
    CPU test flips it to run the kernel under the Triton interpreter."""
    return hidden.is_cuda


class FusedMoE(nn.Module):
    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, reduce_results: bool = True):
        """`reduce_results=False`: return this rank's partial sum (the caller all-reduces it)."""
        super().__init__()
        tp = tensor_parallel()
        if intermediate_size % tp.size:
            raise ValueError(f"--tp-size {tp.size} does not divide the experts' intermediate size {intermediate_size}")
        self.num_experts = num_experts
        self.intermediate_size = intermediate_size // tp.size  # this rank's rows of each expert
        self.tp_size = tp.size
        self.reduce_results = reduce_results
        self.w13_weight = nn.Parameter(torch.empty(num_experts, 2 * self.intermediate_size, hidden_size))
        self.w2_weight = nn.Parameter(torch.empty(num_experts, hidden_size, self.intermediate_size))
        self.quant_method = None  # set by `quantize`

    def quantize(self, method) -> None:
        """Hold the experts as `method` stores them (it replaces the weights and adds their scales)."""
        method.create_weights(self)
        self.quant_method = method

    def block_scales(self) -> dict[str, torch.Tensor]:
        """The FP8 experts' scales as fused_experts takes them (none for unquantized experts)."""
        if self.quant_method is None:
            return {}
        return dict(w13_scale=self.w13_weight_scale_inv, w2_scale=self.w2_weight_scale_inv)

    def forward(self, hidden: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        if uses_fused_kernel(hidden):
            from sgl_kernel import fused_experts  # triton is not a CPU dependency
        else:
            fused_experts = fused_experts_reference
        out = fused_experts(hidden, self.w13_weight, self.w2_weight, topk_weights, topk_ids, **self.block_scales())
        return tensor_model_parallel_all_reduce(out) if self.tp_size > 1 and self.reduce_results else out
