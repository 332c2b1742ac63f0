"""What the OpenAI completions and chat endpoints share: the model check, error mapping,
running a request on the TokenizerManager (whole or streamed), usage and token strings.

Subclasses say how a request becomes prompts and sampling parameters, and how results
become choices and chunks."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import re
import time
import uuid
from typing import Any, AsyncIterator, Optional

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from sglang.srt.entrypoints.http_utils import (
    ClientDisconnected,
    cancel_on_disconnect,
    error_response,
    invalid_request_response,
    sse,
)
from sglang.srt.entrypoints.openai.protocol import MAX_SEED, PromptTokensDetails, UsageInfo
from sglang.srt.errors import ABORTED_BY_CLIENT, InvalidRequest, short_repr
from sglang.srt.managers.io_struct import GenerateReqInput

logger = logging.getLogger(__name__)
MIN_LOGPROB = -9999.0  # JSON has no -Infinity; OpenAI reports impossible tokens as -9999

# Native field names -> OpenAI's, for the fields both endpoints share.
COMMON_PARAM_NAMES = {"sampling_seed": "seed", "min_new_tokens": "min_tokens", "return_logprob": "logprobs"}


class RequestAborted(Exception):
    """The engine aborted a request after it started (its finish_reason has type "abort")."""

    def __init__(self, message: str, status_code: int):
        super().__init__(message)
        self.message = message
        self.status_code = status_code


@dataclasses.dataclass
class Prompts:
    """The prompts of one request, all given as `text` or all as `input_ids`."""

    field: str  # "text" or "input_ids"
    values: list

    def batch_kwargs(self) -> dict:
        return {self.field: self.values if len(self.values) > 1 else self.values[0]}

    def one_kwargs(self, index: int) -> dict:
        return {self.field: self.values[index]}


@dataclasses.dataclass
class ChoiceProgress:
    """How much of one streamed choice has been sent."""

    text_len: int = 0  # characters of the output text
    num_tokens: int = 0  # output tokens whose logprobs went out
    logprob_state: Any = None  # owned by the endpoint (completions: the logprobs' text offsets)
    final_meta: Optional[dict] = None  # meta_info of the finished result
    tool_stream: Any = None  # owned by the chat endpoint (tool_calls.ToolCallStream)
    reasoning_stream: Any = None  # owned by the chat endpoint (reasoning_parser.ReasoningStream)


@dataclasses.dataclass
class RequestContext:
    """One OpenAI request while it runs."""

    request: Any
    id: str
    created: int
    model: str
    num_prompts: int
    progress: list[ChoiceProgress] = dataclasses.field(default_factory=list)

    @property
    def n(self) -> int:
        return self.request.num_choices


class OpenAIServingBase:
    id_prefix = "cmpl"

    def __init__(self, tokenizer_manager):
        self.tokenizer_manager = tokenizer_manager
        self._token_strings: dict[int, tuple[str, list[int]]] = {}
        self._special_ids: Optional[frozenset] = None

    # ---- to be provided by the endpoint --------------------------------------------------

    def build_prompts(self, request) -> Prompts:
        raise NotImplementedError

    def sampling_params(self, request) -> dict:
        raise NotImplementedError

    def param_names(self, request) -> dict:
        """Native field names -> this endpoint's, for error messages."""
        raise NotImplementedError

    def logprob_kwargs(self, request) -> dict:
        raise NotImplementedError

    def generate_kwargs(self, request) -> dict:
        """The GenerateReqInput fields of a request beside its prompts and sampling parameters."""
        return self.logprob_kwargs(request)

    def full_response(self, ctx: RequestContext, results: list[dict], usage: UsageInfo) -> dict:
        raise NotImplementedError

    def stream_start(self, ctx: RequestContext) -> list[dict]:
        return []

    def stream_chunk(
        self, ctx: RequestContext, index: int, delta: str, result: dict, token_start: int
    ) -> Optional[dict]:
        """The chunk of one update, or None when it has nothing to send."""
        raise NotImplementedError

    def usage_chunk(self, ctx: RequestContext, usage: UsageInfo) -> dict:
        raise NotImplementedError

    # ---- the request ----------------------------------------------------------------------

    async def handle_request(self, request, raw_request: Request) -> Response:
        """Runs one request; a bad request is answered with a 400 naming the OpenAI field.

        A request without `model` is accepted (OpenAI requires it; SGLang is lenient)."""
        try:
            self.check_model(request.model)
            # Off the event loop: a chat template renders and tokenizes the whole conversation.
            prompts = await asyncio.get_running_loop().run_in_executor(None, self.build_prompts, request)
            params = self.sampling_params(request)
            self.tokenizer_manager.limits.check_sequences(len(prompts.values), request.num_choices)
            ctx = self._new_context(request, len(prompts.values))
            if request.stream:
                return await self._stream_response(ctx, prompts, params, raw_request)
            return await self._full_response(ctx, prompts, params, raw_request)
        except InvalidRequest as err:
            return self._invalid_request_response(err, request)
        except RequestAborted as err:
            return error_response(err.message, err.status_code)
        except ClientDisconnected:
            return Response(status_code=ABORTED_BY_CLIENT)
        except RuntimeError as err:  # the engine failed (e.g. its scheduler process died)
            logger.error("request failed: %s", err)
            return error_response(f"internal error: {err}", 500)

    def _invalid_request_response(self, err: InvalidRequest, request) -> JSONResponse:
        names = self.param_names(request)
        return invalid_request_response(with_openai_names(err, names), names)

    def check_model(self, model: Optional[str]) -> None:
        args = self.tokenizer_manager.server_args
        if model is not None and model not in (args.served_model_name, args.model_path):
            raise InvalidRequest(
                f"The model {short_repr(model)} does not exist; this server serves '{args.served_model_name}'.", "model"
            )

    def _new_context(self, request, num_prompts: int) -> RequestContext:
        return RequestContext(
            request=request,
            id=f"{self.id_prefix}-{uuid.uuid4().hex}",
            created=int(time.time()),
            model=self.tokenizer_manager.server_args.served_model_name,
            num_prompts=num_prompts,
        )

    async def _full_response(
        self, ctx: RequestContext, prompts: Prompts, params: dict, raw_request: Request
    ) -> Response:
        obj = GenerateReqInput(
            **prompts.batch_kwargs(),
            sampling_params=params,
            stream=False,
            group=ctx.id,
            **self.generate_kwargs(ctx.request),
        )
        results = await cancel_on_disconnect(_first(self.tokenizer_manager.generate_request(obj)), raw_request)
        results = results if isinstance(results, list) else [results]
        for result in results:
            raise_if_aborted(result)
        usage = usage_of([r["meta_info"] for r in results], ctx.n)
        return JSONResponse(self.full_response(ctx, results, usage))

    # ---- streaming ------------------------------------------------------------------------

    async def _stream_response(
        self, ctx: RequestContext, prompts: Prompts, params: dict, raw_request: Request
    ) -> Response:
        # The engine streams one prompt with n = 1 only, so every choice is its own request.
        agens = [self.tokenizer_manager.generate_request(obj) for obj in self._choice_requests(ctx, prompts, params)]
        merged = merge_streams(agens)
        ctx.progress = [ChoiceProgress() for _ in agens]
        try:
            # Wait for the first output before answering 200, so that a request the engine
            # rejects still gets a plain error status.
            first = await cancel_on_disconnect(merged.__anext__(), raw_request)
            raise_if_aborted(first[1])
        except BaseException:
            await merged.aclose()
            raise
        return StreamingResponse(self._sse_events(ctx, first, merged), media_type="text/event-stream")

    def _choice_requests(self, ctx: RequestContext, prompts: Prompts, params: dict) -> list[GenerateReqInput]:
        objs = []
        for prompt_index in range(ctx.num_prompts):
            for j in range(ctx.n):
                choice_params = dict(params, n=1)
                if params.get("sampling_seed") is not None:  # the engine's rule for sample j
                    choice_params["sampling_seed"] = (params["sampling_seed"] + j) % MAX_SEED
                objs.append(
                    GenerateReqInput(
                        **prompts.one_kwargs(prompt_index),
                        sampling_params=choice_params,
                        stream=True,
                        group=ctx.id,
                        **self.generate_kwargs(ctx.request),
                    )
                )
        return objs

    async def _sse_events(self, ctx: RequestContext, first: tuple, merged: AsyncIterator) -> AsyncIterator[bytes]:
        try:
            async for event in self._stream_events(ctx, first, merged):
                yield sse(event)
        except Exception as err:
            yield sse(self._error_event(ctx, err))
        finally:
            await merged.aclose()  # aborts every choice still running
        yield sse("[DONE]")

    async def _stream_events(self, ctx: RequestContext, first: tuple, merged: AsyncIterator) -> AsyncIterator[dict]:
        for event in self.stream_start(ctx):
            yield event
        for event in self._on_update(ctx, *first):
            yield event
        async for index, result in merged:
            for event in self._on_update(ctx, index, result):
                yield event
        if ctx.request.include_usage:
            yield self.usage_chunk(ctx, usage_of([p.final_meta or {} for p in ctx.progress], ctx.n))

    def _on_update(self, ctx: RequestContext, index: int, result: dict) -> list[dict]:
        """The chunk for one cumulative result of choice `index`, if it has news."""
        raise_if_aborted(result)
        progress = ctx.progress[index]
        delta = result["text"][progress.text_len :]
        token_start = progress.num_tokens
        finished = result["meta_info"].get("finish_reason") is not None
        progress.text_len = len(result["text"])
        progress.num_tokens = len(result["output_ids"])
        if finished:
            progress.final_meta = result["meta_info"]
        # A chunk without text only carries news when it brings logprobs of new tokens.
        has_new_logprobs = progress.num_tokens > token_start and bool(self.logprob_kwargs(ctx.request))
        if not delta and not finished and not has_new_logprobs:
            return []
        chunk = self.stream_chunk(ctx, index, delta, result, token_start)
        return [] if chunk is None else [chunk]

    def _error_event(self, ctx: RequestContext, err: Exception) -> dict:
        if isinstance(err, InvalidRequest):
            response = self._invalid_request_response(err, ctx.request)
        elif isinstance(err, RequestAborted):
            response = error_response(err.message, err.status_code)
        else:
            logger.exception("request %s failed while streaming", ctx.id)
            response = error_response(f"internal error: {err}", 500)
        return json.loads(response.body)

    # ---- token strings --------------------------------------------------------------------

    def special_token_ids(self) -> frozenset:
        """The tokenizer's special token ids (BOS, EOS, ...), read once."""
        if self._special_ids is None:
            self._special_ids = frozenset(getattr(self.tokenizer_manager.tokenizer, "all_special_ids", None) or ())
        return self._special_ids

    def token_string(self, token_id: int) -> tuple[str, list[int]]:
        """The token's text as OpenAI shows it, and its UTF-8 bytes. A token that is only part
        of a character shows as `bytes:\\xNN...` (OpenAI's convention), so it stays distinct."""
        cached = self._token_strings.get(token_id)
        if cached is None:
            cached = self._token_strings[token_id] = _token_string(self.tokenizer_manager.tokenizer, token_id)
        return cached


