"""A real server process on loopback, shared by the HTTP tests of this directory."""

from __future__ import annotations

import pytest

from sglang.test.server_fixture import ServerProcess, assert_server_kv_accounting, server_state


@pytest.fixture(scope="session")
def server(tiny_model_paths):
    """The tiny Llama behind `python -m sglang.launch_server --enable-metrics`."""
    proc = ServerProcess(tiny_model_paths["llama"], "--enable-metrics")
    yield proc
    proc.stop()


@pytest.fixture(autouse=True)
def server_kv_accounting_holds_after_test(request):
    yield
    if "server" in request.fixturenames:
        import time

        server = request.getfixturevalue("server")
        # Aborts of disconnected clients land at the scheduler's next step: give it a moment.
        for _ in range(50):
            state = server_state(server)
            if state["num_running_reqs"] == 0 and state["num_queue_reqs"] == 0:
                break
            time.sleep(0.1)
        assert_server_kv_accounting(server)
