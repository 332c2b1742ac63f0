"""FP8 checkpoints of each published layout (block-wise `fp8`, compressed-tensors `float-quantized`,
ModelOpt) and --quantization fp8 load, keep their ignored layers unquantized, and decode the first
greedy tokens of the same weights dequantized to float32 on at least 15 of 16 prompts, each
difference a near tie that activation quantization explains; a wrong scale fails that. Layouts not
served are refused before start-up, naming what is wrong."""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.model_loader.loader import load_model
from sglang.srt.model_paths import check_model_paths
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs
from sglang.test.fp8_agreement import MAX_NOISE, MIN_AGREEING, TIE_BOUND, Agreement
from sglang.test.fp8_checkpoints import calibrate, make_sharp_tiny_model, write_dequantized, write_fp8_checkpoint
from sglang.test.runner_utils import prefill
from sglang.test.tiny_models import make_tiny_model
from sglang.tools.fp8_checkpoint import LAYOUTS

PROMPTS = [[5 + i, 40 + 3 * i, 90 + i, 7, 200 - i] for i in range(16)]
NEW_TOKENS = 8
# Block-wise FP8 splits every projection into whole 128-row blocks, so the tiny models are a little wider.
SHAPES = {
    "llama": dict(
        hidden_size=128, intermediate_size=256, num_attention_heads=2, num_key_value_heads=2, num_hidden_layers=2
    ),
    "qwen3": dict(
        hidden_size=128,
        intermediate_size=256,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=128,
        num_hidden_layers=2,
    ),
}
# Each layout on one of the two architectures; each leaves the head and one projection unquantized.
CASES = {
    "fp8-block": ("qwen3", ["lm_head", "model.layers.0.mlp.down_proj"]),
    "ct-channel-dynamic": ("llama", ["lm_head", "re:.*layers\\.1\\.self_attn\\.o_proj"]),
    "ct-tensor-static": ("qwen3", ["lm_head"]),
    "ct-channel-weight-only": ("llama", ["lm_head"]),
    "modelopt": ("llama", ["lm_head", "model.layers.1.mlp.gate_proj", "model.layers.1.mlp.up_proj"]),
}
ONLINE = "online"  # --quantization fp8 of the llama model: its reference is its per-channel checkpoint's
FUSED_INTO = {
    "q_proj": "qkv_proj",
    "k_proj": "qkv_proj",
    "v_proj": "qkv_proj",
    "gate_proj": "gate_up_proj",
    "up_proj": "gate_up_proj",
}


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("fp8_sources")
    paths = {arch: make_sharp_tiny_model(str(root / arch), arch, **shape) for arch, shape in SHAPES.items()}
    return {arch: (path, calibrate(path, PROMPTS)) for arch, path in paths.items()}


@pytest.fixture(scope="module")
def checkpoints(sources, tmp_path_factory):
    """layout -> (FP8 directory, the same weights dequantized to a float32 directory)."""
    root = tmp_path_factory.mktemp("fp8_checkpoints")
    out = {}
    for layout, (arch, ignore) in CASES.items():
        src, amax = sources[arch]
        fp8 = write_fp8_checkpoint(src, str(root / layout), layout, ignore, amax)
        out[layout] = (fp8, write_dequantized(fp8, str(root / f"{layout}-dequantized")))
    src = sources["llama"][0]
    channel = write_fp8_checkpoint(src, str(root / "online-channel"), "ct-channel-dynamic", ["lm_head"])
    out[ONLINE] = (src, write_dequantized(channel, str(root / "online-dequantized")))
    return out


def greedy_batch(model_path: str, new_tokens: int = NEW_TOKENS, **server_args) -> list[list[int]]:
    scheduler = Scheduler(ServerArgs(model_path=model_path, device="cpu", dtype="float32", **server_args))
    params = SamplingParams(max_new_tokens=new_tokens, temperature=0, ignore_eos=True)
    for i, prompt in enumerate(PROMPTS):
        scheduler.add_request(TokenizedGenerateReqInput(str(i), prompt, params, stream=False))
    tokens: dict[str, list[int]] = {str(i): [] for i in range(len(PROMPTS))}
    while scheduler.has_work():
        out = scheduler.step()
        if out:
            for rid, new in zip(out.rids, out.new_token_ids):
                tokens[rid] += new
    return [tokens[str(i)] for i in range(len(PROMPTS))]


