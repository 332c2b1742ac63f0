"""sglang.Engine: sampling behaviour, bad requests, start-up failures and shutdown."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
import torch
from scipy import stats

import sglang

PROMPT = "def add(a, b):"


def test_same_seed_same_output_different_seed_different_output(engine_pool):
    engine = engine_pool.get("llama")
    params = {"temperature": 1.0, "max_new_tokens": 24, "ignore_eos": True}
    a = engine.generate(PROMPT, {**params, "sampling_seed": 1})["output_ids"]
    b = engine.generate(PROMPT, {**params, "sampling_seed": 1})["output_ids"]
    c = engine.generate(PROMPT, {**params, "sampling_seed": 2})["output_ids"]
    assert a == b
    assert a != c


def test_top_k_one_equals_greedy(engine_pool):
    engine = engine_pool.get("llama")
    greedy = engine.generate(PROMPT, {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True})
    top1 = engine.generate(
        PROMPT, {"temperature": 1.5, "top_k": 1, "max_new_tokens": 24, "ignore_eos": True, "sampling_seed": 5}
    )
    assert top1["output_ids"] == greedy["output_ids"]


def test_temperature_sampling_follows_softmax_of_scaled_logits(engine_pool, hf_reference):
    engine = engine_pool.get("llama")
    temperature, num_samples = 0.7, 3000
    ids = engine.tokenizer_manager.tokenizer.encode(PROMPT)
    probs = torch.softmax(hf_reference.next_token_logits("llama", ids).double() / temperature, dim=-1).numpy()
    params = [{"temperature": temperature, "max_new_tokens": 1, "sampling_seed": s} for s in range(num_samples)]
    outs = engine.generate(input_ids=[ids] * num_samples, sampling_params=params)
    counts = np.bincount([o["output_ids"][0] for o in outs], minlength=len(probs))
    # Chi-square over the tokens expected at least 5 times, the rest pooled into one bin.
    frequent = probs * num_samples >= 5
    observed = np.append(counts[frequent], counts[~frequent].sum())
    expected = np.append(probs[frequent], probs[~frequent].sum()) * num_samples
    expected *= observed.sum() / expected.sum()
    result = stats.chisquare(observed, expected)
    assert frequent.sum() >= 3, "the test needs a spread distribution"
    assert result.pvalue > 1e-3, (result, observed, expected)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"prompt": ""}, "empty"),
        ({"prompt": "word " * 1100}, "context length"),
        ({"prompt": PROMPT, "sampling_params": {"max_new_tokens": -1}}, "max_new_tokens"),
        ({"prompt": PROMPT, "sampling_params": {"temperature": -0.5}}, "temperature"),
        ({"prompt": PROMPT, "sampling_params": {"top_p": 0.0}}, "top_p"),
        ({"prompt": PROMPT, "sampling_params": {"top_p": 1.5}}, "top_p"),
        ({"prompt": PROMPT, "sampling_params": {"max_new_tokens": 2000}}, "context length"),
        ({"prompt": PROMPT, "sampling_params": {"temprature": 0.5}}, "temprature"),
        ({"input_ids": [1, 2, 10**6]}, "input_ids"),
        ({"prompt": [PROMPT, ""]}, "empty"),
        ({"prompt": PROMPT, "sampling_params": "greedy"}, "sampling_params"),
        ({"prompt": PROMPT, "sampling_params": {"top_k": 0}}, "top_k"),
        ({"prompt": PROMPT, "sampling_params": {"n": 65}}, "'n'"),
        ({"prompt": PROMPT, "sampling_params": {"stop": ["ok", ""]}}, "stop"),
        ({"prompt": PROMPT, "return_logprob": True, "top_logprobs_num": 21}, "top_logprobs_num"),
        ({"prompt": PROMPT, "return_logprob": True, "logprob_start_len": 9}, "logprob_start_len"),
        ({"prompt": [PROMPT, "Hello"], "return_logprob": True, "logprob_start_len": [0, 40]}, "logprob_start_len"),
        ({"prompt": PROMPT, "return_logprob": True, "logprob_start_len": -2}, "logprob_start_len"),
        ({"prompt": PROMPT, "sampling_params": {"stop_token_ids": [10**6]}}, "stop_token_ids"),
        ({"prompt": PROMPT, "sampling_params": {"max_new_tokens": "8"}}, "max_new_tokens"),
        ({"prompt": 123}, "string"),
        ({"input_ids": "1 2 3"}, "input_ids"),
        ({"input_ids": [[1, 2], []]}, "empty"),
        ({"prompt": PROMPT, "input_ids": [1, 2]}, "exactly one"),
        ({"prompt": [PROMPT, PROMPT], "sampling_params": [{}, {}, {}]}, "sampling_params"),
    ],
)
def test_bad_request_gets_a_clear_error_and_the_engine_keeps_serving(engine_pool, kwargs, field):
    engine = engine_pool.get("llama")
    with pytest.raises(ValueError, match=field):
        engine.generate(**kwargs)
    out = engine.generate(PROMPT, {"temperature": 0, "max_new_tokens": 4})
    assert out["meta_info"]["completion_tokens"] == 4


def test_n_samples_are_separate_requests_with_consecutive_seeds(engine_pool):
    engine = engine_pool.get("llama")
    params = {"temperature": 1.0, "max_new_tokens": 12, "ignore_eos": True}
    outs = engine.generate(PROMPT, {**params, "n": 3, "sampling_seed": 10})
    assert len(outs) == 3
    for j, out in enumerate(outs):
        assert out["output_ids"] == engine.generate(PROMPT, {**params, "sampling_seed": 10 + j})["output_ids"]
    assert len({tuple(o["output_ids"]) for o in outs}) == 3
    batch = engine.generate([PROMPT, "Hello"], {**params, "n": 2})
    assert [o["meta_info"]["prompt_tokens"] for o in batch][1] == batch[0]["meta_info"]["prompt_tokens"]
    assert len(batch) == 4


def test_max_new_tokens_zero_returns_no_tokens(engine_pool):
    out = engine_pool.get("llama").generate(PROMPT, {"max_new_tokens": 0})
    assert out["output_ids"] == [] and out["text"] == ""
    assert out["meta_info"]["finish_reason"]["type"] == "length"


def _child_pids() -> set[int]:
    import multiprocessing

    return {p.pid for p in multiprocessing.active_children()}


def test_shutdown_leaves_no_process_and_no_socket_dir(tiny_model_paths):
    engine = sglang.Engine(model_path=tiny_model_paths["llama"], dtype="float32", device="cpu", log_level="warning")
    pids = [engine.subprocesses.scheduler.pid, engine.subprocesses.detokenizer.pid]
    ipc_dir = engine.subprocesses.port_args.ipc_dir
    assert engine.generate(PROMPT, {"max_new_tokens": 2})["meta_info"]["completion_tokens"] == 2
    engine.shutdown()
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}"), f"process {pid} is still there"
    assert not os.path.exists(ipc_dir)


def _broken_copy(src: str, dst, edit) -> str:
    shutil.copytree(src, dst)
    edit(str(dst))
    return str(dst)


def _set_architecture(path: str) -> None:
    cfg_path = os.path.join(path, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["architectures"] = ["MysteryForCausalLM"]
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)


@pytest.mark.parametrize(
    "edit, error, message",
    [
        # Refused before any process starts, from config.json alone.
        (_set_architecture, ValueError, "MysteryForCausalLM"),
        # Found by the scheduler process as it loads, and reported through its start-up pipe.
        (lambda p: os.remove(os.path.join(p, "model.safetensors")), RuntimeError, "safetensors"),
    ],
)
def test_engine_start_failure_names_the_problem_and_leaves_nothing(tiny_model_paths, tmp_path, edit, error, message):
    before = _child_pids()
    path = _broken_copy(tiny_model_paths["llama"], tmp_path / "broken", edit)
    with pytest.raises(error, match=message):
        sglang.Engine(model_path=path, dtype="float32", device="cpu", log_level="critical")
    assert _child_pids() <= before


def test_unknown_engine_argument_is_rejected(tiny_model_paths):
    with pytest.raises(TypeError, match="max_tokens_total"):
        sglang.Engine(model_path=tiny_model_paths["llama"], max_tokens_total=10)


def test_stop_string_ends_generation_and_is_cut_from_the_text(engine_pool):
    engine = engine_pool.get("llama")
    full = engine.generate(PROMPT, {"temperature": 0, "max_new_tokens": 30, "ignore_eos": True})
    text = full["text"]
    stop = text[8:11]  # three characters from the middle of the greedy text
    first = text.find(stop)
    out = engine.generate(PROMPT, {"temperature": 0, "max_new_tokens": 30, "stop": [stop, "never-there"]})
    assert out["text"] == text[:first]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert out["output_ids"] == full["output_ids"][: len(out["output_ids"])]
    kept = engine.generate(PROMPT, {"temperature": 0, "max_new_tokens": 30, "stop": stop, "no_stop_trim": True})
    assert kept["text"].startswith(text[: first + len(stop)])
    assert kept["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    streamed = list(engine.generate(PROMPT, {"temperature": 0, "max_new_tokens": 30, "stop": stop}, stream=True))
    assert streamed[-1]["text"] == text[:first]
    assert all(stop not in chunk["text"] for chunk in streamed)


def test_logprobs_match_the_model_distribution(engine_pool, hf_reference):
    engine = engine_pool.get("llama")
    ids = engine.tokenizer_manager.tokenizer.encode(PROMPT)
    out = engine.generate(
        input_ids=ids, sampling_params={"temperature": 0, "max_new_tokens": 3}, return_logprob=True, top_logprobs_num=5
    )
    token_logprobs, top = out["meta_info"]["output_token_logprobs"], out["meta_info"]["output_top_logprobs"]
    assert [t for _, t, _ in token_logprobs] == out["output_ids"]
    assert len(top) == 3 and all(len(alternatives) == 5 for alternatives in top)
    expected = torch.log_softmax(hf_reference.next_token_logits("llama", ids).double(), dim=-1)
    first_logprob, first_token, _ = token_logprobs[0]
    assert first_logprob == pytest.approx(expected[first_token].item(), abs=1e-4)
    values, tokens = expected.topk(5)
    assert [t for _, t, _ in top[0]] == tokens.tolist()
    assert [lp for lp, _, _ in top[0]] == pytest.approx(values.tolist(), abs=1e-4)
    # Greedy picks the most likely token, so its logprob is the top one.
    assert top[0][0][1] == first_token
    assert "input_token_logprobs" not in out["meta_info"], "logprob_start_len -1: output logprobs only"


def test_prompt_logprobs_match_the_model_at_every_prompt_position(engine_pool, hf_reference):
    engine = engine_pool.get("llama")
    ids = engine.tokenizer_manager.tokenizer.encode(PROMPT)
    out = engine.generate(
        input_ids=ids,
        sampling_params={"temperature": 0, "max_new_tokens": 2},
        return_logprob=True,
        logprob_start_len=0,
        top_logprobs_num=3,
    )
    meta = out["meta_info"]
    expected = hf_reference.prompt_logprobs("llama", ids)
    assert [t for _, t, _ in meta["input_token_logprobs"]] == ids
    assert meta["input_token_logprobs"][0] == (None, ids[0], None) and meta["input_top_logprobs"][0] is None
    for i in range(1, len(ids)):
        logprob, token, _ = meta["input_token_logprobs"][i]
        assert logprob == pytest.approx(expected[i - 1, token].item(), abs=1e-4)
        values, tokens = expected[i - 1].topk(3)
        assert [t for _, t, _ in meta["input_top_logprobs"][i]] == tokens.tolist()
        assert [v for v, _, _ in meta["input_top_logprobs"][i]] == pytest.approx(values.tolist(), abs=1e-4)
    assert len(meta["output_token_logprobs"]) == 2


def test_prompt_logprobs_of_a_batch_with_per_prompt_starts_samples_and_streams(engine_pool):
    engine = engine_pool.get("llama")
    params = {"temperature": 0, "max_new_tokens": 3, "n": 2}
    outs = engine.generate([PROMPT, "Hello there"], params, return_logprob=True, logprob_start_len=[2, -1])
    prompt_len = outs[0]["meta_info"]["prompt_tokens"]
    assert len(outs) == 4 and len(outs[0]["meta_info"]["input_token_logprobs"]) == prompt_len - 2
    assert outs[0]["meta_info"]["input_token_logprobs"] == outs[1]["meta_info"]["input_token_logprobs"]
    assert all("input_token_logprobs" not in o["meta_info"] for o in outs[2:])
    whole = engine.generate(PROMPT, {"temperature": 0, "max_new_tokens": 3}, return_logprob=True, logprob_start_len=0)[
        "meta_info"
    ]["input_token_logprobs"]
    assert whole[2:] == outs[0]["meta_info"]["input_token_logprobs"]
    chunks = list(
        engine.generate(
            PROMPT,
            {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True},
            return_logprob=True,
            logprob_start_len=0,
            stream=True,
        )
    )
    assert all(chunk["meta_info"]["input_token_logprobs"] == whole for chunk in chunks), "from the first chunk on"
    prompt_only = engine.generate(PROMPT, {"max_new_tokens": 0}, return_logprob=True, logprob_start_len=0)
    assert prompt_only["output_ids"] == [] and prompt_only["meta_info"]["input_token_logprobs"] == whole
