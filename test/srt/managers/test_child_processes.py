"""How an engine's children start: the HTTP server's children forked on the CPU (spawned on a GPU
or beside another thread), with a new interpreter's signal handlers whatever its parent set."""

from __future__ import annotations

import signal
import sys
import threading

from sglang.srt.managers.child_processes import server_child_context, start_child


def only_this_thread(monkeypatch) -> None:
    """As in a server's process when it starts its scheduler; a test process may still run threads
    of earlier tests' engines and servers."""
    monkeypatch.setattr(threading, "active_count", lambda: 1)


def test_the_servers_children_are_forked_on_the_cpu_and_spawned_on_a_gpu(monkeypatch):
    only_this_thread(monkeypatch)
    assert server_child_context("cpu").get_start_method() == "fork"
    assert {"sglang.srt.managers.scheduler_process", "transformers.utils.type_validators"} <= set(sys.modules)
    assert server_child_context("cuda").get_start_method() == "spawn"


def test_the_servers_children_are_spawned_while_another_thread_runs():
    release = threading.Event()
    thread = threading.Thread(target=release.wait)
    thread.start()
    try:
        assert server_child_context("cpu").get_start_method() == "spawn"
    finally:
        release.set()
        thread.join()


def report_signal_handlers(pipe) -> None:
    pipe.send({signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)})


def test_a_forked_child_has_a_new_interpreters_signal_handlers(monkeypatch):
    """The HTTP server raises SystemExit on SIGTERM and SIGINT; a child forked from it must not."""
    only_this_thread(monkeypatch)
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)}
    try:
        for signum in saved:
            signal.signal(signum, lambda *_: None)
        ctx = server_child_context("cpu")
        reader, writer = ctx.Pipe(duplex=False)
        proc = start_child(ctx, f"{__name__}:report_signal_handlers", "handlers", (writer,))
        handlers = reader.recv()
        proc.join(30)
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)
    assert proc.exitcode == 0
    assert handlers == {
        signal.SIGTERM: signal.SIG_DFL,
        signal.SIGINT: signal.default_int_handler,
        signal.SIGUSR1: signal.SIG_DFL,
    }
