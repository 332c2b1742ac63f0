"""Small benchmark helpers the GPU scripts lean on: benchmark/cpu_sets.py (the CPU lists servers
and the client are pinned to), benchmark/spy_report.py (reading py-spy's collapsed stacks),
benchmark/step_times_report.py (spec_speed --step-times results, one tree or two) and
spec_speed's closed loop (a loaded server's steady state without its front end)."""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import pytest

BENCHMARK = os.path.join(os.path.dirname(__file__), "..", "..", "benchmark")


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(BENCHMARK, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


cpu_sets = load("cpu_sets")
spy_report = load("spy_report")
step_times_report = load("step_times_report")


@pytest.mark.parametrize("cores", [
    [[str(i)] for i in range(16)],  # 16 cores, one thread each (the GPU machine's lscpu)
    [[str(i), str(i + 8)] for i in range(8)],  # 8 cores with a sibling each
])
def test_roles_get_two_cores_each_and_no_cpu_twice(monkeypatch, cores):
    monkeypatch.setattr(cpu_sets, "cores", lambda: cores)
    sets = cpu_sets.split(3, 2, 2)
    assert [len(s) for s in sets] == [2, 2, 2, 2]
    flat = [cpu for s in sets for cpu in s]
    assert len(set(flat)) == len(flat), "a CPU in two roles"
    firsts = {core[0] for core in cores}
    assert set(flat) <= firsts, "one logical CPU per physical core"


def test_a_small_machine_still_gets_a_set_for_every_server_and_the_client(monkeypatch, capsys):
    monkeypatch.setattr(cpu_sets, "cores", lambda: [["0"], ["1"]])
    assert cpu_sets.main(["servers", "3"]) == 0
    lines = capsys.readouterr().out.split()
    assert len(lines) == 4 and all(line for line in lines)
    assert cpu_sets.main(["nonsense"]) == 2


def test_spy_report_counts_inclusive_own_and_idle_samples(tmp_path):
    path = tmp_path / "spy.txt"
    path.write_text(
        "main (a.py:1);step (sched.py:10);forward (model.py:5) 6\n"
        "main (a.py:1);step (sched.py:12);choose (policy.py:3) 2\n"
        "main (a.py:1);receive (io.py:7);poll (libc.so.6) 2\n")
    inclusive, own, total, idle = spy_report.load(str(path))
    assert total == 10 and idle == 2
    assert inclusive["step (sched.py)"] == 8, "lines of one function are pooled"
    assert inclusive["main (a.py)"] == 10 and own["forward (model.py)"] == 6


def test_spy_report_diff_is_per_step_when_steps_are_given(tmp_path, capsys):
    first, second = tmp_path / "a.txt", tmp_path / "b.txt"
    first.write_text("step (s.py:1);choose (p.py:2) 100\n")
    second.write_text("step (s.py:1);choose (p.py:2) 150\n")
    spy_report.print_diff(str(first), str(second), top=5, match="choose", steps=[1000, 1000], rate=100.0)
    out = capsys.readouterr().out
    # 100 -> 150 samples at 100 Hz over 1000 steps: 1000 -> 1500 us per step.
    assert "us/step" in out and "+500.0" in out and "1000.0 ->   1500.0" in out


def spec_speed_result(config, bs, tok_s, code="current", launch_us=100.0, steps=90):
    row = {"steps": steps, "schedule_us": 20.0, "launch_us": launch_us, "process_us": 60.0, "wait_us": 300.0,
           "collect_us": 5.0}
    stray = dict(row, steps=3, launch_us=9999.0)  # a few passes at a smaller bucket: not the level's
    result = {"k": 3, "batch_size": bs, "tokens_per_s": tok_s, "code": code,
              "step_times": {f"spec_k3/bs{bs}": row, "spec_k3/bs1": stray} if code == "current" else {}}
    if config:
        result["config"] = config
    return result


def test_step_times_report_pairs_each_level_of_the_two_trees(tmp_path, capsys, monkeypatch):
    results = [spec_speed_result(None, 4, 1000.0), spec_speed_result(None, 4, 800.0, code="baseline"),
               spec_speed_result(None, 4, 1200.0, launch_us=80.0), spec_speed_result(None, 4, 1000.0, code="baseline"),
               spec_speed_result("dynamic", 16, 500.0), {"k": "dynamic", "run": 1, "code": "baseline", "error": "x"}]
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


def test_closed_loop_keeps_the_concurrency_full_and_counts_every_reported_token(tiny_model_paths):
    """spec_speed --closed-loop: each finished request is replaced in the pass that reports it,
    so prefill passes interleave with decode steps; it stops after ROUNDS x concurrency
    completions and counts the tokens reported meanwhile (its drain is not measured)."""
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.server_args import ServerArgs

    spec_speed = load("spec_speed")
    scheduler = Scheduler(ServerArgs(model_path=tiny_model_paths["llama"], dtype="float32", device="cpu"))
    seen = []
    step = scheduler.step

    def counted():
        seen.append(len(scheduler.running_reqs) + len(scheduler.waiting_queue))
        return step()

    scheduler.step = counted
    result = spec_speed.closed_loop_level(scheduler, tiny_model_paths["llama"], 3, 2, 8, 6, "random", "cpu", True)
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

    results = [run(500.0, 10.0, "current"), run(1000.0, 5.0, "baseline"),
               run(1000.0, 5.0, "current"), run(1000.0, 5.0, "baseline")]
    path = tmp_path / "ab.json"
    path.write_text(json.dumps({"results": results}))
    assert step_times_report.summarize(str(path))[("k3", 64)]["probes"] == [10.0, 5.0]
    monkeypatch.setattr(sys, "argv", ["step_times_report.py", str(path)])
    step_times_report.main()
    after = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("after  k3"))
    assert f"{750 / 1000:.3f}" in after.split() and after.endswith("x-probe after/before 1.000")
    assert "probe ms 10.0 5.0" in after


