"""Tokenizer loading: --tokenizer-mode and --trust-remote-code reach transformers."""

from __future__ import annotations

import json
import logging
import shutil

import pytest

from sglang import demo
from sglang.srt.hf_transformers_utils import get_tokenizer

TEXT = "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)"


def test_tokenizer_mode_slow_loads_the_python_tokenizer_where_transformers_has_one(caplog):
    """transformers 5 has no slow tokenizers: slow then serves the fast one and says so; both modes
    encode alike either way."""
    with caplog.at_level(logging.WARNING, logger="sglang.srt.hf_transformers_utils"):
        fast = get_tokenizer(demo.TARGET_PATH, "auto")
        assert not caplog.records
        slow = get_tokenizer(demo.TARGET_PATH, "slow")
    assert fast.is_fast
    if slow.is_fast:
        assert "--tokenizer-mode slow" in caplog.text and "using the fast one" in caplog.text
    assert slow.encode(TEXT) == fast.encode(TEXT)


def model_with_its_own_tokenizer_class(tmp_path):
    """The demo model whose tokenizer_config names a class in the directory's own Python file."""
    shutil.copytree(demo.TARGET_PATH, tmp_path / "model")
    config = json.loads((tmp_path / "model" / "tokenizer_config.json").read_text())
    config.update(
        tokenizer_class="TinyTokenizer", auto_map={"AutoTokenizer": [None, "tokenization_tiny.TinyTokenizer"]}
    )
    (tmp_path / "model" / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "model" / "tokenization_tiny.py").write_text(
        "from transformers import PreTrainedTokenizerFast\n\n\nclass TinyTokenizer(PreTrainedTokenizerFast):\n"
        "    pass\n"
    )
    return str(tmp_path / "model")


def test_a_tokenizer_class_of_the_model_directorys_own_code_needs_trust_remote_code(tmp_path):
    model = model_with_its_own_tokenizer_class(tmp_path)
    with pytest.raises(ValueError):
        get_tokenizer(model)
    tokenizer = get_tokenizer(model, trust_remote_code=True)
    assert type(tokenizer).__name__ == "TinyTokenizer"
    assert tokenizer.encode(TEXT) == get_tokenizer(demo.TARGET_PATH).encode(TEXT)


def test_the_grammar_backend_loads_the_tokenizer_as_the_server_does(tmp_path):
    from sglang.srt.constrained.grammar_backend import make_grammar_backend

    model = model_with_its_own_tokenizer_class(tmp_path)
    with pytest.raises(ValueError):
        make_grammar_backend("xgrammar", model, 6144, {0})
    backend = make_grammar_backend("xgrammar", model, 6144, {0}, trust_remote_code=True)
    assert backend is not None
