"""The speculation policies (speculative/spec_policy.py, cost_policy.py), pure Python: acceptance
estimates per draft position (pooled and per request, probes, no leak), the measured cost table (bucket
rounding, extrapolation), the threshold and cost policies (the cost policy maximizes expected
tokens per second, speculates at small batches and not at large ones, does not flap under
hysteresis and dwell), the adaptive-config parser and make_policy's errors, and the summary."""

from __future__ import annotations

import json
import logging
import math
import random

import numpy as np
import pytest

from sglang.srt.speculative import acceptance, cost_policy
from sglang.srt.speculative.acceptance import AcceptanceEstimator
from sglang.srt.configs.speculative_adaptive import DEFAULT_ADAPTIVE_CONFIG, parse_adaptive_config
from sglang.srt.speculative.cost_model import LEARN_FIRST_SAMPLES, CostTable
from sglang.srt.speculative.exploration import Exploration
from sglang.srt.speculative.cost_policy import REEVALUATE_EVERY, CostPolicy
from sglang.srt.speculative.spec_policy import ThresholdPolicy, make_policy, policy_from_args, policy_names

K_MAX = 3
BUCKETS = (1, 8, 32, 64, 128, 256)


def spec_factor(bs: int) -> float:
    """Spec step cost relative to plain: 1.2x at batch 1, rising (in log2 bs) to 3x at 256."""
    return 1.2 + 1.8 * math.log2(bs) / 8


def make_cost(k_max: int = K_MAX) -> CostTable:
    """Plain grows with the batch; a spec step costs spec_factor(bs) times plain for k = 1 and a
    little more per extra draft."""
    plain = {bs: 0.010 + 0.0002 * bs for bs in BUCKETS}
    spec = {(bs, k): plain[bs] * spec_factor(bs) * (1 + 0.05 * (k - 1)) for bs in BUCKETS for k in range(1, k_max + 1)}
    return CostTable(plain, spec)


def sample_num_out(rng: random.Random, k: int, rate: float) -> int:
    """Tokens from one verify of k drafts, each accepted with `rate` given the previous were."""
    n = 1
    while n <= k and rng.random() < rate:
        n += 1
    return n


def feed(policy, rids: list[str], k: int, rate: float, rng: random.Random) -> None:
    """What the scheduler reports after a step of k: a verify, or a PLAIN step's probe."""
    if k > 0:
        policy.observe_verify(rids, [sample_num_out(rng, k, rate) for _ in rids], k)
    else:
        policy.observe_probe(rids, [rng.random() < rate for _ in rids])


def independent_objective(est: AcceptanceEstimator, cost: CostTable, rids: list[str], k: int) -> float:
    """Expected tokens per second of k for the batch, written out from the definition."""
    tokens = 0.0
    for rid in rids:
        a = est.rates(rid)
        tokens += 1 + sum(math.prod(a[:i]) for i in range(1, k + 1))
    return tokens / cost.seconds(len(rids), k)


# --- AcceptanceEstimator ---------------------------------------------------------------------


def test_estimator_learns_per_position_rates():
    est = AcceptanceEstimator(K_MAX)
    for _ in range(300):  # draft 1 always accepted, draft 2 never: every verify yields 2 tokens
        est.record_verify(["a", "b"], [2, 2], K_MAX)
    a = est.rates()
    assert a[0] > 0.99 and a[1] < 0.01
    assert a[2] == 0.5, "position 3 was never observed, so it keeps the prior"
    assert est.expected_tokens(3) == pytest.approx(2.0, abs=0.02)
    assert est.expected_tokens(0) == 1.0


def test_estimator_batch_is_one_observation_per_position():
    """A 256-request batch moves the pooled estimate as much as a 1-request batch would."""
    big, small = AcceptanceEstimator(K_MAX, alpha=0.1), AcceptanceEstimator(K_MAX, alpha=0.1)
    big.record_verify([f"r{i}" for i in range(256)], [2] * 256, 1)
    small.record_verify(["r"], [2], 1)
    assert big.rates()[0] == pytest.approx(0.5 + 0.1 * 0.5)
    assert big.rates() == pytest.approx(small.rates())
    # Mixed batch: position 1 observed by 4, accepted by 3; position 2 observed by 3, accepted by 1.
    est = AcceptanceEstimator(K_MAX, alpha=1.0)
    est.record_verify(["a", "b", "c", "d"], [1, 2, 2, 3], 2)
    assert est.rates()[:2] == pytest.approx([3 / 4, 1 / 3])


def test_probe_moves_only_a1():
    est = AcceptanceEstimator(K_MAX)
    for _ in range(200):
        est.record_probe(["a", "b"], [True, True])
    assert est.rates()[0] > 0.99
    assert est.rates()[1:] == [0.5, 0.5]
    assert est.rates("a")[0] > 0.99 and est.rates("a")[1:] == [0.5, 0.5]


def test_per_request_estimates_differ():
    est = AcceptanceEstimator(K_MAX)
    for step in range(100):
        est.record_verify(["good", "bad"], [K_MAX + 1, 1], K_MAX)
        if step == 9:  # ten verifies already tell them apart
            assert est.expected_tokens(K_MAX, "good") > 2.5 > 1.3 > est.expected_tokens(K_MAX, "bad")
    assert est.expected_tokens(K_MAX, "good") > 3.8
    assert est.expected_tokens(K_MAX, "bad") < 1.05
    assert est.rates("stranger") == est.rates(), "an unknown request gets the pooled rates"
    assert 1.05 < est.expected_tokens(K_MAX) < 3.8


def test_settled_request_estimate_is_not_swung_by_one_outcome():
    """Once a request has history, one unlucky verify moves its a_1 by request_alpha at most, so
    a single request's luck does not flip the policy's choice."""
    est = AcceptanceEstimator(K_MAX, request_alpha=0.05)
    for _ in range(40):
        est.record_verify(["a"], [K_MAX + 1], K_MAX)
    before = est.rates("a")[0]
    est.record_verify(["a"], [1], K_MAX)
    assert 0 < before - est.rates("a")[0] <= 0.05 * before + 1e-12


def test_forget_drops_request_state():
    est = AcceptanceEstimator(K_MAX)
    rids = [f"r{i}" for i in range(100)]
    est.record_verify(rids, [2] * 100, K_MAX)
    est.record_probe(["extra"], [False])
    assert est.tracked_requests == 101
    for rid in rids + ["extra"]:
        est.forget(rid)
    assert est.tracked_requests == 0 and len(est._per_request) == 0
    est.forget("never-seen")  # finishing a request that never speculated is fine


