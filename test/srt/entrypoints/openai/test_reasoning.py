"""Reasoning models through the real server and the `openai` client: the demo model served with a
Qwen3-style chat template that opens <think> in the generation prompt (none when
chat_template_kwargs says enable_thinking false). The demo code model copies what it sees: after
"<think>\\n" it writes "<think>\\n" a few times, then "</think>\\n" (the same four tokens as the
tokenizer's "</think>"), so its reasoning block ends after a handful of tokens, deterministically.

One server runs --reasoning-parser deepseek-r1 with --tool-call-parser mistral, the other qwen3
under EAGLE-3 with --speculative-adaptive; their greedy answers to the same constrained request
must agree token for token (the drafts cross the end of the block, and rejected ones are rolled
back across it)."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from sglang import demo
from sglang.test.server_fixture import ServerProcess, assert_server_kv_accounting, server_state

TEMPLATE = """{% for message in messages %}<|{{ message['role'] }}|>
{{ message['content'] }}
{% endfor %}{% if add_generation_prompt %}<|assistant|>
{% if enable_thinking is defined and not enable_thinking %}<think>

</think>

{% else %}<think>
{% endif %}{% endif %}"""

MESSAGES = [{"role": "user", "content": "Plan a trip from Paris to Rome."}]
SCHEMA = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Rome"]}, "ok": {"type": "boolean"}},
    "required": ["city", "ok"],
    "additionalProperties": False,
}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "trip", "schema": SCHEMA}}
WEATHER = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Rome"]}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("template") / "thinking.jinja"
    path.write_text(TEMPLATE)
    return str(path)


@pytest.fixture(scope="module")
def r1_server(template):
    proc = ServerProcess(
        demo.TARGET_PATH,
        "--chat-template",
        template,
        "--reasoning-parser",
        "deepseek-r1",
        "--tool-call-parser",
        "mistral",
        "--skip-server-warmup",
    )
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def qwen3_spec_server(template):
    # Dynamic speculation between k = 1 and 3: without k = 0 among the candidates every step speculates,
    # whatever this loaded CPU's step times make the cost policy prefer.
    proc = ServerProcess(
        demo.TARGET_PATH,
        "--chat-template",
        template,
        "--reasoning-parser",
        "qwen3",
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-adaptive",
        "--speculative-candidate-steps",
        "1,3",
        "--skip-server-warmup",
    )
    yield proc
    proc.stop()


def chat(server, **kwargs):
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0, timeout=120)
    extra = {key: kwargs.pop(key) for key in ("separate_reasoning", "chat_template_kwargs", "regex") if key in kwargs}
    kwargs = {"messages": MESSAGES, "temperature": 0, "max_tokens": 40, **kwargs}
    return client.chat.completions.create(model=client.models.list().data[0].id, extra_body=extra, **kwargs)


def whole(server, **kwargs) -> dict:
    """The first choice's message fields and finish reason."""
    choice = chat(server, **kwargs).choices[0]
    message = choice.message
    calls = [(call.function.name, json.loads(call.function.arguments)) for call in message.tool_calls or ()]
    return {
        "reasoning": (message.model_extra or {}).get("reasoning_content"),
        "content": message.content,
        "calls": calls,
        "finish": choice.finish_reason,
    }


def streamed(server, **kwargs) -> dict:
    """What a stream's deltas add up to, as `whole` reports it."""
    reasoning, content, calls, finish = "", "", {}, None
    for chunk in chat(server, stream=True, **kwargs):
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            delta = choice.delta
            reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
            content += delta.content or ""
            for call in delta.tool_calls or ():
                name, arguments = calls.get(call.index, ("", ""))
                calls[call.index] = (name + (call.function.name or ""), arguments + (call.function.arguments or ""))
    return {
        "reasoning": reasoning or None,
        "content": content or None,
        "calls": [(name, json.loads(arguments)) for name, arguments in (calls[i] for i in sorted(calls))],
        "finish": finish,
    }


def test_reasoning_block_goes_to_reasoning_content_and_streams_the_same(r1_server):
    raw = whole(r1_server, separate_reasoning=False)
    assert raw["reasoning"] is None and raw["content"].startswith("<think>\n<think>")
    end = raw["content"].index("</think>")
    answer = whole(r1_server)
    # deepseek-r1: the model's own leading <think> is dropped, the block ends at the first </think>.
    assert answer["reasoning"] == raw["content"][len("<think>") : end].strip() != ""
    assert answer["content"] == raw["content"][end + len("</think>") :].lstrip()
    assert streamed(r1_server) == answer == whole(r1_server, separate_reasoning=None)  # null: the default
    assert streamed(r1_server, separate_reasoning=False) == raw
    assert_server_kv_accounting(r1_server)


