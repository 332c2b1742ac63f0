"""Replicas behind the real sglang-router, started both ways: our `python -m sglang.launch_server
--dp-size 2` and upstream's `python -m sglang_router.launch_server --dp-size 2`.

Each launcher gets one set of processes for the whole module (tests run in file order per
launcher; the last two kill a replica, then stop everything). The replicas speculate with the
demo pair under the threshold policy (speculate while a replica decodes at most one request),
so a replica's speculation shows whether it follows its own batch.
"""

from __future__ import annotations

import concurrent.futures
import gc
import os
import signal
import subprocess
import sys
import time

import httpx
import openai
import pytest

import sglang
import sglang_router  # noqa: F401  a test dependency (the "router" extra): missing, the module fails
from sglang import demo
from sglang.srt.entrypoints.replicas import READY_MESSAGE, parse_launch_args, replica_args
from sglang.srt.server_args import ServerArgs
from sglang.test.runner_utils import OneRank
from sglang.test.server_fixture import ServerProcess, free_port

LAUNCHERS = {"sglang": "sglang.launch_server", "sglang_router": "sglang_router.launch_server"}
SPECULATION = {"speculative_algorithm": "EAGLE3", "speculative_policy": "threshold", "speculative_threshold": 1}
SERVER_FLAGS = [
    "--max-total-tokens",
    "4096",
    *[x for k, v in SPECULATION.items() for x in (f"--{k.replace('_', '-')}", str(v))],
]
# Sent one at a time to an empty cache, here and to the reference: on the CPU a near-tie in the demo
# model's logits can flip a greedy token with the shape of the computation (the batch, the cached
# prefix), so each request is computed the same way on both sides.
PROMPTS = [
    "def fibonacci(n):",
    "class Stack:\n    def __init__(self):",
    "import os\n\ndef list_files(path):",
    "for i in range(10):",
    "with open(path) as f:",
    "try:\n    import numpy as np\nexcept ImportError:",
]
GREEDY = {"temperature": 0, "max_new_tokens": 24}


def _router_flags() -> list[str]:
    # A free port for the router's Prometheus endpoint (its default, 29000, may be taken), and
    # health checks every second: upstream's launcher has no other way to learn that a replica died.
    return [
        "--router-prometheus-port",
        str(free_port()),
        "--router-log-level",
        "warn",
        "--router-health-check-interval-secs",
        "1",
        "--router-health-failure-threshold",
        "2",
    ]


@pytest.fixture(scope="module")
def reference() -> dict[str, list[int]]:
    """Greedy output ids of a single server with the replicas' settings per prompt, one at a time:
    its Scheduler run in this process (runner_utils.OneRank; an engine's processes take seconds
    of CPU each to start)."""
    one = OneRank(device="cpu", dtype="float32", log_level="warning", max_total_tokens=4096, **SPECULATION)
    outs = {}
    for prompt in PROMPTS:
        assert one.scheduler.flush_cache()
        outs[prompt] = one.generate([prompt], GREEDY)[0]
    del one
    gc.collect()  # the scheduler's KV pool goes with the reference cycles around it
    return outs


@pytest.fixture(scope="module", params=sorted(LAUNCHERS))
def cluster(request):
    server = ServerProcess(
        demo.TARGET_PATH,
        "--dp-size",
        "2",
        *SERVER_FLAGS,
        *_router_flags(),
        module=LAUNCHERS[request.param],
        startup_timeout=300,
    )
    server.workers = _wait_workers(server.base_url, 2)
    server.launcher = request.param
    yield server
    server.stop()


