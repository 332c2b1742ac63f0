"""python -m sglang.benchmark.envelope_report: the envelope check of dynamic speculation from three
sweeps' JSON lines (goals: dynamic >= 0.98 x the better of no draft / always at every level,
>= 0.99 x no draft at the largest)."""

from __future__ import annotations

import json

import pytest

from sglang.benchmark import envelope_report as report


def write(tmp_path, name: str, throughputs: dict[int, float], failed: int = 0) -> str:
    path = tmp_path / f"{name}.jsonl"
    path.write_text(
        "".join(
            json.dumps(
                {
                    "max_concurrency": c,
                    "output_throughput": t,
                    "failed": failed,
                    "accept_length": 2.5 if name != "plain" else None,
                    "spec_step_share_by_k": {"0": c / 256, "3": 1 - c / 256},
                    "spec_prompts_without_draft": c // 64,
                }
            )
            + "\n"
            for c, t in throughputs.items()
        )
    )
    return str(path)


def run(tmp_path, plain, always, dynamic, failed=0):
    out = tmp_path / "report.json"
    rc = report.main(
        [
            "--no-draft",
            write(tmp_path, "plain", plain),
            "--always",
            write(tmp_path, "always", always),
            "--dynamic",
            write(tmp_path, "dynamic", dynamic, failed),
            "--out",
            str(out),
        ]
    )
    return rc, (json.loads(out.read_text()) if out.exists() else None)


def test_an_envelope_that_holds_passes_with_the_ratios(tmp_path):
    rc, result = run(
        tmp_path, {1: 100, 64: 3000, 256: 8000}, {1: 220, 64: 2500, 256: 4000}, {1: 216, 64: 2990, 256: 7950}
    )
    assert rc == 0 and not result["missed"]
    first = result["points"][0]
    assert first["dynamic_vs_best"] == pytest.approx(216 / 220)
    assert result["points"][-1]["dynamic_vs_no_draft"] == pytest.approx(7950 / 8000)
    assert first["dynamic_step_share_by_k"] == {"0": 1 / 256, "3": 255 / 256}  # the mode mix of each point
    # and how many of the level's prompts the dynamic server admitted without the draft
    assert [p["dynamic_prompts_without_draft"] for p in result["points"]] == [0, 1, 4]
    assert result["notes"] == []  # the lines carry no durations: nothing to flag


def test_levels_too_short_to_read_are_flagged(tmp_path):
    no_draft, always = tmp_path / "n.jsonl", tmp_path / "a.jsonl"
    for path, tps in ((no_draft, 100.0), (always, 200.0)):
        path.write_text(
            "".join(
                json.dumps({"max_concurrency": c, "output_throughput": tps * c, "failed": 0, "duration": seconds})
                + "\n"
                for c, seconds in ((1, 20.0), (8, 1.05))
            )
        )
    out = tmp_path / "r.json"
    rc = report.main(
        ["--no-draft", str(no_draft), "--always", str(always), "--dynamic", str(always), "--out", str(out)]
    )
    notes = json.loads(out.read_text())["notes"]
    assert rc == 0 and len(notes) == 1 and "levels [8]" in notes[0]


@pytest.mark.parametrize(
    "dynamic, missed_level",
    [
        ({1: 200, 64: 3000, 256: 8000}, 1),  # 200 < 0.98 x 220 at concurrency 1
        ({1: 220, 64: 3000, 256: 7900}, 256),  # 7900 < 0.99 x 8000 at the top level
    ],
)
def test_a_missed_goal_exits_1_and_names_the_level(tmp_path, dynamic, missed_level):
    rc, result = run(tmp_path, {1: 100, 64: 3000, 256: 8000}, {1: 220, 64: 2500, 256: 4000}, dynamic)
    assert rc == 1 and any(f"concurrency {missed_level}" in line for line in result["missed"])


