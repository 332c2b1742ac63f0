"""The shipped demo pair (python/sglang/demo): the engine serves the code model by default and
its greedy text looks like Python.

The check: for prompts that open a Python block (`def fibonacci(n):`, `class Stack:`, a `for`
loop), the greedy continuation's first line break is followed by an indented line, and that line
opens a docstring or the first 64 tokens contain a Python keyword that belongs inside a body
(`return`, `self`, `if`, ...); a docstring is how most standard-library classes begin. It
is not trivially true: the same architecture and tokenizer with random weights (checked below,
same prompts) emits an unstructured byte soup that fails it, so passing needs a trained model."""

from __future__ import annotations

import json
import os
import re

import pytest
import torch

import sglang
from sglang import demo
from sglang.srt.server_args import ServerArgs, prepare_server_args

PROMPTS = ["def fibonacci(n):", "class Stack:", "for i in range(10):"]
BODY_WORDS = re.compile(r"\b(return|self|if|for|while|yield|raise|print|pass|import|not|in|is|None)\b")
MAX_NEW = 64


def looks_like_python_block(text: str) -> bool:
    """A newline, then a line indented by spaces that opens a docstring, or any indented line and
    a body keyword somewhere in the text."""
    first_body_line = re.match(r"\s*\n( {2,}|\t)(\S.*)", text)
    if first_body_line is None:
        return False
    return first_body_line.group(2).startswith(('"""', "'''")) or BODY_WORDS.search(text) is not None


def test_demo_pair_is_within_the_size_budget_and_documented():
    total = sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(demo.DEMO_DIR) for f in files)
    assert total <= 32 * 2**20, f"demo pair is {total / 2**20:.1f} MiB"
    readme = open(os.path.join(demo.DEMO_DIR, "README.md")).read()
    report = json.load(open(os.path.join(demo.DEMO_DIR, "report.json")))
    assert report["corpus"]["file_list_sha256"] in readme
    assert report["acceptance"]["mean_accepted_length"]["3"] >= 2.5
    with open(os.path.join(demo.DRAFT_PATH, "config.json")) as f:
        assert json.load(f)["architectures"] == ["LlamaForCausalLMEagle3"]


def test_server_args_default_to_the_demo_target():
    args = ServerArgs()
    assert args.model_path == demo.TARGET_PATH and args.tokenizer_path == demo.TARGET_PATH
    assert args.served_model_name == demo.SERVED_MODEL_NAME
    assert prepare_server_args([]).model_path == demo.TARGET_PATH


@pytest.fixture(scope="module")
def demo_engine():
    engine = sglang.Engine(device="cpu", log_level="warning")  # no model_path: the demo target
    yield engine
    engine.shutdown()


def test_engine_on_the_demo_target_writes_python(demo_engine):
    outputs = demo_engine.generate(PROMPTS, {"temperature": 0, "max_new_tokens": MAX_NEW})
    for prompt, out in zip(PROMPTS, outputs):
        assert out["meta_info"]["completion_tokens"] == MAX_NEW or out["meta_info"]["finish_reason"]["type"] == "stop"
        assert looks_like_python_block(out["text"]), (prompt, out["text"])


def test_the_check_fails_for_the_same_model_with_random_weights():
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig.from_pretrained(demo.TARGET_PATH)
    model = LlamaForCausalLM(config).eval()
    tokenizer = AutoTokenizer.from_pretrained(demo.TARGET_PATH)
    passed = []
    for prompt in PROMPTS:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=MAX_NEW, do_sample=False, pad_token_id=0, eos_token_id=None)
        passed.append(looks_like_python_block(tokenizer.decode(out[0, ids.shape[1] :])))
    assert not any(passed)
