"""`/v1/chat/completions`: OpenAI's chat API on the TokenizerManager, with the model's chat
template turning the messages into the prompt."""

from __future__ import annotations

from collections.abc import Mapping

from jinja2 import TemplateError

from sglang.srt.entrypoints.openai.protocol import (
    ChatChoiceLogprobs, ChatCompletionChoice, ChatCompletionMessage, ChatCompletionRequest,
    ChatCompletionResponse, ChatCompletionStreamChoice, ChatCompletionStreamResponse, ChatTokenLogprob,
    DeltaMessage, TopLogprob, UsageInfo,
)
from sglang.srt.entrypoints.openai.serving_base import (
    COMMON_PARAM_NAMES, OpenAIServingBase, Prompts, RequestContext, clamp_logprob, native_sampling_params,
    openai_finish_reason, output_logprobs,
)
from sglang.srt.errors import InvalidRequest

_PARAM_NAMES = {
    **COMMON_PARAM_NAMES,
    "text": "messages",
    "input_ids": "messages",
    "top_logprobs_num": "top_logprobs",
}


class OpenAIServingChat(OpenAIServingBase):
    """`handle_request(ChatCompletionRequest, fastapi.Request)`. A tokenizer without a chat
    template answers 400; such a model is served by /v1/completions only."""

    id_prefix = "chatcmpl"

    def build_prompts(self, request: ChatCompletionRequest) -> Prompts:
        return Prompts("input_ids", [self._render(request)])

    def _render(self, request: ChatCompletionRequest) -> list[int]:
        tokenizer = self.tokenizer_manager.tokenizer
        if not getattr(tokenizer, "chat_template", None):
            raise InvalidRequest("this model's tokenizer has no chat template, so it cannot serve chat "
                                 "completions; use /v1/completions", "messages")
        self.tokenizer_manager.limits.check_prompt_chars(sum(len(m.content or "") for m in request.messages),
                                                         "messages")
        messages = [message.to_template() for message in request.messages]
        try:
            # Tokenized by the template call, not by encoding the rendered text: templates
            # write BOS themselves, and encoding would add a second one.
            ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        except (TemplateError, ValueError, TypeError) as err:
            raise InvalidRequest(f"the chat template rejected these messages: {err}", "messages") from None
        if isinstance(ids, Mapping):  # transformers 5 returns a BatchEncoding
            ids = ids["input_ids"]
        return list(ids)

    def sampling_params(self, request: ChatCompletionRequest) -> dict:
        return native_sampling_params(request, request.max_new_tokens)

    def param_names(self, request: ChatCompletionRequest) -> dict:
        uses_old_name = request.max_tokens is not None and request.max_completion_tokens is None
        return {**_PARAM_NAMES, "max_new_tokens": "max_tokens" if uses_old_name else "max_completion_tokens"}

    def logprob_kwargs(self, request: ChatCompletionRequest) -> dict:
        if not request.logprobs:
            return {}
        return {"return_logprob": True, "top_logprobs_num": request.top_logprobs or 0}

    # ---- responses ------------------------------------------------------------------------

    def full_response(self, ctx: RequestContext, results: list[dict], usage: UsageInfo) -> dict:
        choices = []
        for index, result in enumerate(results):
            finish_reason, matched = openai_finish_reason(result)
            choices.append(ChatCompletionChoice(
                index=index, message=ChatCompletionMessage(content=result["text"]),
                logprobs=self._logprobs(ctx, result, 0), finish_reason=finish_reason, matched_stop=matched,
            ))
        return ChatCompletionResponse(id=ctx.id, created=ctx.created, model=ctx.model, choices=choices,
                                      usage=usage).model_dump()

    def stream_start(self, ctx: RequestContext) -> list[dict]:
        """OpenAI's first chunk of each choice names the role."""
        role = DeltaMessage(role="assistant", content="")
        return [self._chunk(ctx, ChatCompletionStreamChoice(index=index, delta=role)) for index in range(len(ctx.progress))]

    def stream_chunk(self, ctx: RequestContext, index: int, delta: str, result: dict, token_start: int) -> dict:
        finish_reason, matched = openai_finish_reason(result)
        choice = ChatCompletionStreamChoice(
            index=index, delta=DeltaMessage(content=delta or None),
            logprobs=self._logprobs(ctx, result, token_start), finish_reason=finish_reason, matched_stop=matched,
        )
        return self._chunk(ctx, choice)

    def usage_chunk(self, ctx: RequestContext, usage: UsageInfo) -> dict:
        return ChatCompletionStreamResponse(id=ctx.id, created=ctx.created, model=ctx.model, choices=[],
                                            usage=usage).model_dump()

    def _chunk(self, ctx: RequestContext, choice: ChatCompletionStreamChoice) -> dict:
        return ChatCompletionStreamResponse(id=ctx.id, created=ctx.created, model=ctx.model,
                                            choices=[choice]).model_dump()

    def _logprobs(self, ctx: RequestContext, result: dict, start: int):
        if not ctx.request.logprobs:
            return None
        tokens, tops = output_logprobs(result)
        content = []
        for position, (logprob, token_id, _) in enumerate(tokens[start:], start):
            top = tops[position] if position < len(tops) else []
            content.append(ChatTokenLogprob(**self._entry(logprob, token_id).model_dump(),
                                            top_logprobs=[self._entry(lp, tid) for lp, tid, _ in top]))
        return ChatChoiceLogprobs(content=content)

    def _entry(self, logprob: float, token_id: int) -> TopLogprob:
        token, raw = self.token_string(token_id)
        return TopLogprob(token=token, logprob=clamp_logprob(logprob), bytes=raw)
