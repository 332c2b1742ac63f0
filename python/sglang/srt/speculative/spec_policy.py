"""The per-step mode switch of speculative decoding: before each decode step the scheduler asks a
policy how many draft tokens k to verify (k = 0 is PLAIN, a target-only decode step).

Speculation pays off when the expected tokens per verify outweigh the extra cost of drafting and
verifying k + 1 positions. At small batches the target step is memory bound and verifying extra
positions is nearly free; at large batches it is compute bound and the same step costs several
times a plain one. The cost policy compares both with measured step times and the acceptance
observed so far; the simpler policies (always, never, a batch-size threshold) are there for
baselines and for users who know their load.

Everything here is pure Python: it runs on the scheduler's CPU once per decode step, so it must
not touch the device or sync with it."""

from __future__ import annotations

import logging
import math
from abc import ABC, abstractmethod
from bisect import bisect_right
from typing import Optional

from sglang.srt.speculative.acceptance import AcceptanceEstimator
from sglang.srt.configs.speculative_adaptive import _is_int
from sglang.srt.speculative.cost_model import CONTEXT_CLASS_TOKENS, LEARN_WINDOW, CostTable, LearnedCost, context_class
from sglang.srt.speculative.exploration import Exploration

logger = logging.getLogger(__name__)

POLICY_NAMES = ("always", "never", "threshold", "cost")


class SpecPolicy(ABC):
    """Base policy. choose() is the template: subclasses decide in _choose(); the base counts
    steps per k and switches (a step whose k differs from the previous step's; the first step
    is not a switch), which is what the logs and /metrics report."""

    name = "base"

    def __init__(self, k_max: int, estimator: Optional[AcceptanceEstimator] = None):
        self.k_max = k_max
        self.estimator = estimator
        self.current_k: Optional[int] = None
        self.num_switches = 0
        self.steps_per_k: dict[int, int] = {}
        # Steps run in a row with current_k, the step that chose it included (for dwell).
        self.steps_in_current = 0
        # Expected tokens per second of each candidate k at the last evaluation (policies that price
        # steps fill it; shown in the decode log line).
        self.last_objective: dict[int, float] = {}

    def choose(self, rids: list[str], context_tokens: int = 0, num_plain_only: int = 0, explore: bool = False) -> int:
        """k for the next decode step of this batch; 0 = PLAIN. rids: its decode requests that may
        speculate; num_plain_only: those that opted out (one token a step whatever k is);
        context_tokens: the summed context length of all of them. A batch with no request that
        may speculate decodes plainly. `explore`: where the policy would decode plainly, take its
        cheapest speculative step instead (to measure acceptance; the scheduler asks for it)."""
        k = 0 if num_plain_only and not rids else self._choose(rids, context_tokens, num_plain_only)
        if explore and k == 0 and rids:
            k = self._explore_k(len(rids) + num_plain_only)
        self._count_step(k)
        return k

    def _count_step(self, k: int) -> None:
        """Counts a step of k: per k, in a row, and a switch where k changed."""
        if k == self.current_k:
            self.steps_in_current += 1
        else:
            if self.current_k is not None:
                self.num_switches += 1
            self.current_k = k
            self.steps_in_current = 1
        self.steps_per_k[k] = self.steps_per_k.get(k, 0) + 1

    @abstractmethod
    def _choose(self, rids: list[str], context_tokens: int, num_plain_only: int) -> int:
        """The policy's k for this batch; current_k and steps_in_current describe the steps so far."""

    def _explore_k(self, batch_size: int) -> int:
        return 1

    def would_speculate(self, rids: list[str], context_tokens: int = 0, num_plain_only: int = 0) -> bool:
        """Whether a decode batch like this would speculate, judged afresh: no hysteresis, no
        dwell, nothing recorded. The scheduler asks it when admitting a request, with the batch
        the request joins: the draft reads the prompts only of requests admitted while
        speculation pays (the others decode plainly, so a busy server pays nothing for it)."""
        return bool(rids) and self._would_speculate(rids, context_tokens, num_plain_only)

    @abstractmethod
    def _would_speculate(self, rids: list[str], context_tokens: int, num_plain_only: int) -> bool:
        """would_speculate for a batch with at least one request that may speculate."""

    def would_speculate_at_prior(self, batch_size: int, context_tokens: int = 0) -> bool:
        """would_speculate for `batch_size` requests that may all speculate, with acceptance at
        the estimator's prior instead of what it has seen: whether speculation could pay here at
        all. The scheduler asks it before admitting a request with the draft to refresh an
        estimate that nothing has updated for a while (see Scheduler.draft_reads_prompt)."""
        return batch_size > 0 and self._at_prior(batch_size, context_tokens)

    def _at_prior(self, batch_size: int, context_tokens: int) -> bool:
        # Policies that do not read the estimate decide as always.
        return self._would_speculate([""] * batch_size, context_tokens, 0)

    def observe_verify(self, rids: list[str], num_out: list[int], k_step: int) -> None:
        if self.estimator is not None:
            self.estimator.record_verify(rids, num_out, k_step)

    def observe_probe(self, rids: list[str], hits: list[bool]) -> None:
        if self.estimator is not None:
            self.estimator.record_probe(rids, hits)

    def observe_step_seconds(self, batch_size: int, k: int, context_tokens: int, seconds: float) -> None:
        """What one steady decode step of k drafts cost the server: the wall time from its launch
        to the next decode launch, at this batch size and summed context (the scheduler's
        sample rule: Scheduler._observe_decode_launch). Only the cost policy learns from it."""

    def forget(self, rid: str) -> None:
        if self.estimator is not None:
            self.estimator.forget(rid)

    def summary(self) -> dict:
        out: dict = {
            "name": self.name,
            "k": self.current_k,
            "switches": self.num_switches,
            "steps_per_k": dict(sorted(self.steps_per_k.items())),
        }
        if self.estimator is not None:
            out.update(self.estimator.summary())
        return out


