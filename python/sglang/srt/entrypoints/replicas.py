"""Data parallelism (`--dp-size N`): N replicas of the whole server behind sglang-router.

Each replica is a complete server (HTTP process, scheduler, detokenizer) on a loopback port of
its own and on its own GPU, or on a share of one (`ServerArgs.replicas_per_gpu`). The router is
upstream's Rust load balancer (`pip install 'sglang[router]'`); it listens on --host / --port
and spreads requests over the replicas, cache-aware by default (--router-policy). This process
only supervises: it starts the replicas and the router, takes a replica that dies out of the
router at once, and stops everything on SIGTERM / Ctrl-C. Requests never pass through it.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import logging
import multiprocessing as mp
import multiprocessing.connection as mp_connection
import os
import signal
import time
import urllib.request
from typing import Optional

from sglang.srt.cli_help import DefaultsHelpFormatter
from sglang.srt.server_args import ServerArgs, check_model_paths
from sglang.srt.server_args_refused import LaunchArgumentParser
from sglang.srt.utils import configure_logger, free_port, name_process

logger = logging.getLogger(__name__)
PROG = "python -m sglang.launch_server"
INSTALL_HINT = "pip install 'sglang[router]' (or: pip install sglang-router)"
ROUTER_FLAG_PREFIXES = ("--router-", "--dp-size", "--data-parallel-size")
READY_MESSAGE = "The server is fired up and ready to roll!"
POLL_S = 0.5
ROUTER_LOG_LEVELS = {"debug": "debug", "info": "warn", "warning": "warn", "error": "error", "critical": "error"}
STARTUP_TIMEOUT_S = 1800  # a replica loads its model and captures its graphs first
STOP_TIMEOUT_S = 15
PR_SET_PDEATHSIG = 1  # prctl option (linux/prctl.h)


def parse_launch_args(argv: list[str]):
    """The server's flags, plus the router's (`--router-*`, as `sglang_router.launch_server` takes
    them) when sglang-router is installed and the command asks for replicas or the router."""
    parser = LaunchArgumentParser(
        prog=PROG,
        formatter_class=DefaultsHelpFormatter,
        description="Serve a model over HTTP with SGLang's native and OpenAI-compatible APIs.",
    )
    ServerArgs.add_cli_args(parser)
    router_args_cls = _router_args_class() if any(a.startswith(ROUTER_FLAG_PREFIXES) for a in argv) else None
    if router_args_cls is not None:
        router_args_cls.add_cli_args(parser, use_router_prefix=True, exclude_host_port=True)
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        router_flags = [a for a in unknown if a.startswith("--router-")]
        if router_flags and router_args_cls is None:
            parser.error(f"{router_flags[0]} is a flag of sglang-router, which is not installed: {INSTALL_HINT}")
        parser.unknown_flags(unknown)
    try:
        server_args = ServerArgs.from_cli_args(args)
        check_model_paths(server_args)  # before any process starts
    except ValueError as e:  # one line naming the flag, as prepare_server_args gives
        parser.exit(2, f"{parser.prog}: error: {e}\n")
    if server_args.dp_size == 1:
        given = [a for a in argv if a.startswith("--router-")]
        if given:
            parser.error(f"{given[0]} configures the router in front of replicas; it needs --dp-size > 1")
        return server_args, None
    if router_args_cls is None:
        parser.error(
            f"--dp-size {server_args.dp_size} runs {server_args.dp_size} replicas behind sglang-router, "
            f"which is not installed: {INSTALL_HINT}"
        )
    router_args = router_args_cls.from_cli_args(args, use_router_prefix=True)
    if not any(a.startswith("--router-log-level") for a in argv):
        # The router's info level logs every step of every registration; follow --log-level, a notch quieter.
        router_args.log_level = ROUTER_LOG_LEVELS[server_args.log_level]
    return server_args, router_args


def _router_args_class():
    try:
        from sglang_router.router_args import RouterArgs
    except ImportError:
        return None
    return RouterArgs


def replica_args(server_args: ServerArgs, rank: int, port: int) -> ServerArgs:
    """Replica `rank`'s args: its port, the next GPU (the replica's tensor-parallel group), dp_size 1."""
    return dataclasses.replace(
        server_args, port=port, dp_size=1, base_gpu_id=server_args.base_gpu_id + rank * server_args.tp_size
    )


def run_replica(server_args: ServerArgs, rank: int, launcher_pid: int) -> None:
    """A replica's process (spawned): a whole server."""
    from sglang.srt.entrypoints.http_server import launch_server

    os.environ["SGLANG_DP_RANK"] = str(rank)  # what upstream's launcher sets too
    configure_logger(server_args.log_level, f" DP{rank}")
    name_process(f"sglang-dp{rank}")
    _stop_with_parent(launcher_pid)
    raise SystemExit(launch_server(server_args, announce_ready=False))  # the launcher announces the router


