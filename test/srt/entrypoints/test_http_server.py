"""The server process: readiness, health, metrics, cache flush, and what happens when a child
process dies or the server is told to stop."""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest

from sglang.srt.entrypoints.http_server import READY_MESSAGE
from sglang.test.server_fixture import ServerProcess, post_in_background


def test_health_routes_and_model_info(server):
    assert httpx.get(f"{server.base_url}/health").status_code == 200
    assert httpx.get(f"{server.base_url}/health_generate", timeout=30).status_code == 200
    info = httpx.get(f"{server.base_url}/get_model_info").json()
    assert info["is_generation"] is True and info["context_len"] == 1024
    server_info = httpx.get(f"{server.base_url}/get_server_info").json()
    state = server_info["internal_states"][0]
    for key in (
        "num_running_reqs",
        "num_queue_reqs",
        "token_usage",
        "last_step_throughput",
        "free_slots",
        "cached_slots",
        "total_slots",
    ):
        assert key in state
    # The scheduler and HTTP processes froze their start-up objects out of the garbage
    # collector's passes (a full pass over them paused a process for ~100-200 ms) and time its passes.
    for gc_state in (state["gc"], server_info["http_gc"]):
        assert gc_state["frozen_objects"] > 10_000, gc_state
        assert len(gc_state["passes"]) == 3 and gc_state["longest_s"] >= 0


def test_the_cpu_servers_children_are_forked_with_its_environment_and_default_signal_handlers(server):
    """On the CPU the scheduler and the detokenizer are forked from the HTTP process (no second
    import of torch): their command line is the server's, their environment is the server's, their
    output lands in the server's log, and they do not catch SIGTERM (only the HTTP process does: it
    stops its children)."""

    def proc_file(pid: int, name: str) -> bytes:
        with open(f"/proc/{pid}/{name}", "rb") as f:
            return f.read()

    def catches_sigterm(pid: int) -> bool:
        line = next(line for line in proc_file(pid, "status").decode().splitlines() if line.startswith("SigCgt:"))
        return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))

    by_name = {proc_file(pid, "comm").decode().strip(): pid for pid in server.children_pids()}
    http = server.proc.pid
    assert catches_sigterm(http)
    for child in (by_name["sglang-sched"], by_name["sglang-detok"]):
        assert proc_file(child, "cmdline") == proc_file(http, "cmdline")
        assert proc_file(child, "environ") == proc_file(http, "environ")
        assert not catches_sigterm(child)
        for fd in (1, 2):
            assert os.readlink(f"/proc/{child}/fd/{fd}") == os.readlink(f"/proc/{http}/fd/{fd}")
    assert "huggingface/tokenizers" not in server.output()  # no warning of a fork after parallel use


def test_metrics_count_requests_and_tokens(server):
    def scrape() -> dict[str, float]:
        text = httpx.get(f"{server.base_url}/metrics").text
        values = {}
        for line in text.splitlines():
            if line.startswith("sglang:") and " " in line:
                name, value = line.rsplit(" ", 1)
                values[name.split("{")[0]] = float(value)
        return values

    before = scrape()
    body = {"text": "Hello", "sampling_params": {"max_new_tokens": 7, "temperature": 0, "ignore_eos": True}}
    assert httpx.post(f"{server.base_url}/generate", json=body, timeout=30).status_code == 200
    after = scrape()
    assert after["sglang:num_requests_total"] == before.get("sglang:num_requests_total", 0) + 1
    assert after["sglang:generation_tokens_total"] == before.get("sglang:generation_tokens_total", 0) + 7
    assert after["sglang:time_to_first_token_seconds_count"] >= 1
    assert after["sglang:inter_token_latency_seconds_count"] >= 6
    for gauge in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage"):
        assert gauge in after


def test_flush_cache_empties_the_prefix_cache(server):
    body = {"text": "a prompt to cache", "sampling_params": {"max_new_tokens": 3}}
    httpx.post(f"{server.base_url}/generate", json=body, timeout=30)
    assert httpx.post(f"{server.base_url}/flush_cache").status_code == 200
    state = httpx.get(f"{server.base_url}/get_server_info").json()["internal_states"][0]
    assert state["cached_slots"] == 0


