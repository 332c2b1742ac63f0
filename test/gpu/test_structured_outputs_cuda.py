"""Constrained decoding on the GPU: the mask unpacking agrees with xgrammar's CUDA kernel; constrained
requests (JSON schema, regex, EBNF) give answers that match their grammar, greedy and sampled (the
fused sampling kernel under -inf logits), plain and speculative; greedy constrained speculation is
token-identical to plain constrained decoding (float32); and unconstrained requests that share
batches with constrained ones get the tokens they get alone (their batches replay CUDA graphs).

    python -m pytest test/gpu/test_structured_outputs_cuda.py -q"""

from __future__ import annotations

import json
import re

import torch
import xgrammar
from transformers import AutoTokenizer

from sglang import demo
from sglang.srt.constrained.bitmask import allowed_tokens, apply_token_mask
from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs
from sglang.test.runner_utils import run_to_completion
from sglang.test.server_fixture import assert_idle_kv_accounting

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "n": {"type": "integer", "minimum": 0, "maximum": 999},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "n", "ok"],
}
REGEX = r"[a-z]{1,6} [-+*/] [a-z]{1,6}"
EBNF = 'root ::= "[" [0-9]{1,3} ("," [0-9]{1,3}){0,6} "]"'
CONSTRAINTS = [("json_schema", json.dumps(SCHEMA)), ("regex", REGEX), ("ebnf", EBNF)]
PROMPTS = ["def add(a, b):\n", "import os\n", "class Stack:\n", "x = ", "# config\n", "for i in range(3):\n"]
TOKENIZER = AutoTokenizer.from_pretrained(demo.TARGET_PATH)
SPEC = dict(speculative_algorithm="EAGLE3", speculative_num_steps=3, speculative_policy="always")


def run(requests: list[tuple[str, dict]], **kwargs) -> dict[str, list[int]]:
    args = dict(device="cuda", dtype="float32", max_total_tokens=1 << 15, cuda_graph_max_bs=16)
    scheduler = Scheduler(ServerArgs(**{**args, **kwargs}))
    for i, (prompt, params) in enumerate(requests):
        scheduler.add_request(
            TokenizedGenerateReqInput(f"r{i}", TOKENIZER.encode(prompt), SamplingParams(**params), stream=False)
        )
    out = run_to_completion(scheduler)
    assert_idle_kv_accounting(scheduler.get_internal_state())
    return [out[f"r{i}"]["ids"] for i in range(len(requests))]


def constrained_requests(temperature: float) -> list[tuple[str, dict]]:
    # Every grammar here ends within 96 tokens, whatever is sampled.
    return [
        (prompt, {"temperature": temperature, "max_new_tokens": 96, "sampling_seed": i, key: value})
        for i, prompt in enumerate(PROMPTS)
        for key, value in CONSTRAINTS
    ]


def assert_valid(value) -> None:
    # SCHEMA checked by hand: the GPU machine has no jsonschema (the CPU tests validate with it).
    assert isinstance(value, dict) and set(value) >= set(SCHEMA["required"]), value
    assert isinstance(value["name"], str) and len(value["name"]) <= 12, value
    assert type(value["n"]) is int and 0 <= value["n"] <= 999, value
    assert type(value["ok"]) is bool, value


def check_matches(requests, outputs) -> None:
    for (_, params), ids in zip(requests, outputs):
        text = TOKENIZER.decode(ids, skip_special_tokens=True)
        if "json_schema" in params:
            assert_valid(json.loads(text))
        elif "regex" in params:
            assert re.fullmatch(REGEX, text), text
        else:
            assert re.fullmatch(r"\[[0-9]{1,3}(,[0-9]{1,3}){0,6}\]", text), text


def test_mask_unpacking_agrees_with_xgrammar_cuda_kernel():
    generator = torch.Generator().manual_seed(0)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (64, 1000), dtype=torch.int32, generator=generator).cuda()
    logits = torch.randn(64, 32000, device="cuda")
    reference = logits.clone()
    xgrammar.apply_token_bitmask_inplace(reference, bitmask)
    assert torch.equal(apply_token_mask(logits, allowed_tokens(bitmask, 32000)), reference)


def test_constrained_answers_match_their_grammar_plain_and_speculative():
    for temperature in (0.0, 1.0):
        requests = constrained_requests(temperature)
        check_matches(requests, run(requests))
        check_matches(requests, run(requests, **SPEC))


def test_greedy_constrained_speculation_is_plain_constrained_decoding():
    requests = constrained_requests(0.0)
    free = [(prompt, {"temperature": 0, "max_new_tokens": 48}) for prompt in PROMPTS]
    plain = run(requests + free)
    assert run(requests + free, **SPEC) == plain
    # Unconstrained requests alone (graph-replayed batches) get what they got beside constrained ones.
    assert run(free) == plain[len(requests) :]
    assert run(free, **SPEC) == plain[len(requests) :]