def run_router(router_args, launcher_pid: int) -> None:
    """The router's process (spawned): sglang-router's own launcher, in the foreground."""
    from sglang_router.launch_router import launch_router

    _stop_with_parent(launcher_pid)
    launch_router(router_args)


def _stop_with_parent(launcher_pid: int) -> None:
    """SIGTERM to this process when the launcher dies, even killed without its clean-up, so that
    no replica or router outlives it (Linux's parent-death signal: a watching thread would not do
    for the router, whose Rust loop holds the interpreter)."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: the launcher's own clean-up has to do
        return
    if os.getppid() != launcher_pid:  # it died before the signal was asked for
        os.kill(os.getpid(), signal.SIGTERM)


class ReplicaSet:
    """The replicas and the router, as child processes of this one."""

    def __init__(self, server_args: ServerArgs, router_args):
        self.server_args = server_args
        self.router_args = router_args
        self.ports = [free_port() for _ in range(server_args.dp_size)]
        self.urls = [f"http://{_loopback(server_args.host)}:{port}" for port in self.ports]
        self.ctx = mp.get_context("spawn")  # CUDA is not fork-safe
        self.replicas: list[mp.Process] = []
        self.router: Optional[mp.Process] = None
        self.removed: set[int] = set()

    def run(self) -> int:
        """Serves until stopped; the exit code: 0 after SIGTERM / Ctrl-C, 1 if the router or every
        replica died, or start-up failed."""
        try:
            self._start_replicas()
            if not self._wait_replicas_ready():
                return 1
            self._start_router()
            if not self._wait_router_ready():
                return 1
            print(READY_MESSAGE, flush=True)
            return self._supervise()
        except SystemExit as e:  # SIGTERM / Ctrl-C (the signal handler raises it)
            return e.code if isinstance(e.code, int) else 0
        finally:
            self.stop()

    def _start_replicas(self) -> None:
        for rank, port in enumerate(self.ports):
            args = replica_args(self.server_args, rank, port)
            logger.info("starting replica %d on port %d (GPU slot %d)", rank, port, args.base_gpu_id)
            proc = self.ctx.Process(target=run_replica, args=(args, rank, os.getpid()), name=f"sglang-dp{rank}")
            proc.start()
            self.replicas.append(proc)

    def _wait_replicas_ready(self) -> bool:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        pending = set(range(len(self.replicas)))
        while pending and time.monotonic() < deadline:
            for rank in sorted(pending):
                if not self.replicas[rank].is_alive():
                    logger.error(
                        "replica %d exited during start-up (code %s); stopping", rank, self.replicas[rank].exitcode
                    )
                    return False
                if _healthy(self.urls[rank]):
                    pending.discard(rank)
            time.sleep(POLL_S)
        if pending:
            logger.error("replicas %s were not ready within %d s", sorted(pending), STARTUP_TIMEOUT_S)
        return not pending

    def _start_router(self) -> None:
        self.router_args.worker_urls = list(self.urls)
        self.router_args.host, self.router_args.port = self.server_args.host, self.server_args.port
        if self.router_args.api_key is None:  # the replicas ask for the key: the router must send it
            self.router_args.api_key = self.server_args.api_key
        logger.info(
            "starting sglang-router on %s:%d (policy %s) over %s",
            self.server_args.host,
            self.server_args.port,
            self.router_args.policy,
            ", ".join(self.urls),
        )
        self.router = self.ctx.Process(target=run_router, args=(self.router_args, os.getpid()), name="sglang-router")
        self.router.start()

    def _wait_router_ready(self) -> bool:
        url = f"http://{_loopback(self.server_args.host)}:{self.server_args.port}"
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if not self.router.is_alive():
                logger.error("sglang-router exited during start-up (code %s)", self.router.exitcode)
                return False
            if len(_router_workers(url, self.server_args.api_key)) == len(self.urls):
                return True
            time.sleep(POLL_S)
        logger.error("sglang-router did not take the replicas within %d s", STARTUP_TIMEOUT_S)
        return False

    def _supervise(self) -> int:
        """Waits on the children's exits (woken by the first, not polling): a replica's exit is
        acted on at once, inside the window in which the router retries the requests it lost."""
        while True:
            if not self.router.is_alive():
                logger.error("sglang-router exited (code %s); stopping the replicas", self.router.exitcode)
                return 1
            for rank, proc in enumerate(self.replicas):
                if not proc.is_alive() and rank not in self.removed:
                    self._take_out(rank, proc.exitcode)
            if len(self.removed) == len(self.replicas):
                logger.error("every replica has exited; stopping")
                return 1
            live = [p.sentinel for rank, p in enumerate(self.replicas) if rank not in self.removed]
            mp_connection.wait([self.router.sentinel, *live])

    def _take_out(self, rank: int, exitcode) -> None:
        """A dead replica leaves the router now, not after its failed health checks."""
        self.removed.add(rank)
        logger.error(
            "replica %d (%s) exited with code %s; the router stops sending it requests, the "
            "other replicas keep serving",
            rank,
            self.urls[rank],
            exitcode,
        )
        router = f"http://{_loopback(self.server_args.host)}:{self.server_args.port}"
        try:
            worker_id = _worker_id(router, self.urls[rank], self.server_args.api_key)
            _request(f"{router}/workers/{worker_id}", self.server_args.api_key, method="DELETE", timeout=5)
        except (OSError, http.client.HTTPException, LookupError) as e:
            logger.warning("could not remove replica %d from the router (%s); its health checks will", rank, e)

    def stop(self) -> None:
        """SIGTERM to the router and every replica (each stops its own children), then SIGKILL to
        whatever is left after STOP_TIMEOUT_S."""
        procs = [p for p in [self.router, *self.replicas] if p is not None and p.pid is not None]
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for proc in procs:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                logger.warning("%s did not stop within %d s; killing it", proc.name, STOP_TIMEOUT_S)
                proc.kill()
                proc.join()


def _loopback(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host


def _auth(api_key: Optional[str]) -> dict:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _request(url: str, api_key: Optional[str], method: str = "GET", timeout: float = 2) -> bytes:
    """The body of a 2xx answer (the standard library's client: the server does not depend on
    an HTTP client package); raises OSError (urllib's errors) or http.client.HTTPException."""
    request = urllib.request.Request(url, method=method, headers=_auth(api_key))
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.read()


def _healthy(url: str) -> bool:
    try:
        _request(f"{url}/health", None)
        return True
    except (OSError, http.client.HTTPException):
        return False


def _router_workers(router: str, api_key: Optional[str]) -> list[dict]:
    """The workers the router has registered (its /workers listing), [] while it starts."""
    try:
        return json.loads(_request(f"{router}/workers", api_key)).get("workers", [])
    except (OSError, http.client.HTTPException, ValueError):
        return []


def _worker_id(router: str, url: str, api_key: Optional[str]) -> str:
    for worker in _router_workers(router, api_key):
        if worker.get("url") == url:
            return worker["id"]
    raise LookupError(f"the router does not list {url}")
