"""The OpenAI serving classes driven with a scripted TokenizerManager (a real tokenizer, results
shaped like the engine's): the JSON and SSE bytes they produce, error mapping, and that every
engine request is closed (so aborted) when the client goes away."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Optional

import pytest
from fastapi.responses import StreamingResponse

from sglang.srt.entrypoints import http_utils
from sglang.srt.entrypoints.openai import OpenAIServingChat, OpenAIServingCompletion
from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from sglang.srt.errors import InvalidRequest
from sglang.srt.managers.request_limits import RequestLimits
from sglang.srt.server_args import ServerArgs
from sglang.test.tiny_models import build_tokenizer

MODEL = "tiny-model"
MODEL_PATH = "/models/tiny-model"
TEXTS = ["Hello, world! How are you today?", "The quick brown fox jumps", "def add(a, b):"]
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
TOKENIZER = build_tokenizer()


class FakeTokenizerManager:
    """Answers generate_request like the real one: sample k (counted over all calls, prompt-major)
    writes TEXTS[k % len(TEXTS)]; streaming yields the result after every token."""

    def __init__(
        self,
        finish: Optional[dict] = None,
        fail: Optional[Exception] = None,
        fail_after: Optional[int] = None,
        hang_after: Optional[int] = None,
        texts=TEXTS,
        bos: Optional[int] = None,
    ):
        self.tokenizer = TOKENIZER
        self.texts = texts
        self.bos = bos  # a special token id the tokenizer puts before every text prompt, as Llama's adds BOS
        self.context_len = 1024
        self.server_args = SimpleNamespace(
            served_model_name=MODEL,
            model_path=MODEL_PATH,
            tool_call_parser=None,
            reasoning_parser=None,
            sampling_defaults="model",
        )
        self.limits = RequestLimits(ServerArgs(device="cpu"), self.context_len, max_running_requests=64, token_chars=16)
        self.finish, self.fail, self.fail_after, self.hang_after = finish, fail, fail_after, hang_after
        self.calls = []  # GenerateReqInput, in call order
        self.closed = []  # per call: whether its generator has finished or been closed
        self.num_samples = 0

    def generate_request(self, obj):
        self.calls.append(obj)
        self.closed.append(False)
        prompts = obj.text if obj.text is not None else obj.input_ids
        batch = isinstance(prompts, list) and bool(prompts) and isinstance(prompts[0], (str, list))
        prompts = prompts if batch else [prompts]
        n = obj.sampling_params.get("n", 1)
        samples = [(prompt, self._next_text()) for prompt in prompts for _ in range(n)]
        return self._run(len(self.calls) - 1, obj, samples, batch or n > 1)

    def _next_text(self) -> str:
        self.num_samples += 1
        return self.texts[(self.num_samples - 1) % len(self.texts)]

    async def _run(self, call: int, obj, samples, as_list: bool):
        try:
            if self.fail is not None and self.fail_after is None:
                raise self.fail
            if obj.stream:
                prompt, text = samples[0]
                ids = TOKENIZER.encode(text)
                for num_tokens in range(1, len(ids) + 1):
                    await self._maybe_stop(num_tokens)
                    yield self._result(obj, prompt, ids[:num_tokens], num_tokens == len(ids))
            else:
                results = [self._result(obj, prompt, TOKENIZER.encode(text), True) for prompt, text in samples]
                yield results if as_list else results[0]
        finally:
            self.closed[call] = True

    async def _maybe_stop(self, num_tokens: int) -> None:
        if self.hang_after is not None and num_tokens > self.hang_after:
            await asyncio.Event().wait()
        if self.fail_after is not None and num_tokens > self.fail_after:
            raise self.fail
        await asyncio.sleep(0)  # let other streams interleave

    def _result(self, obj, prompt, ids: list[int], finished: bool) -> dict:
        prompt_ids = (
            prompt if isinstance(prompt, list) else [self.bos] * (self.bos is not None) + TOKENIZER.encode(prompt)
        )
        prompt_tokens = len(prompt_ids)
        finish = (self.finish or {"type": "length", "length": len(ids)}) if finished else None
        meta = {
            "id": "rid",
            "finish_reason": finish,
            "prompt_tokens": prompt_tokens,
            "completion_tokens": len(ids),
            "cached_tokens": 2,
            "e2e_latency": 0.1,
        }
        if getattr(obj, "return_logprob", False):
            meta["output_token_logprobs"] = [(-0.25 * (i + 1), t, None) for i, t in enumerate(ids)]
            meta["output_top_logprobs"] = [
                [(-0.25 * (i + 1), t, None), (float("-inf"), (t + 1) % 300, None)][: obj.top_logprobs_num]
                for i, t in enumerate(ids)
            ]
            if getattr(obj, "logprob_start_len", -1) == 0:  # the prompt's tokens, scored -0.5 each
                meta["input_token_logprobs"] = [(None if i == 0 else -0.5, t, None) for i, t in enumerate(prompt_ids)]
                meta["input_top_logprobs"] = [None] + [
                    [(-0.5, t, None)][: obj.top_logprobs_num] for t in prompt_ids[1:]
                ]
        return {"text": TOKENIZER.decode(ids), "output_ids": list(ids), "meta_info": meta}


class FakeRawRequest:
    def __init__(self, disconnected: bool = False):
        self.disconnected = disconnected

    async def is_disconnected(self) -> bool:
        return self.disconnected


def parse_sse(body: bytes) -> list:
    events = []
    for block in body.decode().split("\n\n"):
        if block:
            assert block.startswith("data: "), block
            payload = block[len("data: ") :]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


async def _call(serving, request, raw_request):
    response = await serving.handle_request(request, raw_request)
    if isinstance(response, StreamingResponse):
        assert response.media_type == "text/event-stream"
        return response.status_code, parse_sse(b"".join([chunk async for chunk in response.body_iterator]))
    return response.status_code, json.loads(response.body) if response.body else None


def call(serving, request, raw_request=None):
    return asyncio.run(_call(serving, request, raw_request or FakeRawRequest()))


def completion(tm=None, **body):
    tm = tm or FakeTokenizerManager()
    return (tm, *call(OpenAIServingCompletion(tm), CompletionRequest(**{"model": MODEL, "prompt": "Hi", **body})))


def chat(tm=None, **body):
    tm = tm or FakeTokenizerManager()
    return (tm, *call(OpenAIServingChat(tm), ChatCompletionRequest(**{"model": MODEL, "messages": MESSAGES, **body})))


def chunks_of(events: list) -> list[dict]:
    assert events[-1] == "[DONE]" and "[DONE]" not in events[:-1]
    return events[:-1]


def streamed_texts(events: list, key: str) -> dict[int, str]:
    texts: dict[int, str] = {}
    for chunk in chunks_of(events):
        for choice in chunk["choices"]:
            piece = choice["text"] if key == "text" else choice["delta"].get("content") or ""
            texts[choice["index"]] = texts.get(choice["index"], "") + piece
    return texts


# ---- whole responses -------------------------------------------------------------------------


def test_completion_n2_has_two_choices_and_counts_the_prompt_once():
    tm, status, body = completion(n=2, seed=7)
    assert status == 200 and body["object"] == "text_completion" and body["model"] == MODEL
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert [c["text"] for c in body["choices"]] == TEXTS[:2]
    prompt_tokens = len(TOKENIZER.encode("Hi"))
    completion_tokens = sum(len(TOKENIZER.encode(t)) for t in TEXTS[:2])
    assert body["usage"]["prompt_tokens"] == prompt_tokens
    assert body["usage"]["completion_tokens"] == completion_tokens
    assert body["usage"]["total_tokens"] == prompt_tokens + completion_tokens
    params = tm.calls[0].sampling_params
    assert (params["n"], params["sampling_seed"], params["max_new_tokens"]) == (2, 7, 16)


def test_completion_of_a_prompt_list_is_prompt_major():
    tm, status, body = completion(prompt=["Hi", "Hello there"], n=2)
    assert status == 200 and len(tm.calls) == 1 and tm.calls[0].text == ["Hi", "Hello there"]
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    assert body["usage"]["prompt_tokens"] == len(TOKENIZER.encode("Hi")) + len(TOKENIZER.encode("Hello there"))
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 4


@pytest.mark.parametrize(
    "prompt, field, sent",
    [
        ([5, 6, 7], "input_ids", [5, 6, 7]),
        ([[5, 6], [7]], "input_ids", [[5, 6], [7]]),
        ("Hi", "text", "Hi"),
    ],
)
def test_completion_prompt_shapes_reach_the_engine(prompt, field, sent):
    tm, status, _ = completion(prompt=prompt)
    assert status == 200 and getattr(tm.calls[0], field) == sent


def test_completion_maps_sampling_fields_to_native_names():
    tm, status, _ = completion(
        max_tokens=5,
        temperature=0.5,
        top_p=0.9,
        top_k=3,
        min_p=0.1,
        stop=["\n"],
        stop_token_ids=[1],
        ignore_eos=True,
        min_tokens=2,
        no_stop_trim=True,
        skip_special_tokens=False,
    )
    assert status == 200
    assert tm.calls[0].sampling_params == {
        "max_new_tokens": 5,
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 3,
        "min_p": 0.1,
        "stop": ["\n"],
        "stop_token_ids": [1],
        "ignore_eos": True,
        "min_new_tokens": 2,
        "n": 1,
        "skip_special_tokens": False,
        "no_stop_trim": True,
    }


def test_chat_sends_the_template_token_ids_and_no_text():
    tm, status, body = chat()
    expected = TOKENIZER.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert status == 200 and tm.calls[0].text is None and tm.calls[0].input_ids == expected
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": TEXTS[0]}
    assert body["usage"]["prompt_tokens"] == len(expected)


def test_chat_without_max_tokens_asks_for_up_to_the_context():
    tm, _, _ = chat()
    assert "max_new_tokens" in tm.calls[0].sampling_params and tm.calls[0].sampling_params["max_new_tokens"] is None
    tm, _, _ = chat(max_tokens=9)
    assert tm.calls[0].sampling_params["max_new_tokens"] == 9


@pytest.mark.parametrize(
    "finish, reason, matched",
    [
        ({"type": "length", "length": 3}, "length", None),
        ({"type": "stop", "matched": 0}, "stop", 0),
        ({"type": "stop", "matched": "\n"}, "stop", "\n"),
    ],
)
def test_finish_reason_maps_to_openai(finish, reason, matched):
    _, _, body = completion(tm=FakeTokenizerManager(finish=finish))
    assert (body["choices"][0]["finish_reason"], body["choices"][0]["matched_stop"]) == (reason, matched)
    _, _, body = chat(tm=FakeTokenizerManager(finish=finish))
    assert body["choices"][0]["finish_reason"] == reason


# ---- streaming -------------------------------------------------------------------------------


def test_completion_stream_deltas_concatenate_to_the_full_text():
    tm, status, events = completion(stream=True)
    chunks = chunks_of(events)
    assert status == 200 and streamed_texts(events, "text") == {0: TEXTS[0]}
    assert len(chunks) > 3 and all(c["object"] == "text_completion" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert [c["choices"][0]["finish_reason"] for c in chunks].count("length") == 1
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert all(c["usage"] is None for c in chunks)
    assert tm.calls[0].stream and tm.closed == [True]


def test_include_usage_adds_a_last_chunk_without_choices():
    _, _, events = completion(stream=True, n=2, stream_options={"include_usage": True})
    chunks = chunks_of(events)
    usage_chunk = chunks[-1]
    assert usage_chunk["choices"] == [] and all(c["usage"] is None for c in chunks[:-1])
    assert usage_chunk["usage"]["prompt_tokens"] == len(TOKENIZER.encode("Hi"))
    assert usage_chunk["usage"]["completion_tokens"] == sum(len(TOKENIZER.encode(t)) for t in TEXTS[:2])


def test_chat_stream_starts_with_the_role_and_ends_with_done():
    _, status, events = chat(stream=True)
    chunks = chunks_of(events)
    assert status == 200 and all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all("role" not in c["choices"][0]["delta"] for c in chunks[1:])
    assert streamed_texts(events, "delta") == {0: TEXTS[0]}
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_chat_stream_n3_runs_three_requests_and_interleaves_their_choices():
    tm, status, events = chat(stream=True, n=3, seed=10, stream_options={"include_usage": True})
    assert status == 200 and len(tm.calls) == 3
    assert [c.sampling_params["sampling_seed"] for c in tm.calls] == [10, 11, 12]
    assert all(c.sampling_params["n"] == 1 and c.stream for c in tm.calls)
    assert streamed_texts(events, "delta") == {j: TEXTS[j] for j in range(3)}
    chunks = chunks_of(events)
    indexes = [c["choices"][0]["index"] for c in chunks if c["choices"]]
    assert indexes[:3] == [0, 1, 2]  # one role chunk per choice first
    assert indexes != sorted(indexes), "the choices should be interleaved as they arrive"
    finishes = [c["choices"][0]["index"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert sorted(finishes) == [0, 1, 2]
    assert chunks[-1]["usage"]["completion_tokens"] == sum(len(TOKENIZER.encode(t)) for t in TEXTS)
    assert tm.closed == [True, True, True]


def test_stream_n2_without_seed_leaves_the_seed_unset():
    tm, _, _ = completion(stream=True, n=2)
    assert all("sampling_seed" not in c.sampling_params for c in tm.calls)


def test_completion_stream_of_two_prompts_numbers_choices_prompt_major():
    tm, _, events = completion(stream=True, prompt=["Hi", "Hello there"], n=2)
    assert [c.text for c in tm.calls] == ["Hi", "Hi", "Hello there", "Hello there"]
    assert streamed_texts(events, "text") == {0: TEXTS[0], 1: TEXTS[1], 2: TEXTS[2], 3: TEXTS[0]}


def test_closing_the_stream_closes_every_engine_request():
    tm = FakeTokenizerManager(hang_after=2)

    async def read_a_little_then_leave():
        request = ChatCompletionRequest(model=MODEL, messages=MESSAGES, stream=True, n=3)
        response = await OpenAIServingChat(tm).handle_request(request, FakeRawRequest())
        iterator = response.body_iterator
        for _ in range(5):
            await iterator.__anext__()
        assert tm.closed == [False, False, False]
        await iterator.aclose()

    asyncio.run(read_a_little_then_leave())
    assert tm.closed == [True, True, True]


def test_disconnect_before_the_first_token_closes_the_requests(monkeypatch):
    monkeypatch.setattr(http_utils, "DISCONNECT_POLL_S", 0.01)
    tm = FakeTokenizerManager(hang_after=0)
    status, _ = call(
        OpenAIServingCompletion(tm), CompletionRequest(prompt="Hi", stream=True, n=2), FakeRawRequest(disconnected=True)
    )
    assert status == 499 and tm.closed == [True, True]


def test_disconnect_while_waiting_for_a_whole_response_closes_the_request(monkeypatch):
    monkeypatch.setattr(http_utils, "DISCONNECT_POLL_S", 0.01)

    class Hanging(FakeTokenizerManager):
        async def _run(self, call, obj, samples, as_list):
            try:
                await asyncio.Event().wait()
                yield None
            finally:
                self.closed[call] = True

    tm = Hanging()
    status, _ = call(OpenAIServingChat(tm), ChatCompletionRequest(messages=MESSAGES), FakeRawRequest(disconnected=True))
    assert status == 499 and tm.closed == [True]


# ---- logprobs --------------------------------------------------------------------------------


def test_completion_logprobs_format():
    tm, _, body = completion(logprobs=2)
    assert tm.calls[0].return_logprob and tm.calls[0].top_logprobs_num == 2
    logprobs = body["choices"][0]["logprobs"]
    ids = TOKENIZER.encode(TEXTS[0])
    assert logprobs["tokens"] == [TOKENIZER.decode([t]) for t in ids]
    assert "".join(logprobs["tokens"]) == TEXTS[0]
    assert logprobs["token_logprobs"] == [-0.25 * (i + 1) for i in range(len(ids))]
    assert logprobs["text_offset"][0] == 0
    assert logprobs["text_offset"][1:] == [sum(len(t) for t in logprobs["tokens"][:i]) for i in range(1, len(ids))]
    first_top = logprobs["top_logprobs"][0]
    assert first_top[logprobs["tokens"][0]] == -0.25 and len(first_top) == 2
    assert min(first_top.values()) == -9999.0  # -inf clamped, so the JSON stays valid


@pytest.mark.parametrize("stream", [False, True])
def test_text_offsets_point_into_the_text_when_a_character_spans_tokens(stream):
    text = "café au lait"
    _, _, body = completion(tm=FakeTokenizerManager(texts=[text]), logprobs=0, stream=stream)
    chunks = chunks_of(body) if stream else [body]
    tokens = [t for c in chunks for t in c["choices"][0]["logprobs"]["tokens"]]
    offsets = [o for c in chunks for o in c["choices"][0]["logprobs"]["text_offset"]]
    assert tokens[3:5] == ["bytes:\\xc3", "bytes:\\xa9"] and offsets[:6] == [0, 1, 2, 3, 3, 4]
    for token, offset in zip(tokens, offsets):
        assert token.startswith("bytes:") or text[offset:].startswith(token)


@pytest.mark.parametrize("stream", [False, True])
def test_echo_leads_with_the_prompt_and_its_logprobs(stream):
    prompt_ids = TOKENIZER.encode("def add(a, b):")
    tm, _, body = completion(prompt=prompt_ids, echo=True, logprobs=1, max_tokens=8, stream=stream)
    assert tm.calls[0].logprob_start_len == 0, "the prompt is scored from its first token"
    chunks = chunks_of(body) if stream else [body]
    text = "".join(c["choices"][0]["text"] for c in chunks)
    logprobs = {
        key: [x for c in chunks for x in c["choices"][0]["logprobs"][key]]
        for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset")
    }
    assert chunks[0]["choices"][0]["text"].startswith("def add(a, b):")
    assert text == "def add(a, b):" + TEXTS[0] == "".join(logprobs["tokens"])
    num_prompt = len(prompt_ids)
    assert logprobs["token_logprobs"][:num_prompt] == [None] + [-0.5] * (num_prompt - 1)
    assert logprobs["token_logprobs"][num_prompt:] == [-0.25 * (i + 1) for i in range(len(TOKENIZER.encode(TEXTS[0])))]
    assert logprobs["top_logprobs"][0] is None and logprobs["top_logprobs"][1] == {logprobs["tokens"][1]: -0.5}
    offsets = logprobs["text_offset"]
    assert offsets == [sum(len(t) for t in logprobs["tokens"][:i]) for i in range(len(offsets))]


@pytest.mark.parametrize("stream", [False, True])
def test_echo_offsets_index_the_text_when_the_tokenizer_adds_a_bos(stream):
    """A text prompt echoed as given: the BOS the tokenizer put before it is listed with the prompt's
    tokens but is not in the text, so it takes no characters and every later offset still points
    at its token in the text."""
    bos = TOKENIZER.convert_tokens_to_ids("<|endoftext|>")
    prompt = "def add(a, b):"
    _, _, body = completion(
        tm=FakeTokenizerManager(bos=bos), prompt=prompt, echo=True, logprobs=0, max_tokens=8, stream=stream
    )
    chunks = chunks_of(body) if stream else [body]
    text = "".join(c["choices"][0]["text"] for c in chunks)
    tokens = [t for c in chunks for t in c["choices"][0]["logprobs"]["tokens"]]
    offsets = [o for c in chunks for o in c["choices"][0]["logprobs"]["text_offset"]]
    assert text == prompt + TEXTS[0] and tokens[0] == "<|endoftext|>" and offsets[:2] == [0, 0]
    num_prompt = 1 + len(TOKENIZER.encode(prompt))
    assert offsets[num_prompt] == len(prompt), "the completion starts right after the echoed prompt"
    for token, offset in zip(tokens[1:], offsets[1:]):
        assert text[offset:].startswith(token), (token, offset)
    # Given as token ids, the prompt is echoed decoded, BOS text included, and the BOS takes its characters.
    ids = [bos] + TOKENIZER.encode(prompt)
    _, _, body = completion(tm=FakeTokenizerManager(bos=bos), prompt=ids, echo=True, logprobs=0, max_tokens=8)
    logprobs = body["choices"][0]["logprobs"]
    assert body["choices"][0]["text"].startswith("<|endoftext|>" + prompt)
    assert logprobs["text_offset"][1] == len("<|endoftext|>")


def test_echo_without_logprobs_asks_for_none_and_n_choices_each_lead_with_their_prompt():
    tm, _, body = completion(prompt=["Hi", "Yo"], echo=True, n=2, max_tokens=8)
    assert all(call.logprob_start_len == -1 and not call.return_logprob for call in tm.calls)
    texts = [choice["text"] for choice in body["choices"]]
    assert [t[:2] for t in texts] == ["Hi", "Hi", "Yo", "Yo"] and texts[0][2:] == TEXTS[0]
    assert all(choice["logprobs"] is None for choice in body["choices"])


def test_completion_logprobs_zero_still_lists_the_sampled_token():
    tm, _, body = completion(logprobs=0)
    assert tm.calls[0].top_logprobs_num == 0
    logprobs = body["choices"][0]["logprobs"]
    assert logprobs["top_logprobs"][0] == {logprobs["tokens"][0]: -0.25}


def test_streamed_completion_logprobs_equal_the_whole_ones():
    _, _, whole = completion(logprobs=1)
    _, _, events = completion(logprobs=1, stream=True)
    merged = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for chunk in chunks_of(events):
        for key in merged:
            merged[key] += chunk["choices"][0]["logprobs"][key]
    assert merged == whole["choices"][0]["logprobs"]


def test_chat_logprobs_format():
    tm, _, body = chat(logprobs=True, top_logprobs=2)
    assert tm.calls[0].return_logprob and tm.calls[0].top_logprobs_num == 2
    content = body["choices"][0]["logprobs"]["content"]
    ids = TOKENIZER.encode(TEXTS[0])
    assert [entry["token"] for entry in content] == [TOKENIZER.decode([t]) for t in ids]
    assert all(bytes(entry["bytes"]).decode() == entry["token"] for entry in content)
    assert content[0]["logprob"] == -0.25
    assert [len(entry["top_logprobs"]) for entry in content] == [2] * len(ids)
    assert set(content[0]["top_logprobs"][0]) == {"token", "logprob", "bytes"}


def test_chat_logprobs_without_top_logprobs_asks_for_none():
    tm, _, body = chat(logprobs=True)
    assert tm.calls[0].top_logprobs_num == 0
    assert body["choices"][0]["logprobs"]["content"][0]["top_logprobs"] == []
    _, _, body = chat()
    assert body["choices"][0]["logprobs"] is None


def test_streamed_chat_logprobs_cover_every_token_once():
    _, _, events = chat(logprobs=True, stream=True)
    entries = [e for c in chunks_of(events) for e in (c["choices"][0]["logprobs"] or {}).get("content") or []]
    assert [e["token"] for e in entries] == [TOKENIZER.decode([t]) for t in TOKENIZER.encode(TEXTS[0])]


def test_a_token_that_is_part_of_a_character_shows_its_bytes():
    serving = OpenAIServingChat(FakeTokenizerManager())
    ids = TOKENIZER.encode("é")
    assert len(ids) == 2, "the tiny tokenizer splits é into its two bytes"
    strings = [serving.token_string(t) for t in ids]
    assert [s[0] for s in strings] == ["bytes:\\xc3", "bytes:\\xa9"]
    assert bytes(strings[0][1] + strings[1][1]).decode() == "é"


# ---- errors ----------------------------------------------------------------------------------


def test_unknown_model_is_a_400_naming_model():
    tm, status, body = completion(model="gpt-4")
    assert status == 400 and body["error"]["param"] == "model" and "gpt-4" in body["error"]["message"]
    assert tm.calls == []
    _, status, body = chat(model="gpt-4", stream=True)
    assert status == 400 and body["error"]["param"] == "model"


def test_model_path_and_missing_model_are_accepted():
    assert completion(model=MODEL_PATH)[1] == 200
    assert completion(model=None)[1] == 200


@pytest.mark.parametrize(
    "native, completion_name, chat_name",
    [
        ("max_new_tokens", "max_tokens", "max_completion_tokens"),
        ("sampling_seed", "seed", "seed"),
        ("text", "prompt", "messages"),
        ("input_ids", "prompt", "messages"),
        ("min_new_tokens", "min_tokens", "min_tokens"),
        ("top_logprobs_num", "logprobs", "top_logprobs"),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_engine_errors_name_the_openai_field(native, completion_name, chat_name, stream):
    fail = InvalidRequest(f"Sampling parameter '{native}' is out of range.", native)
    _, status, body = completion(tm=FakeTokenizerManager(fail=fail), stream=stream)
    assert status == 400 and body["error"]["param"] == completion_name
    assert f"'{completion_name}'" in body["error"]["message"]
    _, status, body = chat(tm=FakeTokenizerManager(fail=fail), stream=stream, max_completion_tokens=4)
    assert status == 400 and body["error"]["param"] == chat_name


def test_chat_error_uses_max_tokens_when_the_client_sent_that():
    fail = InvalidRequest("too long", "max_new_tokens")
    _, status, body = chat(tm=FakeTokenizerManager(fail=fail), max_tokens=4000)
    assert status == 400 and body["error"]["param"] == "max_tokens"


def test_overload_keeps_its_status():
    fail = InvalidRequest("the server is overloaded", None, status_code=503)
    _, status, body = completion(tm=FakeTokenizerManager(fail=fail))
    assert status == 503 and body["error"]["code"] == 503


def test_abort_becomes_an_error_status():
    abort = {"type": "abort", "message": "aborted by the server", "status_code": 500}
    _, status, body = completion(tm=FakeTokenizerManager(finish=abort), n=2)
    assert status == 500 and body["error"]["message"] == "aborted by the server"
    _, status, body = chat(tm=FakeTokenizerManager(finish=abort))
    assert status == 500


def test_abort_mid_stream_becomes_an_error_event_then_done():
    abort = {"type": "abort", "message": "evicted", "status_code": 503}
    tm, status, events = completion(tm=FakeTokenizerManager(finish=abort), stream=True, n=2)
    chunks = chunks_of(events)
    assert status == 200 and chunks[-1]["error"]["message"] == "evicted" and chunks[-1]["error"]["code"] == 503
    assert tm.closed == [True, True]


def test_engine_failure_mid_stream_becomes_an_error_event_then_done():
    tm = FakeTokenizerManager(fail=RuntimeError("the scheduler process died"), fail_after=2)
    _, status, events = chat(tm=tm, stream=True, n=2)
    chunks = chunks_of(events)
    assert status == 200 and "scheduler process died" in chunks[-1]["error"]["message"]
    assert chunks[-1]["error"]["code"] == 500 and tm.closed == [True, True]


def test_engine_failure_before_the_answer_is_a_500_error_body():
    _, status, body = completion(tm=FakeTokenizerManager(fail=RuntimeError("the scheduler process died")))
    assert status == 500 and "scheduler process died" in body["error"]["message"]


@pytest.mark.parametrize(
    "body, param",
    [
        ({"suffix": "x"}, "suffix"),
        ({"best_of": 3}, "best_of"),
        ({"prompt": []}, "prompt"),
    ],
)
def test_unsupported_completion_options_are_a_400(body, param):
    tm, status, response = completion(**body)
    assert status == 400 and response["error"]["param"] == param and tm.calls == []


def test_chat_without_a_chat_template_is_a_400():
    tm = FakeTokenizerManager()
    tm.tokenizer = build_tokenizer()
    tm.tokenizer.chat_template = None
    _, status, body = chat(tm=tm)
    assert status == 400 and body["error"]["param"] == "messages" and "chat template" in body["error"]["message"]


def test_a_template_that_raises_is_a_400_naming_messages():
    tm = FakeTokenizerManager()
    tm.tokenizer = build_tokenizer()
    tm.tokenizer.chat_template = "{{ raise_exception('roles must alternate') }}"
    _, status, body = chat(tm=tm)
    assert status == 400 and body["error"]["param"] == "messages" and "roles must alternate" in body["error"]["message"]


def test_server_sent_events_carry_json_a_strict_parser_reads():
    """One event per chunk: `data: <json>` and a blank line; text stays unescaped UTF-8, ids and
    numbers round-trip, integer keys become strings, and non-finite floats (which strict JSON
    parsers reject as NaN / Infinity) become null."""
    chunk = {
        "text": 'naïve 名前 \n"quoted"',
        "output_ids": list(range(64)),
        "meta_info": {
            "e2e_latency": 0.125,
            "finish_reason": None,
            "logprob": float("-inf"),
            "ratio": float("nan"),
            "by_k": {3: 0.5},
        },
    }
    event = http_utils.sse(chunk)
    assert event.startswith(b"data: ") and event.endswith(b"\n\n") and event.count(b"\n\n") == 1
    assert "名前".encode() in event  # not \u-escaped

    def strict(token):
        raise ValueError(f"not JSON: {token}")

    parsed = json.loads(event[len(b"data: ") : -2], parse_constant=strict)
    assert parsed["text"] == chunk["text"] and parsed["output_ids"] == chunk["output_ids"]
    assert parsed["meta_info"] == {
        "e2e_latency": 0.125,
        "finish_reason": None,
        "logprob": None,
        "ratio": None,
        "by_k": {"3": 0.5},
    }
    assert http_utils.sse("[DONE]") == b"data: [DONE]\n\n"


def test_a_chat_with_tools_read_by_a_parser_keeps_special_tokens_in_the_text():
    """As upstream: a model's call marker may be a special token (Llama's <|python_tag|>), so with
    tools and a parser the text keeps special tokens unless the request says otherwise."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]

    def sent(parser, **body):
        tm = FakeTokenizerManager()
        tm.server_args.tool_call_parser = parser
        _, status, _ = chat(tm, **body)
        assert status == 200
        return tm.calls[0].sampling_params.get("skip_special_tokens")

    assert sent("llama3", tools=tools) is False
    assert sent("llama3", tools=tools, skip_special_tokens=True) is True
    assert sent("llama3", tools=tools, tool_choice="none") is None
    assert sent(None, tools=tools) is None and sent("llama3") is None


