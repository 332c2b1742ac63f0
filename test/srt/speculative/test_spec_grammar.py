"""Constrained decoding under EAGLE-3 speculation: the grammar's walk over a step's drafts is
undone exactly (GrammarLookahead), and seeded sampling under a regex keeps the constrained
distribution: the 2nd and 3rd output tokens, which verification produces (accepted drafts or
resampled), follow the exact distribution of the target under the grammar's masks (chi-square);
greedy constrained output with speculation equals plain constrained decoding, and drafting under
the grammar keeps the acceptance up."""

from __future__ import annotations

import gc
import json

import pytest
import torch
import xgrammar
from transformers import AutoTokenizer

import sglang
from sglang import demo
from sglang.srt.constrained.bitmask import allowed_tokens
from sglang.srt.constrained.grammar_backend import GrammarBackend
from sglang.srt.speculative.spec_grammar import GrammarLookahead, draft_mask
from sglang.test.runner_utils import OneRank
from sglang.test.sampling_checks import chi_square_pvalue, exact_token_distributions
from sglang.test.server_fixture import assert_engine_kv_accounting

PROMPT = "def add(a, b):\n    return "
REGEX = r"[a-z]{1,3} [-+*/] [a-z]{1,3}"


@pytest.fixture(scope="module")
def backend():
    tokenizer = AutoTokenizer.from_pretrained(demo.TARGET_PATH)
    return tokenizer, GrammarBackend(tokenizer, len(tokenizer), {tokenizer.eos_token_id})


def matcher_after(backend, key, tokens):
    tokenizer, grammar = backend
    matcher = grammar.matcher(grammar.compile(key).result(), key[0])
    for token in tokens:
        assert matcher.accept_token(token)
    return matcher


def mask_of(matcher, vocab_size):
    bitmask = xgrammar.allocate_token_bitmask(1, vocab_size)
    matcher.fill_next_token_bitmask(bitmask, 0)
    return allowed_tokens(bitmask, vocab_size)[0]


def test_lookahead_masks_follow_the_drafts_and_roll_back(backend):
    tokenizer, grammar = backend
    vocab = len(tokenizer)
    key = ("json_schema", json.dumps({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}))
    text = tokenizer.encode('{"ok": true}', add_special_tokens=False)
    constrained = matcher_after(backend, key, text[:1])
    lookahead = GrammarLookahead([constrained, None], vocab, "cpu")
    first = lookahead.next_mask()
    assert torch.equal(first[0], mask_of(matcher_after(backend, key, text[:1]), vocab)) and first[1].all()
    lookahead.advance(torch.tensor([text[1], 7]))
    second = lookahead.next_mask()
    assert torch.equal(second[0], mask_of(matcher_after(backend, key, text[:2]), vocab))
    forbidden = int((~second[0]).nonzero()[0])
    lookahead.advance(torch.tensor([forbidden, 7]))  # a forbidden draft ends the walk: no mask after it
    assert lookahead.next_mask()[0].all() and lookahead.verify_mask().shape == (2, 3, vocab)
    lookahead.rollback()
    assert torch.equal(mask_of(constrained, vocab), first[0])  # back where the step started
    # The draft's own vocabulary: a row allowing none of its tokens stays unmasked.
    masks = torch.zeros(2, vocab, dtype=torch.bool)
    masks[0, 5] = True
    assert draft_mask(masks, torch.tensor([5, 6])).tolist() == [[True, False], [True, True]]


def engine(**kwargs):
    return sglang.Engine(dtype="float32", device="cpu", log_level="warning", disable_radix_cache=True, **kwargs)


def test_sampling_under_a_regex_keeps_the_constrained_distribution(backend):
    top_k, num_samples = 6, 1200
    spec = engine(speculative_algorithm="EAGLE3", speculative_num_steps=2)
    try:
        params = [
            {"temperature": 1.0, "top_k": top_k, "max_new_tokens": 3, "regex": REGEX, "sampling_seed": seed}
            for seed in range(num_samples)
        ]
        outputs = spec.generate([PROMPT] * num_samples, params)
        state = spec.get_server_info()["internal_state"]
        assert_engine_kv_accounting(spec)
    finally:
        spec.shutdown()
    assert 0 < state["spec_accept_rate"] < 1, state  # drafts were accepted and rejected
    tokenizer, _ = backend
    vocab = len(tokenizer)
    exact = exact_token_distributions(
        demo.TARGET_PATH,
        tokenizer.encode(PROMPT),
        top_k,
        allowed=lambda out: mask_of(matcher_after(backend, ("regex", REGEX), out), vocab),
    )
    for position in (1, 2):
        samples = [o["output_ids"][position] for o in outputs]
        assert len(set(samples)) > 1, position  # a distribution worth testing
        assert chi_square_pvalue(samples, exact[position]) > 1e-3, position


def test_greedy_constrained_speculation_is_plain_constrained_decoding():
    schema = json.dumps(
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 10},
                "n": {"type": "integer", "minimum": 0, "maximum": 999},
            },
            "required": ["name", "n"],
        }
    )
    prompts = ["def add(a, b):\n", "import os\n", "class Stack:\n", "x = "]
    params = [
        {"temperature": 0, "max_new_tokens": 48, key: value}
        for key, value in [
            ("json_schema", schema),
            ("regex", REGEX),
            ("ebnf", 'root ::= "[" [0-9]+ ("," [0-9]+)* "]"'),
            ("regex", r"(True|False|None)"),
        ]
    ]
    # Plain constrained decoding: the plain engine's Scheduler, in this process.
    plain = OneRank(
        model_path=demo.TARGET_PATH,
        dtype="float32",
        device="cpu",
        log_level="warning",
        disable_radix_cache=True,
        disable_overlap_schedule=True,
    )
    spec = engine(speculative_algorithm="EAGLE3", speculative_num_steps=4)
    try:
        expected = plain.generate(prompts, params)
        assert [o["output_ids"] for o in spec.generate(prompts, params)] == expected
        # The draft proposes under the grammar: without that (drafts masked at verification only)
        # these requests accept 1.2 tokens per verify step, with it 2.5.
        state = spec.get_server_info()["internal_state"]
        assert state["spec_tokens"] / state["spec_verifies"] > 1.9, state
        # Constrained and unconstrained requests in the same speculative batches.
        free = [{"temperature": 0, "max_new_tokens": 32}] * len(prompts)
        got = spec.generate(prompts * 2, params + free)
        assert [o["output_ids"] for o in got[: len(prompts)]] == expected
        assert [o["output_ids"] for o in got[len(prompts) :]] == plain.generate(prompts, free)
        assert spec.get_server_info()["internal_state"]["spec_verifies"] > 0
        assert_engine_kv_accounting(spec)
    finally:
        spec.shutdown()
        del plain
        gc.collect()  # the in-process scheduler's KV pool goes with the reference cycles around it
