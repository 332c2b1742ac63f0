"""Routing: which experts each token goes to, and with what weight.

Qwen2-MoE, Qwen3-MoE and Mixtral all route the same way: a softmax over the router's logits (in
float32), the top-k probabilities, renormalised to sum to one where the family does so
(`norm_topk_prob` for Qwen, always for Mixtral). The top k are taken as `torch.topk` takes them on
the probabilities, as transformers does, so that exact ties are broken the same way; on CUDA in
one kernel (`sgl_kernel.fused_moe.route`), whose ids are int32.
"""

from __future__ import annotations

import torch


def select_experts(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(topk_weights [tokens, top_k] float32, topk_ids [tokens, top_k] int64, int32 on CUDA) from the router's
    logits [tokens, num_experts]; the ids of one token are distinct, in descending weight."""
    num_experts = router_logits.shape[-1]
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k {top_k} must be between 1 and the number of experts ({num_experts})")
    if router_logits.is_cuda:
        from sgl_kernel.fused_moe import route  # triton is not a CPU dependency

        return route(router_logits, top_k, renormalize)
    probs = torch.softmax(router_logits.float(), dim=-1)
    topk_weights, topk_ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        topk_weights = topk_weights / topk_weights.sum(dim=-1, keepdim=True)
    return topk_weights, topk_ids
