"""The OpenAI request models: ranges reported by field name, lenient extras, prompt shapes,
chat content parts, and the shape of serialized stream deltas."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from sglang.srt.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    ChatCompletionStreamChoice,
    CompletionRequest,
    DeltaMessage,
)

MESSAGES = [{"role": "user", "content": "hi"}]


def error_field(model, **body) -> str:
    """The last element of the location of the (single) validation error, as the HTTP
    server reports it in the 400 body."""
    with pytest.raises(ValidationError) as info:
        model(**body)
    errors = info.value.errors()
    assert len(errors) == 1, errors
    return errors[0]["loc"][-1]


@pytest.mark.parametrize(
    "field, value",
    [
        ("temperature", -0.1),
        ("temperature", 2.5),
        ("top_p", 0),
        ("top_p", 1.5),
        ("n", 0),
        ("n", 65),
        ("max_tokens", -1),
        ("logprobs", 21),
        ("logprobs", -1),
        ("seed", -1),
        ("presence_penalty", 3),
        ("frequency_penalty", -3),
        ("min_p", 2),
        ("min_tokens", -1),
        ("best_of", 0),
        ("repetition_penalty", 0),
        ("repetition_penalty", 2.5),
    ],
)
def test_completion_range_errors_name_the_field(field, value):
    assert error_field(CompletionRequest, prompt="x", **{field: value}) == field


@pytest.mark.parametrize(
    "field, value",
    [
        ("temperature", 3),
        ("top_p", -1),
        ("n", 100),
        ("max_tokens", -5),
        ("max_completion_tokens", -1),
        ("top_logprobs", 21),
    ],
)
def test_chat_range_errors_name_the_field(field, value):
    body = {"messages": MESSAGES, "logprobs": True, field: value}
    assert error_field(ChatCompletionRequest, **body) == field


def test_boundary_values_are_accepted():
    request = CompletionRequest(prompt="x", temperature=0, top_p=1, n=64, max_tokens=0, logprobs=20)
    assert (request.temperature, request.n, request.logprobs) == (0, 64, 20)
    chat = ChatCompletionRequest(messages=MESSAGES, temperature=2, logprobs=True, top_logprobs=0)
    assert chat.top_logprobs == 0


def test_top_logprobs_needs_logprobs():
    assert error_field(ChatCompletionRequest, messages=MESSAGES, top_logprobs=3) == "top_logprobs"
    assert ChatCompletionRequest(messages=MESSAGES, logprobs=True, top_logprobs=3).top_logprobs == 3


def test_unknown_fields_are_ignored():
    request = CompletionRequest(prompt="x", some_future_field=1, extra_body={"a": 1})
    assert not hasattr(request, "some_future_field")
    chat = ChatCompletionRequest(
        messages=[{"role": "user", "content": "hi", "tool_calls": []}], tools=[], parallel_tool_calls=False
    )
    assert chat.messages[0].content == "hi"


def test_defaults_follow_openai():
    request = CompletionRequest(prompt="x")
    assert (request.max_tokens, request.n, request.stream, request.echo) == (16, 1, False, False)
    chat = ChatCompletionRequest(messages=MESSAGES)
    assert chat.max_new_tokens is None and chat.logprobs is False and not chat.include_usage


@pytest.mark.parametrize("prompt", ["text", ["a", "b"], [1, 2, 3], [[1, 2], [3]]])
def test_every_prompt_shape_is_kept_as_given(prompt):
    assert CompletionRequest(prompt=prompt).prompt == prompt


@pytest.mark.parametrize("prompt", [5, None, [1, "a"], [[1], "a"], [True, 2], [[1.5]], {"a": 1}])
def test_bad_prompt_shapes_name_prompt(prompt):
    assert error_field(CompletionRequest, prompt=prompt) == "prompt"


def test_missing_prompt_names_prompt():
    assert error_field(CompletionRequest) == "prompt"


@pytest.mark.parametrize("stop", ["\n", ["a", "b", "c", "d", "e"], None])
def test_stop_accepts_a_string_or_any_number_of_strings(stop):
    assert CompletionRequest(prompt="x", stop=stop).stop == stop


@pytest.mark.parametrize("stop", [5, ["a", 1]])
def test_bad_stop_names_stop(stop):
    assert error_field(CompletionRequest, prompt="x", stop=stop) == "stop"


def test_text_content_parts_are_joined():
    parts = [{"type": "text", "text": "first"}, {"type": "text", "text": "second"}]
    chat = ChatCompletionRequest(messages=[{"role": "user", "content": parts}])
    assert chat.messages[0].content == "first\nsecond"
    assert chat.messages[0].to_template() == {"role": "user", "content": "first\nsecond"}


def test_image_parts_are_refused_naming_content():
    parts = [{"type": "image_url", "image_url": {"url": "http://x"}}]
    assert error_field(ChatCompletionRequest, messages=[{"role": "user", "content": parts}]) == "content"


def test_messages_must_be_a_nonempty_list_of_known_roles():
    assert error_field(ChatCompletionRequest, messages=[]) == "messages"
    assert error_field(ChatCompletionRequest, messages=[{"role": "robot", "content": "x"}]) == "role"


def test_null_assistant_content_renders_as_empty_string():
    chat = ChatCompletionRequest(messages=[*MESSAGES, {"role": "assistant", "content": None}])
    assert chat.messages[1].to_template()["content"] == ""


def test_max_completion_tokens_wins_over_max_tokens():
    chat = ChatCompletionRequest(messages=MESSAGES, max_tokens=5, max_completion_tokens=7)
    assert chat.max_new_tokens == 7
    assert ChatCompletionRequest(messages=MESSAGES, max_tokens=5).max_new_tokens == 5


def test_stream_options_include_usage():
    assert CompletionRequest(prompt="x", stream=True, stream_options={"include_usage": True}).include_usage
    assert not CompletionRequest(prompt="x", stream=True, stream_options={}).include_usage


def test_nulls_mean_defaults():
    request = CompletionRequest(prompt="x", n=None, temperature=None, stream=None, max_tokens=None)
    assert request.num_choices == 1 and not request.stream


def test_stream_delta_carries_only_what_changed():
    role = ChatCompletionStreamChoice(index=0, delta=DeltaMessage(role="assistant", content=""))
    assert role.model_dump()["delta"] == {"role": "assistant", "content": ""}
    content = ChatCompletionStreamChoice(index=1, delta=DeltaMessage(content="hi"))
    assert content.model_dump()["delta"] == {"content": "hi"}
    assert ChatCompletionStreamChoice(index=0, delta=DeltaMessage()).model_dump()["delta"] == {}
