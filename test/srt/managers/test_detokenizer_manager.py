"""Incremental detokenization: never a broken character mid-stream, stop strings held back
while they may be starting, and the final text equal to decoding all ids at once."""

from __future__ import annotations

import pytest

from sglang.srt.managers.detokenizer_manager import DetokenizerManager
from sglang.srt.managers.io_struct import BatchTokenIDOut, finish_length, finish_matched
from sglang.test.tiny_models import build_tokenizer

TEXT = "héllo wörld, 你好, naïve café 🙂 done"


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def one_token_message(rid, token_id, finished=None, stop_strs=(), no_stop_trim=False):
    return BatchTokenIDOut(
        rids=[rid], new_token_ids=[[token_id]], finished_reasons=[finished], skip_special_tokens=[True],
        prompt_tokens=[1], completion_tokens=[1], cached_tokens=[0], stop_strs=[list(stop_strs)],
        no_stop_trim=[no_stop_trim], new_token_logprobs=[None], new_top_logprobs=[None],
        admit_times=[None], first_token_times=[None],
    )


def stream(tokenizer, ids, final_reason, stop_strs=(), no_stop_trim=False):
    manager = DetokenizerManager(tokenizer)
    chunks = []
    for i, token_id in enumerate(ids):
        reason = final_reason if i == len(ids) - 1 else None
        chunks.append(manager.handle(one_token_message("r", token_id, reason, stop_strs, no_stop_trim)).new_texts[0])
    assert manager.states == {}  # a finished request leaves no state behind
    return chunks


def test_multibyte_characters_are_never_split_mid_stream(tokenizer):
    ids = tokenizer.encode(TEXT)
    assert len(ids) > len(TEXT.encode()) // 2, "the byte-level tokenizer should split characters"
    assert any("\ufffd" in tokenizer.decode([t]) for t in ids), "some token must hold part of a character"
    chunks = stream(tokenizer, ids, finish_length(len(ids)))
    assert all("\ufffd" not in chunk for chunk in chunks)
    assert "".join(chunks) == TEXT


def test_stop_string_is_held_back_then_cut(tokenizer):
    ids = tokenizer.encode(TEXT)
    # The scheduler finishes the request at the token that completes the stop string.
    ids = ids[: next(i for i in range(len(ids) + 1) if "naïve" in tokenizer.decode(ids[:i]))]
    chunks = stream(tokenizer, ids, finish_matched("naïve"), stop_strs=["naïve", "zzz"])
    sent = ""
    for chunk in chunks[:-1]:
        sent += chunk
        # Whatever was sent so far could not have started the stop string yet.
        assert "naïve" not in sent and not any(sent.endswith("naïve"[:k]) for k in range(1, 5))
    assert "".join(chunks) == TEXT[: TEXT.index("naïve")]


def test_no_stop_trim_keeps_the_stop_string(tokenizer):
    ids = tokenizer.encode(TEXT)
    chunks = stream(tokenizer, ids, finish_matched("done"), stop_strs=["done"], no_stop_trim=True)
    assert "".join(chunks) == TEXT


def test_two_requests_are_detokenized_independently(tokenizer):
    manager = DetokenizerManager(tokenizer)
    a, b = tokenizer.encode("alpha 你好"), tokenizer.encode("beta café")
    texts = {"a": "", "b": ""}
    for i in range(max(len(a), len(b))):
        for rid, ids in (("a", a), ("b", b)):
            if i < len(ids):
                reason = finish_length(len(ids)) if i == len(ids) - 1 else None
                texts[rid] += manager.handle(one_token_message(rid, ids[i], reason)).new_texts[0]
    assert texts == {"a": "alpha 你好", "b": "beta café"}
