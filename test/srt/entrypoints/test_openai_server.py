"""The OpenAI-compatible API and the native /generate end to end: a real server process on
loopback (the `server` fixture), driven with the official `openai` client and with httpx."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import time
from collections.abc import Mapping

import httpx
import openai
import pytest
from transformers import AutoTokenizer

from sglang.test.server_fixture import assert_server_kv_accounting, server_state

PROMPT = "The quick brown fox"
PROMPTS = [
    "The quick brown fox",
    "def add(a, b):",
    "Hello, world! How are you today?",
    "A radix tree shares the key-value cache",
    "for i in range(10):\n    print(i * i)\n" * 3,
]
KINDS = ["chat", "completion"]


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def model(client) -> str:
    return client.models.list().data[0].id


@pytest.fixture(scope="module")
def tokenizer(tiny_model_paths):
    return AutoTokenizer.from_pretrained(tiny_model_paths["llama"])


def create(client, model: str, kind: str, prompt: str, **kwargs):
    """One chat or text completion of `prompt` (the chat one sends it as a user message)."""
    if kind == "chat":
        return client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}], **kwargs)
    return client.completions.create(model=model, prompt=prompt, **kwargs)


def text_of(kind: str, choice) -> str:
    return choice.message.content if kind == "chat" else choice.text


def delta_of(kind: str, choice) -> str:
    return (choice.delta.content or "") if kind == "chat" else choice.text


def prompt_length(tokenizer, kind: str, prompt: str) -> int:
    if kind == "chat":
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
        )
        return len(ids["input_ids"] if isinstance(ids, Mapping) else ids)  # transformers 5: a BatchEncoding
    return len(tokenizer.encode(prompt))


def collect_stream(kind: str, chunks) -> dict:
    """The chunks of a streamed response, sorted out per choice index."""
    texts, finish_reasons, usages, firsts = {}, {}, [], {}
    for chunk in chunks:
        if chunk.usage is not None:
            usages.append(chunk)
        for choice in chunk.choices:
            firsts.setdefault(choice.index, choice)
            texts[choice.index] = texts.get(choice.index, "") + delta_of(kind, choice)
            if choice.finish_reason is not None:
                assert choice.index not in finish_reasons, "a choice finished twice"
                finish_reasons[choice.index] = choice.finish_reason
    return {"texts": texts, "finish_reasons": finish_reasons, "usages": usages, "firsts": firsts}


def wait_until_idle(server, timeout: float = 5.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        state = server_state(server)
        if state["num_running_reqs"] == 0 and state["num_queue_reqs"] == 0:
            return state
        assert time.monotonic() < deadline, f"the server still runs requests after {timeout} s: {state}"
        time.sleep(0.05)


def greedy(client, model, kind, prompt=PROMPT, max_tokens=24, **kwargs):
    return create(
        client, model, kind, prompt, max_tokens=max_tokens, temperature=0, extra_body={"ignore_eos": True}, **kwargs
    )


# ---- whole responses -------------------------------------------------------------------------


def test_models_lists_the_served_model_path(client, tiny_model_paths):
    assert [card.id for card in client.models.list().data] == [tiny_model_paths["llama"]]


@pytest.mark.parametrize("kind", KINDS)
def test_completion_stops_at_max_tokens_and_reports_usage(client, model, tokenizer, kind):
    response = greedy(client, model, kind, max_tokens=8)
    assert len(response.choices) == 1
    choice = response.choices[0]
    assert isinstance(text_of(kind, choice), str)
    assert choice.finish_reason == "length"
    if kind == "chat":
        assert choice.message.role == "assistant"
    usage = response.usage
    assert usage.completion_tokens == 8
    assert usage.prompt_tokens == prompt_length(tokenizer, kind, PROMPT)
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert response.model == model


# ---- streaming -------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_streamed_deltas_concatenate_to_the_greedy_text_and_usage_matches(client, model, kind):
    whole = greedy(client, model, kind)
    chunks = list(greedy(client, model, kind, stream=True, stream_options={"include_usage": True}))
    streamed = collect_stream(kind, chunks)
    assert streamed["texts"] == {0: text_of(kind, whole.choices[0])}
    assert streamed["finish_reasons"] == {0: "length"}
    if kind == "chat":
        assert streamed["firsts"][0].delta.role == "assistant"
    # OpenAI's contract: exactly one usage chunk, the last, with no choices.
    assert streamed["usages"] == [chunks[-1]] and chunks[-1].choices == []
    usage = chunks[-1].usage
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (
        whole.usage.prompt_tokens,
        whole.usage.completion_tokens,
        whole.usage.total_tokens,
    )


# ---- n > 1 -----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_n2_with_seed_gives_two_reproducible_choices_and_summed_usage(client, model, kind):
    params = {"max_tokens": 8, "temperature": 1.0, "n": 2, "seed": 1234, "extra_body": {"ignore_eos": True}}
    first = create(client, model, kind, PROMPT, **params)
    again = create(client, model, kind, PROMPT, **params)
    single = create(
        client, model, kind, PROMPT, max_tokens=8, temperature=1.0, seed=1234, extra_body={"ignore_eos": True}
    )
    assert [c.index for c in first.choices] == [0, 1]
    texts = [text_of(kind, c) for c in first.choices]
    assert texts == [text_of(kind, c) for c in again.choices]  # same seed, same samples
    assert texts[0] != texts[1]  # two samples, not one sample twice
    assert all(c.finish_reason == "length" for c in first.choices)
    assert first.usage.completion_tokens == 16
    assert first.usage.prompt_tokens == single.usage.prompt_tokens  # the prompt counts once
    assert first.usage.total_tokens == first.usage.prompt_tokens + 16


@pytest.mark.parametrize("kind", KINDS)
def test_streaming_n2_sends_chunks_for_both_choices(client, model, kind):
    params = {"max_tokens": 8, "temperature": 1.0, "n": 2, "seed": 99, "extra_body": {"ignore_eos": True}}
    whole = create(client, model, kind, PROMPT, **params)
    chunks = list(create(client, model, kind, PROMPT, stream=True, stream_options={"include_usage": True}, **params))
    streamed = collect_stream(kind, chunks)
    assert streamed["finish_reasons"] == {0: "length", 1: "length"}
    # Streamed sample j uses the same seed as whole sample j, so the texts agree.
    assert streamed["texts"] == {c.index: text_of(kind, c) for c in whole.choices}
    if kind == "chat":
        assert all(streamed["firsts"][i].delta.role == "assistant" for i in (0, 1))
    assert chunks[-1].usage.completion_tokens == 16


# ---- stop strings ----------------------------------------------------------------------------


def pick_stop(text: str) -> tuple[str, int]:
    """A 3-character piece from the middle of `text` that first occurs there."""
    for start in range(len(text) // 3, len(text) - 3):
        piece = text[start : start + 3]
        if text.find(piece) == start and "\ufffd" not in piece and piece.strip():
            return piece, start
    raise AssertionError(f"no usable stop string in {text!r}")


@pytest.mark.parametrize("kind", KINDS)
def test_stop_string_cuts_the_text_before_it_whole_and_streamed(client, model, kind):
    full = text_of(kind, greedy(client, model, kind, max_tokens=32).choices[0])
    stop, start = pick_stop(full)
    cut = full[:start]

    response = greedy(client, model, kind, max_tokens=32, stop=[stop])
    choice = response.choices[0]
    assert text_of(kind, choice) == cut
    assert choice.finish_reason == "stop"
    assert choice.matched_stop == stop  # SGLang's extension field
    assert response.usage.completion_tokens < 32

    sent = ""
    finish_reason = None
    for chunk in greedy(client, model, kind, max_tokens=32, stop=[stop], stream=True):
        for streamed_choice in chunk.choices:
            sent += delta_of(kind, streamed_choice)
            assert stop not in sent, f"the stream sent the stop string {stop!r}: {sent!r}"
            finish_reason = streamed_choice.finish_reason or finish_reason
    assert sent == cut
    assert finish_reason == "stop"


# ---- exactness against the engine -----------------------------------------------------------


def test_greedy_output_equals_the_engines(server, client, model, engine_pool):
    params = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}
    expected = engine_pool.get("llama").generate(PROMPT, params)

    completion = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=24, temperature=0, extra_body={"ignore_eos": True}
    )
    assert completion.choices[0].text == expected["text"]

    native = httpx.post(f"{server.base_url}/generate", json={"text": PROMPT, "sampling_params": params}, timeout=60)
    assert native.status_code == 200, native.text
    assert native.json()["output_ids"] == expected["output_ids"]
    assert native.json()["text"] == expected["text"]


# ---- logprobs --------------------------------------------------------------------------------


def test_chat_logprobs_list_three_alternatives_led_by_the_greedy_token(client, model):
    response = greedy(client, model, "chat", max_tokens=6, logprobs=True, top_logprobs=3)
    entries = response.choices[0].logprobs.content
    assert len(entries) == response.usage.completion_tokens == 6
    for entry in entries:
        assert len(entry.top_logprobs) == 3
        alternatives = [top.logprob for top in entry.top_logprobs]
        assert alternatives == sorted(alternatives, reverse=True)
        assert all(lp <= 0 for lp in alternatives)
        assert alternatives[0] >= entry.logprob - 1e-5
        # Greedy picks the most likely token, so it heads the list.
        assert entry.top_logprobs[0].token == entry.token
        assert math.isclose(alternatives[0], entry.logprob, abs_tol=1e-5)
        assert entry.bytes == entry.top_logprobs[0].bytes


def test_completion_logprobs_list_two_alternatives_with_offsets_in_the_text(client, model):
    response = greedy(client, model, "completion", prompt="Hello", max_tokens=6, logprobs=2)
    choice = response.choices[0]
    logprobs = choice.logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == 6
    for token, logprob, top in zip(logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs):
        assert len(top) == 2  # the greedy token is among the top two, so nothing is added
        assert max(top.values()) == pytest.approx(logprob, abs=1e-5)
        assert top[token] == pytest.approx(logprob, abs=1e-5)
    offsets = logprobs.text_offset
    assert offsets[0] == 0 and offsets == sorted(offsets)
    # text_offset indexes the returned text, whatever the token strings look like.
    assert all(offset <= len(choice.text) for offset in offsets), (offsets, choice.text, logprobs.tokens)


def test_completion_echo_with_logprobs_scores_the_prompt_then_the_completion(server, client, model, tokenizer):
    """lm-evaluation-harness's loglikelihood request: echo, logprobs 1, max_tokens 1 or 0."""
    num_prompt = len(tokenizer.encode(PROMPT))
    native = httpx.post(
        f"{server.base_url}/generate",
        timeout=60,
        json={
            "text": PROMPT,
            "sampling_params": {"max_new_tokens": 1, "temperature": 0, "ignore_eos": True},
            "return_logprob": True,
            "logprob_start_len": 0,
        },
    ).json()
    for max_tokens in (1, 0):
        choice = greedy(client, model, "completion", max_tokens=max_tokens, echo=True, logprobs=1).choices[0]
        logprobs = choice.logprobs
        assert choice.text.startswith(PROMPT) and choice.finish_reason == "length"
        assert len(choice.text) > len(PROMPT) if max_tokens else choice.text == PROMPT
        assert (
            len(logprobs.tokens)
            == len(logprobs.token_logprobs)
            == len(logprobs.top_logprobs)
            == len(logprobs.text_offset)
            == num_prompt + max_tokens
        )
        assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
        assert logprobs.token_logprobs[1:num_prompt] == pytest.approx(
            [logprob for logprob, _, _ in native["meta_info"]["input_token_logprobs"][1:]], abs=1e-5
        )
        assert logprobs.text_offset[0] == 0 and logprobs.text_offset == sorted(logprobs.text_offset)
        completion_start = (logprobs.text_offset + [len(choice.text)])[num_prompt]
        assert logprobs.text_offset[num_prompt - 1] < len(PROMPT) == completion_start
        assert "".join(logprobs.tokens) == choice.text
    plain = greedy(client, model, "completion", max_tokens=1, echo=True).choices[0]
    assert plain.logprobs is None and plain.text == PROMPT + native["text"]


