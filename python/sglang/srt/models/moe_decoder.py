"""What the mixture-of-experts decoders (Qwen2-MoE, Qwen3-MoE, Mixtral) share: Llama's attention
and norms around a feed-forward block chosen per layer (a SparseMoeBlock, or a dense LlamaMLP in
Qwen's `mlp_only_layers`), the checkpoint names of stacked experts and shared experts, and the
refusal of config settings these families do not compute."""

from __future__ import annotations

import dataclasses
from typing import Iterable

import torch
from torch import nn

from sglang.srt.distributed.parallel_state import tensor_model_parallel_all_reduce, tensor_parallel
from sglang.srt.layers.activation import SiluAndMul
from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.linear import Linear, TpSource
from sglang.srt.layers.moe.layer import FusedMoE
from sglang.srt.layers.moe.router import select_experts
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.models.llama import LlamaAttention, LlamaForCausalLM, LlamaMLP
from sglang.srt.models.weight_loading import (
    ExpertShard,
    FusedShard,
    expert_shards,
    llama_fused_shards,
    load_named_weights,
)

# Settings other MoE families use (DeepSeek's grouped or sigmoid routing, scaled or shared experts
# counted per layer, leading dense layers) with the value at which they change nothing. In a config
# of these families any other value asks for a computation this engine (and transformers' model
# of the family) would silently skip, so it is refused.
FOREIGN_MOE_SETTINGS = {
    "scoring_func": ("softmax",),
    "topk_method": ("greedy",),
    "n_group": (1,),
    "topk_group": (1,),
    "routed_scaling_factor": (1, 1.0),
    "n_shared_experts": (0,),
    "num_shared_experts": (0,),
    "first_k_dense_replace": (0,),
    "moe_layer_freq": (1,),
}


@dataclasses.dataclass(frozen=True)
class MoeSpec:
    """A family's MoE settings, read from its config."""

    num_experts: int
    top_k: int
    intermediate_size: int  # each routed expert's
    renormalize: bool  # the top-k weights divided by their sum
    shared_intermediate_size: int = 0  # Qwen2-MoE's shared expert (0: none)


def check_moe_supported(config, spec: MoeSpec, architecture: str, not_computed: Iterable[str] = ()) -> None:
    """Refuse, naming the setting, what these models would compute wrong without a word."""
    for key in (*FOREIGN_MOE_SETTINGS, *not_computed):
        value = getattr(config, key, None)
        if value is not None and value not in FOREIGN_MOE_SETTINGS.get(key, (0, False)):
            raise ValueError(f"config.json sets {key} = {value!r}, which {architecture} is not served with")
    if not 1 <= spec.top_k <= spec.num_experts:
        raise ValueError(
            f"config.json routes each token to {spec.top_k} experts of {spec.num_experts} "
            "(num_experts_per_tok must be between 1 and the number of experts)"
        )
    tp_size = tensor_parallel().size
    for name, size in (("routed", spec.intermediate_size), ("shared", spec.shared_intermediate_size)):
        if size % tp_size:
            raise ValueError(f"--tp-size {tp_size} does not divide the {name} experts' intermediate size {size}")


class Router(Linear):
    """A router's projection (or the shared expert's gate): held whole by every rank, and kept in
    the model's dtype whatever the checkpoint quantizes (the published FP8 checkpoints keep them so)."""

    quantizable = False


