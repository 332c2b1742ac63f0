"""Published EAGLE-3 draft layouts, read from a draft directory's config.json and tensor names and
normalised into the one form `LlamaForCausalLMEagle3` serves, or refused naming what is not served.

Layouts: ours / SpecForge (`LlamaForCausalLMEagle3`), the original EAGLE-3 release
(`LlamaForCausalLM` config over `midlayer.*` / `fc.weight` tensors) and speculators
(`Eagle3Speculator` / `Eagle3DraftModel`: the layer's settings nested in `transformer_layer_config`,
aux layer ids counted as the state entering a layer). The same reading runs before any process
starts (model_paths.check_model_paths) and when the worker loads the draft. Under --load-format
dummy there are no tensors: the config alone says what the draft holds.
"""

from __future__ import annotations

import dataclasses
import os
import re

import torch

from sglang.srt.configs.model_config import ModelConfig, resolve_dtype
from sglang.srt.models.llama_eagle3 import canonical_weight_name
from sglang.srt.models.registry import PUBLISHED_DRAFT_ARCHITECTURES as SPECULATORS_ARCHITECTURES
from sglang.srt.utils import read_json_object

LAYOUT_OURS = "LlamaForCausalLMEagle3"
LAYOUT_RELEASE = "EAGLE-3 release (LlamaForCausalLM)"
LAYOUT_SPECULATORS = "speculators Eagle3"
SERVED_LAYOUTS = (
    f"{LAYOUT_OURS}, {' / '.join(SPECULATORS_ARCHITECTURES)} (speculators) and the original EAGLE-3 "
    "release (a LlamaForCausalLM config over midlayer.* tensors)"
)

# Config flags of published drafts that change what the draft computes and that we do not compute.
UNSERVED_FLAGS = {"fc_norm": "fc_norm (a norm after fc)"}
LAYER_MODEL_TYPES = ("llama", "qwen3")  # speculators' transformer_layer_config.model_type
_LAYER = "midlayer."
_BASE_TENSORS = (
    "fc.weight",
    "norm.weight",
    *(
        f"{_LAYER}{name}.weight"
        for name in (
            "input_layernorm",
            "hidden_norm",
            "post_attention_layernorm",
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.o_proj",
            "mlp.gate_proj",
            "mlp.up_proj",
            "mlp.down_proj",
        )
    ),
)
_OPTIONAL_TENSORS = ("lm_head.weight", "embed_tokens.weight", "d2t", "t2d")
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


@dataclasses.dataclass(frozen=True)
class DraftLayout:
    path: str
    layout: str  # LAYOUT_*: which published format the directory holds
    # Normalised: architecture LlamaForCausalLMEagle3, one layer, aux ids counted as ours (the
    # output of a target layer) in eagle_config, and the flags the draft model reads.
    config: object
    features: tuple[str, ...]  # what this draft has beyond the plain layer, e.g. "fc.bias"

    @property
    def aux_layer_ids(self) -> list[int] | None:
        return (getattr(self.config, "eagle_config", None) or {}).get("eagle_aux_hidden_state_layer_ids")


