"""The cost policy (--speculative-policy cost). Pure Python, on the scheduler's thread once per
decode step: no device work."""

from __future__ import annotations

import dataclasses
import logging
import math
from bisect import bisect_right
from typing import Optional

from sglang.srt.speculative.acceptance import AcceptanceEstimator
from sglang.srt.speculative.cost_model import LEARN_WINDOW, CostTable, LearnedCost
from sglang.srt.speculative.exploration import Exploration
from sglang.srt.speculative.spec_policy import PolicyOptions, SpecPolicy

logger = logging.getLogger(__name__)

REEVALUATE_EVERY = 4  # steps between the cost policy's evaluations of an unchanged batch size
# ... where the last evaluation found the best candidate ahead of the next by at least FAR_APART.
REEVALUATE_FAR_EVERY = 16
FAR_APART = 0.15
# An admission into a batch of at least this many requests takes the last verdict at its key where
# speculating won by FAR_APART lately: one request among this many moves the objective less.
SETTLED_BATCH = 8


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The cost policy's last evaluation of its objective."""

    where: tuple[int, int]  # the learned costs' key (batch-size octave, context class)
    candidates: tuple[int, ...]  # the candidate set at that batch size
    best: int
    lead: float  # how far (relative) `best` was ahead of the next candidate
    decode_step: int  # exploration.decode_steps when it was made
    prices: dict[int, float]  # seconds per step of each candidate

    @property
    def far_apart(self) -> bool:
        return self.lead >= FAR_APART

    def stands_for(self, where: tuple[int, int], candidates: list[int]) -> bool:
        return self.where == where and self.candidates == tuple(candidates)


