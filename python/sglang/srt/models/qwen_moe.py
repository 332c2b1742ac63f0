"""Qwen2MoeForCausalLM (routed experts plus a shared expert behind a sigmoid gate; q/k/v bias) and
Qwen3MoeForCausalLM (routed experts only; per-head q/k RMSNorm). Both make the layers listed in
`mlp_only_layers`, and those off every `decoder_sparse_step`-th, dense."""

from __future__ import annotations

from sglang.srt.models.llama import ArchOptions
from sglang.srt.models.moe_decoder import MoeForCausalLM, MoeSpec


class Qwen2MoeForCausalLM(MoeForCausalLM):
    def moe_spec(self, config) -> MoeSpec:
        return MoeSpec(
            num_experts=config.num_experts,
            top_k=config.num_experts_per_tok,
            intermediate_size=config.moe_intermediate_size,
            renormalize=bool(config.norm_topk_prob),
            shared_intermediate_size=getattr(config, "shared_expert_intermediate_size", 0) or 0,
        )

    def is_sparse_layer(self, config, layer_id: int) -> bool:
        step = getattr(config, "decoder_sparse_step", 1)
        if step < 1:
            raise ValueError(f"config.json sets decoder_sparse_step = {step}; it must be at least 1")
        mlp_only = getattr(config, "mlp_only_layers", None) or []
        return layer_id not in mlp_only and self.spec.num_experts > 0 and (layer_id + 1) % step == 0

    def _options(self, config) -> ArchOptions:
        return ArchOptions(qkv_bias=bool(getattr(config, "qkv_bias", True)), o_bias=False)


class Qwen3MoeForCausalLM(Qwen2MoeForCausalLM):
    not_computed = ("shared_expert_intermediate_size",)  # Qwen3-MoE has no shared expert

    def moe_spec(self, config) -> MoeSpec:
        return MoeSpec(
            num_experts=config.num_experts,
            top_k=config.num_experts_per_tok,
            intermediate_size=config.moe_intermediate_size,
            renormalize=bool(config.norm_topk_prob),
        )

    def _options(self, config) -> ArchOptions:
        bias = bool(getattr(config, "attention_bias", False))
        return ArchOptions(qkv_bias=bias, o_bias=bias, qk_norm=True)


EntryClass = [Qwen2MoeForCausalLM, Qwen3MoeForCausalLM]
