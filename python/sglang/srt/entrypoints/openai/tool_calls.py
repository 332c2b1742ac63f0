"""Tool calling on /v1/chat/completions: the grammar that enforces `tool_choice` "required" or a
named function, and the parsers (`--tool-call-parser`, upstream's names) that read calls out of the
model's text, whole or while it streams.

"required" and named choices constrain the output to a JSON array of calls,
`[{"name": ..., "parameters": {...}}, ...]`, whatever the model's own format, and that array is
what is parsed back. With "auto" the model writes calls in its own format, which the parser reads:
`llama3`: JSON objects `{"name": ..., "parameters": {...}}` (optionally after `<|python_tag|>`,
several separated by `;`); `qwen25` / `qwen` / `hermes`: `<tool_call>{"name": ..., "arguments":
{...}}</tool_call>` blocks."""

from __future__ import annotations

import dataclasses
import json
import re
import uuid
from typing import Optional

from sglang.srt.entrypoints.openai.protocol import (ChatCompletionRequest, DeltaFunctionCall, DeltaToolCall,
                                                    FunctionCall, NamedToolChoice, ToolCall)

PYTHON_TAG = "<|python_tag|>"
HERMES_START, HERMES_END = "<tool_call>", "</tool_call>"
_HERMES_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


def tool_mode(request: ChatCompletionRequest, parser: Optional[str]) -> Optional[str]:
    """"forced" (required or a named function: grammar-enforced JSON array), "auto" (the parser
    reads the model's own format), or None (no tool calls are read)."""
    if not request.tools or request.tool_choice == "none":
        return None
    if request.tool_choice == "required" or isinstance(request.tool_choice, NamedToolChoice):
        return "forced"
    return "auto" if parser else None


def forced_calls_schema(request: ChatCompletionRequest) -> str:
    """The JSON schema of the output under tool_choice "required" or a named function."""
    choice = request.tool_choice
    tools = request.tools
    if isinstance(choice, NamedToolChoice):
        tools = [tool for tool in tools if tool.function.name == choice.function.name]
    calls = [{"type": "object", "properties": {"name": {"const": tool.function.name},
                                               "parameters": tool.function.parameters or {"type": "object"}},
              "required": ["name", "parameters"]} for tool in tools]
    schema = {"type": "array", "items": calls[0] if len(calls) == 1 else {"anyOf": calls}, "minItems": 1}
    if isinstance(choice, NamedToolChoice) or request.parallel_tool_calls is False:
        schema["maxItems"] = 1
    return json.dumps(schema)


def parse_tool_calls(text: str, mode: str, parser: Optional[str], tool_names: set[str]) -> tuple[Optional[str], list]:
    """(content, [ToolCall]) read from the whole output; content None when only calls remain."""
    if mode == "forced":
        found = _forced_calls(text)
        content = None if found else text
    elif parser == "llama3":
        content, found = _llama3_calls(text)
    else:
        content, found = _hermes_calls(text)
    calls = [_tool_call(name, arguments) for name, arguments in found if name in tool_names]
    if not calls:
        return text, []
    return (content or None), calls


def _tool_call(name: str, arguments) -> ToolCall:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return ToolCall(id=f"call_{uuid.uuid4().hex[:24]}", function=FunctionCall(name=name, arguments=text))


def _forced_calls(text: str) -> list[tuple[str, object]]:
    """The calls of the JSON array; of an array cut short (max_tokens), its complete calls."""
    decoder, calls = json.JSONDecoder(), []
    at = text.find("[") + 1
    while 0 < at < len(text):
        while at < len(text) and text[at] in " \t\r\n,":
            at += 1
        try:
            obj, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            break
        call = _call_of(obj)
        if call is not None:
            calls.append(call)
    return calls


def _call_of(obj) -> Optional[tuple[str, object]]:
    if isinstance(obj, dict) and isinstance(obj.get("name"), str):
        return obj["name"], obj.get("parameters", obj.get("arguments", {}))
    return None