class SharedExpert(nn.Module):
    """Qwen2-MoE's shared expert: LlamaMLP's SwiGLU (the same checkpoint names and split), whose
    down projection returns this rank's partial sum: the block adds the routed experts' partial
    sum to it before its one all-reduce."""

    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        tp = tensor_parallel()
        self.intermediate_size = intermediate_size // tp.size  # this rank's rows
        self.gate_up_proj = Linear(hidden_size, 2 * self.intermediate_size, bias=False)
        self.down_proj = Linear(self.intermediate_size, hidden_size, bias=False)
        if tp.size > 1:
            rows = self.intermediate_size
            self.down_proj.weight.tp_source = TpSource(1, tp.rank * rows, rows, intermediate_size)
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class SparseMoeBlock(nn.Module):
    """A layer's experts: the router (`gate`), the routed experts (FusedMoE, `experts`) and, where
    the family has one, a shared expert every token goes through, scaled by a sigmoid gate. Under
    tensor parallelism the routed and shared experts' partial sums are added before the one
    all-reduce."""

    def __init__(self, hidden_size: int, spec: MoeSpec):
        super().__init__()
        self.top_k, self.renormalize = spec.top_k, spec.renormalize
        shared = bool(spec.shared_intermediate_size)
        self.gate = Router(hidden_size, spec.num_experts, bias=False)
        self.experts = FusedMoE(spec.num_experts, hidden_size, spec.intermediate_size, reduce_results=not shared)
        self.shared_expert = None
        if shared:
            self.shared_expert = SharedExpert(hidden_size, spec.shared_intermediate_size)
            self.shared_expert_gate = Router(hidden_size, 1, bias=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        topk_weights, topk_ids = select_experts(self.gate(hidden), self.top_k, self.renormalize)
        out = self.experts(hidden, topk_weights, topk_ids)
        if self.shared_expert is None:
            return out
        out = out + torch.sigmoid(self.shared_expert_gate(hidden)) * self.shared_expert(hidden)
        return tensor_model_parallel_all_reduce(out) if tensor_parallel().size > 1 else out


class MoeDecoderLayer(nn.Module):
    """Llama's decoder layer around `feed_forward`, registered under the name the family's
    checkpoints give it (`mlp` for Qwen, `block_sparse_moe` for Mixtral)."""

    def __init__(self, config, layer_id: int, opts, rotary_emb, feed_forward: nn.Module, feed_forward_name: str):
        super().__init__()
        self.self_attn = LlamaAttention(config, layer_id, opts, rotary_emb)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.feed_forward_name = feed_forward_name
        self.add_module(feed_forward_name, feed_forward)

    @property
    def feed_forward(self) -> nn.Module:
        return getattr(self, self.feed_forward_name)

    def forward(self, positions, hidden, forward_batch: ForwardBatch, residual):
        """Returns (this layer's output, the residual stream before it), as LlamaDecoderLayer."""
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden, forward_batch)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.feed_forward(hidden), residual


class MoeForCausalLM(LlamaForCausalLM):
    """A Llama-style decoder whose layers' feed-forward blocks are MoE (or dense where the family
    says). Subclasses give the family's `moe_spec`, `is_sparse_layer` and checkpoint names."""

    feed_forward_name = "mlp"
    expert_projections = ("gate_proj", "up_proj", "down_proj")  # the checkpoint's gate, up, down
    not_computed: tuple[str, ...] = ()  # family-specific settings refused when set

    def __init__(self, config, context_len: int | None = None):
        self.spec = self.moe_spec(config)
        check_moe_supported(config, self.spec, type(self).__name__, self.not_computed)
        super().__init__(config, context_len)

    def moe_spec(self, config) -> MoeSpec:
        raise NotImplementedError

    def is_sparse_layer(self, config, layer_id: int) -> bool:
        return True

    def _decoder_layer(self, config, layer_id: int, opts, rotary_emb) -> MoeDecoderLayer:
        if self.is_sparse_layer(config, layer_id):
            feed_forward = SparseMoeBlock(config.hidden_size, self.spec)
        else:
            feed_forward = LlamaMLP(config.hidden_size, config.intermediate_size)
        return MoeDecoderLayer(config, layer_id, opts, rotary_emb, feed_forward, self.feed_forward_name)

    def _feed_forwards(self) -> list[nn.Module]:
        return [layer.feed_forward for layer in self.model.layers]

    def fused_shards(self) -> dict[str, FusedShard]:
        blocks = self._feed_forwards()
        dense = next((block for block in blocks if isinstance(block, LlamaMLP)), None)
        shards = llama_fused_shards(self.model.layers[0].self_attn, dense)
        shared = next((b.shared_expert for b in blocks if getattr(b, "shared_expert", None) is not None), None)
        if shared is not None:
            for proj, shard in llama_fused_shards(self.model.layers[0].self_attn, shared).items():
                if proj in ("gate_proj", "up_proj"):
                    shards[f"shared_expert.{proj}"] = dataclasses.replace(
                        shard, fused_name="shared_expert.gate_up_proj"
                    )
        return shards

    def expert_shards(self) -> dict[str, ExpertShard]:
        sparse = next((block for block in self._feed_forwards() if isinstance(block, SparseMoeBlock)), None)
        if sparse is None:
            return {}
        return expert_shards(sparse.experts, self.config.hidden_size, *self.expert_projections)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        skip = {"lm_head.weight"} if self.tie_word_embeddings else set()
        load_named_weights(self, weights, self.fused_shards(), skip=skip, experts=self.expert_shards())