# ---- tools -----------------------------------------------------------------------------------

# Writes each tool's name and each earlier call's "city" argument (read as a mapping), so the
# prompt shows what the template was given.
TOOLS_TEMPLATE = (
    "{% for tool in tools or [] %}<|tool|>{{ tool.function.name }}\n{% endfor %}"
    "{% for message in messages %}<|{{ message.role }}|>{{ message.content }}"
    "{% for call in message.tool_calls or [] %}city={{ call.function.arguments.city }}{% endfor %}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"$ref": "#/$defs/City"}},
            "$defs": {"City": {"type": "string"}},
        },
    },
}
ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
    },
}


def tools_manager(parser: Optional[str] = None, texts=TEXTS) -> FakeTokenizerManager:
    tm = FakeTokenizerManager(texts=texts)
    tm.tokenizer = build_tokenizer()
    tm.tokenizer.chat_template = TOOLS_TEMPLATE
    tm.server_args.tool_call_parser = parser
    return tm


def prompt_text(tm: FakeTokenizerManager) -> str:
    return tm.tokenizer.decode(tm.calls[0].input_ids)


def history_with_call(arguments: str) -> list[dict]:
    return [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]


def test_history_call_arguments_reach_the_template_as_a_mapping():
    tm, status, _ = chat(tools_manager(), messages=history_with_call('{"city": "Oslo"}'), tools=[WEATHER_TOOL])
    assert status == 200 and "city=Oslo" in prompt_text(tm)


