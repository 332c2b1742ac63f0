"""Upstream bench_serving command lines against our `python -m sglang.bench_serving`: its backend
names, datasets, request flags and result fields on a real server with the tiny Llama, and the
upstream flags we refuse by name."""

from __future__ import annotations

import datetime
import json
import random
import statistics

import pytest
from transformers import AutoTokenizer

from sglang import bench_serving
from sglang.benchmark.datasets import RandomDataset, SharedPrefixDataset, ShareGPTDataset, chat_template_text
from sglang.benchmark.runner import arrival_gap
from sglang.test.server_fixture import ServerProcess

NUM_PROMPTS, INPUT_LEN, OUTPUT_LEN = 4, 16, 8


@pytest.fixture(scope="module")
def server(tiny_model_paths):
    proc = ServerProcess(tiny_model_paths["llama"])
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def tokenizer(tiny_model_paths):
    return AutoTokenizer.from_pretrained(tiny_model_paths["llama"])


def run_bench(server, output_file, *extra: str) -> tuple[int, list[dict]]:
    rc = bench_serving.main(
        [
            "--base-url",
            server.base_url,
            "--num-prompts",
            str(NUM_PROMPTS),
            "--random-input-len",
            str(INPUT_LEN),
            "--random-output-len",
            str(OUTPUT_LEN),
            "--random-range-ratio",
            "1",
            "--warmup-requests",
            "0",
            "--disable-tqdm",
            "--output-file",
            str(output_file),
            *extra,
        ]
    )
    lines = [json.loads(line) for line in output_file.read_text().splitlines()] if output_file.exists() else []
    return rc, lines


def write_sharegpt(path, pairs: list[tuple[str, str]]) -> str:
    path.write_text(
        json.dumps(
            [
                {"conversations": [{"from": "human", "value": prompt}, {"from": "gpt", "value": reply}]}
                for prompt, reply in pairs
            ]
        )
    )
    return str(path)


def test_upstream_result_fields_and_output_details(server, tmp_path):
    rc, [line] = run_bench(
        server, tmp_path / "r.jsonl", "--backend", "sglang-native", "--tag", "nightly", "--output-details"
    )
    assert rc == 0 and line["completed"] == NUM_PROMPTS and line["backend"] == "sglang-native"
    assert line["tag"] == "nightly" and line["sharegpt_output_len"] is None
    assert line["total_input_text_tokens"] == line["total_input_tokens"] and line["total_input_vision_tokens"] == 0
    assert 1 <= line["max_concurrent_requests"] <= NUM_PROMPTS
    assert line["total_output_tokens_retokenized"] > 0
    assert line["server_info"]["model_path"]
    # Upstream's per-request arrays, in sending order; its `errors` holds one string per request.
    assert line["output_lens"] == [OUTPUT_LEN] * NUM_PROMPTS and line["input_lens"] == [INPUT_LEN] * NUM_PROMPTS
    # One gap per streamed chunk after the first: a loaded server may coalesce a request's tokens into
    # fewer chunks (all of them into one: no gaps), never more than one per token.
    assert len(line["ttfts"]) == len(line["itls"]) == NUM_PROMPTS
    assert all(len(i) < OUTPUT_LEN and all(gap >= 0 for gap in i) for i in line["itls"]), line["itls"]
    assert all(isinstance(text, str) and text for text in line["generated_texts"])
    assert line["errors"] == [""] * NUM_PROMPTS and line["error_summary"] == []


@pytest.mark.parametrize("backend", ["sglang", "vllm", "lmdeploy-chat"])
def test_disable_stream_sends_one_answer_per_request(server, tmp_path, backend):
    rc, [line] = run_bench(server, tmp_path / "r.jsonl", "--backend", backend, "--disable-stream")
    assert rc == 0 and line["completed"] == NUM_PROMPTS and line["token_count_mismatches"] == 0
    assert line["total_output_tokens"] == NUM_PROMPTS * OUTPUT_LEN
    assert line["mean_ttft_ms"] == pytest.approx(line["mean_e2e_latency_ms"])  # everything arrives at once
    assert line["median_itl_ms"] is None


@pytest.mark.parametrize(
    "backend, body", [("sglang", {"sampling_params": {"max_new_tokens": 3}}), ("sglang-oai-chat", {"max_tokens": 3})]
)
def test_extra_request_body_overrides_and_eos_may_end_requests_early(server, tmp_path, backend, body):
    rc, [line] = run_bench(
        server,
        tmp_path / "r.jsonl",
        "--backend",
        backend,
        "--disable-ignore-eos",
        "--extra-request-body",
        json.dumps(body),
    )
    assert rc == 0 and line["completed"] == NUM_PROMPTS
    assert line["total_output_tokens"] <= NUM_PROMPTS * 3
    # Without ignore_eos a request may end before its length: that is no token-count mismatch.
    assert line["token_count_mismatches"] == 0


