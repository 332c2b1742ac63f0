"""Mixture-of-experts targets on the GPU: the fused Triton experts inside captured CUDA graphs give
transformers' greedy tokens (float32), and EAGLE-3 on a MoE target with its verify / draft graphs
gives the target's own greedy tokens, always-on and adaptive."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs
from sglang.test.runner_utils import run_to_completion
from sglang.test.tiny_models import make_tiny_eagle3_draft
from sglang.test.tiny_moe_models import make_tiny_moe_model

VOCAB_SIZE = 384
MAX_NEW = 24
FAMILIES = ["qwen3_moe", "qwen2_moe", "mixtral"]


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe_cuda")
    return {family: make_tiny_moe_model(str(root / family), family, seed=i) for i, family in enumerate(FAMILIES)}


def prompts(count: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(count)
    return [torch.randint(1, VOCAB_SIZE, (5 + 7 * i,), generator=gen).tolist() for i in range(count)]


def greedy(path: str, batch: list[list[int]], **kwargs) -> tuple[list[list[int]], Scheduler]:
    args = dict(
        model_path=path,
        device="cuda",
        dtype="float32",
        attention_backend="triton",
        cuda_graph_max_bs=16,
        max_total_tokens=1 << 14,
    )
    scheduler = Scheduler(ServerArgs(**{**args, **kwargs}))
    for i, ids in enumerate(batch):
        params = SamplingParams(max_new_tokens=MAX_NEW, temperature=0, ignore_eos=True)
        scheduler.add_request(TokenizedGenerateReqInput(f"r{i}", ids, params, stream=False))
    finished = run_to_completion(scheduler)
    return [finished[f"r{i}"]["ids"] for i in range(len(batch))], scheduler


@torch.no_grad()
def hf_greedy(path: str, batch: list[list[int]]) -> list[list[int]]:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).cuda().eval()
    out = []
    for ids in batch:
        gen = model.generate(
            torch.tensor([ids], device="cuda"),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long, device="cuda"),
            max_new_tokens=MAX_NEW,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
        out.append(gen[0, len(ids) :].tolist())
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_graphs_with_fused_experts_give_transformers_greedy_tokens(family, targets):
    batch = prompts(6)
    got, scheduler = greedy(targets[family], batch)
    assert scheduler.tp_worker.model_runner.graph_runners, "no CUDA graphs were captured"
    assert got == hf_greedy(targets[family], batch)


@pytest.mark.parametrize("policy", ["always", "adaptive"])
def test_eagle3_on_a_moe_target_with_graphs_gives_the_targets_tokens(policy, targets, tmp_path):
    target = targets["qwen3_moe"]
    draft = make_tiny_eagle3_draft(str(tmp_path / "draft"), target, draft_vocab_size=200)
    batch = prompts(5)
    plain, _ = greedy(target, batch)
    chosen = dict(speculative_policy="always") if policy == "always" else dict(speculative_adaptive=True)
    got, scheduler = greedy(
        target,
        batch,
        speculative_algorithm="EAGLE3",
        speculative_draft_model_path=draft,
        speculative_num_steps=3,
        **chosen,
    )
    assert got == plain
    if policy == "always":
        assert scheduler.spec.summary([])["spec_verifies"] > 0
