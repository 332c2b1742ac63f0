"""Hostile input against one real demo-model server: malformed, deeply nested, oversized, mistyped,
out-of-range and not-yet-implemented requests on every route. Each is answered quickly, with a
status below 500 and the documented error shape, the server keeps answering /health meanwhile,
and a greedy request afterwards answers exactly as before."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import httpx
import pytest

from sglang import demo
from sglang.srt.managers.scheduler_process import MAX_CPU_THREADS, cpu_intra_op_threads
from sglang.test.server_fixture import ServerProcess
from sglang.test.server_fixture import assert_idle_kv_accounting as assert_idle_kv_accounting_of

API_KEY = "hostile-test-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
MAX_PAYLOAD = 16 * 1024 * 1024  # small, so the 413 case stays cheap
CHAT, COMPLETIONS, GENERATE = "/v1/chat/completions", "/v1/completions", "/generate"
MESSAGES = [{"role": "user", "content": "def add(a, b):"}]
GREEDY = {"text": "def fibonacci(n):", "sampling_params": {"max_new_tokens": 24, "temperature": 0}}
SLOW_S = 10.0  # no answer may take longer


@pytest.fixture(scope="module")
def keyed_server():
    # Not named `server`: conftest's KV check after each test reads /get_server_info without a key.
    proc = ServerProcess(
        demo.TARGET_PATH, "--api-key", API_KEY, "--log-level", "info", "--max-payload-size", str(MAX_PAYLOAD)
    )
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def client(keyed_server):
    with httpx.Client(base_url=keyed_server.base_url, headers=AUTH, timeout=60) as c:
        yield c


def assert_idle_kv_accounting(client: httpx.Client) -> None:
    for _ in range(50):  # aborts land at the scheduler's next step
        state = client.get("/get_server_info").json()["internal_states"][0]
        if state["num_running_reqs"] == 0 and state["num_queue_reqs"] == 0:
            break
        time.sleep(0.1)
    assert_idle_kv_accounting_of(state)


def assert_error_shape(response: httpx.Response) -> dict:
    assert response.headers["content-type"].startswith("application/json"), response.text[:200]
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert isinstance(error["message"], str) and error["message"], body
    assert isinstance(error["type"], str) and error["code"] == response.status_code, body
    assert "param" in error, body
    return error


# ---- the battery ------------------------------------------------------------------------------


def _json_cases(route: str, bodies: list) -> list[tuple]:
    return [("POST", route, json.dumps(body).encode(), None) for body in bodies]


def _raw_body_cases() -> list[tuple]:
    raw = [
        b"",
        b"null",
        b"[]",
        b"123",
        b'"text"',
        b"{",
        b"{bad json}",
        b"[" * 100_000,
        b"{" * 50_000,
        b'{"x": ' + b"[" * 5000 + b"]" * 5000 + b"}",
        b"\xff\xfe\x00garbage",
        b'{"a": NaN}',
        b'{"a": 1' + b"0" * 5000 + b"}",
        b'{"text": "a", "text": 5}',
        b"\x00\x00\x00\x00",
    ]
    return [("POST", route, body, None) for route in (GENERATE, COMPLETIONS, CHAT) for body in raw]


def _generate_cases() -> list[tuple]:
    sp = lambda **kw: {"text": "x", "sampling_params": {"max_new_tokens": 2, **kw}}  # noqa: E731
    bodies = [
        {},
        {"text": 5},
        {"text": [1, "a"]},
        {"text": {"a": 1}},
        {"text": []},
        {"text": ""},
        {"text": "ab\ud800cd"},
        {"text": "x", "input_ids": [1]},
        {"input_ids": ["a"]},
        {"input_ids": [-1]},
        {"input_ids": [10**30]},
        {"input_ids": [[]]},
        {"input_ids": []},
        {"input_ids": [True]},
        {"text": "x", "sampling_params": "hot"},
        {"text": "x", "sampling_params": [{}, {}]},
        sp(temperature="0.5"),
        sp(temperature=1e308),
        sp(temperature=-1),
        sp(top_p=0),
        sp(top_p=True),
        sp(max_new_tokens=-1),
        sp(max_new_tokens=10**30),
        sp(max_new_tokens=1.5),
        sp(top_k=0),
        sp(min_p=2),
        sp(n=0),
        sp(n=10**9),
        sp(n="2"),
        sp(stop=5),
        sp(stop=["x"] * 1000),
        sp(stop=["x" * 5000]),
        sp(stop=[""]),
        sp(stop=["\udfff"]),
        sp(stop_token_ids=[10**30]),
        sp(stop_token_ids="1"),
        sp(sampling_seed=-1),
        sp(sampling_seed=2**64),
        sp(ignore_eos="no"),
        sp(min_new_tokens=10**9),
        sp(regex="a+"),
        sp(json_schema="{}"),
        sp(ebnf="root ::= 'a'"),
        sp(frequency_penalty=1.0),
        sp(logit_bias={"1": 5}),
        sp(unknown_param=1),
        {"text": "x", "rid": 5},
        {"text": ["x", "y"], "rid": ["a"]},
        {"text": "x", "stream": "yes"},
        {"text": "x", "stream": 1},
        {"text": "x", "return_logprob": "yes"},
        {"text": "x", "top_logprobs_num": -1},
        {"text": "x", "top_logprobs_num": True},
        {"text": "x", "logprob_start_len": "x"},
        {"text": ["x"] * 64, "sampling_params": {"n": 64, "max_new_tokens": 1}},
        {"text": "x" * 1_000_000, "sampling_params": {"max_new_tokens": 1}},
    ]
    return _json_cases(GENERATE, bodies)


def _completions_cases() -> list[tuple]:
    c = lambda **kw: {"prompt": "x", "max_tokens": 2, **kw}  # noqa: E731
    bodies = [
        {},
        {"prompt": None},
        {"prompt": 5},
        {"prompt": [1, "a"]},
        {"prompt": [[1], ["a"]]},
        {"prompt": []},
        {"prompt": "ab\ud800cd", "max_tokens": 2},
        {"prompt": [10**30]},
        c(max_tokens=True),
        c(max_tokens="10"),
        c(max_tokens=-1),
        c(max_tokens=10**30),
        c(max_tokens=1.5),
        c(temperature="0.5"),
        c(temperature=1e308),
        c(temperature=-1),
        c(top_p=2),
        c(n="2"),
        c(n=0),
        c(n=10**9),
        c(n=True),
        c(stream="yes"),
        c(stream=1),
        c(stop=5),
        c(stop=["a"] * 100),
        c(stop=[1, 2]),
        c(seed=-1),
        c(seed=2**64),
        c(seed="1"),
        c(logprobs=100),
        c(logprobs=True),
        c(echo=True),
        c(suffix="x"),
        c(best_of=3),
        c(response_format={"type": "json_object"}),
        c(tools=[{"type": "function"}]),
        c(regex="a+"),
        c(json_schema="{}"),
        c(ebnf="root ::= 'a'"),
        c(logit_bias={"a": "b"}),
        c(user=5),
        c(stream_options="x"),
        c(ignore_eos="no"),
        c(model="another-model"),
        c(presence_penalty=5),
        {"prompt": ["x"] * 20, "n": 20, "max_tokens": 1},
        c(model="m" * 1_000_000),
        c(user="u" * 1_000_000),
    ]
    return _json_cases(COMPLETIONS, bodies)


def _chat_cases() -> list[tuple]:
    m = lambda **kw: {"messages": MESSAGES, "max_tokens": 2, **kw}  # noqa: E731
    bodies = [
        {},
        {"messages": None},
        {"messages": "hi"},
        {"messages": []},
        {"messages": [{"role": "wizard"}]},
        {"messages": [{"role": "user", "content": 5}]},
        {"messages": [{"role": "user", "content": "x\udc00"}]},
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        {"messages": [{"role": "user", "content": "x" * 2_000_000}]},
        m(response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": {}}}),
        m(tools=[{"type": "function", "function": {"name": "f"}}]),
        m(tool_choice="auto"),
        m(functions=[{}]),
        m(function_call="auto"),
        m(max_completion_tokens="x"),
        m(top_logprobs=3),
        m(logprobs="yes"),
        m(temperature=[1]),
        m(n=10**9),
        m(stream={"a": 1}),
        m(stop=["\ud800"]),
    ]
    return _json_cases(CHAT, bodies)


def _other_route_cases() -> list[tuple]:
    cases = [
        ("GET", path, None, None)
        for path in (
            "/health?api_key=leaked",
            "/health_generate",
            "/get_model_info",
            "/get_server_info",
            "/v1/models",
            "/metrics",
            "/nope",
            "/v1/nope",
            "/%00",
            "/..%2f..%2fetc%2fpasswd",
            "/" + "a" * 6000,
            "/generate",
            "/v1/completions",
        )
    ]
    cases += [
        ("POST", "/v1/models", b"{}", None),
        ("DELETE", "/flush_cache", None, None),
        ("PUT", "/generate", b"{}", None),
        ("POST", "/health", b"[[[", None),
        ("POST", "/get_model_info", b"[" * 10_000, None),
        ("PATCH", "/v1/chat/completions", None, None),
    ]
    cases += [
        ("POST", "/abort_request", body, None)
        for body in (
            b"[[[",
            b'{"rid": 5}',
            b'{"rid": ["a"]}',
            b'{"abort_all": "yes"}',
            b'{"rid": "' + b"r" * 100_000 + b'"}',
            b'{"rid": ' + b"[" * 900 + b"]" * 900 + b"}",
        )
    ]
    # The API key: missing, wrong, malformed.
    for headers in (
        {"Authorization": ""},
        {"Authorization": "Bearer wrong"},
        {"Authorization": API_KEY},
        {"Authorization": f"bearer {API_KEY}"},
        {"Authorization": "Bearer " + "k" * 10_000},
    ):
        cases.append(("POST", GENERATE, json.dumps(GREEDY).encode(), headers))
    # Content types the JSON parser must not care about, and ones it must refuse.
    cases.append(("POST", COMPLETIONS, b"prompt=x&max_tokens=2", {"Content-Type": "application/x-www-form-urlencoded"}))
    cases.append(("POST", COMPLETIONS, json.dumps({"prompt": "x", "max_tokens": 2}).encode("utf-16"), None))
    return cases


def _deep_value_cases() -> list[tuple]:
    """Nesting the JSON parser takes (900 levels) where a field expects something flat: the error
    message must not try to print it (a repr that deep overflows the stack)."""
    deep = "[" * 900 + "]" * 900
    bodies = [
        (GENERATE, '{"text": "x", "sampling_params": {"temperature": %s}}'),
        (GENERATE, '{"text": "x", "sampling_params": {"stop": %s}}'),
        (GENERATE, '{"text": %s}'),
        (GENERATE, '{"text": "x", "sampling_params": {"logit_bias": {"1": %s}}}'),
        (GENERATE, '{"text": "x", "sampling_params": %s}'),
        (GENERATE, '{"input_ids": %s}'),
        (COMPLETIONS, '{"prompt": %s}'),
        (COMPLETIONS, '{"prompt": "x", "logit_bias": {"1": %s}}'),
        (COMPLETIONS, '{"prompt": "x", "response_format": {"type": %s}}'),
        (CHAT, '{"messages": [{"role": "user", "content": %s}]}'),
        (CHAT, '{"messages": [{"role": "user", "content": "x"}], "tools": %s}'),
    ]
    return [("POST", route, (template % deep).encode(), None) for route, template in bodies]


BATTERY = (
    _raw_body_cases()
    + _generate_cases()
    + _completions_cases()
    + _chat_cases()
    + _deep_value_cases()
    + _other_route_cases()
)


def test_battery_has_no_5xx_no_slow_answer_no_dropped_connection(client):
    assert len(BATTERY) >= 100
    before = client.post(GENERATE, json=GREEDY).json()
    failures = []
    for method, path, body, headers in BATTERY:
        label = f"{method} {path[:40]} {(body or b'')[:60]!r} {headers and list(headers.values())[0][:20]}"
        start = time.monotonic()
        try:
            response = client.request(method, path, content=body, headers=headers)
        except httpx.HTTPError as err:
            failures.append(f"{label}: dropped ({type(err).__name__})")
            continue
        took = time.monotonic() - start
        if response.status_code >= 500 or took > SLOW_S:
            failures.append(f"{label}: {response.status_code} in {took:.1f} s {response.text[:200]}")
        elif response.status_code >= 400:
            try:
                assert_error_shape(response)
            except (AssertionError, ValueError, KeyError) as err:
                failures.append(f"{label}: {response.status_code} not in the error shape: {err}")
            if len(response.content) > 10_000:  # an error never echoes what the client sent back whole
                failures.append(f"{label}: a {len(response.content)}-byte error body")
    assert not failures, "\n".join(failures)
    after = client.post(GENERATE, json=GREEDY).json()
    assert after["text"] == before["text"] and after["output_ids"] == before["output_ids"]
    assert_idle_kv_accounting(client)


# ---- one test per class of input ---------------------------------------------------------------


@pytest.mark.parametrize("route", [GENERATE, COMPLETIONS, CHAT])
@pytest.mark.parametrize(
    "body",
    [b"[" * 100_000, b'{"extra": ' + b"[" * 5000 + b"]" * 5000 + b', "prompt": "x"}'],
    ids=["100k-open-brackets", "5k-levels-in-an-extra-field"],
)
def test_deeply_nested_json_is_a_400_naming_the_body(client, route, body):
    response = client.post(route, content=body)
    assert response.status_code == 400
    error = assert_error_shape(response)
    assert error["param"] == "body" and "deep" in error["message"]


# Text, so the body's own parser never sees the nesting: the schema's does.
DEEP_SCHEMA_TEXT = '{"type": "array", "items": ' * 5000 + '{"type": "integer"}' + "}" * 5000


@pytest.mark.parametrize(
    "route, body",
    [
        (GENERATE, {"text": "x", "sampling_params": {"max_new_tokens": 2, "json_schema": DEEP_SCHEMA_TEXT}}),
        (COMPLETIONS, {"prompt": "x", "max_tokens": 2, "json_schema": DEEP_SCHEMA_TEXT}),
    ],
    ids=["native", "completions"],
)
def test_a_json_schema_text_nested_too_deeply_is_a_400_naming_it(client, route, body):
    response = client.post(route, json=body)
    assert response.status_code == 400, response.text[:300]
    error = assert_error_shape(response)
    assert error["param"] == "json_schema" and "deep" in error["message"]


@pytest.mark.parametrize(
    "route, body, param, path",
    [
        (COMPLETIONS, b'{"prompt": "ab\\ud800cd", "max_tokens": 2}', "prompt", "prompt"),
        (COMPLETIONS, b'{"prompt": ["ok", "\\udfff"], "max_tokens": 2}', "prompt", "prompt.1"),
        (GENERATE, b'{"text": "\\ud83d"}', "text", "text"),
        (
            GENERATE,
            b'{"text": "a", "sampling_params": {"stop": ["\\ud800"]}}',
            "sampling_params",
            "sampling_params.stop.0",
        ),
        (CHAT, b'{"messages": [{"role": "user", "content": "x\\udc00"}]}', "messages", "messages.0.content"),
    ],
)
def test_a_lone_surrogate_is_a_400_naming_the_field(client, route, body, param, path):
    response = client.post(route, content=body)
    assert response.status_code == 400
    error = assert_error_shape(response)
    assert error["param"] == param and error["message"].startswith(path + " ")
    assert "TypeError" not in error["message"] and "TextEncodeInput" not in error["message"]


def test_a_valid_surrogate_pair_is_an_ordinary_character(client):
    body = b'{"text": "# \\ud83d\\ude00 smile", "sampling_params": {"max_new_tokens": 2}}'
    assert client.post(GENERATE, content=body).status_code == 200


def _health_latencies_while(server, send) -> tuple[list[float], httpx.Response]:
    """/health's latencies (s) polled while `send()` runs in a thread, and send's response."""
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("response", send()))
    thread.start()
    latencies = []
    with httpx.Client(base_url=server.base_url, timeout=30) as probe:
        while thread.is_alive():
            start = time.monotonic()
            assert probe.get("/health").status_code == 200
            latencies.append(time.monotonic() - start)
            time.sleep(0.02)
    thread.join()
    return latencies, result["response"]


def test_a_10_mb_prompt_neither_blocks_health_nor_takes_long(keyed_server, client):
    latencies, response = _health_latencies_while(
        keyed_server, lambda: client.post(GENERATE, json={"text": "def f(x):\n" * 1_000_000})
    )
    assert response.status_code == 400 and "context length" in assert_error_shape(response)["message"]
    assert response.elapsed.total_seconds() < 5 and max(latencies) < 1.0, (response.elapsed, latencies)


def test_a_long_prompt_is_tokenized_off_the_event_loop(keyed_server, client):
    # Under the character bound, so it is tokenized (about a second on the CPU): /health answers meanwhile.
    prompt = "def f(x):\n    return x + 1\n" * 12_000
    start = time.monotonic()
    latencies, response = _health_latencies_while(
        keyed_server, lambda: client.post(COMPLETIONS, json={"prompt": prompt})
    )
    took = time.monotonic() - start
    assert response.status_code == 400 and "context length" in assert_error_shape(response)["message"]
    assert len(latencies) >= 3 and max(latencies) < max(0.5, took / 3), (took, latencies)


def test_concurrent_prompts_tokenized_on_threads_all_answer(keyed_server):
    """Long prompts on every route at once: the tokenizer is shared by the worker threads."""
    code = "def f(x):\n    return x * 2\n" * 80  # 2160 characters: tokenized off the loop
    bodies = [
        (GENERATE, {"text": code, "sampling_params": {"max_new_tokens": 1}}),
        (COMPLETIONS, {"prompt": [code, code[::-1]], "max_tokens": 1}),
        (CHAT, {"messages": [{"role": "user", "content": code}], "max_tokens": 1}),
    ] * 4

    async def run():
        async with httpx.AsyncClient(base_url=keyed_server.base_url, headers=AUTH, timeout=60) as c:
            return await asyncio.gather(*(c.post(route, json=body) for route, body in bodies))

    assert [r.status_code for r in asyncio.run(run())] == [200] * len(bodies)


def test_a_body_over_the_payload_limit_is_a_413(client):
    response = client.post(GENERATE, content=b'{"text": "' + b"x" * (MAX_PAYLOAD + 1) + b'"}')
    assert response.status_code == 413
    error = assert_error_shape(response)
    assert error["param"] == "body" and "--max-payload-size" in error["message"]


def _raw_exchange(server: ServerProcess, head: bytes, body: bytes = b"", close_after_send: bool = False) -> bytes:
    """Sends `head` (request line and headers) and `body` on a plain socket; returns what the
    server answered within a few seconds (nothing when `close_after_send`)."""
    host, port = server.base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(head + body)
        if close_after_send:
            return b""
        answer = b""
        try:
            while b"\r\n\r\n" not in answer:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                answer += chunk
        except socket.timeout:
            pass
        return answer


def test_a_body_declared_too_large_with_expect_100_continue_is_refused_before_it_is_sent(keyed_server):
    head = (
        f"POST {GENERATE} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {API_KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {MAX_PAYLOAD * 1000}\r\n"
        f"Expect: 100-continue\r\n\r\n"
    ).encode()
    answer = _raw_exchange(keyed_server, head)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]  # not "100 Continue", then a body sent for nothing


def test_a_client_that_goes_away_while_sending_its_body_leaves_no_traceback(keyed_server, client):
    before = keyed_server.output().count("Traceback")
    head = (
        f"POST {GENERATE} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {API_KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    ).encode()
    _raw_exchange(keyed_server, head, b'{"text": "def f', close_after_send=True)
    deadline = time.monotonic() + 5
    while "went away while sending its body" not in keyed_server.output() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "went away while sending its body" in keyed_server.output()
    assert keyed_server.output().count("Traceback") == before
    assert client.post(GENERATE, json=GREEDY).status_code == 200


@pytest.mark.parametrize(
    "route, body, param",
    [
        (COMPLETIONS, {"prompt": "x", "temperature": "0.5"}, "temperature"),
        (COMPLETIONS, {"prompt": "x", "max_tokens": True}, "max_tokens"),
        (COMPLETIONS, {"prompt": "x", "n": "2"}, "n"),
        (COMPLETIONS, {"prompt": "x", "stream": "yes"}, "stream"),
        (CHAT, {"messages": MESSAGES, "ignore_eos": "no"}, "ignore_eos"),
        (CHAT, {"messages": MESSAGES, "seed": 1.0}, "seed"),
        (CHAT, {"messages": MESSAGES, "temperature": 1e308}, "temperature"),
        (GENERATE, {"text": "x", "return_logprob": "yes"}, "return_logprob"),
        (GENERATE, {"text": "x", "stream": 1}, "stream"),
        (GENERATE, {"text": "x", "top_logprobs_num": True}, "top_logprobs_num"),
        (GENERATE, {"text": "x", "sampling_params": {"temperature": 1e308}}, "temperature"),
        (GENERATE, {"text": "x", "sampling_params": {"ignore_eos": "no"}}, "ignore_eos"),
    ],
)
def test_wrong_types_and_absurd_values_are_a_400_naming_the_field(client, route, body, param):
    response = client.post(route, json=body)
    assert response.status_code == 400 and assert_error_shape(response)["param"] == param


def test_non_finite_numbers_are_refused_on_both_apis(client):
    for route, body in (
        (GENERATE, b'{"text": "x", "sampling_params": {"temperature": Infinity}}'),
        (COMPLETIONS, b'{"prompt": "x", "temperature": NaN}'),
        (CHAT, b'{"messages": [{"role": "user", "content": "x"}], "top_p": -Infinity}'),
    ):
        response = client.post(route, content=body)
        assert response.status_code == 400 and assert_error_shape(response)["param"] in ("temperature", "top_p")


@pytest.mark.parametrize(
    "route, body, param",
    [
        (CHAT, {"messages": MESSAGES, "functions": [{"name": "f", "parameters": {}}]}, "functions"),
        (CHAT, {"messages": MESSAGES, "function_call": "auto"}, "function_call"),
    ],
)
def test_fields_not_implemented_yet_are_a_400_not_ignored(client, route, body, param):
    response = client.post(route, json=body)
    assert response.status_code == 400
    error = assert_error_shape(response)
    assert error["param"] == param and "not supported" in error["message"]


def test_neutral_values_of_those_fields_and_unknown_vendor_fields_are_accepted(client):
    body = {
        "messages": MESSAGES,
        "max_tokens": 2,
        "response_format": {"type": "text"},
        "tools": [],
        "tool_choice": "none",
        "some_vendor_field": {"x": 1},
    }
    assert client.post(CHAT, json=body).status_code == 200


@pytest.mark.parametrize(
    "method, path, status",
    [("GET", "/no/such/route", 404), ("DELETE", GENERATE, 405), ("GET", COMPLETIONS, 405), ("POST", "/v1/models", 405)],
)
def test_404_and_405_have_the_error_shape(client, method, path, status):
    response = client.request(method, path)
    assert response.status_code == status and assert_error_shape(response)["code"] == status


def test_the_stop_list_is_bounded_in_count_and_length(client):
    args = client.get("/get_server_info").json()
    count, length = args["max_stop_strings"], args["max_stop_str_len"]
    for stop, what in ((["x"] * (count + 1), "--max-stop-strings"), (["x" * (length + 1)], "--max-stop-str-len")):
        for route, body in (
            (GENERATE, {"text": "x", "sampling_params": {"stop": stop}}),
            (COMPLETIONS, {"prompt": "x", "stop": stop}),
        ):
            response = client.post(route, json=body)
            assert response.status_code == 400
            error = assert_error_shape(response)
            assert error["param"] == "stop" and what in error["message"]
    longest = [f"{i:03d}" + "y" * (length - 3) for i in range(count)]
    assert (
        client.post(GENERATE, json={"text": "x", "sampling_params": {"stop": longest, "max_new_tokens": 2}}).status_code
        == 200
    )


def test_fan_out_past_the_limit_is_a_400_naming_it(client):
    limit = client.get("/get_server_info").json()["max_sequences_per_request"]
    cases = [
        (GENERATE, {"text": ["x"] * (limit + 1), "sampling_params": {"max_new_tokens": 1}}, "text"),
        (GENERATE, {"text": ["x", "y"], "sampling_params": {"n": limit // 2 + 1, "max_new_tokens": 1}}, "n"),
        (COMPLETIONS, {"prompt": ["x"] * (limit + 1), "max_tokens": 1}, "prompt"),
        (COMPLETIONS, {"prompt": ["x", "y"], "n": limit // 2 + 1, "max_tokens": 1, "stream": True}, "n"),
        (CHAT, {"messages": MESSAGES, "n": limit + 1, "max_tokens": 1}, "n"),
    ]
    for route, body, param in cases:
        if body.get("n", 1) > 64:
            continue  # n alone is bounded at 64 before the fan-out is counted
        response = client.post(route, json=body)
        assert response.status_code == 400, body
        error = assert_error_shape(response)
        assert error["param"] == param and "--max-sequences-per-request" in error["message"], error


def test_the_access_log_redacts_query_strings(keyed_server):
    httpx.get(f"{keyed_server.base_url}/health?api_key=sk-secret-in-url")
    time.sleep(0.3)
    log = keyed_server.output()
    assert "sk-secret-in-url" not in log
    assert "GET /health?<redacted>" in log


def test_health_routes_are_open_without_the_key_and_others_are_not(keyed_server):
    base = keyed_server.base_url
    assert httpx.get(f"{base}/health", timeout=30).status_code == 200
    assert httpx.get(f"{base}/health_generate", timeout=30).status_code == 200
    refused = httpx.get(f"{base}/get_server_info", timeout=30)
    assert refused.status_code == 401 and assert_error_shape(refused)["code"] == 401


def test_the_cpu_scheduler_sets_its_torch_threads_deliberately(keyed_server, monkeypatch):
    assert "torch intra-op threads:" in keyed_server.output()  # the server logs what it took
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert cpu_intra_op_threads() == 3
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(64)))
    assert cpu_intra_op_threads() == MAX_CPU_THREADS
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    assert cpu_intra_op_threads() == 1


@pytest.mark.parametrize(
    "route, body",
    [
        (GENERATE, {"text": "def main():", "sampling_params": {"max_new_tokens": 1500, "ignore_eos": True}}),
        (COMPLETIONS, {"prompt": "def main():", "max_tokens": 1500, "ignore_eos": True}),
    ],
    ids=["generate", "completions"],
)
def test_a_client_that_disconnects_aborts_its_request_behind_the_api_key(client, route, body):
    # 1500 tokens take the demo model many seconds; the abort must land well before that.
    with pytest.raises(httpx.ReadTimeout):
        client.post(route, json=body, timeout=1.0)
    deadline = time.monotonic() + 4.0
    while (state := client.get("/get_server_info").json()["internal_states"][0])["num_running_reqs"]:
        assert time.monotonic() < deadline, f"the request kept running after its client left: {state}"
        time.sleep(0.1)
    assert_idle_kv_accounting(client)