def test_killed_scheduler_fails_waiting_clients_and_the_server_exits(tiny_model_paths):
    srv = ServerProcess(tiny_model_paths["llama"])
    info = httpx.get(f"{srv.base_url}/get_server_info").json()
    body = {"text": "Hello", "sampling_params": {"max_new_tokens": 1000, "ignore_eos": True}}
    waiter, outcome = post_in_background(f"{srv.base_url}/generate", body)
    time.sleep(0.5)
    killed_at = time.monotonic()
    os.kill(info["scheduler_pid"], signal.SIGKILL)
    health = _poll_until_not_healthy(srv.base_url, deadline=killed_at + 10)
    assert health != 200
    # Until it exits, every route answers in JSON: the native one like the OpenAI ones.
    for route, body in (("/generate", {"text": "Hello"}), ("/v1/completions", {"prompt": "Hello"})):
        response = httpx.post(f"{srv.base_url}{route}", json=body, timeout=10)
        assert response.status_code == 500 and "scheduler" in response.json()["error"]["message"], response.text
    srv.proc.wait(timeout=max(0.1, killed_at + 10 - time.monotonic()))
    assert srv.proc.returncode != 0
    waiter.join(timeout=10)
    assert outcome.get("status") not in (None, 200), outcome
    assert srv.wait_children_gone() == []
    assert srv.leftover_files() == []


# Run as `python -m hanging_scheduler`: the spawned server processes import it again (as their
# __mp_main__), so the scheduler process's step hangs on the request whose rid is "stuck".
HANGING_SCHEDULER = """import sys
import time

from sglang.srt.managers import scheduler

_step = scheduler.Scheduler.step


def step(self):
    if any(req.rid == "stuck" for req in self.waiting_queue):
        time.sleep(3600)
    return _step(self)


scheduler.Scheduler.step = step

if __name__ == "__main__":
    from sglang.srt.entrypoints.http_server import main

    main(sys.argv[1:])
"""


def test_a_scheduler_stuck_in_a_step_trips_the_watchdog_and_the_server_exits(tiny_model_paths, tmp_path, monkeypatch):
    (tmp_path / "hanging_scheduler.py").write_text(HANGING_SCHEDULER)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    srv = ServerProcess(tiny_model_paths["llama"], "--watchdog-timeout", "2", module="hanging_scheduler")
    sent_at = time.monotonic()
    response = httpx.post(f"{srv.base_url}/generate", json={"text": "Hello", "rid": "stuck"}, timeout=30)
    assert response.status_code == 500 and "watchdog" in response.json()["error"]["message"], response.text
    assert time.monotonic() - sent_at < 10
    srv.proc.wait(timeout=15)
    assert srv.proc.returncode != 0
    log = srv.output()
    assert "scheduler watchdog" in log and "--watchdog-timeout" in log and "hanging_scheduler.py" in log, log[-3000:]
    assert srv.wait_children_gone() == []


def _poll_until_not_healthy(base_url: str, deadline: float):
    while time.monotonic() < deadline:
        try:
            status = httpx.get(f"{base_url}/health", timeout=1).status_code
        except httpx.HTTPError as e:
            return type(e).__name__
        if status != 200:
            return status
        time.sleep(0.2)
    return 200


@pytest.fixture(scope="module")
def unmetered_server(tiny_model_paths):
    """A server without --enable-metrics, for the metrics check and then the SIGTERM case of the
    stop test, which stops it (so the metrics test comes first in this file): a server's start
    is the expensive part of both."""
    srv = ServerProcess(tiny_model_paths["llama"], "--skip-server-warmup")
    yield srv
    srv.stop()


def test_metrics_route_is_off_without_the_flag(unmetered_server):
    response = httpx.get(f"{unmetered_server.base_url}/metrics")
    assert response.status_code == 404 and "--enable-metrics" in response.json()["error"]["message"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_stop_signal_leaves_no_process_and_no_socket_dir(tiny_model_paths, request, sig):
    if sig == signal.SIGTERM:
        srv = request.getfixturevalue("unmetered_server")
        assert srv.proc.poll() is None, "the shared server was stopped before this test"
    else:
        srv = ServerProcess(tiny_model_paths["llama"], "--skip-server-warmup")
    body = {"text": "Hello", "sampling_params": {"max_new_tokens": 4}}
    assert httpx.post(f"{srv.base_url}/generate", json=body, timeout=30).status_code == 200
    children = srv.children_pids()
    assert len(children) >= 2  # scheduler and detokenizer
    assert srv.stop(sig) == 0
    output = srv.output()
    assert READY_MESSAGE in output
    assert srv.wait_children_gone() == []
    assert srv.leftover_files() == []


def test_start_failure_exits_non_zero_with_the_reason(tmp_path):
    from sglang.test.server_fixture import free_port
    import subprocess
    import sys

    (tmp_path / "config.json").write_text('{"architectures": ["MysteryForCausalLM"], "model_type": "llama"}')
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "sglang.launch_server",
            "--model-path",
            str(tmp_path),
            "--device",
            "cpu",
            "--port",
            str(free_port()),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert "MysteryForCausalLM" in result.stdout + result.stderr
