"""Errors of the OpenAI routes speak OpenAI's field names, in `param` and in the message, and
equivalent spellings of one request are answered alike (the real server of the `server` fixture)."""

from __future__ import annotations

import httpx
import pytest

NATIVE_NAMES = ("max_new_tokens", "min_new_tokens", "sampling_seed", "top_logprobs_num")


def post(server, route: str, body: dict) -> httpx.Response:
    if route == "chat":
        body = {"messages": [{"role": "user", "content": "Hello"}], **body}
        return httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=60)
    return httpx.post(server.base_url + "/v1/completions", json={"prompt": "Hello", **body}, timeout=60)


def error_of(response: httpx.Response) -> dict:
    assert response.status_code == 400, response.text
    return response.json()["error"]


@pytest.mark.parametrize(
    "route, max_field", [("completion", "max_tokens"), ("chat", "max_tokens"), ("chat", "max_completion_tokens")]
)
def test_min_tokens_above_the_maximum_names_both_fields_as_openai_does(server, route, max_field):
    error = error_of(post(server, route, {"min_tokens": 5, max_field: 3}))
    assert error["param"] == "min_tokens"
    assert "min_tokens" in error["message"] and f"{max_field}=3" in error["message"], error
    assert not any(name in error["message"] for name in NATIVE_NAMES), error


@pytest.mark.parametrize("route", ["completion", "chat"])
def test_an_empty_stop_string_is_refused_alone_or_in_a_list(server, route):
    alone, listed = error_of(post(server, route, {"stop": ""})), error_of(post(server, route, {"stop": ["", "x"]}))
    assert alone == listed and alone["param"] == "stop" and "empty string" in alone["message"], (alone, listed)
