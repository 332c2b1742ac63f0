"""`python -m sglang.bench_serving` against a real server on the tiny Llama: a concurrency
sweep, token counts against the server's own counters, failed requests, an unreachable server,
the ShareGPT loader and the comparison plot."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import httpx
import pytest
from PIL import Image
from transformers import AutoTokenizer

from sglang import bench_serving
from sglang.benchmark import plot
from sglang.benchmark.backends import RequestResult, ServerError, _parse_event, _spread_tokens_over_chunks
from sglang.benchmark.datasets import DatasetError, ShareGPTDataset
from sglang.test.server_fixture import ServerProcess, assert_server_kv_accounting, free_port, server_state

NUM_PROMPTS = 8
INPUT_LEN, OUTPUT_LEN = 24, 12
DISTRIBUTIONS = ("e2e_latency", "ttft", "tpot", "itl")
STATS = ("mean", "median", "std", "p90", "p95", "p99")
FIELDS = (
    "backend",
    "request_rate",
    "max_concurrency",
    "random_input_len",
    "random_output_len",
    "random_range_ratio",
    "duration",
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "input_throughput",
    "output_throughput",
    "total_throughput",
    "concurrency",
    "accept_length",
    "max_output_tokens_per_s",
    *(f"{stat}_{name}_ms" for name in DISTRIBUTIONS for stat in STATS),
)


@pytest.fixture(scope="module")
def server(tiny_model_paths):
    proc = ServerProcess(tiny_model_paths["llama"], "--enable-metrics")
    yield proc
    proc.stop()


def run_bench(server, output_file, *extra: str) -> tuple[int, list[dict]]:
    """Runs the CLI in this process (later flags override the defaults given here)."""
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
            "0.5",
            "--disable-tqdm",
            "--output-file",
            str(output_file),
            *extra,
        ]
    )
    lines = [json.loads(line) for line in output_file.read_text().splitlines()] if output_file.exists() else []
    return rc, lines


@pytest.fixture(scope="module")
def sweep(server, tmp_path_factory):
    path = tmp_path_factory.mktemp("sweep") / "sweep.jsonl"
    rc, lines = run_bench(server, path, "--max-concurrency", "1,2,4", "--label", "tiny llama")
    return rc, lines, path


def test_sweep_appends_one_sane_line_per_concurrency_level(sweep):
    rc, lines, _ = sweep
    assert rc == 0
    assert [line["max_concurrency"] for line in lines] == [1, 2, 4]
    for line in lines:
        assert not [field for field in FIELDS if field not in line]
        assert line["completed"] == line["num_prompts"] == NUM_PROMPTS and line["failed"] == 0
        assert line["token_count_mismatches"] == 0 and line["errors"] == []
        assert NUM_PROMPTS * INPUT_LEN // 2 <= line["total_input_tokens"] <= NUM_PROMPTS * INPUT_LEN
        assert NUM_PROMPTS * OUTPUT_LEN // 2 <= line["total_output_tokens"] <= NUM_PROMPTS * OUTPUT_LEN
        for field in (
            "request_throughput",
            "input_throughput",
            "output_throughput",
            "total_throughput",
            "max_output_tokens_per_s",
            "duration",
        ):
            assert line[field] > 0, field
        assert line["total_throughput"] == pytest.approx(line["input_throughput"] + line["output_throughput"])
        # At most max_concurrency requests are ever in flight.
        assert 0 < line["concurrency"] <= line["max_concurrency"] + 1e-6
        for name in DISTRIBUTIONS:
            assert 0 < line[f"median_{name}_ms"] <= line[f"p99_{name}_ms"], name
            assert line[f"p90_{name}_ms"] <= line[f"p95_{name}_ms"] <= line[f"p99_{name}_ms"], name
        assert line["median_ttft_ms"] < line["median_e2e_latency_ms"]
        assert line["accept_length"] is None  # no speculation on this server
        assert line["request_rate"] == "inf" and line["label"] == "tiny llama"


def test_requests_per_level_grow_with_concurrency_up_to_the_cap(server, tmp_path, capsys):
    rc, lines = run_bench(
        server,
        tmp_path / "capped.jsonl",
        "--num-prompts",
        "2",
        "--prompts-per-concurrency",
        "3",
        "--max-prompts-per-level",
        "8",
        "--max-concurrency",
        "1,2,4",
    )
    assert rc == 0
    assert [(line["num_prompts"], line["completed"]) for line in lines] == [(3, 3), (6, 6), (8, 8)]
    with pytest.raises(SystemExit):
        bench_serving.main(["--base-url", server.base_url, "--num-prompts", "8", "--max-prompts-per-level", "4"])
    assert "--max-prompts-per-level 4 is below --num-prompts 8" in capsys.readouterr().err


@pytest.mark.parametrize("backend", ["sglang", "sglang-oai", "sglang-oai-chat"])
def test_token_counts_match_the_servers_own_counters(server, tmp_path, backend):
    before_metrics, before_state = prometheus_counters(server), server_state(server)
    rc, [line] = run_bench(
        server,
        tmp_path / "result.jsonl",
        "--backend",
        backend,
        "--max-concurrency",
        "4",
        "--request-rate",
        "200",
        "--warmup-requests",
        "0",
    )
    after_metrics, after_state = prometheus_counters(server), server_state(server)
    assert rc == 0 and line["completed"] == NUM_PROMPTS and line["backend"] == backend
    # Prompt ids sent as ids are counted by the server as sent, and ignore_eos makes every
    # request generate exactly its max tokens (token_count_mismatches counts any request that did not).
    assert line["token_count_mismatches"] == 0
    generated = after_state["num_generated_tokens"] - before_state["num_generated_tokens"]
    assert line["total_output_tokens"] == generated
    assert line["total_output_tokens"] == after_metrics["generation_tokens"] - before_metrics["generation_tokens"]
    assert line["total_input_tokens"] == after_metrics["prompt_tokens"] - before_metrics["prompt_tokens"]
    if backend == "sglang-oai-chat":  # decoded text under the chat template: more tokens than sampled
        assert line["total_input_tokens"] > NUM_PROMPTS * INPUT_LEN // 2
    assert_server_kv_accounting(server)


def prometheus_counters(server) -> dict[str, float]:
    text = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    values = {}
    for name in ("prompt_tokens", "generation_tokens"):
        match = re.search(rf"^sglang:{name}_total\{{[^}}]*\}} (\S+)$", text, re.MULTILINE)
        values[name] = float(match.group(1))
    return values


def write_sharegpt(path, rows: list[dict], jsonl: bool) -> str:
    text = "\n".join(json.dumps(row) for row in rows) if jsonl else json.dumps(rows)
    path.write_text(text)
    return str(path)


def conversation(prompt: str, reply: str) -> dict:
    return {"id": prompt[:8], "conversations": [{"from": "human", "value": prompt}, {"from": "gpt", "value": reply}]}


def test_request_over_the_context_is_counted_as_failed(server, tiny_model_paths, tmp_path, capsys):
    too_long = "xyzzy plugh " * 600
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_paths["llama"])
    assert len(tokenizer.encode(too_long)) > 1024  # the tiny model's context
    rows = [conversation(f"Hello number {i}, how are you?", "Fine, thanks.") for i in range(3)]
    dataset = write_sharegpt(tmp_path / "chats.json", [*rows, conversation(too_long, "never")], jsonl=False)
    rc, [line] = run_bench(
        server,
        tmp_path / "result.jsonl",
        "--dataset-name",
        "sharegpt",
        "--dataset-path",
        dataset,
        "--num-prompts",
        "4",
        "--sharegpt-output-len",
        "6",
        "--warmup-requests",
        "0",
    )
    assert rc == 0  # the other requests were measured
    assert (line["completed"], line["failed"]) == (3, 1)
    assert line["total_output_tokens"] == 3 * 6
    [error] = line["errors"]
    assert error["count"] == 1 and error["error"].startswith("HTTP 400") and "context" in error["error"]
    assert re.search(r"^Failed requests:\s+1$", capsys.readouterr().out, re.MULTILINE)


def test_unreachable_server_exits_nonzero_with_a_one_line_error(tmp_path):
    out = tmp_path / "result.jsonl"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sglang.bench_serving",
            "--port",
            str(free_port()),
            "--num-prompts",
            "2",
            "--output-file",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    [message] = proc.stderr.strip().splitlines()
    assert message.startswith("error: cannot reach the server at http://127.0.0.1:")
    assert not out.exists()


def test_server_stopped_mid_run_fails_its_requests_and_exits_nonzero(tiny_model_paths, tmp_path):
    # 24 requests, two at a time, each ~1-3 s here: the stop lands with most of them unsent,
    # however late the poll below first sees one running (one CI run saw all of 6 complete).
    doomed = ServerProcess(tiny_model_paths["llama"])
    out = tmp_path / "result.jsonl"
    bench = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sglang.bench_serving",
            "--base-url",
            doomed.base_url,
            "--num-prompts",
            "24",
            "--random-input-len",
            "16",
            "--random-output-len",
            "400",
            "--random-range-ratio",
            "1",
            "--max-concurrency",
            "2",
            "--warmup-requests",
            "0",
            "--disable-tqdm",
            "--output-file",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while server_state(doomed)["num_running_reqs"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        doomed.stop()
    stdout, stderr = bench.communicate(timeout=60)
    assert bench.returncode == 1, (stdout, stderr)
    assert "Traceback" not in stderr
    [message] = stderr.strip().splitlines()
    assert message.startswith(f"error: the server at {doomed.base_url} is down")
    [line] = [json.loads(row) for row in out.read_text().splitlines()]
    assert line["failed"] >= 2 and line["completed"] + line["failed"] == 24
    assert sum(error["count"] for error in line["errors"]) == line["failed"]


def test_sharegpt_json_and_jsonl_files_give_the_same_requests(tiny_model_paths, tmp_path):
    import random

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_paths["llama"])
    rows = [conversation(f"Question {i}: what is {i} plus {i}?", f"It is {2 * i}." * (i + 1)) for i in range(5)]
    rows += [
        {"conversations": [{"from": "human", "value": "no reply"}]},
        {"id": "empty", "conversations": []},
        {"conversations": [{"role": "user", "content": "role layout"}, {"role": "assistant", "content": "ok"}]},
    ]
    loaded = [
        ShareGPTDataset(write_sharegpt(tmp_path / name, rows, jsonl), tokenizer, random.Random(3))
        for name, jsonl in (("a.json", False), ("a.jsonl", True))
    ]
    assert loaded[0].requests == loaded[1].requests
    requests = loaded[0].sample(6, random.Random(0))
    assert sorted(r.prompt for r in requests) == sorted(
        [row["conversations"][0]["value"] for row in rows[:5]] + ["role layout"]
    )
    for request in requests:
        assert request.prompt_len == len(tokenizer.encode(request.prompt, add_special_tokens=False))
    reply_of = {row["conversations"][0]["value"]: row["conversations"][1]["value"] for row in rows[:5]}
    for request in requests:
        if request.prompt in reply_of:
            assert request.output_len == len(tokenizer.encode(reply_of[request.prompt], add_special_tokens=False))
    fixed = ShareGPTDataset(str(tmp_path / "a.json"), tokenizer, random.Random(3), output_len=7)
    assert {r.output_len for r in fixed.requests} == {7}
    with pytest.raises(DatasetError, match="6 usable conversations"):
        fixed.sample(7, random.Random(0))


def test_openai_chunks_share_their_tokens_for_the_itl():
    # Five tokens in three chunks (a partial character waits for the next token): after the
    # first, two chunks carry four tokens, two each.
    result = RequestResult(output_tokens=5, chunks=[(10.0, 1), (11.0, 1), (13.0, 1)])
    _spread_tokens_over_chunks(result)
    assert result.itl == [0.5, 1.0]
    assert sum(n for _, n in result.chunks) == 5


def test_stream_events_parse_fast_and_still_take_what_python_json_takes():
    assert _parse_event(b'{"output_ids": [1, 2], "meta_info": {"finish_reason": null}}') == {
        "output_ids": [1, 2],
        "meta_info": {"finish_reason": None},
    }
    # Python's JSON writes NaN for a non-finite logprob; orjson alone would refuse the event.
    assert _parse_event(b'{"logprob": NaN}')["logprob"] != _parse_event(b'{"logprob": NaN}')["logprob"]
    with pytest.raises(ServerError, match="malformed event from the server: b'{\"text\": '"):
        _parse_event(b'{"text": ')


def test_plot_draws_one_line_per_result_file(sweep, tmp_path):
    _, lines, path = sweep
    other = tmp_path / "other.jsonl"
    other.write_text(
        "".join(
            json.dumps({**line, "label": "other config", "output_throughput": line["output_throughput"] * 2}) + "\n"
            for line in lines
        )
    )
    png = tmp_path / "compare.png"
    fig = plot.plot([str(path), str(other)], str(png))
    for ax in fig.axes:
        assert [len(line.get_xdata()) for line in ax.get_lines()] == [3, 3]
        assert [list(line.get_xdata()) for line in ax.get_lines()][0] == [1, 2, 4]
    with Image.open(png) as image:
        assert image.format == "PNG" and image.size[0] > 100
        assert json.loads(image.text["bench_serving_lines"]) == ["tiny llama", "other config"]
    assert bench_serving.main(["plot", str(path), "--output", str(tmp_path / "one.png")]) == 0
    with Image.open(tmp_path / "one.png") as image:
        assert json.loads(image.text["bench_serving_lines"]) == ["tiny llama"]


def test_help_describes_the_tool_in_whole_sentences(capsys):
    with pytest.raises(SystemExit):
        bench_serving.make_parser().parse_args(["--help"])
    description = capsys.readouterr().out.split("\n\n")[1]
    assert " ".join(description.split()).endswith("achieved concurrency (docs/bench_serving.md).")


@pytest.mark.parametrize("backend", ["sglang", "sglang-oai"])
@pytest.mark.parametrize("ending", ["done", "eof"])
def test_a_stream_ending_early_fails_saying_how_it_ended(backend, ending):
    """A stream that stops before its finish reason fails its request, and the error says whether
    [DONE] came or the connection closed, and whether tokens came first (grouped by kind)."""
    import asyncio

    import aiohttp
    from aiohttp import web

    from sglang.benchmark.backends import BackendClient
    from sglang.benchmark.datasets import BenchRequest

    native = backend == "sglang"
    chunk = (
        {"text": "ab", "output_ids": [1, 2], "meta_info": {"finish_reason": None}}
        if native
        else {"choices": [{"index": 0, "text": "ab", "finish_reason": None}]}
    )

    async def handler(request):
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        if ending == "done":
            await response.write(b"data: [DONE]\n\n")
        await response.write_eof()  # a clean end of the body, with or without [DONE]
        return response

    async def main():
        app = web.Application()
        app.router.add_post("/generate" if native else "/v1/completions", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        try:
            async with aiohttp.ClientSession() as session:
                client = BackendClient(session, f"http://127.0.0.1:{port}", backend, "m")
                return await client.send(BenchRequest(prompt=[1, 2, 3], prompt_len=3, output_len=4))
        finally:
            await runner.cleanup()

    result = asyncio.run(main())
    assert not result.success
    expected = "[DONE] came after some tokens" if ending == "done" else "the body ended without [DONE] after some"
    assert result.error.startswith(f"the stream ended before the request finished: {expected}"), result.error


def test_a_measured_run_freezes_the_clients_objects_out_of_the_collector_and_gives_them_back(unfrozen_collector):
    """A full collector pass over the client's ~300K objects (imports, tokenizer, dataset) paused it
    for ~140 ms, time its requests would count as the server's: during a run they are frozen."""
    import asyncio
    import gc
    import random

    from sglang.benchmark import runner

    seen = []

    class Client:
        async def send(self, request):
            seen.append(gc.get_freeze_count())
            return request

    assert gc.get_freeze_count() == 0
    results, _, _ = asyncio.run(
        runner.run_level(Client(), list(range(4)), 2, float("inf"), random.Random(0), "test", disable_tqdm=True)
    )
    assert results == [0, 1, 2, 3] and min(seen) > 10_000, seen
    assert gc.get_freeze_count() == 0, "the client's objects are the collector's again after the run"
