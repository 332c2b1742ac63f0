"""The random-weights model maker: real shapes, a tokenizer of exactly the vocabulary size,
and a directory the engine loads like any checkpoint."""

import json
import os

import pytest
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


# 128-multiple widths: block-wise FP8 keeps each projection on whole 128-row scale blocks.
TINY_FP8 = dict(
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=2,
    head_dim=64,
    vocab_size=1024,
    max_position_embeddings=512,
    rope_scaling=None,
    tie_word_embeddings=False,
)


@pytest.mark.parametrize("fp8", ["block", "channel"])
def test_fp8_models_store_e4m3_linears_with_the_scales_of_their_bfloat16_weights(tmp_path, monkeypatch, fp8):
    """--fp8 quantizes the weights --fp8 off writes (same seed): each e4m3 entry times its block's
    or row's scale is the bfloat16 weight within e4m3's rounding; embeddings, head and norms stay
    bfloat16, config.json says the layout, and the engine loads it as written."""
    from safetensors.torch import load_file

    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.layers.quantization.fp8 import WeightScales, dequantize_weight
    from sglang.srt.model_loader.loader import load_model

    monkeypatch.setitem(maker.CONFIGS, "tiny", dict(maker.CONFIGS["llama-3.2-1b"], **TINY_FP8))
    plain = load_file(_only_shard(maker.make_random_model(str(tmp_path / "bf16"), "tiny", device="cpu")))
    path = maker.make_random_model(str(tmp_path / fp8), "tiny", device="cpu", fp8=fp8)
    stored = load_file(_only_shard(path))
    scale_name, scales = (
        ("weight_scale_inv", WeightScales.BLOCK) if fp8 == "block" else ("weight_scale", WeightScales.CHANNEL)
    )
    for name in ("model.layers.0.self_attn.k_proj", "model.layers.1.mlp.down_proj"):
        weight, scale = stored[f"{name}.weight"], stored[f"{name}.{scale_name}"]
        assert weight.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32
        rows, cols = weight.shape
        assert scale.shape == ((rows // 128, cols // 128) if fp8 == "block" else (rows, 1))
        want = plain[f"{name}.weight"].float()
        got = dequantize_weight(weight, scale, scales)
        # e4m3 rounds within 2^-4 of a normal value; below 2^-6 (times the scale) in steps of 2^-9
        full_scale = dequantize_weight(torch.ones_like(weight, dtype=torch.float32), scale, scales)
        assert ((got - want).abs() <= want.abs() * 2**-4 + full_scale * 2**-10).all(), name
    for name in ("model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"):
        assert stored[name].dtype == torch.bfloat16 and torch.equal(stored[name], plain[name])
    with open(os.path.join(path, "config.json")) as f:
        method = json.load(f)["quantization_config"]["quant_method"]
    assert method == ("fp8" if fp8 == "block" else "compressed-tensors")
    params = dict(load_model(ModelConfig.from_path(path), "cpu").named_parameters())
    assert params["model.layers.0.self_attn.qkv_proj.weight"].dtype == torch.float8_e4m3fn
    assert torch.equal(
        params["model.layers.1.mlp.down_proj.weight"].float(), stored["model.layers.1.mlp.down_proj.weight"].float()
    )
    assert params["lm_head.weight"].dtype == torch.bfloat16


@pytest.mark.parametrize("fp8", ["block", "channel"])
def test_fp8_config_without_weights_gives_dummy_fp8_layers_of_llama_8b_shapes(tmp_path, monkeypatch, fp8):
    """python -m sglang.tools.make_random_model OUT --config llama-3.1-8b --fp8 ... --no-weights, then
    --load-format dummy: the model is built with FP8 linear layers of Llama-3.1-8B's shapes and their
    scales (built on the meta device here: shapes and dtypes without the memory), and its weights
    take the bytes an FP8 checkpoint of it holds."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader.loader import load_model, weight_bytes

    out = str(tmp_path / "llama8b")
    monkeypatch.setattr(
        "sys.argv", ["make_random_model", out, "--config", "llama-3.1-8b", "--fp8", fp8, "--no-weights"]
    )
    maker.main()
    config = ModelConfig.from_path(out)
    params = dict(load_model(config, "meta", load_format="dummy").named_parameters())
    qkv, down = "model.layers.31.self_attn.qkv_proj", "model.layers.31.mlp.down_proj"
    assert params[f"{qkv}.weight"].shape == (6144, 4096) and params[f"{qkv}.weight"].dtype == torch.float8_e4m3fn
    assert params[f"{down}.weight"].shape == (4096, 14336) and params[f"{down}.weight"].dtype == torch.float8_e4m3fn
    if fp8 == "block":
        assert params[f"{qkv}.weight_scale_inv"].shape == (48, 32)
        assert params[f"{down}.weight_scale_inv"].shape == (32, 112)
    else:
        assert params[f"{qkv}.weight_scale"].shape == (6144, 1)
        assert params[f"{down}.weight_scale"].shape == (4096, 1)
    assert params["model.embed_tokens.weight"].dtype == params["lm_head.weight"].dtype == torch.bfloat16
    shapes = maker.weight_shapes(maker.CONFIGS["llama-3.1-8b"])
    linear = sum(torch.Size(s).numel() for n, s in shapes.items() if n.endswith("_proj.weight"))
    other = sum(torch.Size(s).numel() for n, s in shapes.items() if not n.endswith("_proj.weight"))
    rows = sum(s[0] for n, s in shapes.items() if n.endswith("_proj.weight"))
    blocks = sum(-(-s[0] // 128) * -(-s[1] // 128) for n, s in shapes.items() if n.endswith("_proj.weight"))
    scales = 4 * (blocks if fp8 == "block" else rows)
    assert weight_bytes(config, "dummy") == linear + 2 * other + scales


def test_fp8_dummy_weights_serve(tmp_path, monkeypatch):
    from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.server_args import ServerArgs

    monkeypatch.setitem(maker.CONFIGS, "tiny", dict(maker.CONFIGS["llama-3.2-1b"], **TINY_FP8))
    path = maker.make_random_model(str(tmp_path / "m"), "tiny", device="cpu", weights=False, fp8="channel")
    scheduler = Scheduler(ServerArgs(model_path=path, device="cpu", load_format="dummy"))
    params = SamplingParams(max_new_tokens=3, temperature=0, ignore_eos=True)
    scheduler.add_request(TokenizedGenerateReqInput("r", [1, 2, 3], params, stream=False))
    tokens = []
    while scheduler.has_work():
        out = scheduler.step()
        if out:
            tokens += out.new_token_ids[0]
    assert len(tokens) == 3 and all(0 <= t < 1024 for t in tokens)


def test_fp8_channel_of_a_mixture_of_experts_config_is_refused_before_writing(tmp_path):
    with pytest.raises(ValueError, match="--fp8 channel: mixtral-8x7b is a mixture-of-experts model, whose experts"):
        maker.make_random_model(str(tmp_path / "moe"), "mixtral-8x7b", device="cpu", fp8="channel")
    assert not os.path.exists(tmp_path / "moe")


def test_fp8_moe_config_without_weights_gives_dummy_fp8_experts_of_qwen3_30b_shapes(tmp_path, monkeypatch):
    """--config qwen3-30b-a3b --fp8 block --no-weights, then --load-format dummy: Qwen3-30B-A3B-FP8's
    layout (built on the meta device): every layer's 128 experts stacked in e4m3 with their block
    scales, the routers in bfloat16 (listed in modules_to_not_convert, as the published config
    lists them), and the weights take the bytes the FP8 checkpoint holds."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader.loader import load_model, weight_bytes

    out = str(tmp_path / "qwen3-30b-fp8")
    monkeypatch.setattr(
        "sys.argv", ["make_random_model", out, "--config", "qwen3-30b-a3b", "--fp8", "block", "--no-weights"]
    )
    maker.main()
    with open(os.path.join(out, "config.json")) as f:
        ignore = json.load(f)["quantization_config"]["modules_to_not_convert"]
    assert "lm_head" in ignore and "model.layers.47.mlp.gate" in ignore
    config = ModelConfig.from_path(out)
    params = dict(load_model(config, "meta", load_format="dummy").named_parameters())
    experts = "model.layers.47.mlp.experts"
    assert params[f"{experts}.w13_weight"].shape == (128, 1536, 2048)
    assert params[f"{experts}.w2_weight"].shape == (128, 2048, 768)
    assert params[f"{experts}.w13_weight"].dtype == params[f"{experts}.w2_weight"].dtype == torch.float8_e4m3fn
    assert params[f"{experts}.w13_weight_scale_inv"].shape == (128, 12, 16)
    assert params[f"{experts}.w2_weight_scale_inv"].shape == (128, 16, 6)
    assert params["model.layers.47.mlp.gate.weight"].dtype == torch.bfloat16
    assert params["model.layers.47.self_attn.qkv_proj.weight"].dtype == torch.float8_e4m3fn
    shapes = maker.weight_shapes(maker.CONFIGS["qwen3-30b-a3b"])
    projections = {n: s for n, s in shapes.items() if n.endswith("_proj.weight")}
    linear = sum(torch.Size(s).numel() for s in projections.values())
    other = sum(torch.Size(s).numel() for n, s in shapes.items() if n not in projections)
    blocks = sum(-(-s[0] // 128) * -(-s[1] // 128) for s in projections.values())
    assert weight_bytes(config, "dummy") == linear + 2 * other + 4 * blocks


def test_fp8_moe_model_is_written_with_fp8_experts_and_serves(tmp_path, monkeypatch):
    """A tiny Qwen3-MoE written with --fp8 block: each expert's projections in e4m3 with their
    block scales, the router in bfloat16; the engine loads it and decodes; so do dummy weights."""
    from safetensors import safe_open

    from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.server_args import ServerArgs

    tiny = dict(maker.CONFIGS["qwen3-30b-a3b"], **TINY_FP8)
    monkeypatch.setitem(
        maker.CONFIGS, "tiny-moe", dict(tiny, moe_intermediate_size=96, num_experts=4, num_experts_per_tok=2)
    )
    path = maker.make_random_model(str(tmp_path / "m"), "tiny-moe", device="cpu", fp8="block")
    with safe_open(_only_shard(path), "pt") as f:
        assert f.get_tensor("model.layers.1.mlp.experts.3.up_proj.weight").dtype == torch.float8_e4m3fn
        assert f.get_tensor("model.layers.1.mlp.experts.3.down_proj.weight_scale_inv").shape == (1, 1)
        assert f.get_tensor("model.layers.1.mlp.gate.weight").dtype == torch.bfloat16
    for load_format in ("auto", "dummy"):
        scheduler = Scheduler(ServerArgs(model_path=path, device="cpu", load_format=load_format))
        experts = scheduler.tp_worker.model_runner.model.model.layers[1].mlp.experts
        assert experts.w13_weight.dtype == torch.float8_e4m3fn
        params = SamplingParams(max_new_tokens=3, temperature=0, ignore_eos=True)
        scheduler.add_request(TokenizedGenerateReqInput("r", [1, 2, 3], params, stream=False))
        tokens = []
        while scheduler.has_work():
            out = scheduler.step()
            if out:
                tokens += out.new_token_ids[0]
        assert len(tokens) == 3 and all(0 <= t < 1024 for t in tokens)


def _only_shard(path: str) -> str:
    (shard,) = [f for f in os.listdir(path) if f.endswith(".safetensors")]
    return os.path.join(path, shard)
