"""Incremental detokenization: never a broken character mid-stream, stop strings held back
while they may be starting, and the final text equal to decoding all ids at once."""

from __future__ import annotations

import pytest

from sglang.srt.managers.detokenizer_manager import DetokenizerManager, merge_token_outputs
from sglang.srt.managers.io_struct import BatchTokenIDOut, RequestConstants, finish_length, finish_matched
from sglang.test.tiny_models import build_tokenizer

TEXT = "héllo wörld, 你好, naïve café 🙂 done"


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def one_token_message(rid, token_id, finished=None, stop_strs=(), no_stop_trim=False, skip_special=True):
    return BatchTokenIDOut(
        rids=[rid],
        new_token_ids=[[token_id]],
        finished_reasons=[finished],
        constants=[RequestConstants(skip_special, no_stop_trim, tuple(stop_strs), prompt_tokens=1)],
        completion_tokens=[1],
        new_token_logprobs=[None],
        new_top_logprobs=[None],
    )


def stream(tokenizer, ids, final_reason, stop_strs=(), no_stop_trim=False, skip_special=True):
    manager = DetokenizerManager(tokenizer)
    chunks = []
    for i, token_id in enumerate(ids):
        reason = final_reason if i == len(ids) - 1 else None
        chunks.append(
            manager.handle(one_token_message("r", token_id, reason, stop_strs, no_stop_trim, skip_special)).new_texts[0]
        )
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


def test_a_stop_token_ends_the_text_without_being_part_of_it(tokenizer):
    """As upstream: the token that matched (EOS, or one of stop_token_ids, special or not) is not
    decoded into the text unless no_stop_trim; with skip_special_tokens off an EOS no longer
    shows up as its text."""
    ids = tokenizer.encode("alpha beta")
    eos = tokenizer.eos_token_id
    for skip in (True, False):
        assert "".join(stream(tokenizer, ids + [eos], finish_matched(eos), skip_special=skip)) == "alpha beta"
    assert (
        "".join(stream(tokenizer, ids + [eos], finish_matched(eos), no_stop_trim=True, skip_special=False))
        == "alpha beta" + tokenizer.eos_token
    )
    comma = tokenizer.encode(",")[0]  # an ordinary token given in stop_token_ids
    assert "".join(stream(tokenizer, ids + [comma], finish_matched(comma))) == "alpha beta"
    assert "".join(stream(tokenizer, ids + [comma], finish_matched(comma), no_stop_trim=True)) == "alpha beta,"


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


def test_steps_merged_while_the_detokenizer_was_busy_give_the_same_stream(tokenizer):
    """Steps queued while a batch was decoded are merged into one message: each request gets
    its ids, logprobs and latest counts in one piece, and its text is what the steps gave one
    at a time (a finished request's final text included)."""
    ids_a = tokenizer.encode(TEXT)[:9]
    ids_b = tokenizer.encode("naïve café")[:6]

    def step(k):  # request a streams 9 steps and finishes; b joins at step 2 and runs on
        rids = ["a"] * (k < 9) + ["b"] * (2 <= k < 8)
        token = {"a": ids_a[k] if k < 9 else None, "b": ids_b[k - 2] if 2 <= k < 8 else None}
        return BatchTokenIDOut(
            rids=rids,
            new_token_ids=[[token[r]] for r in rids],
            finished_reasons=[finish_length(9) if r == "a" and k == 8 else None for r in rids],
            # The constants travel with a request's first step only.
            constants=[RequestConstants(prompt_tokens=3) if k == {"a": 0, "b": 2}[r] else None for r in rids],
            completion_tokens=[k + 1 if r == "a" else k - 1 for r in rids],
            new_token_logprobs=[[(-0.5 * k, token[r])] if r == "a" else None for r in rids],
            new_top_logprobs=[None] * len(rids),
            spec_verify_ct=[k] * len(rids),
        )

    steps = [step(k) for k in range(9)]
    one_by_one, merged = DetokenizerManager(tokenizer), DetokenizerManager(tokenizer)
    texts = {"a": "", "b": ""}
    for out in steps:
        for rid, text in zip(out.rids, one_by_one.handle(out).new_texts):
            texts[rid] += text
    merged_texts = {"a": "", "b": ""}
    for group in (steps[:1], steps[1:5], steps[5:]):  # the scheduler ran ahead twice
        out = merge_token_outputs(group)
        for rid, text in zip(out.rids, merged.handle(out).new_texts):
            merged_texts[rid] += text
    assert merged_texts == texts and texts["a"] == tokenizer.decode(ids_a)
    last = merge_token_outputs(steps[5:])
    assert last.rids == ["a", "b"]
    assert last.new_token_ids == [ids_a[5:9], ids_b[3:6]]
    assert last.new_token_logprobs == [[(-0.5 * k, ids_a[k]) for k in range(5, 9)], None]
    assert last.finished_reasons == [finish_length(9), None]
    assert last.completion_tokens == [9, 6] and last.spec_verify_ct == [8, 7]
    assert merge_token_outputs(steps[1:5]).constants == [None, RequestConstants(prompt_tokens=3)]  # b's first step
    assert merge_token_outputs(steps[:1]) is steps[0]


def test_prompt_logprobs_survive_merged_steps_and_reach_the_tokenizer_manager(tokenizer):
    ids = tokenizer.encode(TEXT)[:3]

    def step(k, with_prompt: bool):  # b's prompt logprobs come with one step only
        return BatchTokenIDOut(
            rids=["a", "b"],
            new_token_ids=[[ids[k]], [ids[k]]],
            finished_reasons=[None, None],
            constants=[None, None],
            completion_tokens=[k + 1] * 2,
            new_token_logprobs=[None, None],
            new_top_logprobs=[None, None],
            input_token_logprobs=[None, [(None, 7), (-0.5, 8)]] if with_prompt else None,
            input_top_logprobs=[None, [None, [(-0.5, 8)]]] if with_prompt else None,
        )

    merged = merge_token_outputs([step(0, False), step(1, True), step(2, False)])
    assert merged.input_token_logprobs == [None, [(None, 7), (-0.5, 8)]]
    assert merged.input_top_logprobs == [None, [None, [(-0.5, 8)]]]
    assert merge_token_outputs([step(0, False), step(2, False)]).input_token_logprobs is None
    out = DetokenizerManager(tokenizer).handle(merged)
    assert (out.input_token_logprobs, out.input_top_logprobs) == (
        merged.input_token_logprobs,
        merged.input_top_logprobs,
    )
