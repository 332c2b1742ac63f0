"""Write a Hugging Face model directory with a real model's shapes and random weights.

    python -m sglang.tools.make_random_model OUT_DIR --config llama-3.1-8b [--device cuda] [--fp8 block|channel]

Speed depends on shapes, not weight values, so benchmarks use these instead of downloads.
Weights are drawn on the device (the GPU when there is one) in bfloat16 and written as
sharded safetensors; the tokenizer is a byte-level BPE whose vocabulary has exactly the
config's size, so every token id a benchmark samples decodes and the model accepts it.
With --no-weights only config.json and the tokenizer are written: enough for a server run
with --load-format dummy, which draws random weights itself (seconds instead of minutes for
8B shapes).
With --fp8 the linear layers are stored in FP8 as published checkpoints store them (embeddings,
head and norms stay bfloat16): `block` as Qwen3-*-FP8 / DeepSeek-V3 (config.json `quant_method:
fp8`, e4m3 weights with a `weight_scale_inv` per 128 x 128 block, activations quantized per
1 x 128 group), `channel` as RedHat's FP8-dynamic (compressed-tensors `float-quantized`, a
`weight_scale` per output row, activations quantized per token). A mixture-of-experts config's
experts go block-wise only (`block`, as Qwen3-30B-A3B-FP8: every expert's projections in e4m3, the
routers listed in `modules_to_not_convert` with the head and norms). With --no-weights the config
alone says so, and --load-format dummy builds the FP8 layers and experts.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
from safetensors.torch import save_file

from sglang.tools.fp8_checkpoint import is_quantized_weight, quantized_tensors, write_quantization_settings

_LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}

CONFIGS = {
    "llama-3.1-8b": dict(
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=128256,
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        rope_scaling=_LLAMA3_ROPE,
        tie_word_embeddings=False,
    ),
    "llama-3.2-1b": dict(
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        vocab_size=128256,
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        rope_scaling={**_LLAMA3_ROPE, "factor": 32.0},
        tie_word_embeddings=True,
    ),
    "qwen2.5-1.5b": dict(
        architectures=["Qwen2ForCausalLM"],
        model_type="qwen2",
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        vocab_size=151936,
        max_position_embeddings=32768,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
    ),
    # Mixture-of-experts: Qwen3-30B-A3B (61 GB in bf16) and a 12-layer cut of it (16 GB: two
    # servers fit one H100; an 8-layer one, 11 GB: five), Mixtral-8x7B (93 GB) and an 8-layer cut (23 GB).
    "qwen3-30b-a3b": dict(
        architectures=["Qwen3MoeForCausalLM"],
        model_type="qwen3_moe",
        hidden_size=2048,
        intermediate_size=6144,
        moe_intermediate_size=768,
        num_hidden_layers=48,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=128,
        num_experts=128,
        num_experts_per_tok=8,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        vocab_size=151936,
        max_position_embeddings=40960,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        tie_word_embeddings=False,
    ),
    "mixtral-8x7b": dict(
        architectures=["MixtralForCausalLM"],
        model_type="mixtral",
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        num_local_experts=8,
        num_experts_per_tok=2,
        vocab_size=32000,
        max_position_embeddings=32768,
        rms_norm_eps=1e-5,
        rope_theta=1000000.0,
        sliding_window=None,
        tie_word_embeddings=False,
    ),
}
CONFIGS["qwen3-30b-a3b-12l"] = dict(CONFIGS["qwen3-30b-a3b"], num_hidden_layers=12)
CONFIGS["qwen3-30b-a3b-8l"] = dict(CONFIGS["qwen3-30b-a3b"], num_hidden_layers=8)  # five servers on one H100
CONFIGS["mixtral-8x7b-8l"] = dict(CONFIGS["mixtral-8x7b"], num_hidden_layers=8)
SHARD_BYTES = 5 << 30
INIT_STD = 0.02
FP8_LAYOUTS = {"block": "fp8-block", "channel": "ct-channel-dynamic"}  # --fp8 -> tools.fp8_checkpoint layout
FP8_IGNORE = ["lm_head"]  # the head stays in bfloat16, as in the published FP8 checkpoints


def fp8_ignore(cfg: dict) -> list[str]:
    """`modules_to_not_convert`: the head, and in a mixture-of-experts model each layer's norms and
    router, as Qwen3-30B-A3B-FP8's config.json lists them."""
    if not is_moe(cfg):
        return FP8_IGNORE
    router = "block_sparse_moe.gate" if cfg["model_type"] == "mixtral" else "mlp.gate"
    modules = ("input_layernorm", router, "post_attention_layernorm")
    return FP8_IGNORE + [f"model.layers.{i}.{m}" for i in range(cfg["num_hidden_layers"]) for m in modules]


