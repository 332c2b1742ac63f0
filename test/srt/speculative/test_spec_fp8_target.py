"""EAGLE-3 on an FP8 target: with speculation always on or chosen per step by the cost policy,
greedy output is the FP8 target's own plain greedy output (verification scores with the same
quantized model plain decoding uses), for a block-wise and a per-channel FP8 target; the draft,
unquantized, runs in the target's activation dtype. Tiny random pairs (whose draft is rarely
right), among them a Qwen3-MoE target with block-wise FP8 experts, and the demo pair's target
quantized to FP8 (whose trained draft is: accepted drafts).

Exact up to near ties: an FP8 model quantizes each activation to e4m3 at run time, and a float32
product's last bit, which depends on how many rows it multiplies (a verify of k + 1 tokens, a
one-token decode, a prefill), can move an activation across an e4m3 rounding boundary. Plain
decoding is no more exact: the demo target decodes token 393 where its own prefill of the same
prefix gives 16, two logits 0.001 standard deviations apart. Where speculative and plain output
part, the test checks that the FP8 target's two tokens are such a tie."""

from __future__ import annotations

import pytest
import torch

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs
from sglang import demo
from sglang.test.fp8_checkpoints import make_sharp_tiny_model, write_fp8_checkpoint
from sglang.test.runner_utils import prefill, run_to_completion
from sglang.test.server_fixture import assert_idle_kv_accounting
from sglang.test.tiny_models import make_tiny_eagle3_draft

PROMPTS = [[5, 17, 300, 41, 9, 77], [12, 13, 14], list(range(100, 140)), [200, 199, 7, 7, 7]]
MAX_NEW = [12, 20, 16, 9]
SHAPE = dict(
    hidden_size=128,
    intermediate_size=256,
    num_attention_heads=2,
    num_key_value_heads=2,
    head_dim=64,
    num_hidden_layers=3,
)
TARGETS = {"block": ("qwen3", "fp8-block"), "channel": ("llama", "ct-channel-dynamic")}
# The widest tie a rounding flip explains, in standard deviations of the logits: the FP8 models'
# whole activation quantization moves their logits by about 1% (test_fp8_checkpoints.MAX_NOISE).
NEAR_TIE = 0.01
SPEC = {
    "always": dict(speculative_policy="always"),
    "adaptive": dict(speculative_adaptive=True),
}


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """layout -> (FP8 target directory, an EAGLE-3 draft for it)."""
    root = tmp_path_factory.mktemp("spec_fp8")
    out = {}
    for name, (arch, layout) in TARGETS.items():
        src = make_sharp_tiny_model(str(root / f"{name}-float"), arch, **SHAPE)
        target = write_fp8_checkpoint(src, str(root / name), layout, ["lm_head"])
        out[name] = (target, make_tiny_eagle3_draft(str(root / f"{name}-draft"), target, draft_vocab_size=200))
    return out


def run(target: str, draft: str | None, spec: dict | None, prompts=PROMPTS, max_new=MAX_NEW) -> tuple[dict, Scheduler]:
    kwargs = {}
    if spec is not None:
        kwargs = dict(speculative_algorithm="EAGLE3", speculative_draft_model_path=draft, speculative_num_steps=3)
    scheduler = Scheduler(ServerArgs(model_path=target, dtype="float32", device="cpu", **kwargs, **(spec or {})))
    lengths = max_new if isinstance(max_new, list) else [max_new] * len(prompts)
    for i, (ids, length) in enumerate(zip(prompts, lengths)):
        params = SamplingParams(max_new_tokens=length, temperature=0, ignore_eos=True)
        scheduler.add_request(TokenizedGenerateReqInput(f"r{i}", ids, params, stream=False))
    outputs = run_to_completion(scheduler)
    assert_idle_kv_accounting(scheduler.get_internal_state())
    return {rid: out["ids"] for rid, out in outputs.items()}, scheduler


@pytest.fixture(scope="module")
def plain_outputs(pairs):
    return {name: run(target, None, None)[0] for name, (target, _) in pairs.items()}


