"""Tiny replicas of the published EAGLE-3 draft layouts (config keys and tensor names as published),
written from one set of draft tensors, and a plain-torch reference of the draft they describe.

Layouts: "specforge" (ours: LlamaForCausalLMEagle3, safetensors, midlayer.*), "release" (the
original EAGLE-3 release: a LlamaForCausalLM config without head_dim or eagle_config, one float16
pytorch_model.bin) and "speculators" (Eagle3Speculator: transformer_layer_config, layers.0.*,
embed_tokens, aux ids counted as the state entering a layer). Features (DraftFeatures) are written
the way each format spells them.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os

import torch

LAYOUTS = ("specforge", "release", "speculators")


@dataclasses.dataclass(frozen=True)
class DraftFeatures:
    fc_bias: bool = False
    norm_before_residual: bool = False
    norm_before_fc: bool = False
    attention_bias: bool = False  # q/k/v and o_proj biases
    qk_norm: bool = False  # Qwen3's per-head q_norm / k_norm
    copied_num_layers: bool = False  # config.json's num_hidden_layers is the target's


# Every published layout and feature a draft may have, as (layout, features).
CASES = {
    "specforge": ("specforge", DraftFeatures()),
    "release": ("release", DraftFeatures()),
    "speculators": ("speculators", DraftFeatures()),
    "speculators_fc_bias": ("speculators", DraftFeatures(fc_bias=True)),
    "norm_before_residual": ("speculators", DraftFeatures(norm_before_residual=True)),
    "norm_before_fc": ("speculators", DraftFeatures(norm_before_fc=True)),
    "copied_num_hidden_layers": ("specforge", DraftFeatures(copied_num_layers=True)),
    "attention_bias": ("speculators", DraftFeatures(attention_bias=True)),
    "qwen3_qk_norm": ("speculators", DraftFeatures(qk_norm=True)),
}


def draft_tensors(target_config, draft_vocab: int, features: DraftFeatures, seed: int = 0) -> dict:
    """Random float32 draft tensors in canonical names (midlayer.*); d2t maps draft id i to target
    id i + 1 when the draft vocabulary is reduced."""
    hidden, inter = target_config.hidden_size, target_config.intermediate_size
    heads, kv_heads = target_config.num_attention_heads, target_config.num_key_value_heads
    head_dim = getattr(target_config, "head_dim", None) or hidden // heads
    gen = torch.Generator().manual_seed(seed)

    def weight(*shape, scale=0.1):
        return scale * torch.randn(*shape, generator=gen)

    def norm(size):
        return 1 + 0.3 * torch.randn(size, generator=gen)

    attn = "midlayer.self_attn."
    tensors = {
        "fc.weight": weight(hidden, 3 * hidden),
        f"{attn}q_proj.weight": weight(heads * head_dim, 2 * hidden),
        f"{attn}k_proj.weight": weight(kv_heads * head_dim, 2 * hidden),
        f"{attn}v_proj.weight": weight(kv_heads * head_dim, 2 * hidden),
        f"{attn}o_proj.weight": weight(hidden, heads * head_dim),
        "midlayer.mlp.gate_proj.weight": weight(inter, hidden),
        "midlayer.mlp.up_proj.weight": weight(inter, hidden),
        "midlayer.mlp.down_proj.weight": weight(hidden, inter),
        "midlayer.input_layernorm.weight": norm(hidden),
        "midlayer.hidden_norm.weight": norm(hidden),
        "midlayer.post_attention_layernorm.weight": norm(hidden),
        "norm.weight": norm(hidden),
        "lm_head.weight": weight(draft_vocab, hidden, scale=0.5),
    }
    if features.fc_bias:
        tensors["fc.bias"] = weight(hidden, scale=1.0)
    if features.norm_before_fc:
        tensors["input_norm.weight"] = norm(3 * hidden)
    if features.attention_bias:
        for name, rows in (("q", heads), ("k", kv_heads), ("v", kv_heads)):
            tensors[f"{attn}{name}_proj.bias"] = weight(rows * head_dim, scale=0.5)
        tensors[f"{attn}o_proj.bias"] = weight(hidden, scale=0.5)
    if features.qk_norm:
        tensors[f"{attn}q_norm.weight"] = norm(head_dim)
        tensors[f"{attn}k_norm.weight"] = norm(head_dim)
    if draft_vocab != target_config.vocab_size:
        tensors.update(vocab_map([i + 1 for i in range(draft_vocab)], target_config.vocab_size))
    return tensors


def vocab_map(target_ids: list[int], vocab_size: int) -> dict:
    """d2t (offsets: draft id + d2t = target id) and t2d (the target ids in the draft vocabulary)."""
    target = torch.tensor(target_ids, dtype=torch.int64)
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[target] = True
    return {"d2t": target - torch.arange(len(target_ids)), "t2d": t2d}


def write_draft(
    path: str,
    layout: str,
    tensors: dict,
    target_path: str,
    aux_layer_ids: list[int] | None,
    features: DraftFeatures = DraftFeatures(),
    embed: torch.Tensor | None = None,
) -> str:
    """Writes `tensors` (canonical names) as `layout` publishes a draft. `aux_layer_ids` count as
    ours (a target layer's output); None leaves them out of config.json. `embed`: the embedding a
    speculators export carries (the target's)."""
    from transformers import AutoConfig

    target = AutoConfig.from_pretrained(target_path)
    os.makedirs(path, exist_ok=True)
    writer = {"specforge": _write_specforge, "release": _write_release, "speculators": _write_speculators}[layout]
    config = writer(path, tensors, target, aux_layer_ids, features, embed)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return path


def _layer_settings(target, tensors: dict, features: DraftFeatures) -> dict:
    return {
        "hidden_size": target.hidden_size,
        "intermediate_size": target.intermediate_size,
        "num_hidden_layers": target.num_hidden_layers if features.copied_num_layers else 1,
        "num_attention_heads": target.num_attention_heads,
        "num_key_value_heads": target.num_key_value_heads,
        "hidden_act": "silu",
        "rms_norm_eps": target.rms_norm_eps,
        "max_position_embeddings": target.max_position_embeddings,
        "rope_theta": 10000.0,
        "vocab_size": target.vocab_size,
        "attention_bias": features.attention_bias,
    }


def _save_safetensors(path: str, tensors: dict) -> None:
    from safetensors.torch import save_file

    save_file({name: t.contiguous() for name, t in tensors.items()}, os.path.join(path, "model.safetensors"))


def _write_specforge(path, tensors, target, aux_layer_ids, features, embed) -> dict:
    _save_safetensors(path, tensors)
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        **_layer_settings(target, tensors, features),
        "head_dim": target.hidden_size // target.num_attention_heads,
        "draft_vocab_size": tensors["lm_head.weight"].shape[0],
        "target_hidden_size": target.hidden_size,
        "torch_dtype": "float32",
        "norm_before_residual": features.norm_before_residual,
        "norm_before_fc": features.norm_before_fc,
    }
    if aux_layer_ids is not None:
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": aux_layer_ids}
    return config


def _write_release(path, tensors, target, aux_layer_ids, features, embed) -> dict:
    """yuhuili/EAGLE3-LLaMA3.1-Instruct-8B: float16 .bin, no eagle_config (default aux layers)."""
    assert aux_layer_ids is None, "the original release names no aux layers"
    half = {name: t.half() if t.is_floating_point() else t for name, t in tensors.items()}
    torch.save(half, os.path.join(path, "pytorch_model.bin"))
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        **_layer_settings(target, tensors, features),
        "bos_token_id": 0,
        "eos_token_id": 0,
        "pad_token_id": 0,
        "tie_word_embeddings": False,
        "torch_dtype": "float16",
        "transformers_version": "4.28.1",
        "draft_vocab_size": tensors["lm_head.weight"].shape[0],
    }