def read_draft_layout(path: str, load_format: str = "auto") -> DraftLayout:
    """The draft at `path`, normalised; a ValueError naming the layout or feature we do not serve."""
    raw = read_json_object(os.path.join(path, "config.json"))
    stored = _implied_shapes(raw) if load_format == "dummy" else tensor_shapes(path, load_format)
    shapes = {
        canonical_weight_name(name): shape for name, shape in stored.items() if not name.endswith(_IGNORED_SUFFIXES)
    }
    where = f"--speculative-draft-model-path {path}"
    layout = _detect_layout(raw, set(stored), where)
    if layout == LAYOUT_SPECULATORS:
        layer, aux_ids = _speculators_layer(raw, where), _speculators_aux_ids(raw, where)
    else:
        layer = dict(raw)
        aux_ids = (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    config, features = _normalise(layer, shapes, where)
    config.eagle_config = {"eagle_aux_hidden_state_layer_ids": aux_ids}
    return DraftLayout(path, layout, config, tuple(features))


def check_draft_fits_target(draft: DraftLayout, num_layers: int, hidden_size: int, vocab_size: int) -> None:
    """The draft was made for a target of this shape: its vocabulary, the width of fc's input and
    three aux layer ids the target has (ours: the output of a layer, 0 .. num_layers - 1)."""
    config = draft.config
    if config.vocab_size != vocab_size:
        raise ValueError(
            f"the draft's vocab_size ({config.vocab_size}) differs from the target's "
            f"({vocab_size}): it was made for another model"
        )
    if config.target_hidden_size != hidden_size:
        raise ValueError(
            f"the draft expects target hidden size {config.target_hidden_size}, the target has "
            f"{hidden_size}: it was made for another model"
        )
    aux_ids = draft.aux_layer_ids
    if aux_ids is not None and (len(aux_ids) != 3 or any(not 0 <= i < num_layers for i in aux_ids)):
        counted = (
            " (speculators' ids minus one: ours count a layer's output)" if draft.layout == LAYOUT_SPECULATORS else ""
        )
        raise ValueError(
            f"the draft's aux layer ids {list(aux_ids)}{counted} must be 3 layers of the target's "
            f"{num_layers} (eagle_aux_hidden_state_layer_ids)"
        )


def draft_model_config(
    path: str, dtype: str, device: str, target: ModelConfig, load_format: str = "auto"
) -> ModelConfig:
    """The draft's ModelConfig, checked against its target. It runs in the target's dtype unless
    --dtype names one (then both run in it): a float16 release draft beside a bfloat16 target
    computes in bfloat16."""
    draft = read_draft_layout(path, load_format)
    check_draft_fits_target(draft, target.num_hidden_layers, target.hidden_size, target.vocab_size)
    draft_dtype = target.dtype if dtype == "auto" else resolve_dtype(dtype, draft.config, device)
    return ModelConfig.from_hf_config(path, draft.config, draft_dtype)


def tensor_shapes(path: str, load_format: str = "auto") -> dict[str, tuple[int, ...]]:
    """Every tensor name in the weight files --load-format reads and its shape, without reading
    the data of a safetensors file (a .bin is memory-mapped)."""
    from safetensors import safe_open

    from sglang.srt.model_loader.loader import files_of_format

    shapes = {}
    for file in files_of_format(path, load_format):
        if file.endswith(".bin"):
            state = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
            shapes.update({name: tuple(t.shape) for name, t in state.items()})
            continue
        with safe_open(file, framework="pt", device="cpu") as f:
            shapes.update({name: tuple(f.get_slice(name).get_shape()) for name in f.keys()})
    return shapes


def _implied_shapes(raw: dict) -> dict[str, tuple[int, ...]]:
    """--load-format dummy: the tensors a draft of this config holds (the shapes read are fc's
    input width and the draft vocabulary)."""
    layer = {**raw.get("transformer_layer_config", {}), **raw}
    if (raw.get("architectures") or [None])[0] == "LlamaForCausalLM" and "draft_vocab_size" not in raw:
        return {}  # a full model's config: without tensors, only the release's draft_vocab_size tells a draft
    hidden = layer.get("hidden_size", 0)
    names = dict.fromkeys(_BASE_TENSORS, ())
    names["fc.weight"] = (hidden, 3 * (layer.get("target_hidden_size") or hidden))
    if layer.get("draft_vocab_size") not in (None, layer.get("vocab_size")):
        names.update({"lm_head.weight": (layer["draft_vocab_size"], hidden), "d2t": (), "t2d": ()})
    attn = f"{_LAYER}self_attn."
    if layer.get("norm_before_fc"):
        names["input_norm.weight"] = ()
    if layer.get("attention_bias"):
        names.update(dict.fromkeys((f"{attn}{p}_proj.bias" for p in "qkvo"), ()))
    if layer.get("model_type") == "qwen3":
        names.update(dict.fromkeys((f"{attn}q_norm.weight", f"{attn}k_norm.weight"), ()))
    return names


def _detect_layout(raw: dict, names: set[str], where: str) -> str:
    """Which published layout; a LlamaForCausalLM config is the original release only over a
    draft's tensors (`midlayer.*`, `fc.weight`), never over a full model's `model.layers.*`."""
    architectures = raw.get("architectures") or [None]
    arch = architectures[0]
    kind = raw.get("speculators_model_type")
    if arch in SPECULATORS_ARCHITECTURES or kind is not None:
        if kind != "eagle3":
            raise ValueError(
                f"{where}: a speculators draft of type {kind!r} ({arch}); only speculators_model_type "
                "'eagle3' is served"
            )
        return LAYOUT_SPECULATORS
    if arch == LAYOUT_OURS:
        return LAYOUT_OURS
    if arch == "LlamaForCausalLM":
        if "fc.weight" in names or any(name.startswith(_LAYER) for name in names):
            return LAYOUT_RELEASE
        raise ValueError(
            f"{where}: config.json names 'LlamaForCausalLM' and its tensors are a full model's "
            "(no midlayer.* or fc.weight): it is not an EAGLE-3 draft. EAGLE-3 drafts served: "
            f"{SERVED_LAYOUTS}"
        )
    raise ValueError(
        f"{where}: config.json names architecture {arch!r}, which is not an EAGLE-3 draft layout "
        f"this engine serves ({SERVED_LAYOUTS})"
    )


def _speculators_layer(raw: dict, where: str) -> dict:
    layer = raw.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise ValueError(f"{where}: a speculators config needs transformer_layer_config (the draft layer's settings)")
    model_type = layer.get("model_type", "llama")
    if model_type not in LAYER_MODEL_TYPES:
        raise ValueError(
            f"{where}: transformer_layer_config.model_type {model_type!r} is not served "
            f"(served: {', '.join(LAYER_MODEL_TYPES)})"
        )
    top_level = {
        key: raw[key]
        for key in ("draft_vocab_size", "target_hidden_size", "norm_before_residual", "norm_before_fc", *UNSERVED_FLAGS)
        if key in raw
    }
    return {**layer, **top_level}


def _speculators_aux_ids(raw: dict, where: str) -> list[int] | None:
    """speculators count the state entering layer i (its id i is our i - 1); its default, entering
    [2, L//2, L - 3], is ours. Id 0, the embedding output, is not a layer output we capture."""
    ids = raw.get("eagle_aux_hidden_state_layer_ids")
    if ids is None:
        return None
    if 0 in ids:
        raise ValueError(
            f"{where}: eagle_aux_hidden_state_layer_ids {ids} reads id 0, the target's embedding "
            "output; aux hidden states from the embedding are not served (only decoder-layer outputs)"
        )
    return [i - 1 for i in ids]


def _normalise(layer: dict, shapes: dict, where: str):
    """The layer's settings as a transformers config with this engine's draft fields, and the
    features the tensors and flags turn on; refuses a flag or tensor no served feature reads."""
    from transformers import LlamaConfig, Qwen3Config

    for flag, feature in UNSERVED_FLAGS.items():
        if layer.get(flag):
            raise ValueError(f"{where}: EAGLE-3 drafts with {feature} are not served")
    model_type = layer.get("model_type", "llama")
    known = {key: value for key, value in layer.items() if key not in ("architectures", "model_type")}
    config = (Qwen3Config if model_type == "qwen3" else LlamaConfig)(**known)
    if getattr(config, "hidden_act", "silu") not in ("silu", "swish"):
        raise ValueError(f"{where}: hidden_act {config.hidden_act!r} is not served (silu only)")
    features = _layer_count_features(config, shapes, where)
    hidden = config.hidden_size
    config.architectures = [LAYOUT_OURS]
    config.num_hidden_layers = 1
    config.head_dim = getattr(config, "head_dim", None) or hidden // config.num_attention_heads
    config.draft_vocab_size = _draft_vocab_size(layer, config.vocab_size, shapes, where)
    config.target_hidden_size = layer.get("target_hidden_size") or hidden
    features += _flag_features(config, layer, shapes, where)
    _check_tensor_names(config, shapes, where)
    return config, features


def _draft_vocab_size(layer: dict, vocab_size: int, shapes: dict, where: str) -> int:
    """The rows of the draft's lm_head; config.json's draft_vocab_size must say the same."""
    stated = layer.get("draft_vocab_size")
    rows = shapes["lm_head.weight"][0] if "lm_head.weight" in shapes else None
    if stated is not None and rows is not None and stated != rows:
        raise ValueError(f"{where}: draft_vocab_size is {stated} but lm_head.weight has {rows} rows")
    draft_vocab = stated or rows or vocab_size
    if draft_vocab != vocab_size and "d2t" not in shapes:
        raise ValueError(
            f"{where}: a draft vocabulary of {draft_vocab} (target {vocab_size}) needs d2t, which the checkpoint lacks"
        )
    if draft_vocab != vocab_size and rows is None:
        raise ValueError(
            f"{where}: a draft vocabulary of {draft_vocab} needs its own lm_head.weight, which the "
            "checkpoint lacks (the target's covers the whole vocabulary)"
        )
    return draft_vocab


def _layer_count_features(config, shapes: dict, where: str) -> list[str]:
    extra_layers = sorted({int(m.group(1)) for name in shapes if (m := re.match(r"layers\.(\d+)\.", name))})
    if extra_layers:
        raise ValueError(
            f"{where}: the checkpoint holds {1 + len(extra_layers)} decoder layers (layers."
            f"{extra_layers[0]}.* ...); only one-layer EAGLE-3 drafts are served"
        )
    layers = getattr(config, "num_hidden_layers", 1)
    # Some exports copy the target's num_hidden_layers into config.json; the tensors hold one layer.
    return [f"num_hidden_layers {layers} in config.json (the tensors hold one layer)"] if layers != 1 else []


def _flag_features(config, layer: dict, shapes: dict, where: str) -> list[str]:
    """Sets the draft model's flags (norm_before_residual, norm_before_fc, fc_bias, qkv_bias,
    o_bias, qk_norm) from the config and the tensors, which must agree."""
    features = []
    config.norm_before_residual = bool(layer.get("norm_before_residual", False))
    config.norm_before_fc = bool(layer.get("norm_before_fc", False))
    if config.norm_before_fc != ("input_norm.weight" in shapes):
        raise ValueError(
            f"{where}: norm_before_fc is {config.norm_before_fc} but the checkpoint "
            f"{'lacks' if config.norm_before_fc else 'has'} input_norm.weight"
        )
    config.fc_bias = "fc.bias" in shapes
    config.qkv_bias = f"{_LAYER}self_attn.q_proj.bias" in shapes
    config.o_bias = f"{_LAYER}self_attn.o_proj.bias" in shapes
    if bool(layer.get("attention_bias", False)) and not config.qkv_bias:
        raise ValueError(f"{where}: attention_bias is set but the checkpoint has no {_LAYER}self_attn.q_proj.bias")
    config.qk_norm = f"{_LAYER}self_attn.q_norm.weight" in shapes
    if layer.get("model_type") == "qwen3" and not config.qk_norm:
        raise ValueError(f"{where}: a qwen3 draft layer without {_LAYER}self_attn.q_norm.weight / k_norm.weight")
    for flag, feature in (
        ("norm_before_residual", "norm_before_residual"),
        ("norm_before_fc", "norm_before_fc"),
        ("fc_bias", "fc.bias"),
        ("qkv_bias", "attention_bias"),
        ("qk_norm", "q_norm/k_norm"),
    ):
        if getattr(config, flag):
            features.append(feature)
    return features


def expected_tensor_names(config) -> tuple[set[str], set[str]]:
    """(names a draft of this config must have, names it may have), in canonical form."""
    required = set(_BASE_TENSORS)
    attn = f"{_LAYER}self_attn."
    required |= {"fc.bias"} if config.fc_bias else set()
    required |= {"input_norm.weight"} if config.norm_before_fc else set()
    required |= {f"{attn}{p}_proj.bias" for p in "qkv"} if config.qkv_bias else set()
    required |= {f"{attn}o_proj.bias"} if config.o_bias else set()
    required |= {f"{attn}q_norm.weight", f"{attn}k_norm.weight"} if config.qk_norm else set()
    return required, set(_OPTIONAL_TENSORS)


def _check_tensor_names(config, shapes: dict, where: str) -> None:
    required, optional = expected_tensor_names(config)
    unknown = sorted(set(shapes) - required - optional)
    if unknown:
        raise ValueError(
            f"{where}: the checkpoint has tensors no served EAGLE-3 feature reads: "
            f"{', '.join(unknown[:5])}{' ...' if len(unknown) > 5 else ''}"
        )
    missing = sorted(required - set(shapes))
    if missing:
        raise ValueError(f"{where}: the checkpoint is missing {', '.join(missing[:5])}")
    fc_in = shapes["fc.weight"][-1]
    if fc_in != 3 * config.target_hidden_size:
        raise ValueError(
            f"{where}: fc.weight reads {fc_in} features; the config gives 3 x target hidden size "
            f"{config.target_hidden_size} (set target_hidden_size)"
        )