@pytest.mark.parametrize("rids", [["a"], [f"r{i}" for i in range(9)]])
def test_estimator_rejects_impossible_verify(rids):
    est = AcceptanceEstimator(K_MAX)
    for bad in (5, 0):
        with pytest.raises(ValueError, match=f"request 'a|r0' produced {bad} tokens from 3 drafts"):
            est.record_verify(rids, [bad] + [1] * (len(rids) - 1), 3)
    with pytest.raises(ValueError, match="k_step 4"):
        est.record_verify(rids, [1] * len(rids), 4)
    assert est.rates() == [est.prior] * K_MAX  # nothing recorded


def test_queued_request_updates_fold_in_exactly_as_updates_made_at_once(monkeypatch):
    """A large batch's per-request updates wait in a queue until something reads the requests'
    rates (or MAX_PENDING_STEPS steps queue), a run of steps of one batch sharing a gather and a
    scatter: requests finishing meanwhile (their rows reused by new requests only after the fold),
    probes, small batches between large ones, stretches of one batch and reads at random points
    leave every rate as updating at once does."""

    def history(max_pending: int) -> tuple[AcceptanceEstimator, list[str], list]:
        monkeypatch.setattr(acceptance, "MAX_PENDING_STEPS", max_pending)
        rng = np.random.default_rng(11)
        est, live, next_id, reads, batch = AcceptanceEstimator(K_MAX), [], 0, [], []
        for _ in range(600):
            if not (batch and set(batch) <= set(live) and rng.random() < 0.8):  # else the same batch again
                while len(live) < rng.integers(1, 32):
                    live.append(f"r{next_id}")
                    next_id += 1
                batch = [rid for rid in live if rng.random() < 0.9] or live[:1]
            if rng.random() < 0.1:
                est.record_probe(batch, (rng.random(len(batch)) < 0.6).tolist())
            else:
                k = K_MAX if rng.random() < 0.7 else int(rng.integers(1, K_MAX + 1))
                est.record_verify(batch, rng.integers(1, k + 2, len(batch)).tolist(), k)
            if rng.random() < 0.3:
                for _ in range(int(rng.integers(1, 3))):
                    est.forget(live.pop(int(rng.integers(len(live)))))
            if rng.random() < 0.05:
                reads.append(est.batch_expected_tokens(live, K_MAX))
        return est, live, reads

    max_pending = acceptance.MAX_PENDING_STEPS
    at_once, live, reads = history(1)
    queued, live_again, reads_again = history(max_pending)
    assert live == live_again and np.allclose(reads, reads_again, rtol=0, atol=1e-12)
    assert queued.summary() == at_once.summary()
    for rid in live:
        assert queued.rates(rid) == pytest.approx(at_once.rates(rid), abs=1e-12)
    assert queued.tracked_requests == len(live)


