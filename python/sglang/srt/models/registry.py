"""Architecture name (config.json `architectures[0]`) -> model class, imported lazily."""

from __future__ import annotations

import importlib

_MODELS = {
    "LlamaForCausalLM": "sglang.srt.models.llama",
    "LlamaForCausalLMEagle3": "sglang.srt.models.llama_eagle3",
    "MistralForCausalLM": "sglang.srt.models.llama",
    "MixtralForCausalLM": "sglang.srt.models.mixtral",
    "Qwen2ForCausalLM": "sglang.srt.models.llama",
    "Qwen2MoeForCausalLM": "sglang.srt.models.qwen_moe",
    "Qwen3ForCausalLM": "sglang.srt.models.llama",
    "Qwen3MoeForCausalLM": "sglang.srt.models.qwen_moe",
}


DRAFT_ARCHITECTURES = ("LlamaForCausalLMEagle3",)  # served only as --speculative-draft-model-path
# Published draft configs read into LlamaForCausalLMEagle3 (model_loader.eagle3_formats), not model classes.
PUBLISHED_DRAFT_ARCHITECTURES = ("Eagle3Speculator", "Eagle3DraftModel")


def supported_architectures(draft: bool | None = None) -> list[str]:
    """Every architecture; draft=False: those a server serves as its model, True: drafts only."""
    return sorted(name for name in _MODELS if draft is None or (name in DRAFT_ARCHITECTURES) == draft)


def check_architecture(architectures, draft: bool, where: str) -> None:
    """config.json's `architectures` must name one this engine serves in that role; checked
    before any process starts, so a wrong model fails in a line, not after start-up."""
    name = architectures[0] if isinstance(architectures, list) and architectures else None
    allowed = supported_architectures(draft)
    if name not in allowed:
        role = "an EAGLE-3 draft" if draft else "a model to serve"
        hint = (
            " (it is an EAGLE-3 draft: pass it as --speculative-draft-model-path)"
            if (not draft and name in DRAFT_ARCHITECTURES + PUBLISHED_DRAFT_ARCHITECTURES)
            else ""
        )
        raise ValueError(
            f"{where}: config.json names architecture {name!r}, which is not supported as {role}"
            f"{hint}; supported: {', '.join(allowed)}"
        )


def get_model_class(architecture: str):
    if architecture not in _MODELS:
        raise ValueError(
            f"model architecture {architecture!r} is not supported; supported: {', '.join(supported_architectures())}"
        )
    return getattr(importlib.import_module(_MODELS[architecture]), architecture)
