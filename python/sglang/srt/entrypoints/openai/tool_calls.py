"""Tool calling on /v1/chat/completions: the grammar that enforces `tool_choice` "required" or a
named function, and the parsers (`--tool-call-parser`, upstream's names) that read calls out of the
model's text, whole or while it streams.

"required" and named choices constrain the output to a JSON array of calls,
`[{"name": ..., "parameters": {...}}, ...]`, whatever the model's own format, and that array is
what is parsed back. With "auto" the model writes calls in its own format, which the parser reads:
`llama3`: JSON objects `{"name": ..., "parameters": {...}}` (after `<|python_tag|>` or opening the
output, several separated by `;`); `qwen25` / `qwen` / `hermes`: `<tool_call>{"name": ..., "arguments":
{...}}</tool_call>` blocks; `mistral`: `[TOOL_CALLS]` and a JSON list of `{"name": ..., "arguments":
{...}}` (Mistral-7B-Instruct-v0.3, Mixtral-8x22B), or `[TOOL_CALLS]name[ARGS]{...}` once per call
(tokenizers from v11 on)."""

from __future__ import annotations

import dataclasses
import json
import re
import uuid
from typing import Optional

from sglang.srt.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    DeltaFunctionCall,
    DeltaToolCall,
    FunctionCall,
    NamedToolChoice,
    ToolCall,
)
from sglang.srt.errors import InvalidRequest

PYTHON_TAG = "<|python_tag|>"
HERMES_START, HERMES_END = "<tool_call>", "</tool_call>"
MISTRAL_CALLS, MISTRAL_ARGS = "[TOOL_CALLS]", "[ARGS]"
# What reading a call out of the output may raise: the output is the model's, and a request can
# steer it (a regex, logit_bias) into JSON nested deeper than the parser recurses.
_NOT_A_CALL = (json.JSONDecodeError, RecursionError)
_HERMES_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


def tool_mode(request: ChatCompletionRequest, parser: Optional[str]) -> Optional[str]:
    """ "forced" (required or a named function: grammar-enforced JSON array), "auto" (the parser
    reads the model's own format), or None (no tool calls are read)."""
    if not request.tools or request.tool_choice == "none":
        return None
    if request.tool_choice == "required" or isinstance(request.tool_choice, NamedToolChoice):
        return "forced"
    return "auto" if parser else None


def chosen_tools(request: ChatCompletionRequest) -> list:
    """The tools the model may call: the named one for a named tool_choice (all that the template
    and the forced schema see, as upstream), else all of them."""
    choice = request.tool_choice
    if isinstance(choice, NamedToolChoice):
        return [tool for tool in request.tools if tool.function.name == choice.function.name]
    return list(request.tools or ())


def check_tool_parameters(request: ChatCompletionRequest) -> None:
    """As upstream: each tool's `parameters` must be a valid JSON schema (Draft 2020-12), whatever
    tool_choice is, so a broken definition is a 400 naming `tools`, not a prompt the model misreads."""
    if not request.tools:
        return
    from jsonschema import Draft202012Validator, SchemaError  # only requests with tools pay the import

    for index, tool in enumerate(request.tools):
        if tool.function.parameters is None:
            continue
        where = f"tools[{index}].function.parameters"
        try:
            Draft202012Validator.check_schema(tool.function.parameters)
        except SchemaError as err:
            message = err.message if len(err.message) <= 200 else err.message[:200] + "..."
            raise InvalidRequest(
                f"{where} is not a valid JSON schema (Draft 2020-12): at {err.json_path}: {message}", "tools"
            ) from None
        except RecursionError:
            raise InvalidRequest(f"{where} nests too deeply", "tools") from None


def forced_calls_schema(request: ChatCompletionRequest) -> str:
    """The JSON schema of the output under tool_choice "required" or a named function."""
    try:
        return json.dumps(_forced_calls_schema(request))
    except RecursionError:  # the body parser allows about 1000 levels; the walk below takes fewer
        raise InvalidRequest("the parameters schemas of tools nest too deeply", "tools") from None


