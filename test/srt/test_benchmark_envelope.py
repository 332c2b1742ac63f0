"""python -m sglang.benchmark.envelope: dynamic against the best static server per level, the
no-draft goal where no draft is best, misses inside the A/A spread, and traces."""

from __future__ import annotations

import json

from sglang.benchmark import envelope


def write(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def level(concurrency, tok_s, **extra):
    return {"max_concurrency": concurrency, "output_throughput": tok_s, **extra}


def test_levels_are_judged_against_the_best_static_server(tmp_path, capsys):
    dynamic = write(tmp_path / "d.jsonl", [level(1, 100.0), level(64, 985.0), level(256, 1000.0)])
    no_draft = write(tmp_path / "n.jsonl", [level(1, 50.0), level(64, 900.0), level(256, 1020.0)])
    always = write(tmp_path / "a.jsonl", [level(1, 101.0), level(64, 1000.0), level(256, 700.0)])
    twin = write(tmp_path / "n2.jsonl", [level(1, 50.0), level(64, 890.0), level(256, 1000.0)])
    out = tmp_path / "report.json"
    rc = envelope.main(
        [
            "--dynamic",
            dynamic,
            "--static",
            f"no_draft={no_draft}",
            "--static",
            f"always={always}",
            "--aa",
            f"no_draft={twin}",
            "--out",
            str(out),
        ]
    )
    rows = json.loads(out.read_text())
    assert [row["best_static"] for row in rows] == ["always", "always", "no_draft"]
    assert [row["ok"] for row in rows] == [True, True, False]  # 1000 / 1020 = 0.980 < 0.99 x no draft
    assert rows[2]["miss_within_aa"] and rows[2]["aa_spread"] == round(1 - 1000 / 1020, 4)
    assert rc == 1 and "miss within A/A" in capsys.readouterr().out


def test_a_trace_needs_five_percent_on_throughput_and_tpot(tmp_path):
    def trace(tok_s, tpot):
        return {"max_concurrency": None, "output_throughput": tok_s, "mean_tpot_ms": tpot}

    dynamic = write(tmp_path / "d.jsonl", [trace(1100.0, 9.0)])
    statics = [
        f"no_draft={write(tmp_path / 'n.jsonl', [trace(1000.0, 10.0)])}",
        f"always={write(tmp_path / 'a.jsonl', [trace(900.0, 9.6)])}",
    ]
    assert envelope.main(["--dynamic", dynamic] + sum((["--static", s] for s in statics), [])) == 0
    slower = write(tmp_path / "d2.jsonl", [trace(1100.0, 9.4)])  # TPOT only 1.02 x the best
    assert envelope.main(["--dynamic", slower] + sum((["--static", s] for s in statics), [])) == 1
    assert envelope.main(["--dynamic", str(tmp_path / "missing.jsonl"), "--static", statics[0]]) == 2


def test_a_trace_with_phases_is_also_read_phase_by_phase(tmp_path, capsys):
    """Lines that carry the tokens delivered per phase get each phase's dynamic / best static (the
    best may differ by phase) and their mean; the verdict stays on the whole trace."""

    def trace(tok_s, tpot, phases):
        return {
            "max_concurrency": None,
            "output_throughput": tok_s,
            "mean_tpot_ms": tpot,
            "phases": [
                {
                    "seconds": 10,
                    "target_concurrency": load,
                    "window_output_throughput": rate,
                    "window_output_tokens": rate * 10,
                }
                for load, rate in phases
            ],
        }

    dynamic = write(tmp_path / "d.jsonl", [trace(1100.0, 9.0, [([1, 1], 120.0), ([256, 256], 980.0)])])
    no_draft = write(tmp_path / "n.jsonl", [trace(1000.0, 10.0, [([1, 1], 60.0), ([256, 256], 1000.0)])])
    always = write(tmp_path / "a.jsonl", [trace(900.0, 9.6, [([1, 1], 100.0), ([256, 256], 700.0)])])
    out = tmp_path / "report.json"
    assert (
        envelope.main(
            [
                "--dynamic",
                dynamic,
                "--static",
                f"no_draft={no_draft}",
                "--static",
                f"always={always}",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    (row,) = json.loads(out.read_text())
    assert [(p["best_static"], p["dynamic_over_best"]) for p in row["phases"]] == [("always", 1.2), ("no_draft", 0.98)]
    assert row["mean_phase_ratio"] == 1.09
    # the best static of each phase: 1,000 + 10,000 tokens against no draft's 600 + 10,000 (dynamic: 1,200 + 9,800)
    assert row["phase_oracle_over_best"] == round(11000 / 10600, 4)
    assert row["phase_window_dynamic_over_best"] == round(11000 / 10600, 4)
    printed = capsys.readouterr().out
    assert "phase 1 (concurrency 256)" in printed and "0.980" in printed and "mean of the phases" in printed
    assert "an oracle switching at the boundaries) 1.038" in printed
    old = write(tmp_path / "old.jsonl", [{"max_concurrency": None, "output_throughput": 1000.0, "mean_tpot_ms": 10.0}])
    assert envelope.main(["--dynamic", dynamic, "--static", f"no_draft={old}", "--out", str(out)]) == 0
    assert "phases" not in json.loads(out.read_text())[0]  # a line without phases: the whole trace only
