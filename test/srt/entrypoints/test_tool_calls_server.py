"""Tool calling end to end on the demo model served with a Llama-3.1-style tools template and
`--tool-call-parser llama3`: parameters schemas with $defs under a forced tool_choice, calls cut by
max_tokens finishing with "length", the model's own llama3 calls (forced here with a regex, since a
tiny model's choices mean nothing) parsed out of the content, and a history with an assistant's
calls and a tool's answer rendered as the template renders it."""

from __future__ import annotations

import concurrent.futures
import json

import jsonschema
import openai
import pytest
from transformers import AutoTokenizer

from sglang import demo
from sglang.test.server_fixture import ServerProcess, assert_server_kv_accounting

TEMPLATE = """{%- if tools %}<|system|>
Functions: {% for t in tools %}{{ t | tojson }}
{% endfor %}{% endif %}
{%- for message in messages %}
{%- if 'tool_calls' in message %}<|assistant|>
{% for call in message.tool_calls %}{"name": "{{ call.function.name }}", "parameters": {{ call.function.arguments | tojson }}}{% endfor %}
{% elif message.role == 'tool' %}<|ipython|>
{{ {"output": message.content} | tojson }}
{% else %}<|{{ message.role }}|>
{{ message.content }}
{% endif %}{% endfor %}{% if add_generation_prompt %}<|assistant|>
{% endif %}"""

# pydantic's model_json_schema() of a model with a nested one: the nested model sits under $defs.
ROUTE = {
    "type": "object",
    "properties": {"start": {"$ref": "#/$defs/Stop"}, "end": {"$ref": "#/$defs/Stop"}},
    "required": ["start", "end"],
    "additionalProperties": False,
    "$defs": {
        "Stop": {
            "type": "object",
            "properties": {"city": {"enum": ["Paris", "Rome"]}, "day": {"type": "integer", "minimum": 1, "maximum": 7}},
            "required": ["city", "day"],
            "additionalProperties": False,
        }
    },
}
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"]}
TOOLS = [
    {"type": "function", "function": {"name": "plan_route", "parameters": ROUTE}},
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
]
MESSAGES = [{"role": "user", "content": "Plan a trip from Paris to Rome."}]
LLAMA3_CALL = '{"name": "get_weather", "parameters": {"city": "Paris"}}'


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = tmp_path_factory.mktemp("template") / "llama_tools.jinja"
    path.write_text(TEMPLATE)
    proc = ServerProcess(demo.TARGET_PATH, "--chat-template", str(path), "--tool-call-parser", "llama3")
    yield proc
    proc.stop()


def chat(server, **kwargs):
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0, timeout=120)
    kwargs = {"messages": MESSAGES, "temperature": 0, "max_tokens": 120, "tools": TOOLS, **kwargs}
    return client.chat.completions.create(model=client.models.list().data[0].id, **kwargs)


def streamed(server, **kwargs) -> tuple[str, list[tuple[str, str]], str]:
    """(content, [(name, arguments)], finish reason) that a stream's deltas add up to."""
    content, calls, finish = "", {}, None
    for chunk in chat(server, stream=True, **kwargs):
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            content += choice.delta.content or ""
            for delta in choice.delta.tool_calls or ():
                name, arguments = calls.get(delta.index, ("", ""))
                calls[delta.index] = (name + (delta.function.name or ""), arguments + (delta.function.arguments or ""))
    return content, [calls[i] for i in sorted(calls)], finish


def test_named_tool_with_defs_in_its_parameters_returns_valid_arguments(server):
    answer = chat(server, tool_choice={"type": "function", "function": {"name": "plan_route"}}).choices[0]
    assert answer.finish_reason == "tool_calls" and answer.matched_stop is None
    (call,) = answer.message.tool_calls
    assert call.function.name == "plan_route" and answer.message.content is None
    jsonschema.validate(json.loads(call.function.arguments), ROUTE)
    assert streamed(server, tool_choice="required", parallel_tool_calls=False)[2] == "tool_calls"
    assert_server_kv_accounting(server)


def test_forced_calls_cut_by_max_tokens_finish_with_length(server):
    choice = {"type": "function", "function": {"name": "get_weather"}}
    whole = chat(server, tool_choice=choice)
    assert whole.choices[0].finish_reason == "tool_calls"
    # One token short: the array is written but the model did not end its turn.
    cut = chat(server, tool_choice=choice, max_tokens=whole.usage.completion_tokens - 1).choices[0]
    assert cut.finish_reason == "length"
    assert [c.function.arguments for c in cut.message.tool_calls or ()] in (
        [],
        [c.function.arguments for c in whole.choices[0].message.tool_calls],
    )
    assert streamed(server, tool_choice=choice, max_tokens=whole.usage.completion_tokens - 1)[2] == "length"


def test_llama3_calls_are_read_out_of_the_content(server):
    regex = LLAMA3_CALL.replace("{", r"\{").replace("}", r"\}")
    answer = chat(server, tool_choice="auto", extra_body={"regex": regex}).choices[0]
    assert answer.message.content is None and answer.finish_reason == "tool_calls"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in answer.message.tool_calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    assert streamed(server, tool_choice="auto", extra_body={"regex": regex}) == (
        "",
        [("get_weather", '{"city": "Paris"}')],
        "tool_calls",
    )
    # tool_choice "none": the same text is content.
    answer = chat(server, tool_choice="none", extra_body={"regex": regex}).choices[0]
    assert answer.message.content == LLAMA3_CALL and answer.message.tool_calls is None


def test_json_in_prose_stays_content(server):
    prose = 'Use d = {"name": "get_weather", "parameters": {}} then.'
    regex = prose.replace("{", r"\{").replace("}", r"\}").replace(".", r"\.")
    answer = chat(server, tool_choice="auto", extra_body={"regex": regex}).choices[0]
    assert answer.message.content == prose and answer.message.tool_calls is None
    assert answer.finish_reason == "stop"
    assert streamed(server, tool_choice="auto", extra_body={"regex": regex}) == (prose, [], "stop")


def test_a_call_nested_deeper_than_json_parses_stays_content(server):
    # A request can steer the output into nesting past the JSON decoder's recursion limit (1000).
    text = '{"name": "get_weather", "parameters": ' + "[" * 1100
    regex = text.replace("{", r"\{").replace("[", r"\[")
    kwargs = dict(tool_choice="auto", max_tokens=None, extra_body={"regex": regex})
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # both at once: one batch of ~1,100 steps
        stream = pool.submit(streamed, server, **kwargs)
        answer = chat(server, **kwargs).choices[0]
        assert (answer.message.content, answer.message.tool_calls, answer.finish_reason) == (text, None, "stop")
        assert stream.result() == (text, [], "stop")
    assert_server_kv_accounting(server)


def test_history_with_calls_and_tool_answers_renders_as_the_template_does(server):
    arguments = {"city": "Paris"}
    history = [
        *MESSAGES,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": json.dumps(arguments)},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ]
    expected = [
        *MESSAGES,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
            ],
        },
        {"role": "tool", "content": "sunny, 21 C", "tool_call_id": "call_1"},
    ]
    tokenizer = AutoTokenizer.from_pretrained(demo.TARGET_PATH)
    ids = tokenizer.apply_chat_template(
        expected, tools=TOOLS, chat_template=TEMPLATE, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    text = tokenizer.decode(ids)
    assert '"parameters": {"city": "Paris"}' in text and '{"output": "sunny, 21 C"}' in text
    assert chat(server, messages=history, max_tokens=2).usage.prompt_tokens == len(ids)