class CostPolicy(SpecPolicy):
    """Pick the k with the most expected tokens per second at this batch: sum over requests of
    expected_tokens(k, rid) / seconds(batch size, k), seconds being what a step of k costs the
    running server (LearnedCost). Bounded exploration (Exploration) runs the other candidates now
    and then for a few steps, so that their costs stay measured.

    Two guards keep it from flapping on noise: leave the current k only if the best candidate
    beats it by more than `hysteresis` (relative), and hold a newly chosen k for min_dwell steps,
    unless the batch size's candidate set excludes it. candidates_by_bs (keys: batch-size lower
    bounds) restricts the candidates per batch size, as upstream's --speculative-adaptive-config
    does; hysteresis_by_bs may give {"up": x, "down": y} margins per bucket for moves to a larger
    / smaller k."""

    name = "cost"
    help = (
        "the k with the most expected tokens per second from measured step times and observed "
        "acceptance; the default with --speculative-adaptive"
    )
    needs_step_costs = True

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
        self.candidates = sorted(set(candidates))
        self.candidates_by_bs = {bs: sorted(set(steps)) for bs, steps in sorted((candidates_by_bs or {}).items())}
        self.hysteresis, self.min_dwell = hysteresis, min_dwell
        self.hysteresis_by_bs = dict(sorted((hysteresis_by_bs or {}).items()))
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
        self._verdict: Optional[Verdict] = None
        self._chosen_k: Optional[int] = None  # the k chosen at the last step, exploration aside (observe_step_seconds)
        self._where: Optional[tuple[int, int]] = None  # the learned costs' key of the batch being chosen for
        self.far_reevaluate_every = REEVALUATE_FAR_EVERY
        self.num_decisions = 0  # switches the objective made (exploration's own moves not counted)
        self.last_switch: Optional[str] = None  # why the last decided switch was made

    @classmethod
    def reachable_steps(cls, options: PolicyOptions) -> list[int]:
        return sorted(k for k in set(_candidates(options)).union(*(options.candidates_by_bs or {}).values()) if k > 0)

    @classmethod
    def create(cls, options: PolicyOptions, estimator: AcceptanceEstimator, cost, exploration) -> "CostPolicy":
        if cost is None:
            raise ValueError(
                "--speculative-policy cost needs a measured cost table (step times of the captured graphs); "
                "none was given"
            )
        by_bs = dict(candidates_by_bs=options.candidates_by_bs, hysteresis_by_bs=options.hysteresis_by_bs)
        return cls(_candidates(options), cost, estimator, exploration=exploration, **by_bs)

    def candidates_for(self, batch_size: int) -> list[int]:
        return _bucket_lookup(self.candidates_by_bs, batch_size, self.candidates)

    def objective(
        self, rids: list[str], candidates: list[int], context_tokens: int = 0, num_plain_only: int = 0
    ) -> dict[int, float]:
        """Expected tokens per second of each candidate for this batch (requests that opted out
        of speculation add one token and their share of the step's cost)."""
        return self._priced_objective(rids, candidates, context_tokens, num_plain_only)[0]

    def _priced_objective(self, rids: list[str], candidates: list[int], context_tokens: int, num_plain_only: int):
        """(objective, seconds per step of each candidate)."""
        totals = self.estimator.batch_expected_tokens(rids, max(candidates))
        prices = self.cost.seconds_each(len(rids) + num_plain_only, candidates, context_tokens)
        return {k: (totals[k] + num_plain_only) / prices[k] for k in candidates}, prices

    def seconds(self, batch_size: int, k: int, context_tokens: int = 0) -> float:
        return self.cost.seconds(batch_size, k, context_tokens)

    def observe_step_seconds(self, batch_size: int, k: int, context_tokens: int, seconds: float) -> None:
        # A step's sample comes at the next launch, after its choice: a k other than the one chosen
        # then (the k a burst returns to, where one runs) was explored.
        self.cost.observe_later(batch_size, k, context_tokens, seconds, chosen=self._chosen_k in (None, k))

    def choose(self, rids: list[str], context_tokens: int = 0, num_plain_only: int = 0, explore: bool = False) -> int:
        bs = max(len(rids) + num_plain_only, 1)
        where = self._where = self.cost.key(bs, context_tokens)
        k = super().choose(rids, context_tokens, num_plain_only, explore)
        # The chosen k: what a burst returns to, else what the policy decided (decided_k: before
        # the scheduler's acceptance probe, if it asked for one).
        self._chosen_k = self.exploration.returns_to if self.exploration.active else self.decided_k
        self.exploration.note_step(where, k, self._step_price(where, k, bs, context_tokens))
        return k

    def _step_price(self, where: tuple[int, int], k: int, bs: int, context_tokens: int) -> float:
        """A step's seconds for exploration's accounting: as the last evaluation at this key priced
        it, else afresh (pricing every step afresh costs the host a few us)."""
        prices = self._verdict.prices if self._verdict is not None and self._verdict.where == where else {}
        return prices[k] if k in prices else self.cost.seconds(bs, k, context_tokens)

    def _holds(self, candidates: list[int]) -> bool:
        """Whether the current k stands without an evaluation: within its dwell, or at the key and
        candidate set of the last evaluation, between re-evaluations every REEVALUATE_EVERY steps
        (far_reevaluate_every where the candidates were far apart). The objective costs the host
        ~10-30 us; a batch that changes by a request within its bucket needs no fresh one."""
        steps = self.steps_in_current
        if steps < self.min_dwell:
            return True
        verdict = self._verdict
        if verdict is None or not verdict.stands_for(self._where, candidates):
            return False
        return steps % (self.far_reevaluate_every if verdict.far_apart else REEVALUATE_EVERY) != 0

    def _margin(self, batch_size: int, current: int, best: int) -> float:
        margins = _bucket_lookup(self.hysteresis_by_bs, batch_size, {})
        return margins.get("up" if best > current else "down", self.hysteresis)

    def _choose(self, rids: list[str], context_tokens: int, num_plain_only: int) -> int:
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
        if cur is not None and cur in candidates and not after_burst and self._holds(candidates):
            return cur
        obj, best = self._evaluate(rids, candidates, context_tokens, num_plain_only)
        if cur is None or cur not in candidates:
            return best
        if best != cur and obj[best] > obj[cur] * (1.0 + self._margin(bs, cur, best)):
            self._note_decision(bs, cur, best, obj, after_burst, context_tokens)
            return best
        if after_burst:
            return cur
        # A candidate whose offset rests on less than a window of samples is measured again soon,
        # whatever it looks: one burst over the end of a slow stretch can price it far off.
        unsure = frozenset(
            k for k in candidates if k != cur and self.cost.paired_samples(bs, k, context_tokens) < LEARN_WINDOW
        )
        explored = self.exploration.start_if_due(self._where, cur, obj, unsure)
        return cur if explored is None else explored

    def _evaluate(self, rids: list[str], candidates: list[int], context_tokens: int, num_plain_only: int):
        """(the objective at this step, its best k), kept as the verdict."""
        obj, prices = self._priced_objective(rids, candidates, context_tokens, num_plain_only)
        self.last_objective = obj
        best = _best(obj)
        runner_up = max((value for k, value in obj.items() if k != best), default=0.0)
        lead = obj[best] / runner_up - 1.0 if runner_up > 0 else math.inf  # inf: the only candidate
        self._verdict = Verdict(self._where, tuple(candidates), best, lead, self.exploration.decode_steps, prices)
        return obj, best

    def _note_decision(self, bs: int, cur: int, best: int, obj: dict, after_burst: bool, context_tokens: int) -> None:
        """Logs a decided switch with every candidate's expected tokens per second, its price per
        step (context included) and where that price comes from (cost_model.LearnedCost.source)."""
        self.num_decisions += 1
        how = "after exploring it" if after_burst else "by the learned costs"
        ms = {k: 1e3 * seconds for k, seconds in self._verdict.prices.items()}  # as _evaluate priced them
        each = "; ".join(
            f"{k}: {value:.0f} tok/s, {ms[k]:.3f} ms, {self.cost.source(bs, k, context_tokens)}"
            for k, value in sorted(obj.items())
        )
        self.last_switch = (
            f"k {cur} -> {best} at batch {bs} ({context_tokens} context tokens) {how}: expected {obj[best]:.0f} "
            f"against {obj[cur]:.0f} tok/s, {ms[best]:.3f} against {ms[cur]:.3f} ms per step (k {each})"
        )
        logger.info("speculation: %s", self.last_switch)

    def _would_speculate(self, rids: list[str], context_tokens: int, num_plain_only: int) -> bool:
        bs = len(rids) + num_plain_only
        candidates = self.candidates_for(bs)
        if candidates[0] > 0:  # every candidate speculates
            return True
        # SETTLED_BATCH: a fresh evaluation costs the host ~15 us at batch 16, at every admission.
        verdict = self._verdict
        settled = bs >= SETTLED_BATCH and verdict is not None and verdict.best > 0 and verdict.far_apart
        if settled and self.exploration.decode_steps - verdict.decode_step < self.far_reevaluate_every:
            if verdict.stands_for(self.cost.key(bs, context_tokens), candidates):
                return True
        return _best(self.objective(rids, candidates, context_tokens, num_plain_only)) > 0

    def _explore_k(self, batch_size: int) -> int:
        return min((k for k in self.candidates_for(batch_size) if k > 0), default=self.k_max)

    def _at_prior(self, batch_size: int, context_tokens: int) -> bool:
        # Every request at the prior: 1 + p + ... + p^k tokens per verify of k drafts.
        prior = self.estimator.prior
        objective = {
            k: batch_size * sum(prior**i for i in range(k + 1)) / self.seconds(batch_size, k, context_tokens)
            for k in self.candidates_for(batch_size)
        }
        return _best(objective) > 0

    def summary(self) -> dict:
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


def _candidates(options: PolicyOptions) -> list[int]:
    """The k the policy chooses from: --speculative-candidate-steps, else plain, one draft and k_max."""
    return options.candidates if options.candidates is not None else sorted({0, 1, options.k_max})


def _bucket_lookup(table: dict, batch_size: int, default):
    """The entry with the largest key <= batch_size (keys sorted), else default."""
    keys = list(table)
    i = bisect_right(keys, batch_size)
    return table[keys[i - 1]] if i else default


def _best(objective: dict[int, float]) -> int:
    """The k with the most expected tokens per second; ties go to the smallest k."""
    return max(sorted(objective), key=lambda k: objective[k])
