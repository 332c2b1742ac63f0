"""sglang.Engine's Python surface beyond generate: async_generate from any event loop (batched,
streamed, cancelled), upstream's keyword names, abort_request, the upstream-shaped server and model
info, and what happens after shutdown."""

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import sglang

GREEDY = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
PROMPTS = ["def add(a, b):", "Hello, world!", "import torch", "A radix tree"]


@pytest.fixture(scope="module")
def engine(tiny_model_paths):
    engine = sglang.Engine(model_path=tiny_model_paths["llama"], dtype="float32", device="cpu", log_level="warning")
    yield engine
    engine.shutdown()


def test_async_generate_gathered_on_a_fresh_loop_matches_generate(engine):
    expected = [out["output_ids"] for out in engine.generate(PROMPTS, GREEDY)]

    async def gather():
        return await asyncio.gather(*(engine.async_generate(p, GREEDY) for p in PROMPTS))

    assert [out["output_ids"] for out in asyncio.run(gather())] == expected


def test_async_generate_stream_ends_with_the_full_result(engine):
    expected = engine.generate(PROMPTS[0], GREEDY)

    async def collect():
        return [chunk async for chunk in await engine.async_generate(PROMPTS[0], GREEDY, stream=True)]

    chunks = asyncio.run(collect())
    assert chunks[-1]["output_ids"] == expected["output_ids"]
    assert chunks[-1]["text"] == expected["text"]


def test_cancelled_async_generate_aborts_its_request(engine):
    def running():
        return engine.get_server_info()["internal_state"]["num_running_reqs"]

    async def cancel_midway():
        task = asyncio.ensure_future(engine.async_generate(PROMPTS[0], {"max_new_tokens": 1000, "ignore_eos": True}))
        while running() == 0:
            await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_midway())
    for _ in range(50):  # the abort reaches the scheduler at its next step
        if running() == 0:
            break
        time.sleep(0.1)
    assert running() == 0


def test_generate_works_inside_a_running_event_loop(engine):
    async def call_blocking():
        return engine.generate(PROMPTS[1], GREEDY)["output_ids"]

    assert asyncio.run(call_blocking()) == engine.generate(PROMPTS[1], GREEDY)["output_ids"]


def test_parameters_after_input_ids_are_keyword_only(engine):
    # Upstream's fourth positional parameter is image_data: a ported positional call must not
    # bind it to stream (or anything else) silently.
    for call in (
        lambda: engine.generate(PROMPTS[0], GREEDY, None, True),
        lambda: asyncio.run(engine.async_generate(PROMPTS[0], GREEDY, None, True)),
    ):
        with pytest.raises(TypeError, match="positional"):
            call()


def test_upstream_logprob_keywords_with_upstreams_none_defaults(engine):
    out = engine.generate(PROMPTS[0], GREEDY, return_logprob=True, logprob_start_len=None, top_logprobs_num=None)
    assert len(out["meta_info"]["output_token_logprobs"]) == 8
    plain = engine.generate(PROMPTS[0], GREEDY, return_logprob=None, logprob_start_len=-1)
    assert plain["output_ids"] == out["output_ids"] and "output_token_logprobs" not in plain["meta_info"]


def test_upstream_only_parameters_are_accepted_at_their_defaults_and_refused_otherwise(engine):
    expected = engine.generate(PROMPTS[0], GREEDY)["output_ids"]
    defaults = {
        "image_data": None,
        "lora_path": [None],
        "custom_logit_processor": None,
        "return_hidden_states": False,
        "routed_dp_rank": 0,
        "external_trace_header": {},
        "session_params": None,
    }
    assert engine.generate(PROMPTS[0], GREEDY, **defaults)["output_ids"] == expected
    assert asyncio.run(engine.async_generate(PROMPTS[0], GREEDY, **defaults))["output_ids"] == expected
    for name, value in (("lora_path", "/adapters/a"), ("custom_logit_processor", "{}"), ("image_data", "cat.png")):
        with pytest.raises(NotImplementedError, match=name):
            engine.generate(PROMPTS[0], GREEDY, **{name: value})
        with pytest.raises(NotImplementedError, match=name):
            asyncio.run(engine.async_generate(PROMPTS[0], GREEDY, **{name: value}))
    with pytest.raises(TypeError, match="lora_paths"):
        engine.generate(PROMPTS[0], GREEDY, lora_paths=None)


def test_abort_request_by_rid_or_all_finishes_the_waiting_callers_with_abort(engine):
    long = {"max_new_tokens": 1000, "ignore_eos": True}

    def running():
        return engine.get_server_info()["internal_state"]["num_running_reqs"]

    async def abort_one_then_all():
        tasks = [asyncio.ensure_future(engine.async_generate(PROMPTS[i], long, rid=f"job-{i}")) for i in (0, 1)]
        while running() < 2:
            await asyncio.sleep(0.05)
        assert engine.abort_request("job-0") == ["job-0"]
        first = await tasks[0]
        assert engine.abort_request(abort_all=True) == ["job-1"]
        return first, await tasks[1]

    first, second = asyncio.run(abort_one_then_all())
    for out in (first, second):
        assert out["meta_info"]["finish_reason"]["type"] == "abort"
        assert 0 < out["meta_info"]["completion_tokens"] < 1000
    assert engine.abort_request("job-0") == [] and engine.abort_request(abort_all=True) == []


def test_model_info_names_the_model(engine, tiny_model_paths):
    info = engine.get_model_info()
    assert info["model_path"] == tiny_model_paths["llama"] and info["is_generation"] is True


def test_server_info_has_upstreams_internal_states_list(engine):
    info = engine.get_server_info()
    assert info["internal_states"] == [info["internal_state"]]


def test_use_after_shutdown_fails_clearly_and_shutdown_is_idempotent(tiny_model_paths):
    with sglang.Engine(
        model_path=tiny_model_paths["llama"], dtype="float32", device="cpu", log_level="warning"
    ) as engine:
        assert engine.generate(PROMPTS[0], GREEDY)["meta_info"]["completion_tokens"] == 8
    engine.shutdown()
    for call in (
        lambda: engine.generate(PROMPTS[0], GREEDY),
        engine.flush_cache,
        engine.get_server_info,
        lambda: asyncio.run(engine.async_generate(PROMPTS[0], GREEDY)),
        engine.abort_request,
        engine.get_model_info,
    ):
        with pytest.raises(RuntimeError, match="shut down"):
            call()


def test_a_request_waiting_at_shutdown_fails_with_the_reason(tiny_model_paths):
    """Another thread's generate, and a stream iterator kept across shutdown, get "shut down"
    errors at once, not a dead process's message, a closed loop's, or a hang."""
    engine = sglang.Engine(model_path=tiny_model_paths["llama"], dtype="float32", device="cpu", log_level="warning")
    long = {"max_new_tokens": 1000, "ignore_eos": True}  # seconds on the CPU: still running at shutdown
    stream = engine.generate(PROMPTS[1], long, stream=True)
    next(stream)
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(engine.generate, PROMPTS[0], long)
        while engine.get_server_info()["internal_state"]["num_running_reqs"] < 2:
            time.sleep(0.05)
        started = time.monotonic()
        engine.shutdown()
        with pytest.raises(RuntimeError, match="shut down"):
            waiting.result(timeout=30)
    assert time.monotonic() - started < 30
    with pytest.raises(RuntimeError, match="shut down"):
        next(stream)