def test_reasoning_cut_by_max_tokens_is_all_reasoning(r1_server):
    # 10 tokens: "<think>\n<think>\n", the model's own start tag and one line of its reasoning.
    for answer in (whole(r1_server, max_tokens=10), streamed(r1_server, max_tokens=10)):
        assert answer == {"reasoning": "<think>", "content": None, "calls": [], "finish": "length"}


def test_response_format_constrains_the_answer_after_the_block_only(r1_server):
    answer = whole(r1_server, response_format=RESPONSE_FORMAT)
    jsonschema.validate(json.loads(answer["content"]), SCHEMA)
    # The reasoning was written unconstrained: not JSON, and holding the model's own tags.
    assert "<think>" in answer["reasoning"]
    with pytest.raises(json.JSONDecodeError):
        json.loads(answer["reasoning"])
    assert streamed(r1_server, response_format=RESPONSE_FORMAT) == answer
    assert whole(r1_server, response_format={"type": "json_object"})["content"].startswith("{")


def test_forced_tool_call_is_read_from_the_answer(r1_server):
    for answer in (
        whole(r1_server, tools=TOOLS, tool_choice="required", max_tokens=80),
        streamed(r1_server, tools=TOOLS, tool_choice="required", max_tokens=80),
    ):
        assert answer["finish"] == "tool_calls" and answer["content"] is None and answer["reasoning"]
        ((name, arguments),) = answer["calls"]
        assert name == "get_weather"
        jsonschema.validate(arguments, WEATHER)


@pytest.mark.parametrize(
    "call_text",
    [
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}',
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]',
    ],
)
def test_mistral_calls_after_the_block_are_parsed(r1_server, call_text):
    # A tiny model's own calls mean nothing: a regex (applied after the block) makes it write one.
    regex = "".join("\\" + c if c in '[]{}"' else c for c in call_text)
    for answer in (
        whole(r1_server, tools=TOOLS, regex=regex, max_tokens=80),
        streamed(r1_server, tools=TOOLS, regex=regex, max_tokens=80),
    ):
        assert answer["calls"] == [("get_weather", {"city": "Paris"})] and answer["finish"] == "tool_calls"
        assert answer["content"] is None and answer["reasoning"]


def test_native_generate_constrains_after_the_block_when_it_requires_reasoning(r1_server):
    prompt = "<|user|>\nPlan a trip from Paris to Rome.\n<|assistant|>\n<think>\n"
    body = {
        "text": prompt,
        "sampling_params": {"temperature": 0, "max_new_tokens": 80, "json_schema": json.dumps(SCHEMA)},
    }
    thought = httpx.post(r1_server.base_url + "/generate", json={**body, "require_reasoning": True}, timeout=60).json()
    reasoning, answer = thought["text"].split("</think>", 1)
    assert reasoning.startswith("<think>")
    jsonschema.validate(json.loads(answer), SCHEMA)
    plain = httpx.post(r1_server.base_url + "/generate", json=body, timeout=60).json()  # as upstream: from the start
    jsonschema.validate(json.loads(plain["text"]), SCHEMA)


def test_chat_template_kwargs_may_not_set_the_servers_arguments(r1_server):
    response = httpx.post(
        r1_server.base_url + "/v1/chat/completions",
        timeout=60,
        json={"messages": MESSAGES, "chat_template_kwargs": {"tokenize": False}},
    )
    assert response.status_code == 400 and "chat_template_kwargs" in response.text


def test_qwen3_without_thinking_answers_in_content_constrained_from_the_start(qwen3_spec_server):
    answer = whole(qwen3_spec_server, response_format=RESPONSE_FORMAT, **NO_THINKING)
    assert answer["reasoning"] is None
    jsonschema.validate(json.loads(answer["content"]), SCHEMA)
    plain = whole(qwen3_spec_server, **NO_THINKING)
    assert plain["reasoning"] is None and plain["content"]
    assert streamed(qwen3_spec_server, **NO_THINKING) == plain


@pytest.mark.parametrize(
    "constraint",
    [{"response_format": RESPONSE_FORMAT}, {"tools": TOOLS, "tool_choice": "required"}],
    ids=["response_format", "tool_choice"],
)
def test_speculation_keeps_greedy_answers_with_reasoning_and_grammar(r1_server, qwen3_spec_server, constraint):
    # The qwen3 parser reads the same block here: the output opens it with its own <think>.
    verifies = server_state(qwen3_spec_server)["spec_verifies"]
    speculative = whole(qwen3_spec_server, max_tokens=80, **constraint)
    assert server_state(qwen3_spec_server)["spec_verifies"] > verifies  # it did speculate
    assert speculative == whole(r1_server, max_tokens=80, **constraint)
    assert speculative["reasoning"] and speculative["finish"] in ("stop", "tool_calls")
    assert streamed(qwen3_spec_server, max_tokens=80, **constraint) == speculative
    assert_server_kv_accounting(qwen3_spec_server)
