"""OpenAI request fields as the engine's sampling parameters: the fields both routes share, and
the JSON schema that `response_format` (or a forced tool choice) adds as a constraint."""

from __future__ import annotations

import json
from typing import Optional

from sglang.srt.errors import InvalidRequest


def native_sampling_params(request, max_new_tokens: Optional[int]) -> dict:
    """The sampling fields both endpoints share, under their native names. Unset ones are left
    out so the engine's defaults apply, except max_new_tokens: None there means "up to the
    context length"."""
    params = {
        "max_new_tokens": max_new_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "top_k": request.top_k,
        "min_p": request.min_p,
        "stop": request.stop,
        "stop_token_ids": request.stop_token_ids,
        "ignore_eos": request.ignore_eos,
        "min_new_tokens": request.min_tokens,
        "n": request.n,
        "sampling_seed": request.seed,
        "skip_special_tokens": request.skip_special_tokens,
        "no_stop_trim": request.no_stop_trim,
        "frequency_penalty": request.frequency_penalty,
        "presence_penalty": request.presence_penalty,
        "repetition_penalty": request.repetition_penalty,
        "logit_bias": request.logit_bias,
        "disable_speculative_decoding": request.disable_speculative_decoding,
        "json_schema": request.json_schema,
        "regex": request.regex,
        "ebnf": request.ebnf,
    }
    params = {name: value for name, value in params.items() if value is not None}
    return {"max_new_tokens": max_new_tokens, **params}


def response_format_schema(request) -> Optional[str]:
    """The JSON schema that `response_format` asks for, as text; None for text output."""
    response_format = request.response_format
    if response_format is None or response_format.type == "text":
        return None
    if response_format.type == "json_object":
        return json.dumps({"type": "object"})
    return json.dumps(response_format.json_schema.schema_)


def add_constraint(params: dict, field: str, schema: str) -> dict:
    """`params` with the JSON schema that the OpenAI field `field` asks for; a request that also
    gives its own json_schema, regex or ebnf is a 400 (at most one constraint)."""
    given = [name for name in ("json_schema", "regex", "ebnf") if name in params]
    if given:
        raise InvalidRequest(f"{given[0]} cannot be combined with {field}", given[0])
    return {**params, "json_schema": schema}
