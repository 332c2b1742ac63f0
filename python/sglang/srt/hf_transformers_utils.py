"""Tokenizer loading through transformers, with errors that name what is missing."""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)


def get_tokenizer(tokenizer_path: str, tokenizer_mode: str = "auto", trust_remote_code: bool = False):
    """The tokenizer of --tokenizer-path: the fast one, or with tokenizer_mode "slow" the Python
    one where the installed transformers still has it (transformers 5 loads only fast ones)."""
    import transformers
    from transformers import AutoTokenizer

    if not os.path.isdir(tokenizer_path):
        raise FileNotFoundError(f"tokenizer path {tokenizer_path!r} is not a directory")
    if not any(os.path.isfile(os.path.join(tokenizer_path, f)) for f in ("tokenizer.json", "tokenizer_config.json")):
        raise FileNotFoundError(f"{tokenizer_path} has no tokenizer.json or tokenizer_config.json")
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            tokenizer_path, use_fast=tokenizer_mode != "slow", trust_remote_code=trust_remote_code
        )
    except Exception as e:  # transformers raises many types for a broken tokenizer
        raise ValueError(f"cannot load the tokenizer from {tokenizer_path}: {e}") from e
    if tokenizer_mode == "slow" and tokenizer.is_fast:
        logger.warning(
            "--tokenizer-mode slow: transformers %s has no slow tokenizer for %s; using the fast one",
            transformers.__version__,
            tokenizer_path,
        )
    return tokenizer


def load_chat_template(path: str) -> str:
    """The Jinja text of a --chat-template file."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"--chat-template {path!r} is not a file (a Jinja chat template is expected)")
    with open(path, encoding="utf-8") as f:
        return f.read()
