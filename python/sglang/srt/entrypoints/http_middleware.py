"""The HTTP server's middleware: the API key check (--api-key) and CORS, as upstream."""

from __future__ import annotations

from typing import Optional

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from sglang.srt.entrypoints.http_utils import error_response

# Routes that answer without an API key (probes and scrapers): every /health* route and /metrics, as upstream.
OPEN_ROUTE_PREFIXES = ("/health", "/metrics")


def add_auth(app: FastAPI, api_key: Optional[str]) -> None:
    if api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=api_key)


def add_cors(app: FastAPI) -> None:
    # As upstream: browsers may call from any origin. Preflights are answered here, and every
    # answer (a 401 included) carries the headers that let the page read it.
    app.add_middleware(
        CORSMiddleware, allow_origins=["*"], allow_credentials=True, allow_methods=["*"], allow_headers=["*"]
    )


class ApiKeyMiddleware:
    """Refuses requests without `Authorization: Bearer <key>`, except on the open routes.

    Plain ASGI, not `@app.middleware("http")`: Starlette's BaseHTTPMiddleware hands the route a
    receive channel on which `Request.is_disconnected()` never sees the client go, so with
    --api-key a non-streaming request kept running after its client had disconnected."""

    def __init__(self, app, api_key: str):
        self.app = app
        self.expected = f"Bearer {api_key}"

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and not scope["path"].startswith(OPEN_ROUTE_PREFIXES):
            given = next((value for name, value in scope["headers"] if name == b"authorization"), b"")
            if given.decode("latin-1") != self.expected:
                refusal = error_response("missing or wrong API key (send 'Authorization: Bearer <key>')", 401)
                await refusal(scope, receive, send)
                return
        await self.app(scope, receive, send)
