"""Structured outputs and tool calling end to end: real server processes (the demo model and a tiny
random Llama, each with a tools-aware --chat-template; the demo pair with EAGLE-3 and the mode
switch) driven by the official `openai` client and httpx. JSON-schema answers validate, JSON
objects parse, regex answers match in full, named and required tool choices return calls of the
listed tools whose arguments validate, streamed tool-call deltas add up to the whole answer's calls,
bad constraints are 400s naming the field, and speculation changes no greedy constrained answer."""

from __future__ import annotations

import concurrent.futures
import json
import re

import httpx
import jsonschema
import openai
import pytest
from transformers import AutoTokenizer

from sglang import demo
from sglang.test.server_fixture import ServerProcess, assert_server_kv_accounting, openai_client, server_state

TEMPLATE = """{%- if tools %}<|system|>
You may call: {% for tool in tools %}{{ tool.function.name }}{{ tool.function.parameters | tojson }} {% endfor %}
{% endif %}{% for message in messages %}<|{{ message.role }}|>
{{ message.content }}
{% endfor %}{% if add_generation_prompt %}<|assistant|>
{% endif %}"""

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "admin": {"type": "boolean"},
        "role": {"enum": ["dev", "ops", "pm"]},
    },
    "required": ["name", "age", "admin", "role"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
}
ADD = {
    "type": "object",
    "properties": {
        "a": {"type": "integer", "minimum": 0, "maximum": 99},
        "b": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["a", "b"],
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather forecast", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "add", "description": "Adds two numbers", "parameters": ADD}},
]
PARAMETERS = {"get_weather": WEATHER, "add": ADD}
REGEX = r"(yes|no), [0-9]{2} (cats|dogs)"
MESSAGES = [{"role": "user", "content": "What is the weather in Paris this week?"}]
KINDS = ["demo", "tiny"]


@pytest.fixture(scope="module")
def template_path(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("template") / "tools.jinja"
    path.write_text(TEMPLATE)
    return str(path)


@pytest.fixture(scope="module")
def servers(tiny_model_paths, template_path):
    """demo and tiny: plain servers; spec: the demo pair with EAGLE-3 and the mode switch."""
    common = ("--chat-template", template_path, "--tool-call-parser", "qwen25")
    specs = {
        "demo": (demo.TARGET_PATH, common),
        "tiny": (tiny_model_paths["llama"], common),
        # The mode switch between k = 1 and 3: with k = 0 among the candidates, the cost policy on a loaded
        # CPU may price every constrained step as plain and verify nothing, and the parity would be empty.
        "spec": (
            demo.TARGET_PATH,
            (
                *common,
                "--speculative-algorithm",
                "EAGLE3",
                "--speculative-adaptive",
                "--speculative-candidate-steps",
                "1,3",
            ),
        ),
    }
    with concurrent.futures.ThreadPoolExecutor(len(specs)) as pool:  # they start in parallel
        futures = {name: pool.submit(ServerProcess, path, *args) for name, (path, args) in specs.items()}
    started = {name: future.result() for name, future in futures.items() if future.exception() is None}
    try:
        for future in futures.values():
            if future.exception() is not None:
                raise future.exception()
        yield started
    finally:
        for server in started.values():
            server.stop()


def chat(server, **kwargs):
    kwargs = {"model": "m", "messages": MESSAGES, "temperature": 0, "max_tokens": 96, **kwargs}
    kwargs.pop("model")
    client = openai_client(server, timeout=120)
    return client.chat.completions.create(model=client.models.list().data[0].id, **kwargs)


def schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}


@pytest.mark.parametrize("kind", KINDS)
def test_json_schema_response_validates(servers, kind):
    answer = chat(servers[kind], response_format=schema_format(PERSON)).choices[0]
    jsonschema.validate(json.loads(answer.message.content), PERSON)
    assert answer.finish_reason == "stop"
    client = openai_client(servers[kind], timeout=120)  # text completions take it too (an extra body field there)
    completion = client.completions.create(
        model=client.models.list().data[0].id,
        prompt="user = ",
        max_tokens=96,
        temperature=0,
        extra_body={"response_format": schema_format(PERSON)},
    )
    jsonschema.validate(json.loads(completion.choices[0].text), PERSON)


@pytest.mark.parametrize("kind", KINDS)
def test_json_object_parses(servers, kind):
    answer = chat(
        servers[kind],
        response_format={"type": "json_object"},
        max_tokens=200,
        messages=[{"role": "user", "content": "Give me a config dict"}],
    ).choices[0]
    assert isinstance(json.loads(answer.message.content), dict), answer.message.content


@pytest.mark.parametrize("kind", KINDS)
def test_regex_output_matches_in_full_on_chat_and_generate(servers, kind):
    server = servers[kind]
    text = chat(server, extra_body={"regex": REGEX}).choices[0].message.content
    assert re.fullmatch(REGEX, text), text
    body = {"text": "Answer: ", "sampling_params": {"temperature": 0, "max_new_tokens": 64, "regex": REGEX}}
    generated = httpx.post(server.base_url + "/generate", json=body, timeout=60).json()
    assert re.fullmatch(REGEX, generated["text"]), generated
    assert generated["meta_info"]["finish_reason"]["type"] == "stop"


@pytest.mark.parametrize("kind", KINDS)
def test_json_schema_and_ebnf_on_generate(servers, kind):
    url = servers[kind].base_url + "/generate"
    body = {
        "text": "x = ",
        "sampling_params": {"temperature": 0, "max_new_tokens": 80, "json_schema": json.dumps(PERSON)},
    }
    jsonschema.validate(json.loads(httpx.post(url, json=body, timeout=60).json()["text"]), PERSON)
    ebnf = 'root ::= "[" digit ("," digit){0,4} "]"\ndigit ::= [0-9]'
    body = {"text": "x = ", "sampling_params": {"temperature": 0, "max_new_tokens": 40, "ebnf": ebnf}}
    assert re.fullmatch(r"\[[0-9](,[0-9]){0,4}\]", httpx.post(url, json=body, timeout=60).json()["text"])


@pytest.mark.parametrize("kind", KINDS)
def test_named_tool_choice_returns_that_tool_with_valid_arguments(servers, kind):
    for name in PARAMETERS:
        choice = {"type": "function", "function": {"name": name}}
        answer = chat(servers[kind], tools=TOOLS, tool_choice=choice).choices[0]
        assert answer.finish_reason == "tool_calls"
        (call,) = answer.message.tool_calls
        assert call.type == "function" and call.function.name == name and call.id
        jsonschema.validate(json.loads(call.function.arguments), PARAMETERS[name])


def streamed_calls(stream) -> tuple[list[dict], str]:
    """The tool calls that a stream's deltas add up to, and its finish reason."""
    calls: dict[int, dict] = {}
    finish = None
    for chunk in stream:
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for delta in choice.delta.tool_calls or ():
                call = calls.setdefault(delta.index, {"id": None, "name": "", "arguments": ""})
                call["id"] = delta.id or call["id"]
                call["name"] += delta.function.name or ""
                call["arguments"] += delta.function.arguments or ""
    return [calls[i] for i in sorted(calls)], finish


@pytest.mark.parametrize("kind", KINDS)
def test_required_tool_choice_returns_listed_tools_and_streams_the_same_calls(servers, kind):
    response = chat(servers[kind], tools=TOOLS, tool_choice="required")
    whole = response.choices[0]
    # The random tiny model may write calls until max_tokens: its complete calls, finish "length".
    cut = response.usage.completion_tokens == 96
    assert whole.finish_reason == ("length" if cut else "tool_calls") and whole.message.tool_calls
    for call in whole.message.tool_calls:
        jsonschema.validate(json.loads(call.function.arguments), PARAMETERS[call.function.name])
    stream = chat(servers[kind], tools=TOOLS, tool_choice="required", stream=True)
    calls, finish = streamed_calls(stream)
    assert finish == whole.finish_reason
    assert [(c["name"], c["arguments"]) for c in calls] == [
        (c.function.name, c.function.arguments) for c in whole.message.tool_calls
    ]
    assert all(c["id"] for c in calls)


@pytest.mark.parametrize("kind", KINDS)
def test_tools_reach_the_chat_template(servers, kind, tiny_model_paths):
    tokenizer = AutoTokenizer.from_pretrained(demo.TARGET_PATH if kind == "demo" else tiny_model_paths["llama"])
    expected = tokenizer.apply_chat_template(
        MESSAGES, tools=TOOLS, chat_template=TEMPLATE, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    answer = chat(servers[kind], tools=TOOLS, tool_choice="auto", max_tokens=4)
    assert answer.usage.prompt_tokens == len(expected)
    without = chat(servers[kind], max_tokens=4)
    assert without.usage.prompt_tokens < answer.usage.prompt_tokens


def test_bad_constraints_are_400s_naming_the_field(servers):
    server = servers["demo"]
    cases = [
        ({"extra_body": {"regex": "a["}}, "regex"),
        ({"extra_body": {"json_schema": "{bad"}}, "json_schema"),
        ({"response_format": schema_format({"type": 5})}, "response_format"),
        ({"extra_body": {"ebnf": "root ::= "}}, "ebnf"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"extra_body": {"regex": "a", "ebnf": 'root ::= "a"'}}, "ebnf"),
        ({"response_format": {"type": "json_schema"}}, "response_format"),
        ({"response_format": {"type": "json_object"}, "extra_body": {"regex": "a"}}, "regex"),
        ({"tool_choice": "required"}, "tool_choice"),
        # Grammars that parse but that nothing matches: an empty answer would look finished.
        ({"extra_body": {"regex": "[^\\s\\S]"}}, "regex"),
        ({"response_format": schema_format({"anyOf": []})}, "response_format"),
    ]
    for kwargs, field in cases:
        with pytest.raises(openai.BadRequestError) as err:
            chat(server, **kwargs)
        assert err.value.body["param"] == field, (kwargs, err.value.body)
    body = {"text": "x", "sampling_params": {"json_schema": '{"type": "nope"}'}}
    response = httpx.post(server.base_url + "/generate", json=body, timeout=30)
    assert response.status_code == 400 and "json_schema" in response.text
    body = {"text": "x", "sampling_params": {"ebnf": "root ::= [^\\x00-\\U0010FFFF]"}}  # no character at all
    response = httpx.post(server.base_url + "/generate", json=body, timeout=30)
    assert response.status_code == 400 and response.json()["error"]["param"] == "ebnf", response.text
    assert "nothing matches it" in response.json()["error"]["message"]
    assert_server_kv_accounting(server)


# A tool whose parameters reference $defs (what pydantic writes for a nested model).
ROUTE = {
    "type": "object",
    "properties": {"start": {"$ref": "#/$defs/Stop"}, "end": {"$ref": "#/$defs/Stop"}},
    "required": ["start", "end"],
    "$defs": {"Stop": WEATHER},
}
ROUTE_TOOL = {"type": "function", "function": {"name": "route", "parameters": ROUTE}}
CONSTRAINED = [
    dict(response_format=schema_format(PERSON)),
    dict(extra_body={"regex": REGEX}),
    dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}}),
    dict(tools=[*TOOLS, ROUTE_TOOL], tool_choice={"type": "function", "function": {"name": "route"}}),
    dict(tools=TOOLS, tool_choice="required"),
    dict(response_format={"type": "json_object"}, max_tokens=48),
]


