"""benchmark/cpu_sets.py: the CPU lists that serve_lib.sh pins envelope servers and the client to."""

from __future__ import annotations

import importlib.util
import os

import pytest

PATH = os.path.join(os.path.dirname(__file__), "..", "..", "benchmark", "cpu_sets.py")
spec = importlib.util.spec_from_file_location("cpu_sets", PATH)
cpu_sets = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cpu_sets)


@pytest.mark.parametrize(
    "cores",
    [
        [[str(i)] for i in range(16)],  # 16 cores, one thread each (the GPU machine's lscpu)
        [[str(i), str(i + 8)] for i in range(8)],  # 8 cores with a sibling each
    ],
)
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
