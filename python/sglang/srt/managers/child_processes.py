"""How an engine starts its child processes (scheduler, detokenizer, other tensor-parallel ranks):
their multiprocessing context, and targets named by import path, so that the process that starts
them need not import the scheduler (torch and the model code) to name one."""

from __future__ import annotations

import atexit
import importlib
import multiprocessing as mp
import os
import signal
import threading
from multiprocessing import reduction

SCHEDULER = "sglang.srt.managers.scheduler_process:run_scheduler_process"
DETOKENIZER = "sglang.srt.managers.detokenizer_manager:run_detokenizer_process"
TP_FOLLOWER = "sglang.srt.managers.tp_follower_process:run_tp_follower_process"
# The scheduler's exit code when its watchdog stops it (the HTTP server names the watchdog).
WATCHDOG_EXIT_CODE = 3

# What a CPU child imports to start, imported once by the fork server: each scheduler then forks
# from a warm interpreter instead of importing torch and transformers again (about half of a CPU
# engine's start-up).
FORKSERVER_PRELOAD = [
    "sglang.srt.managers.scheduler_process",
    "sglang.srt.managers.detokenizer_manager",
    "sglang.srt.managers.tp_follower_process",
    "sglang.srt.models.registry",
    "transformers.models.auto.configuration_auto",
    "transformers.models.auto.tokenization_auto",
    # Every model's config class imports it, and with it transformers' activations and
    # torch.distributed.tensor: about 1 CPU-s that each scheduler paid reading its config.
    "transformers.utils.type_validators",
]


def child_context(device: str, preloaded: bool) -> mp.context.BaseContext:
    """`spawn`, or with `preloaded` on the CPU the fork server with the engine imported: for a
    process that starts engine after engine (a test session, a notebook). A GPU server keeps spawn
    (the fork server's imports would not touch CUDA, but spawn is what GPU runs were checked with).
    The HTTP server's children use server_child_context instead."""
    if device != "cpu" or not preloaded:
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(FORKSERVER_PRELOAD)  # no effect once it runs: the list is the same
    return ctx


def server_child_context(device: str) -> mp.context.BaseContext:
    """How the HTTP server starts a child (scheduler, tensor-parallel ranks, detokenizer): on the
    CPU, forked from the server's own process once it has imported what they need, since it
    imports torch and transformers anyway (its tokenizer); a spawned child imported them again
    (about 3.5 CPU-s for a scheduler, 1 for a detokenizer). Spawn on a GPU, and where another
    thread runs here (fork copies no threads, and a lock another thread holds would stay held in
    the child)."""
    if device != "cpu" or threading.active_count() > 1:
        return mp.get_context("spawn")
    for module in FORKSERVER_PRELOAD:
        importlib.import_module(module)
    return mp.get_context("fork")


def start_child(ctx: mp.context.BaseContext, target: str, name: str, args: tuple) -> mp.Process:
    """Starts `target` ("module:function") as a daemon process with this process's environment and
    standard streams as they are now, which a child forked from the fork server would otherwise
    take from the fork server (they were the starting process's when the fork server started)."""
    proc = ctx.Process(
        target=_run_child, name=name, args=(target, dict(os.environ), _ParentStdio(), *args), daemon=True
    )
    proc.start()
    if ctx.get_start_method() == "forkserver":
        _reap_forkserver_at_exit()
    return proc


def start_tp_followers(server_args, init_address: str, ctx: mp.context.BaseContext | None = None) -> list:
    """Starts tensor-parallel ranks 1 .. tp_size - 1, which meet rank 0 at init_address."""
    ctx = ctx or mp.get_context("spawn")
    return [
        start_child(ctx, TP_FOLLOWER, f"sglang-tp{rank}", (server_args, rank, init_address))
        for rank in range(1, server_args.tp_size)
    ]


def _run_child(target: str, environ: dict, stdio, *args) -> None:
    os.environ.clear()
    os.environ.update(environ)
    _default_signal_handlers()
    module, function = target.split(":")
    getattr(importlib.import_module(module), function)(*args)


def _default_signal_handlers() -> None:
    """The signal handlers a new interpreter has, for a child forked from a process that set its own
    (the HTTP server stops on SIGTERM by raising SystemExit; its scheduler is stopped by it)."""
    for signum in signal.valid_signals():
        try:
            handler = signal.getsignal(signum)
        except ValueError:
            continue
        if callable(handler) and handler is not signal.default_int_handler:
            signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)


class _ParentStdio:
    """Pickled into a child's arguments: file descriptors 1 and 2 of the starting process (those
    open), put in place as the child unpickles its arguments."""

    def __reduce__(self):
        return _inherit_stdio, tuple(reduction.DupFd(fd) if _is_open(fd) else None for fd in (1, 2))


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _inherit_stdio(*dups) -> None:
    for fd, dup in zip((1, 2), dups):
        inherited = dup.detach() if dup is not None else fd
        if inherited != fd:
            os.dup2(inherited, fd)
            os.close(inherited)


_reaper_registered = False


def _reap_forkserver_at_exit() -> None:
    """The fork server ends when this process does; waiting for it here keeps it from outliving
    this process for a moment as an orphan (and counts its CPU time with this process's children)."""
    global _reaper_registered
    if not _reaper_registered:
        _reaper_registered = True
        atexit.register(_stop_forkserver)


def _stop_forkserver() -> None:
    from multiprocessing import forkserver

    stop = getattr(forkserver._forkserver, "_stop", None)  # private, but in every Python 3 since 3.8
    if stop is not None:
        stop()
