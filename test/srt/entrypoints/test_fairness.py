"""One request cannot slow everyone else down: a short request beside the largest fan-out the demo
server accepts, or beside a stream with the longest stop list it accepts, stays within

    latency beside it <= 3 x latency alone + 1 s

(medians of 5; "alone" is measured just before and just after, and the larger is taken, so that a
machine whose load drifts during the test does not decide it). On the CPU a decode step's time
grows with the batch, which the default fan-out limit is chosen for (docs/http_api.md, "Limits")."""

from __future__ import annotations

import asyncio
import statistics
import time

import httpx
import pytest

from sglang import demo
from sglang.test.server_fixture import ServerProcess

SHORT = {"text": "def add(a, b):", "sampling_params": {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}}
RATIO, SLACK_S = 3.0, 1.0
LONG_RUN = 1500  # tokens each background sequence may make: it outlasts the measurement, then is cancelled


@pytest.fixture(scope="module")
def server():
    proc = ServerProcess(demo.TARGET_PATH)
    yield proc
    proc.stop()


async def _short_latencies(client: httpx.AsyncClient, count: int = 5) -> list[float]:
    latencies = []
    for _ in range(count):
        start = time.monotonic()
        response = await client.post("/generate", json=SHORT)
        assert response.status_code == 200, response.text
        latencies.append(time.monotonic() - start)
    return latencies


async def _running(client: httpx.AsyncClient) -> int:
    return (await client.get("/get_server_info")).json()["internal_states"][0]["num_running_reqs"]


async def _latency_beside(server: ServerProcess, background, min_running: int) -> tuple[float, float]:
    """(median short latency alone, median beside `background(client)`, a coroutine that runs
    until cancelled once `min_running` requests run)."""
    async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as client:
        await _short_latencies(client, 2)  # warm
        before = await _short_latencies(client)
        task = asyncio.create_task(background(client))
        try:
            deadline = time.monotonic() + 60
            while await _running(client) < min_running:
                assert not task.done(), task.result()
                assert time.monotonic() < deadline, "the background request never ran"
                await asyncio.sleep(0.1)
            beside = await _short_latencies(client)
            assert not task.done(), "the background request ended before the measurement did"
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        while await _running(client):  # the cancelled request is aborted at the next step
            await asyncio.sleep(0.1)
        after = await _short_latencies(client)
    alone = max(statistics.median(before), statistics.median(after))
    return alone, statistics.median(beside)


def test_a_short_request_beside_the_largest_fan_out(server):
    limit = httpx.get(f"{server.base_url}/get_server_info").json()["max_sequences_per_request"]
    too_many = {"text": ["import os\n", "class A:\n"], "sampling_params": {"n": limit // 2 + 1, "max_new_tokens": 1}}
    assert httpx.post(f"{server.base_url}/generate", json=too_many).status_code == 400
    fan_out = {
        "text": ["import os\n", "class A:\n"],
        "sampling_params": {"n": limit // 2, "max_new_tokens": LONG_RUN, "ignore_eos": True},
    }

    async def background(client):
        return await client.post("/generate", json=fan_out)

    alone, beside = asyncio.run(_latency_beside(server, background, min_running=limit))
    assert beside <= RATIO * alone + SLACK_S, (alone, beside)


def test_a_short_request_beside_a_stream_with_the_longest_stop_list(server):
    args = httpx.get(f"{server.base_url}/get_server_info").json()
    count, length = args["max_stop_strings"], args["max_stop_str_len"]
    # Every one starts like the code the model writes, so text is often held back as a possible start.
    stops = [("\n    return " + "z" * length)[: length - 3] + f"{i:03d}" for i in range(count)]
    assert len(stops) == count and all(len(stop) == length for stop in stops)
    body = {
        "text": "def f(x):",
        "stream": True,
        "sampling_params": {"stop": stops, "max_new_tokens": LONG_RUN, "ignore_eos": True, "temperature": 0},
    }

    async def background(client):
        async with client.stream("POST", "/generate", json=body) as response:
            assert response.status_code == 200
            async for _ in response.aiter_lines():
                pass

    alone, beside = asyncio.run(_latency_beside(server, background, min_running=1))
    assert beside <= RATIO * alone + SLACK_S, (alone, beside)
