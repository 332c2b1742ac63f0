"""Clients for the three routes: native /generate (`sglang`), /v1/completions (`sglang-oai`)
and /v1/chat/completions (`sglang-oai-chat`), streamed or not, under upstream's backend names.
Each request becomes one `RequestResult` with its timings and the server's token counts;
failures are results too."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator

import aiohttp
import orjson

from sglang.benchmark.datasets import BenchRequest

# Upstream's backend names for the routes we speak; the other engines' names send the same
# requests as upstream's client does for them.
BACKEND_ROUTES = {
    "sglang": "native",
    "sglang-native": "native",
    "sglang-oai": "completions",
    "vllm": "completions",
    "lmdeploy": "completions",
    "sglang-oai-chat": "chat",
    "vllm-chat": "chat",
    "lmdeploy-chat": "chat",
}
BACKENDS = tuple(BACKEND_ROUTES)
ROUTES = {"native": "/generate", "completions": "/v1/completions", "chat": "/v1/chat/completions"}


@dataclasses.dataclass(frozen=True)
class RequestOptions:
    """How every request of a run is sent (upstream's --disable-stream, --disable-ignore-eos,
    --temperature, --top-p, --extra-request-body, --header)."""

    stream: bool = True
    ignore_eos: bool = True
    temperature: float = 0.0
    top_p: float | None = None  # None: not sent
    extra_body: dict = dataclasses.field(default_factory=dict)  # merged into the JSON body last
    headers: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class RequestResult:
    success: bool = False
    error: str = ""
    latency: float = 0.0  # seconds from sending to the last byte (or the failure)
    ttft: float = 0.0  # seconds to the first chunk with output
    prompt_len: int = 0  # what was sent, by the client's tokenizer
    expected_output_len: int = 0  # max_new_tokens (with ignore_eos: exactly what must come)
    prompt_tokens: int = 0  # as the server reports them
    output_tokens: int = 0  # as the client counted them (native: output ids streamed)
    server_output_tokens: int = 0  # the server's completion_tokens
    # (perf_counter time, new tokens) per chunk with output; OpenAI chunks carry text only, so
    # their token counts are spread evenly over the chunks once the usage is known.
    chunks: list[tuple[float, float]] = dataclasses.field(default_factory=list)
    itl: list[float] = dataclasses.field(default_factory=list)  # seconds per token between chunks
    spec_verify_ct: int | None = None  # verify steps, when the server speculates
    checks_prompt_len: bool = False  # the prompt was token ids the server counts as sent
    exact_output_len: bool = True  # ignore_eos: the server must generate exactly max tokens
    start: float = 0.0  # perf_counter time the request was sent
    generated_text: str = ""

    @property
    def tpot(self) -> float | None:
        if self.output_tokens <= 1:
            return None
        return (self.latency - self.ttft) / (self.output_tokens - 1)

    def token_counts_agree(self) -> bool:
        agree = self.output_tokens == self.server_output_tokens
        if self.exact_output_len:
            agree = agree and self.output_tokens == self.expected_output_len
        else:
            agree = agree and self.output_tokens <= self.expected_output_len
        return agree and (not self.checks_prompt_len or self.prompt_tokens == self.prompt_len)


class ServerError(Exception):
    """An error answer or error event from the server."""


class BackendClient:
    """Sends BenchRequests to one server over one aiohttp session."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        backend: str,
        model: str | None,
        api_key: str | None = None,
        options: RequestOptions | None = None,
    ):
        if backend not in BACKEND_ROUTES:
            raise ValueError(f"--backend must be one of {', '.join(BACKENDS)}; got {backend!r}")
        self.session, self.backend, self.model = session, backend, model
        self.route = BACKEND_ROUTES[backend]
        self.options = options or RequestOptions()
        self.url = base_url.rstrip("/") + ROUTES[self.route]
        self.headers = {**({"Authorization": f"Bearer {api_key}"} if api_key else {}), **self.options.headers}

    def payload(self, request: BenchRequest) -> dict:
        options = self.options
        sampling = {"temperature": options.temperature, "ignore_eos": options.ignore_eos}
        if options.top_p is not None:
            sampling["top_p"] = options.top_p
        if self.route == "native":
            prompt_key = "text" if isinstance(request.prompt, str) else "input_ids"
            params = {"max_new_tokens": request.output_len, **sampling}
            if request.simulated_accept_length is not None:
                params["simulated_accept_length"] = request.simulated_accept_length
            extra = dict(options.extra_body)
            params.update(extra.pop("sampling_params", None) or {})
            return {prompt_key: request.prompt, "sampling_params": params, "stream": options.stream, **extra}
        body = {"model": self.model, "max_tokens": request.output_len, **sampling, "stream": options.stream}
        if options.stream:
            body["stream_options"] = {"include_usage": True}
        if self.route == "completions":
            body["prompt"] = request.prompt
        else:
            body["messages"] = [{"role": "user", "content": request.prompt}]
        return {**body, **options.extra_body}

    async def send(self, request: BenchRequest) -> RequestResult:
        sent_ids = self.route != "chat" and not isinstance(request.prompt, str)
        result = RequestResult(
            prompt_len=request.prompt_len,
            expected_output_len=request.output_len,
            checks_prompt_len=sent_ids,
            exact_output_len=self.options.ignore_eos,
        )
        start = result.start = time.perf_counter()
        stream = StreamState()
        try:
            async with self.session.post(self.url, json=self.payload(request), headers=self.headers) as response:
                if response.status != 200:
                    raise ServerError(f"HTTP {response.status}: {_error_message(await response.text())}")
                if not self.options.stream:
                    _read_whole(self.route, await _json_body(response), result, start)
                elif self.route == "native":
                    await self._read_native(sse_events(response, stream), result, start)
                else:
                    await self._read_openai(sse_events(response, stream), result, start)
            result.success = True
        except StreamEnded as e:
            # Few kinds of message, so that failures group: how the stream ended, and whether tokens came.
            ending = "[DONE] came" if stream.done else "the body ended without [DONE]"
            result.error = (
                f"{e}: {ending} after {'some' if _tokens_so_far(result) else 'no'} tokens "
                f"({'one event' if stream.events == 1 else 'no events' if not stream.events else 'events'})"
            )
        except ServerError as e:
            result.error = str(e)
        except (asyncio.TimeoutError, aiohttp.ClientError, ConnectionError) as e:
            result.error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        result.latency = time.perf_counter() - start
        if result.success and not self.options.stream:
            result.ttft = result.latency  # the whole answer is the first chunk
        return result

    async def _read_native(self, events: AsyncIterator[dict], result: RequestResult, start: float) -> None:
        meta = None
        async for event in events:
            num_ids = len(event.get("output_ids") or [])
            if num_ids > result.output_tokens:
                _record_chunk(result, start, num_ids - result.output_tokens)
                result.output_tokens = num_ids
            meta = event.get("meta_info") or meta
            result.generated_text = event.get("text", result.generated_text)
            _raise_if_aborted(meta)
        if not meta or not meta.get("finish_reason"):
            raise StreamEnded("the stream ended before the request finished")
        result.prompt_tokens = meta.get("prompt_tokens", 0)
        result.server_output_tokens = meta.get("completion_tokens", 0)
        result.spec_verify_ct = meta.get("spec_verify_ct")

    async def _read_openai(self, events: AsyncIterator[dict], result: RequestResult, start: float) -> None:
        usage, finished = None, False
        async for event in events:
            usage = event.get("usage") or usage
            for choice in event.get("choices") or []:
                text = choice.get("text") if "text" in choice else (choice.get("delta") or {}).get("content")
                if text:
                    _record_chunk(result, start, 1)
                    result.generated_text += text
                finished = finished or choice.get("finish_reason") is not None
        if not finished:
            raise StreamEnded("the stream ended before the request finished")
        if usage is None:  # a server without stream usage: one token per chunk is all we know
            usage = {"prompt_tokens": 0, "completion_tokens": len(result.chunks)}
        result.prompt_tokens = usage.get("prompt_tokens", 0)
        result.output_tokens = result.server_output_tokens = usage.get("completion_tokens", 0)
        _spread_tokens_over_chunks(result)


