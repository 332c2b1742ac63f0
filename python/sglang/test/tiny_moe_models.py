"""Tiny random mixture-of-experts models (Qwen3-MoE, Qwen2-MoE, Mixtral) written as Hugging Face
directories with each family's config keys and per-expert tensor names as published on the Hub
(`mlp.experts.{e}.gate_proj` for Qwen, `block_sparse_moe.experts.{e}.w1` for Mixtral).

    python -m sglang.test.tiny_moe_models /tmp/tiny-qwen3-moe --arch qwen3_moe
"""

from __future__ import annotations

import argparse
import json
import os

import torch

from sglang.test.tiny_models import _spread_norm_weights, build_tokenizer

MOE_ARCHITECTURES = ("qwen3_moe", "qwen2_moe", "mixtral")

_COMMON = dict(
    hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
    rms_norm_eps=1e-6,
    initializer_range=0.2,
)


def tiny_moe_config(arch: str, vocab_size: int, eos_token_id: int, **overrides):
    from transformers import MixtralConfig, Qwen2MoeConfig, Qwen3MoeConfig

    ids = dict(vocab_size=vocab_size, eos_token_id=eos_token_id, bos_token_id=None, pad_token_id=eos_token_id)
    if arch == "qwen3_moe":
        # Qwen3-30B-A3B's layout, shrunk: top-k renormalised; layer 1 dense (`mlp_only_layers`).
        settings = dict(
            num_hidden_layers=3,
            head_dim=32,
            intermediate_size=128,
            moe_intermediate_size=32,
            num_experts=8,
            num_experts_per_tok=2,
            norm_topk_prob=True,
            mlp_only_layers=[1],
        )
        config = Qwen3MoeConfig(**{**_COMMON, **ids, **settings, **overrides})
        config.architectures = ["Qwen3MoeForCausalLM"]
    elif arch == "qwen2_moe":
        # Qwen1.5-MoE-A2.7B's layout, shrunk: a shared expert, top-k weights not renormalised.
        settings = dict(
            num_hidden_layers=2,
            intermediate_size=128,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=64,
            num_experts=4,
            num_experts_per_tok=2,
            norm_topk_prob=False,
        )
        config = Qwen2MoeConfig(**{**_COMMON, **ids, **settings, **overrides})
        config.architectures = ["Qwen2MoeForCausalLM"]
    elif arch == "mixtral":
        settings = dict(num_hidden_layers=2, intermediate_size=64, num_local_experts=4, num_experts_per_tok=2)
        config = MixtralConfig(**{**_COMMON, **ids, **settings, **overrides})
        config.architectures = ["MixtralForCausalLM"]
    else:
        raise ValueError(f"arch must be one of {', '.join(MOE_ARCHITECTURES)}; got {arch!r}")
    return config


def make_tiny_moe_model(path: str, arch: str = "qwen3_moe", seed: int = 0, **config_overrides) -> str:
    """Writes a random float32 MoE model of `arch` to `path` and returns `path`."""
    from transformers import AutoModelForCausalLM

    tokenizer = build_tokenizer()
    config = tiny_moe_config(arch, len(tokenizer), tokenizer.eos_token_id, **config_overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _spread_norm_weights(model, seed)
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    if arch == "qwen3_moe":
        _use_hub_key(path, saved="num_local_experts", hub="num_experts")
    return path


def _use_hub_key(path: str, saved: str, hub: str) -> None:
    # transformers 5 writes Qwen3-MoE's expert count under its internal name; the Hub's configs
    # (Qwen3-30B-A3B, Qwen3-235B-A22B) say `num_experts`.
    config_path = os.path.join(path, "config.json")
    with open(config_path) as f:
        config = json.load(f)
    if saved in config:
        config[hub] = config.pop(saved)
        with open(config_path, "w") as f:
            json.dump(config, f, indent=2)


def main() -> None:
    parser = argparse.ArgumentParser(description="Write a tiny random mixture-of-experts model directory.")
    parser.add_argument("path")
    parser.add_argument("--arch", choices=MOE_ARCHITECTURES, default="qwen3_moe")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(make_tiny_moe_model(args.path, args.arch, args.seed))


if __name__ == "__main__":
    main()
