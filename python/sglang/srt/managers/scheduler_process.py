"""The scheduler process: receives requests over ZMQ, steps the Scheduler, sends outputs."""

from __future__ import annotations

import cProfile
import faulthandler
import io
import logging
import os
import pstats
import shutil
import signal
import sys
import threading
import time
import traceback

import torch
import zmq

from sglang.srt.bench_hooks import PROFILE_ENV
from sglang.srt.distributed.parallel_state import init_tensor_parallel
from sglang.srt.gc_pauses import settle_after_startup
from sglang.srt.managers.child_processes import WATCHDOG_EXIT_CODE
from sglang.srt.managers.io_struct import AbortReq, ControlReply, ControlReq, TokenizedGenerateReqInput
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.managers.step_times import make_step_clock, write_period_files, write_text
from sglang.srt.server_args import PortArgs, ServerArgs
from sglang.srt.utils import configure_logger, name_process

logger = logging.getLogger(__name__)
IDLE_POLL_MS = 1000
PARENT_CHECK_S = 1.0  # while busy, how often the loop checks that its parent still lives
PROFILE_TOP = 60


class StepWatchdog:
    """--watchdog-timeout: a step that runs this long means the scheduler is stuck (a hung kernel or
    collective, a deadlock). Its stack is dumped and the process exits, so that the server fails its
    requests and exits instead of hanging. Watched from a thread of its own, which the GIL lets run
    while the stuck step waits on the device or a lock."""

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self.started: float | None = None  # monotonic start of the step running now; None between steps
        threading.Thread(target=self._watch, name="sglang-watchdog", daemon=True).start()

    def begin(self) -> None:
        self.started = time.monotonic()

    def end(self) -> None:
        self.started = None

    def _watch(self) -> None:
        while True:
            time.sleep(min(1.0, self.timeout_s / 4))
            started = self.started
            if started is not None and time.monotonic() - started > self.timeout_s:
                logger.error(
                    "scheduler watchdog: a step has run for more than %s s (--watchdog-timeout); "
                    "dumping the stack and exiting",
                    self.timeout_s,
                )
                faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
                os._exit(WATCHDOG_EXIT_CODE)


