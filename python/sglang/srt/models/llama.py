"""Dense Llama-family decoders: LlamaForCausalLM (Llama 3.x), Qwen2ForCausalLM (qkv bias,
tied embeddings), Qwen3ForCausalLM (per-head q/k RMSNorm) and MistralForCausalLM (Llama's
layers). q/k/v and gate/up projections are fused into one matmul each when the weights are
loaded. Under tensor parallelism each rank builds its share: its attention heads (and KV heads,
or the one its heads read when there are fewer than ranks), its intermediate rows and its
vocabulary rows."""

from __future__ import annotations

import dataclasses
from typing import Iterable

import torch
from torch import nn

from sglang.srt.configs.model_config import rope_parameters
from sglang.srt.distributed.parallel_state import check_shardable, kv_heads_per_rank, tensor_parallel
from sglang.srt.layers.activation import SiluAndMul
from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.linear import Linear, ParallelLMHead, RowParallelLinear, VocabParallelEmbedding
from sglang.srt.layers.logits_processor import LogitsProcessor, LogitsProcessorOutput
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.layers.rotary_embedding import RotaryEmbedding
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.models.weight_loading import FusedShard, llama_fused_shards, load_named_weights


@dataclasses.dataclass(frozen=True)
class ArchOptions:
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    # config.sliding_window, when set, applies to every layer (Mistral: no layer_types, no flag).
    window_on_every_layer: bool = False


# transformers' names for the one activation these models compute (SiluAndMul).
SUPPORTED_ACTIVATIONS = ("silu", "swish")


def check_supported(config, window_on_every_layer: bool = False, context_len: int | None = None) -> None:
    """Refuse at load time what these models would otherwise compute silently wrong: another
    activation than SiluAndMul's, or sliding-window layers whose window is shorter than the served
    context (`context_len`, max_position_embeddings by default): every layer attends to the whole
    context, which equals the window's attention only while no sequence is longer than the window."""
    act = getattr(config, "hidden_act", "silu")
    if act not in SUPPORTED_ACTIVATIONS:
        raise ValueError(
            f"hidden_act {act!r} in config.json is not supported (supported: {', '.join(SUPPORTED_ACTIVATIONS)})"
        )
    window = getattr(config, "sliding_window", None)
    layer_types = layer_attention_types(config, window_on_every_layer)
    sliding = [i for i, kind in enumerate(layer_types) if kind != "full_attention"]
    context_len = context_len or config.max_position_embeddings
    if sliding and (window is None or window < context_len):
        hint = f"; serve it with --context-length {window} or less" if window else ""
        raise ValueError(
            f"config.json makes layers {sliding} {layer_types[sliding[0]]} (sliding_window "
            f"{window}, served context {context_len} tokens); only full attention is "
            f"supported, which computes the same as the window while sequences fit in it{hint}"
        )


def layer_attention_types(config, window_on_every_layer: bool) -> list[str]:
    """Each layer's attention as transformers computes it: config.layer_types where it gives them;
    else, for configs read by older transformers, sliding from max_window_layers on under
    use_sliding_window; else, where the model applies a window to every layer, sliding throughout."""
    num_layers = config.num_hidden_layers
    if getattr(config, "layer_types", None):
        return list(config.layer_types)
    if getattr(config, "use_sliding_window", False):
        first = getattr(config, "max_window_layers", 0) or 0
        return ["full_attention"] * first + ["sliding_attention"] * (num_layers - first)
    if window_on_every_layer and getattr(config, "sliding_window", None) is not None:
        return ["sliding_attention"] * num_layers
    return ["full_attention"] * num_layers


class LlamaMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False):
        super().__init__()
        self.intermediate_size = intermediate_size // tensor_parallel().size  # this rank's rows
        self.gate_up_proj = Linear(hidden_size, 2 * self.intermediate_size, bias=bias)
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias=bias)
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


def fuses_rope_and_kv_store(q: torch.Tensor) -> bool:
    """Whether attention rotates q and k and writes the KV cache in one Triton kernel (on CUDA),
    rather than rotating in torch and leaving the store to the attention backend."""
    return q.is_cuda


