"""FP8 under tensor parallelism on the CPU (gloo): two ranks serve what one rank serves for a
block-wise checkpoint (block scales split with the weight), the same with an FP8 KV cache and
checkpoint k/v scales (per tensor: the same on every rank), a per-channel FP8-dynamic checkpoint
and --quantization fp8. A split that would cut a 128 x 128 scale block is refused before start-up,
naming the share it cuts."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file

import sglang
from sglang.srt.distributed.parallel_state import check_shardable
from sglang.srt.server_args import ServerArgs, check_model_paths
from sglang.test.fp8_agreement import MIN_AGREEING
from sglang.test.fp8_checkpoints import make_sharp_tiny_model, write_fp8_checkpoint

PROMPTS = [[5 + i, 40 + 3 * i, 90 + i, 7, 200 - i] for i in range(16)]
NEW_TOKENS = 4
TOP = 20  # the most top logprobs a request may ask for
GREEDY = {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}
# Each rank's share of every projection is whole 128 x 128 blocks: 128 query rows (one head of
# 128), the one key-value head (held by both ranks) and 128 intermediate rows.
SHAPE = dict(
    hidden_size=128,
    intermediate_size=256,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=128,
    num_hidden_layers=2,
)
KV_SCALES = {0: (0.01, 0.004), 1: (0.02, 0.005)}  # per layer (k_scale, v_scale)
# Per-token dynamic activations: each rank of a row-parallel layer (o_proj, down_proj) quantizes its
# own slice of the input, as upstream does, so two ranks round them slightly differently from one.
# Measured on these prompts: top-20 logprobs within 0.007 of one rank's (0.019 on a wider model's).
MAX_SHIFT = 0.05


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("fp8_tp")
    src = make_sharp_tiny_model(str(root / "src"), "qwen3", **SHAPE)
    block = write_fp8_checkpoint(src, str(root / "block"), "fp8-block", ["lm_head"])
    block_kv = write_fp8_checkpoint(src, str(root / "block-kv"), "fp8-block", ["lm_head"])
    tensors = load_file(os.path.join(block_kv, "model.safetensors"))
    for layer, (k_scale, v_scale) in KV_SCALES.items():
        tensors[f"model.layers.{layer}.self_attn.k_scale"] = torch.tensor(k_scale)
        tensors[f"model.layers.{layer}.self_attn.v_scale"] = torch.tensor(v_scale)
    save_file(tensors, os.path.join(block_kv, "model.safetensors"))
    channel = write_fp8_checkpoint(src, str(root / "channel"), "ct-channel-dynamic", ["lm_head"])
    return {"src": src, "block": block, "block-kv": block_kv, "channel": channel, "root": root}


class Served:
    """Greedy tokens and each step's top-TOP logprobs of PROMPTS from an engine."""

    def __init__(self, path: str, tp_size: int, **server_args):
        engine = sglang.Engine(
            model_path=path, dtype="float32", device="cpu", log_level="warning", tp_size=tp_size, **server_args
        )
        try:
            outs = engine.generate(input_ids=PROMPTS, sampling_params=GREEDY, return_logprob=True, top_logprobs_num=TOP)
            self.kv_cache_dtype = engine.get_server_info()["kv_cache_dtype"]
        finally:
            engine.shutdown()
        self.tokens = [out["output_ids"] for out in outs]
        self.top = [
            [{token: logprob for logprob, token, *_ in step} for step in out["meta_info"]["output_top_logprobs"]]
            for out in outs
        ]

    def shifts(self, other: "Served") -> list[float]:
        """Per compared step, the largest change of a logprob both give in their top TOP, over each
        prompt's steps up to and including the first whose tokens differ."""
        out = []
        for prompt, (mine, theirs) in enumerate(zip(self.tokens, other.tokens)):
            for step, (a, b) in enumerate(zip(mine, theirs)):
                one, two = self.top[prompt][step], other.top[prompt][step]
                out.append(max(abs(one[t] - two[t]) for t in one.keys() & two.keys()))
                if a != b:
                    break
        return out


def assert_same(one: Served, two: Served) -> None:
    assert two.tokens == one.tokens
    assert max(one.shifts(two)) < 1e-4