@pytest.mark.parametrize("batch_size", [1, 3, 8, 200])
def test_batch_expected_tokens_sum_each_requests_expected_tokens(batch_size):
    """The cost policy's per-step sums (expected tokens of the batch for every k) agree with
    expected_tokens per request, for tracked requests with rates of their own, for ones not seen
    yet (the pooled rates), and for the batch of the last update or any other."""
    est = AcceptanceEstimator(K_MAX)
    rng = np.random.default_rng(3)
    tracked = [f"t{i}" for i in range(batch_size)]
    for _ in range(20):
        est.record_verify(tracked, rng.integers(1, K_MAX + 2, batch_size).tolist(), K_MAX)
    mixed = tracked[: batch_size // 2] + [f"new{i}" for i in range(batch_size - batch_size // 2)]
    for rids in (tracked, mixed, tracked[::-1]):
        expected = [sum(est.expected_tokens(k, rid) for rid in rids) for k in range(K_MAX + 1)]
        assert est.batch_expected_tokens(rids, K_MAX) == pytest.approx(expected, abs=1e-9)


# --- CostTable -------------------------------------------------------------------------------


def test_cost_table_buckets_and_extrapolation():
    cost = CostTable({1: 0.010, 8: 0.020, 64: 0.050}, {(1, 3): 0.012, (8, 3): 0.030, (64, 3): 0.100})
    assert cost.seconds(1, 0) == 0.010
    assert cost.seconds(2, 0) == 0.020, "rounds up to the next captured bucket"
    assert cost.seconds(8, 0) == 0.020
    assert cost.seconds(9, 0) == 0.050
    assert cost.seconds(5, 3) == 0.030
    assert cost.seconds(128, 0) == pytest.approx(0.100), "beyond 64: scaled by 128 / 64"
    assert cost.seconds(96, 3) == pytest.approx(0.150)
    with pytest.raises(ValueError, match="k=2"):
        cost.seconds(1, 2)
    assert cost.summary() == {
        "plain_ms": {1: 10.0, 8: 20.0, 64: 50.0},
        "spec_ms": {3: {1: 12.0, 8: 30.0, 64: 100.0}},
        "context_ns_per_token": {},
    }
    json.dumps(cost.summary())


def test_a_bucket_measured_slower_than_a_larger_one_takes_the_larger_ones_time():
    """Start-up timings are noisy (an 8B run measured k = 3 at 17.3 ms for batch 112 and 14.6 ms
    for 128); a step's cost cannot fall as its padded bucket grows."""
    cost = CostTable({1: 0.010, 112: 0.0173, 128: 0.0146, 256: 0.030}, {})
    assert [cost.seconds(bs, 0) for bs in (1, 112, 128, 256)] == [0.010, 0.0146, 0.0146, 0.030]


def test_context_adds_its_kv_read_to_every_step():
    cost = CostTable({8: 0.010}, {(8, 3): 0.020}, context_seconds={0: 1e-8, 3: 1.5e-8})
    assert cost.seconds(8, 0, context_tokens=100_000) == pytest.approx(0.010 + 1e-3)
    assert cost.seconds(8, 3, context_tokens=100_000) == pytest.approx(0.020 + 1.5e-3)
    assert cost.summary()["context_ns_per_token"] == {0: 10.0, 3: 15.0}
    with pytest.raises(ValueError, match="k=1"):
        CostTable({8: 0.010}, {(8, 3): 0.020}, context_seconds={1: 1e-8})


def test_long_contexts_make_the_cost_policy_speculate_deeper():
    """The 8B start-up table of 2026-11-30 at batch 128 (ms: plain 7.86, k = 1 8.62, k = 3 14.59,
    measured without context) and per-token KV reads for 8B shapes at ~4 TB/s (target 128 KiB,
    draft 4 KiB a token): at accept length 3 (rate 0.81) and no context the table prefers
    k = 1, but with 128 requests of 1.1k tokens of context, which every step reads alike,
    k = 3 wins, as the served sweep found (k = 3 2.3% ahead of the k = 1 the policy chose)."""
    kv_target, kv_draft, bandwidth = 131072, 4096, 4.0e12
    context = {k: (kv_target + (k + 1) * kv_draft) / bandwidth for k in (1, 3)}
    context[0] = (kv_target + kv_draft) / bandwidth
    table = dict(plain={128: 7.86e-3}, spec={(128, 1): 8.62e-3, (128, 3): 14.59e-3})
    rids = [f"r{i}" for i in range(128)]

    def choice(context_tokens: int, with_context: bool) -> int:
        cost = CostTable(table["plain"], table["spec"], context if with_context else None)
        policy = CostPolicy([0, 1, K_MAX], cost, AcceptanceEstimator(K_MAX, prior=0.81))
        return policy.choose(rids, context_tokens)

    assert choice(128 * 1100, with_context=False) == 1
    assert choice(128 * 1100, with_context=True) == 3
    assert choice(128 * 10, with_context=True) == 1  # short contexts: the table's choice stands


# --- Threshold policy ------------------------------------------------------------------------


def test_threshold_policy():
    policy = make_policy("threshold", K_MAX, threshold=4)
    assert [policy.choose([f"r{i}" for i in range(bs)]) for bs in (1, 4, 5, 64, 2)] == [K_MAX, K_MAX, 0, 0, K_MAX]
    assert make_policy("threshold", K_MAX, threshold=0).choose(["a"]) == 0
    assert make_policy("always", K_MAX).choose(["a"] * 200) == K_MAX
    assert make_policy("never", K_MAX).choose(["a"]) == 0


# --- Cost policy -----------------------------------------------------------------------------


def no_exploration() -> Exploration:
    """For tests of the decision itself (hysteresis, dwell, estimates): no exploration bursts."""
    return Exploration(max_share=0.0)


def fresh_cost_policy(prior: float, **kwargs) -> CostPolicy:
    return CostPolicy([0, 1, K_MAX], make_cost(), AcceptanceEstimator(K_MAX, prior=prior), **kwargs)


def test_cost_policy_speculates_at_small_batches_only():
    rids = lambda bs: [f"r{i}" for i in range(bs)]  # noqa: E731
    assert fresh_cost_policy(0.8).choose(rids(1)) == K_MAX
    assert fresh_cost_policy(0.8).choose(rids(256)) == 0
    for bs in (1, 8, 64, 256, 300):
        assert fresh_cost_policy(0.0).choose(rids(bs)) == 0, f"no acceptance, batch {bs}"


def test_cost_policy_maximizes_objective():
    rng = random.Random(0)
    cost = make_cost()
    for trial in range(40):
        est = AcceptanceEstimator(K_MAX, prior=rng.random())
        bs = rng.choice([1, 2, 5, 8, 20, 33, 64, 100, 256, 400])
        rids = [f"t{trial}-{i}" for i in range(bs)]
        for _ in range(rng.randrange(0, 20)):  # give requests their own, differing histories
            rate = rng.random()
            est.record_verify(rids, [sample_num_out(rng, K_MAX, rate) for _ in rids], K_MAX)
        policy = CostPolicy([0, 1, 2, 3], cost, est)
        objective = {k: independent_objective(est, cost, rids, k) for k in (0, 1, 2, 3)}
        chosen = policy.choose(rids)
        assert objective[chosen] == pytest.approx(max(objective.values())), (trial, bs, objective, chosen)
        assert policy.last_objective == pytest.approx(objective)


def run_phases(policy, phases: list[tuple[int, int]], rate: float, seed: int = 0) -> list[int]:
    """Run (steps, batch size) phases, feeding acceptance at `rate` per position; the chosen ks."""
    rng = random.Random(seed)
    ks = []
    for steps, bs in phases:
        rids = [f"r{i}" for i in range(bs)]
        for _ in range(steps):
            k = policy.choose(rids)
            ks.append(k)
            feed(policy, rids, k, rate, rng)
    return ks


@pytest.mark.parametrize("rate", [0.8, 0.45])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_no_flapping_when_load_steps_up_and_down(rate, seed):
    """Batch 1 -> 256 -> 1 needs two switches; at most 4 are allowed. At rate 0.45 (k_max still
    ~10% better than k = 1 at batch 1) a single request's noisy outcomes flip a guard-less policy
    (hysteresis 0, dwell 1) up to ~18 times on these seeds."""
    policy = make_policy("cost", K_MAX, cost=make_cost())
    ks = run_phases(policy, [(200, 1), (200, 256), (200, 1)], rate=rate, seed=seed)
    assert policy.num_decisions <= 4, policy.summary()
    # Exploration's own moves (into a burst and out of it) come on top, bounded by its credit.
    bursts = policy.exploration.bursts
    assert bursts <= 2 + 600 * 0.02 / 4 and policy.num_switches <= 4 + 2 * bursts, policy.summary()
    assert ks[199] == K_MAX and ks[399] == 0 and ks[599] == K_MAX, "it still follows the load"


def run_with_rates(
    policy, rates: tuple[float, ...], steps: int, seed: int = 0, rejected_at: int | None = None
) -> list[int]:
    """Batch-1 steps where draft i is accepted with rates[i - 1] given the earlier ones were
    (rejected_at: that 1-based position is always rejected, an unlucky stretch); the chosen ks."""
    rng = random.Random(seed)
    ks = []
    for _ in range(steps):
        k = policy.choose(["r"])
        ks.append(k)
        n = 1
        while n <= k and n != rejected_at and rng.random() < rates[n - 1]:
            n += 1
        if k:
            policy.observe_verify(["r"], [n], k)
        else:
            policy.observe_probe(["r"], [n > 1])
    return ks


def test_an_unobserved_position_drifts_back_up_toward_its_long_run_rate():
    est = AcceptanceEstimator(K_MAX, recovery=0.01)
    for _ in range(400):  # every draft accepted: a_2's long-run rate climbs well above the prior
        est.record_verify(["a"], [K_MAX + 1], K_MAX)
    for _ in range(100):  # then draft 2 always rejected: a_2 falls far below it
        est.record_verify(["a"], [2], K_MAX)
    low = est.rates()[1]
    long_run = est.summary()["acceptance_rates_long_run"][1]
    assert low < 0.05 and long_run > est.prior + 0.05
    for _ in range(300):  # k = 1 from here: position 2 is never observed
        est.record_verify(["a"], [2], 1)
    assert est.rates()[0] > 0.99, "the observed position follows what it sees"
    assert low + 0.5 * (long_run - low) < est.rates()[1] <= long_run
    assert low + 0.5 * (long_run - low) < est.rates("a")[1] <= long_run, "the request's own row too"
    long_run_now = est.summary()["acceptance_rates_long_run"][1]
    assert est.rates("new")[1] == pytest.approx(max(est.rates()[1], long_run_now), abs=1e-4), (
        "a new request starts from the recovered rate, or the long-run one where that is higher"
    )
    high = est.rates()[2]  # position 3, last observed while every draft was accepted
    assert high > est.summary()["acceptance_rates_long_run"][2]
    for _ in range(300):  # an estimate above its target stays where it is
        est.record_probe(["b"], [True])
    assert est.rates()[2] == high > 0.99


@pytest.mark.parametrize("recovery", [0.0, None], ids=["frozen", "default"])
def test_cost_policy_comes_back_after_an_unlucky_stretch_at_a_deeper_position(recovery):
    """What the demo pair did on the GPU: a stretch where draft 2 kept failing pulled a_2 down,
    the policy moved to k = 1, and position 2 was never observed again. With estimates frozen
    where they were last seen it stays at k = 1 for good; by default it is back at k_max within a
    few hundred steps (here draft 2 is accepted 80% of the time again)."""
    policy = make_policy("cost", K_MAX, cost=make_cost(), exploration=no_exploration())
    if recovery is not None:
        policy.estimator.recovery = recovery
    good = (0.8, 0.8, 0.8)
    assert run_with_rates(policy, good, 200)[-1] == K_MAX
    ks = run_with_rates(policy, good, 150, seed=1, rejected_at=2)
    assert ks[-1] < K_MAX, "the unlucky stretch moved it off k_max"
    ks = run_with_rates(policy, good, 1500, seed=2)
    if recovery == 0.0:
        assert K_MAX not in ks
    else:
        back = ks.index(K_MAX)
        assert back < 1000 and ks[-100:] == [K_MAX] * 100, (back, policy.summary())


@pytest.mark.parametrize("rates", [(0.8, 0.1, 0.8), (0.5, 0.2, 0.2), (0.6, 0.3, 0.3)])
def test_recovery_costs_little_where_a_deeper_position_is_really_poor(rates):
    """Where draft 2 really is poor, recovery still lifts a_2 now and then until the policy tries
    k_max again: near the point where k = 1 and k_max are worth the same that costs < 1.5% of the
    tokens per second of the best fixed k, with a switch every 50 steps at most."""
    cost = make_cost()
    policy = make_policy("cost", K_MAX, cost=cost, exploration=no_exploration())

    def value(k):  # true tokens per verify of k drafts, per second
        return (1 + sum(math.prod(rates[:i]) for i in range(1, k + 1))) / cost.seconds(1, k)

    steps = 3000
    ks = run_with_rates(policy, rates, steps)[300:]
    seconds = sum(cost.seconds(1, k) for k in ks)
    tokens = sum(value(k) * cost.seconds(1, k) for k in ks)
    assert tokens / seconds >= 0.985 * max(value(k) for k in (0, 1, K_MAX))
    # The default margin is 2%, so that a held choice is never more than that below the best; where
    # k = 1 and k_max are worth nearly the same (0.3% apart for the first rates) it is crossed
    # about every 60 steps.
    assert policy.num_switches <= steps // 50, policy.summary()


def test_an_unchanged_bucket_is_re_evaluated_every_few_steps_and_a_new_one_at_once(monkeypatch):
    """Past the dwell the objective (tens of microseconds of host time a step) is evaluated every
    REEVALUATE_EVERY steps while the batch stays in its graph bucket, even if it changes size
    within it; a batch in a new bucket is evaluated at once."""
    policy = make_policy("cost", K_MAX, cost=make_cost(), exploration=no_exploration())
    evaluated = []
    real = policy._priced_objective
    monkeypatch.setattr(
        policy, "_priced_objective", lambda rids, *a, **kw: evaluated.append(len(rids)) or real(rids, *a, **kw)
    )
    rids = ["r"]
    for _ in range(policy.min_dwell + 4 * cost_policy.REEVALUATE_EVERY):
        policy.choose(rids)
    assert len(evaluated) == 1 + 4, evaluated  # the first step, then once per REEVALUATE_EVERY
    policy.choose([f"r{i}" for i in range(256)])
    assert evaluated[-1] == 256, "a new bucket is evaluated on its first step"
    # 256 -> 250 -> 256 stays in the 256 bucket: evaluated on the REEVALUATE_EVERY rhythm only.
    count = len(evaluated)
    for step in range(policy.min_dwell + 2 * cost_policy.REEVALUATE_EVERY):
        policy.choose([f"r{i}" for i in range(256 if step % 2 else 250)])
    assert len(evaluated) - count <= 2 + 1, evaluated[count:]


def count_evaluations(policy, monkeypatch) -> list[int]:
    """The batch sizes the policy evaluated its objective for, in order."""
    evaluated = []
    real = policy._priced_objective
    monkeypatch.setattr(
        policy, "_priced_objective", lambda rids, *a, **kw: evaluated.append(len(rids)) or real(rids, *a, **kw)
    )
    return evaluated


def settled_policy(rate: float, bs: int = 8) -> tuple[CostPolicy, list[str]]:
    """A cost policy past its dwell at batch `bs`, every request at acceptance `rate`."""
    policy = make_policy("cost", K_MAX, cost=make_cost(), exploration=no_exploration())
    rids, rng = [f"r{i}" for i in range(bs)], random.Random(3)
    for _ in range(policy.min_dwell + 2 * cost_policy.REEVALUATE_FAR_EVERY):
        feed(policy, rids, policy.choose(rids), rate, rng)
    return policy, rids


def test_a_clear_choice_is_re_evaluated_less_often_and_a_close_one_on_the_usual_rhythm(monkeypatch):
    """Where the best candidate leads every other by FAR_APART or more, the bucket is re-evaluated
    every REEVALUATE_FAR_EVERY steps (each evaluation costs the host 10-30 us); where two are close,
    every REEVALUATE_EVERY. Either way a change of acceptance is followed within the longer rhythm."""
    clear, rids = settled_policy(0.95)
    assert clear.current_k == K_MAX and clear._verdict.far_apart, clear.last_objective
    evaluated = count_evaluations(clear, monkeypatch)
    for _ in range(4 * cost_policy.REEVALUATE_FAR_EVERY):
        clear.choose(rids)
    assert len(evaluated) == 4, evaluated
    # The draft turns useless: plain decoding wins, and the policy gets there within a long rhythm
    # of the estimates crossing over (each request's estimate moves 5% of the way a verify).
    rng, ks = random.Random(4), []
    for _ in range(400):
        ks.append(clear.choose(rids))
        feed(clear, rids, ks[-1], 0.0, rng)
    assert ks[-100:] == [0] * 100, ks

    # At batch 16 an acceptance of 0.85 makes k_max and plain decoding worth about the same.
    close, rids = settled_policy(0.85, bs=16)
    evaluated = count_evaluations(close, monkeypatch)
    close._verdict = None  # the next step evaluates
    close.choose(rids)
    assert not close._verdict.far_apart, close.last_objective
    for _ in range(4 * REEVALUATE_EVERY - 1):
        close.choose(rids)
    assert len(evaluated) == 4, evaluated


def test_an_admission_into_a_clearly_speculating_batch_takes_the_last_verdict(monkeypatch):
    """A request joining a batch of SETTLED_BATCH or more in the bucket the policy evaluated lately,
    where speculating won by FAR_APART, speculates without a fresh evaluation; a small batch, another
    bucket, a verdict for plain decoding, or one older than REEVALUATE_FAR_EVERY decode steps is
    evaluated afresh."""
    policy, rids = settled_policy(0.95)
    policy.choose(rids)  # whatever the rhythm: the last verdict is at most a step old below
    evaluated = count_evaluations(policy, monkeypatch)
    policy._verdict = None  # the next step evaluates
    policy.choose(rids)
    assert evaluated == [8] and policy._verdict.best == K_MAX
    assert policy.would_speculate(rids[1:] + ["new"])
    assert evaluated == [8], "the verdict of this bucket answers"
    assert policy.would_speculate(rids[:4] + ["new"]) and evaluated[-1] == 5, "a small batch is evaluated"
    policy.would_speculate([f"b{i}" for i in range(256)])
    assert evaluated[-1] == 256, "another bucket is evaluated"
    for _ in range(cost_policy.REEVALUATE_FAR_EVERY):
        policy.exploration.note_step(None, K_MAX, 0.01)
    count = len(evaluated)
    assert policy.would_speculate(rids[1:] + ["new"]) and len(evaluated) == count + 1, "an old verdict"

    plain, rids = settled_policy(0.0)
    assert plain.current_k == 0
    evaluated = count_evaluations(plain, monkeypatch)
    assert not plain.would_speculate(rids[1:] + ["new"]) and evaluated == [8], "only speculating is taken on trust"


def test_an_admission_where_every_candidate_speculates_is_not_evaluated(monkeypatch):
    """A policy whose candidates at the batch's size all speculate (--speculative-candidate-steps 3,
    or a bucket of the adaptive config without 0) lets every request have the draft, without
    pricing anything; where plain decoding is a candidate it evaluates as before."""
    only_k3 = make_policy("cost", K_MAX, cost=make_cost(), candidates=[K_MAX], exploration=no_exploration())
    evaluated = count_evaluations(only_k3, monkeypatch)
    hard = [f"r{i}" for i in range(256)]
    only_k3.estimator.record_verify(hard, [1] * 256, K_MAX)
    assert only_k3.would_speculate(hard) and evaluated == []
    by_bs = make_policy(
        "cost",
        K_MAX,
        cost=make_cost(),
        candidates=[0, K_MAX],
        candidates_by_bs={1: [1, K_MAX], 64: [0, K_MAX]},
        exploration=no_exploration(),
    )
    evaluated = count_evaluations(by_bs, monkeypatch)
    assert by_bs.would_speculate(hard[:8]) and evaluated == []
    assert not by_bs.would_speculate(hard) and evaluated == [256]


def test_a_switch_is_logged_with_every_candidate_priced_as_the_policy_priced_it(caplog):
    """The switch line gives each candidate's expected tok/s, its price per step with the batch's
    context read included (what the decision used, not the table's empty-row time) and whether
    that price was learned here, borrowed (from a nearby bucket, or this one's level with the
    table's relative cost) or the table's."""
    cost = CostTable(
        {1: 1.0e-3, 64: 2.0e-3},
        {(1, 1): 1.26e-3, (64, 1): 3.0e-3, (1, K_MAX): 1.8e-3, (64, K_MAX): 5.0e-3},
        context_seconds={0: 1e-8, 1: 1e-8, K_MAX: 1e-8},
    )
    policy = CostPolicy([0, 1, K_MAX], cost, AcceptanceEstimator(K_MAX, prior=0.5))
    rids = [f"r{i}" for i in range(40)]
    context = 40 * 300
    for _ in range(LEARN_FIRST_SAMPLES):  # k = 1 learned at bucket 1 only; k_max learned here, far slower
        policy.observe_step_seconds(1, 1, 0, 1.3e-3)
        policy.observe_step_seconds(40, K_MAX, context, 4 * cost.seconds(40, K_MAX, context))
    policy.current_k, policy.steps_in_current = K_MAX, policy.min_dwell
    with caplog.at_level(logging.INFO, logger="sglang.srt.speculative.cost_policy"):
        k = policy.choose(rids, context_tokens=context)
    assert k != K_MAX
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("speculation: k 3 ->")]
    assert f"at batch 40 ({context} context tokens)" in line
    plain_ms = 1e3 * policy.seconds(40, 0, context)
    assert plain_ms == pytest.approx(4 * (2.0 + 0.12))  # the context read is in the price, at this bucket's level
    assert f"0: {policy.last_objective[0]:.0f} tok/s, {plain_ms:.3f} ms, borrowed" in line, line
    assert policy.cost.source(40, 0, 40 * 5000) == "table", "nothing learned within a context class of it"
    assert f"1: {policy.last_objective[1]:.0f} tok/s, {1e3 * policy.seconds(40, 1, context):.3f} ms, borrowed" in line
    assert (
        f"3: {policy.last_objective[3]:.0f} tok/s, {1e3 * policy.seconds(40, K_MAX, context):.3f} ms, learned" in line
    )


