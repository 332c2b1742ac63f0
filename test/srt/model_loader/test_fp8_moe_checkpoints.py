"""A block-wise FP8 mixture-of-experts checkpoint (Qwen3-30B-A3B-FP8's layout, shrunk: every expert's
gate/up/down in e4m3 with a `weight_scale_inv` per 128 x 128 block, the routers and the head listed in
`modules_to_not_convert`) loads its experts in FP8, each projection's scales in its own block rows,
and decodes the first greedy tokens of the same weights dequantized to float32 (the criterion of
test_fp8_checkpoints: at least 15 of 16, logit noise within MAX_NOISE, any difference a near tie); a
wrong expert scale fails that. The fused kernel (under the interpreter here) gives the torch path's
logits; tensor-parallel splits must leave whole blocks on each rank; what is not served is refused."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from sglang.test.fp8_agreement import MAX_NOISE, MIN_AGREEING, TIE_BOUND
from test_fp8_checkpoints import PROMPTS, _with_quantization, measure_agreement

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.distributed import parallel_state
from sglang.srt.layers.moe.layer import FusedMoE
from sglang.srt.layers.quantization.fp8 import Fp8MoEMethod, WeightScales
from sglang.srt.model_loader.loader import load_model
from sglang.srt.model_paths import check_model_paths
from sglang.srt.models.weight_loading import expert_shards, load_named_weights
from sglang.srt.server_args import ServerArgs
from sglang.test.fp8_checkpoints import make_sharp_tiny_model, write_dequantized, write_fp8_checkpoint
from sglang.test.runner_utils import make_cpu_runner, prefill
from sglang.tools.fp8_checkpoint import quantize_weight

# Qwen3-MoE shrunk to widths block-wise FP8 can split: attention's q, k and v each whole 128-row
# blocks; layers 0 and 2 of 8 experts (top 2) whose intermediate size, 96, is no multiple of 128
# (each projection's last block is partial); layer 1 dense.
SHAPE = dict(
    hidden_size=128,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=128,
    intermediate_size=256,
    moe_intermediate_size=96,
)
LAYERS = 3
# As Qwen3-30B-A3B-FP8's config.json lists them: the head, and each layer's norms and router.
IGNORE = ["lm_head"] + [
    f"model.layers.{i}.{module}"
    for i in range(LAYERS)
    for module in ("input_layernorm", "mlp.gate", "post_attention_layernorm")
]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """(FP8 directory, the same weights dequantized to a float32 directory)."""
    root = tmp_path_factory.mktemp("fp8_moe")
    src = make_sharp_tiny_model(str(root / "float"), "qwen3_moe", **SHAPE)
    fp8 = write_fp8_checkpoint(src, str(root / "fp8"), "fp8-block", IGNORE)
    return fp8, write_dequantized(fp8, str(root / "dequantized"))


def test_experts_load_in_fp8_with_each_projections_block_scales(checkpoints):
    model = load_model(ModelConfig.from_path(checkpoints[0], "float32"), "cpu")
    tensors = load_file(os.path.join(checkpoints[0], "model.safetensors"))
    experts = model.model.layers[2].mlp.experts
    assert experts.w13_weight.dtype == experts.w2_weight.dtype == torch.float8_e4m3fn
    assert experts.w13_weight.shape == (8, 192, 128) and experts.w2_weight.shape == (8, 128, 96)
    # Gate and up each have one (partial) block row of 96 rows: the up's scales start a row of their own.
    assert experts.w13_weight_scale_inv.shape == (8, 2, 1) and experts.w2_weight_scale_inv.shape == (8, 1, 1)
    for e in (0, 5):
        ckpt = f"model.layers.2.mlp.experts.{e}"
        assert torch.equal(
            experts.w13_weight[e, 96:].view(torch.uint8), tensors[f"{ckpt}.up_proj.weight"].view(torch.uint8)
        )
        assert torch.equal(experts.w13_weight_scale_inv[e, :1], tensors[f"{ckpt}.gate_proj.weight_scale_inv"])
        assert torch.equal(experts.w13_weight_scale_inv[e, 1:], tensors[f"{ckpt}.up_proj.weight_scale_inv"])
        assert torch.equal(experts.w2_weight_scale_inv[e], tensors[f"{ckpt}.down_proj.weight_scale_inv"])
    assert model.model.layers[2].mlp.gate.weight.dtype == torch.float32  # routers stay in the model's dtype
    assert model.model.layers[1].mlp.down_proj.weight.dtype == torch.float8_e4m3fn  # the dense layer
    assert model.model.layers[0].self_attn.qkv_proj.weight.dtype == torch.float8_e4m3fn


def test_first_greedy_tokens_agree_with_dequantized_weights(checkpoints):
    """As test_fp8_checkpoints' criterion. The fixture's experts matter: without them the logits
    move by 17% to 22% of their spread and 6 of the 16 first tokens change (measured)."""
    agreement = measure_agreement(*checkpoints)
    print("fp8-block MoE", agreement.summary())
    assert agreement.noise.max() <= MAX_NOISE, agreement.summary()
    assert agreement.agreeing >= MIN_AGREEING, agreement.summary()
    for i, gap in zip(agreement.differ, agreement.gaps):
        assert gap < TIE_BOUND * agreement.noise[i], agreement.summary()


def test_a_wrong_expert_scale_fails_the_agreement(checkpoints, tmp_path):
    """Every expert's scales doubled (the other layers' kept): the logits move far beyond
    MAX_NOISE and most first tokens change (measured: 1 of 16 kept, noise 0.77 at least)."""
    fp8, dequantized = checkpoints
    broken = str(shutil.copytree(fp8, tmp_path / "doubled"))
    tensors = load_file(os.path.join(broken, "model.safetensors"))
    for name in [n for n in tensors if ".experts." in n and n.endswith("weight_scale_inv")]:
        tensors[name] = tensors[name] * 2
    save_file(tensors, os.path.join(broken, "model.safetensors"))
    agreement = measure_agreement(broken, dequantized)
    print("doubled expert scales", agreement.summary())
    assert agreement.noise.min() > 5 * MAX_NOISE
    assert agreement.agreeing < MIN_AGREEING


def test_the_fused_kernel_gives_the_torch_paths_logits(checkpoints, monkeypatch):
    """The FP8 experts through sgl_kernel's fused kernel (CUDA's path; the interpreter here) and
    through the torch reference give the same logits at every position of a prompt."""
    from sglang.srt.layers.moe import layer

    runner = make_cpu_runner(checkpoints[0])
    prompt = PROMPTS[3] + PROMPTS[7] + list(range(100, 120))
    expected = prefill(runner, prompt).next_token_logits
    monkeypatch.setattr(layer, "uses_fused_kernel", lambda hidden: True)
    got = prefill(runner, prompt).next_token_logits
    torch.testing.assert_close(got, expected, atol=1e-4 * expected.abs().max().item(), rtol=0)


@pytest.fixture
def two_ranks(monkeypatch):
    """This process as rank 1 of 2 (building and loading layers only: no collective runs)."""
    monkeypatch.setattr(parallel_state, "_state", parallel_state.TensorParallel(1, 2, None, None))


def test_a_tensor_parallel_split_inside_a_block_is_refused(two_ranks):
    """Qwen3-30B-A3B's 768 intermediate rows over 4 ranks are 192 each: not whole 128-row blocks."""
    experts = FusedMoE(4, 128, 192)
    with pytest.raises(ValueError, match="--tp-size 2 splits the experts' intermediate size 192 into 96 rows"):
        experts.quantize(Fp8MoEMethod())


