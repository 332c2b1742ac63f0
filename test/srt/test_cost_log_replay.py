"""python -m sglang.benchmark.cost_log_replay: the speculation policy replayed against a recorded cost log, each
k charged what the log's samples of it cost at that moment."""

from __future__ import annotations

import json

import pytest

from sglang.benchmark import cost_log_replay

SERVED_MS = {0: 0.32, 1: 0.50, 3: 0.62}  # at batch 16, typical (the demo pair on an H100)


def dense_log(steps: int = 6000) -> list[str]:
    """A dense-exploration server at batch 16: k = 3 runs, k = 1 and k = 0 each for 4 steps in every
    24; every 200 steps, 10 steps are 3.5x slower whatever runs. Verifies give 3.0 tokens per
    request at k = 3 and 1.8 at k = 1 (a per-position rate of 0.8)."""
    lines, t = [], 0.0
    for step in range(steps):
        k = {4: 1, 5: 1, 6: 1, 7: 1, 16: 0, 17: 0, 18: 0, 19: 0}.get(step % 24, 3)
        seconds = SERVED_MS[k] * (3.5 if step % 200 < 10 else 1.0) / 1e3
        t += seconds
        lines.append(f"L {t:.6f} 16 {k} 4800 0")
        lines.append(f"S 16 {k} 4800 {seconds:.6f}")
        if k:
            lines.append(f"V {k} 16 {16 * (2.952 if k == 3 else 1.8):.0f}")
        if step % 500 == 499:
            lines.append(f"P {t:.6f}")
    return lines


def server_info() -> dict:
    flat = {str(bs): 0.4 for bs in (1, 8, 16, 32)}
    return {
        "internal_states": [
            {
                "spec_policy": {
                    "cost": {
                        "prior": {
                            "plain_ms": flat,
                            "spec_ms": {"1": flat, "3": flat},
                            "context_ns_per_token": {"0": 0.0},
                        }
                    }
                }
            }
        ]
    }


def test_the_policy_replayed_on_a_dense_log_keeps_the_best_k_through_slow_stretches(tmp_path, capsys):
    log_path, info_path, out = tmp_path / "log.txt", tmp_path / "info.json", tmp_path / "replay.json"
    log_path.write_text("\n".join(dense_log()) + "\n")
    info_path.write_text(json.dumps(server_info()))
    assert (
        cost_log_replay.main([str(log_path), "--server-info", str(info_path), "--seeds", "2", "--json", str(out)]) == 0
    )
    result = json.loads(out.read_text())
    assert result["acceptance_rate"] == pytest.approx(0.8, abs=0.01)
    fixed = {int(k): r["tok_s"] for k, r in result["fixed"].items()}
    # A fixed k's tokens per second: 16 requests' tokens over the log's costs of k at each step.
    slow_share = 10 / 200
    for k, tokens in ((0, 1.0), (1, 1.8), (3, 2.952)):
        seconds = SERVED_MS[k] / 1e3 * (1 + 2.5 * slow_share)
        assert fixed[k] == pytest.approx(16 * tokens / seconds, rel=0.03), k
    assert result["best_fixed"] == 3
    for policy in result["policy"]:
        assert policy["tok_s"] >= 0.98 * fixed[3], policy
        assert policy["decisions"] <= 2 and policy["exploration_share"] <= 0.02, policy
    assert "policy (seed 1)" in capsys.readouterr().out


def test_bad_inputs_are_named(tmp_path, capsys):
    info_path = tmp_path / "info.json"
    info_path.write_text(json.dumps({"internal_states": [{}]}))
    log_path = tmp_path / "log.txt"
    log_path.write_text("\n".join(dense_log(50)) + "\n")
    assert cost_log_replay.main([str(log_path), "--server-info", str(info_path)]) == 1
    assert "no cost table" in capsys.readouterr().err
    info_path.write_text(json.dumps(server_info()))
    log_path.write_text("L 1.0 16 3 4800 0\nS 16 3 4800 soon\n")
    assert cost_log_replay.main([str(log_path), "--server-info", str(info_path)]) == 1
    assert "line 2" in capsys.readouterr().err
    log_path.write_text("P 1.0\n")
    assert cost_log_replay.main([str(log_path), "--server-info", str(info_path)]) == 1
    assert "no decode launches" in capsys.readouterr().err
