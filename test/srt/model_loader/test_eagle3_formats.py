"""Published EAGLE-3 draft layouts (model_loader/eagle3_formats.py): each is read into the one form
the draft model serves, loads, and computes what a plain-torch reference of that layout computes
(fc bias, norm_before_fc, norm_before_residual, attention biases, q/k norms included); what we do
not serve is refused before any process starts, naming the feature."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.model_loader.eagle3_formats import (
    LAYOUT_OURS,
    LAYOUT_RELEASE,
    LAYOUT_SPECULATORS,
    draft_model_config,
    read_draft_layout,
)
from sglang.srt.model_paths import check_model_paths
from sglang.srt.server_args import ServerArgs
from sglang.test.eagle3_layouts import CASES, DraftFeatures, draft_tensors, reference_draft_step, write_draft
from sglang.test.runner_utils import make_cpu_runner
from sglang.test.tiny_models import make_tiny_model

NUM_TARGET_LAYERS = 8  # deep enough for the default aux layers [1, L//2 - 1, L - 4]
AUX_LAYER_IDS = [1, 3, 6]  # ours: the outputs of these target layers
DRAFT_VOCAB = 96
EXPECTED_LAYOUT = {"specforge": LAYOUT_OURS, "release": LAYOUT_RELEASE, "speculators": LAYOUT_SPECULATORS}


@pytest.fixture(scope="module")
def target_path(tmp_path_factory):
    # Default rope: the reference implements no rope scaling.
    return make_tiny_model(
        str(tmp_path_factory.mktemp("target")), "llama", num_hidden_layers=NUM_TARGET_LAYERS, rope_scaling=None
    )


@pytest.fixture(scope="module")
def target_runner(target_path):
    return make_cpu_runner(target_path)


def write_case(root, case: str, target_runner, **overrides):
    """(directory, canonical tensors as the draft holds them, features) of CASES[case]."""
    layout, features = CASES[case]
    config = target_runner.model_config.hf_config
    tensors = draft_tensors(config, DRAFT_VOCAB, features, seed=len(case))
    aux = None if layout == "release" else AUX_LAYER_IDS
    path = write_draft(
        str(root / case),
        layout,
        tensors,
        target_runner.model_config.path,
        overrides.get("aux", aux),
        features,
        embed=target_runner.model.model.embed_tokens.weight.detach().clone(),
    )
    if layout == "release":  # stored in float16: the reference computes with the same values
        tensors = {name: t.half().float() if t.is_floating_point() else t for name, t in tensors.items()}
    return path, tensors, features


@pytest.mark.parametrize("case", sorted(CASES))
def test_layout_is_read_into_one_normalised_config(case, target_runner, tmp_path):
    path, _, features = write_case(tmp_path, case, target_runner)
    draft = read_draft_layout(path)
    assert draft.layout == EXPECTED_LAYOUT[CASES[case][0]]
    config = draft.config
    assert config.architectures == ["LlamaForCausalLMEagle3"] and config.num_hidden_layers == 1
    assert (config.draft_vocab_size, config.vocab_size) == (DRAFT_VOCAB, target_runner.model_config.vocab_size)
    # speculators write [2, 4, 7] (the states entering those layers): ours are one less.
    assert draft.aux_layer_ids == (None if case == "release" else AUX_LAYER_IDS)
    for flag in ("fc_bias", "norm_before_fc", "norm_before_residual", "qk_norm"):
        assert getattr(config, flag) == getattr(features, flag), flag
    assert config.qkv_bias == config.o_bias == features.attention_bias
    assert any("num_hidden_layers 8" in f for f in draft.features) == features.copied_num_layers


class OneSequence:
    """A draft forward over one fresh sequence (positions 0 .. n - 1), as the worker's
    DRAFT_EXTEND runs it; its KV slots and table row are freed afterwards."""

    def __init__(self, runner: ModelRunner):
        self.runner = runner

    def __call__(self, tokens: torch.Tensor, hidden_in: torch.Tensor):
        n = len(tokens)
        slots = self.runner.token_to_kv_pool_allocator.alloc(n)
        row = self.runner.req_to_token_pool.alloc()
        self.runner.req_to_token_pool.write(row, 0, slots)
        batch = ForwardBatch(
            forward_mode=ForwardMode.DRAFT_EXTEND,
            batch_size=1,
            input_ids=tokens,
            positions=torch.arange(n),
            req_pool_indices=torch.tensor([row]),
            seq_lens=torch.tensor([n]),
            out_cache_loc=slots,
            seq_lens_cpu=[n],
            extend_seq_lens_cpu=[n],
            extend_prefix_lens_cpu=[0],
            return_all_logits=True,
            spec_hidden_states=hidden_in,
        )
        try:
            return self.runner.forward(batch)
        finally:
            self.runner.token_to_kv_pool_allocator.free(slots)
            self.runner.req_to_token_pool.free(row)


@pytest.mark.parametrize("case", sorted(CASES))
def test_layout_loads_and_computes_the_reference_draft(case, target_runner, tmp_path):
    path, tensors, features = write_case(tmp_path, case, target_runner)
    target = target_runner.model_config
    args = ServerArgs(model_path=target.path, dtype="float32", device="cpu", max_total_tokens=1024)
    runner = ModelRunner(draft_model_config(path, "float32", "cpu", target), args, target=target_runner)
    assert runner.aux_layer_ids == (AUX_LAYER_IDS if case != "release" else [1, 3, 4])
    gen = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, target.vocab_size, (9,), generator=gen)
    embeds = target_runner.model.model.embed_tokens.weight[tokens].detach()
    shape = dict(heads=target.num_attention_heads, kv_heads=target.num_key_value_heads, head_dim=target.head_dim)
    eps = target.hf_config.rms_norm_eps
    forward = OneSequence(runner)
    # From the target's aux states (fc path), and from the draft's own outputs (a chain step's input).
    for hidden_in, from_aux in (
        (2 * torch.randn(9, 3 * target.hidden_size, generator=gen), True),
        (torch.randn(9, target.hidden_size, generator=gen), False),
    ):
        out = forward(tokens, hidden_in)
        logits, hidden = reference_draft_step(tensors, features, shape, embeds, hidden_in, from_aux, eps)
        torch.testing.assert_close(out.next_token_logits, logits, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(out.hidden_states, hidden, atol=1e-4, rtol=1e-4)
    assert torch.equal(runner.model.to_target_ids(torch.arange(DRAFT_VOCAB)), torch.arange(1, DRAFT_VOCAB + 1))


# --- refused before any process starts, naming the feature ---


def launch_check(target_path: str, draft_path: str, **kwargs) -> None:
    """What the launch path runs before starting a process (Engine, launch_server, replicas)."""
    args = ServerArgs(
        model_path=target_path,
        dtype="float32",
        device="cpu",
        speculative_algorithm="EAGLE3",
        speculative_draft_model_path=draft_path,
        **kwargs,
    )
    check_model_paths(args)


def edit_config(path: str, edit) -> str:
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    edit(config)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    return path


def edit_tensors(path: str, edit) -> str:
    file = os.path.join(path, "model.safetensors")
    tensors = load_file(file)
    edit(tensors)
    save_file(tensors, file)
    return path


def test_every_served_layout_passes_the_launch_check(target_runner, tmp_path):
    for case in CASES:
        launch_check(target_runner.model_config.path, write_case(tmp_path, case, target_runner)[0])


REFUSALS = {
    "fc_norm": (lambda c: c.update(fc_norm=True), None, "fc_norm"),
    "a second decoder layer": (
        None,
        lambda t: t.update({"layers.1.mlp.up_proj.weight": t["layers.0.mlp.up_proj.weight"].clone()}),
        "2 decoder layers",
    ),
    "aux id 0 (the embedding output)": (
        lambda c: c.update(eagle_aux_hidden_state_layer_ids=[0, 3, 6]),
        None,
        "embedding",
    ),
    "aux id past the target": (
        lambda c: c.update(eagle_aux_hidden_state_layer_ids=[2, 4, 9]),
        None,
        "must be 3 layers of the target's 8",
    ),
    "another speculators type": (lambda c: c.update(speculators_model_type="eagle"), None, "'eagle'"),
    "another layer type": (lambda c: c["transformer_layer_config"].update(model_type="mistral"), None, "'mistral'"),
    "norm_before_fc without input_norm": (lambda c: c.update(norm_before_fc=True), None, "input_norm.weight"),
    "an MLP bias": (None, lambda t: t.update({"layers.0.mlp.up_proj.bias": torch.zeros(128)}), "mlp.up_proj.bias"),
    "attention_bias without biases": (
        lambda c: c["transformer_layer_config"].update(attention_bias=True),
        None,
        "attention_bias",
    ),
    "another activation": (lambda c: c["transformer_layer_config"].update(hidden_act="gelu"), None, "gelu"),
    "another target's vocabulary": (
        lambda c: c["transformer_layer_config"].update(vocab_size=1000),
        None,
        "vocab_size (1000)",
    ),
}


@pytest.mark.parametrize("name", sorted(REFUSALS))
def test_unserved_draft_is_refused_before_start_naming_it(name, target_runner, tmp_path):
    edit, edit_weights, message = REFUSALS[name]
    path, _, _ = write_case(tmp_path, "speculators", target_runner)
    if edit:
        edit_config(path, edit)
    if edit_weights:
        edit_tensors(path, edit_weights)
    with pytest.raises(ValueError, match=f"--speculative-draft-model-path .*{_escape(message)}"):
        launch_check(target_runner.model_config.path, path)


def _escape(text: str) -> str:
    import re

    return re.escape(text)


def test_a_full_llama_passed_as_the_draft_is_refused(target_runner):
    path = target_runner.model_config.path
    with pytest.raises(ValueError, match="tensors are a full model's .*not an EAGLE-3 draft"):
        launch_check(path, path)


def test_a_multi_layer_draft_with_copied_config_is_refused(target_runner, tmp_path):
    path, _, _ = write_case(tmp_path, "copied_num_hidden_layers", target_runner)
    edit_tensors(path, lambda t: t.update({"layers.2.mlp.up_proj.weight": t["midlayer.mlp.up_proj.weight"].clone()}))
    with pytest.raises(ValueError, match="only one-layer EAGLE-3 drafts are served"):
        launch_check(target_runner.model_config.path, path)


def test_refusal_comes_from_the_launch_arguments_check(target_runner, tmp_path):
    """launch_server's prepare_server_args exits with the message before anything loads."""
    from sglang.srt.server_args import prepare_server_args

    path, _, _ = write_case(tmp_path, "speculators", target_runner)
    edit_config(path, lambda c: c.update(fc_norm=True))
    argv = [
        "--model-path",
        target_runner.model_config.path,
        "--device",
        "cpu",
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-draft-model-path",
        path,
    ]
    with pytest.raises(SystemExit):
        prepare_server_args(argv)