def test_every_layout_is_tested():
    assert set(CASES) == set(LAYOUTS)


@pytest.mark.parametrize("layout", list(CASES))
def test_layout_loads_fp8_weights_and_keeps_ignored_layers_unquantized(checkpoints, layout):
    model = load_model(ModelConfig.from_path(checkpoints[layout][0], "float32"), "cpu")
    params = dict(model.named_parameters())
    assert params["model.layers.1.self_attn.qkv_proj.weight"].dtype == torch.float8_e4m3fn
    assert params["model.embed_tokens.weight"].dtype == torch.float32
    assert params["model.norm.weight"].dtype == torch.float32
    for name in CASES[layout][1]:
        if name == "lm_head" or name.startswith("re:"):
            continue
        module, _, proj = name.rpartition(".")
        assert params[f"{module}.{FUSED_INTO.get(proj, proj)}.weight"].dtype == torch.float32, name
    if layout == "ct-channel-dynamic":
        assert params["model.layers.1.self_attn.o_proj.weight"].dtype == torch.float32
        assert params["model.layers.0.self_attn.o_proj.weight"].dtype == torch.float8_e4m3fn
    if layout in ("ct-tensor-static", "modelopt"):  # one input scale for the fused projections: their largest
        assert params["model.layers.1.self_attn.qkv_proj.input_scale"].shape == (1,)


@pytest.mark.parametrize("layout", [*CASES, ONLINE])
def test_first_greedy_tokens_agree_with_dequantized_weights(checkpoints, layout):
    """The two models hold the same weights and differ only where the FP8 one quantizes its
    activations. That moves the logits by `noise` (at most MAX_NOISE), and the first greedy tokens
    agree on at least MIN_AGREEING of 16 prompts; where they differ, the dequantized model's top
    token leads the FP8 model's by less than TIE_BOUND times the noise at that prompt. Weight-only
    FP8 quantizes nothing else: every token and logit agrees."""
    fp8, dequantized = checkpoints[layout]
    quantization = "fp8" if layout == ONLINE else None
    agreement = measure_agreement(fp8, dequantized, quantization)
    print(layout, agreement.summary())
    if layout == "ct-channel-weight-only":
        assert agreement.differ == [] and agreement.noise.max() < 1e-5
        return
    assert agreement.noise.max() <= MAX_NOISE, agreement.summary()
    assert agreement.agreeing >= MIN_AGREEING, agreement.summary()
    for i, gap in zip(agreement.differ, agreement.gaps):
        assert gap < TIE_BOUND * agreement.noise[i], agreement.summary()


@pytest.mark.parametrize("wrong", ["doubled", "ignored"])
def test_a_wrong_weight_scale_fails_the_agreement(checkpoints, tmp_path, wrong):
    """The criterion above catches a loader that misreads scales: the block-wise checkpoint with
    every weight scale doubled (one binade off), or replaced by ones (scales ignored), moves the
    logits far beyond MAX_NOISE and the first tokens off the dequantized model's."""
    fp8, dequantized = checkpoints["fp8-block"]
    broken = str(shutil.copytree(fp8, tmp_path / wrong))
    tensors = load_file(os.path.join(broken, "model.safetensors"))
    for name in [n for n in tensors if n.endswith("weight_scale_inv")]:
        tensors[name] = tensors[name] * 2 if wrong == "doubled" else torch.ones_like(tensors[name])
    save_file(tensors, os.path.join(broken, "model.safetensors"))
    agreement = measure_agreement(broken, dequantized)
    print(wrong, agreement.summary())
    assert agreement.noise.min() > 5 * MAX_NOISE
    assert agreement.agreeing < MIN_AGREEING


