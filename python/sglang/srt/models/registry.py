"""Architecture name (config.json `architectures[0]`) -> model class, imported lazily."""

from __future__ import annotations

import importlib

_MODELS = {
    "LlamaForCausalLM": "sglang.srt.models.llama",
    "LlamaForCausalLMEagle3": "sglang.srt.models.llama_eagle3",
    "Qwen2ForCausalLM": "sglang.srt.models.llama",
    "Qwen3ForCausalLM": "sglang.srt.models.llama",
}


def supported_architectures() -> list[str]:
    return sorted(_MODELS)


def get_model_class(architecture: str):
    if architecture not in _MODELS:
        raise ValueError(
            f"model architecture {architecture!r} is not supported; supported: "
            f"{', '.join(supported_architectures())}"
        )
    return getattr(importlib.import_module(_MODELS[architecture]), architecture)
