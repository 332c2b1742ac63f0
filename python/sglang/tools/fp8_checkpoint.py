"""FP8 checkpoints as published ones store them: a float linear weight quantized to e4m3 with the
scales a layout keeps (block-wise `fp8`, compressed-tensors `float-quantized`, ModelOpt), and the
quantization settings that tell a loader which layout it reads. make_random_model and the test
fixtures (sglang.test.fp8_checkpoints) both write through this module."""

from __future__ import annotations

import json
import os

import torch

from sglang.srt.layers.quantization import MODELOPT_FILE, matches
from sglang.srt.layers.quantization.fp8 import BLOCK, FP8_MAX, WeightScales, quantize

# The projections FP8 checkpoints quantize (routers, `mlp.gate`, never): attention, MLPs and experts
# (Mixtral's experts are w1 gate, w3 up, w2 down).
LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "w1", "w2", "w3")
_CT_TOKEN = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": True, "strategy": "token"}
_CT_STATIC = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False, "strategy": "tensor"}

# layout -> (weight scales, quantization settings: config.json's quantization_config, or None for
# ModelOpt's hf_quant_config.json). The ignore list is added by quantization_settings.
LAYOUTS = {
    "fp8-block": (  # Qwen3-*-FP8, DeepSeek-V3
        WeightScales.BLOCK,
        {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [BLOCK, BLOCK]},
    ),
    # RedHat's FP8-dynamic: per-channel weights, activations quantized per token at run time
    "ct-channel-dynamic": (WeightScales.CHANNEL, {"weights": "channel", "input_activations": _CT_TOKEN}),
    "ct-tensor-static": (WeightScales.TENSOR, {"weights": "tensor", "input_activations": _CT_STATIC}),
    "ct-channel-weight-only": (WeightScales.CHANNEL, {"weights": "channel", "input_activations": None}),
    "modelopt": (WeightScales.TENSOR, None),
}
STATIC_LAYOUTS = ("ct-tensor-static", "modelopt")  # these need each input's calibrated amax


def quantize_weight(weight: torch.Tensor, scales: WeightScales) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 weight, its float32 scale as the layout stores it) of a float weight [N, K]: each
    128 x 128 block, row or the whole tensor scaled so that its largest entry is e4m3's 448."""
    w = weight.float()
    n, k = w.shape
    if scales is WeightScales.BLOCK:
        padded = torch.nn.functional.pad(w, (0, -k % BLOCK, 0, -n % BLOCK))
        blocks = padded.view(padded.shape[0] // BLOCK, BLOCK, padded.shape[1] // BLOCK, BLOCK)
        scale = blocks.abs().amax(dim=(1, 3)) / FP8_MAX
        full = scale.repeat_interleave(BLOCK, 0)[:n].repeat_interleave(BLOCK, 1)[:, :k]
        return quantize(w, full.clamp(min=1e-12)), scale
    amax = w.abs().amax(dim=1, keepdim=True) if scales is WeightScales.CHANNEL else w.abs().amax().reshape(1)
    scale = amax / FP8_MAX
    return quantize(w, scale.clamp(min=1e-12)), scale


def is_quantized_weight(name: str, ignore: list[str]) -> bool:
    """Whether the checkpoint tensor `name` is a linear weight the layout stores in FP8."""
    module = name.removesuffix(".weight")
    return name.endswith(".weight") and module.rpartition(".")[2] in LINEAR_NAMES and not matches(module, ignore)


def quantized_tensors(name: str, weight: torch.Tensor, layout: str, input_amax: float | None = None) -> dict:
    """The checkpoint tensors that hold the linear weight `name` in `layout`: the e4m3 weight, its
    scale, and for static layouts the input scale (`input_amax`: the largest input magnitude seen
    in calibration). ModelOpt's exports also carry k_scale / v_scale on k_proj / v_proj."""
    module = name.removesuffix(".weight")
    quantized, scale = quantize_weight(weight, LAYOUTS[layout][0])
    out = {name: quantized, f"{module}.{'weight_scale_inv' if layout == 'fp8-block' else 'weight_scale'}": scale}
    if layout in STATIC_LAYOUTS:
        out[f"{module}.input_scale"] = torch.tensor([input_amax / FP8_MAX], device=weight.device)
    if layout == "modelopt" and module.endswith(("k_proj", "v_proj")):
        out[f"{module}.{module[-6]}_scale"] = torch.tensor([1.0], device=weight.device)
    return out


def quantization_settings(layout: str, ignore: list[str]) -> dict:
    """config.json's `quantization_config` for `layout` (ModelOpt: the hf_quant_config.json)."""
    settings = LAYOUTS[layout][1]
    if layout == "fp8-block":
        return {**settings, "modules_to_not_convert": ignore}
    if layout.startswith("ct-"):
        weights = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False, "strategy": settings["weights"]}
        group = {"targets": ["Linear"], "weights": weights, "input_activations": settings["input_activations"]}
        return {
            "quant_method": "compressed-tensors",
            "format": "float-quantized",
            "config_groups": {"group_0": group},
            "ignore": ignore,
        }
    return {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "FP8", "exclude_modules": ignore}}


def write_quantization_settings(model_dir: str, layout: str, ignore: list[str]) -> None:
    """Adds `layout`'s settings to the config.json in `model_dir` (ModelOpt: a file beside it)."""
    settings = quantization_settings(layout, ignore)
    if layout == "modelopt":
        with open(os.path.join(model_dir, MODELOPT_FILE), "w") as f:
            json.dump(settings, f)
        return
    config_path = os.path.join(model_dir, "config.json")
    with open(config_path) as f:
        config = json.load(f)
    config["quantization_config"] = settings
    with open(config_path, "w") as f:
        json.dump(config, f, indent=2)