@pytest.mark.parametrize("policy", list(SPEC))
@pytest.mark.parametrize("layout", list(TARGETS))
def test_speculation_on_an_fp8_target_gives_its_plain_greedy_output(pairs, plain_outputs, layout, policy):
    target, draft = pairs[layout]
    outputs, scheduler = run(target, draft, SPEC[policy])
    assert_same_up_to_near_ties(target, PROMPTS, plain_outputs[layout], outputs)
    assert [len(outputs[f"r{i}"]) for i in range(len(PROMPTS))] == MAX_NEW
    worker = scheduler.tp_worker
    assert worker.model_runner.model.model.layers[0].self_attn.qkv_proj.weight.dtype == torch.float8_e4m3fn
    draft_dtypes = {p.dtype for p in worker.draft_model.parameters() if p.is_floating_point()}
    assert draft_dtypes == {torch.float32}  # the target's activation dtype, unquantized
    if policy == "always":
        steps = {int(k): n for k, n in scheduler.get_internal_state()["spec_steps_by_k"].items()}
        assert steps.get(3, 0) > 0 and set(steps) == {3}


# Qwen3-MoE: layers 0 and 2 of 8 block-wise FP8 experts (96 intermediate rows: partial blocks), layer 1 dense.
MOE_SHAPE = dict(SHAPE, moe_intermediate_size=96)
MOE_IGNORE = ["lm_head", *(f"model.layers.{i}.mlp.gate" for i in range(3))]  # the head and the routers


@pytest.fixture(scope="module")
def moe_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("spec_fp8_moe")
    src = make_sharp_tiny_model(str(root / "float"), "qwen3_moe", **MOE_SHAPE)
    target = write_fp8_checkpoint(src, str(root / "fp8"), "fp8-block", MOE_IGNORE)
    return target, make_tiny_eagle3_draft(str(root / "draft"), target, draft_vocab_size=200)


def test_speculation_on_an_fp8_moe_target_gives_its_plain_greedy_output(moe_pair):
    """Always on: each verify routes k + 1 tokens per request through the FP8 experts, and the
    output is the target's plain greedy output (up to near ties)."""
    target, draft = moe_pair
    plain, _ = run(target, None, None)
    outputs, scheduler = run(target, draft, SPEC["always"])
    assert_same_up_to_near_ties(target, PROMPTS, plain, outputs)
    assert [len(outputs[f"r{i}"]) for i in range(len(PROMPTS))] == MAX_NEW
    experts = scheduler.tp_worker.model_runner.model.model.layers[2].mlp.experts
    assert experts.w13_weight.dtype == experts.w2_weight.dtype == torch.float8_e4m3fn
    steps = {int(k): n for k, n in scheduler.get_internal_state()["spec_steps_by_k"].items()}
    assert steps.get(3, 0) > 0 and set(steps) == {3}


CODE = ["def add(a, b):\n", "for i in range(10):\n", "import os\nimport sys\n\n\ndef main(", "class Stack:\n    def"]


@pytest.mark.parametrize("layout", list(TARGETS))
def test_the_demo_draft_on_its_fp8_target_accepts_drafts_and_keeps_the_targets_output(tmp_path, layout):
    """The demo target quantized to FP8 keeps its trained draft useful: drafts are accepted (more
    than one token per verify), and the output is the FP8 target's plain greedy output."""
    from transformers import AutoTokenizer

    target = write_fp8_checkpoint(demo.TARGET_PATH, str(tmp_path / layout), TARGETS[layout][1], ["lm_head"])
    tokenizer = AutoTokenizer.from_pretrained(demo.TARGET_PATH)
    prompts = [tokenizer(text).input_ids for text in CODE]
    plain, _ = run(target, None, None, prompts, 24)
    outputs, scheduler = run(target, demo.DRAFT_PATH, SPEC["always"], prompts, 24)
    assert_same_up_to_near_ties(target, prompts, plain, outputs)
    assert scheduler.get_internal_state()["avg_spec_accept_length"] > 1.5


def assert_same_up_to_near_ties(target: str, prompts: list[list[int]], plain: dict, spec: dict) -> None:
    """Each request's speculative tokens are its plain ones, or both follow the same tokens up to a
    position where the FP8 target's logits (a prefill of that prefix) tie the two within NEAR_TIE."""
    assert spec.keys() == plain.keys()
    runner = None
    for rid, want in plain.items():
        got = spec[rid]
        assert len(got) == len(want), rid
        if got == want:
            continue
        position = next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)
        if runner is None:
            args = ServerArgs(model_path=target, dtype="float32", device="cpu", max_total_tokens=512)
            runner = ModelRunner(ModelConfig.from_path(target, "float32", "cpu"), args)
        prompt = prompts[int(rid.removeprefix("r"))] + want[:position]
        logits = prefill(runner, prompt).next_token_logits.reshape(-1, runner.model_config.vocab_size)[-1]
        lead = (logits.max() - logits[[got[position], want[position]]].min()) / logits.std()
        assert lead < NEAR_TIE, (rid, position, got[position], want[position], lead.item())
