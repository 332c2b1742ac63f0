"""Model loading from real Hugging Face directories: sharded checkpoints load the same weights
as unsharded ones, and every broken directory or checkpoint fails naming what is wrong."""

import json
import os
import re
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.model_loader.loader import BIN_INDEX_FILE, INDEX_FILE, load_model, safetensors_files, weight_files
from sglang.test.runner_utils import make_cpu_runner, prefill
from sglang.test.tiny_models import make_tiny_model

PROMPT = [5, 17, 200, 3, 99, 42, 7, 311, 128, 64, 1, 250]


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    return make_tiny_model(str(tmp_path_factory.mktemp("llama")), "llama", seed=0)


@pytest.fixture(scope="module")
def sharded_llama(tmp_path_factory):
    return make_tiny_model(str(tmp_path_factory.mktemp("llama-sharded")), "llama", seed=0, max_shard_size="100KB")


@pytest.fixture
def model_copy(tiny_llama, tmp_path):
    """A private copy of the tiny model that a test may break."""
    return shutil.copytree(tiny_llama, tmp_path / "model", dirs_exist_ok=False).as_posix()


def load(path, **kwargs):
    return load_model(ModelConfig.from_path(path, dtype="float32", device="cpu", **kwargs), "cpu")


def edit_config(path, **changes):
    config_path = os.path.join(path, "config.json")
    with open(config_path) as f:
        config = json.load(f)
    config.update(changes)
    with open(config_path, "w") as f:
        json.dump(config, f)


def edit_checkpoint(path, edit):
    """Rewrites model.safetensors with edit(tensors) applied to its name -> tensor dict."""
    file = os.path.join(path, "model.safetensors")
    tensors = load_file(file)
    edit(tensors)
    save_file(tensors, file, metadata={"format": "pt"})


def prefill_logits(path, token_ids):
    """Logits at every prompt position from one EXTEND forward through a real ModelRunner."""
    return prefill(make_cpu_runner(path, max_total_tokens=64), token_ids).next_token_logits


def test_sharded_checkpoint_reads_every_shard_named_in_the_index(sharded_llama):
    with open(os.path.join(sharded_llama, INDEX_FILE)) as f:
        shard_names = set(json.load(f)["weight_map"].values())
    assert len(shard_names) > 1
    assert [os.path.basename(p) for p in safetensors_files(sharded_llama)] == sorted(shard_names)


def test_sharded_checkpoint_loads_the_same_weights_as_unsharded(tiny_llama, sharded_llama):
    unsharded = dict(load(tiny_llama).named_parameters())
    sharded = dict(load(sharded_llama).named_parameters())
    assert sharded.keys() == unsharded.keys()
    for name, param in unsharded.items():
        assert torch.equal(sharded[name], param), name


def test_sharded_checkpoint_gives_the_same_logits_as_unsharded(tiny_llama, sharded_llama):
    unsharded = prefill_logits(tiny_llama, PROMPT)
    sharded = prefill_logits(sharded_llama, PROMPT)
    assert unsharded.shape == (len(PROMPT), 384)
    assert torch.equal(sharded, unsharded)


def test_missing_shard_named_in_index_fails_naming_the_file(sharded_llama, tmp_path):
    path = shutil.copytree(sharded_llama, tmp_path / "model").as_posix()
    os.remove(os.path.join(path, "model-00003-of-00007.safetensors"))
    with pytest.raises(FileNotFoundError, match="model-00003-of-00007.safetensors"):
        load(path)


def test_directory_without_safetensors_fails_naming_the_path(model_copy):
    os.remove(os.path.join(model_copy, "model.safetensors"))
    with pytest.raises(FileNotFoundError, match=re.escape(model_copy)) as exc:
        load(model_copy)
    assert "safetensors" in str(exc.value)


def test_directory_without_config_json_fails_naming_it(model_copy):
    os.remove(os.path.join(model_copy, "config.json"))
    with pytest.raises(FileNotFoundError, match="config.json") as exc:
        ModelConfig.from_path(model_copy)
    assert model_copy in str(exc.value)


def test_model_path_that_is_not_a_directory_fails_naming_it(tmp_path):
    missing = str(tmp_path / "no-such-model")
    with pytest.raises(FileNotFoundError, match=re.escape(missing)):
        ModelConfig.from_path(missing)


def test_unknown_architecture_fails_naming_it_and_listing_supported_ones(model_copy):
    edit_config(model_copy, architectures=["MysteryForCausalLM"])
    with pytest.raises(ValueError, match="MysteryForCausalLM") as exc:
        load(model_copy)
    for supported in ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM"):
        assert supported in str(exc.value)