class LlamaAttention(nn.Module):
    def __init__(self, config, layer_id: int, opts: ArchOptions, rotary_emb: RotaryEmbedding):
        super().__init__()
        hidden = config.hidden_size
        tp_size = tensor_parallel().size
        self.total_num_heads = config.num_attention_heads
        self.total_num_kv_heads = getattr(config, "num_key_value_heads", None) or self.total_num_heads
        self.head_dim = getattr(config, "head_dim", None) or hidden // self.total_num_heads
        # This rank's heads (all of them at tp_size 1).
        self.num_heads = self.total_num_heads // tp_size
        self.num_kv_heads = kv_heads_per_rank(self.total_num_kv_heads, tp_size)
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.qkv_proj = Linear(hidden, self.q_size + 2 * self.kv_size, bias=opts.qkv_bias)
        self.o_proj = RowParallelLinear(self.total_num_heads * self.head_dim, hidden, bias=opts.o_bias)
        eps = config.rms_norm_eps
        self.q_norm = RMSNorm(self.head_dim, eps) if opts.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, eps) if opts.qk_norm else None
        self.rotary_emb = rotary_emb  # one table shared by all layers
        self.attn = RadixAttention(self.num_heads, self.head_dim, self.head_dim**-0.5, self.num_kv_heads, layer_id)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, forward_batch: ForwardBatch):
        q, k, v = self.qkv_proj(hidden).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.reshape(-1, self.num_heads, self.head_dim)
        k = k.reshape(-1, self.num_kv_heads, self.head_dim)
        fused = fuses_rope_and_kv_store(q)
        if self.q_norm is not None and not fused:
            q, k = self.q_norm(q), self.k_norm(k)
        if fused:
            # One kernel normalizes q's and k's heads (where the family has q_norm and k_norm),
            # rotates them in place and writes k and v to this layer's cache slots, where both
            # backends read them: the backend then stores nothing.
            pool = forward_batch.token_to_kv_pool
            self.rotary_emb.rotate_and_store(
                positions,
                q,
                k,
                v.view(-1, self.num_kv_heads, self.head_dim),
                pool.get_key_buffer(self.attn.layer_id),
                pool.get_value_buffer(self.attn.layer_id),
                forward_batch.out_cache_loc,
                *pool.get_kv_scales(self.attn.layer_id),
                **self._head_norms(),
            )
            out = self.attn(
                q.reshape(-1, self.q_size), k.reshape(-1, self.kv_size), v, forward_batch, save_kv_cache=False
            )
        else:
            q, k = self.rotary_emb(positions, q, k)
            out = self.attn(q.reshape(-1, self.q_size), k.reshape(-1, self.kv_size), v, forward_batch)
        return self.o_proj(out)

    def _head_norms(self) -> dict:
        """The per-head norms for the fused kernel (none where the family has no q_norm/k_norm; both
        are built with the same eps)."""
        if self.q_norm is None:
            return {}
        return dict(q_norm=self.q_norm.weight, k_norm=self.k_norm.weight, norm_eps=self.q_norm.variance_epsilon)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config, layer_id: int, opts: ArchOptions, rotary_emb: RotaryEmbedding):
        super().__init__()
        self.self_attn = LlamaAttention(config, layer_id, opts, rotary_emb)
        self.mlp = LlamaMLP(config.hidden_size, config.intermediate_size, getattr(config, "mlp_bias", False))
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, positions, hidden, forward_batch: ForwardBatch, residual):
        """Returns (this layer's output, the residual stream before it); their sum is the stream after."""
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden, forward_batch)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class LlamaModel(nn.Module):
    def __init__(self, config, opts: ArchOptions, make_layer=LlamaDecoderLayer):
        """`make_layer(config, layer_id, opts, rotary_emb)`: a decoder layer (MoE models make their own)."""
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        # The cos/sin table is [max_position, head_dim] float32 (64 MiB at 128k positions): build it once.
        rotary_emb = RotaryEmbedding(head_dim, config.max_position_embeddings, rope_parameters(config))
        self.layers = nn.ModuleList([make_layer(config, i, opts, rotary_emb) for i in range(config.num_hidden_layers)])
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        # Layer ids whose output (the full residual stream) the EAGLE-3 draft reads.
        self.layers_to_capture: list[int] = []

    def forward(self, input_ids, positions, forward_batch: ForwardBatch):
        hidden, residual = self.embed_tokens(input_ids), None
        captured = {}
        capture = forward_batch.capture_aux_hidden_states and self.layers_to_capture
        for i, layer in enumerate(self.layers):
            hidden, residual = layer(positions, hidden, forward_batch, residual)
            if capture and i in self.layers_to_capture:
                captured[i] = hidden + residual
        hidden, _ = self.norm(hidden, residual)
        # In the order the draft lists them (a layer may be listed twice in a shallow model).
        return hidden, [captured[i] for i in self.layers_to_capture] if capture else []


class LlamaForCausalLM(nn.Module):
    arch_options = ArchOptions()

    def __init__(self, config, context_len: int | None = None):
        """`context_len`: the longest sequence the server holds (--context-length), by default the
        config's max_position_embeddings."""
        super().__init__()
        check_shardable(config, tensor_parallel().size)
        self.config = config
        opts = self._options(config)
        check_supported(config, opts.window_on_every_layer, context_len)
        self.model = LlamaModel(config, opts, self._decoder_layer)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        if self.tie_word_embeddings:
            self.lm_head = self.model.embed_tokens
        else:
            self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size)
        self.logits_processor = LogitsProcessor()

    def _options(self, config) -> ArchOptions:
        bias = bool(getattr(config, "attention_bias", False))
        return ArchOptions(qkv_bias=bias, o_bias=bias)

    _decoder_layer = LlamaDecoderLayer  # called as LlamaModel's make_layer

    def forward(self, input_ids, positions, forward_batch: ForwardBatch) -> LogitsProcessorOutput:
        hidden, aux = self.model(input_ids, positions, forward_batch)
        return self.logits_processor(hidden, self.lm_head, forward_batch, aux)

    def set_eagle3_layers_to_capture(self, layer_ids: list[int]) -> None:
        self.model.layers_to_capture = list(layer_ids)

    def fused_shards(self) -> dict[str, FusedShard]:
        layer = self.model.layers[0]
        return llama_fused_shards(layer.self_attn, layer.mlp)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        skip = {"lm_head.weight"} if self.tie_word_embeddings else set()
        load_named_weights(self, weights, self.fused_shards(), skip=skip)


class Qwen2ForCausalLM(LlamaForCausalLM):
    def _options(self, config) -> ArchOptions:
        return ArchOptions(qkv_bias=True, o_bias=False)


class Qwen3ForCausalLM(LlamaForCausalLM):
    def _options(self, config) -> ArchOptions:
        bias = bool(getattr(config, "attention_bias", False))
        return ArchOptions(qkv_bias=bias, o_bias=bias, qk_norm=True)


class MistralForCausalLM(LlamaForCausalLM):
    # Llama's layers (head_dim may differ from hidden_size / heads, as in Mistral-Nemo). Mistral
    # applies `sliding_window` to every layer: v0.1's 4096 is served with --context-length 4096 or
    # less (refused on its 32k context), v0.3's null served.
    def _options(self, config) -> ArchOptions:
        return ArchOptions(window_on_every_layer=True)


EntryClass = [LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, MistralForCausalLM]
