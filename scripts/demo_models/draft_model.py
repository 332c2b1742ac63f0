"""The EAGLE-3 draft: one Llama decoder layer fed by [embedding ; fc(three target aux hidden
states)], its chain unrolling (used for training-time test and for evaluation), and a saver
that writes the published `LlamaForCausalLMEagle3` checkpoint format.

Positions and inputs, exactly as the serving engine must reproduce them. Let x_0..x_n be the
tokens the target has verified and aux_t the concatenated outputs of the target decoder layers
`aux_layer_ids` at position t (transformers' hidden_states[id + 1], before any norm).
- Step 0 (one entry per position t, RoPE position t): input [embed(x_{t+1}) ; fc(aux_t)];
  its output o_t (the layer output before the final norm) gives, through norm -> lm_head -> d2t,
  the draft's guess for x_{t+2}.
- Step j >= 1 of a chain anchored at position a (RoPE position a + j): input
  [embed(token guessed at step j - 1) ; output of step j - 1]. It attends to the step-0 entries
  at positions 0..a and to the entries of steps 1..j of its own chain.
In training the step-j embedding is the target's greedy token instead of the draft's guess:
the two agree on every chain prefix that can still be accepted.
"""

from __future__ import annotations

import json
import os

import torch
from safetensors.torch import save_file
from torch import nn
from torch.nn import functional as F


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        variance = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(variance + self.eps)).to(x.dtype) * self.weight


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(2 * hidden, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(2 * hidden, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(2 * hidden, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)

    def project(self, x, cos, sin):
        """q, k, v as [batch, heads, seq, head_dim] with RoPE applied to q and k."""

        def split(t, n):
            return t.view(*x.shape[:2], n, self.head_dim).transpose(1, 2)

        q = apply_rope(split(self.q_proj(x), self.heads), cos, sin)
        k = apply_rope(split(self.k_proj(x), self.kv_heads), cos, sin)
        repeat = self.heads // self.kv_heads
        v = split(self.v_proj(x), self.kv_heads)
        return q, k.repeat_interleave(repeat, 1), v.repeat_interleave(repeat, 1)


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MidLayer(nn.Module):
    def __init__(self, hidden, heads, kv_heads, head_dim, intermediate, eps):
        super().__init__()
        self.hidden_norm = RMSNorm(hidden, eps)
        self.input_layernorm = RMSNorm(hidden, eps)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.self_attn = Attention(hidden, heads, kv_heads, head_dim)
        self.mlp = MLP(hidden, intermediate)


class Eagle3Draft(nn.Module):
    def __init__(self, target_config, draft_vocab_ids: torch.Tensor, aux_layer_ids: list[int]):
        super().__init__()
        c = target_config
        self.target_config, self.aux_layer_ids = c, list(aux_layer_ids)
        self.head_dim = c.hidden_size // c.num_attention_heads
        self.rope_theta = c.rope_parameters["rope_theta"]
        self.fc = nn.Linear(3 * c.hidden_size, c.hidden_size, bias=False)
        self.midlayer = MidLayer(
            c.hidden_size,
            c.num_attention_heads,
            c.num_key_value_heads,
            self.head_dim,
            c.intermediate_size,
            c.rms_norm_eps,
        )
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, len(draft_vocab_ids), bias=False)
        draft_vocab_ids = draft_vocab_ids.sort().values
        self.register_buffer("d2t", draft_vocab_ids - torch.arange(len(draft_vocab_ids)))
        t2d = torch.zeros(c.vocab_size, dtype=torch.bool)
        t2d[draft_vocab_ids] = True
        self.register_buffer("t2d", t2d)
        target_to_draft = torch.full((c.vocab_size,), -100, dtype=torch.long)
        target_to_draft[draft_vocab_ids] = torch.arange(len(draft_vocab_ids))
        self.register_buffer("target_to_draft", target_to_draft, persistent=False)

    def rope(self, positions: torch.Tensor):
        inv_freq = 1.0 / self.rope_theta ** (
            torch.arange(0, self.head_dim, 2, device=positions.device).float() / self.head_dim
        )
        angles = positions.float()[:, None] * inv_freq[None]
        angles = torch.cat([angles, angles], dim=-1)
        return angles.cos(), angles.sin()

    def step_inputs(self, embeds, hidden, positions):
        """Layer input [input_layernorm(embed) ; hidden_norm(hidden)] projected to q, k, v."""
        layer = self.midlayer
        x = torch.cat([layer.input_layernorm(embeds), layer.hidden_norm(hidden)], dim=-1)
        return layer.self_attn.project(x, *self.rope(positions))

    def step_output(self, attn_out, hidden):
        """Residual over the hidden input, then the MLP block; returns the pre-norm output."""
        layer = self.midlayer
        batch, heads, seq, dim = attn_out.shape
        h = hidden + layer.self_attn.o_proj(attn_out.transpose(1, 2).reshape(batch, seq, heads * dim))
        return h + layer.mlp(layer.post_attention_layernorm(h))

    def logits(self, output):
        return self.lm_head(self.norm(output))

    def to_target_ids(self, draft_ids):
        return draft_ids + self.d2t[draft_ids]


def apply_rope(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def chain_attention(q, keys, values):
    """Step-j attention of every anchor a at once: keys[0] is the step-0 entry sequence
    (causal: anchor a sees positions 0..a), keys[1..j] are this chain's own entries, of which
    anchor a sees only its own (the same sequence index)."""
    scale = q.shape[-1] ** -0.5
    seq = q.shape[2]
    causal = torch.ones(seq, seq, dtype=torch.bool, device=q.device).tril()
    scores = [(q @ keys[0].transpose(-1, -2) * scale).float().masked_fill(~causal, float("-inf"))]
    scores += [((q * k).sum(-1, keepdim=True) * scale).float() for k in keys[1:]]
    probs = torch.cat(scores, dim=-1).softmax(-1).to(q.dtype)
    out = probs[..., :seq] @ values[0]
    for i, v in enumerate(values[1:]):
        out = out + probs[..., seq + i : seq + i + 1] * v
    return out


def unroll(
    draft: Eagle3Draft,
    embed: nn.Embedding,
    aux: torch.Tensor,
    next_tokens: torch.Tensor,
    num_steps: int,
    forced_tokens: list[torch.Tensor] | None = None,
) -> list[torch.Tensor]:
    """Runs `num_steps` chain steps from every anchor of a sequence at once.

    aux: [batch, seq, 3 * target_hidden], next_tokens: [batch, seq] = x_{t+1} for anchor t.
    forced_tokens[j - 1] ([batch, seq], target ids) is the step-j embedding input; without it the
    draft's own step-(j - 1) guesses are used (chain drafting as at inference).
    Returns the draft-vocabulary logits of every step, [batch, seq, draft_vocab] each."""
    positions = torch.arange(aux.shape[1], device=aux.device)
    hidden, tokens = draft.fc(aux), next_tokens
    keys, values, all_logits = [], [], []
    for step in range(num_steps):
        q, k, v = draft.step_inputs(embed(tokens), hidden, positions + step)
        keys.append(k)
        values.append(v)
        hidden = draft.step_output(chain_attention(q, keys, values), hidden)
        all_logits.append(draft.logits(hidden))
        if step + 1 < num_steps:
            tokens = (
                forced_tokens[step] if forced_tokens is not None else draft.to_target_ids(all_logits[-1].argmax(-1))
            )
    return all_logits


def draft_config(draft: Eagle3Draft) -> dict:
    c = draft.target_config
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": 1,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": draft.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": c.rms_norm_eps,
        "max_position_embeddings": c.max_position_embeddings,
        "rope_theta": draft.rope_theta,
        "rope_parameters": dict(c.rope_parameters),
        "vocab_size": c.vocab_size,
        "draft_vocab_size": draft.lm_head.out_features,
        "target_hidden_size": c.hidden_size,
        "tie_word_embeddings": False,
        "bos_token_id": None,
        "eos_token_id": c.eos_token_id,
        "pad_token_id": c.pad_token_id,
        "torch_dtype": "bfloat16",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": draft.aux_layer_ids},
    }


def save_draft(draft: Eagle3Draft, path: str) -> None:
    os.makedirs(path, exist_ok=True)
    tensors = {name: t.detach().to("cpu", torch.bfloat16).contiguous() for name, t in draft.named_parameters()}
    tensors["d2t"] = draft.d2t.to("cpu", torch.int64).contiguous()
    tensors["t2d"] = draft.t2d.to("cpu").contiguous()
    save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(draft_config(draft), f, indent=2)


def default_aux_layer_ids(num_layers: int) -> list[int]:
    return [1, num_layers // 2 - 1, num_layers - 4]
