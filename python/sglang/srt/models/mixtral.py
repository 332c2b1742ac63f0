"""MixtralForCausalLM: Mistral's attention (its `sliding_window`, when set, on every layer) with
every layer's feed-forward a `block_sparse_moe` of `num_local_experts` experts (w1 gate, w3 up,
w2 down), the top-k weights always renormalised."""

from __future__ import annotations

from sglang.srt.models.llama import ArchOptions
from sglang.srt.models.moe_decoder import MoeForCausalLM, MoeSpec


class MixtralForCausalLM(MoeForCausalLM):
    feed_forward_name = "block_sparse_moe"
    expert_projections = ("w1", "w3", "w2")
    not_computed = ("shared_expert_intermediate_size",)  # Mixtral has no shared expert

    def moe_spec(self, config) -> MoeSpec:
        # Mixtral always renormalises: a config asking otherwise is another model.
        norm = getattr(config, "norm_topk_prob", None)
        if norm is not None and not norm:
            raise ValueError("config.json sets norm_topk_prob = False, which MixtralForCausalLM is not served with")
        num_experts = getattr(config, "num_local_experts", None) or config.num_experts
        return MoeSpec(num_experts, config.num_experts_per_tok, config.intermediate_size, renormalize=True)

    def _options(self, config) -> ArchOptions:
        return ArchOptions(window_on_every_layer=True)


EntryClass = [MixtralForCausalLM]