# ---- helpers -------------------------------------------------------------------------------


async def _first(agen):
    try:
        return await agen.__anext__()
    finally:
        await agen.aclose()


_DONE = object()


async def merge_streams(agens: list) -> AsyncIterator[tuple[int, Any]]:
    """Yields (source index, item) from several async generators as items arrive. Closing
    this generator cancels every source, which aborts their requests in the engine."""
    # Bounded, so a slow client holds the engine's cumulative results back instead of
    # queueing a copy of every one.
    queue: asyncio.Queue = asyncio.Queue(maxsize=len(agens))

    async def pump(index: int, agen) -> None:
        try:
            async for item in agen:
                await queue.put((index, item))
            await queue.put((index, _DONE))
        except Exception as err:
            await queue.put((index, err))
        finally:
            await agen.aclose()

    tasks = [asyncio.create_task(pump(i, agen)) for i, agen in enumerate(agens)]
    try:
        running = len(tasks)
        while running:
            index, item = await queue.get()
            if item is _DONE:
                running -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def with_openai_names(err: InvalidRequest, names: dict) -> InvalidRequest:
    """`err` with the native field names its message mentions in the endpoint's terms: the field
    at fault, and the others a rule names ("must be in [0, max_new_tokens=3]"). Only names with an
    underscore are rewritten beside the field at fault, so prose such as "the text" stays as it is."""
    renamed = {native: name for native, name in names.items() if native == err.param or "_" in native}
    if not renamed:
        return err
    pattern = "|".join(re.escape(native) for native in sorted(renamed, key=len, reverse=True))
    message = re.sub(rf"(?<![\w.])({pattern})(?!\w)", lambda match: renamed[match.group(1)], err.message)
    return InvalidRequest(message, err.param, err.status_code)


