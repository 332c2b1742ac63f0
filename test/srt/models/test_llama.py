"""Llama, Qwen2, Qwen3 and Mistral against transformers on the same checkpoint: logits at every
prompt position, the EAGLE-3 aux hidden states, tied embeddings, Qwen3's q/k norms, Llama 3 rope
scaling past the original context, and Mistral's greedy tokens through a scheduler.

The models have 4 layers so that layers 0-2 are all inner layers: transformers' last
hidden_states entry is after the final norm, while a captured layer is the raw residual stream.
"""

import pytest
import torch
from safetensors import safe_open
from sglang.test.runner_utils import OneRank, make_cpu_runner, prefill
from sglang.test.tiny_models import make_tiny_model
from transformers import AutoConfig, AutoModelForCausalLM

ARCHS = ("llama", "qwen2", "qwen3", "mistral")
NUM_LAYERS = 4
VOCAB_SIZE = 384
ATOL = 1e-4


def random_prompt(num_tokens, seed):
    return torch.randint(1, VOCAB_SIZE, (num_tokens,), generator=torch.Generator().manual_seed(seed)).tolist()


SHORT_PROMPT = random_prompt(20, seed=1)
LONG_PROMPT = random_prompt(300, seed=2)


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    return {
        arch: make_tiny_model(str(tmp_path_factory.mktemp(arch)), arch, seed=i, num_hidden_layers=NUM_LAYERS)
        for i, arch in enumerate(ARCHS)
    }


@pytest.fixture(scope="module")
def runners(model_dirs):
    return {arch: make_runner(path) for arch, path in model_dirs.items()}


@pytest.fixture(scope="module")
def hf_models(model_dirs):
    return {
        arch: AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        for arch, path in model_dirs.items()
    }


def make_runner(path):
    return make_cpu_runner(path)


@torch.no_grad()
def hf_forward(model, token_ids):
    return model(torch.tensor([token_ids]), output_hidden_states=True)


def checkpoint_tensor(path, name):
    with safe_open(f"{path}/model.safetensors", framework="pt") as f:
        return f.get_tensor(name)


