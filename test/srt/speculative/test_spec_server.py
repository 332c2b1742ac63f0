"""Speculative decoding through the HTTP server: the demo pair served with --speculative-algorithm
EAGLE3 reports spec_verify_ct in meta_info, accept-length stats in /get_server_info and /metrics,
and the periodic decode log line with `accept len`."""

from __future__ import annotations

import time

import httpx
import pytest

from sglang import demo
from sglang.test.server_fixture import ServerProcess, assert_server_kv_accounting, server_state


@pytest.fixture(scope="module")
def spec_server():
    server = ServerProcess(
        demo.TARGET_PATH,
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-num-steps",
        "3",
        "--enable-metrics",
        "--log-level",
        "info",
        "--skip-server-warmup",
    )
    yield server
    server.stop()


def test_generate_reports_verify_steps_and_stats_are_exposed(spec_server):
    body = {
        "text": "def fibonacci(n):",
        "sampling_params": {"temperature": 0, "max_new_tokens": 160, "ignore_eos": True},
    }
    out = httpx.post(f"{spec_server.base_url}/generate", json=body, timeout=120).json()
    meta = out["meta_info"]
    assert meta["completion_tokens"] == 160
    assert 160 / 4 <= meta["spec_verify_ct"] < 160  # at most k + 1 = 4 tokens per verify
    assert meta["spec_accept_length"] == pytest.approx(160 / meta["spec_verify_ct"])
    state = server_state(spec_server)
    assert state["speculative_num_steps"] == 3 and state["avg_spec_accept_length"] > 1
    metrics = httpx.get(f"{spec_server.base_url}/metrics", timeout=10).text
    accept = [line for line in metrics.splitlines() if line.startswith("sglang:spec_accept_length{")]
    assert accept and float(accept[0].split()[-1]) == pytest.approx(state["avg_spec_accept_length"])
    draft_tokens = [line for line in metrics.splitlines() if line.startswith("sglang:spec_num_draft_tokens{")]
    assert draft_tokens and float(draft_tokens[0].split()[-1]) == 4
    for phase in ("draft", "verify", "extend"):  # mean phase times of recent steps
        line = next(line for line in metrics.splitlines() if line.startswith(f"sglang:spec_{phase}_ms{{"))
        assert float(line.split()[-1]) > 0
    assert_server_kv_accounting(spec_server)


def test_bad_speculative_flags_fail_naming_the_flag():
    for args, flag in (
        (["--speculative-eagle-topk", "2"], "--speculative-eagle-topk"),
        (["--speculative-num-steps", "3", "--speculative-num-draft-tokens", "9"], "--speculative-num-draft-tokens"),
    ):
        with pytest.raises(RuntimeError, match=flag):
            ServerProcess(demo.TARGET_PATH, "--speculative-algorithm", "EAGLE3", *args, startup_timeout=60)


@pytest.mark.parametrize("backend", ["sglang", "sglang-oai"])
def test_bench_serving_reports_the_accept_length(spec_server, tmp_path, backend):
    """From meta_info's spec_verify_ct (native route), or from /get_server_info (OpenAI route)."""
    import json

    from sglang import bench_serving

    out = tmp_path / "spec.jsonl"
    rc = bench_serving.main(
        [
            "--base-url",
            spec_server.base_url,
            "--backend",
            backend,
            "--num-prompts",
            "6",
            "--random-input-len",
            "24",
            "--random-output-len",
            "24",
            "--max-concurrency",
            "3",
            "--disable-tqdm",
            "--warmup-requests",
            "0",
            "--output-file",
            str(out),
        ]
    )
    line = json.loads(out.read_text().splitlines()[-1])
    assert rc == 0 and line["completed"] == 6
    assert 1 <= line["accept_length"] <= 4  # tokens per verify with k = 3
    # The level's own steps, from the server's counters: this server always speculates at k = 3.
    assert line["spec_step_share_by_k"] == {"3": 1.0} and line["spec_steps_by_k"]["3"] >= 24 / 4
    assert line["accept_length"] == line["spec_accept_length"]
    assert line["spec_prompts_without_draft"] == 0  # the draft reads every prompt of an `always` server


def test_decode_log_line_reports_accept_length(spec_server):  # last in this file: it stops the server
    body = {"text": "class Stack:", "sampling_params": {"temperature": 0, "max_new_tokens": 200, "ignore_eos": True}}
    httpx.post(f"{spec_server.base_url}/generate", json=body, timeout=120)
    spec_server.stop()
    log = spec_server.output()
    lines = [line for line in log.splitlines() if "Decode batch." in line]
    assert lines and all("accept len: " in line for line in lines), log[-2000:]


