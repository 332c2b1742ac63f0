"""Tensor parallelism on the CPU (gloo, one process per rank): the same greedy tokens as one rank,
for every architecture, for penalized requests, for shapes that split unevenly, and with the
EAGLE-3 draft deciding step by step; a server with --tp-size 2 over HTTP; no process left
behind; clear errors for a bad size."""

from __future__ import annotations

import gc
import json
import os
import signal
import time

import httpx
import pytest

import sglang
from sglang import demo
from sglang.srt.server_args import ServerArgs, check_model_paths
from sglang.test.runner_utils import OneRank
from sglang.test.server_fixture import (
    ServerProcess,
    assert_engine_kv_accounting,
    assert_idle_kv_accounting,
    assert_server_kv_accounting,
    post_in_background,
)
from sglang.test.tiny_models import ARCHITECTURES, make_tiny_eagle3_draft, make_tiny_model

GREEDY = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}
PROMPTS = [
    "def add(a, b):",
    "The quick brown fox jumps over the lazy dog. A radix tree shares",
    "Hello",
]
CODE_PROMPTS = ["def fibonacci(n):\n", "import os\nimport sys\n\ndef main(", "class Stack:\n    def __init__(self):\n"]


def tp_engine(model_path: str, tp_size: int = 2, **kwargs) -> sglang.Engine:
    return sglang.Engine(
        model_path=model_path, dtype="float32", device="cpu", log_level="warning", tp_size=tp_size, **kwargs
    )


def one_rank(model_path: str, **kwargs) -> OneRank:
    """The one-rank reference: tp_engine(model_path, 1, **kwargs)'s scheduler, run in this process
    (an engine's processes take seconds of CPU each to start)."""
    return OneRank(model_path=model_path, dtype="float32", device="cpu", log_level="warning", tp_size=1, **kwargs)


def generate_ids(engine, prompts, params=GREEDY) -> list[list[int]]:
    return [out["output_ids"] for out in engine.generate(prompts, params)]


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_two_ranks_give_one_ranks_greedy_tokens(engine_pool, tiny_model_paths, arch):
    expected = generate_ids(engine_pool.get(arch), PROMPTS)
    engine = tp_engine(tiny_model_paths[arch])
    try:
        assert generate_ids(engine, PROMPTS) == expected
        # The same prompt again: its prefix comes from the radix cache of both ranks' KV.
        again = engine.generate(PROMPTS[1], GREEDY)
        assert again["meta_info"]["cached_tokens"] == again["meta_info"]["prompt_tokens"] - 1
        assert again["output_ids"] == expected[1]
        assert_engine_kv_accounting(engine)
    finally:
        engine.shutdown()


def test_retraction_and_chunked_prefill_over_two_ranks(tiny_model_paths):
    # A pool of 300 slots for 8 requests of up to 120 tokens: requests go back to the queue and
    # return; prompts longer than a 16-token chunk prefill in pieces.
    prompts = [
        "The quick brown fox jumps over the lazy dog. " * 6,
        "def add(a, b):\n    return a + b\n" * 5,
        *[f"Hello {i}" for i in range(6)],
    ]
    params = {"temperature": 0, "max_new_tokens": 40, "ignore_eos": True}
    seeded = {"temperature": 0.8, "max_new_tokens": 12, "sampling_seed": 5}
    # Penalties (rank 0 samples, with its counts) on every other request, under the same pressure.
    penalized = [
        {**params, "presence_penalty": 1.5, "repetition_penalty": 1.3} if i % 2 == 0 else params
        for i in range(len(prompts))
    ]
    settings = dict(chunked_prefill_size=16, max_total_tokens=300, max_running_requests=8)
    reference = one_rank(tiny_model_paths["llama"], **settings)
    expected = (
        reference.generate(prompts, params),
        reference.generate(prompts[:2], seeded),
        reference.generate(prompts, penalized),
    )
    assert expected[2][0] != expected[0][0], "the penalties matter here"
    assert reference.internal_state()["num_retractions"] > 0
    assert_idle_kv_accounting(reference.internal_state())
    engine = tp_engine(tiny_model_paths["llama"], 2, **settings)
    try:
        assert (
            generate_ids(engine, prompts, params),
            generate_ids(engine, prompts[:2], seeded),
            generate_ids(engine, prompts, penalized),
        ) == expected
        state = engine.get_server_info()["internal_state"]
        assert state["num_retractions"] > 0
        assert_engine_kv_accounting(engine)
    finally:
        engine.shutdown()


