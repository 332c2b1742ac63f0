"""python -m sglang.bench_speculative (speculative and plain decode speed through the real
Scheduler, every pass timed by phase) and the reports that read step tables:
sglang.benchmark.step_times_report (its results, one tree or two) and
sglang.benchmark.admission_report (an envelope run's prefill passes per level)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from sglang.benchmark import admission_report, step_times_report
from sglang.benchmark.speculative_levels import closed_loop_level

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def spec_speed_result(config, bs, tok_s, code="current", launch_us=100.0, steps=90):
    row = {
        "steps": steps,
        "schedule_us": 20.0,
        "launch_us": launch_us,
        "process_us": 60.0,
        "wait_us": 300.0,
        "collect_us": 5.0,
    }
    stray = dict(row, steps=3, launch_us=9999.0)  # a few passes at a smaller bucket: not the level's
    result = {
        "k": 3,
        "batch_size": bs,
        "tokens_per_s": tok_s,
        "code": code,
        "step_times": {f"spec_k3/bs{bs}": row, "spec_k3/bs1": stray} if code == "current" else {},
    }
    if config:
        result["config"] = config
    return result


def test_step_times_report_pairs_each_level_of_the_two_trees(tmp_path, capsys, monkeypatch):
    results = [
        spec_speed_result(None, 4, 1000.0),
        spec_speed_result(None, 4, 800.0, code="baseline"),
        spec_speed_result(None, 4, 1200.0, launch_us=80.0),
        spec_speed_result(None, 4, 1000.0, code="baseline"),
        spec_speed_result("dynamic", 16, 500.0),
        {"k": "dynamic", "run": 1, "code": "baseline", "error": "x"},
    ]
    path = tmp_path / "ab.json"
    path.write_text(json.dumps({"results": results}))
    summary = step_times_report.summarize(str(path))
    assert summary[("k3", 4)]["runs"] == [1000.0, 1200.0]
    assert summary[("k3@baseline", 4)]["runs"] == [800.0, 1000.0]
    assert summary[("k3", 4)]["phases"]["launch"] == 90.0  # the level's bucket, not the stray passes
    monkeypatch.setattr(sys, "argv", ["step_times_report.py", str(path)])
    step_times_report.main()
    lines = capsys.readouterr().out.splitlines()
    after = next(line for line in lines if line.startswith("after  k3"))
    assert after.split()[-1] == f"{1100 / 900:.3f}"  # mean current / mean baseline
    assert any(line.startswith("after  dynamic") for line in lines)  # no baseline run: no ratio


def test_step_times_report_merges_each_servers_busy_periods_weighted_by_steps(tmp_path, capsys, monkeypatch):
    """--servers reads what a server wrote under SGLANG_STEP_TIMES (one file per busy period, beside
    other files of that name) and gives each group's phases over all periods, weighted by steps."""
    from sglang.srt.managers.step_times import PHASES, StepClock

    prefix = str(tmp_path / "server.steps")
    for period, (steps, schedule) in enumerate([(30, 10.0), (10, 50.0)]):
        clock = StepClock(prefix)
        clock.periods = period
        clock.groups[("spec_k3", 16)] = {
            "steps": steps,
            "requests": 15 * steps,
            "totals": [1e-4] * steps,
            **{p: (schedule if p == "schedule" else 1.0) * 1e-6 * steps for p in PHASES},
        }
        clock.on_idle()
    (tmp_path / "server.steps.server_info.json").write_text("{}")  # not a period: skipped
    merged = step_times_report.merge_periods(prefix)
    assert merged["spec_k3/bs16"]["steps"] == 40
    assert abs(merged["spec_k3/bs16"]["schedule_us"] - (30 * 10 + 10 * 50) / 40) < 1e-9
    assert abs(merged["spec_k3/bs16"]["mean_batch"] - 15) < 1e-9
    monkeypatch.setattr(sys, "argv", ["step_times_report", "--servers", prefix])
    step_times_report.main()
    line = [row for row in capsys.readouterr().out.splitlines() if "spec_k3/bs16" in row][0]
    assert line.split()[:4] == ["server.steps", "spec_k3/bs16", "40", "15.0"] and "20.0" in line.split()
    monkeypatch.setattr(sys, "argv", ["step_times_report", "--servers", str(tmp_path / "missing")])
    with pytest.raises(SystemExit, match="SGLANG_STEP_TIMES"):
        step_times_report.main()


def test_closed_loop_keeps_the_concurrency_full_and_counts_every_reported_token(tiny_model_paths):
    """bench_speculative --closed-loop: each finished request is replaced in the pass that reports it,
    so prefill passes interleave with decode steps; it stops after ROUNDS x concurrency
    completions and counts the tokens reported meanwhile (its drain is not measured)."""
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.server_args import ServerArgs

    scheduler = Scheduler(ServerArgs(model_path=tiny_model_paths["llama"], dtype="float32", device="cpu"))
    seen = []
    step = scheduler.step

    def counted():
        seen.append(len(scheduler.running_reqs) + len(scheduler.waiting_queue))
        return step()

    scheduler.step = counted
    result = closed_loop_level(scheduler, tiny_model_paths["llama"], 3, 2, 8, 6, "random", "cpu", True)
    assert result["requests"] >= 6 and result["passes"] > 0 and result["tokens_per_s"] > 0
    # Output lengths 3-9 per request: at least the six finished requests' tokens were reported.
    assert result["decode_tokens"] >= 6 * 3
    assert max(seen) <= 3 and seen.count(3) > len(seen) // 2  # never more than 3 in flight, mostly 3
    groups = result["step_times"]
    assert any(name.startswith("prefill") for name in groups) and any(name.startswith("decode") for name in groups)
    assert not scheduler.has_work()
    assert len(result["cpu_probe_ms"]) == 2 and min(result["cpu_probe_ms"]) > 0  # the CPU's speed around it


