"""The demo-model pipeline (scripts/demo_models) at its toy preset: the target is a checkpoint
the engine loads and serves, the draft has the exact EAGLE-3 names and shapes, the chain
unroll matches step-by-step drafting, and a re-run with the same seed is identical."""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch
from safetensors.torch import load_file

PIPELINE_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "scripts", "demo_models"))
_SCRIPT_MODULES = (
    "pipeline",
    "corpus",
    "draft_model",
    "evaluate",
    "readme",
    "tokenizer",
    "train_draft",
    "train_target",
)


def _import_pipeline():
    """Import the pipeline's script modules, then take their generic names (`tokenizer`,
    `evaluate`, ...) back out of sys.path and sys.modules so no other test sees them."""
    sys.path.insert(0, PIPELINE_DIR)
    try:
        import draft_model
        import pipeline

        return pipeline, draft_model
    finally:
        sys.path.remove(PIPELINE_DIR)
        for name in _SCRIPT_MODULES:
            sys.modules.pop(name, None)


pipeline, _draft_model = _import_pipeline()
Eagle3Draft, chain_attention, unroll = _draft_model.Eagle3Draft, _draft_model.chain_attention, _draft_model.unroll

SEED = 3


def run_toy(out) -> dict:
    return pipeline.run(pipeline.parse_args(["--toy", "--out", str(out), "--seed", str(SEED), "--device", "cpu"]))


@pytest.fixture(scope="module", autouse=True)
def restore_torch_determinism():
    # The pipeline turns on deterministic algorithms for the whole process; put it back.
    yield
    torch.use_deterministic_algorithms(False)


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    return out, run_toy(out)


def test_outputs_have_the_expected_files(toy_run):
    out, _ = toy_run
    target = set(os.listdir(out / "target"))
    assert {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    } <= target
    assert {"config.json", "model.safetensors"} <= set(os.listdir(out / "draft"))
    assert (out / "README.md").read_text().count("| ") >= 5
    tensors = load_file(out / "target" / "model.safetensors")
    assert all(t.dtype == torch.bfloat16 for t in tensors.values())


def test_draft_checkpoint_has_eagle3_names_and_shapes(toy_run):
    out, _ = toy_run
    config = json.loads((out / "draft" / "config.json").read_text())
    target_config = json.loads((out / "target" / "config.json").read_text())
    hidden, vocab, draft_vocab = config["hidden_size"], config["vocab_size"], config["draft_vocab_size"]
    layers = target_config["num_hidden_layers"]
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["model_type"] == "llama"
    assert config["num_hidden_layers"] == 1 and vocab == target_config["vocab_size"]
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, layers // 2 - 1, layers - 4]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim, inter = hidden // heads, config["intermediate_size"]
    expected = {
        "fc.weight": (hidden, 3 * hidden),
        "norm.weight": (hidden,),
        "lm_head.weight": (draft_vocab, hidden),
        "d2t": (draft_vocab,),
        "t2d": (vocab,),
        "midlayer.hidden_norm.weight": (hidden,),
        "midlayer.input_layernorm.weight": (hidden,),
        "midlayer.post_attention_layernorm.weight": (hidden,),
        "midlayer.self_attn.q_proj.weight": (heads * head_dim, 2 * hidden),
        "midlayer.self_attn.k_proj.weight": (kv_heads * head_dim, 2 * hidden),
        "midlayer.self_attn.v_proj.weight": (kv_heads * head_dim, 2 * hidden),
        "midlayer.self_attn.o_proj.weight": (hidden, heads * head_dim),
        "midlayer.mlp.gate_proj.weight": (inter, hidden),
        "midlayer.mlp.up_proj.weight": (inter, hidden),
        "midlayer.mlp.down_proj.weight": (hidden, inter),
    }
    tensors = load_file(out / "draft" / "model.safetensors")
    assert {name: tuple(t.shape) for name, t in tensors.items()} == expected
    d2t, t2d = tensors["d2t"], tensors["t2d"]
    assert d2t.dtype == torch.int64 and t2d.dtype == torch.bool
    assert t2d[torch.arange(draft_vocab) + d2t].all() and t2d.sum().item() == draft_vocab


def test_report_has_acceptance_for_k_1_to_5(toy_run):
    _, report = toy_run
    table = report["acceptance"]["mean_accepted_length"]
    assert sorted(table) == ["1", "2", "3", "4", "5"]
    for k, value in table.items():
        assert 1 <= value <= int(k) + 1
    assert len(report["corpus"]["file_list_sha256"]) == 64
    assert report["target"]["heldout_perplexity"] > 1


def test_engine_loader_and_engine_serve_the_target(toy_run):
    from transformers import AutoModelForCausalLM

    import sglang
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader.loader import load_model

    path = str(toy_run[0] / "target")
    load_model(ModelConfig.from_path(path, dtype="float32", device="cpu"), "cpu")
    engine = sglang.Engine(model_path=path, dtype="float32", device="cpu", log_level="warning")
    try:
        result = engine.generate("def main(", {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True})
        ids = engine.tokenizer_manager.tokenizer.encode("def main(")
    finally:
        engine.shutdown()
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    expected = hf.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False, eos_token_id=None)
    assert result["output_ids"] == expected[0, len(ids) :].tolist()


def reference_chain(draft, embed, aux, next_tokens, anchor, num_steps):
    """Chain drafting from one anchor, one step at a time: step 0 over positions 0..anchor,
    then one query per step attending to those entries and the chain's own."""
    positions = torch.arange(anchor + 1)
    hidden = draft.fc(aux[:, : anchor + 1])
    q, k, v = draft.step_inputs(embed(next_tokens[:, : anchor + 1]), hidden, positions)
    out = draft.step_output(chain_attention(q, [k], [v]), hidden)[:, -1:]
    guesses = [draft.to_target_ids(draft.logits(out).argmax(-1))]
    keys, values = [k], [v]
    for step in range(1, num_steps):
        q, k1, v1 = draft.step_inputs(embed(guesses[-1]), out, torch.tensor([anchor + step]))
        keys.append(k1)
        values.append(v1)
        scale = q.shape[-1] ** -0.5
        scores = torch.cat([q @ key.transpose(-1, -2) * scale for key in keys], dim=-1).softmax(-1)
        out = draft.step_output(scores @ torch.cat(values, dim=2), out)
        guesses.append(draft.to_target_ids(draft.logits(out).argmax(-1)))
    return torch.cat(guesses, dim=1)[0]


def test_unrolled_chain_matches_step_by_step_drafting():
    from transformers import LlamaConfig

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_theta=10000.0,
    )
    draft = Eagle3Draft(config, torch.arange(0, 50, 2), [1, 3, 4])
    embed = torch.nn.Embedding(50, 32)
    aux, tokens = torch.randn(1, 12, 96), torch.randint(0, 50, (1, 12))
    with torch.no_grad():
        chains = unroll(draft, embed, aux, tokens, num_steps=4)
        guesses = torch.stack([draft.to_target_ids(logits.argmax(-1)) for logits in chains], dim=-1)[0]
        for anchor in range(12):
            assert guesses[anchor].tolist() == reference_chain(draft, embed, aux, tokens, anchor, 4).tolist()


def test_same_seed_gives_identical_heldout_loss(toy_run, tmp_path):
    _, first = toy_run
    second = run_toy(tmp_path)
    assert second["corpus"]["file_list_sha256"] == first["corpus"]["file_list_sha256"]
    assert second["target"]["heldout_loss"] == first["target"]["heldout_loss"]
    assert second["acceptance"]["mean_accepted_length"] == first["acceptance"]["mean_accepted_length"]
