"""Loading a Hugging Face directory: find the weight files (safetensors, else PyTorch .bin;
sharded or not), build the model on the device, copy the weights in."""

from __future__ import annotations

import glob
import json
import os
from typing import Iterator

import torch
from safetensors import safe_open

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.layers.quantization import process_weights_after_loading, quantize_linear_layers
from sglang.srt.model_loader.dummy import fill_dummy_weights
from sglang.srt.model_loader.kv_scales import without_kv_cache_scales
from sglang.srt.models.registry import get_model_class

INDEX_FILE = "model.safetensors.index.json"
BIN_INDEX_FILE = "pytorch_model.bin.index.json"


def safetensors_files(model_path: str) -> list[str]:
    files = _indexed_or_globbed(model_path, INDEX_FILE, "*.safetensors")
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {model_path}")
    return files


def weight_files(model_path: str) -> list[str]:
    """The safetensors files, else the PyTorch `pytorch_model*.bin` files (older checkpoints)."""
    files = _indexed_or_globbed(model_path, INDEX_FILE, "*.safetensors") or _indexed_or_globbed(
        model_path, BIN_INDEX_FILE, "pytorch_model*.bin"
    )
    if not files:
        raise FileNotFoundError(f"no *.safetensors (or pytorch_model*.bin) weights in {model_path}")
    return files


def _indexed_or_globbed(model_path: str, index_name: str, pattern: str) -> list[str]:
    """The shards the index file names (all of which must exist), else the files matching `pattern`."""
    index_path = os.path.join(model_path, index_name)
    if os.path.isfile(index_path):
        with open(index_path) as f:
            weight_map = json.load(f).get("weight_map", {})
        files = sorted({os.path.join(model_path, name) for name in weight_map.values()})
        missing = [f for f in files if not os.path.isfile(f)]
        if missing:
            raise FileNotFoundError(
                f"{index_name} names shard {os.path.basename(missing[0])}, which is missing from {model_path}"
            )
        return files
    return sorted(glob.glob(os.path.join(model_path, pattern)))


def iterate_weights(files: list[str]) -> Iterator[tuple[str, torch.Tensor]]:
    for path in files:
        if path.endswith(".bin"):
            # weights_only: a .bin is a pickle, and nothing but tensors may come out of it.
            yield from torch.load(path, map_location="cpu", weights_only=True, mmap=True).items()
            continue
        with safe_open(path, framework="pt", device="cpu") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def load_model(model_config: ModelConfig, device: str, load_format: str = "auto") -> torch.nn.Module:
    """load_format (--load-format): "auto" (weight_files), "safetensors" or "pt" (only those
    files), "dummy" (no files: random weights, model_loader.dummy)."""
    files = None if load_format == "dummy" else files_of_format(model_config.path, load_format)
    model = _build(model_config, device)
    with torch.no_grad():
        if files is None:
            fill_dummy_weights(model)
        else:
            # KV cache scales belong to the KV pool (the model runner reads them: kv_scales).
            model.load_weights(without_kv_cache_scales(iterate_weights(files)))
        process_weights_after_loading(model)
    return model.eval()


def weight_bytes(model_config: ModelConfig, load_format: str = "auto") -> int:
    """What the model's weights will take: the size of its weight files, or with dummy weights
    the parameters of the model built on the meta device (with those `after_dummy_weights`
    adds). For memory planning before the model is loaded."""
    if load_format != "dummy":
        return sum(os.path.getsize(f) for f in files_of_format(model_config.path, load_format))
    model = _build(model_config, "meta")
    fill_dummy_weights(model)
    return parameter_bytes(model)


def parameter_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _build(model_config: ModelConfig, device: str) -> torch.nn.Module:
    """The model class of the config, its parameters made on `device` in the config's dtype."""
    model_class = get_model_class(model_config.architecture)
    previous_dtype = torch.get_default_dtype()
    torch.set_default_dtype(model_config.dtype)
    try:
        with torch.device(device):
            model = model_class(model_config.hf_config, context_len=model_config.context_len)
            if model_config.quantization is not None:
                quantize_linear_layers(model, model_config.quantization)
            return model
    finally:
        torch.set_default_dtype(previous_dtype)


def files_of_format(model_path: str, load_format: str) -> list[str]:
    """The weight files --load-format reads (not "dummy", which reads none)."""
    if load_format == "auto":
        return weight_files(model_path)
    if load_format == "safetensors":
        return safetensors_files(model_path)
    if load_format == "pt":
        files = _indexed_or_globbed(model_path, BIN_INDEX_FILE, "pytorch_model*.bin")
        if not files:
            raise FileNotFoundError(f"no pytorch_model*.bin weights in {model_path} (--load-format pt)")
        return files
    raise ValueError(f"--load-format must be one of auto, safetensors, pt, dummy; got {load_format!r}")
