"""EAGLE-3 speculative decoding (chain drafting) through the real engine, on the CPU in float32:
greedy output is token-identical to plain decoding (tiny random pair and the shipped demo pair;
single requests, mixed batches, radix-cache hits, requests that finish inside the accepted
tokens); sampled output follows the target's distribution (chi-square against the exact
distribution); KV accounting holds after every test, aborts included; stats are reported; the
start-up log names the model and the speculation policy."""

from __future__ import annotations

import gc
import logging
import time

import pytest

import sglang
from sglang import demo
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.server_args import ServerArgs
from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2
from sglang.test.runner_utils import OneRank
from sglang.test.sampling_checks import chi_square_pvalue, exact_token_distributions
from sglang.test.tiny_models import make_tiny_eagle3_draft

from sglang.test.server_fixture import assert_engine_kv_accounting as assert_kv_accounting

CODE_PROMPTS = [
    "def fibonacci(n):",
    "class Stack:\n    def __init__(self):",
    "import os\nimport sys\n",
    "for i in range(10):\n    print(",
    "x = [1, 2, 3]\ny = ",
]


def engine(**kwargs):
    """Speculative engines overlap by default (the scheduler launches step N + 1 before it has
    step N's accepted lengths); plain reference engines run without overlap."""
    args = dict(dtype="float32", device="cpu", log_level="warning")
    if "speculative_algorithm" not in kwargs:
        args["disable_overlap_schedule"] = True
    return sglang.Engine(**{**args, **kwargs})


def plain_reference(prompts, params, **kwargs) -> list[list[int]]:
    """Greedy output ids of engine(**kwargs) without a draft, from its Scheduler run in this process
    (the same scheduler, without starting an engine's processes); cached per arguments, since
    several tests compare against the same plain decoding."""
    key = repr((prompts, params, sorted(kwargs.items())))
    if key not in _plain_outputs:
        args = {
            "model_path": demo.TARGET_PATH,
            "dtype": "float32",
            "device": "cpu",
            "log_level": "warning",
            "disable_overlap_schedule": True,
            **kwargs,
        }
        _plain_outputs[key] = OneRank(**args).generate(prompts, params)
        gc.collect()  # the scheduler's KV pool goes with the reference cycles around it
    return _plain_outputs[key]


_plain_outputs: dict[str, list[list[int]]] = {}


@pytest.fixture(scope="module")
def tiny_pair(tiny_model_paths, tmp_path_factory):
    target = tiny_model_paths["llama"]
    draft = make_tiny_eagle3_draft(str(tmp_path_factory.mktemp("tiny_draft")), target, draft_vocab_size=200)
    # Plain decoding: the plain engine's Scheduler, in this process.
    plain = OneRank(
        model_path=target, dtype="float32", device="cpu", log_level="warning", disable_overlap_schedule=True
    )
    spec = engine(
        model_path=target, speculative_algorithm="EAGLE3", speculative_draft_model_path=draft, speculative_num_steps=3
    )
    spec_serial = engine(
        model_path=target,
        speculative_algorithm="EAGLE3",
        speculative_draft_model_path=draft,
        speculative_num_steps=3,
        disable_overlap_schedule=True,
    )
    yield plain, spec, spec_serial
    for e in (spec, spec_serial):
        e.shutdown()


@pytest.fixture(scope="module")
def demo_pair():
    plain = engine()
    spec = engine(speculative_algorithm="EAGLE3", speculative_num_steps=4)
    yield plain, spec
    plain.shutdown()
    spec.shutdown()


def ids(outputs):
    return [o["output_ids"] for o in outputs]


