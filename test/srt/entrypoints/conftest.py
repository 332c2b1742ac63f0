"""A real server process on loopback, shared by the HTTP tests of this directory."""

from __future__ import annotations

import httpx
import pytest

from sglang.test.server_fixture import ServerProcess


@pytest.fixture(scope="session")
def server(tiny_model_paths):
    """The tiny Llama behind `python -m sglang.launch_server --enable-metrics`."""
    proc = ServerProcess(tiny_model_paths["llama"], "--enable-metrics")
    yield proc
    proc.stop()


def server_state(server: ServerProcess) -> dict:
    return httpx.get(f"{server.base_url}/get_server_info", timeout=10).json()["internal_states"][0]


def assert_server_kv_accounting(server: ServerProcess) -> None:
    """DESIGN.md section 4 through /get_server_info: idle means free + cached == total."""
    state = server_state(server)
    assert state["num_running_reqs"] == 0 and state["num_queue_reqs"] == 0, state
    assert state["request_slots"] == 0, state
    assert state["free_slots"] + state["cached_slots"] == state["total_slots"], state


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
