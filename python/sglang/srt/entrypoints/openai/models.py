"""The OpenAI models routes: list the served model (`GET /v1/models`) and retrieve it by name
(`GET /v1/models/{model}`)."""

from __future__ import annotations

import time

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from sglang.srt.errors import short_repr
from sglang.srt.server_args import ServerArgs


def add_model_routes(app: FastAPI, server_args: ServerArgs, context_len: int) -> None:
    def card() -> dict:
        return {
            "id": server_args.served_model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "sglang",
            "root": server_args.model_path,
            "max_model_len": context_len,
        }

    @app.get("/v1/models")
    async def list_models():
        return {"object": "list", "data": [card()]}

    # `:path`: the default served name is the model path, slashes included.
    @app.get("/v1/models/{model:path}")
    async def retrieve_model(model: str):
        if model != server_args.served_model_name:
            return model_not_found(model)
        return card()


def model_not_found(model: str) -> JSONResponse:
    """OpenAI's answer for a model it does not serve (its `code` is a name, not the status)."""
    error = {
        "message": f"The model {short_repr(model)} does not exist",
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_found",
    }
    return JSONResponse({"error": error}, status_code=404)
