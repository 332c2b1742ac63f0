"""Streaming clients for the three backends: `sglang` (native /generate), `sglang-oai`
(/v1/completions) and `sglang-oai-chat` (/v1/chat/completions). Each request becomes one
`RequestResult` with its timings and the server's token counts; failures are results too."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator

import aiohttp
import orjson

from sglang.benchmark.datasets import BenchRequest

BACKENDS = ("sglang", "sglang-oai", "sglang-oai-chat")
ROUTES = {"sglang": "/generate", "sglang-oai": "/v1/completions", "sglang-oai-chat": "/v1/chat/completions"}


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

    @property
    def tpot(self) -> float | None:
        if self.output_tokens <= 1:
            return None
        return (self.latency - self.ttft) / (self.output_tokens - 1)

    def token_counts_agree(self) -> bool:
        agree = self.output_tokens == self.server_output_tokens == self.expected_output_len
        return agree and (not self.checks_prompt_len or self.prompt_tokens == self.prompt_len)


class ServerError(Exception):
    """An error answer or error event from the server."""


class BackendClient:
    """Sends BenchRequests to one server over one aiohttp session."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str, backend: str, model: str | None,
                 api_key: str | None = None):
        if backend not in BACKENDS:
            raise ValueError(f"--backend must be one of {', '.join(BACKENDS)}; got {backend!r}")
        self.session, self.backend, self.model = session, backend, model
        self.url = base_url.rstrip("/") + ROUTES[backend]
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def payload(self, request: BenchRequest) -> dict:
        if self.backend == "sglang":
            prompt_key = "text" if isinstance(request.prompt, str) else "input_ids"
            params = {"max_new_tokens": request.output_len, "temperature": 0.0, "ignore_eos": True}
            if request.simulated_accept_length is not None:
                params["simulated_accept_length"] = request.simulated_accept_length
            return {prompt_key: request.prompt, "sampling_params": params, "stream": True}
        body = {"model": self.model, "max_tokens": request.output_len, "temperature": 0.0, "ignore_eos": True,
                "stream": True, "stream_options": {"include_usage": True}}
        if self.backend == "sglang-oai":
            return {**body, "prompt": request.prompt}
        return {**body, "messages": [{"role": "user", "content": request.prompt}]}

    async def send(self, request: BenchRequest) -> RequestResult:
        sent_ids = self.backend != "sglang-oai-chat" and not isinstance(request.prompt, str)
        result = RequestResult(prompt_len=request.prompt_len, expected_output_len=request.output_len,
                               checks_prompt_len=sent_ids)
        start = time.perf_counter()
        try:
            async with self.session.post(self.url, json=self.payload(request), headers=self.headers) as response:
                if response.status != 200:
                    raise ServerError(f"HTTP {response.status}: {_error_message(await response.text())}")
                read = self._read_native if self.backend == "sglang" else self._read_openai
                await read(sse_events(response), result, start)
            result.success = True
        except ServerError as e:
            result.error = str(e)
        except (asyncio.TimeoutError, aiohttp.ClientError, ConnectionError) as e:
            result.error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        result.latency = time.perf_counter() - start
        return result

    async def _read_native(self, events: AsyncIterator[dict], result: RequestResult, start: float) -> None:
        meta = None
        async for event in events:
            num_ids = len(event.get("output_ids") or [])
            if num_ids > result.output_tokens:
                _record_chunk(result, start, num_ids - result.output_tokens)
                result.output_tokens = num_ids
            meta = event.get("meta_info") or meta
            _raise_if_aborted(meta)
        if not meta or not meta.get("finish_reason"):
            raise ServerError("the stream ended before the request finished")
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
                finished = finished or choice.get("finish_reason") is not None
        if not finished:
            raise ServerError("the stream ended before the request finished")
        if usage is None:  # a server without stream usage: one token per chunk is all we know
            usage = {"prompt_tokens": 0, "completion_tokens": len(result.chunks)}
        result.prompt_tokens = usage.get("prompt_tokens", 0)
        result.output_tokens = result.server_output_tokens = usage.get("completion_tokens", 0)
        _spread_tokens_over_chunks(result)


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


async def sse_events(response: aiohttp.ClientResponse) -> AsyncIterator[dict]:
    """The JSON events of a server-sent event stream, up to `data: [DONE]`; an error event
    raises ServerError. Events are split by hand: a native event holds all output ids so far
    and can outgrow aiohttp's line limit."""
    buffer = b""
    async for data in response.content.iter_any():
        buffer += data
        *events, buffer = buffer.split(b"\n\n")
        for raw in events:
            payload = raw.strip()
            if not payload.startswith(b"data:"):
                continue
            payload = payload[len(b"data:"):].strip()
            if payload == b"[DONE]":
                return
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