@pytest.mark.parametrize("overlap", [True, False])
def test_tiny_random_pair_greedy_is_plain_decoding(tiny_pair, overlap):
    plain, spec_overlap, spec_serial = tiny_pair
    spec = spec_overlap if overlap else spec_serial
    prompts = ["Hello", "The quick brown fox", "a b c d e f g", "def add(a, b):", "1 2 3"]
    # Lengths that end inside a chain (k = 3: steps give 1..4 tokens) and beyond.
    params = [{"temperature": 0, "max_new_tokens": n, "ignore_eos": True} for n in (1, 2, 5, 17, 40)]
    assert ids(spec.generate(prompts, params)) == plain.generate(prompts, params)
    for prompt, p in zip(prompts, params):  # one at a time == in a batch
        assert spec.generate(prompt, p)["output_ids"] == plain.generate([prompt], p)[0]
    assert_kv_accounting(spec)


def test_demo_pair_greedy_is_plain_decoding_and_accepts_drafts(demo_pair):
    plain, spec = demo_pair
    params = {"temperature": 0, "max_new_tokens": 64}
    expected = ids(plain.generate(CODE_PROMPTS, params))
    outputs = spec.generate(CODE_PROMPTS, params)
    assert ids(outputs) == expected
    for out in outputs:
        meta = out["meta_info"]
        assert 1 <= meta["spec_verify_ct"] < meta["completion_tokens"]
        assert meta["spec_accept_length"] == pytest.approx(meta["completion_tokens"] / meta["spec_verify_ct"])
    state = spec.get_server_info()["internal_state"]
    # The demo draft predicts its target: well over one token per verify on code.
    assert state["avg_spec_accept_length"] > 1.8, state
    assert sum(state["spec_accept_length_histogram"]) == state["spec_verifies"]
    assert set(state["spec_phase_ms"]) == {"draft", "verify", "extend"}
    assert_kv_accounting(spec)


def test_radix_cache_hits_keep_output_identical(demo_pair):
    plain, spec = demo_pair
    params = {"temperature": 0, "max_new_tokens": 40}
    prefix = "import json\n\n\ndef load(path):\n    with open(path) as f:\n"
    prompts = [prefix + "        return json.load(f)\n", prefix + "        data = f.read()\n", prefix]
    expected = ids(plain.generate(prompts, params))
    first = spec.generate(prompts[0], params)
    assert first["output_ids"] == expected[0]
    again = spec.generate(prompts, params)  # shared prefix and a full repeat: radix hits
    assert ids(again) == expected
    assert all(o["meta_info"]["cached_tokens"] > 0 for o in again)
    assert_kv_accounting(spec)