@pytest.mark.parametrize("case", ["block", "block-kv"])
def test_two_ranks_serve_one_ranks_tokens_and_logprobs_for_block_wise_fp8(checkpoints, case):
    """Each rank holds whole 128 x 128 blocks of every weight with their scales and quantizes its
    activations in whole 1 x 128 groups, so two ranks compute one rank's products but for the order
    of the sum. With --kv-cache-dtype fp8_e4m3 each rank's pool stores its heads with the
    checkpoint's per-layer scales, the same on every rank."""
    kwargs = {"kv_cache_dtype": "fp8_e4m3"} if case == "block-kv" else {}
    one, two = Served(checkpoints[case], 1, **kwargs), Served(checkpoints[case], 2, **kwargs)
    assert two.kv_cache_dtype == ("fp8_e4m3" if kwargs else "auto")
    assert_same(one, two)


@pytest.fixture(scope="module")
def channel_served(checkpoints):
    return Served(checkpoints["channel"], 1), Served(checkpoints["channel"], 2)


def test_two_ranks_follow_one_rank_for_per_token_fp8_but_at_near_ties(channel_served):
    """A per-channel FP8-dynamic checkpoint: the weights split exactly (a row's scale goes with the
    row; o_proj and down_proj keep every row's scale), but a row-parallel layer's input is
    quantized per token over each rank's slice of it. That moves the logprobs by at most MAX_SHIFT;
    the first tokens agree on 15 of 16 prompts or more, and where a later token differs one rank's
    two candidates were within 2 x MAX_SHIFT there. Measured: all 64 tokens agree (with two
    key-value heads and 256 intermediate rows per rank, one of 64 differed, at a gap of 0.0003)."""
    one, two = channel_served
    shifts = one.shifts(two)
    first_agree = sum(a[0] == b[0] for a, b in zip(one.tokens, two.tokens))
    print(f"first tokens agree on {first_agree} of 16; largest logprob shift {max(shifts):.4f}")
    assert max(shifts) <= MAX_SHIFT
    assert first_agree >= MIN_AGREEING
    for prompt, (mine, theirs) in enumerate(zip(one.tokens, two.tokens)):
        step = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), None)
        if step is not None:
            top = one.top[prompt][step]
            assert top[mine[step]] - top.get(theirs[step], -float("inf")) < 2 * MAX_SHIFT, (prompt, step)


def test_online_fp8_over_two_ranks_is_the_per_channel_checkpoint_over_two_ranks(checkpoints, channel_served):
    """--quantization fp8 scales each row of a row-parallel layer by its largest entry over all the
    ranks (one all-reduce at load), so two ranks hold the per-channel checkpoint's split, and serve
    its tokens and logprobs (test_fp8_checkpoints: the same holds on one rank)."""
    assert_same(channel_served[1], Served(checkpoints["src"], 2, quantization="fp8"))


REFUSED = {
    # hidden 128 over 2 heads: 64 query rows per rank
    "head": ("llama", dict(SHAPE, head_dim=64, num_key_value_heads=2), "each rank's 64 query rows of q_proj"),
    # 384 intermediate rows: 192 per rank
    "intermediate": (
        "qwen3",
        dict(SHAPE, intermediate_size=384),
        "each rank's 192 intermediate_size rows of gate_proj and up_proj are not a multiple of 128",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_split_that_would_cut_a_scale_block_is_refused_before_start_up(tmp_path, case):
    arch, shape, message = REFUSED[case]
    src = make_sharp_tiny_model(str(tmp_path / "src"), arch, **shape)
    block = write_fp8_checkpoint(src, str(tmp_path / "block"), "fp8-block", ["lm_head"])
    with pytest.raises(ValueError, match=f"--tp-size 2 cannot split the model: block-wise .*{message}"):
        sglang.Engine(model_path=block, dtype="float32", device="cpu", tp_size=2)
    # Per-channel scales go with any split of the rows: the same weights per channel are served.
    channel = write_fp8_checkpoint(src, str(tmp_path / "channel"), "ct-channel-dynamic", ["lm_head"])
    check_model_paths(ServerArgs(model_path=channel, device="cpu", tp_size=2))


def test_expert_rows_that_would_cut_a_block_are_refused_naming_them():
    """Qwen3-30B-A3B-FP8's shapes: its 768 expert rows split over 2 ranks in whole blocks, over 4
    into 192 rows each (the experts' own check refuses them at load; this one before start-up)."""
    config = SimpleNamespace(
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=128,
        hidden_size=2048,
        intermediate_size=6144,
        moe_intermediate_size=768,
        quantization_config={"quant_method": "fp8", "weight_block_size": [128, 128]},
    )
    check_shardable(config, 2)
    with pytest.raises(ValueError, match="each rank's 192 moe_intermediate_size rows of gate_proj and up_proj"):
        check_shardable(config, 4)