def test_the_choice_follows_the_learned_cost_not_the_table(caplog):
    """The table says k = 1 wins at batch 1 by 14%; the server's own steps say k = 1 costs three
    times the table's k_max step, and k_max (explored beside it) what the table says. Once those
    samples are in, the policy prices k = 1 by them and moves away from it; the table stays beside
    the learned costs in the summary."""
    cost = CostTable({1: 1.0e-3}, {(1, 1): 1.26e-3, (1, K_MAX): 1.8e-3})
    rids = ["r"]
    # a = 0.5: k = 1 yields 1.5 tokens a step, k_max 1.875, at 1.26 and 1.8 ms: k = 1 wins by 14%.
    policy = CostPolicy([0, 1, K_MAX], cost, AcceptanceEstimator(K_MAX, prior=0.5))
    assert policy.choose(rids) == 1
    slow = 3 * cost.seconds(1, K_MAX)
    for _ in range(LEARN_FIRST_SAMPLES):
        policy.observe_step_seconds(1, 1, 0, slow)
    assert policy.seconds(1, 1) == pytest.approx(slow)
    assert policy.choose(rids) == 1, "the chosen k's steps alone move every price alike"
    assert policy.seconds(1, 0) == pytest.approx(cost.seconds(1, 0) * slow / cost.seconds(1, 1))
    for _ in range(LEARN_FIRST_SAMPLES):  # explored beside k = 1
        policy.observe_step_seconds(1, K_MAX, 0, cost.seconds(1, K_MAX))
    assert policy.seconds(1, K_MAX) == pytest.approx(cost.seconds(1, K_MAX))
    with caplog.at_level(logging.INFO, logger="sglang.srt.speculative.cost_policy"):
        for _ in range(policy.min_dwell + REEVALUATE_EVERY):
            k = policy.choose(rids)
    assert k == K_MAX
    switch = [r.getMessage() for r in caplog.records if "speculation: k 1 -> 3" in r.getMessage()]
    assert len(switch) == 1 and "by the learned costs" in switch[0] and "ms per step" in switch[0], switch
    assert policy.summary()["last_switch"] in switch[0] and policy.num_decisions == 1
    summary = policy.summary()["cost"]
    assert summary["prior"] == cost.summary()
    assert summary["learned_ms"][1] == {1: pytest.approx(1e3 * slow, rel=1e-3)}
    assert summary["samples"] == {1: {1: LEARN_FIRST_SAMPLES}, K_MAX: {1: LEARN_FIRST_SAMPLES}}
    for nonsense in [(1, 7, 0, 1.0), (0, 1, 0, 1.0), (1, 1, 0, float("nan")), (1, 1, 0, float("inf")), (1, 1, 0, -1.0)]:
        policy.observe_step_seconds(*nonsense)  # a k the table lacks, no batch, not a time: ignored
    assert policy.summary()["cost"]["samples"] == {1: {1: LEARN_FIRST_SAMPLES}, K_MAX: {1: LEARN_FIRST_SAMPLES}}