def _llama3_calls(text: str) -> tuple[str, list]:
    start = text.find(PYTHON_TAG)
    body_at = start + len(PYTHON_TAG) if start >= 0 else text.find("{")
    if body_at < 0:
        return text, []
    content = text[: start if start >= 0 else body_at].strip()
    decoder, calls, at = json.JSONDecoder(), [], body_at
    body = text
    while at < len(body):
        while at < len(body) and body[at] in " \t\r\n;":
            at += 1
        if at >= len(body):
            break
        try:
            obj, at = decoder.raw_decode(body, at)
        except json.JSONDecodeError:
            break
        call = _call_of(obj)
        if call is None:
            break
        calls.append(call)
    return content, calls


def _hermes_calls(text: str) -> tuple[str, list]:
    start = text.find(HERMES_START)
    if start < 0:
        return text, []
    calls = []
    for block in _HERMES_BLOCK.findall(text[start:]):
        try:
            call = _call_of(json.loads(block))
        except json.JSONDecodeError:
            continue
        if call is not None:
            calls.append(call)
    return text[:start].strip(), calls


@dataclasses.dataclass
class ToolCallStream:
    """One streamed choice: content goes out until the text may be starting a call, then is held
    back; each call goes out as OpenAI tool-call deltas once it is complete in the text (the last
    ones, or the held text as content if there are none, once the output is complete)."""

    mode: str
    parser: Optional[str]
    tool_names: set[str]
    sent: int = 0  # characters of the output sent as content
    holding: bool = False
    num_calls: int = 0  # calls sent

    def content_delta(self, text: str) -> Optional[str]:
        """The content that can go out now, given the output so far."""
        if self.mode == "forced" or self.holding:
            return None
        marker_at = self._marker(text)
        if marker_at is not None:
            self.holding = True
            end = marker_at
        else:
            end = len(text) - _partial_marker_len(text, self._markers())
        delta, self.sent = text[self.sent:end], max(self.sent, end)
        return delta or None

    def call_deltas(self, text: str) -> list[DeltaToolCall]:
        """Deltas of the calls completed in the output so far and not sent yet."""
        if self.mode == "auto" and not self.holding:
            return []
        if self.mode == "auto" and self.parser != "llama3":  # only the blocks already closed
            end = text.rfind(HERMES_END)
            text = text[: end + len(HERMES_END)] if end >= 0 else ""
        return self._deltas(parse_tool_calls(text, self.mode, self.parser, self.tool_names)[1])

    def finish(self, text: str) -> tuple[Optional[str], list[DeltaToolCall]]:
        """(the content not sent yet, the remaining calls as deltas) once the output is complete."""
        content, calls = parse_tool_calls(text, self.mode, self.parser, self.tool_names)
        if not calls:
            rest, self.sent = text[self.sent:], len(text)
            return rest or None, []
        return None, self._deltas(calls)

    def _deltas(self, calls: list[ToolCall]) -> list[DeltaToolCall]:
        deltas = []
        for index, call in enumerate(calls[self.num_calls:], self.num_calls):
            deltas.append(DeltaToolCall(index=index, id=call.id, type="function",
                                        function=DeltaFunctionCall(name=call.function.name, arguments="")))
            deltas.append(DeltaToolCall(index=index, function=DeltaFunctionCall(arguments=call.function.arguments)))
        self.num_calls = max(self.num_calls, len(calls))
        return deltas

    def _markers(self) -> tuple[str, ...]:
        return (PYTHON_TAG, "{") if self.parser == "llama3" else (HERMES_START,)

    def _marker(self, text: str) -> Optional[int]:
        found = [text.find(m, self.sent) for m in self._markers()]
        found = [at for at in found if at >= 0]
        return min(found) if found else None


def _partial_marker_len(text: str, markers: tuple[str, ...]) -> int:
    """How many trailing characters could be the start of a marker (held back until known)."""
    longest = 0
    for marker in markers:
        for n in range(1, len(marker)):
            if text.endswith(marker[:n]):
                longest = max(longest, n)
    return longest
