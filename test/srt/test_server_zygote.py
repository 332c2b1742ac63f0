"""Test servers forked from `sglang.test.server_zygote`: a forked process gets what
`subprocess.Popen(start_new_session=True)` would have given it (its arguments, environment,
directory and TMPDIR, a session of its own, the log as stdout and stderr), and its exit status or
killing signal comes back as `Popen` reports it. A server whose environment differs from the
zygote's in what the zygote's imports read starts as a plain process."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import time

import pytest

from sglang.test.server_fixture import ForkedProcess, ServerProcess, Zygote, generated_ids

PROBE = textwrap.dedent(
    """
    import os, sys, tempfile, time
    print("argv", sys.argv[1:])
    print("cwd", os.getcwd())
    print("tmp", tempfile.gettempdir())
    print("probe", os.environ.get("PROBE"))
    print("own session", os.getsid(0) == os.getpid())
    print("stdin", repr(sys.stdin.read()))
    sys.stdout.flush()
    if sys.argv[1] == "sleep":
        time.sleep(60)
    raise SystemExit(int(sys.argv[1]))
    """
)


@pytest.fixture
def zygote():
    zygote = Zygote.for_env("sglang.launch_server", dict(os.environ))
    if zygote is None:
        pytest.skip("no zygote for this process's environment (SGLANG_TEST_FORKED_SERVERS=0)")
    return zygote


def fork_probe(zygote, tmp_path, arg: str) -> tuple[ForkedProcess, str]:
    (tmp_path / "zygote_probe.py").write_text(PROBE)
    private = tmp_path / "private_tmp"
    private.mkdir(exist_ok=True)
    log = tmp_path / f"probe_{arg}.log"
    log.touch()
    env = dict(os.environ, PROBE="from the request", TMPDIR=str(private))
    cwd = os.getcwd()
    os.chdir(tmp_path)  # the child runs in the requester's directory, and imports from it as `python -m` would
    try:
        return ForkedProcess(zygote, "zygote_probe", [arg, "x y"], env, str(log)), str(log)
    finally:
        os.chdir(cwd)


def test_a_forked_process_gets_its_request_and_its_exit_status_comes_back(zygote, tmp_path):
    proc, log = fork_probe(zygote, tmp_path, "3")
    assert proc.wait(timeout=30) == 3 and proc.poll() == 3
    out = open(log).read().splitlines()
    assert out == [
        "argv ['3', 'x y']",
        f"cwd {tmp_path}",
        f"tmp {tmp_path / 'private_tmp'}",
        "probe from the request",
        "own session True",
        "stdin ''",
    ], out


def test_a_killed_forked_process_reports_the_signal_as_popen_does(zygote, tmp_path):
    proc, log = fork_probe(zygote, tmp_path, "sleep")
    deadline = time.monotonic() + 30
    while "stdin" not in open(log).read() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == -signal.SIGTERM


def test_a_server_with_its_own_environment_starts_as_a_plain_process(tiny_model_paths, monkeypatch):
    monkeypatch.setenv("TRANSFORMERS_VERBOSITY", "error")  # transformers reads it as it loads
    server = ServerProcess(tiny_model_paths["llama"], "--skip-server-warmup")
    try:
        assert not isinstance(server.proc, ForkedProcess)
        assert open(f"/proc/{server.proc.pid}/cmdline").read().split("\0")[:3] == [
            sys.executable,
            "-m",
            "sglang.launch_server",
        ]
    finally:
        assert server.stop() == 0


def test_the_suites_servers_are_forked_and_serve(tiny_model_paths):
    """The saving this module exists for: a test's server (the test's own environment, which
    pytest changes per test) is forked from the zygote, and serves as a launched one does."""
    if os.environ.get("SGLANG_TEST_FORKED_SERVERS") == "0":
        pytest.skip("forked servers turned off (SGLANG_TEST_FORKED_SERVERS=0)")
    server = ServerProcess(tiny_model_paths["llama"], "--skip-server-warmup")
    try:
        assert isinstance(server.proc, ForkedProcess)
        assert len(generated_ids(server, [1, 2, 3], {"max_new_tokens": 3, "temperature": 0})) == 3
    finally:
        server.stop()
    assert server.proc.poll() is not None and not server.wait_children_gone()