def test_streamed_echo_leads_each_choice_with_its_prompt(client, model):
    chunks = list(
        greedy(
            client, model, "completion", prompt=[PROMPT, "Hello"], max_tokens=4, echo=True, logprobs=0, n=2, stream=True
        )
    )
    whole = greedy(client, model, "completion", prompt=[PROMPT, "Hello"], max_tokens=4, echo=True, logprobs=0, n=2)
    texts, tokens, firsts = {}, {}, {}
    for chunk in chunks:
        for choice in chunk.choices:
            firsts.setdefault(choice.index, choice.text)
            texts[choice.index] = texts.get(choice.index, "") + choice.text
            tokens[choice.index] = tokens.get(choice.index, []) + choice.logprobs.tokens
    assert [firsts[i].startswith(p) for i, p in enumerate([PROMPT, PROMPT, "Hello", "Hello"])] == [True] * 4
    assert [texts[i] for i in range(4)] == [c.text for c in whole.choices]
    assert [tokens[i] for i in range(4)] == [c.logprobs.tokens for c in whole.choices]


# ---- many clients, disconnects ---------------------------------------------------------------


async def _stream_one(aclient, model: str, i: int) -> tuple[int, int, str, int]:
    """Client i streams with max_tokens in 1..64; returns (asked, tokens seen, finish, usage)."""
    kind = KINDS[i % 2]
    max_tokens = i % 64 + 1
    prompt = PROMPTS[i % len(PROMPTS)] * (1 + i % 3)
    sampling = {"temperature": 0} if i % 3 else {"temperature": 0.8, "seed": i}
    logprobs = {"logprobs": True} if kind == "chat" else {"logprobs": 0}
    common = dict(
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
        **sampling,
        **logprobs,
    )
    if kind == "chat":
        stream = await aclient.chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompt}], **common
        )
    else:
        stream = await aclient.completions.create(model=model, prompt=prompt, **common)
    num_tokens, finish_reason, usage = 0, None, None
    async for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            if choice.logprobs is not None:  # one logprob per token: counts what the stream delivered
                num_tokens += len(choice.logprobs.content or []) if kind == "chat" else len(choice.logprobs.tokens)
            finish_reason = choice.finish_reason or finish_reason
    return max_tokens, num_tokens, finish_reason, usage.completion_tokens


