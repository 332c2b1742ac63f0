"""ModelConfig: what the runtime needs to know about a checkpoint, read from its config.json."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Optional

import torch

# --dtype's names; "half" and "float" are upstream's aliases.
_DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "half": torch.float16,
    "float": torch.float32,
}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    path: str
    hf_config: Any  # transformers.PretrainedConfig
    architecture: str
    dtype: torch.dtype
    context_len: int
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    quantization: Any = None  # layers/quantization's config of a quantized checkpoint

    @classmethod
    def from_path(
        cls,
        path: str,
        dtype: str = "auto",
        device: str = "cpu",
        context_length: Optional[int] = None,
        trust_remote_code: bool = False,
        quantization: Optional[str] = None,
    ) -> "ModelConfig":
        """`quantization`: --quantization (quantize an unquantized checkpoint at load)."""
        hf_config = load_hf_config(path, trust_remote_code)
        dtype = resolve_dtype(dtype, hf_config, device)
        return cls.from_hf_config(path, hf_config, dtype, context_length, quantization)

    @classmethod
    def from_hf_config(
        cls,
        path: str,
        hf_config,
        dtype: torch.dtype,
        context_length: Optional[int] = None,
        quantization: Optional[str] = None,
    ) -> "ModelConfig":
        """From a config already read (an EAGLE-3 draft's is normalised from its published layout)."""
        architectures = getattr(hf_config, "architectures", None) or []
        if not architectures:
            raise ValueError(f"{path}/config.json names no architecture ('architectures' is missing)")
        max_pos = getattr(hf_config, "max_position_embeddings", None) or 4096
        if context_length is not None and context_length > max_pos:
            raise ValueError(
                f"--context-length {context_length} is longer than the model's max_position_embeddings ({max_pos})"
            )
        num_heads = hf_config.num_attention_heads
        head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // num_heads
        from sglang.srt.layers.quantization import read_quantization_config

        config = hf_config.to_dict() if hasattr(hf_config, "to_dict") else dict(vars(hf_config))
        quantization = read_quantization_config(path, config, quantization)
        return cls(
            path=path,
            hf_config=hf_config,
            architecture=architectures[0],
            dtype=dtype,
            context_len=context_length or max_pos,
            vocab_size=hf_config.vocab_size,
            hidden_size=hf_config.hidden_size,
            num_hidden_layers=hf_config.num_hidden_layers,
            num_attention_heads=num_heads,
            num_key_value_heads=getattr(hf_config, "num_key_value_heads", None) or num_heads,
            head_dim=head_dim,
            quantization=quantization,
        )


def load_hf_config(path: str, trust_remote_code: bool = False):
    from transformers import AutoConfig

    if not os.path.isdir(path):
        raise FileNotFoundError(f"model path {path!r} is not a directory")
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise FileNotFoundError(f"model path {path!r} has no config.json")
    try:
        return AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    except Exception as e:  # transformers raises several types for a bad config
        raise ValueError(f"cannot read {path}/config.json: {e}") from e


def resolve_dtype(dtype: str, hf_config, device: str) -> torch.dtype:
    if dtype != "auto":
        return _DTYPES[dtype]
    config_dtype = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
    if isinstance(config_dtype, str):
        config_dtype = _DTYPES.get(config_dtype)
    if config_dtype in (torch.bfloat16, torch.float16):
        return config_dtype
    # A float32 checkpoint runs in bfloat16 on a GPU (speed), in float32 on a CPU (exactness).
    return torch.bfloat16 if device == "cuda" else torch.float32


def rope_parameters(hf_config) -> dict:
    """Rotary settings across transformers versions (`rope_parameters` in v5, `rope_scaling` before)."""
    params = dict(getattr(hf_config, "rope_parameters", None) or {})
    scaling = getattr(hf_config, "rope_scaling", None)
    if scaling and not params:
        params = dict(scaling)
    params.setdefault("rope_theta", getattr(hf_config, "rope_theta", None) or 10000.0)
    params["rope_type"] = params.get("rope_type") or params.get("type") or "default"
    return params
