"""Tiny random models written as real Hugging Face directories (config.json, safetensors,
tokenizer.json + tokenizer_config.json), for tests and quick starts without downloads.

    python -m sglang.test.tiny_models /tmp/tiny-llama --arch llama
"""

from __future__ import annotations

import argparse
import os

import torch

ARCHITECTURES = ("llama", "qwen2", "qwen3")  # the suite's shared fixtures, each served by engines
# Mistral runs Llama's code with another config.json: its tests compare the model and a scheduler's
# greedy tokens with transformers (test/srt/models) without engines of its own.
ALL_ARCHITECTURES = (*ARCHITECTURES, "mistral")
EOS_TOKEN = "<|endoftext|>"
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b\n",
    "Speculative decoding drafts tokens with a small model and verifies them with a large one.",
    "for i in range(10):\n    print(i * i)\n",
    "A radix tree shares the key-value cache of common prompt prefixes between requests.",
    "Hello, world! How are you today? I am fine, thank you.",
    "import torch\nx = torch.zeros(3, 4)\nprint(x.shape)\n",
    "Continuous batching lets requests join and leave the running batch between steps.",
]


def build_tokenizer(vocab_size: int = 384):
    """A byte-level BPE trained on a small fixed corpus, wrapped for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_CORPUS * 4, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token=EOS_TOKEN, pad_token=EOS_TOKEN, chat_template=CHAT_TEMPLATE
    )


def tiny_config(arch: str, vocab_size: int, eos_token_id: int, **overrides):
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    common = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        rms_norm_eps=1e-6,
        initializer_range=0.2,
        eos_token_id=eos_token_id,
        bos_token_id=None,
        pad_token_id=eos_token_id,
    )
    if arch == "llama":
        common["rope_scaling"] = {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 256,
        }
        config = LlamaConfig(**{**common, **overrides})
        config.architectures = ["LlamaForCausalLM"]
    elif arch == "qwen2":
        config = Qwen2Config(**{**common, "tie_word_embeddings": True, **overrides})
        config.architectures = ["Qwen2ForCausalLM"]
    elif arch == "qwen3":
        config = Qwen3Config(**{**common, "head_dim": 32, **overrides})
        config.architectures = ["Qwen3ForCausalLM"]
    elif arch == "mistral":
        # Mistral-7B-v0.3's settings: no sliding window (MistralConfig's default is v0.1's 4096), theta 1e6.
        config = MistralConfig(**{**common, "sliding_window": None, "rope_theta": 1e6, **overrides})
        config.architectures = ["MistralForCausalLM"]
    else:
        raise ValueError(f"arch must be one of {', '.join(ALL_ARCHITECTURES)}; got {arch!r}")
    return config


def make_tiny_model(
    path: str, arch: str = "llama", seed: int = 0, max_shard_size: str | None = None, **config_overrides
) -> str:
    """Writes a random float32 model of `arch` to `path` and returns `path`."""
    from transformers import AutoModelForCausalLM

    tokenizer = build_tokenizer()
    # A vocabulary larger than the tokenizer's is allowed (rows no text maps to), as in real checkpoints.
    vocab_size = config_overrides.pop("vocab_size", len(tokenizer))
    config = tiny_config(arch, vocab_size, tokenizer.eos_token_id, **config_overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _spread_norm_weights(model, seed)
    os.makedirs(path, exist_ok=True)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(path, **kwargs)
    tokenizer.save_pretrained(path)
    return path


def make_tiny_eagle3_draft(
    path: str,
    target_path: str,
    draft_vocab_size: int | None = None,
    seed: int = 0,
    aux_layer_ids: list[int] | None = None,
    dtype: torch.dtype = torch.float32,
) -> str:
    # Aux layers default to first / middle / last: tiny targets are too shallow for [1, L//2-1, L-4].
    """Writes a random EAGLE-3 draft (LlamaForCausalLMEagle3, float32) for the target at
    `target_path`: `midlayer.*`, `fc`, `norm`, `lm_head` and, with a reduced vocabulary of the
    `draft_vocab_size` lowest target ids shifted by one, `d2t` / `t2d`. Works for any target
    size (benchmarks make random drafts for 8B shapes with dtype bfloat16). Returns `path`."""
    import json

    from safetensors.torch import save_file
    from transformers import AutoConfig

    target = AutoConfig.from_pretrained(target_path)
    hidden, inter = target.hidden_size, target.intermediate_size
    heads, kv_heads = target.num_attention_heads, target.num_key_value_heads
    head_dim = getattr(target, "head_dim", None) or hidden // heads
    vocab = target.vocab_size
    draft_vocab = draft_vocab_size or vocab
    gen = torch.Generator().manual_seed(seed)

    def weight(*shape, scale=0.1):
        return (scale * torch.randn(*shape, generator=gen)).to(dtype)

    tensors = {
        "fc.weight": weight(hidden, 3 * hidden),
        "midlayer.self_attn.q_proj.weight": weight(heads * head_dim, 2 * hidden),
        "midlayer.self_attn.k_proj.weight": weight(kv_heads * head_dim, 2 * hidden),
        "midlayer.self_attn.v_proj.weight": weight(kv_heads * head_dim, 2 * hidden),
        "midlayer.self_attn.o_proj.weight": weight(hidden, heads * head_dim),
        "midlayer.mlp.gate_proj.weight": weight(inter, hidden),
        "midlayer.mlp.up_proj.weight": weight(inter, hidden),
        "midlayer.mlp.down_proj.weight": weight(hidden, inter),
        "midlayer.input_layernorm.weight": 1 + weight(hidden),
        "midlayer.hidden_norm.weight": 1 + weight(hidden),
        "midlayer.post_attention_layernorm.weight": 1 + weight(hidden),
        "norm.weight": 1 + weight(hidden),
        "lm_head.weight": weight(draft_vocab, hidden, scale=0.5),
    }
    if draft_vocab != vocab:  # draft id i is target id i + 1 (id 0 is left out)
        tensors["d2t"] = torch.ones(draft_vocab, dtype=torch.int64)
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[1 : draft_vocab + 1] = True
        tensors["t2d"] = t2d
    os.makedirs(path, exist_ok=True)
    save_file({name: t.contiguous() for name, t in tensors.items()}, os.path.join(path, "model.safetensors"))
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": 1,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": target.rms_norm_eps,
        "max_position_embeddings": target.max_position_embeddings,
        "rope_theta": 10000.0,
        "vocab_size": vocab,
        "draft_vocab_size": draft_vocab,
        "target_hidden_size": hidden,
        "torch_dtype": str(dtype).removeprefix("torch."),
    }
    layers = target.num_hidden_layers
    aux = aux_layer_ids if aux_layer_ids is not None else [0, layers // 2, layers - 1]
    config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": aux}
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return path


def _spread_norm_weights(model, seed: int) -> None:
    # Norm weights start at exactly 1; perturb them so a loader that drops one is caught.
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1 + 0.2 * torch.randn(param.shape, generator=gen))


def main() -> None:
    parser = argparse.ArgumentParser(description="Write a tiny random Hugging Face model directory.")
    parser.add_argument("path")
    parser.add_argument("--arch", choices=ALL_ARCHITECTURES, default="llama")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(make_tiny_model(args.path, args.arch, args.seed))


if __name__ == "__main__":
    main()
