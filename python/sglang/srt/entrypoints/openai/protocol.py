"""Pydantic models of the OpenAI `/v1/completions` and `/v1/chat/completions` requests and
responses, with the ranges OpenAI documents, so a bad value is reported by its field name."""

from __future__ import annotations

import json
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_serializer, model_validator

from sglang.srt.errors import short_repr
from sglang.srt.sampling.sampling_params import MAX_PENALTY, MAX_REPETITION_PENALTY, MAX_TEMPERATURE

MAX_N = 64  # the engine's limit on samples per request
MAX_TOP_LOGPROBS = 20
MAX_SEED = 2**63  # seeds travel as int64


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_stop(value: Any) -> Any:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return value
    raise ValueError("stop must be a string or a list of strings")


def _check_prompt(value: Any) -> Any:
    # Checked by hand, not by a pydantic union: a union's errors are located at the name of a
    # union member ("str", "list[int]"), and the 400 body must name "prompt".
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        if all(isinstance(p, str) for p in value) or all(_is_int(t) for t in value):
            return value
        if all(isinstance(p, list) and all(_is_int(t) for t in p) for p in value):
            return value
    raise ValueError("prompt must be a string, a list of strings, a list of token ids, or a list of lists of token ids")


class _Lenient(BaseModel):
    # OpenAI clients send fields this server does not know (and SDK versions add new ones): those
    # are ignored (the ones OpenAI defines but this server does not implement are refused, in
    # entrypoints/not_implemented.py). Known fields are strict, as /generate's: "0.5" is not a
    # number, true is not an integer, "yes" is not a boolean; NaN and infinities are refused.
    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)


class StreamOptions(_Lenient):
    include_usage: Optional[bool] = False


class JsonSchemaFormat(_Lenient):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    name: Optional[str] = None
    description: Optional[str] = None
    schema_: Optional[Union[dict[str, Any], bool]] = Field(None, alias="schema")
    strict: Optional[bool] = None


class ResponseFormat(_Lenient):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[JsonSchemaFormat] = None

    @model_validator(mode="after")
    def _schema_given(self) -> "ResponseFormat":
        if self.type == "json_schema" and (self.json_schema is None or self.json_schema.schema_ is None):
            raise ValueError("response_format of type json_schema needs json_schema.schema")
        return self


class _SamplingRequest(_Lenient):
    """The fields that completions and chat requests share. `None` means "the default",
    because some clients send explicit nulls for fields they leave unset."""

    model: Optional[str] = None
    temperature: Optional[float] = Field(None, ge=0, le=MAX_TEMPERATURE)
    top_p: Optional[float] = Field(None, gt=0, le=1)
    n: Optional[int] = Field(1, ge=1, le=MAX_N)
    stream: Optional[bool] = False
    stream_options: Optional[StreamOptions] = None
    stop: Optional[Union[str, list[str]]] = None
    seed: Optional[int] = Field(None, ge=0, lt=MAX_SEED)
    presence_penalty: Optional[float] = Field(None, ge=-MAX_PENALTY, le=MAX_PENALTY)
    frequency_penalty: Optional[float] = Field(None, ge=-MAX_PENALTY, le=MAX_PENALTY)
    logit_bias: Optional[dict[str, float]] = None
    user: Optional[str] = None
    # SGLang extensions, with the native sampling parameters' names
    top_k: Optional[int] = None
    min_p: Optional[float] = Field(None, ge=0, le=1)
    repetition_penalty: Optional[float] = Field(None, gt=0, le=MAX_REPETITION_PENALTY)
    ignore_eos: Optional[bool] = None
    stop_token_ids: Optional[list[int]] = None
    skip_special_tokens: Optional[bool] = None
    no_stop_trim: Optional[bool] = None
    min_tokens: Optional[int] = Field(None, ge=0)
    disable_speculative_decoding: Optional[bool] = None  # this request never speculates
    # Constrained decoding, as the native sampling parameters (at most one of them)
    json_schema: Optional[Union[str, dict]] = None
    regex: Optional[str] = None
    ebnf: Optional[str] = None
    response_format: Optional[ResponseFormat] = None

    @field_validator("stop", mode="before")
    @classmethod
    def _validate_stop(cls, value: Any) -> Any:
        return _check_stop(value)

    @property
    def num_choices(self) -> int:
        return self.n or 1

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_SamplingRequest):
    prompt: Union[str, list[str], list[int], list[list[int]]]
    max_tokens: Optional[int] = Field(16, ge=0)
    logprobs: Optional[int] = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: Optional[bool] = False
    suffix: Optional[str] = None
    best_of: Optional[int] = Field(None, ge=1, le=MAX_N)

    @field_validator("prompt", mode="before")
    @classmethod
    def _validate_prompt(cls, value: Any) -> Any:
        return _check_prompt(value)


