"""Quantized checkpoints: config.json's `quantization_config` (or ModelOpt's hf_quant_config.json), read
once into a config object that tells each linear layer how its weights are stored and multiplied. The
config classes sit behind a registry by `quant_method`, imported lazily; any other method is refused
before start-up, by name."""

from __future__ import annotations

import fnmatch
import importlib
import os
import re
from typing import Iterable, Iterator

import torch
from torch import nn

from sglang.srt.utils import read_json_object

# quant_method -> (module, config class). Each class has `from_config(dict)`, `linear_method(names)`.
_METHODS = {
    "fp8": ("sglang.srt.layers.quantization.fp8", "Fp8Config"),
    "compressed-tensors": ("sglang.srt.layers.quantization.compressed_tensors", "CompressedTensorsConfig"),
    "modelopt": ("sglang.srt.layers.quantization.modelopt", "ModelOptFp8Config"),
}
MODELOPT_FILE = "hf_quant_config.json"
# Per-tensor KV-cache scales some FP8 checkpoints carry: the KV cache is held in the model's dtype,
# which needs none of them.
KV_SCALE_SUFFIXES = (".k_scale", ".v_scale")
# config.json keys of mixture-of-experts models, whose experts are served in FP8 block-wise only.
_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")
_MOE_METHODS = ("fp8",)  # quant_methods whose config gives FusedMoE layers a method (`moe_method`)


ONLINE_METHODS = ("fp8",)  # --quantization


def read_quantization_config(model_path: str, config: dict, online: str | None = None):
    """The quantization config of a model directory (config.json as a dict), or None for an
    unquantized checkpoint; `online` (--quantization) quantizes an unquantized one at load. A
    ValueError names what is not served."""
    raw = config.get("quantization_config")
    if raw is None and os.path.isfile(os.path.join(model_path, MODELOPT_FILE)):
        raw = {"quant_method": "modelopt", **read_json_object(os.path.join(model_path, MODELOPT_FILE))}
    if online is not None:
        return _online_config(online, raw, config)
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ValueError(f"quantization_config must be an object, not {type(raw).__name__}")
    method = raw.get("quant_method")
    if method not in _METHODS:
        raise ValueError(
            f"quantization_config.quant_method {method!r} is not served; served: {', '.join(sorted(_METHODS))}"
        )
    if method not in _MOE_METHODS and any(config.get(key) for key in _EXPERT_KEYS):
        raise ValueError(
            f"{method} quantized mixture-of-experts models are not served yet; FP8 experts are served "
            "block-wise (quant_method fp8, weight_block_size [128, 128])"
        )
    module, name = _METHODS[method]
    return getattr(importlib.import_module(module), name).from_config(raw)


def _online_config(online: str, raw, config: dict):
    if online not in ONLINE_METHODS:
        raise ValueError(f"--quantization {online} is not served; served: {', '.join(ONLINE_METHODS)}")
    if raw is not None:
        method = raw.get("quant_method") if isinstance(raw, dict) else raw
        raise ValueError(
            f"--quantization {online}: the checkpoint is already quantized ({method}); drop --quantization"
        )
    if any(config.get(key) for key in _EXPERT_KEYS):
        raise ValueError(f"--quantization {online} of mixture-of-experts models is not served yet (FP8 experts)")
    from sglang.srt.layers.quantization.fp8 import OnlineFp8Config

    return OnlineFp8Config()


def matches(name: str, patterns: Iterable[str]) -> bool:
    """Whether a checkpoint module name is listed: by its whole name, a trailing part of it
    (`lm_head`, `mlp.down_proj`), a module above it, a `re:` regular expression (compressed-tensors)
    or a `*` wildcard (ModelOpt's `model.layers.*.mlp.gate`)."""
    for pattern in patterns:
        if pattern.startswith("re:"):
            if re.fullmatch(pattern[3:], name):
                return True
        elif "*" in pattern:
            if fnmatch.fnmatchcase(name, pattern):
                return True
        elif name == pattern or name.endswith("." + pattern) or name.startswith(pattern + "."):
            return True
    return False


def layer_checkpoint_names(module_name: str, fused: dict) -> list[str]:
    """The checkpoint modules whose weights a layer holds: `...q_proj`, `...k_proj`, `...v_proj`
    for a fused `...qkv_proj` (`fused`: the model's FusedShards), else its own name."""
    head, _, last = module_name.rpartition(".")
    prefix = f"{head}." if head else ""
    names = [prefix + split for split, shard in fused.items() if shard.fused_name == last]
    return names or [module_name]


def quantize_linear_layers(model: nn.Module, quant_config) -> None:
    """Gives each linear layer the checkpoint quantizes its linear method, and each FusedMoE layer
    its experts' method (their parameters become the checkpoint's: FP8 weights and scales). A fused
    layer's projections, and a layer's experts, must be stored alike. Routers are never quantized."""
    from sglang.srt.layers.linear import Linear
    from sglang.srt.layers.moe.layer import FusedMoE

    fused = model.fused_shards() if hasattr(model, "fused_shards") else {}
    for name, module in model.named_modules():
        method = None
        if isinstance(module, Linear) and module.quantizable:
            method = quant_config.linear_method(layer_checkpoint_names(name, fused))
        elif isinstance(module, FusedMoE):
            names = expert_checkpoint_names(name, module.num_experts, model.expert_projections)
            method = quant_config.moe_method(names)
        if method is not None:
            module.quantize(method)


def expert_checkpoint_names(module_name: str, num_experts: int, projections: Iterable[str]) -> list[str]:
    """The checkpoint modules a FusedMoE layer holds: `<module>.<e>.<projection>` for every expert."""
    return [f"{module_name}.{e}.{proj}" for e in range(num_experts) for proj in projections]


def process_weights_after_loading(model: nn.Module) -> None:
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if method is not None:
            method.process_weights_after_loading(module)


def without_kv_scales(weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    return ((name, tensor) for name, tensor in weights if not name.endswith(KV_SCALE_SUFFIXES))


def linear_method_for(names: list[str], ignore: list[str], method, what: str):
    """`method` for a layer whose checkpoint modules are `names`, None where `ignore` lists them
    all; a fused layer whose projections are listed in part is refused (one format per matmul)."""
    listed = [matches(name, ignore) for name in names]
    if all(listed):
        return None
    if any(listed):
        kept = [name for name, hit in zip(names, listed) if hit]
        raise ValueError(
            f"{what} leaves {', '.join(kept)} unquantized but not the projections fused with it "
            f"({', '.join(n for n in names if n not in kept)}); a fused layer must be stored in one format"
        )
    return method