def _forced_calls_schema(request: ChatCompletionRequest) -> dict:
    calls, defs = [], {}
    for index, tool in enumerate(chosen_tools(request)):
        parameters = tool.function.parameters or {"type": "object"}
        # Its "#/..." references point into the parameters schema, which is no longer the root once
        # nested in the array: such a schema moves under the root's $defs, its references rebased.
        name = f"tool_{index}_parameters"
        rebased = _rebase_refs(parameters, f"#/$defs/{name}")
        if rebased != parameters:
            defs[name], parameters = rebased, {"$ref": f"#/$defs/{name}"}
        calls.append(
            {
                "type": "object",
                "properties": {"name": {"const": tool.function.name}, "parameters": parameters},
                "required": ["name", "parameters"],
            }
        )
    schema = {"type": "array", "items": calls[0] if len(calls) == 1 else {"anyOf": calls}, "minItems": 1}
    if isinstance(request.tool_choice, NamedToolChoice) or request.parallel_tool_calls is False:
        schema["maxItems"] = 1
    if defs:
        schema["$defs"] = defs
    return schema


# Keywords whose values are JSON data, not schemas (a "$ref" in them is not a reference), and
# keywords whose values map names, which may be any word, to schemas.
_DATA_KEYWORDS = frozenset(("const", "enum", "default", "examples"))
_NAMED_SCHEMAS = frozenset(("properties", "patternProperties", "$defs", "definitions", "dependentSchemas"))


def _rebase_refs(schema, base: str, named: bool = False):
    """`schema` with each local reference "#/a/b" rewritten to base + "/a/b" ("#" to base)."""
    # Plain loops, not comprehensions (each a frame of its own): a deep schema recurses once a level.
    if isinstance(schema, list):
        items = []
        for item in schema:
            items.append(_rebase_refs(item, base))
        return items
    if not isinstance(schema, dict):
        return schema
    rebased = {}
    for key, value in schema.items():
        if named:
            rebased[key] = _rebase_refs(value, base)
        elif key == "$ref" and isinstance(value, str) and value.startswith("#"):
            rebased[key] = base + value[1:]
        else:
            rebased[key] = value if key in _DATA_KEYWORDS else _rebase_refs(value, base, key in _NAMED_SCHEMAS)
    return rebased


def tool_finish_reason(finish_reason: Optional[str], has_calls: bool) -> Optional[str]:
    """As OpenAI and upstream: "tool_calls" when the model ended its turn with calls; an answer cut
    short ("length") or aborted keeps that reason, so a client can tell the calls may be incomplete."""
    return "tool_calls" if has_calls and finish_reason == "stop" else finish_reason


def parse_tool_calls(text: str, mode: str, parser: Optional[str], tool_names: set[str]) -> tuple[Optional[str], list]:
    """(content, [ToolCall]) read from the whole output; content None when only calls remain."""
    if mode == "forced":
        found = _forced_calls(text)
        content = None if found else text
    elif parser == "llama3":
        content, found = _llama3_calls(text)
    elif parser == "mistral":
        content, found = _mistral_calls(text)
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
        except _NOT_A_CALL:
            break
        call = _call_of(obj)
        if call is not None:
            calls.append(call)
    return calls


def _call_of(obj) -> Optional[tuple[str, object]]:
    if isinstance(obj, dict) and isinstance(obj.get("name"), str):
        return obj["name"], obj.get("parameters", obj.get("arguments", {}))
    return None


def _llama3_start(text: str, start: int = 0) -> Optional[int]:
    """Where the calls begin, from `start` on: at <|python_tag|>, or at a "{" that opens the
    output (Llama 3.1 answers a call with the JSON alone; a "{" later in prose is text, as upstream)."""
    at = text.find(PYTHON_TAG, start)
    if at >= 0:
        return at
    opening = len(text) - len(text.lstrip())
    return opening if opening >= start and text.startswith("{", opening) else None


def _llama3_calls(text: str) -> tuple[str, list]:
    start = _llama3_start(text)
    if start is None:
        return text, []
    content = text[:start].strip()
    body_at = start + len(PYTHON_TAG) if text.startswith(PYTHON_TAG, start) else start
    decoder, calls, at = json.JSONDecoder(), [], body_at
    body = text
    while at < len(body):
        while at < len(body) and body[at] in " \t\r\n;":
            at += 1
        if at >= len(body):
            break
        try:
            obj, at = decoder.raw_decode(body, at)
        except _NOT_A_CALL:
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
        except _NOT_A_CALL:
            continue
        if call is not None:
            calls.append(call)
    return text[:start].strip(), calls


