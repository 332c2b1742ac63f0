"""ReasoningGrammar on the demo tokenizer (where "</think>" is four tokens): every token is allowed
until the end tag is written, then the request's grammar masks exactly as it would alone; rollback
crosses the end of the block both ways (speculative drafts walk over it and are undone); a batch
fill of many rows gives the same masks as filling each; and a Qwen3-style output whose first token
may open a block is offered the start tag beside the grammar's first tokens."""

from __future__ import annotations

import json

import pytest
import torch
import xgrammar
from transformers import AutoTokenizer

from sglang import demo
from sglang.srt.constrained.bitmask import BATCH_FILL_ROWS, allowed_tokens, fill_masks
from sglang.srt.constrained.grammar_backend import GrammarBackend
from sglang.srt.constrained.reasoning_grammar import ReasoningGrammar, ThinkTokens
from sglang.srt.speculative.spec_grammar import GrammarLookahead

KEY = (
    "json_schema",
    json.dumps(
        {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}
    ),
)


@pytest.fixture(scope="module")
def setup():
    tokenizer = AutoTokenizer.from_pretrained(demo.TARGET_PATH)
    backend = GrammarBackend(tokenizer, len(tokenizer), {tokenizer.eos_token_id}, reasoning_parser="deepseek-r1")
    return tokenizer, backend, backend.compile(KEY).result()


def ids(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False)


def mask(matcher, vocab_size):
    bitmask = xgrammar.allocate_token_bitmask(1, vocab_size)
    bitmask[0] = 0
    matcher.fill_next_token_bitmask(bitmask, 0)
    return allowed_tokens(bitmask, vocab_size)[0]


def test_the_end_tag_is_the_tokenizers(setup):
    tokenizer, backend, _ = setup
    assert backend.think_tokens == ThinkTokens(tuple(ids(tokenizer, "</think>")), None, True)
    assert len(backend.think_tokens.end_ids) == 4


def test_tokens_are_free_until_the_block_ends_then_the_grammar_masks(setup):
    tokenizer, backend, compiled = setup
    vocab = len(tokenizer)
    grammar = backend.matcher(compiled, KEY[0], thinks=True)
    plain = backend.matcher(compiled, KEY[0])
    assert isinstance(grammar, ReasoningGrammar) and not isinstance(plain, ReasoningGrammar)
    # Not JSON, and it holds a partial end tag ("</" alone) that must not end the block.
    for token in ids(tokenizer, "x = </ 1\n") + list(backend.think_tokens.end_ids[:-1]):
        assert mask(grammar, vocab).all() and grammar.accept_token(token) and not grammar.is_terminated()
    assert grammar.accept_token(backend.think_tokens.end_ids[-1])
    answer = ids(tokenizer, '{"ok": true}')
    for token in answer:
        assert torch.equal(mask(grammar, vocab), mask(plain, vocab))
        assert grammar.accept_token(token) and plain.accept_token(token)
    assert not grammar.accept_token(ids(tokenizer, "x")[0])  # the grammar refuses more text
    assert grammar.accept_token(tokenizer.eos_token_id) and grammar.is_terminated()


def test_rollback_crosses_the_end_of_the_block(setup):
    tokenizer, backend, compiled = setup
    vocab = len(tokenizer)
    grammar = backend.matcher(compiled, KEY[0], thinks=True)
    thought, end, answer = ids(tokenizer, "hmm"), list(backend.think_tokens.end_ids), ids(tokenizer, '{"ok"')
    for token in thought + end + answer:
        assert grammar.accept_token(token)
    grammar.rollback(len(answer) + 2)  # back inside the block, half of the end tag written
    assert mask(grammar, vocab).all()
    for token in end[2:] + answer:  # the same tokens again reach the same state
        assert grammar.accept_token(token)
    after = ReasoningGrammar(backend.matcher(compiled, KEY[0]), backend.think_tokens)
    for token in thought + end + answer:
        after.accept_token(token)
    assert torch.equal(mask(grammar, vocab), mask(after, vocab)) and not mask(grammar, vocab).all()


def test_speculative_lookahead_walks_over_the_end_tag_and_rolls_back(setup):
    tokenizer, backend, compiled = setup
    vocab = len(tokenizer)
    grammar = backend.matcher(compiled, KEY[0], thinks=True)
    for token in ids(tokenizer, "ok"):
        grammar.accept_token(token)
    end = list(backend.think_tokens.end_ids)
    drafts = end + ids(tokenizer, "{")
    lookahead = GrammarLookahead([grammar, None], vocab, "cpu")
    masks = [lookahead.next_mask()]
    for token in drafts:
        lookahead.advance(torch.tensor([token, 0]))
        masks.append(lookahead.next_mask())
    assert all(m[0].all() for m in masks[: len(end)])  # free up to the end tag's last token
    assert not masks[len(end)][0].all() and not masks[len(end) + 1][0].all()  # then the JSON grammar
    assert masks[len(end)][0][drafts[-1]] and lookahead.walked[0] == len(drafts)
    lookahead.rollback()
    assert grammar.phase.is_free() and mask(grammar, vocab).all()


def test_a_batch_fill_equals_filling_each_row(setup):
    tokenizer, backend, compiled = setup
    vocab = len(tokenizer)
    rows = []
    for prefix in ("", "think", "think</think>", 'think</think>{"ok"', "</think>{", "a"):
        grammar = backend.matcher(compiled, KEY[0], thinks=True)
        tokens = (
            ids(tokenizer, prefix.replace("</think>", ""))
            if "</think>" not in prefix
            else (
                ids(tokenizer, prefix.split("</think>")[0])
                + list(backend.think_tokens.end_ids)
                + ids(tokenizer, prefix.split("</think>")[1])
            )
        )
        for token in tokens:
            assert grammar.accept_token(token)
        rows.append(grammar)
    rows += [None, backend.matcher(compiled, KEY[0])]
    assert len(rows) >= BATCH_FILL_ROWS
    batch = allowed_tokens(fill_masks(rows, vocab), vocab)
    for row, grammar in enumerate(rows):
        expected = torch.ones(vocab, dtype=torch.bool) if grammar is None else mask(grammar, vocab)
        assert torch.equal(batch[row], expected), row
    assert batch[0].all() and batch[1].all() and not batch[2].all()


def test_a_first_token_may_open_the_block_or_begin_the_answer(setup):
    tokenizer, backend, compiled = setup
    vocab = len(tokenizer)
    start = ids(tokenizer, "<")[0]  # standing in for a one-token <think> (Qwen3's)
    tokens = ThinkTokens(backend.think_tokens.end_ids, start, starts_inside=False)
    opening = ReasoningGrammar(backend.matcher(compiled, KEY[0]), tokens)
    expected = mask(backend.matcher(compiled, KEY[0]), vocab)
    expected[start] = True
    assert torch.equal(mask(opening, vocab), expected)
    assert opening.accept_token(start) and mask(opening, vocab).all()  # a block opened
    opening.rollback(1)
    brace = ids(tokenizer, "{")[0]
    assert opening.accept_token(brace) and not mask(opening, vocab)[start]  # the answer began
    opening.rollback(1)
    assert torch.equal(mask(opening, vocab), expected)
    assert not opening.accept_token(ids(tokenizer, "x")[0])  # neither a block nor JSON
