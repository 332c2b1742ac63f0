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
    spec = importlib.util.spec_from_file_location(
        "interleaved_sweep", os.path.join(ROOT, "benchmark", "interleaved_sweep.py")
    )
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
        float(i + 1) for i, name in enumerate(plays) if name == "a"
    ][warmups:]
    for name in ("a", "b"):
        measured = (tmp_path / f"{name}.rounds.jsonl").read_text().splitlines()
        assert [json.loads(line)["round"] for line in measured] == [0, 1]
        warm = tmp_path / f"{name}.warmup.jsonl"
        assert (len(warm.read_text().splitlines()) if warm.exists() else 0) == warmups


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--warmup-rounds", "-1", "--warmup-rounds must be at least 0"),
        ("--time-budget-s", "0", "--time-budget-s must be positive"),
    ],
)
def test_bad_round_options_are_refused(capsys, flag, value, message):
    sweep = load_sweep()
    with pytest.raises(SystemExit):
        sweep.main(
            ["--server", "a=http://127.0.0.1:1", "--server", "b=http://127.0.0.1:2", "--out-dir", "x", flag, value]
        )
    assert message in capsys.readouterr().err


def write_rounds(path, lines):
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def round_line(level, round_index, tokens, phases=None):
    line = {
        "max_concurrency": level,
        "round": round_index,
        "position": 0,
        "started_unix": 0.0,
        "ended_unix": 1.0,
        "duration": 2.0,
        "completed": 4,
        "failed": 0,
        "total_input_tokens": 40,
        "total_output_tokens": tokens,
        "input_throughput": 20.0,
        "output_throughput": tokens / 2.0,
        "concurrency": float(level),
        "mean_tpot_ms": 10.0,
        "errors": [],
    }
    if phases is not None:
        line["phases"] = phases
    return line


def test_repool_after_a_cut_short_sweep_pools_only_the_rounds_every_server_finished(tmp_path, capsys):
    sweep = load_sweep()
    # a finished rounds 0-2 at both levels; b was cut off during round 2 of level 16.
    write_rounds(
        tmp_path / "a.rounds.jsonl",
        [round_line(1, r, 100 * (r + 1)) for r in range(3)] + [round_line(16, r, 1000 * (r + 1)) for r in range(3)],
    )
    write_rounds(
        tmp_path / "b.rounds.jsonl",
        [round_line(1, r, 10 * (r + 1)) for r in range(3)] + [round_line(16, r, 7) for r in range(2)],
    )
    (tmp_path / "a.jsonl").write_text("stale line from the cut-short sweep\n")
    assert sweep.main(["repool", str(tmp_path), "a", "b"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "concurrency 1: pooled rounds [0, 1, 2]",
        "concurrency 16: pooled rounds [0, 1], left out [2]",
    ]
    a = [json.loads(line) for line in (tmp_path / "a.jsonl").read_text().splitlines()]
    b = [json.loads(line) for line in (tmp_path / "b.jsonl").read_text().splitlines()]
    assert [line["max_concurrency"] for line in a] == [1, 16]
    assert [line["rounds"] for line in a] == [3, 2] == [line["rounds"] for line in b]
    # a's third round at 16 (3,000 tokens) is left out: b has no play in that round to set against it.
    assert a[1]["total_output_tokens"] == 3000 and a[1]["output_throughput"] == 3000 / 4.0
    assert b[0]["round_output_throughput"] == [5.0, 10.0, 15.0]


def test_repool_pools_a_trace_with_its_phases(tmp_path, capsys):
    sweep = load_sweep()

    def phases(tokens):
        return [
            {
                "seconds": 10,
                "target_concurrency": c,
                "accept_mix": None,
                "completed": 1,
                "window_output_tokens": tokens,
                "window_output_throughput": tokens / 10,
                "mean_tpot_ms": 5.0,
            }
            for c in (1, 8)
        ]

    for name in ("a", "b"):
        write_rounds(tmp_path / f"{name}.rounds.jsonl", [round_line(1, r, 50, phases(100 * (r + 1))) for r in range(2)])
    assert sweep.main(["repool", str(tmp_path), "a", "b"]) == 0
    assert capsys.readouterr().out.strip() == "trace: pooled rounds [0, 1]"
    (pooled,) = [json.loads(line) for line in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert [phase["window_output_throughput"] for phase in pooled["phases"]] == [15.0, 15.0]  # 300 tokens over 20 s
    assert pooled["total_output_tokens"] == 100


def test_repool_names_a_server_without_rounds(tmp_path, capsys):
    sweep = load_sweep()
    write_rounds(tmp_path / "a.rounds.jsonl", [round_line(1, 0, 10)])
    assert sweep.main(["repool", str(tmp_path), "a", "typo"]) == 1
    assert "no rounds of typo" in capsys.readouterr().err
    assert sweep.main(["repool", str(tmp_path), "a"]) == 2
    assert "two or more servers" in capsys.readouterr().err


def test_a_time_budget_stops_before_a_round_that_would_not_fit(tmp_path, capsys, monkeypatch):
    """Plays of 0.1 s (two servers: rounds of 0.2 s) under a 0.5 s budget: two complete rounds, no
    third started (a round in progress is never cut off); every server has the same rounds."""
    sweep = load_sweep()
    clock = [100.0]
    monkeypatch.setattr(sweep, "_now", lambda: clock[0])

    async def measure(name, round_index):
        clock[0] += 0.1
        return {"failed": 0, "output_throughput": 1.0}

    args = argparse.Namespace(rounds=5, warmup_rounds=0, out_dir=str(tmp_path), time_budget_s=0.5, started=100.0)
    rounds = asyncio.run(sweep.run_rounds(args, ["a", "b"], {}, None, measure))
    assert {name: [line["round"] for line in lines] for name, lines in rounds.items()} == {"a": [0, 1], "b": [0, 1]}
    assert "time budget: 2 of 5 rounds measured" in capsys.readouterr().err
    # Past its budget already, a level still gets its first measured round (after the warm-up one).
    args = argparse.Namespace(
        rounds=3, warmup_rounds=1, out_dir=str(tmp_path / "late"), time_budget_s=0.5, started=clock[0] - 60
    )
    os.makedirs(args.out_dir)
    rounds = asyncio.run(sweep.run_rounds(args, ["a", "b"], {}, None, measure))
    assert [line["round"] for line in rounds["a"]] == [0]