def _write_speculators(path, tensors, target, aux_layer_ids, features, embed) -> dict:
    """RedHat speculators' Eagle3Speculator export: layers.0.*, embed_tokens, aux ids counted as
    the state entering a layer (ours + 1), the layer's settings in transformer_layer_config."""
    renamed = {name.replace("midlayer.", "layers.0."): t for name, t in tensors.items()}
    if embed is not None:
        renamed["embed_tokens.weight"] = embed
    _save_safetensors(path, renamed)
    layer = {
        "model_type": "qwen3" if features.qk_norm else "llama",
        **_layer_settings(target, tensors, features),
        "head_dim": target.hidden_size // target.num_attention_heads,
    }
    config = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": "0.1.0",
        "transformer_layer_config": layer,
        "draft_vocab_size": tensors["lm_head.weight"].shape[0],
        "norm_before_residual": features.norm_before_residual,
        "torch_dtype": "float32",
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
            "verifier": {"name_or_path": "tiny-target", "architectures": list(target.architectures)},
        },
    }
    if features.norm_before_fc:
        config["norm_before_fc"] = True
    if aux_layer_ids is not None:
        config["eagle_aux_hidden_state_layer_ids"] = [i + 1 for i in aux_layer_ids]
    return config


# --- a plain-torch reference of the draft (none of the engine's modules) ---


def rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rotate(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Default RoPE over [tokens, heads, head_dim], rotating halves."""
    dim = x.shape[-1]
    inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    angles = positions.float()[:, None] * inv_freq[None]
    cos, sin = torch.cat([angles.cos()] * 2, -1)[:, None], torch.cat([angles.sin()] * 2, -1)[:, None]
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-second, first], -1) * sin


def reference_draft_step(
    t: dict,
    features: DraftFeatures,
    shape: dict,
    embeds: torch.Tensor,
    hidden_in: torch.Tensor,
    from_aux: bool,
    eps: float,
    theta: float = 10000.0,
):
    """One draft forward over one sequence (positions 0 .. n - 1, causal): `hidden_in` is the
    three aux states [n, 3H] (from_aux) or the draft's own previous outputs [n, H]. Returns
    (draft-vocabulary logits, the output before the final norm)."""
    a = "midlayer.self_attn."
    if from_aux:
        x = rms(hidden_in, t["input_norm.weight"], eps) if features.norm_before_fc else hidden_in
        hidden_in = x @ t["fc.weight"].T + (t["fc.bias"] if features.fc_bias else 0)
    normed = rms(hidden_in, t["midlayer.hidden_norm.weight"], eps)
    stream = normed if features.norm_before_residual else hidden_in
    x = torch.cat([rms(embeds, t["midlayer.input_layernorm.weight"], eps), normed], -1)

    def proj(name):
        bias = t.get(f"{a}{name}.bias") if features.attention_bias else None
        return x @ t[f"{a}{name}.weight"].T + (bias if bias is not None else 0)

    n, heads, kv_heads, head_dim = x.shape[0], shape["heads"], shape["kv_heads"], shape["head_dim"]
    q, k, v = (proj(f"{p}_proj").reshape(n, -1, head_dim) for p in "qkv")
    if features.qk_norm:
        q, k = rms(q, t[f"{a}q_norm.weight"], eps), rms(k, t[f"{a}k_norm.weight"], eps)
    positions = torch.arange(n)
    q, k = rotate(q, positions, theta), rotate(k, positions, theta)
    k, v = (z.repeat_interleave(heads // kv_heads, dim=1) for z in (k, v))
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(head_dim)
    scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    attn = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(n, heads * head_dim)
    attn = attn @ t[f"{a}o_proj.weight"].T + (t[f"{a}o_proj.bias"] if features.attention_bias else 0)
    residual = stream + attn
    h = rms(residual, t["midlayer.post_attention_layernorm.weight"], eps)
    mlp = (
        torch.nn.functional.silu(h @ t["midlayer.mlp.gate_proj.weight"].T) * (h @ t["midlayer.mlp.up_proj.weight"].T)
    ) @ t["midlayer.mlp.down_proj.weight"].T
    out = residual + mlp
    return rms(out, t["norm.weight"], eps) @ t["lm_head.weight"].T, out
