"""Per-request simulated acceptance (benchmarks only) and time-varying traces in bench_serving:
one speculative server under SGLANG_SIMULATE_ACC_LEN gives each request the accept length it asks
for (sampling parameter simulated_accept_length), so one trace can mix easy and hard requests
and change its mix over time."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from sglang import bench_serving, demo
from sglang.benchmark.backends import RequestResult
from sglang.benchmark.trace import Phase, TraceError, load_trace, parse_mix, trace_line
from sglang.srt import bench_hooks
from sglang.srt.errors import InvalidRequest
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.test.server_fixture import ServerProcess


@pytest.fixture(scope="module")
def simulating_server():
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SGLANG_SIMULATE_ACC_LEN", "2.0")
        server = ServerProcess(
            demo.TARGET_PATH,
            "--speculative-algorithm",
            "EAGLE3",
            "--speculative-num-steps",
            "3",
            "--max-total-tokens",
            "4096",
        )
    yield server
    server.stop()


def generate(server, accept_length, max_new=48, text="def f(x):"):
    params = {"temperature": 0, "max_new_tokens": max_new, "ignore_eos": True}
    if accept_length is not None:
        params["simulated_accept_length"] = accept_length
    response = httpx.post(f"{server.base_url}/generate", json={"text": text, "sampling_params": params}, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()["meta_info"]


def test_each_request_gets_the_accept_length_it_asks_for(simulating_server):
    easy = generate(simulating_server, 4.0)  # k = 3: every draft accepted
    hard = generate(simulating_server, 1.0)  # none accepted
    default = generate(simulating_server, None)  # the server's 2.0
    assert easy["spec_accept_length"] == pytest.approx(4.0, abs=0.2), easy
    assert hard["spec_accept_length"] == pytest.approx(1.0, abs=0.05), hard  # the prefill token counts too
    assert hard["spec_accept_length"] < default["spec_accept_length"] < easy["spec_accept_length"]


def test_a_request_accepts_alike_whichever_row_it_runs_in(simulating_server):
    """A benchmark sends every server the same prompts: each request's simulated draws follow its
    prompt, not the request-table row it lands in, so it has the same luck on every server and in
    every round. Each prompt alone (the first free row) and then all at once (other rows) give the
    same accept length."""
    prompts = ["def f(x):", "import os\n", "class Point:", "for i in range(10):"]
    alone = [generate(simulating_server, 2.0, max_new=96, text=text)["spec_accept_length"] for text in prompts]
    with ThreadPoolExecutor(len(prompts)) as pool:
        together = list(
            pool.map(
                lambda text: generate(simulating_server, 2.0, max_new=96, text=text)["spec_accept_length"], prompts
            )
        )
    assert together == alone
    assert len(set(alone)) > 1, "different prompts draw differently"


def test_a_bad_simulated_accept_length_is_refused(simulating_server):
    response = httpx.post(
        f"{simulating_server.base_url}/generate",
        json={"text": "x", "sampling_params": {"simulated_accept_length": 0.5}},
        timeout=60,
    )
    assert response.status_code == 400 and "simulated_accept_length" in response.text


def test_only_a_simulating_speculative_server_takes_it():
    params = SamplingParams.from_dict({"simulated_accept_length": 2.5})
    simulating = bench_hooks.from_env({"SGLANG_SIMULATE_ACC_LEN": "2.0"}).simulates_acceptance
    assert simulating and not bench_hooks.from_env({}).simulates_acceptance
    params.verify_simulation(speculative=False, simulating=False)  # a server without a draft ignores it
    with pytest.raises(InvalidRequest, match="SGLANG_SIMULATE_ACC_LEN"):
        params.verify_simulation(speculative=True, simulating=False)
    params.verify_simulation(speculative=True, simulating=simulating)
    with pytest.raises(InvalidRequest, match="must be"):
        SamplingParams.from_dict({"simulated_accept_length": 99.0}).verify_simulation(speculative=True, simulating=True)


def test_bench_serving_plays_a_trace_with_a_shifting_mix(simulating_server, tmp_path):
    trace = tmp_path / "trace.json"
    trace.write_text(
        json.dumps(
            {
                "phases": [
                    {"seconds": 3, "concurrency": 1, "accept_mix": {"4.0": 1}},
                    {"seconds": 3, "concurrency": [1, 4], "accept_mix": {"4.0": 1, "1.0": 3}},
                ]
            }
        )
    )
    out = tmp_path / "trace.jsonl"
    rc = bench_serving.main(
        [
            "--base-url",
            simulating_server.base_url,
            "--trace",
            str(trace),
            "--random-input-len",
            "16",
            "--random-output-len",
            "16",
            "--disable-tqdm",
            "--warmup-requests",
            "0",
            "--output-file",
            str(out),
        ]
    )
    line = json.loads(out.read_text().splitlines()[-1])
    assert rc == 0 and line["failed"] == 0 and line["completed"] >= 4, line
    first, second = line["phases"]
    assert first["completed"] >= 1 and second["completed"] >= 2
    assert first["target_concurrency"] == [1, 1] and second["target_concurrency"] == [1, 4]
    assert second["accept_mix"] == [[4.0, 1.0], [1.0, 3.0]] or second["accept_mix"] == [(4.0, 1.0), (1.0, 3.0)]
    # Only easy requests in the first phase: more tokens per verify than the mixed second phase.
    assert first["accept_length"] > second["accept_length"], (first["accept_length"], second["accept_length"])
    assert line["output_throughput"] > 0 and line["mean_tpot_ms"] > 0
    assert line["spec_accept_length"] is not None
    # Every delivered token falls in one phase's window or in the drain after the trace's time.
    delivered = sum(phase["window_output_tokens"] for phase in line["phases"]) + line["drain_output_tokens"]
    assert delivered == line["total_output_tokens"] and first["window_output_tokens"] > 0
    assert second["window_output_throughput"] == pytest.approx(second["window_output_tokens"] / 3)


def test_a_phase_counts_the_tokens_delivered_during_it_whoever_started_them():
    """A request started late in phase 0 that streams through phase 1 adds its later tokens to
    phase 1's window, not to phase 0's; tokens after the trace's time are the drain's."""
    start = 100.0
    phases = [Phase(10, 1, 1), Phase(10, 4, 4)]

    def result(*chunks):
        return RequestResult(
            success=True, latency=1.0, ttft=0.1, output_tokens=sum(n for _, n in chunks), chunks=list(chunks)
        )

    spanning = result((start + 9.0, 1), (start + 9.99, 2), (start + 10.0, 3), (start + 12.0, 4))
    late = result((start + 19.5, 5), (start + 21.0, 6))
    failed = RequestResult(success=False, chunks=[(start + 1.0, 7)])
    line = trace_line([(0, spanning), (1, late), (0, failed)], phases, start, 21.5)
    first, second = line["phases"]
    assert (first["window_output_tokens"], second["window_output_tokens"], line["drain_output_tokens"]) == (3, 12, 6)
    assert first["window_output_throughput"] == pytest.approx(0.3) and line["drain_seconds"] == pytest.approx(1.5)
    # The fields of the requests started in each phase stay as they were.
    assert first["total_output_tokens"] == 10 and second["total_output_tokens"] == 11


def test_trace_files_and_mixes_are_checked(tmp_path):
    assert parse_mix("3.0:0.7,1.4:0.3") == [(3.0, 0.7), (1.4, 0.3)]
    assert Phase(10, 1, 257).concurrency_at(5) == 129 and Phase(10, 256, 16).concurrency_at(20) == 16
    for bad in ["x:1", "3.0:0", "0.5:1", ""]:
        with pytest.raises(TraceError):
            parse_mix(bad)
    for phases in [
        [],
        [{"seconds": 0, "concurrency": 1}],
        [{"seconds": 1, "concurrency": 0}],
        [{"seconds": 1, "concurrency": [1, 2, 3]}],
        [{"seconds": 1, "concurrency": 1, "speed": 2}],
    ]:
        path = tmp_path / "bad.json"
        path.write_text(json.dumps({"phases": phases}))
        with pytest.raises(TraceError, match="--trace"):
            load_trace(str(path))


def test_trace_needs_the_native_backend():
    with pytest.raises(SystemExit):
        bench_serving.main(["--backend", "sglang-oai", "--trace", "x.json"])