class AlwaysPolicy(SpecPolicy):
    """Speculate with k_max on every step (the classic static EAGLE setup)."""

    name = "always"

    def _choose(self, rids: list[str], context_tokens: int, num_plain_only: int) -> int:
        return self.k_max

    def _would_speculate(self, rids: list[str], context_tokens: int, num_plain_only: int) -> bool:
        return True


class NeverPolicy(SpecPolicy):
    """Never speculate: the baseline, with the draft loaded (the scheduler gives it no request,
    so it never runs)."""

    name = "never"

    def _choose(self, rids: list[str], context_tokens: int, num_plain_only: int) -> int:
        return 0

    def _would_speculate(self, rids: list[str], context_tokens: int, num_plain_only: int) -> bool:
        return False


class ThresholdPolicy(SpecPolicy):
    """Speculate with k_max while the decode batch has at most `threshold` requests: the simple
    rule for users who have measured where speculation stops paying on their hardware."""

    name = "threshold"

    def __init__(self, k_max: int, threshold: int, estimator: Optional[AcceptanceEstimator] = None):
        super().__init__(k_max, estimator)
        if threshold < 0:
            raise ValueError(f"threshold must be >= 0, got {threshold}")
        self.threshold = threshold

    def _choose(self, rids: list[str], context_tokens: int, num_plain_only: int) -> int:
        return self.k_max if self._would_speculate(rids, context_tokens, num_plain_only) else 0

    def _would_speculate(self, rids: list[str], context_tokens: int, num_plain_only: int) -> bool:
        return len(rids) + num_plain_only <= self.threshold

    def summary(self) -> dict:
        return {**super().summary(), "threshold": self.threshold}


REEVALUATE_EVERY = 4  # steps between the cost policy's evaluations of an unchanged batch size
# ... and where its last evaluation there found the best candidate ahead of every other by at least
# FAR_APART (relative): a choice that clear is not undone by a few steps of drifting estimates.
REEVALUATE_FAR_EVERY = 16
FAR_APART = 0.15
# An admission into a batch of at least this many requests, in the bucket the policy last evaluated
# (within REEVALUATE_FAR_EVERY decode steps) where speculating won by FAR_APART, takes that verdict
# instead of evaluating afresh: one request among this many moves the objective by less than that.
SETTLED_BATCH = 8
# Whether the cost policy serves the steps it holds k through from a hold (CostPolicy._next_hold);
# a test turns it off to hold the two paths to the same choices.
HOLDS = True