async def _json_body(response: aiohttp.ClientResponse) -> dict:
    try:
        body = _parse_event(await response.read())
    except ServerError:
        raise ServerError("the server's answer is not JSON") from None
    if "error" in body:
        raise ServerError(_error_message(json.dumps(body)))
    return body


def _read_whole(route: str, body: dict, result: RequestResult, start: float) -> None:
    """A non-streamed answer (--disable-stream): all tokens arrive at once, so the TTFT is the
    whole latency and there is no ITL, as in upstream."""
    if route == "native":
        meta = body.get("meta_info") or {}
        _raise_if_aborted(meta)
        if not meta.get("finish_reason"):
            raise ServerError("the answer has no finish reason")
        result.generated_text = body.get("text") or ""
        output_tokens = len(body.get("output_ids") or [])
        result.prompt_tokens = meta.get("prompt_tokens", 0)
        result.server_output_tokens = meta.get("completion_tokens", 0)
        result.spec_verify_ct = meta.get("spec_verify_ct")
    else:
        choice = (body.get("choices") or [{}])[0]
        if choice.get("finish_reason") is None:
            raise ServerError("the answer has no finish reason")
        result.generated_text = choice.get("text") or (choice.get("message") or {}).get("content") or ""
        usage = body.get("usage") or {}
        result.prompt_tokens = usage.get("prompt_tokens", 0)
        output_tokens = result.server_output_tokens = usage.get("completion_tokens", 0)
    if output_tokens:
        _record_chunk(result, start, output_tokens)
    result.output_tokens = output_tokens


