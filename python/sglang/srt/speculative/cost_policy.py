"""The cost policy (--speculative-policy cost): each decode step, the candidate k with the most
expected tokens per second, from the acceptance observed so far and what steps of each k cost the
running server. Pure Python, on the scheduler's thread once per step: no device work."""

from __future__ import annotations

import dataclasses
import logging
import math
from bisect import bisect_right
from typing import Optional

from sglang.srt.speculative.acceptance import AcceptanceEstimator
from sglang.srt.speculative.cost_model import LEARN_WINDOW, CostTable, LearnedCost
from sglang.srt.speculative.exploration import Exploration
from sglang.srt.speculative.spec_policy import PolicyOptions, SpecPolicy, default_candidates

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
        self._verdict: Optional[Verdict] = None
        self._decided_k: Optional[int] = None  # what the last _choose returned
        self._chosen_k: Optional[int] = None  # the k chosen at the last step, exploration aside (observe_step_seconds)
        self._where: Optional[tuple[int, int]] = None  # the learned costs' key of the batch being chosen for
        self.far_reevaluate_every = REEVALUATE_FAR_EVERY
        self.num_decisions = 0  # switches the objective made (exploration's own moves not counted)
        self.last_switch: Optional[str] = None  # why the last decided switch was made

    @classmethod
    def reachable_steps(cls, options: PolicyOptions) -> list[int]:
        candidates = _candidates(options)
        return sorted(k for k in set(candidates).union(*(options.candidates_by_bs or {}).values()) if k > 0)

    @classmethod
    def create(cls, options: PolicyOptions, estimator: AcceptanceEstimator, cost, exploration) -> "CostPolicy":
        if cost is None:
            raise ValueError(
                "--speculative-policy cost needs a measured cost table (step times of the captured graphs); "
                "none was given"
            )
        return cls(
            _candidates(options),
            cost,
            estimator,
            candidates_by_bs=options.candidates_by_bs,
            hysteresis_by_bs=options.hysteresis_by_bs,
            exploration=exploration,
        )

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
        """What a step of k drafts costs the server at this batch size and summed context."""
        return self.cost.seconds(batch_size, k, context_tokens)

    def observe_step_seconds(self, batch_size: int, k: int, context_tokens: int, seconds: float) -> None:
        # A step's sample comes at the next launch, after its choice: a k other than the one chosen
        # then (the k a burst returns to, where one runs) was explored.
        self.cost.observe_later(batch_size, k, context_tokens, seconds, chosen=self._chosen_k in (None, k))

    def choose(self, rids: list[str], context_tokens: int = 0, num_plain_only: int = 0, explore: bool = False) -> int:
        bs = max(len(rids) + num_plain_only, 1)
        where = self._where = self.cost.key(bs, context_tokens)
        self._decided_k = None
        k = super().choose(rids, context_tokens, num_plain_only, explore)
        # The chosen k: what a burst returns to, else what _choose decided (before the scheduler's
        # acceptance probe, if it asked for one), else (a batch that decodes plainly) k.
        if self.exploration.active:
            self._chosen_k = self.exploration.returns_to
        else:
            self._chosen_k = self._decided_k if self._decided_k is not None else k
        self.exploration.note_step(where, k, self._step_price(where, k, bs, context_tokens))
        return k

    def _step_price(self, where: tuple[int, int], k: int, bs: int, context_tokens: int) -> float:
        """A step's seconds for exploration's accounting: as the last evaluation at this key priced
        it, else afresh (pricing every step afresh costs the host a few us)."""
        verdict = self._verdict
        seconds = verdict.prices.get(k) if verdict is not None and verdict.where == where else None
        return seconds if seconds is not None else self.cost.seconds(bs, k, context_tokens)

    def _holds(self, candidates: list[int]) -> bool:
        """Whether the current k stands without an evaluation: within its dwell, or at the key and
        candidate set of the last evaluation, between re-evaluations every REEVALUATE_EVERY steps
        (far_reevaluate_every where the candidates were far apart). The objective costs the host
        ~10-30 us; a batch that changes by a request within its bucket needs no fresh one."""
        steps = self.steps_in_current
        if steps < self.min_dwell:
            return True
        verdict = self._verdict
        if verdict is None or verdict.where != self._where or verdict.candidates != tuple(candidates):
            return False
        return steps % (self.far_reevaluate_every if verdict.far_apart else REEVALUATE_EVERY) != 0

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
        if cur is not None and cur in candidates and not after_burst and self._holds(candidates):
            return cur
        obj = self._evaluate(rids, candidates, context_tokens, num_plain_only)
        best = self._verdict.best
        if cur is None or cur not in candidates:
            return best
        if best != cur and obj[best] > obj[cur] * (1.0 + self._margin(bs, cur, best)):
            self._note_decision(bs, cur, best, obj, after_burst, context_tokens)
            return best
        if not after_burst:
            # A candidate whose offset rests on less than a window of samples is measured again soon,
            # whatever it looks: one burst over the end of a slow stretch can price it far off.
            unsure = frozenset(
                k for k in candidates if k != cur and self.cost.paired_samples(bs, k, context_tokens) < LEARN_WINDOW
            )
            explored = self.exploration.start_if_due(self._where, cur, obj, unsure)
            if explored is not None:
                return explored
        return cur

    def _evaluate(self, rids: list[str], candidates: list[int], context_tokens: int, num_plain_only: int) -> dict:
        """The objective at this step, kept as the verdict."""
        obj, prices = self._priced_objective(rids, candidates, context_tokens, num_plain_only)
        self.last_objective = obj
        best = _best(obj)
        lead = _lead(obj, best)
        self._verdict = Verdict(self._where, tuple(candidates), best, lead, self.exploration.decode_steps, prices)
        return obj

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
        # SETTLED_BATCH: a fresh evaluation costs the host ~15 us at batch 16, at every admission.
        verdict = self._verdict
        if (
            verdict is not None
            and verdict.best > 0
            and verdict.far_apart
            and bs >= SETTLED_BATCH
            and self.exploration.decode_steps - verdict.decode_step < self.far_reevaluate_every
            and verdict.where == self.cost.key(bs, context_tokens)
            and verdict.candidates == tuple(candidates)
        ):
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
    return options.candidates if options.candidates is not None else default_candidates(options.k_max)


def _bucket_lookup(keys: list[int], table: dict, batch_size: int, default):
    """The entry with the largest key <= batch_size (keys sorted), else default."""
    i = bisect_right(keys, batch_size)
    return table[keys[i - 1]] if i else default


def _lead(objective: dict[int, float], best: int) -> float:
    """How far (relative) the best candidate is ahead of the next one (inf where it is the only one)."""
    runner_up = max((value for k, value in objective.items() if k != best), default=0.0)
    return objective[best] / runner_up - 1.0 if runner_up > 0 else math.inf


def _best(objective: dict[int, float]) -> int:
    """The k with the most expected tokens per second; ties go to the smallest k."""
    return max(sorted(objective), key=lambda k: objective[k])
