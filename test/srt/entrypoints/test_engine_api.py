"""sglang.Engine's Python surface beyond generate: async_generate from any event loop (batched,
streamed, cancelled), the upstream-shaped server info, and what happens after shutdown."""

import asyncio
import time

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


def test_server_info_has_upstreams_internal_states_list(engine):
    info = engine.get_server_info()
    assert info["internal_states"] == [info["internal_state"]]


def test_use_after_shutdown_fails_clearly_and_shutdown_is_idempotent(tiny_model_paths):
    with sglang.Engine(model_path=tiny_model_paths["llama"], dtype="float32", device="cpu",
                       log_level="warning") as engine:
        assert engine.generate(PROMPTS[0], GREEDY)["meta_info"]["completion_tokens"] == 8
    engine.shutdown()
    for call in (lambda: engine.generate(PROMPTS[0], GREEDY), engine.flush_cache, engine.get_server_info,
                 lambda: asyncio.run(engine.async_generate(PROMPTS[0], GREEDY))):
        with pytest.raises(RuntimeError, match="shut down"):
            call()