def test_failed_requests_or_no_common_level_exit_2(tmp_path, capsys):
    rc, result = run(tmp_path, {1: 100}, {1: 200}, {1: 200}, failed=3)
    assert rc == 2 and "failed requests" in result["problems"][0]
    rc, _ = run(tmp_path, {1: 100}, {2: 200}, {4: 200})
    assert rc == 2 and "share no concurrency level" in capsys.readouterr().err


def test_a_control_sweep_reports_the_spread_between_identical_servers_without_judging(tmp_path, capsys):
    """--control: a second always server. Its ratio to always per level, and the largest and mean
    distance from 1, are printed and written; a control far off does not fail the envelope."""
    control = write(tmp_path, "always_b", {1: 231, 64: 2400, 256: 4000})
    out = tmp_path / "report.json"
    rc = report.main(
        [
            "--no-draft",
            write(tmp_path, "plain", {1: 100, 64: 3000, 256: 8000}),
            "--always",
            write(tmp_path, "always", {1: 220, 64: 2500, 256: 4000}),
            "--dynamic",
            write(tmp_path, "dynamic", {1: 216, 64: 2990, 256: 7950}),
            "--control",
            control,
            "--out",
            str(out),
        ]
    )
    result = json.loads(out.read_text())
    assert rc == 0 and not result["missed"]
    assert [p["control_vs_always"] for p in result["points"]] == pytest.approx([1.05, 0.96, 1.0])
    assert any("up to 5.0%" in note and "mean 3.0%" in note for note in result["notes"]), result["notes"]
    assert "ctrl/alw" in capsys.readouterr().out


def test_identical_instances_are_pooled_by_tokens_over_time_and_their_spread_reported(tmp_path):
    """--always / --dynamic given twice: each kind is judged by its instances pooled (total output
    tokens over total measured time), each instance's throughput and their spread are reported.
    Here dynamic's first instance alone would miss at concurrency 8 (0.95 x always's first), the
    pooled pair does not (an instance's own offset averages out), and the second instance's
    longer measurement weighs more."""

    def sweep(name, rows):
        path = tmp_path / f"{name}.jsonl"
        path.write_text(
            "".join(
                json.dumps(
                    {
                        "max_concurrency": c,
                        "output_throughput": tokens / seconds,
                        "total_output_tokens": tokens,
                        "duration": seconds,
                        "failed": 0,
                        "accept_length": length,
                        "spec_step_share_by_k": {"3": 1.0},
                    }
                )
                + "\n"
                for c, (tokens, seconds, length) in rows.items()
            )
        )
        return str(path)

    plain = sweep("plain", {8: (10_000, 10.0, None)})
    always = [sweep("always", {8: (20_000, 10.0, 2.9)}), sweep("always_b", {8: (19_000, 10.0, 3.0)})]
    dynamic = [sweep("dynamic", {8: (19_000, 10.0, 2.9)}), sweep("dynamic_b", {8: (40_000, 20.0, 3.1)})]
    out = tmp_path / "r.json"
    rc = report.main(
        [
            "--no-draft",
            plain,
            "--always",
            always[0],
            "--always",
            always[1],
            "--dynamic",
            dynamic[0],
            "--dynamic",
            dynamic[1],
            "--out",
            str(out),
        ]
    )
    result = json.loads(out.read_text())
    point = result["points"][0]
    assert rc == 0 and not result["missed"]
    assert point["always_tok_s"] == pytest.approx(39_000 / 20)
    assert point["dynamic_tok_s"] == pytest.approx(59_000 / 30)
    assert point["dynamic_vs_best"] == pytest.approx((59_000 / 30) / (39_000 / 20))
    assert point["dynamic_instances_tok_s"] == [1900, 2000]
    assert point["always_instances_spread"] == pytest.approx(2000 / 1900 - 1)
    assert point["dynamic_accept_length"] == pytest.approx(3.0)
    assert any("always: 2 identical instances" in note for note in result["notes"])
    # The first dynamic instance alone misses.
    assert report.main(["--no-draft", plain, "--always", always[0], "--dynamic", dynamic[0]]) == 1
