"""benchmark/monitor_report.py: the machine's clocks over each round of an interleaved sweep, and
whether the rounds' spread in throughput follows them."""

from __future__ import annotations

import datetime
import importlib.util
import json
import os

PATH = os.path.join(os.path.dirname(__file__), "..", "..", "benchmark", "monitor_report.py")
spec = importlib.util.spec_from_file_location("monitor_report", PATH)
monitor_report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(monitor_report)

T0 = 1_800_000_000.0


def write_monitor(tmp_path, sm_clock_by_second: list[int]) -> str:
    """nvidia-smi's CSV layout (local timestamps), 4 samples a second, and the CPU sampler's."""
    prefix = str(tmp_path / "demo_monitor")
    header = (
        "timestamp, clocks.current.sm [MHz], clocks.current.memory [MHz], power.draw [W], "
        "utilization.gpu [%], pstate, temperature.gpu, clocks_event_reasons.active\n"
    )
    gpu, cpu = [header], ["time,mhz_mean,mhz_min,mhz_max,load1\n"]
    for second, clock in enumerate(sm_clock_by_second):
        for quarter in range(4):
            t = T0 + second + quarter / 4
            stamp = datetime.datetime.fromtimestamp(t).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]
            gpu.append(f"{stamp}, {clock} MHz, 3201 MHz, 120.50 W, 40 %, P0, 35, 0x0000000000000000\n")
            cpu.append(f"{t:.3f},2445,2400,2500,3.5\n")
    (tmp_path / "demo_monitor.gpu.csv").write_text("".join(gpu))
    (tmp_path / "demo_monitor.cpu.csv").write_text("".join(cpu))
    return prefix


def write_rounds(tmp_path, name: str, rounds: list[tuple[int, int, float, float]], port: int = 30000) -> str:
    """(concurrency, round, start second, tok/s) per round, each one second long."""
    path = tmp_path / f"{name}.rounds.jsonl"
    path.write_text(
        "".join(
            json.dumps(
                {
                    "label": name,
                    "max_concurrency": c,
                    "round": r,
                    "output_throughput": t,
                    "base_url": f"http://127.0.0.1:{port}",
                    "started_unix": T0 + s,
                    "ended_unix": T0 + s + 0.9,
                }
            )
            + "\n"
            for c, r, s, t in rounds
        )
    )
    return str(path)


def test_rounds_get_their_windows_clocks_and_the_spread_is_set_against_them(tmp_path, capsys):
    # The SM clock halves in seconds 1 and 3; the rounds run then are the slow ones.
    prefix = write_monitor(tmp_path, [1980, 990, 1980, 990])
    a = write_rounds(tmp_path, "demo_always", [(8, 0, 0, 10000.0), (8, 1, 3, 6000.0)])
    b = write_rounds(tmp_path, "demo_no_draft", [(8, 0, 1, 7000.0), (8, 1, 2, 11000.0)])
    assert monitor_report.main(["--monitor", prefix, a, b]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.startswith("demo_")]
    assert [(r[0], r[2], r[3], r[4]) for r in rows] == [
        ("demo_always", "0", "10000", "1980"),
        ("demo_no_draft", "0", "7000", "990"),
        ("demo_always", "1", "6000", "990"),
        ("demo_no_draft", "1", "11000", "1980"),
    ]
    assert all(r[6] == "120.5" and r[7] == "40" and r[8] == "P0" for r in rows)
    assert "demo_always      conc    8:      8000 tok/s over 2 rounds, CV 25.0%" in out
    assert "demo_no_draft    conc    8:      9000 tok/s over 2 rounds, CV 22.2%" in out
    assert "vs sm_mhz's: r = 1.00 over 4 rounds (largest throughput deviation 25%)" in out
    assert "vs cpu_mhz's: r = - over 4 rounds" in out  # a constant clock explains nothing


def test_rounds_without_spans_are_refused(tmp_path, capsys):
    prefix = write_monitor(tmp_path, [1980])
    path = tmp_path / "old.rounds.jsonl"
    path.write_text(json.dumps({"label": "x", "max_concurrency": 1, "round": 0, "output_throughput": 1.0}) + "\n")
    assert monitor_report.main(["--monitor", prefix, str(path)]) == 2
    assert "no round spans" in capsys.readouterr().err


def test_each_round_gets_the_cpu_its_server_processes_and_the_client_used(tmp_path, capsys):
    """Server A (port 30000) runs in second 0, B (30001) in second 1. A's scheduler is busy all
    its round (a full core), its HTTP process half; B's HTTP process is the busy one. The client
    uses 80% throughout. Samples of the idle server in the other's round do not count."""
    prefix = write_monitor(tmp_path, [1980, 1980])
    busy = {
        ("http", 30000): [0.5, 0.0],
        ("sched", 30000): [1.0, 0.05],
        ("detok", 30000): [0.1, 0.0],
        ("http", 30001): [0.0, 0.98],
        ("sched", 30001): [0.02, 0.6],
        ("detok", 30001): [0.0, 0.2],
        ("client", 0): [0.8, 0.8],
    }
    lines, used = ["time,pid,role,port,cpu_s\n"], dict.fromkeys(busy, 0.0)
    for step in range(9):  # every 0.25 s over two seconds
        t = T0 + step / 4
        for pid, (role, port) in enumerate(busy, start=100):
            lines.append(f"{t:.3f},{pid},{role},{port},{used[role, port]:.3f}\n")
            used[role, port] += busy[role, port][min(step // 4, 1)] / 4
    (tmp_path / "demo_monitor.procs.csv").write_text("".join(lines))
    a = write_rounds(tmp_path, "demo_a", [(64, 0, 0, 30000.0)], port=30000)
    b = write_rounds(tmp_path, "demo_b", [(64, 0, 1, 20000.0)], port=30001)
    assert monitor_report.main(["--monitor", prefix, a, b]) == 0
    out = capsys.readouterr().out.split("CPU per process over each round")[1]
    rows = {line.split()[0]: line.split()[4:8] for line in out.splitlines() if line.startswith("demo_")}
    assert rows == {"demo_a": ["50", "100", "10", "80"], "demo_b": ["98", "60", "20", "80"]}


def test_the_monitor_finds_the_server_processes_by_name(tmp_path):
    """start_monitor's process sampler reads /proc: a process named as the scheduler (as
    name_process names it) whose parent was started with --port is recorded under that port."""
    import subprocess
    import sys

    child = "from sglang.srt.utils import name_process; import time; name_process('sglang-sched'); time.sleep(6)"
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import subprocess, sys; subprocess.run([sys.executable, '-c', {child!r}])",
            "--port",
            "30999",
        ]
    )
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    prefix = str(tmp_path / "m")
    monitor = subprocess.Popen(
        ["bash", "-c", f"source benchmark/serve_lib.sh; start_monitor {prefix}; sleep 2; stop_monitor"], cwd=root
    )
    try:
        monitor.wait(timeout=60)
    finally:
        parent.wait(timeout=60)  # the named child exits by itself after six seconds
    with open(prefix + ".procs.csv") as f:
        rows = [line.strip().split(",") for line in f][1:]
    assert any(row[2] == "sched" and row[3] == "30999" for row in rows), rows[:5]