def _bucket_lookup(keys: list[int], table: dict, batch_size: int, default):
    """The entry with the largest key <= batch_size (keys sorted), else default."""
    i = bisect_right(keys, batch_size)
    return table[keys[i - 1]] if i else default


class CostPolicy(SpecPolicy):
    """Pick the k with the most expected tokens per second at this batch:
    sum over requests of expected_tokens(k, rid) / seconds(batch size, k), where seconds is what
    a step of k costs the running server (LearnedCost: learned from its own steady decode steps,
    over the start-up table as the prior).

    Bounded exploration (Exploration) runs the other candidates now and then for a few steps, so
    that every candidate's cost at the current bucket stays measured; after a burst the policy
    decides afresh, past its dwell.

    Two guards keep it from flapping on noise, since each switch can cost a draft catch-up:
    - hysteresis: leave the current k only if the best candidate beats it by more than this
      fraction (relative);
    - min_dwell: a newly chosen k is held for at least min_dwell steps (the step that chose it
      included), whatever the objective says meanwhile. The one exception is a batch size whose
      candidate set excludes the current k: then the policy moves at once.

    candidates_by_bs (keys are batch-size lower bounds) restricts the candidates per batch size,
    as upstream's --speculative-adaptive-config does; hysteresis_by_bs may likewise give
    {"up": x, "down": y} margins per bucket for moves to a larger / smaller k, each falling back
    to `hysteresis`."""

    name = "cost"

    def __init__(
        self,
        candidates: list[int],
        cost: CostTable,
        estimator: AcceptanceEstimator,
        hysteresis: float = 0.02,
        min_dwell: int = 8,
        candidates_by_bs: Optional[dict[int, list[int]]] = None,
        hysteresis_by_bs: Optional[dict[int, dict[str, float]]] = None,
        exploration: Optional[Exploration] = None,
    ):
        super().__init__(estimator.k_max, estimator)
        if hysteresis < 0:
            raise ValueError(f"hysteresis must be >= 0, got {hysteresis}")
        if min_dwell < 1:
            raise ValueError(f"min_dwell must be >= 1, got {min_dwell}")
        self.candidates = _checked_candidates(candidates, estimator.k_max, "candidates")
        self.candidates_by_bs = {
            bs: _checked_candidates(steps, estimator.k_max, f"candidates_by_bs[{bs}]")
            for bs, steps in sorted((candidates_by_bs or {}).items())
        }
        self._bs_keys = list(self.candidates_by_bs)
        self.hysteresis = hysteresis
        self.hysteresis_by_bs = dict(sorted((hysteresis_by_bs or {}).items()))
        self._hyst_keys = list(self.hysteresis_by_bs)
        self.min_dwell = min_dwell
        self.cost = LearnedCost(cost)
        self.exploration = exploration if exploration is not None else Exploration()
        # Fail at start-up, not at the first decode step that would reach a missing k.
        needed = set(self.candidates).union(*self.candidates_by_bs.values())
        missing = sorted(needed - set(cost.measured_steps))
        if missing:
            raise ValueError(
                f"CostPolicy: the cost table has no step time for k in {missing} "
                f"(measured k: {list(cost.measured_steps)})"
            )
        self._evaluated_key: Optional[tuple] = None  # (graph bucket, candidate set) of the last evaluation
        self._decided_k: Optional[int] = None  # what the last _choose returned
        self._chosen_k: Optional[int] = None  # the k chosen at the last step, exploration aside (observe_step_seconds)
        self._where: Optional[tuple[int, int]] = None  # the learned costs' key of the batch being chosen for
        self._prices: tuple[Optional[tuple[int, int]], dict[int, float]] = (
            None,
            {},
        )  # (key, seconds per k), last evaluation
        # The last evaluation: (its key, the best candidate, how far ahead of the next it was, the decode step).
        self._verdict: tuple[Optional[tuple], int, float, int] = (None, 0, 0.0, 0)
        self.far_reevaluate_every = REEVALUATE_FAR_EVERY
        self.num_decisions = 0  # switches the objective made (exploration's own moves not counted)
        self.last_switch: Optional[str] = None  # why the last decided switch was made
        # The held k's hold (_next_hold): (batch sizes lo..hi-1, mean context per request lo..hi-1,
        # steps it covers, the k, its step price); _held counts the steps it has served, not yet
        # counted (_settle).
        self._hold: Optional[tuple[int, int, int, int, int, int, float]] = None
        self._held = 0
        self._bs_range: dict[int, tuple[int, int]] = {}  # batch size -> the sizes sharing its key and candidates

    def candidates_for(self, batch_size: int) -> list[int]:
        return _bucket_lookup(self._bs_keys, self.candidates_by_bs, batch_size, self.candidates)

    def objective(
        self, rids: list[str], candidates: list[int], context_tokens: int = 0, num_plain_only: int = 0
    ) -> dict[int, float]:
        """Expected tokens per second of each candidate for this batch (requests that opted out
        of speculation add one token and their share of the step's cost)."""
        return self._priced_objective(rids, candidates, context_tokens, num_plain_only)[0]

    def _priced_objective(
        self, rids: list[str], candidates: list[int], context_tokens: int, num_plain_only: int
    ) -> tuple[dict[int, float], dict[int, float]]:
        """(objective, seconds per step of each candidate)."""
        totals = self.estimator.batch_expected_tokens(rids, max(candidates))
        prices = self.cost.seconds_each(len(rids) + num_plain_only, candidates, context_tokens)
        return {k: (totals[k] + num_plain_only) / prices[k] for k in candidates}, prices

    def seconds(self, batch_size: int, k: int, context_tokens: int = 0) -> float:
        """What a step of k drafts costs the server at this batch size and summed context: the
        learned cost where its steps have been measured, the start-up table's scaled by what
        nearby buckets showed elsewhere."""
        return self.cost.seconds(batch_size, k, context_tokens)

    def observe_step_seconds(self, batch_size: int, k: int, context_tokens: int, seconds: float) -> None:
        # A step's sample comes at the next launch, after its choice: a k other than the one chosen
        # then (the k a burst returns to, where one runs) was explored.
        self.cost.observe_later(batch_size, k, context_tokens, seconds, chosen=self._chosen_k in (None, k))

    def choose(self, rids: list[str], context_tokens: int = 0, num_plain_only: int = 0, explore: bool = False) -> int:
        hold = self._hold
        if hold is not None:
            bs = len(rids) + num_plain_only
            if (
                self._held < hold[4]
                and rids
                and not explore
                and hold[0] <= bs < hold[1]
                and hold[2] * bs <= context_tokens < hold[3] * bs
            ):
                # Within a serving loop, where this code is cold, the path through _decide cost the
                # host ~20-30 us a step on this project's CPU: a hold costs a few comparisons.
                self._held += 1
                return hold[5]
            self._settle(keep=False)
        k = self._choose_step(rids, context_tokens, num_plain_only, explore)
        self._hold = self._next_hold(rids, context_tokens, num_plain_only, explore, k) if HOLDS else None
        return k

    def _settle(self, keep: bool = True) -> None:
        """Counts the steps the hold served as _choose_step would have: per k, in a row, and in
        exploration's accounting (each at the hold's step price). `keep`: the hold goes on for its
        steps left (reading the counts changes nothing it rests on; at a busy level an admission
        asks would_speculate every few steps)."""
        held, self._held = self._held, 0
        hold = self._hold
        if held:
            k, seconds = hold[5], hold[6]
            self.steps_in_current += held
            self.steps_per_k[k] += held
            for _ in range(held):
                self.exploration.note_step(self._where, k, seconds)
        self._hold = hold[:4] + (hold[4] - held,) + hold[5:] if keep and hold is not None and hold[4] > held else None

    def _next_hold(self, rids: list[str], context_tokens: int, num_plain_only: int, explore: bool, k: int):
        """The hold after a step that held k or chose it: the steps after it (while the batch stays
        in this step's key and candidate set) that _holds would hold k through, None where none
        would be held (exploration running, a batch with nothing to speculate, the scheduler's
        probe)."""
        if not rids or explore or self.exploration.active or k != self.current_k or self._prices[0] != self._where:
            return None  # (without this key's prices, _step_price prices each step afresh)
        bs = len(rids) + num_plain_only
        key = (self._where, id(self.candidates_for(bs)))
        steps = 0
        while self._holds(key, self.steps_in_current + steps):
            steps += 1
        if not steps:
            return None
        bs_lo, bs_hi = self._bs_range.get(bs) or self._batch_sizes_like(bs)
        if context_tokens < CONTEXT_CLASS_TOKENS * bs:
            mean_lo, mean_hi = 0, CONTEXT_CLASS_TOKENS
        else:
            mean_lo = CONTEXT_CLASS_TOKENS << (context_class(bs, context_tokens) - 1)
            mean_hi = 2 * mean_lo
            if not mean_lo * bs <= context_tokens < mean_hi * bs:  # float rounding at a class edge
                return None
        return bs_lo, bs_hi, mean_lo, mean_hi, steps, k, self._step_price(self._where, k, bs, context_tokens)

    def _batch_sizes_like(self, batch_size: int) -> tuple[int, int]:
        """The batch sizes lo..hi-1 around batch_size with its learned-cost bucket and candidate set."""

        def alike(bs: int) -> bool:
            return self.cost.bucket(bs) == bucket and self.candidates_for(bs) is candidates

        bucket, candidates = self.cost.bucket(batch_size), self.candidates_for(batch_size)
        lo = hi = batch_size
        while lo > 1 and alike(lo - 1):
            lo -= 1
        while hi < 2 * batch_size + 64 and alike(hi + 1):
            hi += 1
        self._bs_range[batch_size] = (lo, hi + 1)
        return lo, hi + 1

    def _choose_step(self, rids: list[str], context_tokens: int, num_plain_only: int, explore: bool) -> int:
        bs = max(len(rids) + num_plain_only, 1)
        where = self._where = self.cost.key(bs, context_tokens)
        self._decided_k = None
        k = super().choose(rids, context_tokens, num_plain_only, explore)
        # The chosen k: what a burst returns to, else what _choose decided (before the scheduler's
        # acceptance probe, if it asked for one), else (a batch that decodes plainly) k.
        self._chosen_k = (
            self.exploration.returns_to
            if self.exploration.active
            else self._decided_k
            if self._decided_k is not None
            else k
        )
        self.exploration.note_step(where, k, self._step_price(where, k, bs, context_tokens))
        return k

    def _step_price(self, where: tuple[int, int], k: int, bs: int, context_tokens: int) -> float:
        """A step's seconds for exploration's accounting: as the last evaluation at this key priced
        it (every candidate was), else afresh (pricing every step afresh cost the host a few us)."""
        priced_at, prices = self._prices
        seconds = prices.get(k) if priced_at == where else None
        return seconds if seconds is not None else self.cost.seconds(bs, k, context_tokens)

    def _holds(self, key: tuple, steps_in_current: int) -> bool:
        """Whether the held k, run steps_in_current steps in a row so far, stands at this step
        without an evaluation: within its dwell, or past it
        in the bucket (and candidate set) of the last evaluation, between evaluations. Past the
        dwell an unchanged bucket is re-evaluated every REEVALUATE_EVERY steps (far_reevaluate_every
        where the last evaluation found the candidates far apart): the objective costs the host
        ~10-30 us, a few percent of a small model's step. A batch that grows or shrinks by a
        request within its bucket (at concurrency 4, every few steps) is no reason to evaluate afresh."""
        if steps_in_current < self.min_dwell:
            return True
        every = self.far_reevaluate_every if self._verdict[2] >= FAR_APART else REEVALUATE_EVERY
        return key == self._evaluated_key and steps_in_current % every != 0

    def _margin(self, batch_size: int, current: int, best: int) -> float:
        margins = _bucket_lookup(self._hyst_keys, self.hysteresis_by_bs, batch_size, {})
        return margins.get("up" if best > current else "down", self.hysteresis)

    def _choose(self, rids: list[str], context_tokens: int, num_plain_only: int) -> int:
        self._decided_k = self._decide(rids, context_tokens, num_plain_only)
        return self._decided_k

    def _decide(self, rids: list[str], context_tokens: int, num_plain_only: int) -> int:
        cur = self.current_k
        if not rids:  # nothing to decode: no evidence either way
            return cur if cur is not None else self.candidates[0]
        bs = len(rids) + num_plain_only
        candidates = self.candidates_for(bs)
        after_burst = False
        if self.exploration.active:
            k, back = self.exploration.continue_burst(candidates)
            if k is not None:
                return k
            cur, after_burst = back, True  # decide afresh from the k the burst left
        # Batch sizes that replay the same graphs cost the same per step, so within a bucket (and
        # context class and candidate set) only the requests' estimates and the learned costs move
        # the choice.
        key = (self._where, id(candidates))
        if cur is not None and cur in candidates and not after_burst and self._holds(key, self.steps_in_current):
            return cur
        self._evaluated_key = key
        obj, prices = self._priced_objective(rids, candidates, context_tokens, num_plain_only)
        self._prices = (self._where, prices)
        self.last_objective = obj
        best = _best(obj)
        self._verdict = (key, best, _lead(obj, best), self.exploration.decode_steps)
        if cur is None or cur not in candidates:
            return best
        if best != cur and obj[best] > obj[cur] * (1.0 + self._margin(bs, cur, best)):
            self._note_decision(bs, cur, best, obj, after_burst, context_tokens)
            return best
        if not after_burst:
            # A candidate whose offset to the chosen k rests on fewer than a window of samples is
            # measured again soon, whatever it looks: a burst that straddled the end of a slow
            # stretch can price it far off, and a k that was chosen until now has none.
            unsure = frozenset(
                k for k in candidates if k != cur and self.cost.paired_samples(bs, k, context_tokens) < LEARN_WINDOW
            )
            explored = self.exploration.start_if_due(key[0], cur, obj, unsure)
            if explored is not None:
                return explored
        return cur

    def _note_decision(
        self, bs: int, cur: int, best: int, obj: dict[int, float], after_burst: bool, context_tokens: int
    ) -> None:
        """Logs a decided switch with every candidate's expected tokens per second, its price per
        step (context included) and where that price comes from (cost_model.LearnedCost.source)."""
        self.num_decisions += 1
        how = "after exploring it" if after_burst else "by the learned costs"
        each = "; ".join(
            f"{k}: {value:.0f} tok/s, {1e3 * self.seconds(bs, k, context_tokens):.3f} ms, "
            f"{self.cost.source(bs, k, context_tokens)}"
            for k, value in sorted(obj.items())
        )
        self.last_switch = (
            f"k {cur} -> {best} at batch {bs} ({context_tokens} context tokens) {how}: expected "
            f"{obj[best]:.0f} against {obj[cur]:.0f} tok/s, "
            f"{1e3 * self.seconds(bs, best, context_tokens):.3f} against "
            f"{1e3 * self.seconds(bs, cur, context_tokens):.3f} ms per step (k {each})"
        )
        logger.info("speculation: %s", self.last_switch)

    def _would_speculate(self, rids: list[str], context_tokens: int, num_plain_only: int) -> bool:
        bs = len(rids) + num_plain_only
        candidates = self.candidates_for(bs)
        if candidates[0] > 0:  # every candidate speculates
            return True
        self._settle()
        # A request joining a large batch whose bucket speculates by a clear margin, as evaluated
        # lately, speculates too (SETTLED_BATCH): admissions come every few steps at a busy level,
        # and each fresh evaluation costs the host ~15 us at batch 16.
        key, best, lead, step = self._verdict
        if (
            best > 0
            and lead >= FAR_APART
            and bs >= SETTLED_BATCH
            and self.exploration.decode_steps - step < self.far_reevaluate_every
            and key == (self.cost.key(bs, context_tokens), id(candidates))
        ):
            return True
        return _best(self.objective(rids, candidates, context_tokens, num_plain_only)) > 0

    def _explore_k(self, batch_size: int) -> int:
        return min((k for k in self.candidates_for(batch_size) if k > 0), default=self.k_max)

    def _at_prior(self, batch_size: int, context_tokens: int) -> bool:
        # Every request at the prior: 1 + p + ... + p^k tokens per verify of k drafts.
        prior = self.estimator.prior
        return (
            _best(
                {
                    k: batch_size * sum(prior**i for i in range(k + 1)) / self.seconds(batch_size, k, context_tokens)
                    for k in self.candidates_for(batch_size)
                }
            )
            > 0
        )

    def summary(self) -> dict:
        self._settle()
        return {
            **super().summary(),
            "candidates": self.candidates,
            "candidates_by_bs": self.candidates_by_bs,
            "hysteresis": self.hysteresis,
            "min_dwell": self.min_dwell,
            "cost": self.cost.summary(),
            "decisions": self.num_decisions,
            "last_switch": self.last_switch,
            "exploration": self.exploration.summary(),
        }