def test_each_rank_loads_its_blocks_of_the_experts_scales(two_ranks):
    """Rank 1 of 2 with 512 intermediate rows: gate and up rows 256-511 and their block rows 2-3,
    down's columns 256-511 and its block columns 2-3."""
    hidden, inter = 256, 512
    module, experts = torch.nn.Module(), FusedMoE(2, hidden, inter)
    module.mlp = torch.nn.Module()
    module.mlp.experts = experts
    experts.quantize(Fp8MoEMethod())
    gen = torch.Generator().manual_seed(0)
    checkpoint = {}
    for e in range(2):
        for proj, shape in (
            ("gate_proj", (inter, hidden)),
            ("up_proj", (inter, hidden)),
            ("down_proj", (hidden, inter)),
        ):
            weight, scale = quantize_weight(torch.randn(shape, generator=gen), WeightScales.BLOCK)
            checkpoint[f"mlp.experts.{e}.{proj}.weight"] = weight
            checkpoint[f"mlp.experts.{e}.{proj}.weight_scale_inv"] = scale
    with torch.no_grad():
        shards = expert_shards(experts, hidden, "gate_proj", "up_proj", "down_proj")
        load_named_weights(module, checkpoint.items(), {}, experts=shards)
    for e in range(2):
        gate, up, down = (f"mlp.experts.{e}.{proj}" for proj in ("gate_proj", "up_proj", "down_proj"))
        assert torch.equal(experts.w13_weight_scale_inv[e, :2], checkpoint[f"{gate}.weight_scale_inv"][2:])
        assert torch.equal(experts.w13_weight_scale_inv[e, 2:], checkpoint[f"{up}.weight_scale_inv"][2:])
        assert torch.equal(experts.w2_weight_scale_inv[e], checkpoint[f"{down}.weight_scale_inv"][:, 2:])
        assert torch.equal(experts.w13_weight[e, 256:].float(), checkpoint[f"{up}.weight"][256:].float())
        assert torch.equal(experts.w2_weight[e].float(), checkpoint[f"{down}.weight"][:, 256:].float())


