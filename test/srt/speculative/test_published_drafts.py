"""Every published EAGLE-3 draft layout serves (sglang.test.eagle3_layouts), through the real
Scheduler on the CPU: greedy output with speculation on every step and under --speculative-adaptive
is the target's alone; a draft read where its tensors belong is accepted in full (k + 1 tokens per
verify) by a target rigged to emit one token, and the same draft with d2t pointing elsewhere is not;
a float16 draft serves beside a bfloat16 target under --dtype auto."""

from __future__ import annotations

import dataclasses
import gc
import json
import os

import pytest
import torch

from sglang.test.eagle3_layouts import (
    CASES,
    DraftFeatures,
    draft_tensors,
    reference_draft_step,
    rms,
    vocab_map,
    write_draft,
)
from sglang.test.runner_utils import OneRank
from sglang.test.tiny_models import build_tokenizer, make_tiny_model, tiny_config

NUM_TARGET_LAYERS = 8
AUX_LAYER_IDS = [1, 3, 5]  # + 1 (a speculators id read unconverted) is still a layer the rig knows
RELEASE_AUX_LAYER_IDS = [1, 3, 4]  # the default [1, L//2 - 1, L - 4]: the release names none
DRAFT_VOCAB = 96
K = 3  # --speculative-num-steps
RIGGED_TOKEN = 300  # the rigged target's only output; outside the draft's default ids 1 .. 96
ELSEWHERE = 301
PROMPTS = ["Hello", "The quick brown fox", "def add(a, b):"]
GREEDY = {"temperature": 0, "max_new_tokens": 1 + 4 * K, "ignore_eos": True}
# The GPU machine runs this module on CUDA (Triton kernels, CUDA graphs) with SGLANG_TEST_DEVICE=cuda.
DEVICE = os.environ.get("SGLANG_TEST_DEVICE", "cpu")
ARGS = dict(dtype="float32", device=DEVICE, log_level="warning", max_total_tokens=2048)
TINY = tiny_config("llama", vocab_size=len(build_tokenizer()), eos_token_id=0)  # the tiny targets' shape


def aux_ids_of(case: str) -> list[int]:
    return RELEASE_AUX_LAYER_IDS if CASES[case][0] == "release" else AUX_LAYER_IDS


def write_case(path: str, case: str, target_path: str, tensors: dict) -> str:
    layout, features = CASES[case]
    aux = None if layout == "release" else AUX_LAYER_IDS
    embed = _target_state(target_path)["model.embed_tokens.weight"]
    return write_draft(path, layout, tensors, target_path, aux, features, embed=embed)


def _target_state(target_path: str) -> dict:
    from safetensors.torch import load_file

    return load_file(os.path.join(target_path, "model.safetensors"))


def speculative(target: str, draft: str, **policy) -> OneRank:
    return OneRank(
        model_path=target,
        speculative_algorithm="EAGLE3",
        speculative_draft_model_path=draft,
        speculative_num_steps=K,
        **ARGS,
        **policy,
    )


# --- lossless: each layout, speculation on every step and adaptive ---


@pytest.fixture(scope="module")
def random_target(tmp_path_factory):
    return make_tiny_model(str(tmp_path_factory.mktemp("target")), "llama", num_hidden_layers=NUM_TARGET_LAYERS)


@pytest.fixture(scope="module")
def plain_output(random_target):
    plain = OneRank(model_path=random_target, disable_overlap_schedule=True, **ARGS)
    out = plain.generate(PROMPTS, {**GREEDY, "max_new_tokens": 24})
    del plain
    gc.collect()
    return out


@pytest.mark.parametrize(
    "policy", [dict(speculative_policy="always"), dict(speculative_adaptive=True)], ids=["always", "adaptive"]
)
@pytest.mark.parametrize("case", sorted(CASES))
def test_layout_serves_greedy_output_of_the_target_alone(case, policy, random_target, plain_output, tmp_path):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(random_target)
    tensors = draft_tensors(config, DRAFT_VOCAB, CASES[case][1], seed=3)
    draft = write_case(str(tmp_path / case), case, random_target, tensors)
    spec = speculative(random_target, draft, **policy)
    assert spec.generate(PROMPTS, {**GREEDY, "max_new_tokens": 24}) == plain_output
    assert spec.scheduler.tp_worker.draft_runner.aux_layer_ids == aux_ids_of(case)