def alternating_cost() -> CostTable:
    """k_max = 1, acceptance 0.5 (1.5 tokens per verify): at batch 1 spec is better by 0.5%, at
    batch 2 plain is better by 0.5%."""
    return CostTable({1: 1.0, 2: 1.0}, {(1, 1): 1.5 / 1.005, (2, 1): 1.5 * 1.005})


def test_hysteresis_ignores_small_alternating_gains():
    batches = [["a"], ["a", "b"]] * 50
    held = CostPolicy(
        [0, 1], alternating_cost(), AcceptanceEstimator(1), hysteresis=0.05, min_dwell=1, exploration=no_exploration()
    )
    assert [held.choose(b) for b in batches] == [1] * 100
    assert held.num_switches == 0
    # Control: without hysteresis the same load flips every step.
    eager = CostPolicy(
        [0, 1], alternating_cost(), AcceptanceEstimator(1), hysteresis=0.0, min_dwell=1, exploration=no_exploration()
    )
    assert [eager.choose(b) for b in batches] == [1, 0] * 50


def test_hysteresis_by_direction_and_bucket():
    """An "up" margin blocks only moves to a larger k, a "down" margin only moves to a smaller one
    (here for the bucket starting at batch 1, so for batches 1 and 2)."""
    batches = [["a", "b"], ["a"]] * 20  # batch 2 favours k = 0, batch 1 favours k = 1, by 0.5%
    up = CostPolicy(
        [0, 1],
        alternating_cost(),
        AcceptanceEstimator(1),
        hysteresis=0.0,
        min_dwell=1,
        exploration=no_exploration(),
        hysteresis_by_bs={1: {"up": 0.05}},
    )
    assert [up.choose(b) for b in batches] == [0] * 40
    down = CostPolicy(
        [0, 1],
        alternating_cost(),
        AcceptanceEstimator(1),
        hysteresis=0.0,
        min_dwell=1,
        exploration=no_exploration(),
        hysteresis_by_bs={1: {"down": 0.05}},
    )
    assert [down.choose(b) for b in batches] == [0] + [1] * 39


