"""Attention backends, behind a registry with lazy imports so a CPU machine never imports
a GPU-only library it does not use."""

from __future__ import annotations

import importlib

_BACKENDS = {
    "torch_native": ("sglang.srt.layers.attention.torch_native_backend", "TorchNativeAttnBackend"),
    "triton": ("sglang.srt.layers.attention.triton_backend", "TritonAttnBackend"),
}


def create_attention_backend(name: str, model_runner):
    if name not in _BACKENDS:
        raise ValueError(f"--attention-backend must be one of {', '.join(_BACKENDS)}; got {name!r}")
    module_name, class_name = _BACKENDS[name]
    return getattr(importlib.import_module(module_name), class_name)(model_runner)
