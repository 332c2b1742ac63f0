"""`/v1/completions`: OpenAI's text completion API on the TokenizerManager."""

from __future__ import annotations

import codecs
from typing import Optional

from sglang.srt.entrypoints.openai.protocol import (
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    CompletionStreamResponse,
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
from sglang.srt.errors import InvalidRequest

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions

_PARAM_NAMES = {
    **COMMON_PARAM_NAMES,
    "max_new_tokens": "max_tokens",
    "text": "prompt",
    "input_ids": "prompt",
    "top_logprobs_num": "logprobs",
}


class OpenAIServingCompletion(OpenAIServingBase):
    """`handle_request(CompletionRequest, fastapi.Request)`. A list of prompts gives
    len(prompts) * n choices, prompt-major, as OpenAI does."""

    id_prefix = "cmpl"

    def build_prompts(self, request: CompletionRequest) -> Prompts:
        _reject_unsupported(request)
        return _prompts(request.prompt)

    def sampling_params(self, request: CompletionRequest) -> dict:
        max_tokens = DEFAULT_MAX_TOKENS if request.max_tokens is None else request.max_tokens
        params = native_sampling_params(request, max_tokens)
        schema = response_format_schema(request)
        return params if schema is None else add_constraint(params, "response_format", schema)

    def param_names(self, request: CompletionRequest) -> dict:
        if request.response_format is not None and request.json_schema is None:
            return {**_PARAM_NAMES, "json_schema": "response_format"}
        return _PARAM_NAMES

    def logprob_kwargs(self, request: CompletionRequest) -> dict:
        if request.logprobs is None:
            return {}
        # With echo, the prompt's tokens are scored too (from position 0).
        return {
            "return_logprob": True,
            "top_logprobs_num": request.logprobs,
            **({"logprob_start_len": 0} if request.echo else {}),
        }

    # ---- responses ------------------------------------------------------------------------

    def full_response(self, ctx: RequestContext, results: list[dict], usage: UsageInfo) -> dict:
        choices = []
        for index, result in enumerate(results):
            echo = self._echo_text(ctx, index)
            logprobs = self._logprobs(ctx, result, 0, TextOffsets(), echo)
            choices.append(_choice(index, (echo or "") + result["text"], result, logprobs))
        return CompletionResponse(
            id=ctx.id, created=ctx.created, model=ctx.model, choices=choices, usage=usage
        ).model_dump()

    def stream_chunk(self, ctx: RequestContext, index: int, delta: str, result: dict, token_start: int) -> dict:
        progress = ctx.progress[index]
        echo = None
        if progress.logprob_state is None:  # the choice's first chunk: with echo, the prompt leads it
            progress.logprob_state = TextOffsets()
            echo = self._echo_text(ctx, index)
        logprobs = self._logprobs(ctx, result, token_start, progress.logprob_state, echo)
        return CompletionStreamResponse(
            id=ctx.id,
            created=ctx.created,
            model=ctx.model,
            choices=[_choice(index, (echo or "") + delta, result, logprobs)],
        ).model_dump()

    def usage_chunk(self, ctx: RequestContext, usage: UsageInfo) -> dict:
        return CompletionStreamResponse(
            id=ctx.id, created=ctx.created, model=ctx.model, choices=[], usage=usage
        ).model_dump()

    def _echo_text(self, ctx: RequestContext, index: int):
        """The prompt of choice `index` as echoed (as given, or the decoded token ids), or None
        without echo."""
        if not ctx.request.echo:
            return None
        prompts = _prompts(ctx.request.prompt)
        prompt = prompts.values[index // ctx.n]  # choices are prompt-major
        return prompt if prompts.field == "text" else self.tokenizer_manager.tokenizer.decode(prompt)

    def _logprobs(
        self, ctx: RequestContext, result: dict, start: int, offsets: TextOffsets, echo: Optional[str] = None
    ):
        """Logprobs of the output tokens from `start` on, after the prompt's when `echo` (the
        echoed prompt text) is given; `offsets` continues across calls."""
        if ctx.request.logprobs is None:
            return None
        logprobs = CompletionLogprobs()
        if echo is not None:
            meta = result["meta_info"]
            tops = meta.get("input_top_logprobs") or []
            special = self.special_token_ids()
            for position, (logprob, token_id, _) in enumerate(meta.get("input_token_logprobs") or []):
                # A special token the tokenizer added (a BOS) is not in the echoed text: it takes no
                # characters there, so the offsets after it still index the text.
                added = token_id in special and not echo.startswith(self.token_string(token_id)[0], offsets.num_chars)
                self._add_entry(
                    logprobs,
                    offsets,
                    token_id,
                    logprob,
                    tops[position] if position < len(tops) else [],
                    width=not added,
                )
        tokens, tops = output_logprobs(result)
        for position, (logprob, token_id, _) in enumerate(tokens[start:], start):
            self._add_entry(logprobs, offsets, token_id, logprob, tops[position] if position < len(tops) else [])
        return logprobs

    def _add_entry(
        self, logprobs: CompletionLogprobs, offsets: TextOffsets, token_id: int, logprob, top, width: bool = True
    ) -> None:
        token, raw = self.token_string(token_id)
        logprobs.tokens.append(token)
        logprobs.text_offset.append(offsets.next(raw if width else []))
        if logprob is None:  # a prompt's first token: nothing precedes it
            logprobs.token_logprobs.append(None)
            logprobs.top_logprobs.append(None)
            return
        logprobs.token_logprobs.append(clamp_logprob(logprob))
        logprobs.top_logprobs.append(self._top_dict(top or [], token, logprob))

    def _top_dict(self, top: list, token: str, logprob: float) -> dict[str, float]:
        # OpenAI lists the sampled token among the top ones even when it was not among them.
        entries = {self.token_string(top_id)[0]: clamp_logprob(top_logprob) for top_logprob, top_id, _ in top}
        entries.setdefault(token, clamp_logprob(logprob))
        return entries


class TextOffsets:
    """Where each token starts in the choice's text (with echo, the prompt's tokens come first).
    The tokens' bytes are decoded incrementally, so a character split over several tokens counts
    once, at the token that starts it."""

    def __init__(self):
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.num_chars = 0

    def next(self, token_bytes: list[int]) -> int:
        """The offset of a token of these bytes (none: a token not in the text), and moves past it."""
        offset = self.num_chars
        self.num_chars += len(self.decoder.decode(bytes(token_bytes)))
        return offset


def _choice(index: int, text: str, result: dict, logprobs) -> CompletionChoice:
    finish_reason, matched = openai_finish_reason(result)
    return CompletionChoice(
        index=index, text=text, logprobs=logprobs, finish_reason=finish_reason, matched_stop=matched
    )


def _prompts(prompt) -> Prompts:
    if isinstance(prompt, str):
        return Prompts("text", [prompt])
    if not prompt:
        raise InvalidRequest("prompt must not be empty", "prompt")
    if isinstance(prompt[0], str):
        return Prompts("text", prompt)
    if isinstance(prompt[0], int):
        return Prompts("input_ids", [prompt])
    return Prompts("input_ids", prompt)


def _reject_unsupported(request: CompletionRequest) -> None:
    if request.suffix:
        raise InvalidRequest("suffix is not supported by this server", "suffix")
    if request.best_of is not None and request.best_of != request.num_choices:
        raise InvalidRequest("best_of is not supported by this server (only best_of == n)", "best_of")