def test_features_listed_by_name(target_runner, tmp_path):
    path, _, _ = write_case(tmp_path, "attention_bias", target_runner)
    assert read_draft_layout(path).features == ("attention_bias",)
    features = DraftFeatures(fc_bias=True, norm_before_fc=True, norm_before_residual=True)
    config = target_runner.model_config.hf_config
    both = write_draft(
        str(tmp_path / "both"),
        "speculators",
        draft_tensors(config, DRAFT_VOCAB, features),
        target_runner.model_config.path,
        AUX_LAYER_IDS,
        features,
    )
    assert set(read_draft_layout(both).features) == {"fc.bias", "norm_before_fc", "norm_before_residual"}


@pytest.mark.parametrize("case", ["release", "speculators", "norm_before_fc", "attention_bias", "qwen3_qk_norm"])
def test_config_alone_is_read_the_same_under_dummy_weights(case, target_runner, tmp_path):
    """--load-format dummy reads no tensors: the config says what the draft holds."""
    path, _, _ = write_case(tmp_path, case, target_runner)
    config_only = tmp_path / "config_only"
    config_only.mkdir()
    (config_only / "config.json").write_text(open(os.path.join(path, "config.json")).read())
    with_tensors, dummy = read_draft_layout(path), read_draft_layout(str(config_only), "dummy")
    assert (dummy.layout, dummy.features, dummy.aux_layer_ids) == (
        with_tensors.layout,
        with_tensors.features,
        with_tensors.aux_layer_ids,
    )
    launch_check(target_runner.model_config.path, str(config_only), load_format="dummy")


def test_a_full_llama_config_is_refused_under_dummy_weights(target_runner, tmp_path):
    (tmp_path / "config.json").write_text(open(os.path.join(target_runner.model_config.path, "config.json")).read())
    with pytest.raises(ValueError, match="not an EAGLE-3 draft"):
        launch_check(target_runner.model_config.path, str(tmp_path), load_format="dummy")
