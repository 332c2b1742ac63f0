"""Penalized requests through the Scheduler in-process: their token counts live on the device
(the worker's PenaltyCounts), so overlap scheduling, a chunked prompt, a retraction (the counts
rebuilt from the output so far) and an abort all give the tokens of an unhurried run, and every
row is given back once the requests are gone."""

from __future__ import annotations

from sglang.srt.managers.io_struct import AbortReq, TokenizedGenerateReqInput
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs
from sglang.test.runner_utils import run_to_completion
from sglang.test.server_fixture import assert_idle_kv_accounting

PENALTIES = [
    {"presence_penalty": 1.2},
    {"frequency_penalty": 0.8, "repetition_penalty": 1.5},
    {},  # an unpenalized neighbour
    {"repetition_penalty": 0.6},
    {"temperature": 0.7, "sampling_seed": 3, "presence_penalty": 0.9, "frequency_penalty": 0.4},
]


def make_scheduler(path: str, **kwargs) -> Scheduler:
    return Scheduler(ServerArgs(model_path=path, dtype="float32", device="cpu", **kwargs))


def add(scheduler: Scheduler, rid: str, input_ids: list[int], max_new_tokens: int = 40, **params) -> None:
    sampling = SamplingParams.from_dict(
        {"temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": True, **params}
    )
    sampling.verify(scheduler.model_config.vocab_size)
    scheduler.add_request(TokenizedGenerateReqInput(rid, input_ids, sampling, stream=False))


def prompts(n: int, length: int) -> list[list[int]]:
    return [[(7 * i + 13 * j + 1) % 300 + 1 for j in range(length)] for i in range(n)]


def outputs(path: str, prompt_length: int = 15, **kwargs) -> tuple[dict, Scheduler]:
    scheduler = make_scheduler(path, **kwargs)
    for i, (ids, params) in enumerate(zip(prompts(len(PENALTIES), prompt_length), PENALTIES)):
        add(scheduler, f"r{i}", ids, **params)
    got = {rid: out["ids"] for rid, out in run_to_completion(scheduler).items()}
    state = scheduler.get_internal_state()
    assert_idle_kv_accounting(state)
    assert state["penalty_rows"] == 0 and state["penalty_rows_capacity"] == 0, state
    return got, scheduler


def test_overlap_and_plain_scheduling_give_the_same_penalized_tokens(tiny_model_paths):
    path = tiny_model_paths["llama"]
    overlapped, _ = outputs(path)
    sequential, _ = outputs(path, disable_overlap_schedule=True)
    assert overlapped == sequential
    one_at_a_time, _ = outputs(path, disable_overlap_schedule=True, max_running_requests=1)
    assert one_at_a_time == overlapped, "one request at a time: nothing of a neighbour leaks into the counts"


def test_chunked_prompts_and_retractions_keep_the_penalized_tokens(tiny_model_paths):
    path = tiny_model_paths["llama"]
    expected, _ = outputs(path, prompt_length=40)
    # 16-token chunks, and a pool too small for all five: requests go back to the queue mid-output
    # and resume with their counts rebuilt from what they generated.
    got, tight = outputs(path, prompt_length=40, chunked_prefill_size=16, max_total_tokens=200)
    assert tight.num_retractions > 0, "the pool was meant to run out"
    assert got == expected


def test_aborted_penalized_requests_give_their_rows_back(tiny_model_paths):
    path = tiny_model_paths["llama"]
    scheduler = make_scheduler(path)
    for i, ids in enumerate(prompts(3, 10)):
        add(scheduler, f"r{i}", ids, presence_penalty=1.0)
    in_use = []

    def abort_some(step: int) -> None:
        in_use.append(scheduler.get_internal_state()["penalty_rows"])
        if step == 4:
            scheduler.abort_request(AbortReq("r0"))
        if step == 6:
            assert scheduler.in_flight is not None  # with a step in flight
            scheduler.abort_request(AbortReq("r2"))

    results = run_to_completion(scheduler, abort_some)
    assert max(in_use) == 3
    assert results["r0"]["reason"]["type"] == results["r2"]["reason"]["type"] == "abort"
    assert len(results["r1"]["ids"]) == 40
    state = scheduler.get_internal_state()
    assert_idle_kv_accounting(state)
    assert state["penalty_rows"] == 0 and state["penalty_rows_capacity"] == 0
    # The survivor's tokens are its own: the same as alone.
    alone = make_scheduler(path)
    add(alone, "r1", prompts(3, 10)[1], presence_penalty=1.0)
    assert run_to_completion(alone)["r1"]["ids"] == results["r1"]["ids"]


def test_a_server_without_penalized_requests_holds_no_rows(tiny_model_paths):
    scheduler = make_scheduler(tiny_model_paths["llama"])
    for i, ids in enumerate(prompts(3, 10)):
        add(scheduler, f"r{i}", ids, frequency_penalty=0.0, repetition_penalty=1.0)
    capacity = []
    run_to_completion(scheduler, lambda step: capacity.append(scheduler.get_internal_state()["penalty_rows_capacity"]))
    assert set(capacity) == {0}