def test_dp_size_without_the_router_names_the_extra(tmp_path):
    hidden = tmp_path / "sglang_router"  # shadows the installed package: as if it were not there
    hidden.mkdir()
    (hidden / "__init__.py").write_text("raise ImportError('No module named sglang_router')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    for argv in (["--dp-size", "2"], ["--dp-size", "2", "--router-policy", "round_robin"]):
        result = subprocess.run(
            [sys.executable, "-m", "sglang.launch_server", "--device", "cpu", *argv],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 2 and "pip install 'sglang[router]'" in result.stderr, result.stderr
        assert "sglang-router, which is not installed" in result.stderr, result.stderr


def test_router_flags_reach_the_router_and_need_replicas(capsys):
    server_args, router_args = parse_launch_args(
        ["--device", "cpu", "--dp-size", "3", "--router-policy", "round_robin", "--router-cache-threshold", "0.5"]
    )
    assert server_args.dp_size == 3 and (router_args.policy, router_args.cache_threshold) == ("round_robin", 0.5)
    assert parse_launch_args(["--device", "cpu"]) == (ServerArgs(device="cpu"), None)
    with pytest.raises(SystemExit):
        parse_launch_args(["--device", "cpu", "--router-policy", "round_robin"])
    assert "it needs --dp-size > 1" in capsys.readouterr().err


def test_router_log_level_follows_the_server_unless_given():
    assert parse_launch_args(["--device", "cpu", "--dp-size", "2"])[1].log_level == "warn"
    assert parse_launch_args(["--device", "cpu", "--dp-size", "2", "--log-level", "debug"])[1].log_level == "debug"
    assert parse_launch_args(["--device", "cpu", "--dp-size", "2", "--router-log-level", "info"])[1].log_level == "info"


def test_an_engine_is_one_replica():
    with pytest.raises(ValueError, match="--dp-size N"):
        sglang.Engine(device="cpu", dp_size=2)


def test_replica_args_place_each_replica():
    args = ServerArgs(device="cpu", dp_size=2, base_gpu_id=1)
    replica = replica_args(args, rank=1, port=31002)
    assert (replica.port, replica.base_gpu_id, replica.dp_size) == (31002, 2, 1)
    assert replica.replicas_per_gpu == args.replicas_per_gpu and replica.model_path == args.model_path


def _wait_workers(router: str, count: int, timeout: float = 300) -> list[str]:
    """The replica URLs once the router lists `count` healthy workers (upstream's launcher
    starts the router before its replicas are up)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        workers = httpx.get(f"{router}/workers", timeout=5).json()["workers"]
        healthy = sorted(w["url"] for w in workers if w["is_healthy"])
        if len(healthy) == count:
            return healthy
        time.sleep(0.5)
    raise TimeoutError(f"the router did not list {count} healthy workers: {workers}")


def _generate(base_url: str, prompt: str, sampling_params: dict = GREEDY) -> httpx.Response:
    return httpx.post(f"{base_url}/generate", json={"text": prompt, "sampling_params": sampling_params}, timeout=120)


def _state(worker: str) -> dict:
    return httpx.get(f"{worker}/get_server_info", timeout=10).json()["internal_states"][0]


def _generated(cluster) -> list[int]:
    return [_state(worker)["num_generated_tokens"] for worker in cluster.workers]


def test_the_ready_message_is_printed_once_when_the_router_serves(cluster):
    """Our launcher's replicas leave it to the launcher, which prints it once the router has taken
    them; upstream's launcher has no such step, so each of its replicas (our servers) prints its own."""
    expected = 1 if cluster.launcher == "sglang" else 2
    deadline = time.monotonic() + 10  # the launcher polls the router's workers every POLL_S
    while cluster.output().count(READY_MESSAGE) < expected and time.monotonic() < deadline:
        time.sleep(0.1)
    assert cluster.output().count(READY_MESSAGE) == expected, cluster.output()


def test_router_serves_greedy_output_equal_to_a_single_server(cluster, reference):
    for prompt in PROMPTS:
        assert httpx.post(f"{cluster.base_url}/flush_cache", timeout=30).status_code == 200  # every replica
        response = _generate(cluster.base_url, prompt)
        assert response.status_code == 200, response.text
        assert response.json()["output_ids"] == reference[prompt], prompt


def test_both_replicas_take_requests(cluster):
    before = _generated(cluster)
    # At once, and no two share a first letter: without a cached prefix to follow, the cache-aware
    # policy sends each to the replica with the fewest requests in flight.
    words = ["apple", "banana", "cherry", "dates", "elder", "figs", "grape", "honey"]
    with concurrent.futures.ThreadPoolExecutor(len(words)) as pool:
        responses = list(pool.map(lambda word: _generate(cluster.base_url, f"{word}_count = len("), words))
    assert all(r.status_code == 200 for r in responses)
    taken = [after - b for after, b in zip(_generated(cluster), before)]
    assert all(n > 0 for n in taken), f"tokens generated per replica: {taken}"


def test_openai_streaming_through_the_router(cluster, reference):
    client = openai.OpenAI(base_url=f"{cluster.base_url}/v1", api_key="none")
    model = client.models.list().data[0].id
    prompt = PROMPTS[0]
    stream = client.completions.create(model=model, prompt=prompt, max_tokens=24, temperature=0, stream=True)
    streamed = "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
    whole = client.completions.create(model=model, prompt=prompt, max_tokens=24, temperature=0)
    assert streamed == whole.choices[0].text and streamed
    chat = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], max_tokens=8, temperature=0, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in chat if c.choices)