def test_a_layers_experts_left_unquantized_together_load_in_the_models_dtype(checkpoints, tmp_path):
    """`modules_to_not_convert` naming one layer's experts: that layer's stay float (its checkpoint
    tensors float), the other layer's FP8."""
    src = make_sharp_tiny_model(str(tmp_path / "float"), "qwen3_moe", **SHAPE)
    ignore = [*IGNORE, "model.layers.0.mlp.experts"]
    fp8 = write_fp8_checkpoint(src, str(tmp_path / "fp8"), "fp8-block", ignore)
    model = load_model(ModelConfig.from_path(fp8, "float32"), "cpu")
    assert model.model.layers[0].mlp.experts.w13_weight.dtype == torch.float32
    assert model.model.layers[2].mlp.experts.w13_weight.dtype == torch.float8_e4m3fn


def test_experts_of_one_layer_quantized_in_part_are_refused(checkpoints, tmp_path):
    path = _with_config(checkpoints[0], tmp_path / "part", ignore=[*IGNORE, "model.layers.0.mlp.experts.3"])
    with pytest.raises(ValueError, match="leaves model.layers.0.mlp.experts.3.gate_proj"):
        load_model(ModelConfig.from_path(path, "float32"), "meta", load_format="dummy")


@pytest.mark.parametrize(
    "quantization, online, message",
    [
        (
            {"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {}},
            None,
            "compressed-tensors quantized mixture-of-experts models are not served yet; FP8 experts are served "
            "block-wise",
        ),
        (None, "fp8", "--quantization fp8 of mixture-of-experts models is not served yet"),
    ],
    ids=["compressed-tensors", "online"],
)
def test_other_fp8_schemes_for_experts_are_refused_before_start(checkpoints, tmp_path, quantization, online, message):
    path = _with_quantization(checkpoints[1], tmp_path / "refused", quantization)
    with pytest.raises(ValueError, match=message):
        check_model_paths(ServerArgs(model_path=path, device="cpu", quantization=online))


def _with_config(src: str, dst, ignore: list[str]) -> str:
    shutil.copytree(src, dst)
    with open(os.path.join(dst, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"]["modules_to_not_convert"] = ignore
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(config, f)
    return str(dst)