def test_min_dwell_holds_a_new_choice():
    policy = fresh_cost_policy(0.8, hysteresis=0.0, min_dwell=5)
    small, big = ["a"], [f"r{i}" for i in range(256)]
    ks = [policy.choose(small)] + [policy.choose(big) for _ in range(7)] + [policy.choose(small) for _ in range(7)]
    # k_max is held for 5 steps although batch 256 favours 0 from step 2; then 0 is held 5 steps.
    assert ks == [K_MAX] * 5 + [0] * 5 + [K_MAX] * 5
    assert policy.num_switches == 2


def test_candidates_by_batch_size():
    policy = CostPolicy(
        [0, 1, K_MAX],
        make_cost(),
        AcceptanceEstimator(K_MAX, prior=0.8),
        min_dwell=100,
        candidates_by_bs={4: [0, 1], 64: [0]},
    )
    assert policy.candidates_for(1) == [0, 1, K_MAX], "below the smallest key: the default candidates"
    assert policy.candidates_for(4) == [0, 1] and policy.candidates_for(63) == [0, 1]
    assert policy.candidates_for(1000) == [0]
    assert policy.choose(["a"]) == K_MAX
    four = ["a", "b", "c", "d"]
    best = max([0, 1], key=lambda k: independent_objective(policy.estimator, policy.cost, four, k))
    assert policy.choose(four) == best, "k_max is not a candidate at 4: moves at once despite dwell"
    assert policy.choose(["a"]) == best, "back at batch 1 the new k is a candidate, so dwell holds it"
    assert policy.choose([f"r{i}" for i in range(64)]) == 0