# --- acceptance: a target that always emits one token, a draft rigged to predict it ---


@pytest.fixture(scope="module")
def rigged_target(tmp_path_factory):
    """A tiny Llama whose every token embeds to the same vector: every position's hidden states are
    the same (attention averages equal values), so its output never depends on the input; its
    lm_head row RIGGED_TOKEN points along that output. Returns (path, embedding, layer outputs)."""
    from transformers import AutoModelForCausalLM

    path = make_tiny_model(
        str(tmp_path_factory.mktemp("rigged")), "llama", num_hidden_layers=NUM_TARGET_LAYERS, rope_scaling=None
    )
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        embed = model.model.embed_tokens.weight
        embed.copy_(embed[7].expand_as(embed).clone())
        states = model(torch.tensor([[5, 6]]), output_hidden_states=True).hidden_states
        final = states[-1][0, -1]
        head = model.lm_head.weight
        head[RIGGED_TOKEN] = 2 * head.norm(dim=1).max() * final / final.norm()
    model.save_pretrained(path)
    # states[i + 1] is layer i's output: what the draft reads as aux layer i.
    layer_outputs = [states[i + 1][0, -1].clone() for i in range(NUM_TARGET_LAYERS - 1)]
    return path, embed[0].detach().clone(), layer_outputs


def rig_draft(tensors: dict, features: DraftFeatures, embed, layer_outputs, aux_ids, eps, wrong: dict) -> int:
    """Points the draft's lm_head row j* along its own outputs at the k chain steps read right (given
    the rigged target's aux states), a row per wrong read along what that read computes, and maps
    j* to RIGGED_TOKEN; returns j*. The draft's values see only the embedding (constant), so
    attention returns the same vector however q and k are read."""
    hidden = embed.shape[0]
    tensors["midlayer.self_attn.v_proj.weight"][:, hidden:] = 0
    head = tensors["lm_head.weight"]
    scale = head.norm(dim=1).max()
    chosen, reads = 17, [(features, aux_ids), *wrong.values()]
    for row, (read_features, read_aux) in zip([chosen, *range(40, 40 + len(wrong))], reads):
        mean = torch.stack(chain_directions(tensors, read_features, embed, layer_outputs, read_aux, eps)).sum(0)
        head[row] = scale * mean / mean.norm()
    target_ids = [i + 1 for i in range(head.shape[0])]
    target_ids[chosen] = RIGGED_TOKEN
    tensors.update(vocab_map(target_ids, TINY.vocab_size))
    return chosen