@pytest.mark.parametrize("arch", ARCHS)
def test_logits_at_every_position_match_transformers(arch, runners, hf_models):
    out = prefill(runners[arch], SHORT_PROMPT)
    expected = hf_forward(hf_models[arch], SHORT_PROMPT).logits[0]
    assert out.next_token_logits.shape == (len(SHORT_PROMPT), VOCAB_SIZE)
    torch.testing.assert_close(out.next_token_logits, expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_aux_hidden_states_are_residual_stream_after_each_captured_layer(arch, runners, hf_models):
    layer_ids = [0, 1, 2]
    out = prefill(runners[arch], SHORT_PROMPT, capture_layers=layer_ids)
    hidden_states = hf_forward(hf_models[arch], SHORT_PROMPT).hidden_states
    captured = out.aux_hidden_states.split(hf_models[arch].config.hidden_size, dim=-1)
    assert len(captured) == len(layer_ids)
    for layer_id, aux in zip(layer_ids, captured):
        torch.testing.assert_close(aux, hidden_states[layer_id + 1][0], atol=ATOL, rtol=0)


def test_capturing_the_last_layer_gives_the_stream_before_the_final_norm(runners, hf_models):
    model = hf_models["llama"]
    last_layer_out = []
    hook = model.model.layers[-1].register_forward_hook(
        lambda module, args, output: last_layer_out.append(output[0] if isinstance(output, tuple) else output)
    )
    try:
        hidden_states = hf_forward(model, SHORT_PROMPT).hidden_states
    finally:
        hook.remove()
    aux = prefill(runners["llama"], SHORT_PROMPT, capture_layers=[NUM_LAYERS - 1]).aux_hidden_states
    torch.testing.assert_close(aux, last_layer_out[0][0], atol=ATOL, rtol=0)
    # transformers' last entry is normed, so it must not be what was captured.
    assert not torch.allclose(aux, hidden_states[-1][0], atol=1e-2)


def test_aux_hidden_states_are_not_returned_unless_asked(runners):
    runner = runners["qwen3"]
    runner.model.set_eagle3_layers_to_capture([1])
    assert prefill(runner, SHORT_PROMPT).aux_hidden_states is None


def test_qwen2_ties_lm_head_to_embed_tokens(runners, model_dirs):
    model = runners["qwen2"].model
    assert model.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    embedding = checkpoint_tensor(model_dirs["qwen2"], "model.embed_tokens.weight")
    assert torch.equal(model.lm_head.weight, embedding)


def test_llama_keeps_its_own_lm_head(runners, model_dirs):
    model = runners["llama"].model
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    assert torch.equal(model.lm_head.weight, checkpoint_tensor(model_dirs["llama"], "lm_head.weight"))


@pytest.mark.parametrize("norm", ["q_norm", "k_norm"])
def test_qwen3_qk_norm_weights_come_from_the_checkpoint(runners, model_dirs, norm):
    layers = runners["qwen3"].model.model.layers
    for i, layer in enumerate(layers):
        expected = checkpoint_tensor(model_dirs["qwen3"], f"model.layers.{i}.self_attn.{norm}.weight")
        assert not torch.equal(expected, torch.ones_like(expected))  # else the check proves nothing
        assert torch.equal(getattr(layer.self_attn, norm).weight, expected)


def test_llama3_rope_scaling_matches_transformers_past_original_context(runners, hf_models, model_dirs):
    rope = AutoConfig.from_pretrained(model_dirs["llama"]).rope_parameters
    assert rope["rope_type"] == "llama3" and rope["original_max_position_embeddings"] < len(LONG_PROMPT)
    out = prefill(runners["llama"], LONG_PROMPT)
    expected = hf_forward(hf_models["llama"], LONG_PROMPT).logits[0]
    torch.testing.assert_close(out.next_token_logits, expected, atol=ATOL, rtol=0)


def test_llama3_rope_scaling_changes_logits_past_original_context(model_dirs, hf_models):
    """The comparison above can fail: the same weights with unscaled rope give other logits."""
    config = AutoConfig.from_pretrained(model_dirs["llama"])
    config.rope_parameters = {"rope_type": "default", "rope_theta": config.rope_parameters["rope_theta"]}
    unscaled = AutoModelForCausalLM.from_pretrained(model_dirs["llama"], config=config, dtype=torch.float32)
    scaled_logits = hf_forward(hf_models["llama"], LONG_PROMPT).logits[0, 256:]
    unscaled_logits = hf_forward(unscaled.eval(), LONG_PROMPT).logits[0, 256:]
    assert (scaled_logits - unscaled_logits).abs().max() > 100 * ATOL


@pytest.mark.parametrize(
    "shape",
    [
        {},  # Mistral-7B-v0.3: head_dim is hidden_size / heads
        {"head_dim": 32},  # Mistral-Nemo: an explicit head_dim (128 there, with hidden 5120 over 32 heads)
    ],
    ids=["v0.3", "explicit-head-dim"],
)
def test_mistral_greedy_tokens_through_the_scheduler_match_transformers(shape, tmp_path):
    path = make_tiny_model(str(tmp_path / "mistral"), "mistral", seed=5, **shape)
    config = AutoConfig.from_pretrained(path)
    assert config.sliding_window is None
    assert (config.head_dim != config.hidden_size // config.num_attention_heads) == bool(shape)
    prompt = "The quick brown fox jumps over the lazy dog. A radix tree shares"
    engine = OneRank(model_path=path, dtype="float32", device="cpu", log_level="warning")
    [got] = engine.generate([prompt], {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True})
    ids = engine.tokenizer.encode(prompt)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=24,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    assert got == expected[0, len(ids) :].tolist()
