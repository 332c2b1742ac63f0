"""The routed experts' computation: for each (token, slot) pair the router chose, the expert's
SwiGLU MLP on the token, weighted by the router's weight and summed over the token's slots.

`fused_experts_reference` is the torch reference (and the CPU path): the pairs are sorted by
expert (`align_tokens_to_experts`), each expert that received tokens runs one gate/up GEMM, SiLU
times up, and one down GEMM over its tokens, and the top-k weighted sum is taken at the end.
Experts with no tokens are not read.

Block-wise FP8 experts (e4m3 weights with a float32 scale per 128 x 128 block, `w13_scale` and
`w2_scale`) go as the dense block-wise FP8 layers do (fp8_reference): each expert's weights
dequantized, the input of each GEMM quantized per token and 128 features and back, products in
float32; the SwiGLU output is rounded to hidden's dtype in between, as the fused kernel stores it.
"""

from __future__ import annotations

import dataclasses

import torch
from sgl_kernel.fp8_reference import GROUP, dequantize_block_weight, fake_quantize_activation


@dataclasses.dataclass(frozen=True)
class ExpertAlignment:
    """The (token, slot) pairs of a batch sorted by expert."""

    sorted_pairs: torch.Tensor  # [tokens * top_k] int64: flat pair index (token * top_k + slot), by expert
    tokens_per_expert: torch.Tensor  # [num_experts] int64


def align_tokens_to_experts(topk_ids: torch.Tensor, num_experts: int) -> ExpertAlignment:
    flat = topk_ids.reshape(-1)
    # Stable: within an expert, pairs keep token order (the computation does not depend on it).
    sorted_pairs = torch.argsort(flat, stable=True)
    return ExpertAlignment(sorted_pairs, torch.bincount(flat, minlength=num_experts))


def fused_experts_reference(
    hidden: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    w13_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """hidden [T, H]; w13 [E, 2 * I, H] (gate rows, then up rows); w2 [E, H, I]; topk_weights and
    topk_ids [T, k]. Returns [T, H] in hidden's dtype: sum over slots of weight * expert(token).
    FP8: w13_scale [E, 2 * ceil(I/128), ceil(H/128)] (the gate's block rows, then the up's) and
    w2_scale [E, ceil(H/128), ceil(I/128)]."""
    num_tokens, top_k = topk_ids.shape
    alignment = align_tokens_to_experts(topk_ids, w13.shape[0])
    per_pair = hidden.new_empty(num_tokens * top_k, hidden.shape[-1])
    start = 0
    # One host read of the counts: the loop visits only the experts that received tokens.
    for expert, count in enumerate(alignment.tokens_per_expert.tolist()):
        if count == 0:
            continue
        pairs = alignment.sorted_pairs[start : start + count]
        start += count
        x = hidden[pairs // top_k]
        if w13_scale is None:
            per_pair[pairs] = _expert(x, w13[expert], w2[expert])
        else:
            per_pair[pairs] = _fp8_expert(x, w13[expert], w2[expert], w13_scale[expert], w2_scale[expert])
    weighted = per_pair.view(num_tokens, top_k, hidden.shape[-1]) * topk_weights.unsqueeze(-1).to(per_pair.dtype)
    return weighted.sum(dim=1)


def _expert(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    gate, up = torch.nn.functional.linear(x, w13).chunk(2, dim=-1)
    return torch.nn.functional.linear(torch.nn.functional.silu(gate) * up, w2)


def _fp8_expert(x, w13, w2, w13_scale, w2_scale) -> torch.Tensor:
    """One expert's SwiGLU over its tokens x [n, H] in x's dtype, its weights e4m3 with block scales."""
    inter = w2.shape[-1]
    gate_blocks = -(-inter // GROUP)  # the up projection's scales start on a block row of their own
    xq = fake_quantize_activation(x.float(), "group")
    gate = xq @ dequantize_block_weight(w13[:inter], w13_scale[:gate_blocks]).T
    up = xq @ dequantize_block_weight(w13[inter:], w13_scale[gate_blocks:]).T
    act = (torch.nn.functional.silu(gate) * up).to(x.dtype)
    out = fake_quantize_activation(act.float(), "group") @ dequantize_block_weight(w2, w2_scale).T
    return out.to(x.dtype)