class FunctionCall(BaseModel):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Lenient):
    """A message of the conversation. Content given as a list of text parts is joined into
    one string, because chat templates expect a string."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Optional[str] = None
    name: Optional[str] = None
    tool_calls: Optional[list[ToolCall]] = None  # an assistant's earlier calls
    tool_call_id: Optional[str] = None  # a tool's answer to that call

    @field_validator("content", mode="before")
    @classmethod
    def _join_text_parts(cls, value: Any) -> Any:
        if not isinstance(value, list):
            return value
        texts = []
        for part in value:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ValueError("only text content parts ({'type': 'text', 'text': ...}) are supported")
            texts.append(part["text"])
        return "\n".join(texts)

    @model_validator(mode="after")
    def _content_given(self) -> "ChatMessage":
        # As OpenAI: only an assistant's message may go without content (it may hold just calls).
        if self.content is None and self.role != "assistant":
            raise ValueError(f"a {self.role} message needs content")
        return self

    def to_template(self) -> dict:
        message = {"role": self.role, "content": self.content or ""}
        if self.name is not None:
            message["name"] = self.name
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        if self.tool_calls:
            message["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {
                        "name": call.function.name,
                        "arguments": self._template_arguments(index, call.function.arguments),
                    },
                }
                for index, call in enumerate(self.tool_calls)
            ]
        return message

    def _template_arguments(self, index: int, arguments: str) -> Any:
        """An assistant's arguments as the mapping templates read (transformers' convention); as
        upstream, arguments that are not a JSON object are an error (ValueError), and other roles'
        are passed as sent."""
        if self.role != "assistant":
            return arguments
        try:
            value = json.loads(arguments)
        except json.JSONDecodeError:
            value = None
        except RecursionError:
            raise ValueError(f"tool_calls[{index}].function.arguments nests too deeply") from None
        if not isinstance(value, dict):
            raise ValueError(
                f"tool_calls[{index}].function.arguments must be the JSON text of an object, "
                f"got {short_repr(arguments)}"
            )
        return value


class FunctionDefinition(_Lenient):
    name: str = Field(..., min_length=1)
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None  # a JSON schema of the arguments
    strict: Optional[bool] = None


class Tool(_Lenient):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class ToolChoiceFunction(_Lenient):
    name: str


class NamedToolChoice(_Lenient):
    type: Literal["function"] = "function"
    function: ToolChoiceFunction


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage] = Field(..., min_length=1)
    max_tokens: Optional[int] = Field(None, ge=0)  # deprecated by OpenAI, still sent by many clients
    max_completion_tokens: Optional[int] = Field(None, ge=0)
    logprobs: Optional[bool] = False
    top_logprobs: Optional[int] = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: Optional[list[Tool]] = None
    tool_choice: Optional[Union[Literal["none", "auto", "required"], NamedToolChoice]] = None
    parallel_tool_calls: Optional[bool] = True
    # SGLang extensions: variables the chat template reads (Qwen3's enable_thinking), and, under
    # --reasoning-parser, whether the reasoning block goes to reasoning_content (else all is content).
    chat_template_kwargs: Optional[dict[str, Any]] = None
    separate_reasoning: Optional[bool] = True

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _tool_choice_shape(cls, value: Any) -> Any:
        """One message naming the shapes allowed, not one per branch of the union."""
        if value is None or isinstance(value, str) and value in ("none", "auto", "required"):
            return value
        function = value.get("function") if isinstance(value, dict) else None
        if (
            not isinstance(function, dict)
            or not isinstance(function.get("name"), str)
            or value.get("type", "function") != "function"
        ):
            raise ValueError(
                'tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": "..."}}'
            )
        return value

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice_names_a_tool(cls, value: Any, info) -> Any:
        tools = info.data.get("tools") or []
        if value == "required" and not tools:
            raise ValueError("tool_choice 'required' needs tools")
        if isinstance(value, NamedToolChoice) and value.function.name not in {t.function.name for t in tools}:
            raise ValueError(f"tool_choice names the function '{value.function.name}', which is not in tools")
        return value

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs_needs_logprobs(cls, value: Optional[int], info) -> Optional[int]:
        if value is not None and not info.data.get("logprobs"):
            raise ValueError("top_logprobs requires logprobs to be true")
        return value

    @property
    def max_new_tokens(self) -> Optional[int]:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


# ---- responses ----------------------------------------------------------------------------


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: Optional[PromptTokensDetails] = None


class CompletionLogprobs(BaseModel):
    tokens: list[str] = Field(default_factory=list)
    # None for the first token of an echoed prompt (nothing precedes it).
    token_logprobs: list[Optional[float]] = Field(default_factory=list)
    top_logprobs: list[Optional[dict[str, float]]] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: Optional[CompletionLogprobs] = None
    finish_reason: Optional[str] = None
    matched_stop: Optional[Union[int, str]] = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo


class CompletionStreamResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Optional[UsageInfo] = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: Optional[list[int]] = None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatChoiceLogprobs(BaseModel):
    content: Optional[list[ChatTokenLogprob]] = None


class ChatCompletionMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: Optional[str] = None
    reasoning_content: Optional[str] = None  # the reasoning block, under --reasoning-parser
    tool_calls: Optional[list[ToolCall]] = None

    @model_serializer(mode="wrap")
    def _drop_no_calls(self, handler):
        # As OpenAI answers: a message without calls has no tool_calls field (nor reasoning_content
        # without reasoning).
        out = handler(self)
        for field in ("reasoning_content", "tool_calls"):
            if out.get(field) is None:
                out.pop(field, None)
        return out


class ChatCompletionChoice(BaseModel):
    index: int
    message: ChatCompletionMessage
    logprobs: Optional[ChatChoiceLogprobs] = None
    finish_reason: Optional[str] = None
    matched_stop: Optional[Union[int, str]] = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatCompletionChoice]
    usage: UsageInfo


class DeltaFunctionCall(BaseModel):
    name: Optional[str] = None
    arguments: Optional[str] = None


class DeltaToolCall(BaseModel):
    index: int
    id: Optional[str] = None
    type: Optional[Literal["function"]] = None
    function: DeltaFunctionCall

    @model_serializer(mode="wrap")
    def _drop_unset(self, handler):
        # Only the first delta of a call names it; the others carry arguments only.
        out = {key: value for key, value in handler(self).items() if value is not None}
        out["function"] = {key: value for key, value in out["function"].items() if value is not None}
        return out


class DeltaMessage(BaseModel):
    role: Optional[Literal["assistant"]] = None
    content: Optional[str] = None
    reasoning_content: Optional[str] = None
    tool_calls: Optional[list[DeltaToolCall]] = None

    @model_serializer(mode="wrap")
    def _drop_unset(self, handler):
        # A delta carries only what changed: {"role": ...} first, then {"content": ...}.
        return {key: value for key, value in handler(self).items() if value is not None}


class ChatCompletionStreamChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: Optional[ChatChoiceLogprobs] = None
    finish_reason: Optional[str] = None
    matched_stop: Optional[Union[int, str]] = None


class ChatCompletionStreamResponse(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatCompletionStreamChoice]
    usage: Optional[UsageInfo] = None
