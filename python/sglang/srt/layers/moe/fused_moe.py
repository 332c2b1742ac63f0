"""The routed experts' computation: for each (token, slot) pair the router chose, the expert's
SwiGLU MLP on the token, weighted by the router's weight and summed over the token's slots.

`fused_experts_reference` is the torch reference (and the CPU path): the pairs are sorted by
expert (`align_tokens_to_experts`), each expert that received tokens runs one gate/up GEMM, SiLU
times up, and one down GEMM over its tokens, and the top-k weighted sum is taken at the end.
Experts with no tokens are not read.
"""

from __future__ import annotations

import dataclasses

import torch


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
) -> torch.Tensor:
    """hidden [T, H]; w13 [E, 2 * I, H] (gate rows, then up rows); w2 [E, H, I]; topk_weights and
    topk_ids [T, k]. Returns [T, H] in hidden's dtype: sum over slots of weight * expert(token)."""
    num_tokens, top_k = topk_ids.shape
    intermediate = w2.shape[-1]
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
        gate_up = torch.nn.functional.linear(x, w13[expert])
        act = torch.nn.functional.silu(gate_up[:, :intermediate]) * gate_up[:, intermediate:]
        per_pair[pairs] = torch.nn.functional.linear(act, w2[expert])
    weighted = per_pair.view(num_tokens, top_k, hidden.shape[-1]) * topk_weights.unsqueeze(-1).to(per_pair.dtype)
    return weighted.sum(dim=1)