def raise_if_aborted(result: dict) -> None:
    """An abort the engine decided (a 400 / 500 / 503) is an error; one a client asked for
    (POST /abort_request) is a finish, `finish_reason: "abort"`, as upstream."""
    reason = result["meta_info"].get("finish_reason")
    if reason is not None and reason.get("type") == "abort" and reason.get("status_code") != ABORTED_BY_CLIENT:
        if reason.get("param"):  # a field at fault (a grammar that does not compile): named in OpenAI's terms
            raise InvalidRequest(
                reason.get("message", "the request was aborted"), reason["param"], reason.get("status_code", 400)
            )
        raise RequestAborted(reason.get("message", "the request was aborted"), reason.get("status_code", 500))


def openai_finish_reason(result: dict) -> tuple[Optional[str], Any]:
    """(OpenAI finish_reason, the stop token or string that matched)."""
    reason = result["meta_info"].get("finish_reason")
    if reason is None:
        return None, None
    if reason["type"] == "stop":
        return "stop", reason.get("matched")
    return reason["type"], None


def usage_of(metas: list[dict], n: int) -> UsageInfo:
    """Usage of results ordered prompt-major; each prompt's tokens count once, as OpenAI does."""
    firsts = metas[::n]
    prompt_tokens = sum(m.get("prompt_tokens", 0) for m in firsts)
    completion_tokens = sum(m.get("completion_tokens", 0) for m in metas)
    cached = sum(m.get("cached_tokens") or 0 for m in firsts)
    return UsageInfo(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached),
    )