def test_uneven_shapes_split_with_replicated_kv_heads_and_a_padded_vocabulary(tmp_path):
    # One KV head for two ranks (each holds a copy) and a vocabulary of 387 rows (the second rank's
    # block is padded); three ranks would not divide the 4 heads.
    path = make_tiny_model(str(tmp_path / "uneven"), "llama", num_key_value_heads=1, vocab_size=387)
    outputs, prompt_logprobs = {}, {}
    for tp_size in (1, 2):
        engine = tp_engine(path, tp_size)
        try:
            outputs[tp_size] = generate_ids(engine, PROMPTS)
            # Prompt logprobs over the gathered (padded) vocabulary, scored on every rank alike.
            meta = engine.generate(
                PROMPTS[1], {"max_new_tokens": 1}, return_logprob=True, logprob_start_len=0, top_logprobs_num=2
            )["meta_info"]
            prompt_logprobs[tp_size] = meta["input_token_logprobs"], meta["input_top_logprobs"]
        finally:
            engine.shutdown()
        assert len(engine.subprocesses.processes) == 1 + tp_size  # the detokenizer and a process per rank
        assert not any(proc.is_alive() for proc in engine.subprocesses.processes)
    assert outputs[2] == outputs[1]
    (tokens_2, top_2), (tokens_1, top_1) = prompt_logprobs[2], prompt_logprobs[1]
    assert [t for _, t, _ in tokens_2] == [t for _, t, _ in tokens_1] and tokens_2[0][0] is None
    assert [lp for lp, _, _ in tokens_2[1:]] == pytest.approx([lp for lp, _, _ in tokens_1[1:]], abs=1e-4)
    assert [[t for _, t, _ in top] for top in top_2[1:]] == [[t for _, t, _ in top] for top in top_1[1:]]


def test_four_ranks_over_two_kv_heads(tmp_path):
    path = make_tiny_model(
        str(tmp_path / "wide"), "qwen3", num_attention_heads=8, num_key_value_heads=2, intermediate_size=96
    )
    expected = one_rank(path).generate(PROMPTS[:2], GREEDY)
    engine = tp_engine(path, 4)
    try:
        assert generate_ids(engine, PROMPTS[:2]) == expected
    finally:
        engine.shutdown()


@pytest.fixture(scope="module")
def demo_plain_ids():
    ids = one_rank(demo.TARGET_PATH).generate(CODE_PROMPTS, GREEDY)
    gc.collect()  # the scheduler's KV pool (about 1.3 GB) goes with the reference cycles around it
    return ids


@pytest.mark.parametrize(
    "policy", [{"speculative_adaptive": True}, {"speculative_policy": "always"}], ids=["adaptive", "always"]
)
def test_eagle3_draft_over_two_ranks_keeps_plain_decodings_tokens(demo_plain_ids, policy):
    engine = tp_engine(demo.TARGET_PATH, speculative_algorithm="EAGLE3", **policy)
    try:
        outs = engine.generate(CODE_PROMPTS, GREEDY)
        assert [out["output_ids"] for out in outs] == demo_plain_ids
        if "speculative_policy" in policy:  # every step drafted, and drafts were accepted
            verifies = sum(out["meta_info"]["spec_verify_ct"] for out in outs)
            assert 0 < verifies < sum(out["meta_info"]["completion_tokens"] for out in outs)
        assert_engine_kv_accounting(engine)
    finally:
        engine.shutdown()