@pytest.mark.parametrize(
    "arguments", ['{"city": "Oslo"', '["Oslo"]', "Oslo", "null"], ids=["cut_short", "array", "not_json", "null"]
)
def test_history_call_arguments_that_are_not_a_json_object_are_a_400_naming_messages(arguments):
    """As upstream: an assistant's earlier call must carry the JSON text of an object."""
    tm, status, body = chat(tools_manager(), messages=history_with_call(arguments), tools=[WEATHER_TOOL])
    assert status == 400 and body["error"]["param"] == "messages" and tm.calls == []
    assert body["error"]["message"].startswith("messages[1].tool_calls[0].function.arguments must be")


@pytest.mark.parametrize(
    "arguments", ["[" * 5000, '{"a": ' + "[" * 600 + "]" * 600 + "}"], ids=["past_the_json_parser", "past_the_template"]
)
def test_history_call_arguments_nested_too_deeply_are_a_400_naming_messages(arguments):
    tm, status, body = chat(tools_manager(), messages=history_with_call(arguments), tools=[WEATHER_TOOL])
    assert status == 400 and body["error"]["param"] == "messages" and tm.calls == [], body
    assert "nest too deeply" in body["error"]["message"] or "nests too deeply" in body["error"]["message"]


@pytest.mark.parametrize(
    "choice, shown",
    [
        ({"type": "function", "function": {"name": "add"}}, ["add"]),
        ("required", ["get_weather", "add"]),
        ("auto", ["get_weather", "add"]),
        ("none", []),
    ],
)
def test_the_template_sees_only_the_tools_the_model_may_call(choice, shown):
    """As upstream: a named tool_choice shows the template that tool alone."""
    tm, status, _ = chat(tools_manager("hermes"), tools=[WEATHER_TOOL, ADD_TOOL], tool_choice=choice)
    assert status == 200
    assert [line[len("<|tool|>") :] for line in prompt_text(tm).splitlines() if line.startswith("<|tool|>")] == shown


