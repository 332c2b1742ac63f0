"""FP8 checkpoints written from a float model directory, in the layouts published checkpoints use
(block-wise `fp8`, compressed-tensors `float-quantized`, ModelOpt), and the same weights
dequantized to a plain float32 checkpoint, for comparing the two."""

from __future__ import annotations

import json
import os
import shutil

import torch
from safetensors.torch import load_file, save_file

from sglang.srt.layers.quantization.fp8 import FP8, WeightScales, dequantize_weight
from sglang.test.tiny_models import make_tiny_model
from sglang.test.tiny_moe_models import MOE_ARCHITECTURES, make_tiny_moe_model
from sglang.tools.fp8_checkpoint import (
    LINEAR_NAMES,
    is_quantized_weight,
    quantized_tensors,
    write_quantization_settings,
)

# The sharp fixture (make_sharp_tiny_model): decoder projections drawn with the 0.02 standard
# deviation real checkpoints are initialised with, embeddings with ten times that, so that each
# layer adds an update to the residual stream a fraction of its size, as in a pre-norm transformer.
LINEAR_STD = 0.02
EMBED_STD = 0.2
# A tiny MoE's experts (a few dozen intermediate rows each, two of them per token) drawn at
# LINEAR_STD would add a few percent to the logits, within what activation quantization moves: at
# twice that their SwiGLU output is eight times larger and they move the logits as a layer does.
EXPERT_STD = 2 * LINEAR_STD
# Routers at LINEAR_STD give logits a few hundredths apart: every routing a near-tie that rounding
# an activation flips, swapping an expert. Trained routers are decisive; these are drawn ten times wider.
ROUTER_STD = 10 * LINEAR_STD


def make_sharp_tiny_model(path: str, arch: str, seed: int = 0, **config_overrides) -> str:
    """A tiny random model (make_tiny_model) whose first greedy tokens rounding its activations to
    e4m3 seldom moves. The default tiny models draw every weight with a standard deviation of 0.2,
    so at width 128 each layer's output is ~25 times its input's and the logits are carried by
    products of layers each rounded within 2^-4: the activation rounding moves them by ~10% of
    their spread and swaps the near-ties a flat random distribution over 384 tokens is full of.
    Here the layers' updates are modest (LINEAR_STD, EMBED_STD): the rounding moves logits by ~1%,
    while the layers still decide about a third of the first tokens (a model that only copied its
    embeddings would prove nothing: test_fp8_checkpoints checks that a wrong scale changes them)."""
    make = make_tiny_moe_model if arch in MOE_ARCHITECTURES else make_tiny_model  # the MoE families too
    make(path, arch, seed=seed, initializer_range=LINEAR_STD, **config_overrides)
    file = os.path.join(path, "model.safetensors")
    tensors = load_file(file)
    tensors["model.embed_tokens.weight"] = tensors["model.embed_tokens.weight"] * (EMBED_STD / LINEAR_STD)
    for name in [name for name in tensors if ".experts." in name]:
        tensors[name] = tensors[name] * (EXPERT_STD / LINEAR_STD)
    for name in [name for name in tensors if name.endswith(("mlp.gate.weight", "block_sparse_moe.gate.weight"))]:
        tensors[name] = tensors[name] * (ROUTER_STD / LINEAR_STD)
    save_file(tensors, file, metadata={"format": "pt"})
    return path


def write_fp8_checkpoint(src: str, dst: str, layout: str, ignore: list[str], input_amax: dict | None = None) -> str:
    """`src`'s model with its linear weights (all but those `ignore` names by module) in FP8 as
    `layout` stores them, at `dst`. Static layouts need `input_amax`: checkpoint module name ->
    the largest input magnitude seen in calibration (`calibrate`). ModelOpt's also carries
    k_scale / v_scale. Returns `dst`."""
    tensors = load_file(os.path.join(src, "model.safetensors"))
    out = {}
    for name, tensor in tensors.items():
        if not is_quantized_weight(name, ignore):
            out[name] = tensor
            continue
        amax = input_amax[name.removesuffix(".weight")] if input_amax is not None else None
        out.update(quantized_tensors(name, tensor, layout, amax))
    _copy_directory(src, dst)
    save_file(out, os.path.join(dst, "model.safetensors"))
    write_quantization_settings(dst, layout, ignore)
    return dst


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
