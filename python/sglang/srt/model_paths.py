"""Checks that the model, tokenizer and draft paths are local model directories the server can
load and split, before any process starts: nothing is downloaded."""

from __future__ import annotations

import os
import re
import types
from typing import TYPE_CHECKING

from sglang.srt.utils import read_json_object

if TYPE_CHECKING:
    from sglang.srt.server_args import ServerArgs


def check_model_paths(server_args: ServerArgs) -> None:
    """The model and tokenizer must be local directories: nothing is downloaded. Checked before
    any process starts, so a typo or a Hugging Face id fails in a line, not after a load."""
    _check_model_dir("--model-path", server_args.model_path, need_config=True)
    from sglang.srt.models.registry import check_architecture

    check_architecture(
        getattr(_read_config(server_args.model_path), "architectures", None),
        False,
        f"--model-path {server_args.model_path}",
    )
    _check_quantization(server_args.model_path, server_args.quantization)
    if server_args.speculative_enabled:
        _check_model_dir("--speculative-draft-model-path", server_args.speculative_draft_model_path, need_config=True)
        draft = _check_draft(server_args)
    if server_args.tokenizer_path != server_args.model_path:
        _check_model_dir("--tokenizer-path", server_args.tokenizer_path, need_config=False)
    if server_args.tp_size > 1:  # whether --tp-size can split the model(s), before any rank loads them
        from sglang.srt.distributed.parallel_state import check_shardable

        check_shardable(_read_config(server_args.model_path), server_args.tp_size)
        if server_args.speculative_enabled:
            check_shardable(draft.config, server_args.tp_size, "the EAGLE-3 draft")


def _check_quantization(path: str, online: str | None) -> None:
    """A quantized checkpoint must be in a layout served (layers/quantization), named otherwise;
    --quantization quantizes only an unquantized one."""
    from sglang.srt.layers.quantization import read_quantization_config

    try:
        read_quantization_config(path, read_json_object(os.path.join(path, "config.json")), online)
    except ValueError as e:
        raise ValueError(f"--model-path {path}: {e}") from None


def _check_draft(server_args: ServerArgs):
    """The draft is a published EAGLE-3 layout we serve, made for this target (eagle3_formats)."""
    from sglang.srt.model_loader.eagle3_formats import check_draft_fits_target, read_draft_layout

    draft = read_draft_layout(server_args.speculative_draft_model_path, server_args.load_format)
    target = _read_config(server_args.model_path)
    try:
        check_draft_fits_target(draft, target.num_hidden_layers, target.hidden_size, target.vocab_size)
    except ValueError as e:
        raise ValueError(f"--speculative-draft-model-path {server_args.speculative_draft_model_path}: {e}") from None
    return draft


def _read_config(path: str) -> types.SimpleNamespace:
    """A model directory's config.json as attributes (no model code needed to read head counts)."""
    return types.SimpleNamespace(**read_json_object(os.path.join(path, "config.json")))


def _check_model_dir(flag: str, path: str, need_config: bool) -> None:
    if os.path.isdir(path):
        if need_config and not os.path.isfile(os.path.join(path, "config.json")):
            raise ValueError(f"{flag} {path!r} has no config.json: point it at a Hugging Face model directory")
        return
    if os.path.exists(path):
        raise ValueError(f"{flag} {path!r} is a file; it must be a model directory")
    if _looks_like_hub_id(path):
        raise ValueError(
            f"{flag} {path!r} is not a local directory. If it is a Hugging Face model id: weights are "
            f"not downloaded here, so download them (e.g. `huggingface-cli download {path} --local-dir "
            f"DIR`) and point {flag} at DIR"
        )
    raise ValueError(f"{flag} {path!r} does not exist")


def _looks_like_hub_id(path: str) -> bool:
    """`org/name` or `name`, as the Hugging Face hub spells model ids."""
    return re.fullmatch(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?", path) is not None