class BusyProfiler:
    """Diagnosis only (`SGLANG_SCHEDULER_PROFILE=PREFIX`): profiles the scheduler loop with
    cProfile and, once the loop has idled for a poll interval, writes the busy period just ended
    as PREFIX.N.prof (pstats) and PREFIX.N.txt (the top functions by own and by cumulative time),
    then starts a new period. Each burst of load separated by a second of idleness gets its own
    files. cProfile's overhead on every Python call slows the loop while on."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.periods = 0
        self.busy = False
        self.stopped = False
        self.profile = cProfile.Profile()

    def start(self) -> None:
        self.profile.enable()

    def on_idle(self) -> None:
        """Called when the loop has idled a full poll interval."""
        if not self.busy or self.stopped:
            return
        self.profile.disable()
        self.busy = False
        path = f"{self.prefix}.{self.periods}"
        text = io.StringIO()
        stats = pstats.Stats(self.profile, stream=text)
        for key in ("tottime", "cumulative"):
            stats.sort_stats(key).print_stats(PROFILE_TOP)
        report = text.getvalue()
        if not write_period_files(
            PROFILE_ENV,
            path,
            {".prof": self.profile.dump_stats, ".txt": lambda p: write_text(p, report)},
            "scheduler profiles",
            logger,
        ):
            self.stopped = True
            return
        self.periods += 1
        self.profile = cProfile.Profile()
        self.start()


def run_scheduler_process(server_args: ServerArgs, port_args: PortArgs, ready_pipe) -> None:
    configure_logger(server_args.log_level, " Scheduler")
    name_process("sglang-sched")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when we stop
    parent_pid = os.getppid()
    if server_args.device == "cpu":
        threads = cpu_intra_op_threads()
        torch.set_num_threads(threads)
        logger.info(
            "torch intra-op threads: %d (%s)",
            threads,
            "OMP_NUM_THREADS" if os.environ.get("OMP_NUM_THREADS") else "usable CPUs - 2, at most 16",
        )
    try:
        select_gpu(server_args)
        # Rank 0 of tensor parallelism runs the scheduler; the other ranks (tp_follower_process)
        # build and run what it announces.
        init_tensor_parallel(0, server_args.tp_size, port_args.tp_init_address, server_args.device)
        scheduler = Scheduler(server_args)
    except Exception as e:
        logger.error("scheduler failed to start:\n%s", traceback.format_exc())
        ready_pipe.send({"status": "error", "message": f"{type(e).__name__}: {e}"})
        raise SystemExit(1)
    loop = SchedulerLoop(scheduler, port_args, parent_pid, StepWatchdog(server_args.watchdog_timeout))
    scheduler.gc_watch = settle_after_startup("scheduler", server_args.gc_warning_threshold_secs)
    ready_pipe.send({"status": "ready", **scheduler.model_info()})
    try:
        loop.run()
    except Exception:
        logger.error("scheduler crashed:\n%s", traceback.format_exc())
        raise SystemExit(1)


# Most intra-op threads a CPU scheduler takes by itself: a small model's matmuls gain nothing from
# more, and every thread spins while it waits for work.
MAX_CPU_THREADS = 16


def cpu_intra_op_threads() -> int:
    """torch's intra-op threads on the CPU: OMP_NUM_THREADS when it is set; otherwise the CPUs this
    process may run on less two (the HTTP and detokenizer processes need one each), at least 1, at
    most MAX_CPU_THREADS. torch's default (every core) makes its threads fight the server's other
    processes: a decode step took ~10x longer on a busy machine."""
    value = os.environ.get("OMP_NUM_THREADS", "")
    if value.isdigit() and int(value) > 0:
        return int(value)
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(usable - 2, MAX_CPU_THREADS))


def select_gpu(server_args: ServerArgs, tp_rank: int = 0) -> None:
    """The GPU this process runs on: --base-gpu-id plus its tensor-parallel rank, wrapped over the
    visible GPUs (replicas that outnumber them share one; each plans its memory from its share, see
    `replicas_per_gpu`)."""
    if server_args.device == "cuda":
        torch.cuda.set_device((server_args.base_gpu_id + tp_rank) % torch.cuda.device_count())


def load_report(scheduler: Scheduler) -> dict:
    """What sglang-router balances on (a row of upstream's /get_load): the requests here, and the
    tokens that hold KV memory or wait for it (KV in use and not evictable, plus waiting prompts)."""
    kv = scheduler.kv_manager.accounting(0)
    waiting = list(scheduler.waiting_queue) + ([scheduler.chunked_req] if scheduler.chunked_req else [])
    num_tokens = kv["total_slots"] - kv["free_slots"] - kv["evictable_slots"]
    num_tokens += sum(len(req.origin_input_ids) for req in scheduler.waiting_queue)
    return {
        "num_reqs": len(scheduler.running_reqs) + len(waiting),
        "num_waiting_reqs": len(waiting),
        "num_tokens": num_tokens,
    }


class SchedulerLoop:
    def __init__(self, scheduler: Scheduler, port_args: PortArgs, parent_pid: int, watchdog: StepWatchdog):
        self.scheduler = scheduler
        self.watchdog = watchdog
        self.parent_pid = parent_pid
        self.ipc_dir = port_args.ipc_dir
        ctx = zmq.Context(2)
        self.recv_from_tokenizer = ctx.socket(zmq.PULL)
        self.recv_from_tokenizer.bind(port_args.scheduler_input_ipc)
        self.send_to_detokenizer = ctx.socket(zmq.PUSH)
        self.send_to_detokenizer.connect(port_args.detokenizer_ipc)
        self.send_to_tokenizer = ctx.socket(zmq.PUSH)
        self.send_to_tokenizer.connect(port_args.tokenizer_ipc)
        prefix = scheduler.hooks.profile_prefix  # bench_hooks, read as the scheduler started
        self.profiler = BusyProfiler(prefix) if prefix else None
        if self.profiler:
            logger.warning(
                "%s is set: the scheduler runs under cProfile (slow; diagnosis only), "
                "writing %s.N.{prof,txt} after each busy period",
                PROFILE_ENV,
                prefix,
            )
        self.clock = scheduler.clock = make_step_clock(scheduler.hooks.step_times_prefix)

    def run(self) -> None:
        if self.profiler:
            self.profiler.start()
        clock = self.clock
        next_parent_check = time.monotonic() + PARENT_CHECK_S
        while True:
            if not self.scheduler.has_work():
                self._wait_for_message()  # idle: not part of a step
            elif time.monotonic() > next_parent_check:  # busy: a dead parent reads nothing we send
                self._exit_if_orphaned()
                next_parent_check = time.monotonic() + PARENT_CHECK_S
            clock.begin()
            self.watchdog.begin()
            self._receive()
            clock.lap("receive")
            out = self.scheduler.step()
            if self.profiler and out is not None:
                self.profiler.busy = True
            if out is not None:
                self.send_to_detokenizer.send_pyobj(out)
            clock.lap("send")
            self.watchdog.end()
            clock.end()

    def _wait_for_message(self) -> None:
        while not self.recv_from_tokenizer.poll(IDLE_POLL_MS):
            self._exit_if_orphaned()
            if self.profiler:
                self.profiler.on_idle()
            self.clock.on_idle()

    def _exit_if_orphaned(self) -> None:
        if os.getppid() != self.parent_pid:
            # A parent killed outright could not remove the IPC directory: this process does.
            shutil.rmtree(self.ipc_dir, ignore_errors=True)
            raise SystemExit("the parent process is gone")

    def _receive(self) -> None:
        """Everything queued, without waiting."""
        while True:
            try:
                msg = self.recv_from_tokenizer.recv_pyobj(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._dispatch(msg)

    def _dispatch(self, msg) -> None:
        if isinstance(msg, TokenizedGenerateReqInput):
            self.scheduler.add_request(msg)
        elif isinstance(msg, AbortReq):
            self.scheduler.abort_request(msg)
        elif isinstance(msg, ControlReq):
            self.send_to_tokenizer.send_pyobj(ControlReply(msg.id, self._control(msg.kind)))
        else:
            logger.error("scheduler ignored an unknown message: %r", type(msg))

    def _control(self, kind: str):
        if kind == "flush_cache":
            return self.scheduler.flush_cache()
        if kind == "get_internal_state":
            return self.scheduler.get_internal_state()
        if kind == "get_load":
            return load_report(self.scheduler)
        return {"error": f"unknown control request {kind!r}"}
