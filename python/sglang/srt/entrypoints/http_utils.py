"""Helpers shared by the HTTP routes: OpenAI-style error responses, disconnect-aware waiting,
server-sent events."""

from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator, Awaitable, Optional

from fastapi import Request
from fastapi.responses import JSONResponse

from sglang.srt.errors import InvalidRequest

DISCONNECT_POLL_S = 0.5

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                503: "service_unavailable", 500: "internal_server_error"}


def error_response(message: str, status_code: int = 400, param: Optional[str] = None) -> JSONResponse:
    body = {"error": {"message": message, "type": _ERROR_TYPES.get(status_code, "error"),
                      "param": param, "code": status_code}}
    return JSONResponse(body, status_code=status_code)


def invalid_request_response(err: InvalidRequest, param_names: Optional[dict] = None) -> JSONResponse:
    """`param_names` maps native field names to the front end's (e.g. max_new_tokens -> max_tokens)."""
    param = (param_names or {}).get(err.param, err.param)
    message = err.message
    if param != err.param and err.param:
        message = message.replace(f"'{err.param}'", f"'{param}'").replace(err.param, param)
    return error_response(message, err.status_code, param)


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


def sse(data: Any) -> bytes:
    """One server-sent event carrying `data` as JSON (or a literal string such as [DONE])."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {payload}\n\n".encode()


async def sse_stream(events: AsyncIterator[Any]) -> AsyncIterator[bytes]:
    async for event in events:
        yield sse(event)
