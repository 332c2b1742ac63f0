"""Routes of upstream SGLang's HTTP server beyond generation: POST /abort_request, the OpenAI
retrieve-model route GET /v1/models/{model}, and CORS (browser preflights), end to end on a
real server process with --api-key."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from sglang.test.server_fixture import ServerProcess, assert_idle_kv_accounting

API_KEY = "sk-upstream-routes"
AUTH = {"authorization": f"Bearer {API_KEY}"}
# Long enough to be running (or queued behind one that is) when the abort comes.
LONG = {"max_new_tokens": 1000, "ignore_eos": True, "temperature": 0}
# Long enough to be seen running between two polls of the server's state on a busy 2-core machine
# (40 tokens could finish between them), short enough to finish by its length.
SEEN_RUNNING = {"max_new_tokens": 300, "ignore_eos": True}
ORIGIN = "http://localhost:8080"


@pytest.fixture(scope="module")
def keyed_server(tiny_model_paths):
    """One request runs at a time, so a second one waits in the queue."""
    proc = ServerProcess(tiny_model_paths["llama"], "--api-key", API_KEY, "--max-running-requests", "1")
    yield proc
    proc.stop()


@pytest.fixture(autouse=True)
def kv_accounting_returns_to_idle(keyed_server):
    yield
    for _ in range(50):  # aborts land at the scheduler's next step
        state = internal_state(keyed_server)
        if state["num_running_reqs"] == 0 and state["num_queue_reqs"] == 0:
            break
        time.sleep(0.1)
    assert_idle_kv_accounting(internal_state(keyed_server))


@pytest.fixture(scope="module")
def pool():
    with ThreadPoolExecutor(4) as executor:
        yield executor


def internal_state(server) -> dict:
    info = httpx.get(f"{server.base_url}/get_server_info", headers=AUTH, timeout=10).json()
    return info["internal_states"][0]


def wait_for(server, running: int, queued: int = 0) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        state = internal_state(server)
        if state["num_running_reqs"] == running and state["num_queue_reqs"] == queued:
            return
        time.sleep(0.02)
    raise TimeoutError(f"never {running} running and {queued} queued: {state}")


def generate(server, body: dict) -> httpx.Response:
    return httpx.post(f"{server.base_url}/generate", json=body, headers=AUTH, timeout=60)


def abort(server, body: dict, headers=AUTH) -> httpx.Response:
    return httpx.post(f"{server.base_url}/abort_request", json=body, headers=headers, timeout=10)


def assert_aborted(meta: dict) -> None:
    assert meta["finish_reason"]["type"] == "abort", meta
    assert meta["completion_tokens"] < LONG["max_new_tokens"], meta


# ---- POST /abort_request ---------------------------------------------------------------------


def test_abort_request_ends_a_running_request_and_its_client_gets_the_tokens_so_far(keyed_server, pool):
    waiter = pool.submit(generate, keyed_server, {"text": "Hello", "rid": "running-1", "sampling_params": LONG})
    wait_for(keyed_server, running=1)
    answer = abort(keyed_server, {"rid": "running-1"})
    assert answer.status_code == 200 and answer.content == b""  # as upstream: an empty 200

    response = waiter.result(timeout=30)
    assert response.status_code == 200, response.text
    meta = response.json()["meta_info"]
    assert meta["id"] == "running-1"
    assert_aborted(meta)
    assert len(response.json()["output_ids"]) == meta["completion_tokens"]


def test_abort_request_ends_a_stream_with_an_abort_finish_then_done(keyed_server):
    body = {"text": "Hello", "rid": "streamed-1", "stream": True, "sampling_params": LONG}
    with httpx.stream("POST", f"{keyed_server.base_url}/generate", json=body, headers=AUTH, timeout=60) as stream:
        assert stream.status_code == 200
        events = []
        for line in stream.iter_lines():
            if not line.startswith("data: "):
                continue
            events.append(line[len("data: ") :])
            if len(events) == 1:  # it is running: abort it from another connection
                assert abort(keyed_server, {"rid": "streamed-1"}).status_code == 200
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    assert_aborted(last["meta_info"])
    assert all(json.loads(event)["meta_info"]["finish_reason"] is None for event in events[:-2])


def test_abort_request_by_rid_ends_every_sample_of_the_request_running_or_queued(keyed_server, pool):
    # n = 2 runs as rid-0 and rid-1: one runs, the other waits for the only running slot.
    body = {"text": "Hello", "rid": "pair", "sampling_params": dict(LONG, n=2)}
    waiter = pool.submit(generate, keyed_server, body)
    wait_for(keyed_server, running=1, queued=1)
    assert abort(keyed_server, {"rid": "pair"}).status_code == 200

    response = waiter.result(timeout=30)
    assert response.status_code == 200, response.text
    results = response.json()
    assert sorted(r["meta_info"]["id"] for r in results) == ["pair-0", "pair-1"]
    for result in results:
        assert_aborted(result["meta_info"])


def test_abort_all_ends_every_request_in_flight(keyed_server, pool):
    waiters = [pool.submit(generate, keyed_server, {"text": "Hello", "sampling_params": LONG}) for _ in range(2)]
    wait_for(keyed_server, running=1, queued=1)
    assert abort(keyed_server, {"abort_all": True}).status_code == 200
    for waiter in waiters:
        response = waiter.result(timeout=30)
        assert response.status_code == 200, response.text
        assert_aborted(response.json()["meta_info"])


@pytest.mark.parametrize("stream", [False, True])
def test_an_openai_request_aborted_by_abort_all_finishes_with_reason_abort(
    keyed_server, pool, stream, tiny_model_paths
):
    """As upstream: a 200 whose choice has finish_reason "abort" and the text so far, not an error."""
    client = openai.OpenAI(base_url=f"{keyed_server.base_url}/v1", api_key=API_KEY)

    def complete():
        kwargs = dict(
            model=tiny_model_paths["llama"],
            prompt="Hello",
            max_tokens=1000,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        if not stream:
            return client.completions.create(**kwargs).choices[0].finish_reason
        return [c.choices[0].finish_reason for c in client.completions.create(stream=True, **kwargs) if c.choices]

    waiter = pool.submit(complete)
    wait_for(keyed_server, running=1)
    assert abort(keyed_server, {"abort_all": True}).status_code == 200
    reasons = waiter.result(timeout=30)
    assert (reasons[-1] if stream else reasons) == "abort", reasons


def test_abort_request_of_an_unknown_rid_changes_nothing(keyed_server, pool):
    waiter = pool.submit(generate, keyed_server, {"text": "Hello", "rid": "kept", "sampling_params": SEEN_RUNNING})
    wait_for(keyed_server, running=1)
    # Neither a prefix of the running rid nor a longer rid starting with it names it.
    for body in ({"rid": "no-such-request"}, {"rid": ""}, {}, {"rid": "kep"}, {"rid": "kept-1"}):
        answer = abort(keyed_server, body)
        assert answer.status_code == 200 and answer.content == b"", (body, answer.text)
    response = waiter.result(timeout=30)
    assert response.json()["meta_info"]["finish_reason"]["type"] == "length"


def test_abort_request_leaves_another_clients_request_whose_rid_looks_like_a_sample(keyed_server, pool):
    """ "job-1" sent by a client with n = 1 is not a sample of "job": aborting "job" leaves it running."""
    waiter = pool.submit(generate, keyed_server, {"text": "Hello", "rid": "job-1", "sampling_params": SEEN_RUNNING})
    wait_for(keyed_server, running=1)
    answer = abort(keyed_server, {"rid": "job"})
    assert answer.status_code == 200 and answer.content == b"", answer.text
    response = waiter.result(timeout=30)
    assert response.json()["meta_info"]["finish_reason"]["type"] == "length"


def test_abort_request_refuses_a_malformed_body_and_a_missing_key(keyed_server):
    for body, param in (({"rid": 5}, "rid"), ({"abort_all": "yes"}, "abort_all")):
        refused = abort(keyed_server, body)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == param, refused.text
    assert abort(keyed_server, {"abort_all": True}, headers={}).status_code == 401


# ---- GET /v1/models/{model} ------------------------------------------------------------------


def test_retrieve_model_returns_the_served_model(keyed_server, tiny_model_paths):
    client = openai.OpenAI(base_url=f"{keyed_server.base_url}/v1", api_key=API_KEY, max_retries=0)
    listed = client.models.list().data[0]
    assert listed.id == tiny_model_paths["llama"]  # the default name: the model path, slashes and all
    retrieved = client.models.retrieve(listed.id)
    assert retrieved.id == listed.id and retrieved.object == "model" and retrieved.owned_by == "sglang"
    assert retrieved.model_extra["max_model_len"] == listed.model_extra["max_model_len"] == 1024
    raw = httpx.get(f"{keyed_server.base_url}/v1/models/{listed.id}", headers=AUTH, timeout=10)
    assert raw.status_code == 200 and raw.json()["id"] == listed.id


def test_retrieve_model_of_another_name_is_openais_404(keyed_server):
    client = openai.OpenAI(base_url=f"{keyed_server.base_url}/v1", api_key=API_KEY, max_retries=0)
    with pytest.raises(openai.NotFoundError) as raised:
        client.models.retrieve("gpt-4o")
    assert raised.value.body == {
        "message": "The model 'gpt-4o' does not exist",
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_found",
    }
    unkeyed = httpx.get(f"{keyed_server.base_url}/v1/models/gpt-4o", timeout=10)
    assert unkeyed.status_code == 401


# ---- CORS --------------------------------------------------------------------------------------


def test_a_browser_preflight_is_answered_without_the_key(keyed_server):
    headers = {
        "origin": ORIGIN,
        "access-control-request-method": "POST",
        "access-control-request-headers": "authorization, content-type",
    }
    for route in ("/v1/chat/completions", "/generate", "/abort_request"):
        answer = httpx.options(f"{keyed_server.base_url}{route}", headers=headers, timeout=10)
        assert answer.status_code == 200, (route, answer.status_code, answer.text)
        assert answer.headers["access-control-allow-origin"] == ORIGIN
        assert "POST" in answer.headers["access-control-allow-methods"]
        assert "authorization" in answer.headers["access-control-allow-headers"].lower()


def test_cross_origin_requests_still_need_the_key_and_can_read_the_answer(keyed_server):
    body = {"text": "Hello", "sampling_params": {"max_new_tokens": 2}}
    refused = httpx.post(f"{keyed_server.base_url}/generate", json=body, headers={"origin": ORIGIN}, timeout=10)
    assert refused.status_code == 401
    assert refused.headers["access-control-allow-origin"] == ORIGIN  # the page can read why
    accepted = httpx.post(
        f"{keyed_server.base_url}/generate", json=body, headers={"origin": ORIGIN, **AUTH}, timeout=30
    )
    assert accepted.status_code == 200, accepted.text
    assert accepted.headers["access-control-allow-origin"] == ORIGIN