def test_router_facing_routes_answer_as_upstream(cluster):
    worker = cluster.workers[0]
    idle = httpx.get(f"{worker}/get_load", timeout=10).json()
    assert idle == [{"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}]
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # a request running on this replica shows
        running = pool.submit(_generate, worker, "def busy(x):", {"max_new_tokens": 200, "ignore_eos": True})
        busy = _poll(lambda: httpx.get(f"{worker}/get_load", timeout=10).json()[0], lambda row: row["num_reqs"])
        assert running.result().status_code == 200
    assert busy["num_reqs"] == 1 and busy["num_tokens"] >= 5, busy  # its prompt and output so far hold KV
    info = httpx.get(f"{worker}/server_info", timeout=10).json()
    assert info["dp_size"] == 1 and info["model_path"] == demo.TARGET_PATH
    assert httpx.get(f"{worker}/model_info", timeout=10).json()["model_path"] == demo.TARGET_PATH
    loads = httpx.get(f"{cluster.base_url}/get_loads", timeout=10).json()["workers"]
    assert sorted(w["worker"] for w in loads) == cluster.workers and all(w["load"] >= 0 for w in loads)
    assert httpx.post(f"{cluster.base_url}/flush_cache", timeout=30).status_code == 200


def test_each_replica_speculates_by_its_own_batch(cluster):
    """A shared prefix makes the cache-aware router send a burst to one replica; a lone request
    goes to the other. The busy replica decodes plainly (batch > 1), the lone one speculates."""
    prefix = 'def merge_sorted_lists(left, right):\n    """Merge two sorted lists into one."""\n'
    before = {w: _state(w) for w in cluster.workers}
    assert _generate(cluster.base_url, prefix).status_code == 200  # its replica now caches the prefix
    busy = next(w for w in cluster.workers if _state(w)["num_generated_tokens"] > before[w]["num_generated_tokens"])
    params = {"temperature": 0, "max_new_tokens": 32, "ignore_eos": True}
    with concurrent.futures.ThreadPoolExecutor(5) as pool:
        burst = [pool.submit(_generate, cluster.base_url, prefix + f"    # case {i}\n", params) for i in range(4)]
        time.sleep(0.3)
        lone = pool.submit(_generate, cluster.base_url, "import sys\n\nif __name__ == '__main__':", params)
        assert all(f.result().status_code == 200 for f in [*burst, lone])
    after = {w: _state(w) for w in cluster.workers}
    quiet = next(w for w in cluster.workers if w != busy)
    tokens = {w: after[w]["num_generated_tokens"] - before[w]["num_generated_tokens"] for w in cluster.workers}
    assert tokens[busy] >= 4 * 32 and tokens[quiet] == 32, f"the router's split: {tokens}"
    plain = {w: after[w]["spec_plain_steps"] - before[w]["spec_plain_steps"] for w in cluster.workers}
    spec = {w: after[w]["spec_steps"] - before[w]["spec_steps"] for w in cluster.workers}
    assert plain[busy] > 0, (plain, spec)
    assert plain[quiet] == 0 and spec[quiet] > 0, (plain, spec)


def test_dead_replica_is_taken_out_and_the_other_keeps_serving(cluster, reference):
    """A request in flight on a replica that dies ends either in the router's HTTP 500 or, when the
    router's retry lands on the live replica, in a whole answer; it never hangs. The router stops
    sending work to the dead replica, and the other serves every later request."""
    long_run = {"temperature": 0, "max_new_tokens": 600, "ignore_eos": True}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        in_flight = pool.submit(_generate, cluster.base_url, "def long_function(x):", long_run)
        victim = _replica_running_a_request(cluster)
        os.kill(_parent_pid(_scheduler_pid(victim)), signal.SIGKILL)  # its HTTP process; its children follow
        failed = in_flight.result()
    if failed.status_code == 200:  # retried from the start on the live replica
        assert failed.json()["meta_info"]["completion_tokens"] == long_run["max_new_tokens"]
    else:
        assert failed.status_code == 500 and "call_upstream_request_error" in failed.text, failed.text
    survivor = next(w for w in cluster.workers if w != victim)
    deadline = time.monotonic() + 120  # our launcher removes it at once, upstream's after 2 health checks
    while _healthy_workers(cluster.base_url) != [survivor] and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _healthy_workers(cluster.base_url) == [survivor]
    for prompt in PROMPTS:
        assert httpx.post(f"{survivor}/flush_cache", timeout=30).status_code == 200
        response = _generate(cluster.base_url, prompt)
        assert response.status_code == 200 and response.json()["output_ids"] == reference[prompt]


def _poll(read, done, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = read()
        if done(value):
            return value
        time.sleep(0.05)
    raise TimeoutError(f"still {value}")


def _replica_running_a_request(cluster, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for worker in cluster.workers:
            if _state(worker)["num_running_reqs"] > 0:
                return worker
        time.sleep(0.1)
    raise TimeoutError("no replica started the request")


def _scheduler_pid(worker: str) -> int:
    return httpx.get(f"{worker}/get_server_info", timeout=10).json()["scheduler_pid"]


def test_sigterm_leaves_no_process(cluster):
    assert cluster.children_pids(), "the launcher should have children to stop"
    cluster.stop(signal.SIGTERM)
    assert cluster.wait_children_gone(timeout=30) == []
    assert cluster.leftover_files() == []


def _parent_pid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _healthy_workers(router: str) -> list[str]:
    return sorted(w["url"] for w in httpx.get(f"{router}/workers", timeout=5).json()["workers"] if w["is_healthy"])