# --- parse_adaptive_config -------------------------------------------------------------------


def test_parse_adaptive_config_good(tmp_path):
    path = tmp_path / "adaptive.json"
    path.write_text(
        json.dumps(
            {
                "1": [3, 1, 1],
                "8": {"candidate_steps": [0, 1], "up_hysteresis": 0.1},
                "64": [0],
                "ema_alpha": 0.1,
                "warmup_batches": 5,
            }
        )
    )
    config = parse_adaptive_config(str(path))
    assert config == {
        "candidates_by_bs": {1: [1, 3], 8: [0, 1], 64: [0]},
        "hysteresis_by_bs": {8: {"up": 0.1}},
        "ema_alpha": 0.1,
        "warmup_batches": 5,
        "update_interval": None,
    }
    default = tmp_path / "default.json"
    default.write_text(json.dumps(DEFAULT_ADAPTIVE_CONFIG))
    parsed = parse_adaptive_config(str(default))["candidates_by_bs"]
    assert parsed == {int(bs): steps for bs, steps in DEFAULT_ADAPTIVE_CONFIG.items()}


def test_adaptive_config_drives_cost_policy(tmp_path):
    path = tmp_path / "adaptive.json"
    path.write_text(
        json.dumps({"1": [1, 3], "32": {"candidate_steps": [0, 1], "down_hysteresis": 0.2}, "ema_alpha": 0.2})
    )
    config = parse_adaptive_config(str(path))
    policy = make_policy(
        "cost",
        K_MAX,
        cost=make_cost(),
        candidates_by_bs=config["candidates_by_bs"],
        hysteresis_by_bs=config["hysteresis_by_bs"],
        ema_alpha=config["ema_alpha"],
    )
    assert policy.estimator.alpha == 0.2
    assert policy.candidates_for(1) == [1, 3] and policy.candidates_for(100) == [0, 1]
    assert policy.hysteresis_by_bs == {32: {"down": 0.2}}


@pytest.mark.parametrize(
    "text, problem",
    [
        ("{not json", "invalid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"1": [0, -1]}', "candidate step -1 is not a non-negative integer"),
        ('{"1": [0, 1.5]}', "candidate step 1.5"),
        ('{"1": [true]}', "candidate step True"),
        ('{"1": []}', "candidate step list is empty"),
        ('{"1": 3}', "must be a list"),
        ('{"0": [0]}', "key '0' is not a positive integer"),
        ('{"-4": [0]}', "key '-4' is not a positive integer"),
        ('{"2.5": [0]}', "key '2.5' is not a positive integer"),
        ('{"1": [0], "speed": 2}', "unknown key 'speed'"),
        ('{"1": [0], "ema_alpha": 2}', "ema_alpha must be a number in (0, 1]"),
        ('{"1": [0], "update_interval": 0}', "update_interval must be an integer >= 1"),
        ('{"1": {"steps": [1]}}', "unknown key(s) ['steps']"),
        ('{"1": {"candidate_steps": [1], "down_hysteresis": -1}}', "down_hysteresis must be a number >= 0"),
        ('{"ema_alpha": 0.1}', "no batch-size keys"),
    ],
)
def test_parse_adaptive_config_errors(tmp_path, text, problem):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ValueError) as info:
        parse_adaptive_config(str(path))
    assert problem in str(info.value) and str(path) in str(info.value)


def test_parse_adaptive_config_missing_file(tmp_path):
    missing = str(tmp_path / "nope.json")
    with pytest.raises(ValueError, match="cannot read") as info:
        parse_adaptive_config(missing)
    assert missing in str(info.value)


# --- make_policy -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, names",
    [
        (dict(name="greedy"), ["--speculative-policy", "'greedy'", "cost"]),
        (dict(name="threshold"), ["--speculative-threshold", "None"]),
        (dict(name="threshold", threshold=-1), ["--speculative-threshold", "-1"]),
        (dict(name="cost"), ["--speculative-policy cost", "cost table"]),
        (dict(name="cost", cost=make_cost(), candidates=[0, 5]), ["--speculative-candidate-steps", "5", f"0..{K_MAX}"]),
        (dict(name="cost", cost=make_cost(), candidates=[]), ["--speculative-candidate-steps", "empty"]),
        (
            dict(name="cost", cost=make_cost(), candidates_by_bs={8: [0, 4]}),
            ["--speculative-adaptive-config", "batch size 8", "4"],
        ),
        (dict(name="cost", cost=make_cost(), ema_alpha=0.0), ["ema_alpha", "0.0"]),
        (dict(name="cost", cost=make_cost(k_max=1)), ["cost table has no step time for k in [3]"]),
        (dict(name="always", k_max=0), ["--speculative-num-steps", "0"]),
    ],
)
def test_make_policy_errors(kwargs, names):
    kwargs = {"k_max": K_MAX, **kwargs}
    with pytest.raises(ValueError) as info:
        make_policy(kwargs.pop("name"), kwargs.pop("k_max"), **kwargs)
    for name in names:
        assert name in str(info.value), (name, str(info.value))


def test_make_policy_defaults():
    made = {make_policy(n, K_MAX, threshold=1 if n == "threshold" else None, cost=make_cost()) for n in policy_names()}
    assert {policy.name for policy in made} == set(policy_names()) == {"always", "never", "threshold", "cost"}
    assert make_policy("cost", K_MAX, cost=make_cost()).candidates == [0, 1, K_MAX]
    one = CostTable({1: 1.0}, {(1, 1): 1.1})
    assert make_policy("cost", 1, cost=one).candidates == [0, 1]
    assert make_policy("cost", K_MAX, cost=make_cost(), ema_alpha=0.3).estimator.alpha == 0.3


