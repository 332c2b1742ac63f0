"""Tool-call parsing: the llama3, qwen25 / hermes and mistral formats with content around them, unknown
functions dropped, an array cut short by max_tokens keeps its complete calls, the forced-choice
schema, and streaming: content goes out until a call may start, and the streamed deltas add up to
the calls and content that parsing the whole text gives."""

from __future__ import annotations

import json

import jsonschema
import pytest

from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
from sglang.srt.entrypoints.openai.tool_calls import ToolCallStream, forced_calls_schema, parse_tool_calls

NAMES = {"add", "get_weather"}
ADD = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
TOOLS = [
    {"type": "function", "function": {"name": "add", "parameters": ADD}},
    {"type": "function", "function": {"name": "get_weather"}},
]


def calls_of(calls):
    return [(c.function.name, json.loads(c.function.arguments)) for c in calls]


def test_llama3_json_calls_with_and_without_the_python_tag():
    text = '{"name": "add", "parameters": {"a": 1}}; {"name": "get_weather", "parameters": {"city": "Rome"}}'
    content, calls = parse_tool_calls(text, "auto", "llama3", NAMES)
    assert content is None and calls_of(calls) == [("add", {"a": 1}), ("get_weather", {"city": "Rome"})]
    content, calls = parse_tool_calls(
        'Let me add.<|python_tag|>{"name": "add", "arguments": {"a": 2}}', "auto", "llama3", NAMES
    )
    assert content == "Let me add." and calls_of(calls) == [("add", {"a": 2})]
    assert parse_tool_calls("no calls here", "auto", "llama3", NAMES) == ("no calls here", [])


def test_hermes_blocks_keep_the_content_before_them_and_drop_unknown_functions():
    text = (
        'I will check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>'
    )
    for parser in ("qwen25", "qwen", "hermes"):
        content, calls = parse_tool_calls(text, "auto", parser, NAMES)
        assert content == "I will check." and calls_of(calls) == [("get_weather", {"city": "Oslo"})]
    # Every call of an unknown function: the text stays content.
    text = '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>'
    assert parse_tool_calls(text, "auto", "hermes", NAMES) == (text, [])


def test_mistral_calls_as_a_json_list_or_as_name_and_args():
    text = 'Checking. [TOOL_CALLS] [{"name": "add", "arguments": {"a": 1}}, {"name": "get_weather", "arguments": {}}]'
    content, calls = parse_tool_calls(text, "auto", "mistral", NAMES)
    assert content == "Checking." and calls_of(calls) == [("add", {"a": 1}), ("get_weather", {})]
    text = '[TOOL_CALLS]add[ARGS]{"a": 2}[TOOL_CALLS]rm[ARGS]{}[TOOL_CALLS]get_weather[ARGS] {"city": "Oslo"}'
    content, calls = parse_tool_calls(text, "auto", "mistral", NAMES)
    assert content is None and calls_of(calls) == [("add", {"a": 2}), ("get_weather", {"city": "Oslo"})]
    assert parse_tool_calls('[TOOL_CALLS]add[ARGS]{"a": ', "auto", "mistral", NAMES)[1] == []
    assert parse_tool_calls("[TOOLS] no calls", "auto", "mistral", NAMES) == ("[TOOLS] no calls", [])


def test_mistral_calls_stream_each_once_it_is_complete():
    text = '[TOOL_CALLS]add[ARGS]{"a": 1}[TOOL_CALLS]get_weather[ARGS]{"city": "Rome"}'
    stream = ToolCallStream("auto", "mistral", NAMES)
    sent_at = {}
    for end in range(1, len(text) + 1):
        assert stream.content_delta(text[:end]) is None
        for delta in stream.call_deltas(text[:end]):
            sent_at.setdefault(delta.index, end)
    assert stream.finish(text) == (None, [])
    assert sent_at == {0: text.index("}") + 1, 1: len(text)}