def _mistral_calls(text: str) -> tuple[str, list]:
    """The calls after [TOOL_CALLS]: each marker followed by a JSON list of calls (or one call
    object), or by name[ARGS] and the arguments object; of a list cut short, its complete calls."""
    start = text.find(MISTRAL_CALLS)
    if start < 0:
        return text, []
    calls = []
    for segment in text[start + len(MISTRAL_CALLS) :].split(MISTRAL_CALLS):
        calls.extend(_mistral_segment_calls(segment))
    return text[:start].strip(), calls


def _mistral_segment_calls(segment: str) -> list[tuple[str, object]]:
    body = segment.lstrip()
    if body.startswith("["):
        return _forced_calls(body)
    decoder = json.JSONDecoder()
    if body.startswith("{"):
        try:
            call = _call_of(decoder.raw_decode(body)[0])
        except _NOT_A_CALL:
            return []
        return [call] if call is not None else []
    name, marker, rest = body.partition(MISTRAL_ARGS)
    if not marker or not name.strip():
        return []
    rest = rest.lstrip()
    try:
        arguments = decoder.raw_decode(rest)[0]
    except _NOT_A_CALL:
        return []
    return [(name.strip(), arguments)] if isinstance(arguments, dict) else []


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
            # Whitespace just before the call is not content (parsing the whole text trims it).
            end = self.sent + len(text[self.sent : marker_at].rstrip())
        else:
            end = len(text) - self._undecided_len(text)
        delta, self.sent = text[self.sent : end], max(self.sent, end)
        return delta or None

    def call_deltas(self, text: str) -> list[DeltaToolCall]:
        """Deltas of the calls completed in the output so far and not sent yet."""
        if self.mode == "auto" and not self.holding:
            return []
        if self.mode == "auto" and self.parser not in ("llama3", "mistral"):  # only the blocks already closed
            end = text.rfind(HERMES_END)
            text = text[: end + len(HERMES_END)] if end >= 0 else ""
        return self._deltas(parse_tool_calls(text, self.mode, self.parser, self.tool_names)[1])

    def finish(self, text: str) -> tuple[Optional[str], list[DeltaToolCall]]:
        """(the content not sent yet, the remaining calls as deltas) once the output is complete."""
        content, calls = parse_tool_calls(text, self.mode, self.parser, self.tool_names)
        if not calls:
            rest, self.sent = text[self.sent :], len(text)
            return rest or None, []
        return None, self._deltas(calls)

    def _deltas(self, calls: list[ToolCall]) -> list[DeltaToolCall]:
        deltas = []
        for index, call in enumerate(calls[self.num_calls :], self.num_calls):
            deltas.append(
                DeltaToolCall(
                    index=index,
                    id=call.id,
                    type="function",
                    function=DeltaFunctionCall(name=call.function.name, arguments=""),
                )
            )
            deltas.append(DeltaToolCall(index=index, function=DeltaFunctionCall(arguments=call.function.arguments)))
        self.num_calls = max(self.num_calls, len(calls))
        return deltas

    def _marker(self, text: str) -> Optional[int]:
        """Where a call starts in the text not sent yet, if it does."""
        if self.parser == "llama3":
            return _llama3_start(text, self.sent)
        at = text.find(MISTRAL_CALLS if self.parser == "mistral" else HERMES_START, self.sent)
        return at if at >= 0 else None

    def _undecided_len(self, text: str) -> int:
        """How many trailing characters may yet turn out to start a call, or to be the whitespace
        before one (held back until known)."""
        if self.parser == "llama3":
            # Only whitespace so far may precede the "{" of a call.
            return len(text) if not text.strip() else _partial_marker_len(text, PYTHON_TAG)
        return _partial_marker_len(text, MISTRAL_CALLS if self.parser == "mistral" else HERMES_START)


def _partial_marker_len(text: str, marker: str) -> int:
    """How many trailing characters are a proper prefix of the marker, with the whitespace before it."""
    start = len(text) - max((n for n in range(1, len(marker)) if text.endswith(marker[:n])), default=0)
    while start > 0 and text[start - 1].isspace():  # from the end, not a copy of the text per update
        start -= 1
    return len(text) - start