def test_threshold_server_reports_its_modes_in_metrics_and_logs():
    """A server that speculates only while at most 1 request decodes: a lone request speculates,
    3 concurrent ones decode plainly (the two that joined a batch past the threshold skip the
    draft for good), the first one alone again speculates again; /metrics counts the steps of
    each k and the switches, and the log line names the k of the moment and the start-up line
    names the policy."""
    import concurrent.futures

    server = ServerProcess(
        demo.TARGET_PATH,
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-num-steps",
        "3",
        "--speculative-policy",
        "threshold",
        "--speculative-threshold",
        "1",
        "--enable-metrics",
        "--log-level",
        "info",
        "--skip-server-warmup",
    )
    try:

        def generate(max_new):
            body = {
                "text": "import os\n",
                "sampling_params": {"temperature": 0, "max_new_tokens": max_new, "ignore_eos": True},
            }
            return httpx.post(f"{server.base_url}/generate", json=body, timeout=120).json()

        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            first = pool.submit(generate, 160)  # alone at first, and again at the end
            deadline = time.time() + 60
            while server_state(server)["num_running_reqs"] == 0 and time.time() < deadline:
                time.sleep(0.05)
            outs = [first] + [pool.submit(generate, 40) for _ in range(2)]
            outs = [future.result() for future in outs]
        assert [o["meta_info"]["completion_tokens"] for o in outs] == [160, 40, 40]
        assert outs[1]["meta_info"]["spec_verify_ct"] == outs[2]["meta_info"]["spec_verify_ct"] == 0
        assert 0 < outs[0]["meta_info"]["spec_verify_ct"] < 160
        state = server_state(server)
        assert state["spec_policy"]["name"] == "threshold" and state["spec_policy"]["switches"] >= 1
        metrics = httpx.get(f"{server.base_url}/metrics", timeout=10).text
        steps = {
            line.split('k="')[1].split('"')[0]: float(line.split()[-1])
            for line in metrics.splitlines()
            if line.startswith("sglang:spec_decode_steps{")
        }
        assert steps.get("0", 0) > 0 and steps.get("3", 0) > 0, metrics
        switches = next(line for line in metrics.splitlines() if line.startswith("sglang:spec_mode_switches{"))
        assert float(switches.split()[-1]) == state["spec_policy"]["switches"]

        # The policy's acceptance estimate per draft position and its expected tokens per k.
        def labelled(name, label):
            return {
                line.split(f'{label}="')[1].split('"')[0]: float(line.split()[-1])
                for line in metrics.splitlines()
                if line.startswith(f"sglang:{name}{{")
            }

        rates = labelled("spec_position_acceptance", "position")
        assert rates == {str(i + 1): pytest.approx(a) for i, a in enumerate(state["spec_policy"]["acceptance_rates"])}
        assert len(rates) == 3 and all(0 <= a <= 1 for a in rates.values())
        expected = labelled("spec_expected_tokens", "k")
        assert expected["0"] == 1 and 1 <= expected["1"] <= expected["3"] <= 4
        assert_server_kv_accounting(server)
    finally:
        server.stop()
    log = server.output()
    assert any("spec k: " in line for line in log.splitlines() if "Decode batch." in line), log[-2000:]


def test_cost_server_shows_learned_costs_and_exploration_in_metrics_and_server_info(monkeypatch):
    """A dynamic server prices its steps by what they cost it: /get_server_info and /metrics show
    the start-up table (prior) and the learned cost per (k, bucket) for the k that ran, the
    exploration share and its estimated cost; the decode log line sets the tokens per second the
    policy expects of its k beside the served ones."""
    # The draft reads the request's prompt whatever admission would judge: on a loaded CPU the
    # start-up table can price speculation at batch 1 as a loss, and a request admitted without the
    # draft decodes plainly with no evaluation of the policy (so no expected tokens per second).
    monkeypatch.setenv("SGLANG_DRAFT_FOLLOWS_ALL", "1")
    server = ServerProcess(
        demo.TARGET_PATH,
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-adaptive",
        "--enable-metrics",
        "--log-level",
        "info",
        "--skip-server-warmup",
    )
    try:
        # Long enough for a decode log line (every 40 decode steps; up to 4 tokens a step).
        body = {
            "text": "def parse(line):",
            "sampling_params": {"temperature": 0, "max_new_tokens": 192, "ignore_eos": True},
        }
        assert httpx.post(f"{server.base_url}/generate", json=body, timeout=120).status_code == 200
        policy = server_state(server)["spec_policy"]
        cost = policy["cost"]
        assert cost["prior"]["plain_ms"] and cost["learned_ms"], cost
        ran = {int(k) for k, n in policy["steps_per_k"].items() if n}
        assert {int(k) for k in cost["learned_ms"]} <= ran
        metrics = httpx.get(f"{server.base_url}/metrics", timeout=10).text
        costs = [line for line in metrics.splitlines() if line.startswith("sglang:spec_step_cost_ms{")]
        assert any('source="prior"' in line for line in costs) and any('source="learned"' in line for line in costs)
        for k, by_bucket in cost["learned_ms"].items():
            for bucket, ms in by_bucket.items():
                line = next(
                    line
                    for line in costs
                    if f'k="{k}"' in line and f'bucket="{bucket}"' in line and 'source="learned"' in line
                )
                assert float(line.split()[-1]) == pytest.approx(ms)
        share = next(line for line in metrics.splitlines() if line.startswith("sglang:spec_exploration_share{"))
        assert float(share.split()[-1]) == pytest.approx(policy["exploration"]["share"])
        assert any(line.startswith("sglang:spec_exploration_cost_share{") for line in metrics.splitlines())
        assert_server_kv_accounting(server)
    finally:
        server.stop()
    lines = [line for line in server.output().splitlines() if "Decode batch." in line]
    assert lines and all(float(line.split("expected (token/s): ")[1].split(",")[0]) > 0 for line in lines), lines