def _record_chunk(result: RequestResult, start: float, num_tokens: float) -> None:
    now = time.perf_counter()
    if not result.chunks:
        result.ttft = now - start
    else:
        result.itl.extend([(now - result.chunks[-1][0]) / num_tokens] * int(num_tokens))
    result.chunks.append((now, num_tokens))


def _spread_tokens_over_chunks(result: RequestResult) -> None:
    """OpenAI chunks hold text, and a chunk may hold several tokens (partial characters wait
    for the next token): assume the first chunk holds one and the rest share the others evenly."""
    if not result.chunks:
        return
    later = len(result.chunks) - 1
    per_chunk = (result.output_tokens - 1) / later if later else 0.0
    result.chunks = [(result.chunks[0][0], 1.0)] + [(t, per_chunk) for t, _ in result.chunks[1:]]
    times = [t for t, _ in result.chunks]
    result.itl = [(b - a) / per_chunk for a, b in zip(times, times[1:])] if per_chunk > 0 else []


def _raise_if_aborted(meta: dict | None) -> None:
    reason = (meta or {}).get("finish_reason") or {}
    if reason.get("type") == "abort":
        raise ServerError(f"aborted by the server: {reason.get('message', 'no reason given')}")


@dataclasses.dataclass
class StreamState:
    """What a stream delivered, for the error when it ends early."""

    events: int = 0
    done: bool = False  # `data: [DONE]` came (else the body just ended)


class StreamEnded(ServerError):
    """A stream ended before its request's finish reason arrived."""


def _tokens_so_far(result: RequestResult) -> int:
    return max(result.output_tokens, len(result.chunks))


async def sse_events(response: aiohttp.ClientResponse, state: StreamState | None = None) -> AsyncIterator[dict]:
    """The JSON events of a server-sent event stream, up to `data: [DONE]`; an error event
    raises ServerError. Events are split by hand: a native event holds all output ids so far
    and can outgrow aiohttp's line limit. `state` counts the events and notes the [DONE]."""
    state = state if state is not None else StreamState()
    buffer = b""
    async for data in response.content.iter_any():
        buffer += data
        *events, buffer = buffer.split(b"\n\n")
        for raw in events:
            payload = raw.strip()
            if not payload.startswith(b"data:"):
                continue
            payload = payload[len(b"data:") :].strip()
            if payload == b"[DONE]":
                state.done = True
                return
            state.events += 1
            event = _parse_event(payload)
            if "error" in event:
                raise ServerError(_error_message(json.dumps(event)))
            yield event


def _parse_event(payload: bytes) -> dict:
    """orjson first (the client parses every chunk, and at high concurrency its own CPU can set
    the pace); the standard library for what orjson refuses but Python's JSON takes (NaN)."""
    try:
        return orjson.loads(payload)
    except ValueError:
        pass
    try:
        return json.loads(payload)
    except ValueError:
        raise ServerError(f"malformed event from the server: {payload[:200]!r}") from None


def _error_message(body: str) -> str:
    try:
        error = json.loads(body).get("error")
    except (json.JSONDecodeError, AttributeError):
        error = None
    if isinstance(error, dict):
        return error.get("message", body)
    return body.strip()[:300] or "no body"