def _deep_parameters(levels: int) -> dict:
    parameters = node = {}
    for _ in range(levels):
        node["properties"] = {"a": {}}
        node = node["properties"]["a"]
    return parameters


@pytest.mark.parametrize(
    "parameters",
    [
        {"type": "object", "properties": {"a": {"type": "strin"}}},
        {"type": "object", "required": "a"},
        {"type": "object", "properties": {"a": {"minimum": "1"}}},
        _deep_parameters(900),
    ],
    ids=["unknown_type", "required_not_a_list", "minimum_not_a_number", "nested_too_deeply"],
)
@pytest.mark.parametrize("choice", ["auto", "none", "required"])
def test_tool_parameters_that_are_not_a_json_schema_are_a_400_naming_tools(parameters, choice):
    """As upstream: every tool's parameters are checked against JSON Schema Draft 2020-12,
    whatever tool_choice is (xgrammar, which compiles forced choices, accepts some of these)."""
    broken = {"type": "function", "function": {"name": "f", "parameters": parameters}}
    tm, status, body = chat(tools_manager("hermes"), tools=[ADD_TOOL, broken], tool_choice=choice)
    assert status == 400 and body["error"]["param"] == "tools" and tm.calls == []
    assert body["error"]["message"].startswith("tools[1].function.parameters ")


@pytest.mark.parametrize(
    "text",
    [
        'I will check. <tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>',
        'I will check.\n\n<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>',
    ],
)
def test_streamed_content_before_a_call_adds_up_to_the_whole_content(text):
    _, status, whole = chat(tools_manager("hermes", [text]), tools=[ADD_TOOL])
    assert status == 200 and whole["choices"][0]["message"]["content"] == "I will check."
    _, status, events = chat(tools_manager("hermes", [text]), tools=[ADD_TOOL], stream=True)
    assert status == 200 and streamed_texts(events, "content") == {0: "I will check."}
