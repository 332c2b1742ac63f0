"""cost_log_report's first-sample-of-a-run table: under overlap a cost sample (launch to next launch)
waits for the step launched before it, so the first sample of a run of one k holds the run's first
step, the one right after a switch. A log written the way the scheduler writes it, where that step
costs more, shows it there and nowhere else."""

import pytest

from sglang.benchmark import cost_log_report

BASE_MS = {3: 2.0, 1: 1.6}


def overlapped_log(ks: list, switch_ms: float, batch_size: int = 1) -> list[str]:
    """The scheduler's L, S and P lines for these launches (k of a decode step; None: a prefill).
    A launch starts when the step launched two before it finishes (the pipeline); a decode step's
    first run step costs switch_ms more. A step is sampled at the next launch if the launch before
    it was a decode step of the same k (and the next one is a decode step)."""
    lines, t, last_start, finish = [], 0.0, 0.0, [0.0, 0.0]  # finish: when the last two launched steps end
    for i, k in enumerate(ks):
        t = max(t + 1e-4, finish[-2])
        if k is None:
            lines.append(f"P {t:.6f}")
            finish = [t, t + 1e-3]  # the pipeline drains around a prefill
            continue
        lines.append(f"L {t:.6f} {batch_size} {k} 300 0")
        previous, before = (ks[i - 1] if i else None), (ks[i - 2] if i > 1 else None)
        if previous is not None and previous == before:
            lines.append(f"S {batch_size} {previous} 300 {t - last_start:.6f}")
        last_start = t
        first = previous != k
        finish = [finish[-1], max(finish[-1], t) + 1e-3 * (BASE_MS[k] + (switch_ms if first else 0.0))]
    return lines


def test_the_first_sample_of_each_run_shows_what_a_switch_adds():
    ks = ([3] * 20 + [1] * 4) * 6 + [3] * 20  # exploration bursts of 4 steps of k = 1
    rep = cost_log_report.report(cost_log_report.parse(overlapped_log(ks, switch_ms=0.4)))
    first = rep["first_in_run"]
    assert first["1 k1"]["first_n"] == 6 and first["1 k1"]["rest_n"] == 12
    assert first["1 k1"]["first_median_ms"] == pytest.approx(1.6 + 0.4, abs=2e-3)
    assert first["1 k1"]["rest_median_ms"] == pytest.approx(1.6, abs=2e-3)
    assert first["1 k3"]["first_median_ms"] == pytest.approx(2.0 + 0.4, abs=2e-3)
    assert first["1 k3"]["rest_median_ms"] == pytest.approx(2.0, abs=2e-3)
    text = cost_log_report.render("log", rep)
    assert "first sample of a run" in text and "1.250" in text  # k = 1: 2.0 / 1.6


def test_without_a_switch_cost_the_first_samples_equal_the_rest():
    rep = cost_log_report.report(cost_log_report.parse(overlapped_log(([3] * 10 + [1] * 5) * 4, switch_ms=0.0)))
    assert set(rep["first_in_run"]) == {"1 k1", "1 k3"}
    for row in rep["first_in_run"].values():
        assert row["first_median_ms"] == pytest.approx(row["rest_median_ms"], abs=2e-3)


def test_a_prefill_starts_a_new_run():
    log = cost_log_report.parse(overlapped_log([3] * 5 + [None] + [3] * 5, switch_ms=0.0))
    # Each stretch of 5 launches gives 3 samples (its second to fourth steps), at places 2, 3 and 4.
    assert log["run_positions"] == [2, 3, 4, 2, 3, 4]
