"""SGLANG_SIMULATE_ACC_LEN (benchmarks only): verification accepts drafts at the per-position rate
that gives the asked mean accept length, and a plain step's probe hits at that same rate, so a
policy's acceptance estimate stays at the simulated value while the server decodes plainly (a
probe of the random draft's real guesses would read ~0 and keep it plain for good)."""

from __future__ import annotations

import pytest
import torch

from sglang.srt.sampling.simulated_acceptance import simulate_acceptance, simulated_accept_rate, simulated_probe_hits


@pytest.mark.parametrize("accept_length, k", [(2.0, 3), (3.0, 3), (1.5, 1), (4.0, 5)])
def test_the_rate_gives_the_asked_accept_length(accept_length, k):
    rate = simulated_accept_rate(accept_length, k)
    assert sum(rate**i for i in range(k + 1)) == pytest.approx(accept_length, rel=1e-9)
    positions = torch.arange(20000) * 7 + 3
    drafts = torch.randint(0, 50, (positions.numel(), k))
    logits = torch.randn(positions.numel(), k + 1, 50)
    tokens, num_out = simulate_acceptance(logits, drafts, positions, rate)
    assert num_out.float().mean().item() == pytest.approx(accept_length, rel=0.03)
    # Accepted drafts are output as drafted, then the target's greedy token at the first rejection.
    row = int(torch.nonzero(num_out > 1)[0])
    n = int(num_out[row])
    assert tokens[row, : n - 1].tolist() == drafts[row, : n - 1].tolist()
    assert int(tokens[row, n - 1]) == int(logits[row, n - 1].argmax())


def test_out_of_range_lengths_clamp_to_what_k_can_reach():
    assert simulated_accept_rate(0.5, 3) == pytest.approx(0.0, abs=1e-9)
    assert simulated_accept_rate(9.0, 3) == pytest.approx(1.0, abs=1e-9)


def test_plain_probes_hit_at_the_simulated_rate_and_match_the_first_draft():
    rate = simulated_accept_rate(2.5, 3)
    positions = torch.arange(20000) * 5 + 1
    hits = simulated_probe_hits(positions, rate)
    assert hits.float().mean().item() == pytest.approx(rate, abs=0.015)
    # The probe at a position is the verdict of a speculative step's first draft there.
    _, num_out = simulate_acceptance(
        torch.randn(positions.numel(), 4, 8), torch.zeros(positions.numel(), 3, dtype=torch.long), positions, rate
    )
    assert torch.equal(hits, num_out > 1)


def test_requests_at_the_same_position_draw_independently_with_their_rows():
    """A batch of equal-length prompts advances in lockstep: keyed on the position alone, every
    request accepts or rejects together (the batch's rate per step is 0 or 1, and a policy's
    estimate of it swings); keyed on the row as well, each step's batch rate is near the rate."""
    rate, rows = simulated_accept_rate(1.5, 3), torch.arange(256)
    positions = torch.full((256,), 200)
    alike = simulated_probe_hits(positions, rate)
    assert alike.all() or not alike.any()
    per_step = [simulated_probe_hits(torch.full((256,), p), rate, rows).float().mean().item() for p in range(200, 240)]
    assert all(abs(r - rate) < 0.15 for r in per_step)
    assert sum(per_step) / len(per_step) == pytest.approx(rate, abs=0.03)
    _, num_out = simulate_acceptance(
        torch.randn(256, 4, 8), torch.zeros(256, 3, dtype=torch.long), positions, rate, rows
    )
    assert torch.equal(simulated_probe_hits(positions, rate, rows), num_out > 1), "the probe is the first draft"
