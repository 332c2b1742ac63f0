"""The random-weights model maker: real shapes, a tokenizer of exactly the vocabulary size,
and a directory the engine loads like any checkpoint."""

import os

import torch

from sglang.tools import make_random_model as maker


def test_llama_8b_shapes_have_8b_parameters():
    shapes = maker.weight_shapes(maker.CONFIGS["llama-3.1-8b"])
    params = sum(torch.Size(s).numel() for s in shapes.values())
    assert 8.0e9 < params < 8.1e9  # Llama-3.1-8B has 8.03B
    assert shapes["model.layers.31.self_attn.k_proj.weight"] == (1024, 4096)


def test_tokenizer_has_exactly_the_vocabulary_size_and_round_trips():
    tokenizer = maker.build_tokenizer(2000)
    assert len(tokenizer) == 2000
    assert tokenizer.eos_token_id == 1999
    text = "def add(a, b):\n    return a + b  # héllo"
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_written_model_loads_and_generates(tmp_path, monkeypatch):
    tiny = dict(
        maker.CONFIGS["llama-3.2-1b"],
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=1024,
        max_position_embeddings=512,
        rope_scaling=None,
    )
    monkeypatch.setitem(maker.CONFIGS, "tiny", tiny)
    path = maker.make_random_model(str(tmp_path / "m"), "tiny", device="cpu")

    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.server_args import ServerArgs

    config = ModelConfig.from_path(path)
    assert config.dtype == torch.bfloat16  # "auto" keeps a 16-bit checkpoint's dtype
    scheduler = Scheduler(ServerArgs(model_path=path, device="cpu", dtype="bfloat16"))
    params = SamplingParams(max_new_tokens=5, temperature=0, ignore_eos=True)
    scheduler.add_request(TokenizedGenerateReqInput("r", [1, 2, 3, 4], params, stream=False))
    outputs = []
    while scheduler.has_work():
        out = scheduler.step()
        if out:
            outputs += out.new_token_ids[0]
    assert len(outputs) == 5 and all(0 <= t < 1024 for t in outputs)


def test_a_model_without_weights_serves_with_dummy_weights(tmp_path, monkeypatch):
    """--no-weights writes config.json and the tokenizer only; --load-format dummy serves it."""
    tiny = dict(
        maker.CONFIGS["llama-3.2-1b"],
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=1024,
        max_position_embeddings=512,
        rope_scaling=None,
    )
    monkeypatch.setitem(maker.CONFIGS, "tiny", tiny)
    path = maker.make_random_model(str(tmp_path / "m"), "tiny", device="cpu", weights=False)
    assert "config.json" in os.listdir(path) and "tokenizer.json" in os.listdir(path)
    assert not [f for f in os.listdir(path) if f.endswith((".safetensors", ".index.json"))]

    from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.server_args import ServerArgs

    scheduler = Scheduler(ServerArgs(model_path=path, device="cpu", dtype="bfloat16", load_format="dummy"))
    scheduler.add_request(
        TokenizedGenerateReqInput(
            "r", [1, 2, 3], SamplingParams(max_new_tokens=3, temperature=0, ignore_eos=True), stream=False
        )
    )
    tokens = []
    while scheduler.has_work():
        out = scheduler.step()
        if out:
            tokens += out.new_token_ids[0]
    assert len(tokens) == 3


def test_moe_shapes_have_their_models_parameters():
    counts = {
        name: sum(torch.Size(s).numel() for s in maker.weight_shapes(maker.CONFIGS[name]).values())
        for name in ("qwen3-30b-a3b", "qwen3-30b-a3b-12l", "mixtral-8x7b", "mixtral-8x7b-8l")
    }
    assert 30.4e9 < counts["qwen3-30b-a3b"] < 30.6e9  # Qwen3-30B-A3B: 30.5B
    assert 46.6e9 < counts["mixtral-8x7b"] < 46.8e9  # Mixtral-8x7B: 46.7B
    assert counts["qwen3-30b-a3b-12l"] < 8.2e9 and counts["mixtral-8x7b-8l"] < 12e9  # two servers fit one H100


def test_written_moe_models_match_transformers(tmp_path, monkeypatch):
    """The Hub's names: transformers and the engine read the same weights and agree."""
    from sglang.test.runner_utils import make_cpu_runner, prefill
    from transformers import AutoModelForCausalLM

    shrink = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    shrink.update(vocab_size=512, max_position_embeddings=512, num_experts_per_tok=2)
    tiny = {
        "tiny-qwen3-moe": dict(
            maker.CONFIGS["qwen3-30b-a3b"], **shrink, intermediate_size=96, moe_intermediate_size=32, num_experts=4
        ),
        "tiny-mixtral": dict(maker.CONFIGS["mixtral-8x7b"], **shrink, intermediate_size=32, num_local_experts=4),
    }
    prompt = list(range(3, 40, 3))
    for name, cfg in tiny.items():
        monkeypatch.setitem(maker.CONFIGS, name, cfg)
        path = maker.make_random_model(str(tmp_path / name), name, device="cpu")
        hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        with torch.no_grad():
            expected = hf(torch.tensor([prompt])).logits[0]
        got = prefill(make_cpu_runner(path), prompt).next_token_logits
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)