def test_requests_finishing_inside_the_accepted_tokens(demo_pair):
    plain, spec = demo_pair
    base = plain.generate(CODE_PROMPTS[0], {"temperature": 0, "max_new_tokens": 48})["output_ids"]
    # A stop token that occurs mid-output, a stop string, and short max_new_tokens.
    stop_id = base[len(base) // 2]
    cases = [{"stop_token_ids": [stop_id]}, {"stop": ["_fp"]}, {"max_new_tokens": 3}, {"max_new_tokens": 6}]
    for extra in cases:
        params = {"temperature": 0, "max_new_tokens": 48, **extra}
        want, got = plain.generate(CODE_PROMPTS[0], params), spec.generate(CODE_PROMPTS[0], params)
        assert got["output_ids"] == want["output_ids"], extra
        assert got["text"] == want["text"]
        assert got["meta_info"]["finish_reason"] == want["meta_info"]["finish_reason"]
    assert_kv_accounting(spec)


def test_mixed_greedy_and_sampled_batch_keeps_greedy_rows_exact(demo_pair):
    plain, spec = demo_pair
    greedy = {"temperature": 0, "max_new_tokens": 32}
    sampled = {"temperature": 0.9, "top_p": 0.95, "max_new_tokens": 32, "sampling_seed": 7}
    outputs = spec.generate(CODE_PROMPTS[:4], [greedy, sampled, greedy, sampled])
    expected = ids(plain.generate([CODE_PROMPTS[0], CODE_PROMPTS[2]], greedy))
    assert [outputs[0]["output_ids"], outputs[2]["output_ids"]] == expected
    assert all(len(o["output_ids"]) == 32 or o["meta_info"]["finish_reason"]["type"] == "stop" for o in outputs)
    # Seeded sampling is reproducible with speculation too.
    assert spec.generate(CODE_PROMPTS[1], sampled)["output_ids"] == outputs[1]["output_ids"]
    assert_kv_accounting(spec)


def test_logprobs_of_speculative_tokens_match_plain(demo_pair):
    plain, spec = demo_pair
    params = {"temperature": 0, "max_new_tokens": 12}
    want = plain.generate(CODE_PROMPTS[1], params, return_logprob=True, top_logprobs_num=2)
    got = spec.generate(CODE_PROMPTS[1], params, return_logprob=True, top_logprobs_num=2)
    assert got["output_ids"] == want["output_ids"]
    for (a, ta, _), (b, tb, _) in zip(
        got["meta_info"]["output_token_logprobs"], want["meta_info"]["output_token_logprobs"]
    ):
        assert ta == tb and a == pytest.approx(b, abs=1e-4)
    assert len(got["meta_info"]["output_top_logprobs"]) == 12


def test_prompt_logprobs_come_from_the_target_prefill(tiny_pair, hf_reference):
    """The target's logits score the prompt (the draft's smaller vocabulary scores nothing), also
    for a prompt whose prefix the radix cache holds with draft KV."""
    _, spec, _ = tiny_pair
    ids = [(37 * j + 11) % 380 + 1 for j in range(24)]  # ids past the draft's 200-token vocabulary
    expected = hf_reference.prompt_logprobs("llama", ids)
    spec.generate(input_ids=ids, sampling_params={"temperature": 0, "max_new_tokens": 4})
    for start in (0, 9):  # recomputed past the cached prefix: from the start, or from position 8
        meta = spec.generate(
            input_ids=ids,
            sampling_params={"temperature": 0, "max_new_tokens": 4},
            return_logprob=True,
            logprob_start_len=start,
            top_logprobs_num=2,
        )["meta_info"]
        assert [t for _, t, _ in meta["input_token_logprobs"]] == ids[start:]
        for position, (logprob, token, _) in enumerate(meta["input_token_logprobs"][1:], start + 1):
            assert logprob == pytest.approx(expected[position - 1, token].item(), abs=1e-4)
        assert [[t for _, t, _ in top] for top in meta["input_top_logprobs"][1:]] == [
            expected[p - 1].topk(2).indices.tolist() for p in range(start + 1, len(ids))
        ]
    assert_kv_accounting(spec)


def test_abort_during_speculative_decoding_frees_everything(demo_pair):
    _, spec = demo_pair
    stream = spec.generate("def main():", {"temperature": 0, "max_new_tokens": 400, "ignore_eos": True}, stream=True)
    chunks = [next(stream) for _ in range(3)]
    stream.close()  # the client goes away mid-generation: the request is aborted
    assert 0 < len(chunks[-1]["output_ids"]) < 400
    deadline = time.time() + 30
    while spec.get_server_info()["internal_state"]["num_running_reqs"] and time.time() < deadline:
        time.sleep(0.05)  # the abort reaches the scheduler between two of its steps
    assert_kv_accounting(spec)
    # The engine keeps serving, with the same greedy output as before.
    params = {"temperature": 0, "max_new_tokens": 16}
    assert spec.generate(CODE_PROMPTS[0], params)["output_ids"] == spec.generate(CODE_PROMPTS[0], params)["output_ids"]


def test_sampled_tokens_follow_the_target_distribution():
    """Chi-square of the 2nd and 3rd output tokens (produced by verify steps: accepted drafts
    or resampled) against their exact distribution under the target, top-k 6, temperature 1."""
    prompt, top_k, num_samples = "def add(a, b):\n", 6, 1500
    spec = engine(speculative_algorithm="EAGLE3", speculative_num_steps=2, disable_radix_cache=True)
    try:
        prompt_ids = spec.tokenizer_manager.tokenizer.encode(prompt) if hasattr(spec, "tokenizer_manager") else None
        params = [
            {"temperature": 1.0, "top_k": top_k, "max_new_tokens": 3, "ignore_eos": True, "sampling_seed": seed}
            for seed in range(num_samples)
        ]
        outputs = spec.generate([prompt] * num_samples, params)
        state = spec.get_server_info()["internal_state"]
        assert_kv_accounting(spec)
    finally:
        spec.shutdown()
    # Both paths of the chain test ran: drafts were accepted and rejected.
    assert 0 < state["spec_accept_rate"] < 1, state
    from transformers import AutoTokenizer

    prompt_ids = prompt_ids or AutoTokenizer.from_pretrained(demo.TARGET_PATH)(prompt).input_ids
    exact = exact_token_distributions(demo.TARGET_PATH, prompt_ids, top_k)
    for position in (1, 2):
        samples = [o["output_ids"][position] for o in outputs]
        assert chi_square_pvalue(samples, exact[position]) > 1e-3, position


# Switching with the catch-up draft: plain steps while more than 2 requests decode, then speculation
# that first catches the draft up, through retractions (released KV keeps only draft-covered positions).
CATCH_UP_SWITCHING = {
    "speculative_policy": "threshold",
    "speculative_threshold": 2,
    "speculative_draft_sync": "catch-up",
}


@pytest.mark.parametrize(
    "extra, spec_extra, lengths",
    [
        (
            {"chunked_prefill_size": 7},
            {},
            (40,) * 4,
        ),  # the draft extends chunk by chunk, fed the next chunk's first token
        ({"max_total_tokens": 160, "max_running_requests": 8}, {}, (40,) * 4),  # KV pressure: retraction, re-prefill
        ({"context_length": 48}, {}, None),  # requests run into the context limit inside a chain
        # Retractions shrink the batch below the threshold; so do requests of different lengths.
        ({"max_total_tokens": 160, "max_running_requests": 8}, CATCH_UP_SWITCHING, (40,) * 4),
        ({"chunked_prefill_size": 7}, CATCH_UP_SWITCHING, (40, 25, 12, 33)),
    ],
    ids=["chunked_prefill", "retraction", "context_limit", "retraction_catch_up", "chunked_catch_up"],
)
def test_speculation_under_chunking_memory_pressure_and_context_limit(extra, spec_extra, lengths):
    prompts = [
        "def fibonacci(n):\n    if n < 2:\n        return n\n",
        "class Stack:\n    def push(self, x):",
        "import os\nimport sys\nimport json\n",
        "x = 1\ny = 2\nz = x + y\nprint(z)\n",
    ]
    params = [{"temperature": 0, "max_new_tokens": n, "ignore_eos": True} for n in lengths or ()]
    if "context_length" in extra:  # each request fills the context exactly: its last chains overhang it
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(demo.TARGET_PATH)
        params = [
            {
                "temperature": 0,
                "ignore_eos": True,
                "max_new_tokens": extra["context_length"] - len(tokenizer(p).input_ids),
            }
            for p in prompts
        ]
    expected = plain_reference(prompts, params, **extra)
    spec = engine(speculative_algorithm="EAGLE3", speculative_num_steps=4, **extra, **spec_extra)
    try:
        got = ids(spec.generate(prompts, params))
        state = spec.get_server_info()["internal_state"]
        assert_kv_accounting(spec)
    finally:
        spec.shutdown()
    assert got == expected
    if "max_total_tokens" in extra:
        assert state["num_retractions"] > 0, state
    if spec_extra:
        assert {"0", "4"} <= set(state["spec_steps_by_k"]), state


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_other_target_architectures_speculate_losslessly(tiny_model_paths, tmp_path, arch):
    """Qwen2 (qkv bias, tied embeddings) and Qwen3 (q/k norm, explicit head_dim) targets with
    a random EAGLE-3 draft of the full vocabulary (no d2t)."""
    target = tiny_model_paths[arch]
    draft = make_tiny_eagle3_draft(str(tmp_path / "draft"), target)
    prompts = ["Hello", "The quick brown fox", "def add(a, b):"]
    params = [{"temperature": 0, "max_new_tokens": n, "ignore_eos": True} for n in (3, 12, 25)]
    expected = plain_reference(prompts, params, model_path=target)
    spec = engine(
        model_path=target, speculative_algorithm="EAGLE3", speculative_draft_model_path=draft, speculative_num_steps=2
    )
    try:
        assert ids(spec.generate(prompts, params)) == expected
        assert_kv_accounting(spec)
    finally:
        spec.shutdown()


def test_streaming_delivers_several_tokens_per_step_and_the_same_text(demo_pair):
    plain, spec = demo_pair
    params = {"temperature": 0, "max_new_tokens": 48, "stop": ["\n\n\n"]}
    want = plain.generate(CODE_PROMPTS[2], params)
    chunks = list(spec.generate(CODE_PROMPTS[2], params, stream=True))
    final = chunks[-1]
    assert final["text"] == want["text"] and final["output_ids"] == want["output_ids"]
    growth = [len(b["output_ids"]) - len(a["output_ids"]) for a, b in zip(chunks, chunks[1:])]
    assert max(growth) > 1  # a verify step delivers its accepted tokens together
    assert all(later["text"].startswith(earlier["text"]) for earlier, later in zip(chunks, chunks[1:]))


def test_catch_up_pieces_cover_every_position_in_order_within_the_cap():
    from sglang.srt.speculative.draft_catch_up import catch_up_pieces

    behind = [(0, 3), (2, 11), (5, 1), (7, 4)]
    for cap in (1, 2, 4, 5, 19, 100):
        pieces = catch_up_pieces(behind, cap)
        assert all(sum(hi - lo for _, lo, hi in piece) <= cap for piece in pieces)
        assert all(len({i for i, _, _ in piece}) == len(piece) for piece in pieces)  # a request once per forward
        for i, n in behind:  # each request's segments tile 0 .. n in order, in successive pieces
            segments = [(lo, hi) for piece in pieces for j, lo, hi in piece if j == i]
            assert segments[0][0] == 0 and segments[-1][1] == n
            assert all(a[1] == b[0] for a, b in zip(segments, segments[1:]))
    assert catch_up_pieces(behind, 100) == [[(0, 0, 3), (2, 0, 11), (5, 0, 1), (7, 0, 4)]]  # one forward


@pytest.mark.parametrize(
    "policy, shown",
    [
        ("cost", "policy cost (each step plain or k in [1, 3])"),
        ("always", "policy always"),
        ("never", "policy never (plain steps only)"),
    ],
)
def test_start_up_log_at_info_names_the_model_and_the_policy(caplog, policy, shown):
    """What a user reads at INFO as a speculative server starts: the model (path, architecture,
    dtype, device) once, and the EAGLE-3 line with the policy and the k it can choose."""
    args = ServerArgs(
        device="cpu",
        dtype="float32",
        speculative_algorithm="EAGLE3",
        speculative_num_steps=3,
        speculative_policy=policy,
        max_total_tokens=1024,
    )
    config = ModelConfig.from_path(args.model_path, dtype="float32", device="cpu")
    with caplog.at_level(logging.INFO, logger="sglang"):
        EAGLEWorkerV2(args, config)
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert f"Model: {demo.TARGET_PATH} (LlamaForCausalLM, float32) on cpu" in lines, lines
    eagle = next(line for line in lines if line.startswith("EAGLE-3:"))
    assert f"draft {demo.DRAFT_PATH}" in eagle and "k = 3" in eagle and eagle.endswith(f"; {shown}"), eagle
    assert sum(line.startswith("Model:") for line in lines) == 1, "the draft's runner logs no model line"
