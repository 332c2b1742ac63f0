"""The benchmark-only cost log (SGLANG_SPEC_COST_LOG) and dense exploration (SGLANG_SPEC_EXPLORE_EVERY)
of a speculative server, and python -m sglang.benchmark.cost_log_report, which reads the log: what each k's
steps cost, paired with the k that ran around them."""

from __future__ import annotations

import glob

import pytest

from sglang import demo
from sglang.benchmark import cost_log_report
from sglang.srt import bench_hooks
from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs
from sglang.test.runner_utils import run_to_completion


def serve(tmp_path, monkeypatch, explore_every: str | None) -> tuple[dict, str]:
    monkeypatch.setenv(bench_hooks.COST_LOG_ENV, str(tmp_path / "server"))
    if explore_every is not None:
        monkeypatch.setenv(bench_hooks.EXPLORE_EVERY_ENV, explore_every)
        # As the benchmarks' dense exploration runs: where the start-up step costs (timed on a busy
        # CPU) say speculation does not pay, requests are admitted without the draft and no k > 0
        # could be explored; with the draft following every request each k runs whatever they say.
        monkeypatch.setenv(bench_hooks.DRAFT_FOLLOWS_ALL_ENV, "1")
    scheduler = Scheduler(
        ServerArgs(
            model_path=demo.TARGET_PATH,
            dtype="float32",
            device="cpu",
            speculative_algorithm="EAGLE3",
            speculative_draft_model_path=demo.DRAFT_PATH,
            speculative_num_steps=3,
            speculative_adaptive=True,
        )
    )
    for i in range(3):
        params = SamplingParams(max_new_tokens=160, temperature=0, ignore_eos=True)
        scheduler.add_request(TokenizedGenerateReqInput(f"r{i}", [100 + i, 17, 300, 41, 9], params, stream=False))
    run_to_completion(scheduler, lambda step: None)
    scheduler.spec.close()
    (path,) = glob.glob(str(tmp_path / "server.*.txt"))
    return scheduler.get_internal_state(), path


def test_the_log_holds_every_decode_launch_and_cost_sample_and_dense_exploration_runs_every_k(tmp_path, monkeypatch):
    state, path = serve(tmp_path, monkeypatch, explore_every="2")
    with open(path) as f:
        log = cost_log_report.parse(f)
    steps = {int(k): n for k, n in state["spec_steps_by_k"].items()}
    rep = cost_log_report.report(log)
    assert rep["steps_per_k"] == steps, "one L line per decode launch, with its k"
    policy = state["spec_policy"]
    assert len(steps) == 3, f"exploring every 2 steps runs k = 0, 1 and 3: {steps}"
    assert rep["exploration_steps"] == policy["exploration"]["steps"] > 0
    assert len(log["samples"]) == sum(sum(by_bucket.values()) for by_bucket in policy["cost"]["samples"].values()), (
        "one S line per cost sample the policy learned from"
    )
    assert rep["paired"], "runs of one k between runs of another are paired"
    assert (
        set(rep["tokens_per_verify"]) == {0, 1, 3} and rep["tokens_per_verify"][3] >= rep["tokens_per_verify"][1] >= 1
    )


def test_bad_settings_fail_at_start_naming_the_variable(tmp_path):
    with pytest.raises(ValueError, match=bench_hooks.EXPLORE_EVERY_ENV):
        bench_hooks.from_env({bench_hooks.EXPLORE_EVERY_ENV: "often"})
    with pytest.raises(ValueError, match=bench_hooks.COST_LOG_ENV):
        bench_hooks.open_cost_log(str(tmp_path / "no such folder" / "log"))
    assert bench_hooks.open_cost_log(None) is None and bench_hooks.from_env({}) == bench_hooks.OFF


def synthetic_log() -> list[str]:
    """k = 3 at batch 20 costs 1 ms, or 2 ms while every step is slow; k = 1 runs in bursts of 4 and
    costs 0.8 of k = 3 at the same moment. Every third stretch is slow, and k = 1's bursts come only
    in those."""
    lines, t = [], 0.0
    for stretch in range(12):
        slow = 1.0 if stretch % 3 else 2.0
        for step in range(20):
            k = 1 if slow > 1 and 8 <= step < 12 else 3
            seconds = 1e-3 * slow * (0.8 if k == 1 else 1.0)
            t += seconds
            lines.append(f"L {t:.6f} 20 {k} 4000 {stretch}")
            lines.append(f"S 20 {k} 4000 {seconds:.6f}")
            lines.append(f"V {k} 20 {20 * (1.8 if k == 1 else 3.0):.0f}")
        lines.append(f"P {t:.6f}")
    return lines


def test_paired_ratios_cancel_a_slowdown_common_to_every_k():
    rep = cost_log_report.report(cost_log_report.parse(synthetic_log()))
    costs = rep["costs"]
    # By octave alone, k = 1 looks 1.6x k = 3's median: most of its samples come from slow stretches.
    assert costs["16-31 k1"]["median_ms"] / costs["16-31 k3"]["median_ms"] == pytest.approx(1.6)
    # Paired with the k = 3 steps around each burst: 0.8, the true ratio.
    assert rep["paired"]["16-31 k1/k3"]["cost_ratio"] == pytest.approx(0.8)
    assert rep["paired"]["16-31 k1/k3"]["value_ratio"] == pytest.approx(1.8 / 3.0 / 0.8)
    assert rep["tokens_per_verify"] == {1: 1.8, 3: 3.0, 0: 1.0}
    assert rep["switches"] == 4 * 2 and rep["steps_per_k"] == {1: 16, 3: 224}
    text = cost_log_report.render("synthetic", rep)
    assert "16-31 k1/k3" in text and "0.800" in text


def test_the_report_names_a_malformed_line(tmp_path, capsys):
    bad = tmp_path / "bad.txt"
    bad.write_text("L 1.0 4 3 100 0\nS 4 three 100 0.001\n")
    assert cost_log_report.main([str(bad)]) == 1
    assert "line 2" in capsys.readouterr().err
    good = tmp_path / "good.txt"
    good.write_text("\n".join(synthetic_log()) + "\n")
    out = tmp_path / "report.json"
    assert cost_log_report.main([str(good), "--json", str(out)]) == 0
    assert "paired" in out.read_text()


def test_pauses_between_launches_are_counted_by_what_stood_still():
    """A gap of 0.1-1 s between launches inside a play is a pause: with requests running (the
    scheduler stood still), after the batch drained to one (no new request came) or after a
    prefill; longer gaps are the server idle between plays."""
    lines = [
        "L 0.000 20 3 4000 0",
        "L 0.001 20 3 4000 0",
        "L 0.301 20 3 4000 0",  # 300 ms with 20 requests running
        "L 0.302 1 3 300 0",
        "P 0.502",  # 200 ms after the batch drained to one
        "L 0.503 2 3 600 0",
        "P 0.504",
        "L 0.654 2 3 600 0",  # 150 ms after a prefill
        "L 3.000 16 3 4000 0",
    ]  # the next play, 2.3 s later: not a pause
    rep = cost_log_report.report(cost_log_report.parse(lines))
    assert (rep["pauses"], rep["with_running"], rep["drained"], rep["after_prefill"]) == (3, 1, 1, 1)
    assert rep["pause_s"] == pytest.approx(0.65) and rep["busy_s"] == pytest.approx(0.654)
    assert "pauses of 100-1000 ms between launches: 3" in cost_log_report.render("log", rep)