def test_a_forced_array_cut_short_keeps_its_complete_calls():
    text = '[{"name": "add", "parameters": {"a": 1}}, {"name": "add", "parameters": {"a'
    content, calls = parse_tool_calls(text, "forced", None, NAMES)
    assert content is None and calls_of(calls) == [("add", {"a": 1})]
    assert parse_tool_calls('[{"name": "add", "para', "forced", None, NAMES)[1] == []


@pytest.mark.parametrize(
    "mode, parser, start",
    [
        ("auto", "llama3", '{"name": "add", "parameters": '),
        ("auto", "hermes", "<tool_call>"),
        ("forced", None, "["),
        ("auto", "mistral", "[TOOL_CALLS]"),
    ],
)
def test_output_nested_past_the_json_recursion_limit_is_no_call(mode, parser, start):
    text = start + "[" * 5000
    assert parse_tool_calls(text, mode, parser, NAMES) == (text, [])


@pytest.mark.parametrize(
    "choice, max_items", [("required", None), ({"type": "function", "function": {"name": "add"}}, 1)]
)
def test_forced_schema_lists_the_chosen_tools(choice, max_items):
    request = ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], tools=TOOLS, tool_choice=choice)
    schema = json.loads(forced_calls_schema(request))
    assert schema.get("maxItems") == max_items
    jsonschema.validate([{"name": "add", "parameters": {"a": 3}}], schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{"name": "add", "parameters": {}}], schema)
    if choice == "required":
        jsonschema.validate(
            [{"name": "get_weather", "parameters": {}}, {"name": "add", "parameters": {"a": 1}}], schema
        )
    else:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate([{"name": "get_weather", "parameters": {}}], schema)


@pytest.mark.parametrize(
    "parser, text",
    [
        ("hermes", 'Checking <tool><tool_call>{"name": "add", "arguments": {"a": 5}}</tool_call>'),
        ("hermes", 'Checking. \n <tool_call>{"name": "add", "arguments": {"a": 5}}</tool_call>'),
        ("llama3", 'Sure: <|python_tag|>{"name": "add", "parameters": {"a": 5}}'),
        ("hermes", "Plain text with a < sign and <tool but no call \n"),
        ("hermes", 'Unknown function \n<tool_call>{"name": "rm", "arguments": {}}</tool_call>'),
        ("mistral", 'Adding. [TOOL_CALLS] [{"name": "add", "arguments": {"a": 5}}]'),
        ("mistral", 'Adding [TOOL_CALL] [TOOL_CALLS]add[ARGS]{"a": 5}'),
        ("mistral", "A [bracket] and [TOOL but no call \n"),
    ],
)
@pytest.mark.parametrize("step", [1, 4, 1000])  # characters per update (1000: the whole text at once)
def test_streamed_deltas_add_up_to_the_parsed_answer(parser, text, step):
    stream = ToolCallStream("auto", parser, NAMES)
    content, deltas = "", []
    for end in range(step, len(text) + step, step):
        content += stream.content_delta(text[:end]) or ""
        deltas += stream.call_deltas(text[:end])
    rest, last = stream.finish(text)
    content += rest or ""
    deltas += last
    whole_content, whole_calls = parse_tool_calls(text, "auto", parser, NAMES)
    if whole_calls:
        assert content == whole_content  # the whitespace before the call included
        names = "".join(d.function.name or "" for d in deltas)
        arguments = "".join(d.function.arguments or "" for d in deltas)
        assert names == "add" and json.loads(arguments) == {"a": 5} and deltas[0].id
    else:
        assert content == text and deltas == []


def test_each_forced_call_streams_once_it_is_complete():
    text = '[{"name": "add", "parameters": {"a": 1}}, {"name": "get_weather", "parameters": {"city": "Rome"}}]'
    stream = ToolCallStream("forced", None, NAMES)
    sent_at = {}
    for end in range(1, len(text) + 1):
        assert stream.content_delta(text[:end]) is None
        for delta in stream.call_deltas(text[:end]):
            sent_at.setdefault(delta.index, end)
    assert stream.finish(text) == (None, [])  # everything went out before the end
    first_call_end = text.index("}}") + 2
    assert sent_at == {0: first_call_end, 1: len(text) - 1}
