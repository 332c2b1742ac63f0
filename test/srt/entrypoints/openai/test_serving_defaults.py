"""`--sampling-defaults`: a model's generation_config.json sampling defaults reach the chat
requests that leave them unset, on a real server; completions and /generate keep theirs."""

from __future__ import annotations

import json
import os

import httpx
import openai
import pytest

from sglang.test.server_fixture import ServerProcess
from sglang.test.tiny_models import make_tiny_model

SEEDS = (1, 2, 3, 4)
PROMPT = "The quick brown fox"
MAX_TOKENS = 12
# Greedy by default, with a repetition penalty (Qwen2.5 recommends one) that changes this prompt's
# greedy chat output within MAX_TOKENS.
RECOMMENDED = {"temperature": 0.0, "top_p": 0.9, "repetition_penalty": 1.1}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    path = make_tiny_model(str(tmp_path_factory.mktemp("recommends_greedy") / "llama"), "llama")
    config_path = os.path.join(path, "generation_config.json")
    with open(config_path) as f:
        config = json.load(f)
    with open(config_path, "w") as f:
        json.dump({**config, **RECOMMENDED}, f)
    return path


def start(model_dir: str, *flags: str):
    server = ServerProcess(model_dir, *flags)
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0, timeout=60)
    return server, client


def chat_texts(client, **kwargs) -> list[str]:
    return [
        client.chat.completions.create(
            model=client.models.list().data[0].id,
            max_tokens=MAX_TOKENS,
            seed=seed,
            messages=[{"role": "user", "content": PROMPT}],
            **kwargs,
        )
        .choices[0]
        .message.content
        for seed in SEEDS
    ]


def completion_texts(client) -> list[str]:
    return [
        client.completions.create(
            model=client.models.list().data[0].id, prompt=PROMPT, max_tokens=MAX_TOKENS, seed=seed
        )
        .choices[0]
        .text
        for seed in SEEDS
    ]


def generate_texts(server) -> list[str]:
    return [
        httpx.post(
            server.base_url + "/generate",
            timeout=60,
            json={"text": PROMPT, "sampling_params": {"max_new_tokens": MAX_TOKENS, "sampling_seed": seed}},
        ).json()["text"]
        for seed in SEEDS
    ]


def test_the_models_defaults_fill_what_a_chat_request_leaves_unset_and_nothing_else(model_dir):
    server, client = start(model_dir)
    try:
        greedy = chat_texts(client, temperature=0)
        assert len(set(greedy)) == 1
        assert chat_texts(client) == greedy, "no temperature: the model's 0.0, so every seed gives the greedy text"
        assert chat_texts(client, extra_body={"repetition_penalty": 1.1}) == greedy, "the model's repetition_penalty"
        unpenalized = chat_texts(client, temperature=0, extra_body={"repetition_penalty": 1.0})
        assert unpenalized != greedy, "a request's own repetition_penalty wins"
        assert len(set(chat_texts(client, temperature=1.0))) > 1, "a request's own temperature wins"
        assert len(set(completion_texts(client))) > 1, "/v1/completions keeps OpenAI's temperature 1"
        assert len(set(generate_texts(server))) > 1, "/generate keeps its temperature 1"
    finally:
        server.stop()


def test_sampling_defaults_openai_keeps_openais_defaults_for_chat(model_dir):
    server, client = start(model_dir, "--sampling-defaults", "openai")
    try:
        assert len(set(chat_texts(client))) > 1, "temperature 1 despite the model's recommended 0.0"
        assert "repetition_penalty" not in server.output()
    finally:
        server.stop()
