"""Bad requests against a real server: each is refused with an OpenAI-style error naming the
field at fault, and the server keeps serving afterwards. Also the API key and the queue limit."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import openai
import pytest

from sglang.test.server_fixture import ServerProcess

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
GENERATE = "/generate"
MESSAGES = [{"role": "user", "content": "Hello"}]
TOO_LONG = "word " * 1100  # well over the tiny model's 1024-token context
CONTEXT_LENGTH = 1024

# A small request per route that must succeed after every bad one.
GOOD_BODIES = {
    CHAT: {"messages": MESSAGES, "max_tokens": 2, "ignore_eos": True},
    COMPLETIONS: {"prompt": "Hello", "max_tokens": 2, "ignore_eos": True},
    GENERATE: {"text": "Hello", "sampling_params": {"max_new_tokens": 2, "ignore_eos": True}},
}


def row(route, body, status, param, message_part, id):
    return pytest.param(route, body, status, param, message_part, id=id)


BAD_REQUESTS = [
    # the body itself
    row(CHAT, b'{"messages": [', 400, "body", "JSON", "chat-malformed-json"),
    row(CHAT, b'[{"role": "user", "content": "hi"}]', 400, "body", "JSON object", "chat-array-body"),
    row(CHAT, b"", 400, "body", "JSON object", "chat-empty-body"),
    row(COMPLETIONS, b"{'prompt': 'single quotes'}", 400, "body", "JSON", "completions-malformed-json"),
    row(GENERATE, b"{bad", 400, "body", "JSON", "native-malformed-json"),
    row(GENERATE, b"[]", 400, "body", "JSON object", "native-array-body"),
    row(GENERATE, b"", 400, "body", "JSON object", "native-empty-body"),
    # chat messages
    row(CHAT, {}, 400, "messages", "required", "chat-missing-messages"),
    row(CHAT, {"messages": "Hello"}, 400, "messages", "list", "chat-messages-not-a-list"),
    row(CHAT, {"messages": []}, 400, "messages", "messages", "chat-empty-messages"),
    row(CHAT, {"messages": [{"content": "Hello"}]}, 400, "messages", "role", "chat-message-without-role"),
    row(CHAT, {"messages": [{"role": "wizard", "content": "Hello"}]}, 400, "messages", "role", "chat-unknown-role"),
    row(CHAT, {"messages": [{"role": "user"}]}, 400, "messages", "needs content", "chat-user-message-without-content"),
    row(
        CHAT,
        {"messages": [{"role": "system", "content": None}, *MESSAGES]},
        400,
        "messages",
        "needs content",
        "chat-system-message-null-content",
    ),
    # completion prompts
    row(COMPLETIONS, {}, 400, "prompt", "required", "completions-missing-prompt"),
    row(COMPLETIONS, {"prompt": {"text": "Hello"}}, 400, "prompt", "prompt", "completions-prompt-an-object"),
    row(COMPLETIONS, {"prompt": [1, "two"]}, 400, "prompt", "prompt", "completions-prompt-mixed-list"),
    row(COMPLETIONS, {"prompt": [1, 100000]}, 400, "prompt", "[0, 384)", "completions-token-outside-vocab"),
    # lengths
    row(
        COMPLETIONS,
        {"prompt": "Hello", "max_tokens": -1},
        400,
        "max_tokens",
        "greater than",
        "completions-max-tokens-negative",
    ),
    row(
        COMPLETIONS,
        {"prompt": "Hello", "max_tokens": "ten"},
        400,
        "max_tokens",
        "integer",
        "completions-max-tokens-string",
    ),
    row(CHAT, {"messages": MESSAGES, "max_tokens": -1}, 400, "max_tokens", "greater than", "chat-max-tokens-negative"),
    row(COMPLETIONS, {"prompt": TOO_LONG}, 400, "prompt", "context length", "completions-prompt-over-context"),
    row(
        CHAT,
        {"messages": [{"role": "user", "content": TOO_LONG}]},
        400,
        "messages",
        "context length",
        "chat-prompt-over-context",
    ),
    row(GENERATE, {"text": TOO_LONG}, 400, "text", "context length", "native-prompt-over-context"),
    row(
        COMPLETIONS,
        {"prompt": "Hello", "max_tokens": CONTEXT_LENGTH},
        400,
        "max_tokens",
        "context length",
        "completions-prompt-plus-max-tokens-over-context",
    ),
    row(
        CHAT,
        {"messages": MESSAGES, "max_completion_tokens": CONTEXT_LENGTH},
        400,
        "max_completion_tokens",
        "context length",
        "chat-prompt-plus-max-completion-tokens-over-context",
    ),
    row(
        GENERATE,
        {"text": "Hello", "sampling_params": {"max_new_tokens": CONTEXT_LENGTH}},
        400,
        "max_new_tokens",
        "context length",
        "native-prompt-plus-max-new-tokens-over-context",
    ),
    # sampling ranges and types
    row(
        CHAT, {"messages": MESSAGES, "temperature": -1}, 400, "temperature", "greater than", "chat-temperature-negative"
    ),
    row(
        COMPLETIONS, {"prompt": "Hello", "temperature": 3}, 400, "temperature", "less than", "completions-temperature-3"
    ),
    row(COMPLETIONS, {"prompt": "Hello", "top_p": 0}, 400, "top_p", "greater than", "completions-top-p-0"),
    row(CHAT, {"messages": MESSAGES, "top_p": 1.5}, 400, "top_p", "less than", "chat-top-p-1.5"),
    row(COMPLETIONS, {"prompt": "Hello", "top_k": 0}, 400, "top_k", "top_k", "completions-top-k-0"),
    row(CHAT, {"messages": MESSAGES, "n": 0}, 400, "n", "greater than", "chat-n-0"),
    row(COMPLETIONS, {"prompt": "Hello", "n": 65}, 400, "n", "64", "completions-n-over-limit"),
    row(COMPLETIONS, {"prompt": "Hello", "logprobs": 21}, 400, "logprobs", "20", "completions-logprobs-21"),
    row(
        CHAT,
        {"messages": MESSAGES, "logprobs": True, "top_logprobs": 21},
        400,
        "top_logprobs",
        "20",
        "chat-top-logprobs-21",
    ),
    row(
        CHAT,
        {"messages": MESSAGES, "top_logprobs": 3},
        400,
        "top_logprobs",
        "logprobs",
        "chat-top-logprobs-without-logprobs",
    ),
    row(COMPLETIONS, {"prompt": "Hello", "stop": 5}, 400, "stop", "stop", "completions-stop-a-number"),
    row(CHAT, {"messages": MESSAGES, "seed": "abc"}, 400, "seed", "integer", "chat-seed-a-string"),
    row(
        COMPLETIONS,
        {"prompt": "Hello", "frequency_penalty": 2.5},
        400,
        "frequency_penalty",
        "less than",
        "completions-frequency-penalty-2.5",
    ),
    row(
        CHAT,
        {"messages": MESSAGES, "presence_penalty": -2.5},
        400,
        "presence_penalty",
        "greater than",
        "chat-presence-penalty--2.5",
    ),
    row(
        CHAT,
        {"messages": MESSAGES, "repetition_penalty": 0},
        400,
        "repetition_penalty",
        "greater than",
        "chat-repetition-penalty-0",
    ),
    # a streamed request is refused with a plain status too, before any event
    row(CHAT, {"messages": MESSAGES, "stream": True, "top_k": 0}, 400, "top_k", "top_k", "chat-stream-top-k-0"),
    row(
        COMPLETIONS,
        {"prompt": "Hello", "stream": True, "frequency_penalty": 2.5},
        400,
        "frequency_penalty",
        "less than",
        "completions-stream-frequency-penalty-2.5",
    ),
    # the model
    row(
        COMPLETIONS,
        {"model": "no-such-model", "prompt": "Hello"},
        400,
        "model",
        "no-such-model",
        "completions-unknown-model",
    ),
    row(CHAT, {"model": "no-such-model", "messages": MESSAGES}, 400, "model", "no-such-model", "chat-unknown-model"),
    row(
        CHAT,
        {
            "messages": MESSAGES,
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": {"type": "function"},
        },
        400,
        "tool_choice",
        '{"name": "..."}',
        "chat-tool-choice-no-function",
    ),
    row(
        CHAT,
        {"messages": MESSAGES, "tool_choice": "sometimes"},
        400,
        "tool_choice",
        '"none", "auto", "required"',
        "chat-tool-choice-unknown-word",
    ),
    # the native API
    row(
        GENERATE,
        {"text": "Hello", "sampling_params": {"repetition_penalty": 3}},
        400,
        "repetition_penalty",
        "(0, 2]",
        "native-repetition-penalty-3",
    ),
    row(
        GENERATE,
        {"text": "Hello", "sampling_params": {"max_new_tokens": -1}},
        400,
        "max_new_tokens",
        ">= 0",
        "native-max-new-tokens-negative",
    ),
    row(GENERATE, {"sampling_params": {"max_new_tokens": 2}}, 400, "text", "input_ids", "native-no-prompt"),
    row(GENERATE, {"text": "Hello", "input_ids": [1, 2]}, 400, "text", "input_ids", "native-text-and-input-ids"),
    row(GENERATE, {"input_ids": [1, 2, 100000]}, 400, "input_ids", "[0, 384)", "native-input-ids-outside-vocab"),
    row(GENERATE, {"input_ids": [1, -1]}, 400, "input_ids", "[0, 384)", "native-input-ids-negative"),
    row(
        GENERATE,
        {"text": "Hello", "sampling_params": "greedy"},
        400,
        "sampling_params",
        "dict",
        "native-sampling-params-a-string",
    ),
    row(
        GENERATE,
        {"text": "Hello", "sampling_params": {"temprature": 0}},
        400,
        "temprature",
        "Unknown",
        "native-unknown-sampling-param",
    ),
    row(
        GENERATE,
        {"text": "Hello", "sampling_params": {"max_new_tokens": "x"}},
        400,
        "max_new_tokens",
        "integer",
        "native-max-new-tokens-string",
    ),
    row(GENERATE, {"text": 5}, 400, "text", "string", "native-text-a-number"),
    row(
        GENERATE,
        {"text": "Hello", "return_logprob": True, "top_logprobs_num": 21},
        400,
        "top_logprobs_num",
        "20",
        "native-top-logprobs-num-21",
    ),
    row(
        GENERATE,
        {"text": "Hello", "return_logprob": True, "logprob_start_len": 50},
        400,
        "logprob_start_len",
        "smaller than the prompt",
        "native-logprob-start-past-the-prompt",
    ),
    row(
        GENERATE,
        {"text": ["Hello", "Hi"], "return_logprob": True, "logprob_start_len": [0, 0, 0]},
        400,
        "logprob_start_len",
        "3 entries",
        "native-logprob-start-per-prompt-mismatch",
    ),
    row(
        GENERATE,
        {"text": "Hello", "stream": True, "sampling_params": {"temperature": -1}},
        400,
        "temperature",
        "[0, 2]",
        "native-stream-temperature-negative",
    ),
]


def post(base_url: str, route: str, body, model: str, headers=None) -> httpx.Response:
    if isinstance(body, bytes):
        headers = {"content-type": "application/json", **(headers or {})}
        return httpx.post(base_url + route, content=body, headers=headers, timeout=60)
    if route != GENERATE and "model" not in body:
        body = {"model": model, **body}
    return httpx.post(base_url + route, json=body, headers=headers, timeout=60)


def completion_tokens(route: str, response: httpx.Response) -> int:
    body = response.json()
    return body["meta_info"]["completion_tokens"] if route == GENERATE else body["usage"]["completion_tokens"]


@pytest.mark.parametrize("route, body, status, param, message_part", BAD_REQUESTS)
def test_bad_request_is_refused_naming_the_field_and_the_server_keeps_serving(
    server, tiny_model_paths, route, body, status, param, message_part
):
    model = tiny_model_paths["llama"]
    response = post(server.base_url, route, body, model)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert (error["code"], error["type"], error["param"]) == (status, "invalid_request_error", param), error
    assert message_part in error["message"], error

    good = post(server.base_url, route, GOOD_BODIES[route], model)
    assert good.status_code == 200, good.text
    assert completion_tokens(route, good) == 2


# ---- one server with an API key and a one-request queue -------------------------------------

API_KEY = "sk-test"
AUTH = {"authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def guarded_server(tiny_model_paths):
    """One server for both tests below (starting a server is the expensive part)."""
    proc = ServerProcess(
        tiny_model_paths["llama"], "--api-key", API_KEY, "--max-running-requests", "1", "--max-queued-requests", "1"
    )
    yield proc
    proc.stop()


def test_api_key_is_required_except_for_health(guarded_server, tiny_model_paths):
    base = guarded_server.base_url
    model = tiny_model_paths["llama"]
    assert httpx.get(f"{base}/health", timeout=10).status_code == 200
    for headers in ({}, {"authorization": "Bearer sk-wrong"}, {"authorization": API_KEY}):
        refused = post(base, COMPLETIONS, GOOD_BODIES[COMPLETIONS], model, headers=headers)
        assert refused.status_code == 401, (headers, refused.text)
        assert refused.json()["error"]["type"] == "authentication_error"
        assert httpx.get(f"{base}/v1/models", headers=headers, timeout=10).status_code == 401
        assert post(base, GENERATE, GOOD_BODIES[GENERATE], model, headers=headers).status_code == 401

    accepted = post(base, GENERATE, GOOD_BODIES[GENERATE], model, headers=AUTH)
    assert accepted.status_code == 200, accepted.text
    assert httpx.get(f"{base}/v1/models", headers=AUTH, timeout=10).status_code == 200

    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{base}/v1", api_key="sk-wrong", max_retries=0).models.list()
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=API_KEY, max_retries=0)
    chat = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=2, extra_body={"ignore_eos": True})
    assert chat.usage.completion_tokens == 2


QUEUE_TEST_TOKENS = 300  # long enough that all six requests are in flight together


def test_requests_beyond_the_queue_limit_get_503_and_the_rest_complete(guarded_server):
    base = guarded_server.base_url
    body = {"text": "Hello", "sampling_params": {"max_new_tokens": QUEUE_TEST_TOKENS, "ignore_eos": True}}

    async def fire_all():
        async with httpx.AsyncClient(timeout=120, headers=AUTH) as http:
            return await asyncio.gather(*(http.post(f"{base}/generate", json=body) for _ in range(6)))

    responses = asyncio.run(fire_all())
    statuses = sorted(r.status_code for r in responses)
    # One running + one queued fit; the other four are refused up front.
    assert statuses == [200, 200, 503, 503, 503, 503], [r.text for r in responses]
    for response in responses:
        if response.status_code == 200:
            assert response.json()["meta_info"]["completion_tokens"] == QUEUE_TEST_TOKENS
        else:
            error = response.json()["error"]
            assert error["code"] == 503 and "overloaded" in error["message"], error

    state = _wait_until_idle(base)
    assert state["request_slots"] == 0, state
    assert state["free_slots"] + state["cached_slots"] == state["total_slots"], state


def _wait_until_idle(base: str, timeout: float = 5.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        state = httpx.get(f"{base}/get_server_info", headers=AUTH, timeout=10).json()["internal_states"][0]
        if state["num_running_reqs"] == 0 and state["num_queue_reqs"] == 0:
            return state
        assert time.monotonic() < deadline, state
        time.sleep(0.05)


@pytest.mark.parametrize(
    "route, body",
    [
        (GENERATE, {"text": "Hello", "sampling_params": {"max_new_tokens": 4}, "stream": True}),
        (COMPLETIONS, {"prompt": "Hello", "max_tokens": 4, "stream": True}),
    ],
    ids=["generate", "completions"],
)
def test_a_stream_whose_client_leaves_while_it_is_queued_leaves_the_queue(guarded_server, route, body):
    base = guarded_server.base_url
    # One running request fills the server (--max-running-requests 1) while the stream waits.
    long_body = {"text": "Hello", "sampling_params": {"max_new_tokens": 1000, "ignore_eos": True}}
    thread = threading.Thread(
        target=httpx.post, args=(f"{base}/generate",), kwargs={"json": long_body, "headers": AUTH, "timeout": 120}
    )
    thread.start()
    deadline = time.monotonic() + 10
    while _server_state(base)["num_running_reqs"] == 0:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    with pytest.raises(httpx.ReadTimeout):
        with httpx.stream("POST", f"{base}{route}", json=body, headers=AUTH, timeout=0.5) as response:
            response.read()
    # The abort lands within a disconnect poll (0.5 s); the long request runs for seconds more.
    deadline = time.monotonic() + 1.5
    while (state := _server_state(base))["num_queue_reqs"]:
        assert time.monotonic() < deadline, f"the stream stayed queued after its client left: {state}"
        time.sleep(0.05)
    assert thread.is_alive(), "the long request ended first, so the queue emptied by admission"
    thread.join()
    _wait_until_idle(base)


def _server_state(base: str) -> dict:
    return httpx.get(f"{base}/get_server_info", headers=AUTH, timeout=10).json()["internal_states"][0]
