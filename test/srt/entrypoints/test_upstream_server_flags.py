"""Upstream SGLang's launch_server flags that have a meaning here, on a real server started with
them: streamed chunks of --stream-interval tokens, --log-requests lines, a model whose config
class is the model directory's own code (--trust-remote-code), and upstream's dtype alias."""

from __future__ import annotations

import json
import shutil

import httpx
import pytest

from sglang.test.server_fixture import ServerProcess

CUSTOM_CONFIG = """from transformers import LlamaConfig


class TinyCustomConfig(LlamaConfig):
    model_type = "tiny_custom"
"""


def with_custom_config_code(src: str, dst) -> str:
    """A copy of the model whose config.json names a config class in a Python file of its own
    directory: transformers loads it only with trust_remote_code."""
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    config.update(model_type="tiny_custom", auto_map={"AutoConfig": "configuration_tiny_custom.TinyCustomConfig"})
    (dst / "config.json").write_text(json.dumps(config))
    (dst / "configuration_tiny_custom.py").write_text(CUSTOM_CONFIG)
    return str(dst)


@pytest.fixture(scope="module")
def server(tiny_model_paths, tmp_path_factory):
    path = with_custom_config_code(tiny_model_paths["llama"], tmp_path_factory.mktemp("remote_code") / "model")
    srv = ServerProcess(
        path,
        "--trust-remote-code",
        "--tokenizer-mode",
        "auto",
        "--dtype",
        "float",
        "--kv-cache-dtype",
        "auto",
        "--max-prefill-tokens",
        "64",
        "--stream-interval",
        "4",
        "--log-requests",
        "--watchdog-timeout",
        "120",
    )
    yield srv
    srv.stop()


def test_the_server_serves_a_model_whose_config_is_its_own_code_with_trust_remote_code(server):
    info = httpx.get(f"{server.base_url}/get_server_info", timeout=10).json()
    assert info["trust_remote_code"] is True and info["dtype"] == "float" and info["max_prefill_tokens"] == 64
    response = httpx.post(
        f"{server.base_url}/generate",
        timeout=60,
        json={"text": "def add(a, b):", "sampling_params": {"max_new_tokens": 3, "temperature": 0}},
    )
    assert response.status_code == 200, response.text


def test_the_model_directorys_code_is_refused_without_trust_remote_code(tiny_model_paths, tmp_path):
    from sglang.srt.configs.model_config import load_hf_config

    path = with_custom_config_code(tiny_model_paths["llama"], tmp_path / "model")
    with pytest.raises(ValueError, match="custom code"):
        load_hf_config(path)
    assert type(load_hf_config(path, trust_remote_code=True)).__name__ == "TinyCustomConfig"


def stream_chunks(server: ServerProcess, body: dict) -> list[dict]:
    chunks = []
    with httpx.stream("POST", f"{server.base_url}/generate", json={**body, "stream": True}, timeout=60) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[len("data: ") :]))
    return chunks


def test_a_streaming_client_gets_a_chunk_every_stream_interval_tokens_and_the_last(server):
    """Chunks end at multiples of 4 tokens but the last: 4, 8, ..., 30. A stream that falls behind
    gets the chunks it missed as one (the tiny model's steps take microseconds), never more chunks."""
    chunks = stream_chunks(
        server,
        {"text": "def add(a, b):", "sampling_params": {"max_new_tokens": 30, "ignore_eos": True, "temperature": 0}},
    )
    ends = [len(chunk["output_ids"]) for chunk in chunks]
    assert ends[-1] == 30 and chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert all(end % 4 == 0 for end in ends[:-1]) and ends == sorted(set(ends)), ends
    assert len(chunks) <= 8, ends


def test_log_requests_logs_each_requests_input_and_output_whatever_the_log_level(server):
    # The server runs with --log-level warning (ServerProcess): the request lines show anyway.
    body = {"text": "class Stack:", "rid": "logged-request", "sampling_params": {"max_new_tokens": 5, "temperature": 0}}
    result = httpx.post(f"{server.base_url}/generate", json=body, timeout=60).json()
    log = server.output()
    received = next(line for line in log.splitlines() if "Receive: rid='logged-request'" in line)
    assert "'class Stack:'" in received and "'max_new_tokens': 5" in received, received
    finished = next(line for line in log.splitlines() if "Finish: rid='logged-request'" in line)
    assert repr(result["text"]) in finished and "completion_tokens=5" in finished, finished
