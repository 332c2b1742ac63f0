"""Bounded exploration for the cost policy: now and then a candidate k other than the chosen one
runs for a few steps, so that its learned cost at the current key stays known."""

from __future__ import annotations

import dataclasses
import math
from typing import Hashable, Optional

EXPLORE_STEPS = 4  # steps per exploration burst: with the pipelined sample rule, 3 cost samples
# (shortfall against the chosen k, steps between bursts at a key): near candidates often, far rarely.
EXPLORE_INTERVALS = ((0.05, 128), (0.15, 384), (math.inf, 1536))
EXPLORE_MAX_SHARE = 0.02  # exploration never takes more than this share of decode steps
EXPLORE_CREDIT_START = 2 * EXPLORE_STEPS  # a fresh server may explore twice before earning credit


@dataclasses.dataclass
class Burst:
    k: int  # the candidate it runs
    steps_left: int
    returns_to: int  # the chosen k, which the policy decides afresh from after the burst
    shortfall: float  # 1 - objective[k] / objective[returns_to] when it started


class Exploration:
    """When to run which other candidate, and what it cost. A candidate is due at a key when the
    steps since it last ran there pass the interval for its shortfall (1 - objective[k] /
    objective[chosen]); a burst runs it EXPLORE_STEPS steps, then the policy decides afresh. A
    credit (EXPLORE_MAX_SHARE per decode step) caps exploration's share of steps; its cost is
    each exploration step's shortfall, by the policy's own estimate."""

    def __init__(self, steps: int = EXPLORE_STEPS, max_share: float = EXPLORE_MAX_SHARE, intervals=EXPLORE_INTERVALS):
        self.burst_steps, self.max_share, self.intervals = steps, max_share, intervals
        self._credit = float(EXPLORE_CREDIT_START) if max_share else 0.0
        self._credit_cap = float(max(EXPLORE_CREDIT_START, 2 * steps))
        self._last_run: dict[tuple[Hashable, int], int] = {}
        self.decode_steps = 0
        self.steps = 0  # exploration steps run
        self.bursts = 0
        self.lost_seconds = 0.0  # summed over exploration steps: seconds * shortfall
        self.decode_seconds = 0.0  # every decode step's estimated seconds
        self._burst: Optional[Burst] = None
        self._step_explores = False  # the step being chosen is an exploration step

    def note_step(self, bucket: Hashable, k: int, seconds: float) -> None:
        """A decode step of k, estimated at `seconds`, ran at this key (every step, exploring or not)."""
        self.decode_steps += 1
        self.decode_seconds += seconds
        if self._step_explores:
            self.lost_seconds += seconds * self._burst.shortfall
            self._step_explores = False
        self._credit = min(self._credit + self.max_share, self._credit_cap)
        self._last_run[(bucket, k)] = self.decode_steps

    @property
    def active(self) -> bool:
        return self._burst is not None

    @property
    def returns_to(self) -> Optional[int]:
        """The k the running burst returns to (None when none runs)."""
        return self._burst.returns_to if self._burst is not None else None

    def continue_burst(self, candidates: list[int]) -> tuple[Optional[int], Optional[int]]:
        """(k, None) while a burst goes on; (None, k it left) once it is over (or its k is no
        longer a candidate at this batch size)."""
        burst = self._burst
        if burst.steps_left > 0 and burst.k in candidates:
            burst.steps_left -= 1
            self.steps += 1
            self._step_explores = True
            return burst.k, None
        self._burst = None
        return None, burst.returns_to

    def start_if_due(
        self, bucket: Hashable, chosen: int, objective: dict[int, float], unsure: frozenset = frozenset()
    ) -> Optional[int]:
        """A candidate to run now instead of `chosen` (this step is the burst's first), or None.
        `unsure` candidates (costs on few samples) are due at the shortest interval."""
        if self._credit < self.burst_steps or not objective.get(chosen):
            return None
        due = []
        for k, value in objective.items():
            if k == chosen:
                continue
            shortfall = max(0.0, 1.0 - value / objective[chosen])
            last = self._last_run.get((bucket, k))
            interval = self.intervals[0][1] if k in unsure else _interval(self.intervals, shortfall)
            overdue = math.inf if last is None else (self.decode_steps - last) / interval
            if overdue >= 1:
                due.append((-overdue, shortfall, k))
        if not due:
            return None
        # The most overdue first (never run here before all); between equals, the nearest.
        _, shortfall, k = min(due)
        self._credit -= self.burst_steps
        self.bursts += 1
        self._burst = Burst(k, self.burst_steps, chosen, shortfall)
        return self.continue_burst([k])[0]  # its first step

    def summary(self) -> dict:
        return {
            "steps": self.steps,
            "bursts": self.bursts,
            "share": round(self.steps / max(self.decode_steps, 1), 5),
            "cost_share": round(self.lost_seconds / self.decode_seconds, 5) if self.decode_seconds else 0.0,
        }


def _interval(intervals: tuple[tuple[float, int], ...], shortfall: float) -> int:
    return next((interval for bound, interval in intervals if shortfall < bound), intervals[-1][1])
