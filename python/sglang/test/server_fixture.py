"""Start a real `python -m sglang.launch_server` process on loopback for tests."""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from pathlib import Path

import httpx

from sglang.test.server_zygote import import_time_env

# One TLS context for every request of these helpers: without it each `httpx.get` builds its own,
# loading the CA bundle (about 50 ms of CPU, against 2 ms for the request itself), though a
# loopback server speaks plain HTTP. A server start polls /health a few dozen times.
LOOPBACK_TLS = ssl.create_default_context()


class Zygote:
    """`python -m sglang.test.server_zygote` of this process, started on first use (see there)."""

    _instance: Zygote | None = None
    _lock = threading.Lock()

    def __init__(self, env: dict[str, str]):
        self.env = env
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sglang.test.server_zygote"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        ready = self.proc.stdout.readline()
        if not ready:
            raise RuntimeError(f"the server zygote exited with {self.proc.wait()}")
        weakref.finalize(self, stop_zygote, self.proc)

    @classmethod
    def for_env(cls, module: str, env: dict[str, str]) -> Zygote | None:
        """The zygote that can start this server, or None where a plain process must: another
        launcher module, an environment that differs from the zygote's in what its imports read,
        or SGLANG_TEST_FORKED_SERVERS=0."""
        if (
            module != "sglang.launch_server"
            or env.get("SGLANG_TEST_FORKED_SERVERS", "1") == "0"
            or not hasattr(os, "fork")
        ):
            return None
        with cls._lock:
            if cls._instance is None:
                cls._instance = Zygote(env)
        zygote = cls._instance
        if zygote.proc.poll() is not None or import_time_env(env) != import_time_env(zygote.env):
            return None
        return zygote

    def ask(self, request: dict) -> dict:
        with self._lock:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the server zygote exited")
        return json.loads(line)


def stop_zygote(proc: subprocess.Popen) -> None:
    """EOF on its stdin ends the zygote; waited for, so its CPU time counts in this process's."""
    proc.stdin.close()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class ForkedProcess:
    """The part of `subprocess.Popen` tests use, for a server forked by the zygote (its parent,
    which alone can reap it)."""

    def __init__(self, zygote: Zygote, module: str, args: list[str], env: dict[str, str], log: str):
        self.zygote = zygote
        request = {"op": "spawn", "module": module, "args": args, "env": env, "cwd": os.getcwd(), "log": log}
        self.pid = zygote.ask(request)["pid"]
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.zygote.ask({"op": "poll", "pid": self.pid})["returncode"]
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"server {self.pid}", timeout)
            time.sleep(0.02)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(
        self, model_path: str, *extra_args: str, startup_timeout: float = 120, module: str = "sglang.launch_server"
    ):
        """`module`: the launcher run with `python -m` (sglang_router.launch_server for upstream's)."""
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        cmd = [
            sys.executable,
            "-m",
            module,
            "--model-path",
            model_path,
            "--device",
            "cpu",
            "--dtype",
            "float32",
            "--port",
            str(self.port),
            "--log-level",
            "warning",
            *extra_args,
        ]
        # A private TMPDIR shows what the server leaves behind (its IPC socket directory).
        self.tmpdir = tempfile.mkdtemp(prefix="sglang-test-server-")
        env = dict(os.environ, TMPDIR=self.tmpdir)
        # One torch thread per server process unless asked otherwise: the server's processes, the
        # test's client and other servers share a few cores, and idle OpenMP threads spin on them.
        env.setdefault("OMP_NUM_THREADS", "1")
        # The output goes to a file, not a pipe: nobody reads a pipe while the server runs, and a
        # server that logged more than the pipe holds would block in its next write.
        self._log = tempfile.NamedTemporaryFile(prefix="sglang-test-server-", suffix=".log", delete=False)
        # Own process group, so a test can check that nothing outlives the server. Forked from the
        # zygote where it can (the same server, without importing torch and transformers again).
        zygote = Zygote.for_env(module, env)
        if zygote is not None:
            self.proc = ForkedProcess(zygote, module, cmd[3:], env, self._log.name)
        else:
            self.proc = subprocess.Popen(
                cmd, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True, env=env
            )
        self._log.close()
        weakref.finalize(self, Path(self._log.name).unlink, missing_ok=True)
        self._wait_ready(startup_timeout)

    def output(self) -> str:
        """Everything the server has printed so far (stdout and stderr)."""
        with open(self._log.name, encoding="utf-8", errors="replace") as f:
            return f.read()

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}:\n{self.output()}")
            try:
                if httpx.get(f"{self.base_url}/health", timeout=1, verify=LOOPBACK_TLS).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        self.stop()
        raise TimeoutError(f"the server was not ready within {timeout} s")

    def children_pids(self) -> list[int]:
        """Every live process of the server's session except the server itself (the session, not
        the process group: upstream's router launcher puts each replica in a group of its own)."""
        out = subprocess.run(["ps", "-o", "pid=,stat=", "-s", str(self.proc.pid)], capture_output=True, text=True)
        rows = [line.split() for line in out.stdout.splitlines() if line.strip()]
        return [int(pid) for pid, stat in rows if int(pid) != self.proc.pid and not stat.startswith("Z")]

    def wait_children_gone(self, timeout: float = 5) -> list[str]:
        """Waits for the server's process group to empty; returns the command lines left."""
        deadline = time.monotonic() + timeout
        while self.children_pids() and time.monotonic() < deadline:
            time.sleep(0.1)
        left = self.children_pids()
        if not left:
            return []
        out = subprocess.run(["ps", "-o", "pid=,args=", "-p", ",".join(map(str, left))], capture_output=True, text=True)
        return out.stdout.splitlines()

    def leftover_files(self) -> list[str]:
        return os.listdir(self.tmpdir)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode


