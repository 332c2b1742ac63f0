"""Qwen3-MoE, Qwen2-MoE and Mixtral against transformers on tiny random checkpoints written with
each family's config keys and per-expert tensor names: logits at every prompt position, greedy
tokens through a scheduler (alone, batched, chunked prefill, radix hits), the settings and
checkpoints these models refuse, and the expert stacks filled in place at load."""

import json
import os
import shutil
import weakref

import pytest
import torch
from safetensors.torch import load_file, save_file
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
from sglang.srt.model_loader.loader import iterate_weights, load_model, parameter_bytes, weight_files
from sglang.srt.models.registry import get_model_class, supported_architectures
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.test.runner_utils import OneRank, make_cpu_runner, prefill
from sglang.test.tiny_models import make_tiny_eagle3_draft
from sglang.test.tiny_moe_models import make_tiny_moe_model
from transformers import AutoConfig, AutoModelForCausalLM

VOCAB_SIZE = 384
MAX_NEW = 16
# name -> (family, config overrides): Qwen3-MoE with a dense layer among MoE ones, and without
# renormalised top-k weights; Qwen2-MoE with its shared expert; Mixtral.
CONFIGS = {
    "qwen3_moe": ("qwen3_moe", {}),
    "qwen3_moe-no-norm-topk": ("qwen3_moe", {"norm_topk_prob": False, "mlp_only_layers": [], "num_hidden_layers": 2}),
    "qwen2_moe": ("qwen2_moe", {}),
    "mixtral": ("mixtral", {}),
}