def _lead(objective: dict[int, float], best: int) -> float:
    """How far (relative) the best candidate is ahead of the next one (inf where it is the only one)."""
    runner_up = max((value for k, value in objective.items() if k != best), default=0.0)
    return objective[best] / runner_up - 1.0 if runner_up > 0 else math.inf


def _best(objective: dict[int, float]) -> int:
    """The k with the most expected tokens per second; ties go to the smallest k."""
    return max(sorted(objective), key=lambda k: objective[k])


def _checked_candidates(steps: list[int], k_max: int, label: str) -> list[int]:
    steps = sorted(set(steps))
    if not steps:
        raise ValueError(f"{label}: the candidate list is empty")
    bad = [k for k in steps if not 0 <= k <= k_max]
    if bad:
        raise ValueError(f"{label}: {bad} outside 0..{k_max}")
    return steps


def make_policy(
    name: str,
    k_max: int,
    *,
    threshold: Optional[int] = None,
    candidates: Optional[list[int]] = None,
    candidates_by_bs: Optional[dict[int, list[int]]] = None,
    cost: Optional[CostTable] = None,
    ema_alpha: Optional[float] = None,
    hysteresis: float = 0.02,
    min_dwell: int = 8,
    hysteresis_by_bs: Optional[dict[int, dict[str, float]]] = None,
    exploration: Optional[Exploration] = None,
) -> SpecPolicy:
    """The policy named by --speculative-policy, with an acceptance estimator for every policy
    (so acceptance is reported even when it does not drive the choice). Errors name the flag."""
    if name not in POLICY_NAMES:
        raise ValueError(f"--speculative-policy: unknown policy {name!r} (choose from {', '.join(POLICY_NAMES)})")
    if not _is_int(k_max) or k_max < 1:
        raise ValueError(f"--speculative-num-steps (k_max) must be an integer >= 1, got {k_max!r}")
    if ema_alpha is not None and not 0 < ema_alpha <= 1:
        raise ValueError(f"--speculative-adaptive-config: ema_alpha must be in (0, 1], got {ema_alpha}")
    estimator = AcceptanceEstimator(k_max, alpha=ema_alpha if ema_alpha is not None else 0.05)
    if name == "always":
        return AlwaysPolicy(k_max, estimator)
    if name == "never":
        return NeverPolicy(k_max, estimator)
    if name == "threshold":
        if threshold is None or threshold < 0:
            raise ValueError(
                "--speculative-policy threshold needs --speculative-threshold N >= 0 "
                f"(speculate while the decode batch has at most N requests), got {threshold}"
            )
        return ThresholdPolicy(k_max, threshold, estimator)
    if cost is None:
        raise ValueError(
            "--speculative-policy cost needs a measured cost table (step times of the captured graphs); none was given"
        )
    if candidates is None:
        candidates = sorted({0, 1, k_max})
    if not candidates:
        raise ValueError("--speculative-candidate-steps: the list is empty")
    for k in candidates:
        if not _is_int(k) or not 0 <= k <= k_max:
            raise ValueError(
                f"--speculative-candidate-steps: {k!r} is outside 0..{k_max} "
                f"(k_max = --speculative-num-steps = {k_max})"
            )
    for bs, steps in (candidates_by_bs or {}).items():
        for k in steps:
            if not _is_int(k) or not 0 <= k <= k_max:
                raise ValueError(
                    f"--speculative-adaptive-config: batch size {bs} lists step {k!r}, outside "
                    f"0..{k_max} (k_max = --speculative-num-steps = {k_max})"
                )
    return CostPolicy(
        candidates,
        cost,
        estimator,
        hysteresis=hysteresis,
        min_dwell=min_dwell,
        candidates_by_bs=candidates_by_bs,
        hysteresis_by_bs=hysteresis_by_bs,
        exploration=exploration,
    )
