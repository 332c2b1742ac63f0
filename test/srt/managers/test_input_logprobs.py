"""Prompt logprobs through an in-process Scheduler: every prompt position from logprob_start_len
scored as transformers scores it, across chunked prefill passes, past a radix-cached prefix, and
once only for a request that is retracted and prefilled again."""

from __future__ import annotations

import pytest

from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs

MAX_STEPS = 2000


def make_scheduler(path: str, **kwargs) -> Scheduler:
    return Scheduler(ServerArgs(model_path=path, dtype="float32", device="cpu", **kwargs))


def request(rid: str, input_ids: list[int], start: int, top: int = 0, max_new_tokens: int = 2):
    params = SamplingParams(temperature=0, max_new_tokens=max_new_tokens, ignore_eos=True)
    return TokenizedGenerateReqInput(
        rid, input_ids, params, stream=False, return_logprob=True, top_logprobs_num=top, logprob_start_len=start
    )


def prompt(length: int, salt: int = 0) -> list[int]:
    return [(7 * j + 13 * salt + 5) % 300 + 1 for j in range(length)]


def run(scheduler: Scheduler) -> dict[str, dict]:
    """Per request: every message's prompt logprobs (a list, one entry per message that had
    them), its top ones, cached tokens and output ids."""
    results: dict[str, dict] = {}
    for _ in range(MAX_STEPS):
        if not scheduler.has_work():
            return results
        out = scheduler.step()
        for i, rid in enumerate(out.rids if out else ()):
            entry = results.setdefault(rid, {"input": [], "top": [], "cached": None, "ids": [], "reason": None})
            entry["ids"] += out.new_token_ids[i]
            entry["reason"] = out.finished_reasons[i] or entry["reason"]
            if out.constants[i] is not None:
                entry["cached"] = out.constants[i].cached_tokens
            if out.input_token_logprobs is not None and out.input_token_logprobs[i] is not None:
                entry["input"].append(out.input_token_logprobs[i])
                entry["top"].append(out.input_top_logprobs[i])
    pytest.fail("the scheduler did not finish its work")


def assert_model_scores(hf_reference, ids: list[int], start: int, got: list, top=None, top_n: int = 0) -> None:
    """`got` holds (logprob, token) per prompt position from `start`: the log-softmax of the
    logits before each token (None at position 0), as transformers computes it."""
    expected = hf_reference.prompt_logprobs("llama", ids)
    assert [token for _, token in got] == ids[start:]
    for position, (logprob, token) in enumerate(got, start):
        if position == 0:
            assert logprob is None
        else:
            assert logprob == pytest.approx(expected[position - 1, token].item(), abs=1e-4), position
    if top_n:
        assert len(top) == len(got) and (top[0] is None) == (start == 0)
        for position, alternatives in enumerate(top, start):
            if position == 0:
                continue
            values, tokens = expected[position - 1].topk(top_n)
            assert [t for _, t in alternatives] == tokens.tolist()
            assert [v for v, _ in alternatives] == pytest.approx(values.tolist(), abs=1e-4)


def test_prompt_logprobs_are_the_models_log_softmax_from_the_start_position(tiny_model_paths, hf_reference):
    scheduler = make_scheduler(tiny_model_paths["llama"])
    ids = prompt(20)
    scheduler.add_request(request("all", ids, start=0, top=3))
    scheduler.add_request(request("tail", prompt(12, salt=1), start=7))
    scheduler.add_request(request("last", prompt(9, salt=2), start=8))
    plain = request("outputs-only", prompt(10, salt=3), start=-1)
    scheduler.add_request(plain)
    got = run(scheduler)
    assert len(got["all"]["input"]) == 1, "sent once, with the first output"
    assert_model_scores(hf_reference, ids, 0, got["all"]["input"][0], got["all"]["top"][0], top_n=3)
    assert_model_scores(hf_reference, prompt(12, salt=1), 7, got["tail"]["input"][0])
    assert got["tail"]["top"] == [None]
    assert_model_scores(hf_reference, prompt(9, salt=2), 8, got["last"]["input"][0])
    assert got["outputs-only"]["input"] == [] and len(got["outputs-only"]["ids"]) == 2


def test_a_prompt_chunked_over_several_passes_is_scored_across_each_boundary(tiny_model_paths, hf_reference):
    scheduler = make_scheduler(tiny_model_paths["llama"], chunked_prefill_size=8)
    ids = prompt(30)
    scheduler.add_request(request("chunked", ids, start=0, top=2))
    scheduler.add_request(request("from-the-third-chunk", prompt(27, salt=4), start=19))
    got = run(scheduler)
    assert_model_scores(hf_reference, ids, 0, got["chunked"]["input"][0], got["chunked"]["top"][0], top_n=2)
    assert_model_scores(hf_reference, prompt(27, salt=4), 19, got["from-the-third-chunk"]["input"][0])


def test_a_cached_prefix_is_recomputed_from_the_position_before_the_start(tiny_model_paths, hf_reference):
    scheduler = make_scheduler(tiny_model_paths["llama"])
    ids = prompt(24)
    scheduler.add_request(request("warm", ids, start=-1))
    first = run(scheduler)["warm"]
    scheduler.add_request(request("cached", ids, start=-1))
    assert run(scheduler)["cached"]["cached"] == 23, "the cache holds the prompt"
    scheduler.add_request(request("whole", ids, start=0))
    whole = run(scheduler)["whole"]
    assert whole["cached"] == 0
    assert_model_scores(hf_reference, ids, 0, whole["input"][0])
    scheduler.add_request(request("late", ids, start=15))
    late = run(scheduler)["late"]
    assert late["cached"] == 14, "positions before the one scoring the start are still served from the cache"
    assert late["input"][0] == whole["input"][0][15:]
    assert late["ids"] == whole["ids"] == first["ids"]


def test_a_retracted_request_sends_its_prompt_logprobs_once(tiny_model_paths, hf_reference):
    prompts = [prompt(15, salt=i) for i in range(6)]
    tight = make_scheduler(tiny_model_paths["llama"], max_total_tokens=140)
    for i, ids in enumerate(prompts):
        tight.add_request(request(f"r{i}", ids, start=0, max_new_tokens=40))
    got = run(tight)
    assert tight.num_retractions > 0, "the pool was meant to run out"
    for i, ids in enumerate(prompts):
        assert len(got[f"r{i}"]["input"]) == 1
        assert_model_scores(hf_reference, ids, 0, got[f"r{i}"]["input"][0])
    state = tight.get_internal_state()
    assert state["free_slots"] + state["cached_slots"] == state["total_slots"]


@pytest.mark.parametrize("start", [9, 50])
def test_a_start_at_or_past_the_prompts_end_is_refused(tiny_model_paths, start):
    scheduler = make_scheduler(tiny_model_paths["llama"])
    scheduler.add_request(request("r", prompt(9), start=start))
    reason = run(scheduler)["r"]["reason"]
    assert reason["type"] == "abort" and "logprob_start_len" in reason["message"]