def output_logprobs(result: dict) -> tuple[list, list]:
    """(output_token_logprobs, output_top_logprobs) of a result: [(logprob, token_id, _)] per
    output token, and a list of such per output token."""
    meta = result["meta_info"]
    tokens = meta.get("output_token_logprobs", result.get("output_token_logprobs")) or []
    tops = meta.get("output_top_logprobs", result.get("output_top_logprobs")) or []
    return tokens, tops


def clamp_logprob(logprob: float) -> float:
    return max(float(logprob), MIN_LOGPROB)


def _byte_level_alphabet() -> dict[str, int]:
    """Byte-level BPE writes each byte as a printable character; this maps them back."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, shifted = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[chr(byte)] = byte
        else:
            chars[chr(256 + shifted)] = byte
            shifted += 1
    return chars


_BYTE_LEVEL = _byte_level_alphabet()


def _token_bytes(tokenizer, token_id: int, text: str) -> bytes:
    if "\ufffd" not in text:
        return text.encode("utf-8")
    piece = tokenizer.convert_ids_to_tokens(token_id)
    if isinstance(piece, str) and len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        return bytes([int(piece[3:5], 16)])  # SentencePiece byte fallback
    if isinstance(piece, str) and piece and all(c in _BYTE_LEVEL for c in piece):
        return bytes(_BYTE_LEVEL[c] for c in piece)
    return text.encode("utf-8")


def _token_string(tokenizer, token_id: int) -> tuple[str, list[int]]:
    text = tokenizer.decode([token_id], skip_special_tokens=False)
    raw = _token_bytes(tokenizer, token_id, text)
    try:
        return raw.decode("utf-8"), list(raw)
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw), list(raw)
