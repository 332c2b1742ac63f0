"""benchmark/spec_envelope_gpu.sh end to end on the CPU (the GPU run's dry run): the demo pair
served three ways (no draft, always, dynamic), each swept by bench_serving, then the envelope
report and plot; the shipped model directories stay as they were (the sweep script once wrote a
random model into a directory it did not recognise)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tarfile

import pytest

from sglang import demo

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def digest(directory: str) -> str:
    h = hashlib.sha256()
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), "rb") as f:
            h.update(name.encode() + f.read())
    return h.hexdigest()


@pytest.mark.parametrize("rounds", [2, 0], ids=["interleaved", "one_sweep_each"])
def test_envelope_script_runs_three_servers_and_reports(tmp_path, rounds):
    before = {path: digest(path) for path in (demo.TARGET_PATH, demo.DRAFT_PATH)}
    env = dict(
        os.environ,
        LEVELS="1,2",
        NUM_PROMPTS="2",
        PER_CONC="1",
        INPUT_LEN="16",
        OUTPUT_LEN="8",
        EXTRA_SERVER_ARGS="--device cpu",
        PORT="30871",
        SWEEP_TIMEOUT_S="200",
        ROUNDS=str(rounds),
        KV_TOKENS="4096",
    )
    proc = subprocess.run(
        ["bash", "benchmark/spec_envelope_gpu.sh", str(tmp_path), "demo"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    files = sorted(os.listdir(tmp_path))
    assert files == [
        "demo_always.jsonl",
        "demo_dynamic.jsonl",
        "demo_envelope.json",
        "demo_envelope.png",
        "demo_no_draft.jsonl",
        "demo_servers.tgz",
    ], files  # few files: the device returns 8
    report = json.loads((tmp_path / "demo_envelope.json").read_text())
    assert [p["concurrency"] for p in report["points"]] == [1, 2] and not report["problems"]
    assert all(p["always_accept_length"] > 1 and p["dynamic_step_share_by_k"] for p in report["points"])
    assert report["dynamic_server"]["spec_policy"]["name"] == "cost"
    assert {path: digest(path) for path in before} == before
    with tarfile.open(tmp_path / "demo_servers.tgz") as archive:
        names = set(archive.getnames())
        rounds_lines = {
            name: [json.loads(line) for line in archive.extractfile(name).read().splitlines()]
            for name in names
            if name.endswith(".rounds.jsonl")
        }
    assert {f"demo_{s}.server.log" for s in ("no_draft", "always", "dynamic")} <= names
    if not rounds:
        assert not rounds_lines
        return
    # Interleaved: every server measured twice per level, first in the order given, then reversed;
    # the loose line pools both rounds.
    assert sorted(rounds_lines) == [f"demo_{s}.rounds.jsonl" for s in ("always", "dynamic", "no_draft")]
    assert {"demo_monitor.cpu.csv", "demo_monitor.txt"} <= names  # the machine's clocks over each round
    first = {
        name.split(".")[0]: [(r["max_concurrency"], r["round"], r["position"]) for r in lines]
        for name, lines in rounds_lines.items()
    }
    assert first["demo_no_draft"] == [(1, 0, 0), (1, 1, 2), (2, 0, 0), (2, 1, 2)]
    assert first["demo_always"] == [(1, 0, 1), (1, 1, 1), (2, 0, 1), (2, 1, 1)]
    for server in ("no_draft", "always", "dynamic"):
        for line in map(json.loads, (tmp_path / f"demo_{server}.jsonl").read_text().splitlines()):
            assert line["rounds"] == 2 and len(line["round_output_throughput"]) == 2 and "round" not in line
            assert line["completed"] == 4 and line["failed"] == 0  # 2 prompts per round
            assert line["output_throughput"] == pytest.approx(line["total_output_tokens"] / line["duration"])


def test_envelope_script_plays_a_trace_against_each_server_in_turn_and_returns_cost_logs(tmp_path):
    """TRACE=FILE: every server plays the bench_serving trace in turn each round; the pooled line
    per server feeds python -m sglang.benchmark.envelope. COST_LOG=1: each speculative server (here
    always, and dynamic with dense exploration) writes its cost log; the logs and cost_log_report.py's
    reading of them come back in one archive. STEP_TIMES=1: every server's step tables are in the
    servers' archive, none left beside it (the servers are stopped first, so a table written as one
    idles after its last play cannot land outside)."""
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"phases": [{"seconds": 1, "concurrency": 1}, {"seconds": 1, "concurrency": [1, 3]}]}))
    out = tmp_path / "out"
    env = dict(
        os.environ,
        INPUT_LEN="16",
        OUTPUT_LEN="24",
        EXTRA_SERVER_ARGS="--device cpu",
        PORT="30881",
        SWEEP_TIMEOUT_S="200",
        ROUNDS="2",
        KV_TOKENS="4096",
        TRACE=str(trace),
        NUM_PROMPTS="2",
        PER_CONC="1",
        COST_LOG="1",
        EXPLORE_EVERY="2",
        STEP_TIMES="1",
    )
    proc = subprocess.run(
        ["bash", "benchmark/spec_envelope_gpu.sh", str(out), "demo", "no_draft", "always", "dynamic_x"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = {
        name: json.loads((out / f"demo_{name}.jsonl").read_text().splitlines()[-1])
        for name in ("no_draft", "always", "dynamic_x")
    }
    assert all(line["rounds"] == 2 and line["completed"] >= 4 and line["failed"] == 0 for line in lines.values())
    for line in lines.values():  # the pooled phases: tokens delivered during each, over both rounds' seconds
        assert [phase["seconds"] for phase in line["phases"]] == [1, 1]
        assert all(len(phase["round_window_output_throughput"]) == 2 for phase in line["phases"])
        assert line["phases"][0]["window_output_throughput"] == pytest.approx(
            line["phases"][0]["window_output_tokens"] / 2
        )
    with tarfile.open(out / "demo_servers.tgz") as archive:
        rounds = [json.loads(line) for line in archive.extractfile("demo_dynamic_x.rounds.jsonl").read().splitlines()]
        log = archive.extractfile("demo_dynamic_x.server.log").read().decode()
        steps = [name for name in archive.getnames() if ".steps." in name and name.endswith(".json")]
    assert [len(r["phases"]) for r in rounds] == [2, 2] and [r["round"] for r in rounds] == [0, 1]
    assert "SGLANG_SPEC_EXPLORE_EVERY=2" in log and "SGLANG_SPEC_COST_LOG" in log, "both logged loudly"
    assert {name.split(".steps.")[0] for name in steps} == {"demo_no_draft", "demo_always", "demo_dynamic_x"}, steps
    with tarfile.open(out / "demo_cost_logs.tgz") as archive:
        names = archive.getnames()
        cost_report = json.loads(archive.extractfile("cost_report.json").read())
    logs = sorted(name for name in names if ".costlog." in name)
    assert [name.split(".costlog.")[0] for name in logs] == ["demo_always", "demo_dynamic_x"], names
    by_server = {path.split(".costlog.")[0]: rep for path, rep in cost_report.items()}
    assert set(by_server["demo_always"]["steps_per_k"]) == {"3"}
    assert len(by_server["demo_dynamic_x"]["steps_per_k"]) >= 2, "dense exploration ran other k's"
    assert not list(out.glob("*.costlog.*")), "the logs themselves are only in the archive"
    report = subprocess.run(
        [
            "python3",
            "-m",
            "sglang.benchmark.envelope",
            "--dynamic",
            str(out / "demo_dynamic_x.jsonl"),
            "--static",
            f"no_draft={out / 'demo_no_draft.jsonl'}",
            "--static",
            f"always={out / 'demo_always.jsonl'}",
            "--out",
            str(tmp_path / "r.json"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert report.returncode in (0, 1) and "trace: dynamic" in report.stdout, report.stdout + report.stderr