def test_server_with_two_ranks_answers_aborts_and_stops_clean(tiny_model_paths, engine_pool):
    expected = generate_ids(engine_pool.get("llama"), PROMPTS[:1])[0]
    srv = ServerProcess(tiny_model_paths["llama"], "--tp-size", "2")
    try:
        body = {"text": PROMPTS[0], "sampling_params": GREEDY}
        response = httpx.post(f"{srv.base_url}/generate", json=body, timeout=60)
        assert response.status_code == 200 and response.json()["output_ids"] == expected
        chat = httpx.post(
            f"{srv.base_url}/v1/chat/completions",
            timeout=60,
            json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5, "ignore_eos": True},
        )
        assert chat.status_code == 200 and chat.json()["usage"]["completion_tokens"] == 5, chat.text
        # A client that leaves mid-stream: the request is aborted on rank 0, the KV freed.
        long = {"text": "Hello", "stream": True, "sampling_params": {"max_new_tokens": 2000, "ignore_eos": True}}
        with httpx.stream("POST", f"{srv.base_url}/generate", json=long, timeout=60) as stream:
            for _ in zip(range(3), stream.iter_lines()):
                pass
        _wait_idle(srv)
        assert_server_kv_accounting(srv)
        assert len(srv.children_pids()) >= 3  # scheduler (rank 0), rank 1, detokenizer
        assert srv.stop(signal.SIGTERM) == 0
        assert srv.wait_children_gone() == []
        assert srv.leftover_files() == []
    finally:
        srv.stop(signal.SIGKILL)


def _wait_idle(srv: ServerProcess, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = httpx.get(f"{srv.base_url}/get_server_info", timeout=10).json()["internal_states"][0]
        if state["num_running_reqs"] == 0 and state["num_queue_reqs"] == 0:
            return
        time.sleep(0.1)


def test_killed_rank_zero_takes_every_rank_down(tiny_model_paths):
    srv = ServerProcess(tiny_model_paths["qwen2"], "--tp-size", "2", "--skip-server-warmup")
    try:
        scheduler_pid = httpx.get(f"{srv.base_url}/get_server_info").json()["scheduler_pid"]
        body = {"text": "Hello", "sampling_params": {"max_new_tokens": 2000, "ignore_eos": True}}
        waiter, outcome = post_in_background(f"{srv.base_url}/generate", body)
        time.sleep(1.0)
        os.kill(scheduler_pid, signal.SIGKILL)
        srv.proc.wait(timeout=30)
        assert srv.proc.returncode != 0
        waiter.join(timeout=30)
        assert outcome.get("status") not in (None, 200), outcome
        assert srv.wait_children_gone(timeout=15) == []
    finally:
        srv.stop(signal.SIGKILL)


@pytest.mark.parametrize(
    "heads, kv_heads, tp_size, message",
    [
        (4, 2, 3, "--tp-size 3 cannot split the model: its 4 attention heads do not divide by 3"),
        (6, 3, 2, "--tp-size 2 cannot split the model: its 3 key-value heads neither divide by 2 nor divide it"),
    ],
)
def test_a_size_that_cannot_split_the_model_fails_before_loading(tmp_path, heads, kv_heads, tp_size, message):
    config = {
        "architectures": ["LlamaForCausalLM"],
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "hidden_size": 16 * heads,
        "intermediate_size": 96,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    args = ServerArgs(model_path=str(tmp_path), device="cpu", tp_size=tp_size)
    with pytest.raises(ValueError, match=message):
        check_model_paths(args)


def test_a_draft_that_cannot_split_is_named(tiny_model_paths, tmp_path):
    target = make_tiny_model(
        str(tmp_path / "target"), "llama", num_attention_heads=8, num_key_value_heads=4, intermediate_size=96
    )
    draft = make_tiny_eagle3_draft(str(tmp_path / "draft"), target)
    # The draft's intermediate size (the target's, 96) splits over 4 ranks; make it one that does not.
    config_path = os.path.join(draft, "config.json")
    with open(config_path) as f:
        config = json.load(f)
    config["intermediate_size"] = 98
    with open(config_path, "w") as f:
        json.dump(config, f)
    args = ServerArgs(
        model_path=target, device="cpu", tp_size=4, speculative_algorithm="EAGLE3", speculative_draft_model_path=draft
    )
    with pytest.raises(ValueError, match="cannot split the EAGLE-3 draft: its intermediate_size 98"):
        check_model_paths(args)


def test_more_ranks_than_gpus_is_refused(tiny_model_paths, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match="--tp-size 2 needs 2 GPUs, one per rank; 1 is visible"):
        ServerArgs(model_path=tiny_model_paths["llama"], device="cuda", attention_backend="torch_native", tp_size=2)