def test_the_sharp_models_layers_move_logits_far_more_than_activation_quantization(checkpoints):
    """The fixture is no model that copies its input: its decoder layers move every prompt's logits
    by more than 3 x MAX_NOISE (measured 13% to 29% of their spread; they change 2 and 5 of the 16
    first tokens) from what the last prompt token's embedding alone gives through the final norm
    and the head, while activation quantization moves them by 0.6% to 1.4%."""
    from transformers import AutoModelForCausalLM

    for layout in ("fp8-block", "ct-channel-dynamic"):  # one of each architecture
        model = AutoModelForCausalLM.from_pretrained(checkpoints[layout][1], dtype=torch.float32).eval()
        with torch.no_grad():
            full = model(torch.tensor(PROMPTS)).logits[:, -1]
            embedded = model.model.embed_tokens(torch.tensor([prompt[-1] for prompt in PROMPTS]))
            embedding_only = model.lm_head(model.model.norm(embedded))
        moved = (full - embedding_only).pow(2).mean(dim=-1).sqrt() / full.std(dim=-1)
        assert moved.min() > 3 * MAX_NOISE, (layout, moved)


def measure_agreement(fp8: str, dequantized: str, quantization: str | None = None) -> Agreement:
    """The FP8 model (this engine) against its dequantized float32 reference (transformers) on PROMPTS."""
    fp8_logits = _engine_first_logits(fp8, quantization)
    got = [tokens[0] for tokens in greedy_batch(fp8, 1, quantization=quantization)]
    assert fp8_logits.argmax(dim=-1).tolist() == got  # the scheduler's greedy token is the runner's argmax
    return Agreement(fp8_logits, _reference_first_logits(dequantized))


def _engine_first_logits(path: str, quantization: str | None = None) -> torch.Tensor:
    args = ServerArgs(model_path=path, dtype="float32", device="cpu", max_total_tokens=256, quantization=quantization)
    runner = ModelRunner(ModelConfig.from_path(path, "float32", "cpu", quantization=quantization), args)
    return torch.stack(
        [
            prefill(runner, prompt).next_token_logits.reshape(-1, runner.model_config.vocab_size)[-1]
            for prompt in PROMPTS
        ]
    )


def _reference_first_logits(path: str) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor(PROMPTS)).logits[:, -1]


def _with_quantization(src: str, dst, quantization: dict | None, hf_quant: dict | None = None) -> str:
    os.makedirs(dst)
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    config.pop("quantization_config", None)
    if quantization is not None:
        config["quantization_config"] = quantization
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(config, f)
    if hf_quant is not None:
        with open(os.path.join(dst, "hf_quant_config.json"), "w") as f:
            json.dump(hf_quant, f)
    return str(dst)


