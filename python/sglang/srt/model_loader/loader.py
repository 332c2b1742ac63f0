"""Loading a Hugging Face directory: find the safetensors files (sharded or not), build the
model on the device, copy the weights in."""

from __future__ import annotations

import glob
import json
import os
from typing import Iterator

import torch
from safetensors import safe_open

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.models.registry import get_model_class

INDEX_FILE = "model.safetensors.index.json"


def safetensors_files(model_path: str) -> list[str]:
    index_path = os.path.join(model_path, INDEX_FILE)
    if os.path.isfile(index_path):
        with open(index_path) as f:
            weight_map = json.load(f).get("weight_map", {})
        files = sorted({os.path.join(model_path, name) for name in weight_map.values()})
        missing = [f for f in files if not os.path.isfile(f)]
        if missing:
            raise FileNotFoundError(f"{INDEX_FILE} names shard {os.path.basename(missing[0])}, "
                                    f"which is missing from {model_path}")
        return files
    files = sorted(glob.glob(os.path.join(model_path, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {model_path}")
    return files


def iterate_weights(files: list[str]) -> Iterator[tuple[str, torch.Tensor]]:
    for path in files:
        with safe_open(path, framework="pt", device="cpu") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def load_model(model_config: ModelConfig, device: str) -> torch.nn.Module:
    model_class = get_model_class(model_config.architecture)
    files = safetensors_files(model_config.path)
    previous_dtype = torch.get_default_dtype()
    torch.set_default_dtype(model_config.dtype)
    try:
        with torch.device(device):
            model = model_class(model_config.hf_config)
    finally:
        torch.set_default_dtype(previous_dtype)
    with torch.no_grad():
        model.load_weights(iterate_weights(files))
    return model.eval()
