"""Small benchmark helpers the GPU scripts lean on: benchmark/cpu_sets.py (the CPU lists servers
and the client are pinned to) and benchmark/spy_report.py (reading py-spy's collapsed stacks)."""

from __future__ import annotations

import importlib.util
import os

import pytest

BENCHMARK = os.path.join(os.path.dirname(__file__), "..", "..", "benchmark")


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(BENCHMARK, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


cpu_sets = load("cpu_sets")
spy_report = load("spy_report")


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
