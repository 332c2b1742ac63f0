"""The EAGLE-3 draft model (`LlamaForCausalLMEagle3`): one Llama decoder layer whose attention
reads [embedding ; hidden], over a reduced draft vocabulary mapped to target ids through d2t.

The hidden input of a token is fc(the target's three aux hidden states) when it comes from the
target (DRAFT_EXTEND, EXTEND) or the draft's own previous output in a chain step (DECODE). The
layer's residual stream starts from that hidden input, not from the embedding. The output before
the final norm is returned for every token: it is the next chain step's hidden input.

Published variants it computes, flagged on the config by model_loader.eagle3_formats (which reads
every published layout into this one): `norm_before_residual` (the residual stream starts from
hidden_norm(hidden)), `norm_before_fc` (an RMSNorm over the 3 concatenated aux states before fc),
`fc_bias`, `qkv_bias` / `o_bias` (attention biases) and `qk_norm` (Qwen3's per-head q/k RMSNorm).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from sglang.srt.configs.model_config import rope_parameters
from sglang.srt.distributed.parallel_state import check_shardable, tensor_parallel
from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.linear import Linear
from sglang.srt.layers.logits_processor import LogitsProcessor, LogitsProcessorOutput
from sglang.srt.layers.rotary_embedding import RotaryEmbedding
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.model_loader.dummy import DUMMY_SEED, DUMMY_STD
from sglang.srt.models.llama import ArchOptions, LlamaAttention, LlamaMLP
from sglang.srt.models.weight_loading import FusedShard, llama_fused_shards, load_named_weights

# Loaded outside load_named_weights: the vocabulary map, and the weights a checkpoint may lack
# because the target's are shared.
_VOCAB_MAP_WEIGHTS = ("d2t", "t2d")
_SHAREABLE_WEIGHTS = ("embed_tokens.weight", "lm_head.weight")
_UNSUPPORTED_FLAGS = ("fc_norm",)


def default_aux_layer_ids(num_target_layers: int) -> list[int]:
    """Target layers read when the draft's config names none: low, middle and high."""
    return [1, num_target_layers // 2 - 1, num_target_layers - 4]


def canonical_weight_name(name: str) -> str:
    """`model.layers.0.mlp.up_proj.weight` and `midlayer.mlp.up_proj.weight` are the same weight."""
    name = name.removeprefix("model.")
    if name.startswith("layers.0."):
        name = "midlayer." + name.removeprefix("layers.0.")
    return name


def _flag(config, name: str) -> bool:
    return bool(getattr(config, name, False))


class Eagle3DecoderLayer(nn.Module):
    def __init__(self, config, rotary_emb: RotaryEmbedding):
        super().__init__()
        hidden = config.hidden_size
        opts = ArchOptions(
            qkv_bias=_flag(config, "qkv_bias"), o_bias=_flag(config, "o_bias"), qk_norm=_flag(config, "qk_norm")
        )
        self.self_attn = LlamaAttention(config, 0, opts, rotary_emb)
        # q, k and v read [embedding ; hidden]: twice the hidden width.
        attn = self.self_attn
        attn.qkv_proj = Linear(2 * hidden, attn.q_size + 2 * attn.kv_size, bias=opts.qkv_bias)
        self.norm_before_residual = _flag(config, "norm_before_residual")
        self.mlp = LlamaMLP(hidden, config.intermediate_size)
        self.input_layernorm = RMSNorm(hidden, config.rms_norm_eps)
        self.hidden_norm = RMSNorm(hidden, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(hidden, config.rms_norm_eps)

    def forward(self, positions, embeds, hidden, forward_batch: ForwardBatch):
        """Returns (the MLP output, the residual stream before it); their sum is the layer output."""
        normed_hidden = self.hidden_norm(hidden)
        attn_input = torch.cat([self.input_layernorm(embeds), normed_hidden], dim=-1)
        # Not the fused norm: `hidden` may be the caller's tensor, which that kernel writes into.
        stream = normed_hidden if self.norm_before_residual else hidden
        residual = stream + self.self_attn(positions, attn_input, forward_batch)
        return self.mlp(self.post_attention_layernorm(residual)), residual


class LlamaForCausalLMEagle3(nn.Module):
    def __init__(self, config, context_len: int | None = None):
        """`context_len` (the served context) changes nothing: the draft's one layer attends to the
        whole context, as EAGLE-3 drafts are trained to."""
        super().__init__()
        _check_config(config)
        check_shardable(config, tensor_parallel().size, "the EAGLE-3 draft")
        self.config = config
        self.hidden_size = config.hidden_size
        self.vocab_size = config.vocab_size
        self.draft_vocab_size = getattr(config, "draft_vocab_size", None) or config.vocab_size
        self.target_hidden_size = getattr(config, "target_hidden_size", None) or config.hidden_size
        eagle_config = getattr(config, "eagle_config", None) or {}
        self.aux_layer_ids: list[int] | None = eagle_config.get("eagle_aux_hidden_state_layer_ids")
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        rotary_emb = RotaryEmbedding(head_dim, config.max_position_embeddings, rope_parameters(config))
        self.fc = Linear(3 * self.target_hidden_size, self.hidden_size, bias=_flag(config, "fc_bias"))
        # norm_before_fc: one RMSNorm over the three concatenated aux states, fc's input only.
        self.input_norm = (
            RMSNorm(3 * self.target_hidden_size, config.rms_norm_eps) if _flag(config, "norm_before_fc") else None
        )
        self.midlayer = Eagle3DecoderLayer(config, rotary_emb)
        self.norm = RMSNorm(self.hidden_size, config.rms_norm_eps)
        # Set by load_weights from the checkpoint, or by share_target_weights from the target.
        self.embed_tokens: nn.Module | None = None
        self.lm_head: nn.Module | None = None
        # Draft id + d2t[draft id] = target id; zeros (identity) until loaded.
        self.register_buffer("d2t", torch.zeros(self.draft_vocab_size, dtype=torch.int64))
        self.logits_processor = LogitsProcessor()

    def forward(self, input_ids, positions, forward_batch: ForwardBatch) -> LogitsProcessorOutput:
        hidden = self._hidden_input(forward_batch.spec_hidden_states)
        mlp_out, residual = self.midlayer(positions, self._embed(input_ids), hidden, forward_batch)
        normed, output = self.norm(mlp_out, residual)
        result = self.logits_processor(normed, self.lm_head, forward_batch, [])
        result.hidden_states = output
        return result

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    def _hidden_input(self, spec_hidden_states: torch.Tensor | None) -> torch.Tensor:
        if spec_hidden_states is None:
            raise ValueError("the EAGLE-3 draft needs forward_batch.spec_hidden_states")
        width = spec_hidden_states.shape[-1]
        if width == self.fc.in_features:
            if self.input_norm is not None:
                spec_hidden_states = self.input_norm(spec_hidden_states)
            return self.fc(spec_hidden_states)
        if width == self.hidden_size:
            return spec_hidden_states
        raise ValueError(
            f"spec_hidden_states has width {width}; the draft takes {self.fc.in_features} "
            f"(3 target aux hidden states) or {self.hidden_size} (its own previous output)"
        )

    def _embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        missing = [name for name in ("embed_tokens", "lm_head") if getattr(self, name) is None]
        if missing:
            raise RuntimeError(
                f"the draft checkpoint has no {' or '.join(missing)}: call "
                "share_target_weights(target_model) before running it"
            )
        return self.embed_tokens(input_ids)

    def attach_to_target(self, target_model: nn.Module) -> list[int]:
        """Share the target's weights where the checkpoint has none (share_target_weights) and
        have the target capture the hidden states of the layers this draft reads. Returns them."""
        self.share_target_weights(target_model)
        num_layers = target_model.config.num_hidden_layers
        aux_ids = self.aux_layer_ids or default_aux_layer_ids(num_layers)
        if len(aux_ids) != 3 or any(not 0 <= i < num_layers for i in aux_ids):
            raise ValueError(
                f"the draft's aux layer ids {list(aux_ids)} must be 3 layers of the target's "
                f"{num_layers} (eagle_config.eagle_aux_hidden_state_layer_ids)"
            )
        target_model.set_eagle3_layers_to_capture(list(aux_ids))
        return list(aux_ids)

    def share_target_weights(self, target_model: nn.Module) -> None:
        """Use the target's embedding (and lm_head) where the checkpoint has none: the same
        tensors, not copies."""
        if self.embed_tokens is None:
            embed = target_model.model.embed_tokens
            _check_shared_shape("embed_tokens", embed, (self.vocab_size, self.hidden_size))
            self.embed_tokens = embed
        if self.lm_head is None:
            if self.draft_vocab_size != self.vocab_size:
                raise ValueError(
                    f"the draft checkpoint has no lm_head.weight and its draft_vocab_size "
                    f"({self.draft_vocab_size}) differs from vocab_size ({self.vocab_size}), so the "
                    "target's lm_head cannot stand in for it"
                )
            _check_shared_shape("lm_head", target_model.lm_head, (self.vocab_size, self.hidden_size))
            self.lm_head = target_model.lm_head

    def fused_shards(self) -> dict[str, FusedShard]:
        return llama_fused_shards(self.midlayer.self_attn, self.midlayer.mlp)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Layer weights under `midlayer.` or `layers.0.` (either with or without `model.`);
        errors name layer weights in their `midlayer.` form."""
        set_aside: dict[str, tuple[str, torch.Tensor]] = {}

        def layer_weights():
            for ckpt_name, tensor in weights:
                name = canonical_weight_name(ckpt_name)
                if name in _VOCAB_MAP_WEIGHTS + _SHAREABLE_WEIGHTS:
                    set_aside[name] = (ckpt_name, tensor)
                else:
                    yield name, tensor

        load_named_weights(self, layer_weights(), self.fused_shards())
        self._load_vocab_map(set_aside.get("d2t"), set_aside.get("t2d"))
        if "embed_tokens.weight" in set_aside:
            self.embed_tokens = nn.Embedding.from_pretrained(
                self._own_weight(*set_aside["embed_tokens.weight"], (self.vocab_size, self.hidden_size))
            )
        if "lm_head.weight" in set_aside:
            self.lm_head = Linear(self.hidden_size, self.draft_vocab_size, bias=False, device="meta")
            self.lm_head.weight = nn.Parameter(
                self._own_weight(*set_aside["lm_head.weight"], (self.draft_vocab_size, self.hidden_size)),
                requires_grad=False,
            )

    def after_dummy_weights(self) -> None:
        """--load-format dummy: the vocabulary map stays the identity (zeros), and a draft
        vocabulary smaller than the target's gets a random head of its own (the target's cannot
        stand in for it); the embedding is the target's, as for a checkpoint without one."""
        if self.draft_vocab_size != self.vocab_size:
            weight = torch.empty(
                self.draft_vocab_size, self.hidden_size, device=self.fc.weight.device, dtype=self.fc.weight.dtype
            )
            self.lm_head = Linear(self.hidden_size, self.draft_vocab_size, bias=False, device="meta")
            generator = (
                torch.Generator(device=weight.device).manual_seed(DUMMY_SEED) if weight.device.type != "meta" else None
            )
            self.lm_head.weight = nn.Parameter(weight.normal_(0.0, DUMMY_STD, generator=generator), requires_grad=False)

    def _own_weight(self, ckpt_name: str, tensor: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
        _check_shape(ckpt_name, tensor, shape)
        return tensor.to(device=self.fc.weight.device, dtype=self.fc.weight.dtype)

    def _load_vocab_map(self, d2t: tuple | None, t2d: tuple | None) -> None:
        if d2t is None:
            if self.draft_vocab_size != self.vocab_size:
                raise ValueError(
                    f"checkpoint is missing weight 'd2t', which a draft_vocab_size "
                    f"({self.draft_vocab_size}) below vocab_size ({self.vocab_size}) needs"
                )
            return
        name, offsets = d2t
        _check_shape(name, offsets, (self.draft_vocab_size,))
        target_ids = torch.arange(self.draft_vocab_size) + offsets.to(torch.int64)
        if target_ids.min() < 0 or target_ids.max() >= self.vocab_size:
            raise ValueError(f"weight {name!r} maps draft ids outside the target vocabulary [0, {self.vocab_size})")
        if t2d is not None:
            _check_t2d(*t2d, target_ids, self.vocab_size)
        self.d2t.copy_(offsets)


def _check_config(config) -> None:
    layers = getattr(config, "num_hidden_layers", 1)
    if layers != 1:
        raise ValueError(f"an EAGLE-3 draft has one decoder layer; config.json says num_hidden_layers={layers}")
    draft_vocab = getattr(config, "draft_vocab_size", None) or config.vocab_size
    if draft_vocab > config.vocab_size:
        raise ValueError(f"draft_vocab_size ({draft_vocab}) exceeds vocab_size ({config.vocab_size})")
    for flag in _UNSUPPORTED_FLAGS:
        if getattr(config, flag, False):
            raise ValueError(f"EAGLE-3 drafts with {flag!r} set are not supported")


def _check_shape(ckpt_name: str, tensor: torch.Tensor, shape: tuple) -> None:
    if tuple(tensor.shape) != tuple(shape):
        raise ValueError(
            f"weight {ckpt_name!r} has shape {tuple(tensor.shape)} in the checkpoint, "
            f"but the model expects {tuple(shape)} (check config.json)"
        )


def _check_t2d(ckpt_name: str, mask: torch.Tensor, target_ids: torch.Tensor, vocab_size: int) -> None:
    """t2d is redundant with d2t (the target ids in the draft vocabulary); it must agree."""
    _check_shape(ckpt_name, mask, (vocab_size,))
    mask = mask.to(torch.bool)
    if int(mask.sum()) != target_ids.numel() or not bool(mask[target_ids].all()):
        raise ValueError(f"weight {ckpt_name!r} does not mark the same target ids as 'd2t'")


def _check_shared_shape(name: str, module: nn.Module, shape: tuple) -> None:
    # A vocabulary-parallel module's weight holds this rank's rows: compare the whole.
    whole = tuple(getattr(module, "full_shape", module.weight.shape))
    if whole != tuple(shape):
        raise ValueError(f"cannot share the target's {name}: it is {whole}, the draft needs {tuple(shape)}")


EntryClass = [LlamaForCausalLMEagle3]