def is_moe(cfg: dict) -> bool:
    return "num_experts" in cfg or "num_local_experts" in cfg


def weight_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    hidden = cfg["hidden_size"]
    head_dim = cfg.get("head_dim") or hidden // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * head_dim, cfg["num_key_value_heads"] * head_dim
    shapes = {"model.embed_tokens.weight": (cfg["vocab_size"], hidden), "model.norm.weight": (hidden,)}
    qkv_bias = cfg["model_type"] == "qwen2"
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update(
            {
                p + "input_layernorm.weight": (hidden,),
                p + "post_attention_layernorm.weight": (hidden,),
                p + "self_attn.q_proj.weight": (q, hidden),
                p + "self_attn.k_proj.weight": (kv, hidden),
                p + "self_attn.v_proj.weight": (kv, hidden),
                p + "self_attn.o_proj.weight": (hidden, q),
                **_feed_forward_shapes(cfg, i, p),
            }
        )
        if cfg["model_type"] == "qwen3_moe":
            shapes.update({p + "self_attn.q_norm.weight": (head_dim,), p + "self_attn.k_norm.weight": (head_dim,)})
        if qkv_bias:
            shapes.update(
                {
                    p + "self_attn.q_proj.bias": (q,),
                    p + "self_attn.k_proj.bias": (kv,),
                    p + "self_attn.v_proj.bias": (kv,),
                }
            )
    if not cfg["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (cfg["vocab_size"], hidden)
    return shapes


def _feed_forward_shapes(cfg: dict, layer: int, p: str) -> dict[str, tuple[int, ...]]:
    """A layer's dense MLP, or its router and per-expert projections under the Hub's names."""
    hidden, inter = cfg["hidden_size"], cfg["intermediate_size"]
    if cfg["model_type"] == "mixtral":
        block, (gate, up, down), expert_inter = "block_sparse_moe", ("w1", "w3", "w2"), inter
    elif cfg["model_type"] == "qwen3_moe" and layer not in cfg["mlp_only_layers"]:
        block, (gate, up, down), expert_inter = (
            "mlp",
            ("gate_proj", "up_proj", "down_proj"),
            cfg["moe_intermediate_size"],
        )
    else:
        return {
            p + "mlp.gate_proj.weight": (inter, hidden),
            p + "mlp.up_proj.weight": (inter, hidden),
            p + "mlp.down_proj.weight": (hidden, inter),
        }
    num_experts = cfg.get("num_experts") or cfg["num_local_experts"]
    shapes = {f"{p}{block}.gate.weight": (num_experts, hidden)}
    for e in range(num_experts):
        expert = f"{p}{block}.experts.{e}."
        shapes[expert + f"{gate}.weight"] = (expert_inter, hidden)
        shapes[expert + f"{up}.weight"] = (expert_inter, hidden)
        shapes[expert + f"{down}.weight"] = (hidden, expert_inter)
    return shapes


def write_weights(out_dir: str, cfg: dict, device: str, seed: int, fp8_layout: str | None = None) -> int:
    """Random bfloat16 weights (norms ones) in shards of about SHARD_BYTES, each linear weight
    quantized as `fp8_layout` stores it when given; returns the bytes of all tensors written."""
    gen = torch.Generator(device=device).manual_seed(seed)
    ignore = fp8_ignore(cfg)
    shard, shard_bytes, shards, weight_map, total = {}, 0, [], {}, 0
    for name, shape in weight_shapes(cfg).items():
        if name.endswith("norm.weight"):
            tensor = torch.ones(shape, dtype=torch.bfloat16, device=device)
        else:
            tensor = torch.empty(shape, dtype=torch.bfloat16, device=device).normal_(0, INIT_STD, generator=gen)
        stored = {name: tensor}
        if fp8_layout is not None and is_quantized_weight(name, ignore):
            stored = quantized_tensors(name, tensor, fp8_layout)
        for stored_name, stored_tensor in stored.items():
            shard[stored_name] = stored_tensor.cpu()
            shard_bytes += stored_tensor.nbytes
        if shard_bytes >= SHARD_BYTES:
            shards.append(shard)
            shard, shard_bytes = {}, 0
    if shard:
        shards.append(shard)
    for i, tensors in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(tensors, os.path.join(out_dir, file), metadata={"format": "pt"})
        weight_map.update({name: file for name in tensors})
        total += sum(t.nbytes for t in tensors.values())
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    return total


def build_tokenizer(vocab_size: int, eos_token: str = "<|eot_id|>"):
    """A byte-level BPE with exactly `vocab_size` tokens: the 256 byte symbols, then merges of
    two and three symbols, then `eos_token` as the last id."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {symbol: i for i, symbol in enumerate(alphabet)}
    merges = []
    num_regular = vocab_size - 1
    pairs = ((a, b) for a in alphabet for b in alphabet)
    triples = ((a + b, c) for a in alphabet for b in alphabet for c in alphabet)
    for left, right in _chain(pairs, triples):
        if len(vocab) >= num_regular:
            break
        if left in vocab and left + right not in vocab:
            vocab[left + right] = len(vocab)
            merges.append((left, right))
    vocab[eos_token] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([eos_token])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=eos_token, chat_template=_CHAT_TEMPLATE)


_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def _chain(*iterables):
    for it in iterables:
        yield from it


def make_random_model(
    out_dir: str,
    config: str,
    device: str | None = None,
    seed: int = 0,
    weights: bool = True,
    fp8: str | None = None,
) -> str:
    """`fp8`: None (bfloat16) or a key of FP8_LAYOUTS."""
    if config not in CONFIGS:
        raise ValueError(f"--config must be one of {', '.join(CONFIGS)}; got {config!r}")
    if fp8 is not None and fp8 not in FP8_LAYOUTS:
        raise ValueError(f"--fp8 must be one of {', '.join(FP8_LAYOUTS)}; got {fp8!r}")
    if fp8 not in (None, "block") and is_moe(CONFIGS[config]):
        raise ValueError(
            f"--fp8 {fp8}: {config} is a mixture-of-experts model, whose experts are served in FP8 block-wise only"
        )
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    cfg = dict(CONFIGS[config], torch_dtype="bfloat16")
    os.makedirs(out_dir, exist_ok=True)
    tokenizer = build_tokenizer(cfg["vocab_size"])
    assert len(tokenizer) == cfg["vocab_size"], (len(tokenizer), cfg["vocab_size"])
    cfg["eos_token_id"] = tokenizer.eos_token_id
    cfg["bos_token_id"] = None
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": tokenizer.eos_token_id, "do_sample": False}, f)
    tokenizer.save_pretrained(out_dir)
    layout = FP8_LAYOUTS[fp8] if fp8 is not None else None
    if layout is not None:
        write_quantization_settings(out_dir, layout, fp8_ignore(cfg))
    if weights:
        write_weights(out_dir, cfg, device, seed, layout)
    return out_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--config", default="llama-3.1-8b", choices=sorted(CONFIGS))
    parser.add_argument("--device", default=None, help="where to draw the weights (default: cuda if available)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--no-weights",
        action="store_true",
        help="write config.json and the tokenizer only, for a server run with --load-format dummy",
    )
    parser.add_argument(
        "--fp8",
        choices=sorted(FP8_LAYOUTS),
        default=None,
        help="store the linear layers in FP8: block (quant_method fp8, 128 x 128 weight blocks) or channel "
        "(compressed-tensors per-channel weights, dynamic per-token activations)",
    )
    args = parser.parse_args()
    start = time.perf_counter()
    make_random_model(args.out_dir, args.config, args.device, args.seed, weights=not args.no_weights, fp8=args.fp8)
    fp8 = f" (FP8 {args.fp8})" if args.fp8 else ""
    print(f"wrote {args.config}{fp8} to {args.out_dir} in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