def test_64_concurrent_streaming_clients_each_get_their_tokens_and_kv_is_freed(server, model):
    async def run_all():
        async with openai.AsyncOpenAI(
            base_url=server.base_url + "/v1", api_key="x", max_retries=0, timeout=120
        ) as aclient:
            return await asyncio.gather(*(_stream_one(aclient, model, i) for i in range(64)))

    results = asyncio.run(run_all())
    for i, (asked, num_tokens, finish_reason, usage_tokens) in enumerate(results):
        assert (num_tokens, usage_tokens, finish_reason) == (asked, asked, "length"), f"client {i}"
    wait_until_idle(server)
    assert_server_kv_accounting(server)


DISCONNECT_MAX_TOKENS = 400


@pytest.mark.parametrize(
    "route, body",
    [
        (
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": PROMPT}],
                "stream": True,
                "max_tokens": DISCONNECT_MAX_TOKENS,
                "ignore_eos": True,
            },
        ),
        (
            "/generate",
            {
                "text": PROMPT,
                "stream": True,
                "sampling_params": {"max_new_tokens": DISCONNECT_MAX_TOKENS, "ignore_eos": True},
            },
        ),
    ],
    ids=["openai", "native"],
)
def test_client_disconnect_mid_stream_aborts_the_request_and_frees_kv(server, route, body):
    generated_before = wait_until_idle(server)["num_generated_tokens"]
    with httpx.Client(timeout=30) as http, http.stream("POST", server.base_url + route, json=body) as response:
        assert response.status_code == 200
        events = 0
        for line in response.iter_lines():
            events += line.startswith("data: ")
            if events == 2:
                break  # leaving the block closes the connection mid-stream
    state = wait_until_idle(server, timeout=5)
    # The abort stopped generation: far fewer tokens than asked were produced.
    assert state["num_generated_tokens"] - generated_before < DISCONNECT_MAX_TOKENS // 2, state
    assert_server_kv_accounting(server)


# ---- the native stream -----------------------------------------------------------------------


def test_native_generate_stream_sends_sse_events_ending_with_done(server):
    body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}}
    whole = httpx.post(f"{server.base_url}/generate", json=body, timeout=60).json()
    with httpx.stream("POST", f"{server.base_url}/generate", json={**body, "stream": True}, timeout=60) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines), lines
    assert lines[-1] == "data: [DONE]"
    events = [json.loads(line[len("data: ") :]) for line in lines[:-1]]
    assert len(events) >= 2
    ids = [event["output_ids"] for event in events]
    # Each event carries the whole output so far.
    assert all(later[: len(earlier)] == earlier for earlier, later in itertools.pairwise(ids)), ids
    assert all(event["meta_info"]["finish_reason"] is None for event in events[:-1])
    last = events[-1]
    assert last["meta_info"]["finish_reason"]["type"] == "length"
    assert last["meta_info"]["completion_tokens"] == 12
    assert (last["output_ids"], last["text"]) == (whole["output_ids"], whole["text"])
