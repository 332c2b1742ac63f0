"""`/v1/chat/completions`: OpenAI's chat API on the TokenizerManager, with the model's chat
template turning the messages into the prompt. Under --reasoning-parser the answer's reasoning
block goes to `reasoning_content`, and tool calls and JSON are read from what follows it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Optional

from jinja2 import TemplateError

from sglang.srt.entrypoints.openai.protocol import (
    ChatChoiceLogprobs,
    ChatCompletionChoice,
    ChatCompletionMessage,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionStreamChoice,
    ChatCompletionStreamResponse,
    ChatTokenLogprob,
    DeltaMessage,
    TopLogprob,
    UsageInfo,
)
from sglang.srt.entrypoints.openai.sampling import add_constraint, native_sampling_params, response_format_schema
from sglang.srt.entrypoints.openai.serving_base import (
    COMMON_PARAM_NAMES,
    OpenAIServingBase,
    Prompts,
    RequestContext,
    clamp_logprob,
    openai_finish_reason,
    output_logprobs,
)
from sglang.srt.entrypoints.openai.serving_defaults import model_sampling_defaults
from sglang.srt.entrypoints.openai.tool_calls import (
    ToolCallStream,
    check_tool_parameters,
    chosen_tools,
    forced_calls_schema,
    parse_tool_calls,
    tool_finish_reason,
    tool_mode,
)
from sglang.srt.errors import InvalidRequest
from sglang.srt.reasoning_parser import REASONING_FORMATS, ReasoningStream, request_thinks, split_reasoning

_PARAM_NAMES = {
    **COMMON_PARAM_NAMES,
    "text": "messages",
    "input_ids": "messages",
    "top_logprobs_num": "top_logprobs",
}
# Arguments of apply_chat_template that chat_template_kwargs may not set: the server sets them.
_TEMPLATE_ARGUMENTS = frozenset(
    (
        "conversation",
        "messages",
        "tools",
        "add_generation_prompt",
        "tokenize",
        "return_dict",
        "chat_template",
        "continue_final_message",
    )
)


class OpenAIServingChat(OpenAIServingBase):
    """`handle_request(ChatCompletionRequest, fastapi.Request)`. A tokenizer without a chat
    template answers 400; such a model is served by /v1/completions only."""

    id_prefix = "chatcmpl"

    def __init__(self, tokenizer_manager):
        super().__init__(tokenizer_manager)
        args = tokenizer_manager.server_args
        # What a request leaves unset and the model's generation_config.json recommends (--sampling-defaults).
        self.model_defaults = model_sampling_defaults(args.model_path, args.sampling_defaults)
        self.reasoning_format = REASONING_FORMATS.get(args.reasoning_parser)

    def build_prompts(self, request: ChatCompletionRequest) -> Prompts:
        return Prompts("input_ids", [self._render(request)])

    def _render(self, request: ChatCompletionRequest) -> list[int]:
        tokenizer = self.tokenizer_manager.tokenizer
        if not getattr(tokenizer, "chat_template", None):
            raise InvalidRequest(
                "this model's tokenizer has no chat template, so it cannot serve chat completions; use /v1/completions",
                "messages",
            )
        self.tokenizer_manager.limits.check_prompt_chars(
            sum(len(m.content or "") for m in request.messages), "messages"
        )
        check_tool_parameters(request)
        messages = _template_messages(request)
        # The tools reach the template as transformers passes them: a list of {"type": "function", ...}.
        tools = None
        if request.tools and request.tool_choice != "none":
            tools = [tool.model_dump(exclude_none=True) for tool in chosen_tools(request)]
        try:
            # Tokenized by the template call, not by encoding the rendered text: templates
            # write BOS themselves, and encoding would add a second one.
            ids = tokenizer.apply_chat_template(
                messages, tools=tools, add_generation_prompt=True, tokenize=True, **_template_kwargs(request)
            )
        except (TemplateError, ValueError, TypeError) as err:
            raise InvalidRequest(f"the chat template rejected these messages: {err}", "messages") from None
        except RecursionError:  # the template walks tool-call arguments nested a few hundred deep
            raise InvalidRequest(
                "the messages nest too deeply for the chat template (tool-call arguments hundreds of levels deep)",
                "messages",
            ) from None
        if isinstance(ids, Mapping):  # transformers 5 returns a BatchEncoding
            ids = ids["input_ids"]
        return list(ids)

    def sampling_params(self, request: ChatCompletionRequest) -> dict:
        params = {**self.model_defaults, **native_sampling_params(request, request.max_new_tokens)}
        if tool_mode(request, self.parser) == "auto" and request.skip_special_tokens is None:
            # As upstream: a model's call markers may be special tokens (Llama's <|python_tag|>),
            # which the parser must see; the stop token itself is still left out of the text.
            params["skip_special_tokens"] = False
        constraint = self._constraint(request)
        return params if constraint is None else add_constraint(params, *constraint)

    def _constraint(self, request: ChatCompletionRequest) -> Optional[tuple[str, str]]:
        """(the OpenAI field, a JSON schema) that tool_choice or response_format asks for."""
        field = self._constraint_field(request)
        if field is None:
            return None
        return field, forced_calls_schema(request) if field == "tool_choice" else response_format_schema(request)

    def _constraint_field(self, request: ChatCompletionRequest) -> Optional[str]:
        """The OpenAI field whose JSON schema constrains the output, found without building it (the
        error path names it, and must not fail on the schema that made the error)."""
        if tool_mode(request, self.parser) == "forced":
            return "tool_choice"
        response_format = request.response_format
        return "response_format" if response_format is not None and response_format.type != "text" else None

    @property
    def parser(self) -> Optional[str]:
        return self.tokenizer_manager.server_args.tool_call_parser

    def param_names(self, request: ChatCompletionRequest) -> dict:
        uses_old_name = request.max_tokens is not None and request.max_completion_tokens is None
        names = {**_PARAM_NAMES, "max_new_tokens": "max_tokens" if uses_old_name else "max_completion_tokens"}
        field = self._constraint_field(request) if request.json_schema is None else None
        if field is not None:  # the schema it made is reported under the field it came from
            names["json_schema"] = field
        return names

    def logprob_kwargs(self, request: ChatCompletionRequest) -> dict:
        if not request.logprobs:
            return {}
        return {"return_logprob": True, "top_logprobs_num": request.top_logprobs or 0}

    def generate_kwargs(self, request: ChatCompletionRequest) -> dict:
        # A request that thinks is constrained (response_format, forced tools) after its reasoning.
        return {**self.logprob_kwargs(request), "require_reasoning": self._thinks(request)}

    def _thinks(self, request: ChatCompletionRequest) -> bool:
        return request_thinks(self.tokenizer_manager.server_args.reasoning_parser, request.chat_template_kwargs)

    # ---- responses ------------------------------------------------------------------------

    def full_response(self, ctx: RequestContext, results: list[dict], usage: UsageInfo) -> dict:
        choices = []
        mode = tool_mode(ctx.request, self.parser)
        for index, result in enumerate(results):
            finish_reason, matched = openai_finish_reason(result)
            reasoning, block, content = self._split(ctx.request, result["text"])
            calls = None
            if mode is not None:
                content, calls = parse_tool_calls(content, mode, self.parser, _tool_names(ctx.request))
                finish_reason = tool_finish_reason(finish_reason, bool(calls))
                matched = None if finish_reason == "tool_calls" else matched
                calls = calls or None
            if reasoning is not None:  # the output had a block: an empty answer is no content
                content = content or None
                if ctx.request.separate_reasoning is False:
                    reasoning, content = None, block + (content or "")
            message = ChatCompletionMessage(content=content, reasoning_content=reasoning or None, tool_calls=calls)
            choices.append(
                ChatCompletionChoice(
                    index=index,
                    message=message,
                    logprobs=self._logprobs(ctx, result, 0),
                    finish_reason=finish_reason,
                    matched_stop=matched,
                )
            )
        return ChatCompletionResponse(
            id=ctx.id, created=ctx.created, model=ctx.model, choices=choices, usage=usage
        ).model_dump()

    def _split(self, request: ChatCompletionRequest, text: str) -> tuple[Optional[str], str, str]:
        """(reasoning, the block as written, the answer) of a whole output; reasoning None when
        the request does not think."""
        if not self._thinks(request):
            return None, "", text
        split = split_reasoning(text, self.reasoning_format)
        return split.reasoning, text[: split.block_end], split.answer(text)

    def stream_start(self, ctx: RequestContext) -> list[dict]:
        """OpenAI's first chunk of each choice names the role."""
        role = DeltaMessage(role="assistant", content="")
        return [
            self._chunk(ctx, ChatCompletionStreamChoice(index=index, delta=role)) for index in range(len(ctx.progress))
        ]

    def stream_chunk(
        self, ctx: RequestContext, index: int, delta: str, result: dict, token_start: int
    ) -> Optional[dict]:
        finish_reason, matched = openai_finish_reason(result)
        reasoning, block, text = None, "", result["text"]
        if self._thinks(ctx.request):
            reasoning, block, delta, text = self._reasoning_delta(ctx, index, text, finish_reason is not None)
        message = DeltaMessage(content=delta or None)
        mode = tool_mode(ctx.request, self.parser)
        if mode is not None:
            message, finish_reason = self._tool_delta(ctx, index, mode, text, finish_reason)
            matched = None if finish_reason == "tool_calls" else matched
        message.reasoning_content = reasoning
        message.content = (block + (message.content or "")) or None
        if (
            finish_reason is None
            and message.content is None
            and message.reasoning_content is None
            and not message.tool_calls
            and not ctx.request.logprobs
        ):
            return None  # the text is held back: it may be a call or a tag
        choice = ChatCompletionStreamChoice(
            index=index,
            delta=message,
            logprobs=self._logprobs(ctx, result, token_start),
            finish_reason=finish_reason,
            matched_stop=matched,
        )
        return self._chunk(ctx, choice)

    def _reasoning_delta(self, ctx: RequestContext, index: int, text: str, finished: bool):
        """(new reasoning or None, new text of the block as written for separate_reasoning false,
        new answer text, the answer so far) of a streamed choice that thinks."""
        progress = ctx.progress[index]
        if progress.reasoning_stream is None:
            progress.reasoning_stream = ReasoningStream(self.reasoning_format)
        update = progress.reasoning_stream.update(text, finished)
        if ctx.request.separate_reasoning is False:  # null: the default, reasoning apart
            return None, update.block, update.answer, update.answer_so_far
        return update.reasoning or None, "", update.answer, update.answer_so_far

    def _tool_delta(self, ctx: RequestContext, index: int, mode: str, text: str, finish_reason: Optional[str]):
        """The delta of a streamed choice whose tool calls are read from `text` (the output, or
        its answer after the reasoning block, so far): content while it cannot be a call, each
        call once it is complete, the rest when the output is."""
        progress = ctx.progress[index]
        if progress.tool_stream is None:
            progress.tool_stream = ToolCallStream(mode, self.parser, _tool_names(ctx.request))
        stream = progress.tool_stream
        if finish_reason is None:
            content, calls = stream.content_delta(text), stream.call_deltas(text)
        else:
            content, calls = stream.finish(text)
            finish_reason = tool_finish_reason(finish_reason, stream.num_calls > 0)
        return DeltaMessage(content=content, tool_calls=calls or None), finish_reason

    def usage_chunk(self, ctx: RequestContext, usage: UsageInfo) -> dict:
        return ChatCompletionStreamResponse(
            id=ctx.id, created=ctx.created, model=ctx.model, choices=[], usage=usage
        ).model_dump()

    def _chunk(self, ctx: RequestContext, choice: ChatCompletionStreamChoice) -> dict:
        return ChatCompletionStreamResponse(
            id=ctx.id, created=ctx.created, model=ctx.model, choices=[choice]
        ).model_dump()

    def _logprobs(self, ctx: RequestContext, result: dict, start: int):
        if not ctx.request.logprobs:
            return None
        tokens, tops = output_logprobs(result)
        content = []
        for position, (logprob, token_id, _) in enumerate(tokens[start:], start):
            top = tops[position] if position < len(tops) else []
            content.append(
                ChatTokenLogprob(
                    **self._entry(logprob, token_id).model_dump(),
                    top_logprobs=[self._entry(lp, tid) for lp, tid, _ in top],
                )
            )
        return ChatChoiceLogprobs(content=content)

    def _entry(self, logprob: float, token_id: int) -> TopLogprob:
        token, raw = self.token_string(token_id)
        return TopLogprob(token=token, logprob=clamp_logprob(logprob), bytes=raw)


def _template_messages(request: ChatCompletionRequest) -> list[dict]:
    messages = []
    for index, message in enumerate(request.messages):
        try:
            messages.append(message.to_template())
        except ValueError as err:
            raise InvalidRequest(f"messages[{index}].{err}", "messages") from None
    return messages


def _template_kwargs(request: ChatCompletionRequest) -> dict:
    """chat_template_kwargs, as variables of the template (Qwen3's enable_thinking)."""
    kwargs = request.chat_template_kwargs or {}
    reserved = sorted(_TEMPLATE_ARGUMENTS.intersection(kwargs))
    if reserved:
        raise InvalidRequest(
            f"chat_template_kwargs may not set {', '.join(reserved)}: the server sets it", "chat_template_kwargs"
        )
    return kwargs


def _tool_names(request: ChatCompletionRequest) -> set[str]:
    return {tool.function.name for tool in request.tools or ()}