def test_generated_shared_prefix_groups_questions_behind_shared_system_prompts(server, tokenizer, tmp_path):
    rc, [line] = run_bench(
        server,
        tmp_path / "r.jsonl",
        "--dataset-name",
        "generated-shared-prefix",
        "--gsp-num-groups",
        "2",
        "--gsp-prompts-per-group",
        "3",
        "--gsp-system-prompt-len",
        "32",
        "--gsp-question-len",
        "4",
        "--gsp-output-len",
        "5",
        "--num-prompts",
        "6",
    )
    assert rc == 0 and line["dataset_name"] == "generated-shared-prefix"
    assert (line["completed"], line["total_output_tokens"]) == (6, 30)
    dataset = SharedPrefixDataset(tokenizer, list(range(10, 200)), random.Random(0), 2, 3, 32, 4, 5)
    systems = [request.prompt.split("\n\n")[0] for request in dataset.requests]
    assert len(systems) == 6 and sorted(systems.count(system) for system in set(systems)) == [3, 3]
    assert len({request.prompt for request in dataset.requests}) == 6


def test_dataset_path_alone_means_sharegpt_as_upstream(server, tmp_path):
    path = write_sharegpt(tmp_path / "chats.json", [(f"Question {i}: what is {i} plus {i}?", "ok") for i in range(4)])
    rc, [line] = run_bench(server, tmp_path / "r.jsonl", "--dataset-path", path, "--sharegpt-output-len", "4")
    assert rc == 0 and line["dataset_name"] == "sharegpt" and line["sharegpt_output_len"] == 4
    assert line["total_output_tokens"] == NUM_PROMPTS * 4


def test_sharegpt_context_len_drops_long_conversations_and_chat_template_wraps(tokenizer, tmp_path):
    path = write_sharegpt(tmp_path / "chats.json", [("short one", "fine"), ("a much longer prompt " * 20, "fine")])
    kept = ShareGPTDataset(path, tokenizer, random.Random(0), output_len=4, context_len=30)
    assert [request.prompt for request in kept.requests] == ["short one"]
    wrapped = ShareGPTDataset(
        path, tokenizer, random.Random(0), output_len=4, wrap=lambda text: chat_template_text(tokenizer, text)
    )
    assert sorted(r.prompt for r in wrapped.requests)[1] == "<|user|>short one\n<|assistant|>"


def test_random_with_a_dataset_path_cuts_prompts_from_its_prompts(tokenizer):
    source = [[5, 6, 7], [8, 9]]
    requests = RandomDataset(list(range(100)), 7, 2, 1.0, source_prompts=source).sample(20, random.Random(0))
    assert {tuple(r.prompt) for r in requests} <= {(5, 6, 7, 5, 6, 7, 5), (8, 9, 8, 9, 8, 9, 8)}
    assert {r.prompt_len for r in requests} == {7}


def test_burstiness_keeps_the_rate_and_changes_the_spread():
    for burstiness, squared_cv in ((1.0, 1.0), (0.25, 4.0), (4.0, 0.25)):
        rng = random.Random(0)
        gaps = [arrival_gap(rng, 10.0, burstiness) for _ in range(40000)]
        assert statistics.fmean(gaps) == pytest.approx(0.1, rel=0.05)
        assert statistics.pvariance(gaps) / statistics.fmean(gaps) ** 2 == pytest.approx(squared_cv, rel=0.1)


def test_without_output_file_the_line_goes_to_upstreams_file_name(server, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert (
        bench_serving.main(
            [
                "--base-url",
                server.base_url,
                "--num-prompts",
                "2",
                "--random-input-len",
                "8",
                "--random-output-len",
                "3",
                "--warmup-requests",
                "0",
                "--disable-tqdm",
            ]
        )
        == 0
    )
    name = f"sglang_{datetime.date.today():%m%d}_2_8_3.jsonl"
    [line] = [json.loads(row) for row in (tmp_path / name).read_text().splitlines()]
    assert line["completed"] == 2


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--lora-name", "a", "b"],
            "--lora-name (upstream bench_serving) is not supported here: the engine serves no LoRA",
        ),
        (["--pd-separated"], "--pd-separated (upstream bench_serving) is not supported here"),
        (["--profile"], "--profile (upstream bench_serving) is not supported here"),
        (["--return-logprob"], "--extra-request-body"),
        (["--backend", "trt"], "--backend trt (upstream bench_serving) is not supported here"),
        (["--dataset-name", "mmmu"], "--dataset-name mmmu (upstream bench_serving) is not supported here"),
        (["--dataset-name", "sharegpt", "--dataset-path", "x.json", "--tokenize-prompt"], "--tokenize-prompt needs"),
        (["--backend", "sglang-oai-chat", "--apply-chat-template"], "the chat route applies the server's template"),
        (["--burstiness", "0.5"], "--burstiness shapes the gaps between arrivals: it needs a finite --request-rate"),
        (["--extra-request-body", "[1]"], "expected a JSON object"),
    ],
)
def test_upstream_flags_we_do_not_implement_are_refused_by_name(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench_serving.main(["--port", "1", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