def test_admission_report_reads_each_rounds_busy_period(tmp_path, capsys):
    report = load("admission_report")
    rounds = [{"max_concurrency": 64, "output_throughput": 50000.0, "mean_ttft_ms": 30.0},
              {"max_concurrency": 64, "output_throughput": 40000.0, "mean_ttft_ms": 50.0}]
    (tmp_path / "srv.rounds.jsonl").write_text("".join(json.dumps(line) + "\n" for line in rounds))

    def period(index, groups):
        (tmp_path / f"srv.steps.{index}.json").write_text(json.dumps(groups))

    row = lambda steps, bs, us: {"steps": steps, "mean_batch": bs, "pass_us": us}  # noqa: E731
    period(0, {"prefill/bs1": row(1, 1.0, 9e6)})  # start-up and warm-up: not a level's
    period(1, {"prefill/bs8": row(1, 8.0, 9e6)})
    period(2, {"prefill/bs2": row(10, 2.0, 2000.0), "spec_k3/bs64": row(30, 60.0, 1000.0)})
    period(3, {"prefill/bs4": row(4, 4.0, 3000.0), "prefill/bs16": row(1, 12.0, 40000.0),
               "spec_k3/bs64": row(28, 60.0, 1000.0)})
    assert report.main([str(tmp_path)]) == 0
    line = [l for l in capsys.readouterr().out.splitlines() if l.startswith("srv ")][0].split()
    # 15 passes; requests per pass: round means (2.0 and 28/5); prefill share: 20/50 and 52/80.
    assert line[1:5] == ["64", "50000", "/", "40000"] and line[5] == "40.0" and line[6] == "15"
    assert line[7] == f"{(2.0 + 28 / 5) / 2:.2f}" and line[8] == f"{100 * (0.4 + 52 / 80) / 2:.0f}%" and line[9] == "1"
    (tmp_path / "srv.steps.3.json").unlink()  # a server whose rounds merged into one busy period
    assert report.main([str(tmp_path), "srv"]) == 0
    assert "srv: busy periods merged" in capsys.readouterr().out