BLOCK = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
CT_GROUP = {
    "targets": ["Linear"],
    "weights": {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False, "strategy": "channel"},
    "input_activations": {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": True, "strategy": "token"},
}
CT = {"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"g": CT_GROUP}}


def _ct_with(section: str, **changes) -> dict:
    group = {**CT_GROUP, section: {**CT_GROUP[section], **changes}}
    return {**CT, "config_groups": {"g": group}}


REFUSED = {
    "awq": ({"quant_method": "awq", "bits": 4}, "'awq' is not served"),
    "gptq": ({"quant_method": "gptq", "bits": 4}, "'gptq' is not served"),
    "e5m2": ({**BLOCK, "fmt": "e5m2"}, "fmt 'e5m2'"),
    "block-64": ({**BLOCK, "weight_block_size": [64, 64]}, "weight_block_size [64, 64]"),
    "block-static": ({**BLOCK, "activation_scheme": "static"}, "activation_scheme 'static'"),
    "ct-pack": ({**CT, "format": "pack-quantized"}, "format 'pack-quantized'"),
    "ct-int8": (_ct_with("weights", type="int"), "num_bits/type '8/int'"),
    "ct-block": (_ct_with("weights", strategy="block"), "weights strategy 'block'"),
    "ct-group": (_ct_with("input_activations", strategy="group"), "strategy group"),
    "ct-asymmetric": (_ct_with("weights", symmetric=False), "weights symmetric False"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_layout_not_served_is_refused_before_start_naming_it(sources, tmp_path, case):
    quantization, message = REFUSED[case]
    path = _with_quantization(sources["llama"][0], tmp_path / case, quantization)
    with pytest.raises(ValueError, match="--model-path .*" + re.escape(message)):
        check_model_paths(ServerArgs(model_path=path, device="cpu"))


def test_modelopt_algorithm_not_served_is_refused(sources, tmp_path):
    hf_quant = {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4"}}
    path = _with_quantization(sources["llama"][0], tmp_path / "nvfp4", None, hf_quant)
    with pytest.raises(ValueError, match="quant_algo 'NVFP4' is not served"):
        check_model_paths(ServerArgs(model_path=path, device="cpu"))


def test_fused_projections_ignored_in_part_are_refused(checkpoints, sources, tmp_path):
    path = _with_quantization(sources["llama"][0], tmp_path / "part", {**BLOCK, "modules_to_not_convert": ["k_proj"]})
    with pytest.raises(ValueError, match="leaves model.layers.0.self_attn.k_proj unquantized"):
        load_model(ModelConfig.from_path(path, "float32"), "meta", load_format="dummy")


def test_fp8_weight_for_a_layer_the_config_leaves_unquantized_is_refused(checkpoints, tmp_path):
    fp8 = checkpoints["ct-channel-weight-only"][0]
    with open(os.path.join(fp8, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"]["ignore"].append("model.layers.0.mlp.down_proj")
    copy = tmp_path / "misdeclared"
    shutil.copytree(fp8, copy)
    with open(copy / "config.json", "w") as f:
        json.dump(config, f)
    with pytest.raises(ValueError, match="down_proj.weight' is torch.float8_e4m3fn in the checkpoint"):
        load_model(ModelConfig.from_path(str(copy), "float32"), "cpu")


def test_block_scales_that_split_a_projection_mid_block_are_refused(tmp_path):
    """The default tiny llama's q_proj has 64 rows: its k_proj would start inside a scale block."""
    src = make_tiny_model(str(tmp_path / "narrow"), "llama")
    fp8 = write_fp8_checkpoint(src, str(tmp_path / "narrow-fp8"), "fp8-block", ["lm_head"])
    with pytest.raises(ValueError, match="does not fall on whole 128-row FP8 scale blocks"):
        load_model(ModelConfig.from_path(fp8, "float32"), "cpu")


def test_dummy_weights_of_an_fp8_model_are_fp8_with_unit_scales(checkpoints):
    model = load_model(ModelConfig.from_path(checkpoints["fp8-block"][0], "float32"), "cpu", load_format="dummy")
    layer = model.model.layers[1].self_attn.qkv_proj
    assert layer.weight.dtype == torch.float8_e4m3fn and layer.weight.float().std() > 0.01
    assert torch.equal(layer.weight_scale_inv, torch.ones_like(layer.weight_scale_inv))


def test_online_fp8_quantizes_like_a_per_channel_checkpoint_and_serves_its_tokens(sources, tmp_path):
    """--quantization fp8 quantizes each linear weight per output row at load, with activations per
    token: the same model as a compressed-tensors per-channel FP8-dynamic checkpoint of the same
    weights (whose tokens test_first_greedy_tokens_agree_with_dequantized_weights compares)."""
    src = sources["llama"][0]
    checkpoint = write_fp8_checkpoint(src, str(tmp_path / "channel"), "ct-channel-dynamic", ["lm_head"])
    online = load_model(ModelConfig.from_path(src, "float32", quantization="fp8"), "cpu")
    stored = dict(load_model(ModelConfig.from_path(checkpoint, "float32"), "cpu").named_parameters())
    for name, param in online.named_parameters():
        assert param.dtype == stored[name].dtype and torch.equal(param.float(), stored[name].float()), name
    assert online.model.layers[0].self_attn.o_proj.weight.dtype == torch.float8_e4m3fn
    assert greedy_batch(src, quantization="fp8") == greedy_batch(checkpoint)


def test_online_fp8_of_a_quantized_checkpoint_is_refused(checkpoints):
    with pytest.raises(ValueError, match="--quantization fp8: the checkpoint is already quantized"):
        check_model_paths(ServerArgs(model_path=checkpoints["fp8-block"][0], device="cpu", quantization="fp8"))


def test_engine_serves_the_block_wise_checkpoint_with_the_schedulers_tokens(checkpoints):
    """Through sglang.Engine (the scheduler in its own process, reading the quantization config
    there): the tokens the in-process scheduler gives, which the test above compares with the
    dequantized model's."""
    import sglang

    path = checkpoints["fp8-block"][0]
    engine = sglang.Engine(model_path=path, dtype="float32", device="cpu", log_level="warning")
    try:
        outs = engine.generate(
            input_ids=PROMPTS, sampling_params={"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}
        )
    finally:
        engine.shutdown()
    assert [out["output_ids"] for out in outs] == greedy_batch(path)