def test_step_times_report_scales_each_run_by_its_cpu_probe(tmp_path, capsys, monkeypatch):
    """A run whose CPU ran at half speed (its probe took twice as long) served half as fast: by
    tok/s the current tree looks 25% slower, by tok/s x probe ms it is as fast as the baseline."""

    def run(tok_s, probe, code):
        return dict(spec_speed_result(None, 64, tok_s, code=code), cpu_probe_ms=[probe, probe])

    results = [
        run(500.0, 10.0, "current"),
        run(1000.0, 5.0, "baseline"),
        run(1000.0, 5.0, "current"),
        run(1000.0, 5.0, "baseline"),
    ]
    path = tmp_path / "ab.json"
    path.write_text(json.dumps({"results": results}))
    assert step_times_report.summarize(str(path))[("k3", 64)]["probes"] == [10.0, 5.0]
    monkeypatch.setattr(sys, "argv", ["step_times_report.py", str(path)])
    step_times_report.main()
    after = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("after  k3"))
    assert f"{750 / 1000:.3f}" in after.split() and after.endswith("x-probe after/before 1.000")
    assert "probe ms 10.0 5.0" in after


def test_admission_report_reads_each_rounds_busy_period(tmp_path, capsys):
    report = admission_report
    rounds = [
        {"max_concurrency": 64, "output_throughput": 50000.0, "mean_ttft_ms": 30.0},
        {"max_concurrency": 64, "output_throughput": 40000.0, "mean_ttft_ms": 50.0},
    ]
    (tmp_path / "srv.rounds.jsonl").write_text("".join(json.dumps(line) + "\n" for line in rounds))

    def period(index, groups):
        (tmp_path / f"srv.steps.{index}.json").write_text(json.dumps(groups))

    row = lambda steps, bs, us: {"steps": steps, "mean_batch": bs, "pass_us": us}  # noqa: E731
    period(0, {"prefill/bs1": row(1, 1.0, 9e6)})  # start-up and warm-up: not a level's
    period(1, {"prefill/bs8": row(1, 8.0, 9e6)})
    period(2, {"prefill/bs2": row(10, 2.0, 2000.0), "spec_k3/bs64": row(30, 60.0, 1000.0)})
    period(
        3,
        {
            "prefill/bs4": row(4, 4.0, 3000.0),
            "prefill/bs16": row(1, 12.0, 40000.0),
            "spec_k3/bs64": row(28, 60.0, 1000.0),
        },
    )
    assert report.main([str(tmp_path)]) == 0
    line = [row for row in capsys.readouterr().out.splitlines() if row.startswith("srv ")][0].split()
    # 15 passes; requests per pass: round means (2.0 and 28/5); prefill share: 20/50 and 52/80.
    assert line[1:5] == ["64", "50000", "/", "40000"] and line[5] == "40.0" and line[6] == "15"
    assert line[7] == f"{(2.0 + 28 / 5) / 2:.2f}" and line[8] == f"{100 * (0.4 + 52 / 80) / 2:.0f}%" and line[9] == "1"
    (tmp_path / "srv.steps.3.json").unlink()  # a server whose rounds merged into one busy period
    assert report.main([str(tmp_path), "srv"]) == 0
    assert "srv: busy periods merged" in capsys.readouterr().out


def test_bench_speculative_measures_plain_and_eagle3_on_the_demo_pair_and_the_report_reads_it(tmp_path):
    """The command a user runs, on the CPU: plain decoding and k = 2 at two batch sizes, every pass
    timed by phase; the speculative rows accept more than one token per verify on code prompts,
    and the report prints one line per variant and level with the phases' microseconds."""
    out = tmp_path / "result.json"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sglang.bench_speculative",
            "--out",
            str(out),
            "--device",
            "cpu",
            "--batch-sizes",
            "1,2",
            "--steps",
            "2",
            "--input-len",
            "32",
            "--output-len",
            "12",
            "--step-times",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads(out.read_text())["results"]
    assert sorted((r["k"], r["batch_size"]) for r in results) == [(0, 1), (0, 2), (2, 1), (2, 2)]
    assert all(r["tokens_per_s"] > 0 and r["step_times"] for r in results)
    assert all(r["accept_length"] > 1.0 for r in results if r["k"] == 2)
    report = subprocess.run(
        [sys.executable, "-m", "sglang.benchmark.step_times_report", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert report.returncode == 0, report.stderr
    rows = [line.split() for line in report.stdout.splitlines()[1:]]
    assert sorted((row[0], row[1]) for row in rows) == [("k0", "1"), ("k0", "2"), ("k2", "1"), ("k2", "2")]
    assert all(float(value) > 0 for row in rows for value in row[3:5])  # mean tok/s and the schedule phase