def answer_of(response) -> tuple:
    message = response.choices[0].message
    calls = [(c.function.name, c.function.arguments) for c in message.tool_calls or ()]
    return message.content, calls, response.choices[0].finish_reason


def test_speculation_gives_the_same_greedy_constrained_answers(servers):
    before = server_state(servers["spec"])["spec_verifies"]
    for kwargs in CONSTRAINED:
        assert answer_of(chat(servers["spec"], **kwargs)) == answer_of(chat(servers["demo"], **kwargs)), kwargs
    assert server_state(servers["spec"])["spec_verifies"] > before  # drafts were verified under the grammars
    assert_server_kv_accounting(servers["spec"])


@pytest.mark.parametrize("kind", ["demo", "spec"])
def test_constrained_and_unconstrained_requests_share_batches(servers, kind):
    server = servers[kind]
    requests = [
        *CONSTRAINED,
        dict(max_tokens=40),
        dict(max_tokens=24, messages=[{"role": "user", "content": "Hi"}]),
        dict(extra_body={"regex": r"[a-z]{2,8}"}, max_tokens=16),
    ]
    alone = [answer_of(chat(server, **kwargs)) for kwargs in requests]
    with concurrent.futures.ThreadPoolExecutor(len(requests) * 2) as pool:
        together = list(pool.map(lambda kwargs: answer_of(chat(server, **kwargs)), requests * 2))
    assert together == alone * 2
    assert_server_kv_accounting(server)
