"""Helpers shared by the HTTP routes: OpenAI-style error responses, disconnect-aware waiting,
server-sent events."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from typing import Any, AsyncIterator, Awaitable, Callable, Optional

import orjson
from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

from sglang.srt.errors import InvalidRequest

DISCONNECT_POLL_S = 0.5

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                405: "method_not_allowed", 413: "request_too_large", 503: "service_unavailable",
                500: "internal_server_error"}


def error_response(message: str, status_code: int = 400, param: Optional[str] = None) -> JSONResponse:
    body = {"error": {"message": message, "type": _ERROR_TYPES.get(status_code, "error"),
                      "param": param, "code": status_code}}
    return JSONResponse(body, status_code=status_code)


def invalid_request_response(err: InvalidRequest, param_names: Optional[dict] = None) -> JSONResponse:
    """`param_names` maps native field names to the front end's (e.g. max_new_tokens -> max_tokens)."""
    param = (param_names or {}).get(err.param, err.param)
    message = err.message
    if param != err.param and err.param:
        # Whole words only: the native name "text" must not turn "context" into "conprompt".
        message = re.sub(rf"(?<![\w.]){re.escape(err.param)}(?!\w)", lambda _: param, message)
    return error_response(message, err.status_code, param)


async def parse_json_body(raw_request: Request, model_cls: type[BaseModel], max_bytes: int,
                          check: Optional[Callable[[dict], None]] = None) -> BaseModel:
    """The body as `model_cls`, whatever the Content-Type (curl -d sends form encoding);
    raises InvalidRequest naming the field at fault (413 past `max_bytes`). `check` sees the
    parsed object first."""
    data = await read_json_object(raw_request, max_bytes)
    if check is not None:
        check(data)
    try:
        return model_cls.model_validate(data)
    except ValidationError as e:
        raise validation_error_to_invalid_request(e) from None


async def read_json_object(raw_request: Request, max_bytes: int) -> dict:
    raw = await read_body(raw_request, max_bytes)
    try:
        data = json.loads(raw) if raw.strip() else None
    except RecursionError:
        raise InvalidRequest("the request body nests arrays or objects too deeply", "body") from None
    except ValueError as e:  # not JSON, not UTF-8, or an integer of thousands of digits
        raise InvalidRequest(f"the request body is not valid JSON: {_short(str(e))}", "body") from None
    if not isinstance(data, dict):
        raise InvalidRequest("the request body must be a JSON object", "body")
    if _MAYBE_SURROGATE.search(raw):
        check_no_lone_surrogates(data)
    return data


async def read_body(raw_request: Request, max_bytes: int) -> bytes:
    """The whole body, or InvalidRequest 413 past `max_bytes`. A body too large is still read
    to its end (and dropped), so that the client gets the 413 instead of a broken connection."""
    declared = raw_request.headers.get("content-length", "")
    too_large = declared.isdigit() and int(declared) > max_bytes
    chunks, size = [], 0
    async for chunk in raw_request.stream():
        size += len(chunk)
        too_large = too_large or size > max_bytes
        if not too_large:
            chunks.append(chunk)
    if too_large:
        raise InvalidRequest(f"the request body is larger than the server takes ({max_bytes} bytes, "
                             f"--max-payload-size)", "body", status_code=413)
    return b"".join(chunks)


# A lone surrogate reaches a parsed string only through a \uD800-\uDFFF escape or the raw bytes
# that would encode one (Python's JSON decoder lets those through); a body without either needs no walk.
_MAYBE_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def check_no_lone_surrogates(data: Any) -> None:
    """Raises InvalidRequest naming the first string (or key) that holds a lone surrogate: UTF-8
    cannot encode it, so neither the tokenizer nor the response could."""
    stack = [(data, ())]
    while stack:
        value, path = stack.pop()
        if isinstance(value, str):
            if _SURROGATE.search(value):
                where = ".".join(map(str, path)) or "body"
                raise InvalidRequest(f"{where} holds a lone surrogate code point, which is not valid Unicode",
                                     str(path[0]) if path else "body")
        elif isinstance(value, dict):
            stack.extend((key, path) for key in value if isinstance(key, str))
            stack.extend((item, path + (key,)) for key, item in value.items() if isinstance(item, (str, list, dict)))
        elif isinstance(value, list):
            stack.extend((item, path + (i,)) for i, item in enumerate(value) if isinstance(item, (str, list, dict)))


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def validation_error_to_invalid_request(exc: ValidationError) -> InvalidRequest:
    err = exc.errors()[0]
    loc = [str(part) for part in err.get("loc", ()) if not isinstance(part, int)]
    # Union members show up in loc as type names; the field is the first element.
    param = loc[0] if loc else None
    where = ".".join(str(part) for part in err.get("loc", ())) or "body"
    return InvalidRequest(f"{where}: {err.get('msg', 'invalid value')}", param)


def redact_query_strings(record: logging.LogRecord) -> bool:
    """A logging filter for uvicorn's access log: a query string is logged as `?<redacted>`, so a
    key that a client put in a URL does not land in the log."""
    args = record.args
    if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str) and "?" in args[2]:
        record.args = (*args[:2], args[2].split("?", 1)[0] + "?<redacted>", *args[3:])
    return True


class ClientDisconnected(Exception):
    pass


async def cancel_on_disconnect(awaitable: Awaitable, raw_request: Request) -> Any:
    """Awaits `awaitable`, cancelling it (which aborts its requests) if the client goes away."""
    task = asyncio.ensure_future(awaitable)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await raw_request.is_disconnected():
                raise ClientDisconnected()
    finally:
        if not task.done():
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass


_SSE_JSON_OPTIONS = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY


def sse(data: Any) -> bytes:
    """One server-sent event carrying `data` as JSON (or a literal string such as [DONE]).

    Every streamed step of every request passes through here, and a native /generate chunk
    repeats the text and token ids so far: orjson encodes a 64-token chunk in ~2 us where the
    standard library took ~15 us, on the path that most likely caps how many tokens a second
    a small model's server streams (no draft plateaued at 21-22K tok/s on the demo pair, H200).
    Non-finite floats become null (valid JSON, which NaN / Infinity are not)."""
    if isinstance(data, str):
        return f"data: {data}\n\n".encode()
    return b"data: " + orjson.dumps(data, option=_SSE_JSON_OPTIONS) + b"\n\n"


async def sse_stream(events: AsyncIterator[Any]) -> AsyncIterator[bytes]:
    async for event in events:
        yield sse(event)
