"""config.json variants users bring beyond the tiny fixtures' defaults: YaRN rope scaling matches
transformers, and settings the models cannot compute fail at load time naming the setting."""

import pytest
import torch
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.model_loader.loader import load_model
from sglang.test.runner_utils import make_cpu_runner, prefill
from sglang.test.tiny_models import make_tiny_model
from transformers import AutoModelForCausalLM

# Past the original context below, where YaRN's interpolation matters.
PROMPT = torch.randint(1, 384, (400,), generator=torch.Generator().manual_seed(5)).tolist()

YARN = {
    # Qwen3's recommended long-context setting, shrunk: factor 4 over the pre-training length.
    "qwen3": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128},
    # DeepSeek-style mscale pair and custom betas.
    "llama": {
        "rope_type": "yarn",
        "factor": 8.0,
        "original_max_position_embeddings": 128,
        "mscale": 1.0,
        "mscale_all_dim": 0.5,
        "beta_fast": 16,
        "beta_slow": 2,
    },
}


@pytest.mark.parametrize("arch", sorted(YARN))
def test_yarn_rope_scaling_matches_transformers_past_original_context(arch, tmp_path):
    path = make_tiny_model(str(tmp_path / arch), arch, seed=3, rope_scaling=YARN[arch])
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = hf(torch.tensor([PROMPT])).logits[0]
    got = prefill(make_cpu_runner(path), PROMPT).next_token_logits
    torch.testing.assert_close(got, expected, atol=1e-3, rtol=1e-4)
    assert torch.equal(got.argmax(-1), expected.argmax(-1))


@pytest.mark.parametrize(
    "arch, setting, message",
    [
        ("llama", {"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        ("llama", {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "rope type 'dynamic'"),
        ("qwen2", {"use_sliding_window": True, "sliding_window": 32, "max_window_layers": 1}, "sliding_attention"),
        # Mistral-7B-v0.1's 4096-token window on a 32k context, shrunk: every layer slides, with no flag.
        ("mistral", {"sliding_window": 32}, r"layers \[0, 1, 2\] sliding_attention \(sliding_window 32,"),
    ],
)
def test_unsupported_setting_fails_at_load_naming_it(arch, setting, message, tmp_path):
    path = make_tiny_model(str(tmp_path / "model"), arch, **setting)
    with pytest.raises(ValueError, match=message):
        load_model(ModelConfig.from_path(path, dtype="float32", device="cpu"), "cpu")


@pytest.mark.parametrize(
    "arch, setting",
    [
        # Qwen2.5 checkpoints name a window as long as their context: full attention, so no refusal.
        ("qwen2", {"use_sliding_window": True, "sliding_window": 1024, "max_window_layers": 1}),
        ("mistral", {"sliding_window": 1024}),
        ("mistral", {"sliding_window": None}),  # Mistral-7B-v0.3 and later
    ],
    ids=["qwen2.5-window-of-the-context", "mistral-window-of-the-context", "mistral-no-window"],
)
def test_sliding_window_none_or_as_wide_as_the_context_loads(arch, setting, tmp_path):
    path = make_tiny_model(str(tmp_path / "model"), arch, **setting)
    load_model(ModelConfig.from_path(path, dtype="float32", device="cpu"), "cpu")


@pytest.mark.parametrize(
    "arch, setting",
    [
        ("mistral", {"sliding_window": 32}),  # Mistral-7B-v0.1's window, shrunk
        ("qwen2", {"use_sliding_window": True, "sliding_window": 32, "max_window_layers": 1}),
    ],
)
def test_a_window_shorter_than_the_model_is_served_with_a_context_that_fits_in_it(arch, setting, tmp_path):
    """--context-length at most the window: no sequence outgrows the window, so full attention
    computes what transformers' windowed attention does; one token more is refused, saying so."""
    path = make_tiny_model(str(tmp_path / "model"), arch, seed=4, **setting)
    with pytest.raises(ValueError, match=r"served context 33 tokens.*--context-length 32 or less"):
        load_model(ModelConfig.from_path(path, dtype="float32", device="cpu", context_length=33), "cpu")
    config = ModelConfig.from_path(path, dtype="float32", device="cpu", context_length=32)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = hf(torch.tensor([PROMPT[:32]])).logits[0]
    got = prefill(make_cpu_runner(path, context_length=32), PROMPT[:32]).next_token_logits
    torch.testing.assert_close(got, expected, atol=1e-3, rtol=1e-4)
    assert config.context_len == 32


def test_a_sliding_window_is_refused_also_where_transformers_gives_no_layer_types():
    """Older transformers read a Qwen2 config without making layer_types: the flags alone say
    which layers slide (those from max_window_layers on)."""
    from types import SimpleNamespace

    from sglang.srt.models.llama import check_supported

    config = SimpleNamespace(
        hidden_act="silu",
        use_sliding_window=True,
        sliding_window=32,
        max_window_layers=1,
        num_hidden_layers=3,
        max_position_embeddings=1024,
    )
    with pytest.raises(ValueError, match=r"layers \[1, 2\] sliding_attention"):
        check_supported(config)
    check_supported(SimpleNamespace(**{**vars(config), "sliding_window": 1024}))  # as wide as the context
    check_supported(SimpleNamespace(**{**vars(config), "use_sliding_window": False}))
