"""Tool-call corner cases a client trips on: parameters schemas with local references ($defs,
definitions, "#") under a forced tool_choice, the finish reason of calls cut short, and llama3
output that only mentions JSON in prose (not a call, and streamed as it comes)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from sglang.srt.constrained.grammar import check_constraint
from sglang.srt.errors import InvalidRequest
from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
from sglang.srt.entrypoints.openai.tool_calls import (
    ToolCallStream,
    forced_calls_schema,
    parse_tool_calls,
    tool_finish_reason,
)
from sglang.srt.sampling.sampling_params import SamplingParams

# What pydantic's model_json_schema() writes for nested models: the nested one under $defs.
PLACE = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "near": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}},
    "required": ["city", "near"],
}
ROUTE = {
    "type": "object",
    "properties": {
        "start": {"$ref": "#/$defs/Stop"},
        "end": {"$ref": "#/definitions/Stop"},
        "default": {"$ref": "#/$defs/Stop"},
        "mode": {"const": {"$ref": "#/x"}},
    },
    "required": ["start", "end", "default", "mode"],
    "$defs": {"Stop": {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}},
    "definitions": {"Stop": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}},
}
TOOLS = [
    {"type": "function", "function": {"name": "route", "parameters": ROUTE}},
    {"type": "function", "function": {"name": "place", "parameters": PLACE}},
    {"type": "function", "function": {"name": "ping"}},
]
NAMES = {"route", "place", "ping", "add"}
GOOD_ROUTE = {"start": {"id": 1}, "end": {"code": "X"}, "default": {"id": 2}, "mode": {"$ref": "#/x"}}


def forced_schema(choice) -> str:
    request = ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], tools=TOOLS, tool_choice=choice)
    return forced_calls_schema(request)


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "route"}}])
def test_forced_schema_keeps_the_local_references_of_parameters(choice):
    text = forced_schema(choice)
    check_constraint(SamplingParams(json_schema=text))  # xgrammar resolves every reference (a 400 before)
    schema = json.loads(text)
    jsonschema.validate([{"name": "route", "parameters": GOOD_ROUTE}], schema)
    for wrong in ({"end": {"id": 1}}, {"start": {"code": "X"}}, {"default": {}}, {"mode": "walk"}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate([{"name": "route", "parameters": {**GOOD_ROUTE, **wrong}}], schema)
    if choice == "required":  # "#" is the parameters schema itself, not the array of calls
        jsonschema.validate(
            [
                {"name": "place", "parameters": {"city": "A", "near": {"city": "B", "near": None}}},
                {"name": "ping", "parameters": {}},
            ],
            schema,
        )
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate([{"name": "place", "parameters": {"city": "A", "near": [{"name": "ping"}]}}], schema)


def test_forced_schema_without_references_nests_the_parameters_as_given():
    request = ChatCompletionRequest(
        messages=[{"role": "user", "content": "x"}],
        tools=TOOLS[2:]
        + [{"type": "function", "function": {"name": "add", "parameters": PLACE["properties"]["near"]["anyOf"][1]}}],
        tool_choice="required",
    )
    schema = json.loads(forced_calls_schema(request))
    assert "$defs" not in schema
    assert schema["items"]["anyOf"][1]["properties"]["parameters"] == {"type": "null"}


def test_calls_finish_with_tool_calls_only_when_the_model_stopped():
    assert tool_finish_reason("stop", True) == "tool_calls"
    assert tool_finish_reason("length", True) == "length"  # calls cut short: the client must know
    assert tool_finish_reason("abort", True) == "abort"
    assert tool_finish_reason("stop", False) == "stop"


@pytest.mark.parametrize(
    "text",
    [
        'Write it as {"name": "add", "parameters": {"a": 1}} in the file.',
        'x = {"name": "add", "parameters": {"a": 1}}',
    ],
)
def test_llama3_json_inside_prose_is_content(text):
    assert parse_tool_calls(text, "auto", "llama3", NAMES) == (text, [])


def test_llama3_call_after_leading_whitespace_is_a_call():
    content, calls = parse_tool_calls('\n {"name": "add", "parameters": {"a": 1}}', "auto", "llama3", NAMES)
    assert content is None and [(c.function.name, c.function.arguments) for c in calls] == [("add", '{"a": 1}')]


def test_llama3_prose_with_braces_streams_as_it_comes():
    text = "def f():\n    d = {}\n    return d  # the rest of a long answer"
    stream = ToolCallStream("auto", "llama3", NAMES)
    streamed = "".join(stream.content_delta(text[:end]) or "" for end in range(1, len(text) + 1))
    assert streamed == text  # nothing held back until the end
    assert stream.finish(text) == (None, [])


def test_llama3_stream_holds_leading_whitespace_until_it_knows():
    text = '\n{"name": "add", "parameters": {"a": 1}}'
    stream = ToolCallStream("auto", "llama3", NAMES)
    content = [stream.content_delta(text[:end]) for end in range(1, len(text) + 1)]
    deltas = [d for end in range(1, len(text) + 1) for d in stream.call_deltas(text[:end])]
    assert content == [None] * len(text)
    assert "".join(d.function.arguments or "" for d in deltas) == '{"a": 1}'


def test_forced_schema_of_parameters_nested_too_deeply_is_a_400_naming_tools():
    parameters = node = {}
    for _ in range(900):
        node["properties"] = {"a": {}}
        node = node["properties"]["a"]
    request = ChatCompletionRequest(
        messages=[{"role": "user", "content": "x"}],
        tool_choice="required",
        tools=[{"type": "function", "function": {"name": "f", "parameters": parameters}}],
    )
    with pytest.raises(InvalidRequest) as err:
        forced_calls_schema(request)
    assert err.value.param == "tools"
