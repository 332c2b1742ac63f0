"""`python -m sglang.launch_server` refuses what cannot work in one line and before the model
loads: a model path that does not exist, a Hugging Face id (nothing is downloaded), a port that
another server holds."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from sglang import demo


def launch(*argv: str, timeout: float = 120) -> tuple[int, str, float]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "sglang.launch_server", "--device", "cpu", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - start


@pytest.mark.parametrize(
    "path, message",
    [
        ("/no/such/model-dir", "does not exist"),
        ("meta-llama/Llama-3.1-8B-Instruct", "weights are not downloaded"),
    ],
)
def test_a_model_path_that_is_not_a_local_directory_fails_in_one_line(path, message):
    code, output, _ = launch("--model-path", path)
    assert code == 2, output
    lines = output.strip().splitlines()
    assert len(lines) == 1 and "--model-path" in lines[0] and message in lines[0], output
    assert "usage:" not in output


def test_a_port_in_use_is_found_before_the_model_loads():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        code, output, _ = launch("--model-path", demo.TARGET_PATH, "--port", str(port), "--log-level", "info")
    assert code == 1, output
    assert f"127.0.0.1:{port}" in output and "--port" in output, output
    assert "KV cache:" not in output, "the model loaded before the port was checked"  # ModelRunner's log line


def test_the_engine_refuses_a_hub_id_before_starting_any_process():
    import multiprocessing

    import sglang

    before = set(multiprocessing.active_children())  # engines other tests in this process keep
    with pytest.raises(ValueError, match="weights are not downloaded"):
        sglang.Engine(model_path="Qwen/Qwen2.5-0.5B-Instruct")
    assert set(multiprocessing.active_children()) <= before, "it started a process"


def test_the_command_line_help_shows_groups_and_defaults():
    """`python -m sglang.launch_server --help` as a user runs it (the launcher that also takes
    --dp-size and the router's flags), not only the parser the tests build."""
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "sglang.launch_server", "--help"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    groups = [line for line in proc.stdout.splitlines() if line.endswith(":") and not line.startswith(" ")]
    assert len(groups) >= 6, groups  # options plus at least five groups of flags
    assert proc.stdout.count("(default: ") >= 20


@pytest.mark.parametrize(
    "argv, first_line",
    [
        (
            ["--enable-torch-compile"],
            "--enable-torch-compile (an upstream SGLang flag) is not supported: this engine captures CUDA graphs",
        ),
        (["--max-prefil-tokens", "4096"], "unknown flag --max-prefil-tokens; did you mean --max-prefill-tokens?"),
    ],
)
def test_a_refused_or_unknown_flag_fails_in_two_lines_not_the_usage_text(argv, first_line):
    code, output, _ = launch(*argv)
    lines = output.strip().splitlines()
    assert code == 2 and len(lines) == 2 and "usage:" not in output, output
    assert first_line in lines[0] and "--help" in lines[1], output