def test_config_disagreeing_with_checkpoint_fails_naming_a_weight(model_copy):
    edit_config(model_copy, intermediate_size=96)
    with pytest.raises(ValueError, match=r"model\.layers\.0\.mlp\.\w+_proj\.weight.*config\.json"):
        load(model_copy)


def test_tensor_with_wrong_shape_fails_naming_it_and_both_shapes(model_copy):
    def shrink_k_proj(tensors):
        tensors["model.layers.1.self_attn.k_proj.weight"] = torch.zeros(24, 64)

    edit_checkpoint(model_copy, shrink_k_proj)
    with pytest.raises(ValueError, match=r"model\.layers\.1\.self_attn\.k_proj\.weight") as exc:
        load(model_copy)
    assert "(24, 64)" in str(exc.value) and "(32, 64)" in str(exc.value)


def test_extra_unknown_tensor_fails_naming_it(model_copy):
    def add_stray(tensors):
        tensors["model.layers.0.self_attn.mystery_proj.weight"] = torch.zeros(4, 4)

    edit_checkpoint(model_copy, add_stray)
    with pytest.raises(ValueError, match=r"model\.layers\.0\.self_attn\.mystery_proj\.weight"):
        load(model_copy)


@pytest.mark.parametrize(
    "dropped",
    [
        "model.norm.weight",
        "model.layers.2.mlp.up_proj.weight",
        "model.layers.1.self_attn.v_proj.weight",
    ],
)
def test_checkpoint_missing_a_tensor_fails_naming_it(model_copy, dropped):
    edit_checkpoint(model_copy, lambda tensors: tensors.pop(dropped))
    with pytest.raises(ValueError, match="missing") as exc:
        load(model_copy)
    assert re.search(rf"\b{re.escape(dropped)}\b", str(exc.value)), str(exc.value)


def test_rotary_inv_freq_in_checkpoint_is_ignored(model_copy, tiny_llama):
    def add_inv_freq(tensors):
        tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)

    edit_checkpoint(model_copy, add_inv_freq)
    loaded = dict(load(model_copy).named_parameters())
    for name, param in load(tiny_llama).named_parameters():
        assert torch.equal(loaded[name], param), name


def test_context_length_beyond_max_position_embeddings_fails(tiny_llama):
    with pytest.raises(ValueError, match=r"--context-length 2048.*max_position_embeddings \(1024\)"):
        ModelConfig.from_path(tiny_llama, context_length=2048)


def test_context_length_defaults_to_max_position_embeddings_and_may_be_lowered(tiny_llama):
    assert ModelConfig.from_path(tiny_llama).context_len == 1024
    assert ModelConfig.from_path(tiny_llama, context_length=1024).context_len == 1024
    assert ModelConfig.from_path(tiny_llama, context_length=300).context_len == 300


def _to_bin_checkpoint(path, num_shards):
    """Replaces model.safetensors by PyTorch pickles, as older checkpoints ship: one
    pytorch_model.bin, or shards named in pytorch_model.bin.index.json."""
    tensors = load_file(os.path.join(path, "model.safetensors"))
    os.remove(os.path.join(path, "model.safetensors"))
    if num_shards == 1:
        torch.save(tensors, os.path.join(path, "pytorch_model.bin"))
        return
    names = sorted(tensors)
    weight_map = {}
    for i in range(num_shards):
        shard = f"pytorch_model-{i + 1:05d}-of-{num_shards:05d}.bin"
        part = {name: tensors[name] for name in names[i::num_shards]}
        torch.save(part, os.path.join(path, shard))
        weight_map.update({name: shard for name in part})
    with open(os.path.join(path, BIN_INDEX_FILE), "w") as f:
        json.dump({"weight_map": weight_map}, f)


@pytest.mark.parametrize("num_shards", [1, 3])
def test_pytorch_bin_checkpoint_gives_the_same_logits_as_safetensors(tiny_llama, model_copy, num_shards):
    _to_bin_checkpoint(model_copy, num_shards)
    assert torch.equal(prefill_logits(model_copy, PROMPT), prefill_logits(tiny_llama, PROMPT))


def test_safetensors_are_preferred_over_bin_files_beside_them(tiny_llama, model_copy):
    torch.save({"model.embed_tokens.weight": torch.zeros(3, 3)}, os.path.join(model_copy, "pytorch_model.bin"))
    assert [os.path.basename(f) for f in weight_files(model_copy)] == ["model.safetensors"]
