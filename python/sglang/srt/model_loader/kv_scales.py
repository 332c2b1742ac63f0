"""FP8 KV cache scales in a checkpoint: per layer, the K and the V scale (real value = FP8 value
x scale) that calibration chose. Published names, under `model.layers.N.self_attn.`:

- `k_scale` / `v_scale` (vLLM and SGLang exports, newer compressed-tensors);
- `k_proj.k_scale` / `v_proj.v_scale` (ModelOpt), also under `qkv_proj.` or `attn.`;
- `k_proj.output_scale` / `v_proj.output_scale` (older compressed-tensors);
- `kv_scale` (older FP8 exports: one scale for both).

The weight loader skips these names (`without_kv_cache_scales`); with an FP8 KV cache the model
runner reads them (`read_kv_cache_scales`). A layer the checkpoint gives no scale gets 1.0.
"""

from __future__ import annotations

import logging
import re
from typing import Iterable, Iterator

import torch
from safetensors import safe_open

logger = logging.getLogger(__name__)

_KV_SCALE_NAME = re.compile(
    r"^(?:model\.)?layers\.(?P<layer>\d+)\.self_attn\."
    r"(?:(?:k_proj\.(?P<k_out>output_scale|k_scale))|(?:v_proj\.(?P<v_out>output_scale|v_scale))"
    r"|(?:(?:qkv_proj|attn)\.)?(?P<which>k_scale|v_scale|kv_scale))$"
)


def kv_scale_target(name: str) -> tuple[int, str] | None:
    """(layer id, "k" | "v" | "kv") for a KV cache scale's checkpoint name, else None."""
    match = _KV_SCALE_NAME.match(name)
    if match is None:
        return None
    if match["k_out"]:
        return int(match["layer"]), "k"
    if match["v_out"]:
        return int(match["layer"]), "v"
    return int(match["layer"]), match["which"].removesuffix("_scale")


def without_kv_cache_scales(weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """The weights with the KV cache scales left out (they belong to the KV pool, not the model)."""
    return ((name, tensor) for name, tensor in weights if kv_scale_target(name) is None)


def read_kv_cache_scales(files: list[str], num_layers: int) -> dict[int, tuple[float, float]]:
    """{layer id: (k_scale, v_scale)} for the layers whose scales the weight files hold; a layer
    with only one of the two gets 1.0 for the other. A scale of several entries (per head) becomes
    its largest: one scale per tensor is what the pool keeps, and the largest saturates nothing."""
    found: dict[int, dict[str, float]] = {}
    for name, tensor in _named_kv_scales(files):
        layer, which = kv_scale_target(name)
        value = float(tensor.float().max())
        if tensor.numel() > 1:
            logger.info("KV cache scale %s has %d entries: using their largest, %g", name, tensor.numel(), value)
        if not value > 0 or value == float("inf"):
            raise ValueError(f"KV cache scale {name!r} is {value}; a scale must be positive and finite")
        if layer >= num_layers:
            raise ValueError(f"KV cache scale {name!r} is for layer {layer}, but the model has {num_layers} layers")
        for part in "kv" if which == "kv" else which:
            found.setdefault(layer, {})[part] = value
    return {layer: (parts.get("k", 1.0), parts.get("v", 1.0)) for layer, parts in sorted(found.items())}


def _named_kv_scales(files: list[str]) -> Iterator[tuple[str, torch.Tensor]]:
    """Only the scale tensors: safetensors reads no other tensor; a .bin is memory-mapped."""
    for path in files:
        if path.endswith(".bin"):
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            yield from ((name, t) for name, t in state.items() if kv_scale_target(name) is not None)
            continue
        with safe_open(path, framework="pt", device="cpu") as f:
            for name in f.keys():
                if kv_scale_target(name) is not None:
                    yield name, f.get_tensor(name)
