"""benchmark/interleaved_sweep.py's rounds: servers measured in turn, the order reversed every
other round, and warm-up rounds played first but kept out of what is pooled."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def load_sweep():
    spec = importlib.util.spec_from_file_location("interleaved_sweep", os.path.join(ROOT, "benchmark",
                                                                                    "interleaved_sweep.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("warmups", [0, 1, 2])
def test_warmup_rounds_are_played_first_and_left_out_of_the_pool(tmp_path, warmups):
    sweep = load_sweep()
    plays = []

    async def measure(name, round_index):
        plays.append(name)
        return {"failed": 0, "output_throughput": float(len(plays))}

    args = argparse.Namespace(rounds=2, warmup_rounds=warmups, out_dir=str(tmp_path))
    rounds = asyncio.run(sweep.run_rounds(args, ["a", "b"], {}, None, measure))
    assert len(plays) == 2 * (warmups + 2)
    assert plays[:4] == ["a", "b", "b", "a"]  # rotating from the first play, warm-ups included
    assert {name: [line["round"] for line in lines] for name, lines in rounds.items()} == {"a": [0, 1], "b": [0, 1]}
    # The pooled rounds are the last two of each server's plays.
    assert [line["output_throughput"] for line in rounds["a"]] == [
        float(i + 1) for i, name in enumerate(plays) if name == "a"][warmups:]
    for name in ("a", "b"):
        measured = (tmp_path / f"{name}.rounds.jsonl").read_text().splitlines()
        assert [json.loads(line)["round"] for line in measured] == [0, 1]
        warm = tmp_path / f"{name}.warmup.jsonl"
        assert (len(warm.read_text().splitlines()) if warm.exists() else 0) == warmups


def test_negative_warmup_rounds_are_refused(capsys):
    sweep = load_sweep()
    with pytest.raises(SystemExit):
        sweep.main(["--server", "a=http://127.0.0.1:1", "--server", "b=http://127.0.0.1:2", "--out-dir", "x",
                    "--warmup-rounds", "-1"])
    assert "--warmup-rounds must be at least 0" in capsys.readouterr().err