def chain_directions(tensors, features, embed, layer_outputs, aux_ids, eps) -> list[torch.Tensor]:
    """The unit vectors the lm_head reads at the k chain steps (reference_draft_step, one position:
    the rig makes the draft's attention independent of position and context)."""
    heads, kv_heads = TINY.num_attention_heads, TINY.num_key_value_heads
    shape = dict(heads=heads, kv_heads=kv_heads, head_dim=TINY.hidden_size // heads)
    hidden_in, from_aux = torch.cat([layer_outputs[i] for i in aux_ids])[None], True
    directions = []
    for _ in range(K):
        _, out = reference_draft_step(tensors, features, shape, embed[None], hidden_in, from_aux, eps)
        read = rms(out[0], tensors["norm.weight"], eps)
        directions.append(read / read.norm())
        hidden_in, from_aux = out, False
    return directions


def draft_picks(tensors, features, embed, layer_outputs, aux_ids, eps) -> list[int]:
    head = tensors["lm_head.weight"]
    return [int((head @ d).argmax()) for d in chain_directions(tensors, features, embed, layer_outputs, aux_ids, eps)]


def wrong_reads(case: str) -> dict[str, tuple]:
    """Reads a loader could get wrong for this layout, as (features, aux ids) to compute with."""
    features, aux = CASES[case][1], aux_ids_of(case)
    reads = {"aux ids off by one": (features, [i + 1 for i in aux])}
    for flag in ("fc_bias", "norm_before_fc", "norm_before_residual", "attention_bias"):
        if getattr(features, flag):
            reads[f"without {flag}"] = (dataclasses.replace(features, **{flag: False}), aux)
    return reads


def accept_length(target: str, draft: str) -> float:
    spec = speculative(target, draft, speculative_policy="always")
    outputs = spec.generate(PROMPTS, GREEDY)
    assert all(out == [RIGGED_TOKEN] * GREEDY["max_new_tokens"] for out in outputs), outputs
    return spec.internal_state()["avg_spec_accept_length"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_draft_read_where_its_tensors_belong_is_accepted_in_full(case, rigged_target, tmp_path):
    from transformers import AutoConfig

    target, embed, layer_outputs = rigged_target
    config = AutoConfig.from_pretrained(target)
    features, aux = CASES[case][1], aux_ids_of(case)
    tensors = draft_tensors(config, DRAFT_VOCAB, features, seed=11)
    for name in ("fc.bias", "midlayer.self_attn.v_proj.bias", "midlayer.self_attn.o_proj.bias"):
        if name in tensors:  # large enough that a loader dropping it reads another direction
            tensors[name] *= 4
    eps = config.rms_norm_eps
    chosen = rig_draft(tensors, features, embed, layer_outputs, aux, eps, wrong_reads(case))
    if CASES[case][0] == "release":  # stored in float16
        tensors = {n: t.half().float() if t.is_floating_point() else t for n, t in tensors.items()}
    assert draft_picks(tensors, features, embed, layer_outputs, aux, eps) == [chosen] * K
    for read, (wrong_features, wrong_aux) in wrong_reads(case).items():
        picks = draft_picks(tensors, wrong_features, embed, layer_outputs, wrong_aux, eps)
        assert picks != [chosen] * K, f"the rig does not tell a read {read} from the right one"

    assert accept_length(target, write_case(str(tmp_path / "right"), case, target, tensors)) == K + 1
    broken = dict(
        tensors, **vocab_map([ELSEWHERE if i == chosen else i + 1 for i in range(DRAFT_VOCAB)], TINY.vocab_size)
    )
    assert accept_length(target, write_case(str(tmp_path / "broken"), case, target, broken)) < 1.3


# --- dtype: a float16 draft beside a bfloat16 target ---


def test_float16_draft_serves_in_the_bfloat16_targets_dtype(random_target, tmp_path):
    from transformers import AutoConfig

    target = str(tmp_path / "bf16-target")
    os.makedirs(target)
    for name in os.listdir(random_target):
        os.symlink(os.path.join(random_target, name), os.path.join(target, name))
    os.remove(os.path.join(target, "config.json"))
    with open(os.path.join(random_target, "config.json")) as f:
        config = json.load(f)
    config.update(dtype="bfloat16", torch_dtype="bfloat16")
    with open(os.path.join(target, "config.json"), "w") as f:
        json.dump(config, f)
    tensors = draft_tensors(AutoConfig.from_pretrained(random_target), DRAFT_VOCAB, DraftFeatures(), seed=5)
    draft = write_case(str(tmp_path / "release"), "release", target, tensors)  # float16 .bin, torch_dtype float16
    spec = OneRank(
        model_path=target,
        speculative_algorithm="EAGLE3",
        speculative_draft_model_path=draft,
        speculative_num_steps=K,
        device=DEVICE,
        log_level="warning",
        max_total_tokens=2048,
    )
    worker = spec.scheduler.tp_worker
    assert worker.model_runner.model_config.dtype == worker.draft_runner.model_config.dtype == torch.bfloat16
    assert worker.draft_model.fc.weight.dtype == torch.bfloat16
    outputs = spec.generate(PROMPTS, {**GREEDY, "max_new_tokens": 8})
    assert all(len(out) == 8 for out in outputs)