def post_in_background(url: str, body: dict, timeout: float = 60) -> tuple[threading.Thread, dict]:
    """POSTs `body` on a thread of its own; the dict gets "status": the HTTP status, or the name of
    the error that ended the request (a server that died under it)."""
    outcome: dict = {}

    def post():
        try:
            outcome["status"] = httpx.post(url, json=body, timeout=timeout, verify=LOOPBACK_TLS).status_code
        except httpx.HTTPError as e:
            outcome["status"] = type(e).__name__

    thread = threading.Thread(target=post)
    thread.start()
    return thread, outcome


def server_state(server: ServerProcess) -> dict:
    return httpx.get(f"{server.base_url}/get_server_info", timeout=10, verify=LOOPBACK_TLS).json()["internal_states"][0]


def assert_server_kv_accounting(server: ServerProcess) -> None:
    """DESIGN.md section 4 through /get_server_info: idle means free + cached == total."""
    assert_idle_kv_accounting(server_state(server))


def assert_engine_kv_accounting(engine) -> None:
    """The same for an in-process `sglang.Engine`."""
    assert_idle_kv_accounting(engine.get_server_info()["internal_state"])


def assert_idle_kv_accounting(state: dict) -> None:
    assert state["num_running_reqs"] == 0 and state["num_queue_reqs"] == 0, state
    assert state["request_slots"] == 0, state
    assert state["free_slots"] + state["cached_slots"] == state["total_slots"], state
    assert state.get("penalty_rows", 0) == 0, state  # every penalized request gave its counts back


def generate(server: ServerProcess, input_ids: list[int], params: dict) -> httpx.Response:
    """POST /generate of one request's token ids with these sampling parameters."""
    return httpx.post(
        server.base_url + "/generate",
        json={"input_ids": input_ids, "sampling_params": params},
        timeout=60,
        verify=LOOPBACK_TLS,
    )


def generated_ids(server: ServerProcess, input_ids: list[int], params: dict) -> list[int]:
    """The output token ids of a /generate request that must succeed."""
    response = generate(server, input_ids, params)
    assert response.status_code == 200, response.text
    return response.json()["output_ids"]


def openai_client(server: ServerProcess, timeout: float = 60):
    """An OpenAI client of the server's /v1 routes (no retries: a failure shows at once)."""
    import openai

    return openai.OpenAI(
        base_url=server.base_url + "/v1",
        api_key="x",
        max_retries=0,
        timeout=timeout,
        http_client=openai.DefaultHttpxClient(verify=LOOPBACK_TLS),
    )
