"""Tokenizer loading through transformers, with errors that name what is missing."""

from __future__ import annotations

import os


def get_tokenizer(tokenizer_path: str):
    from transformers import AutoTokenizer

    if not os.path.isdir(tokenizer_path):
        raise FileNotFoundError(f"tokenizer path {tokenizer_path!r} is not a directory")
    if not any(os.path.isfile(os.path.join(tokenizer_path, f)) for f in ("tokenizer.json", "tokenizer_config.json")):
        raise FileNotFoundError(f"{tokenizer_path} has no tokenizer.json or tokenizer_config.json")
    try:
        return AutoTokenizer.from_pretrained(tokenizer_path)
    except Exception as e:  # transformers raises many types for a broken tokenizer
        raise ValueError(f"cannot load the tokenizer from {tokenizer_path}: {e}") from e


def load_chat_template(path: str) -> str:
    """The Jinja text of a --chat-template file."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"--chat-template {path!r} is not a file (a Jinja chat template is expected)")
    with open(path, encoding="utf-8") as f:
        return f.read()
