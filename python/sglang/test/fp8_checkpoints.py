"""FP8 checkpoints written from a float model directory, in the layouts published checkpoints use
(block-wise `fp8`, compressed-tensors `float-quantized`, ModelOpt), and the same weights
dequantized to a plain float32 checkpoint, for comparing the two."""

from __future__ import annotations

import json
import os
import shutil

import torch
from safetensors.torch import load_file, save_file

from sglang.srt.layers.quantization import matches
from sglang.srt.layers.quantization.fp8 import BLOCK, FP8, FP8_MAX, dequantize_weight, quantize, WeightScales

LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_CT_TOKEN = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": True, "strategy": "token"}
_CT_STATIC = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False, "strategy": "tensor"}

# layout -> (weight scales, quantization settings: config.json's quantization_config, or None for
# ModelOpt's hf_quant_config.json). `ignore` is filled in by write_fp8_checkpoint.
LAYOUTS = {
    "fp8-block": (
        WeightScales.BLOCK,
        {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [BLOCK, BLOCK]},
    ),
    "ct-channel-dynamic": (WeightScales.CHANNEL, {"weights": "channel", "input_activations": _CT_TOKEN}),
    "ct-tensor-static": (WeightScales.TENSOR, {"weights": "tensor", "input_activations": _CT_STATIC}),
    "ct-channel-weight-only": (WeightScales.CHANNEL, {"weights": "channel", "input_activations": None}),
    "modelopt": (WeightScales.TENSOR, None),
}


def quantize_weight(weight: torch.Tensor, scales: WeightScales) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 weight, its scale as the layout stores it) of a float weight [N, K]."""
    w = weight.float()
    n, k = w.shape
    if scales is WeightScales.BLOCK:
        padded = torch.nn.functional.pad(w, (0, -k % BLOCK, 0, -n % BLOCK))
        blocks = padded.view(padded.shape[0] // BLOCK, BLOCK, padded.shape[1] // BLOCK, BLOCK)
        scale = blocks.abs().amax(dim=(1, 3)) / FP8_MAX
        full = scale.repeat_interleave(BLOCK, 0)[:n].repeat_interleave(BLOCK, 1)[:, :k]
        return quantize(w, full.clamp(min=1e-12)), scale
    scale = (w.abs().amax(dim=1, keepdim=True) if scales is WeightScales.CHANNEL else w.abs().amax().reshape(1)) / 448
    return quantize(w, scale.clamp(min=1e-12)), scale


def write_fp8_checkpoint(src: str, dst: str, layout: str, ignore: list[str], input_amax: dict | None = None) -> str:
    """`src`'s model with its linear weights (all but those `ignore` names by module) in FP8 as
    `layout` stores them, at `dst`. Static layouts need `input_amax`: checkpoint module name ->
    the largest input magnitude seen in calibration (`calibrate`). ModelOpt's also carries
    k_scale / v_scale (which the engine skips). Returns `dst`."""
    scales_kind, settings = LAYOUTS[layout]
    tensors = load_file(os.path.join(src, "model.safetensors"))
    out = {}
    for name, tensor in tensors.items():
        module = name.removesuffix(".weight")
        if not (name.endswith(".weight") and module.rpartition(".")[2] in LINEAR_NAMES) or matches(module, ignore):
            out[name] = tensor
            continue
        weight, scale = quantize_weight(tensor, scales_kind)
        out[name] = weight
        out[f"{module}.{'weight_scale_inv' if layout == 'fp8-block' else 'weight_scale'}"] = scale
        if layout in ("ct-tensor-static", "modelopt"):
            out[f"{module}.input_scale"] = torch.tensor([input_amax[module] / FP8_MAX])
        if layout == "modelopt" and module.endswith(("k_proj", "v_proj")):
            out[f"{module}.{module[-6]}_scale"] = torch.tensor([1.0])
    _copy_directory(src, dst)
    save_file(out, os.path.join(dst, "model.safetensors"))
    _write_quantization_settings(dst, layout, settings, ignore)
    return dst


def _write_quantization_settings(dst: str, layout: str, settings: dict | None, ignore: list[str]) -> None:
    config_path = os.path.join(dst, "config.json")
    with open(config_path) as f:
        config = json.load(f)
    if layout == "fp8-block":
        config["quantization_config"] = {**settings, "modules_to_not_convert": ignore}
    elif layout.startswith("ct-"):
        weights = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False, "strategy": settings["weights"]}
        group = {"targets": ["Linear"], "weights": weights, "input_activations": settings["input_activations"]}
        config["quantization_config"] = {
            "quant_method": "compressed-tensors",
            "format": "float-quantized",
            "config_groups": {"group_0": group},
            "ignore": ignore,
        }
    else:
        modelopt = {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "FP8", "exclude_modules": ignore}}
        with open(os.path.join(dst, "hf_quant_config.json"), "w") as f:
            json.dump(modelopt, f)
    with open(config_path, "w") as f:
        json.dump(config, f, indent=2)


def write_dequantized(fp8_dir: str, dst: str) -> str:
    """The FP8 checkpoint at `fp8_dir` with every weight dequantized to float32 and no scales: a
    plain checkpoint computing what the FP8 one does, short of activation quantization."""
    tensors = load_file(os.path.join(fp8_dir, "model.safetensors"))
    out = {}
    for name, tensor in tensors.items():
        if tensor.dtype != FP8:
            if not name.endswith(("_scale", "_scale_inv")):
                out[name] = tensor
            continue
        module = name.removesuffix(".weight")
        if f"{module}.weight_scale_inv" in tensors:
            out[name] = dequantize_weight(tensor, tensors[f"{module}.weight_scale_inv"], WeightScales.BLOCK)
        else:
            scale = tensors[f"{module}.weight_scale"]
            out[name] = dequantize_weight(tensor, scale.reshape(-1, 1), WeightScales.CHANNEL)
    _copy_directory(fp8_dir, dst)
    for extra in ("hf_quant_config.json",):
        if os.path.exists(os.path.join(dst, extra)):
            os.remove(os.path.join(dst, extra))
    save_file(out, os.path.join(dst, "model.safetensors"))
    with open(os.path.join(dst, "config.json")) as f:
        config = json.load(f)
    config.pop("quantization_config", None)
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return dst


def calibrate(src: str, prompts: list[list[int]]) -> dict[str, float]:
    """Each linear module's largest input magnitude over `prompts`, from transformers' model."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    amax: dict[str, float] = {}

    def hook(name):
        def record(_module, inputs, _output):
            amax[name] = max(amax.get(name, 0.0), inputs[0].abs().max().item())

        return record

    handles = [
        module.register_forward_hook(hook(name))
        for name, module in model.named_modules()
        if name.rpartition(".")[2] in LINEAR_NAMES
    ]
    with torch.no_grad():
        for prompt in prompts:
            model(torch.tensor([prompt]))
    for handle in handles:
        handle.remove()
    return amax


def _copy_directory(src: str, dst: str) -> None:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.safetensors", "*.index.json"), dirs_exist_ok=True)