def random_prompt(num_tokens, seed):
    return torch.randint(1, VOCAB_SIZE, (num_tokens,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe")
    return {
        name: make_tiny_moe_model(str(root / name), family, seed=i, **overrides)
        for i, (name, (family, overrides)) in enumerate(CONFIGS.items())
    }


@pytest.fixture(scope="module")
def hf_models(model_dirs):
    return {
        name: AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        for name, path in model_dirs.items()
    }


@torch.no_grad()
def hf_greedy(model, ids, max_new_tokens=MAX_NEW):
    out = model.generate(
        torch.tensor([ids]),
        attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )
    return out[0, len(ids) :].tolist()


def generate(engine: OneRank, prompts: list[list[int]]) -> list[tuple[list[int], int]]:
    """(greedy output ids, cached prompt tokens) per prompt, all queued before the first step."""
    scheduler = engine.scheduler
    engine.calls += 1
    rids = [f"{engine.calls}-{i}" for i in range(len(prompts))]
    for rid, ids in zip(rids, prompts):
        params = SamplingParams.from_dict({"temperature": 0, "max_new_tokens": MAX_NEW, "ignore_eos": True})
        params.verify(VOCAB_SIZE)
        scheduler.add_request(TokenizedGenerateReqInput(rid, ids, params, stream=False))
    tokens, cached = {rid: [] for rid in rids}, {}
    while scheduler.has_work():
        out = scheduler.step()
        for rid, ids, constants in zip(out.rids, out.new_token_ids, out.constants) if out else ():
            tokens[rid].extend(ids)
            if constants is not None:
                cached[rid] = constants.cached_tokens
    return [(tokens[rid], cached[rid]) for rid in rids]


def test_the_families_are_served():
    served = supported_architectures(draft=False)
    assert {"Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM", "MixtralForCausalLM"} <= set(served)


def test_fixtures_use_the_hub_names(model_dirs):
    with open(os.path.join(model_dirs["qwen3_moe"], "config.json")) as f:
        config = json.load(f)
    assert config["num_experts"] == 8 and config["mlp_only_layers"] == [1] and config["norm_topk_prob"]
    names = {name: set(load_file(os.path.join(path, "model.safetensors"))) for name, path in model_dirs.items()}
    assert "model.layers.0.mlp.experts.7.gate_proj.weight" in names["qwen3_moe"]
    assert "model.layers.1.mlp.gate_proj.weight" in names["qwen3_moe"]  # the dense layer
    assert {"model.layers.0.mlp.shared_expert.up_proj.weight", "model.layers.0.mlp.shared_expert_gate.weight"} <= (
        names["qwen2_moe"]
    )
    assert "model.layers.1.block_sparse_moe.experts.3.w3.weight" in names["mixtral"]


@pytest.mark.parametrize("name", CONFIGS)
def test_logits_at_every_position_match_transformers(name, model_dirs, hf_models):
    prompt = random_prompt(40, seed=1)
    got = prefill(make_cpu_runner(model_dirs[name]), prompt).next_token_logits
    with torch.no_grad():
        expected = hf_models[name](torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("name", CONFIGS)
def test_greedy_tokens_alone_batched_chunked_and_on_radix_hits_match_transformers(name, model_dirs, hf_models):
    """One scheduler with 16-token prefill chunks: a short prompt alone, then a batch of three whose
    longer prompts are chunked, then the longest again (a radix hit of all but its last token) and
    extended by part of its output (a hit past the prompt)."""
    engine = OneRank(model_path=model_dirs[name], dtype="float32", device="cpu", chunked_prefill_size=16)
    short, mid, long = random_prompt(5, 2), random_prompt(19, 3), random_prompt(40, 4)
    expected = {tuple(ids): hf_greedy(hf_models[name], ids) for ids in (short, mid, long)}
    [(alone, _)] = generate(engine, [short])
    assert alone == expected[tuple(short)]
    batch = generate(engine, [mid, long, short])
    assert [ids for ids, _ in batch] == [expected[tuple(mid)], expected[tuple(long)], expected[tuple(short)]]
    [(again, cached)] = generate(engine, [long])
    assert cached == len(long) - 1 and again == expected[tuple(long)]
    extended = long + again[:6] + random_prompt(3, 5)
    [(out, cached)] = generate(engine, [extended])
    assert cached >= len(long) + 5
    assert out == hf_greedy(hf_models[name], extended)


@pytest.mark.parametrize(
    "name, setting, message",
    [
        ("qwen3_moe", {"scoring_func": "sigmoid"}, "scoring_func = 'sigmoid'"),
        ("qwen3_moe", {"n_group": 8}, "n_group = 8"),
        ("qwen3_moe", {"routed_scaling_factor": 2.5}, "routed_scaling_factor"),
        ("qwen3_moe", {"shared_expert_intermediate_size": 64}, "shared_expert_intermediate_size = 64"),
        ("qwen3_moe", {"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        ("qwen2_moe", {"num_experts_per_tok": 5}, "5 experts of 4"),
        ("qwen2_moe", {"use_sliding_window": True, "sliding_window": 32, "max_window_layers": 2}, "sliding"),
        ("mixtral", {"norm_topk_prob": False}, "norm_topk_prob = False"),
        ("mixtral", {"sliding_window": 32}, "sliding_window 32"),
    ],
)
def test_a_setting_the_family_does_not_compute_is_refused_by_name(name, setting, message, model_dirs):
    config = AutoConfig.from_pretrained(model_dirs[name])
    for key, value in setting.items():
        setattr(config, key, value)
    if "use_sliding_window" in setting:
        config.layer_types = ["sliding_attention"] * config.num_hidden_layers
    with pytest.raises(ValueError, match=message):
        get_model_class(config.architectures[0])(config)


def rewritten_checkpoint(src: str, dst: str, edit) -> str:
    shutil.copytree(src, dst)
    path = os.path.join(dst, "model.safetensors")
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path)
    return dst


def load(path: str):
    return load_model(ModelConfig.from_path(path, dtype="float32", device="cpu"), "cpu")


def test_a_missing_expert_is_named(model_dirs, tmp_path):
    path = rewritten_checkpoint(
        model_dirs["mixtral"],
        str(tmp_path / "m"),
        lambda t: t.pop("model.layers.1.block_sparse_moe.experts.2.w3.weight"),
    )
    with pytest.raises(ValueError, match=r"missing 1 weight\(s\): model.layers.1.block_sparse_moe.experts.2.w3.weight"):
        load(path)


def test_an_expert_beyond_the_config_is_named(model_dirs, tmp_path):
    def add_expert(tensors):
        tensors["model.layers.0.mlp.experts.4.up_proj.weight"] = tensors[
            "model.layers.0.mlp.experts.0.up_proj.weight"
        ].clone()

    path = rewritten_checkpoint(model_dirs["qwen2_moe"], str(tmp_path / "q"), add_expert)
    with pytest.raises(ValueError, match="experts.4.up_proj.weight' is for expert 4, but config.json gives 4 experts"):
        load(path)


def test_fused_expert_tensors_are_refused_by_name(model_dirs, tmp_path):
    def fuse(tensors):
        for e in range(8):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                tensors.pop(f"model.layers.0.mlp.experts.{e}.{proj}.weight")
        tensors["model.layers.0.mlp.experts.gate_up_proj"] = torch.zeros(8, 64, 64)

    path = rewritten_checkpoint(model_dirs["qwen3_moe"], str(tmp_path / "f"), fuse)
    with pytest.raises(ValueError, match="'model.layers.0.mlp.experts.gate_up_proj' does not belong"):
        load(path)


def test_expert_stacks_are_filled_in_place_one_checkpoint_tensor_at_a_time(model_dirs):
    """The stacks are allocated with the model (as large as the checkpoint's experts) and each
    expert's tensor is copied into them and dropped before the next one is read: the load never
    holds more than the model plus one checkpoint tensor (at most one expert's projection)."""
    path = model_dirs["qwen3_moe"]
    files = weight_files(path)
    model = get_model_class("Qwen3MoeForCausalLM")(AutoConfig.from_pretrained(path))
    addresses = {name: p.data_ptr() for name, p in model.named_parameters()}
    alive_before_each_read, refs = [], []

    def watched(weights):
        for name, tensor in weights:
            alive_before_each_read.append(sum(ref() is not None for ref in refs))
            refs.append(weakref.ref(tensor))
            yield name, tensor
            del tensor

    with torch.no_grad():
        model.load_weights(watched(iterate_weights(files)))
    assert max(alive_before_each_read) == 0
    assert {name: p.data_ptr() for name, p in model.named_parameters()} == addresses
    checkpoint = load_file(files[0])
    assert parameter_bytes(model) == sum(t.numel() * t.element_size() for t in checkpoint.values())
    experts = model.model.layers[2].mlp.experts
    assert torch.equal(experts.w13_weight[5, 32:], checkpoint["model.layers.2.mlp.experts.5.up_proj.weight"])
    assert torch.equal(experts.w2_weight[5], checkpoint["model.layers.2.mlp.experts.5.down_proj.weight"])


@pytest.mark.parametrize(
    "policy", [dict(speculative_policy="always"), dict(speculative_adaptive=True)], ids=["always", "adaptive"]
)
def test_eagle3_on_a_moe_target_gives_the_targets_greedy_tokens(policy, model_dirs, hf_models, tmp_path):
    """The draft reads the residual stream after layers 0 and 2 (MoE) and 1 (dense); the target
    verifies 4 tokens per request at a time through its experts."""
    target = model_dirs["qwen3_moe"]
    draft = make_tiny_eagle3_draft(str(tmp_path / "draft"), target, draft_vocab_size=200)
    spec = OneRank(
        model_path=target,
        dtype="float32",
        device="cpu",
        speculative_algorithm="EAGLE3",
        speculative_draft_model_path=draft,
        speculative_num_steps=3,
        **policy,
    )
    prompts = [random_prompt(7, 6), random_prompt(23, 7), random_prompt(12, 8)]
    got = [ids for ids, _ in generate(spec, prompts)]
    assert got == [hf_greedy(hf_models["qwen3_moe"], ids) for ids in prompts]
    if "speculative_policy" in policy:  # the adaptive policy may judge plain steps cheaper throughout
        assert spec.internal_state()["spec_verifies"] > 0


def test_two_ranks_give_one_ranks_greedy_tokens(tmp_path):
    """Experts, the shared expert and the dense layer split along their intermediate dimension
    over two ranks (gloo); the router and the shared expert's gate held whole by each."""
    import sglang

    path = make_tiny_moe_model(
        str(tmp_path / "qwen2_moe"), "qwen2_moe", seed=9, num_hidden_layers=3, mlp_only_layers=[1]
    )
    prompts = ["def add(a, b):", "The quick brown fox jumps over the lazy dog. A radix tree shares", "Hello"]
    greedy = {"temperature": 0, "max_new_tokens": MAX_NEW, "ignore_eos": True}
    args = dict(model_path=path, dtype="float32", device="cpu", log_level="warning")
    expected = OneRank(**args).generate(prompts, greedy)
    engine = sglang.Engine(**args, tp_size=2)
    try:
        assert [out["output_ids"] for out in engine.generate(prompts, greedy)] == expected
    finally:
        engine.shutdown()


@pytest.mark.parametrize("name", ["qwen2_moe", "mixtral"])
def test_the_fused_kernel_in_the_model_matches_transformers(name, model_dirs, hf_models, monkeypatch):
    """The experts through sgl_kernel's fused kernel (the CUDA path; here under the Triton
    interpreter) give transformers' logits too."""
    from sglang.srt.layers.moe import layer

    monkeypatch.setattr(layer, "uses_fused_kernel", lambda hidden: True)
    prompt = random_prompt(21, seed=10)
    got = prefill(make_cpu_runner(model_dirs[name]), prompt).next_token_logits
    with torch.no_grad():
        expected = hf_models[name](torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)
