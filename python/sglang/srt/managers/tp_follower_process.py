"""A tensor-parallel rank other than 0: it holds its shard of the model and runs every forward rank
0's scheduler runs (model_executor/tp_mirror.py). It has no scheduler, sampler or sockets of its
own; it ends when rank 0 says stop, when rank 0 goes, or when the server stops it."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import traceback

import torch

from sglang.srt.distributed.parallel_state import destroy_tensor_parallel, init_tensor_parallel
from sglang.srt.gc_pauses import settle_after_startup
from sglang.srt.managers.child_processes import start_tp_followers  # noqa: F401 (where bench_one_batch imports it)
from sglang.srt.managers.scheduler_process import PARENT_CHECK_S, cpu_intra_op_threads, select_gpu
from sglang.srt.model_executor import tp_mirror
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils import configure_logger, name_process

logger = logging.getLogger(__name__)


def run_tp_follower_process(server_args: ServerArgs, tp_rank: int, init_address: str) -> None:
    configure_logger(server_args.log_level, f" TP{tp_rank}")
    name_process(f"sglang-tp{tp_rank}")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when we stop
    _exit_with_parent(os.getppid())
    if server_args.device == "cpu":
        torch.set_num_threads(cpu_intra_op_threads())
    try:
        select_gpu(server_args, tp_rank)
        init_tensor_parallel(tp_rank, server_args.tp_size, init_address, server_args.device)
    except Exception:
        logger.error("tensor-parallel rank %d failed to start:\n%s", tp_rank, traceback.format_exc())
        raise SystemExit(1)
    try:
        tp_mirror.follow(
            server_args,
            _make_runner,
            ready=lambda: settle_after_startup(
                f"tensor-parallel rank {tp_rank}", server_args.gc_warning_threshold_secs
            ),
        )
    except tp_mirror.LeaderGone as e:
        logger.info("tensor-parallel rank %d stops: rank 0 is gone (%s)", tp_rank, e)
        os._exit(0)
    except Exception:
        logger.error("tensor-parallel rank %d failed:\n%s", tp_rank, traceback.format_exc())
        os._exit(1)
    destroy_tensor_parallel()


def _make_runner(model_config, server_args, target, **kwargs) -> ModelRunner:
    return ModelRunner(model_config, server_args, target=target, **kwargs)


def _exit_with_parent(parent_pid: int) -> None:
    """A rank blocked in a collective cannot poll: a thread ends the process once its parent (the
    server) is gone, e.g. killed outright."""

    def watch():
        while os.getppid() == parent_pid:
            time.sleep(PARENT_CHECK_S)
        os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