def test_policy_from_args_measures_step_costs_only_where_the_policy_needs_them():
    from types import SimpleNamespace

    def args(policy: str, **flags) -> SimpleNamespace:
        fields = dict(speculative_threshold=None, speculative_candidate_steps=None, speculative_adaptive_config=None)
        return SimpleNamespace(speculative_policy=policy, speculative_num_steps=K_MAX, **{**fields, **flags})

    measured = []

    def measure() -> dict:
        measured.append(1)
        cost = make_cost()
        spec = {(bs, k): cost.seconds(bs, k) for bs in BUCKETS for k in range(1, K_MAX + 1)}
        return {"plain": {bs: cost.seconds(bs, 0) for bs in BUCKETS}, "spec": spec}

    threshold = policy_from_args(args("threshold", speculative_threshold=2), measure)
    assert threshold.threshold == 2 and measured == []
    cost = policy_from_args(args("cost", speculative_candidate_steps=[0, 2]), measure)
    assert cost.candidates == [0, 2] and measured == [1]


# --- summary ---------------------------------------------------------------------------------


def test_summary_counts_steps_and_switches():
    policy = ThresholdPolicy(K_MAX, threshold=4)
    for bs in (1, 1, 5, 5, 5, 1, 9):
        policy.choose([f"r{i}" for i in range(bs)])
    summary = policy.summary()
    assert summary["name"] == "threshold" and summary["k"] == 0
    assert summary["steps_per_k"] == {0: 4, K_MAX: 3}
    assert summary["switches"] == 3

    cost_policy = make_policy("cost", K_MAX, cost=make_cost(), exploration=no_exploration())
    run_phases(cost_policy, [(50, 1)], rate=0.9)
    summary = cost_policy.summary()
    assert summary["steps_per_k"] == {K_MAX: 50} and summary["switches"] == 0
    assert summary["acceptance_rates"][0] > 0.8
    assert summary["cost"] == {
        "prior": make_cost().summary(),
        "learned_ms": {},
        "window_mean_ms": {},
        "samples": {},
        "learned_ms_by_context": {},
    }
    assert summary["exploration"] == {"steps": 0, "bursts": 0, "share": 0.0, "cost_share": 0.0}
    json.dumps(summary)


# --- Admission: would the batch a new request joins speculate? ------------------------------


def test_would_speculate_follows_each_policy_without_side_effects():
    rids = lambda bs: [f"r{i}" for i in range(bs)]  # noqa: E731
    assert make_policy("always", K_MAX).would_speculate(rids(500))
    assert not make_policy("never", K_MAX).would_speculate(rids(1))
    threshold = make_policy("threshold", K_MAX, threshold=4)
    assert [threshold.would_speculate(rids(bs)) for bs in (1, 4, 5)] == [True, True, False]
    assert not threshold.would_speculate(rids(3), num_plain_only=2)
    # Nothing that may speculate: no.
    assert not make_policy("always", K_MAX).would_speculate([], num_plain_only=3)
    cost = fresh_cost_policy(0.8)
    assert cost.would_speculate(rids(1)) and not cost.would_speculate(rids(256))
    assert not fresh_cost_policy(0.0).would_speculate(rids(1))
    # Judged afresh: the policy's dwell on plain steps does not hold it back, and asking records nothing.
    for _ in range(3):
        assert cost.choose(rids(256)) == 0
    before = cost.summary()
    assert cost.would_speculate(rids(1))
    assert cost.summary() == before and cost.steps_in_current == 3


def test_would_speculate_reads_the_acceptance_the_policy_has_seen():
    policy = fresh_cost_policy(0.5)
    rng = random.Random(1)
    batch = [f"r{i}" for i in range(8)]
    for _ in range(300):  # the draft turns out to be bad: speculation stops paying at batch 8
        feed(policy, batch, K_MAX, 0.02, rng)
    assert not policy.would_speculate(batch + ["new"])
    for _ in range(300):  # and good again
        feed(policy, batch, K_MAX, 0.95, rng)
    assert policy.would_speculate(batch + ["new"])


def test_would_speculate_at_prior_ignores_what_the_estimate_has_seen():
    policy = fresh_cost_policy(0.5)
    rng = random.Random(2)
    for _ in range(300):
        feed(policy, ["a"], K_MAX, 0.0, rng)  # the draft never hit
    assert not policy.would_speculate(["new"])
    assert policy.would_speculate_at_prior(1)  # at the prior (0.5) batch 1 would pay
    assert not policy.would_speculate_at_prior(256)  # batch 256 would not, whatever the draft
    assert not policy.would_speculate_at_prior(0)
    assert not make_policy("never", K_MAX).would_speculate_at_prior(1)
    threshold = make_policy("threshold", K_MAX, threshold=4)
    assert threshold.would_speculate_at_prior(4) and not threshold.would_speculate_at_prior(5)


def test_one_hard_request_does_not_keep_the_next_ones_from_the_draft():
    """At batch 1 the pooled EMA follows the one running request step by step: a single prompt the
    draft cannot predict pulls it far down within tens of steps. A new request is judged from at
    least the long-run rates (max of pooled and long-run per position), so the requests after a
    hard one are still admitted with the draft; on the H200 (session 12) they were judged at the
    pooled rates, and 16 requests in a row decoded plainly at 0.55x until exploration, in every round
    of the demo pair at concurrency 1. A workload that stays hard pulls the long-run rates down too."""
    # The demo pair's start-up table at batch 1 (ms): plain 0.27, k = 1 0.36, k = 3 0.44.
    cost = CostTable({1: 0.27e-3}, {(1, 1): 0.36e-3, (1, K_MAX): 0.44e-3})
    policy = CostPolicy([0, 1, K_MAX], cost, AcceptanceEstimator(K_MAX))
    rng = random.Random(0)

    def serve(rid: str, rate: float, steps: int = 40) -> None:
        for _ in range(steps):
            n = 1
            while n <= K_MAX and rng.random() < rate:
                n += 1
            policy.observe_verify([rid], [n], K_MAX)
        policy.forget(rid)

    for i in range(40):
        serve(f"easy{i}", 0.8)
    assert policy.would_speculate(["next"])
    serve("hard", 0.1)
    assert policy.estimator.rates()[0] < 0.3, "the pooled a_1 follows the hard request"
    assert policy.would_speculate(["after-hard"]), policy.estimator.summary()
    for i in range(60):  # the workload turns hard for good: new requests follow it
        serve(f"hard{i}", 0.1)
    assert not policy.would_speculate(["still-hard"]), policy.estimator.summary()
