"""Acceptance estimates of speculative decoding: per draft position, how likely the draft's
token is accepted given the ones before it were, pooled over the batch and per request."""

from __future__ import annotations

import itertools
from typing import Optional

import numpy as np

# A new request's estimates start from the pooled ones, weighted as this many observations of
# its own: its first verifies move it quickly (running mean), later ones at request_alpha.
_REQUEST_PRIOR_WEIGHT = 4
MAX_PENDING_STEPS = 32  # steps whose per-request updates wait to be folded in, at most
INITIAL_ROWS = 16  # request rows made at start; the table doubles when they run out


class AcceptanceEstimator:
    """Per-position acceptance estimates a_1..a_kmax, a_i = P(draft i accepted | drafts 1..i-1
    were). Per-position rates price every k from the same statistics, E[tokens | k] = 1 +
    sum_{i<=k} prod_{j<=i} a_j, even a k that has not run lately.

    The pooled estimate is an EMA over recent verifies. Each request also has its own (some
    prompts are much easier to draft for): it starts at new_request_rates and follows a running
    mean (that start weighted as _REQUEST_PRIOR_WEIGHT observations) until that is slower than
    request_alpha, then an EMA at request_alpha: quick to tell a new request apart, yet not swung
    by one request's luck.

    A position the current k does not reach goes unobserved, and a frozen low estimate there
    would keep the deeper k from ever running again. So each step moves the unobserved positions
    a fraction `recovery` of the way up to max(prior, long-run rate), the long-run rate being a
    slow EMA (alpha / 10) of what the position showed when observed.

    Per-request state lives in numpy rows (reused after `forget`): a step updates the pooled rates
    at once and queues the rows' updates, which _fold_rows applies when something reads them or
    MAX_PENDING_STEPS are queued (consecutive steps of one batch share one gather and scatter,
    ~70-100 us a step on the host instead of ~190-260 us)."""

    def __init__(self, k_max: int, alpha=0.05, prior=0.5, request_alpha=0.05, recovery=0.002):
        self.k_max, self.alpha, self.request_alpha, self.recovery = k_max, alpha, request_alpha, float(recovery)
        self.prior = float(prior)  # each rate before any evidence
        self._pooled = [float(prior)] * k_max
        self._long_run = np.full(k_max, float(prior))  # slow EMA of each position's observed rate
        # rid -> row of _rates / _seen, from a request's first observation until it is forgotten.
        self._per_request: dict[str, int] = {}
        self._free_rows: list[int] = list(range(INITIAL_ROWS - 1, -1, -1))  # popped from the end: row 0 first
        # A request's rates and observation counts share one row of _state (one gather and one
        # scatter per step); _rates and _seen are views of its halves.
        self._state = np.zeros((INITIAL_ROWS, 2 * k_max))
        self._rates, self._seen = self._state[:, :k_max], self._state[:, k_max:]
        # Per k_step: row n of each table is what a request that produced n tokens observed at
        # each 0-based position (1.0 where observed) and accepted (1.0 where accepted).
        positions = np.arange(k_max)[None, :]
        self._outcome_tables = [
            (((positions < np.minimum(n, k)) * 1.0), (positions < n - 1) * 1.0)
            for k in range(k_max + 1)
            for n in [np.arange(k + 2)[:, None]]
        ]
        self._last_rids: list[str] = []
        self._last_rows = np.zeros(0, dtype=np.int64)
        # Steps not folded into _state yet: (rows, tokens per request, k_step, recovery target).
        self._pending: list[tuple[np.ndarray, list[int], int, Optional[np.ndarray]]] = []
        self._rows_to_free: list[int] = []  # rows of forgotten requests, freed once pending steps are folded

    @property
    def tracked_requests(self) -> int:
        """Requests with per-request state (should return to 0 once all have been forgotten)."""
        return len(self._per_request)

    def _rows(self, rids: list[str]) -> np.ndarray:
        """Each request's row, made (from the pooled rates) for a request seen the first time.
        Consecutive steps mostly see the same batch: its rows are kept for the next call."""
        if rids == self._last_rids:
            return self._last_rows
        for rid in rids:
            if rid not in self._per_request:
                self._per_request[rid] = self._new_row()
        self._last_rids = list(rids)
        self._last_rows = np.asarray([self._per_request[rid] for rid in rids], dtype=np.int64)
        return self._last_rows

    def _new_row(self) -> int:
        if not self._free_rows:
            used = len(self._state)
            self._state = np.concatenate([self._state, np.zeros_like(self._state)])
            self._rates, self._seen = self._state[:, : self.k_max], self._state[:, self.k_max :]
            self._free_rows = list(range(2 * used - 1, used - 1, -1))
        row = self._free_rows.pop()
        self._rates[row] = self.new_request_rates()
        self._seen[row] = 0
        return row

    def new_request_rates(self) -> list[float]:
        """What a request not seen yet is expected to accept: per position the larger of the pooled
        and the long-run rate. At small batches one hard prompt pulls the pooled EMA far down within
        tens of steps, which would keep the draft from the requests admitted after it; the long-run
        rate moves ten times slower, so only a workload that stays hard brings new requests down."""
        return [max(pooled, float(long_run)) for pooled, long_run in zip(self._pooled, self._long_run)]

    def _observe(self, rids: list[str], num_out: list[int], k_step: int, counts: list[int]) -> None:
        """One step's outcomes: request r produced num_out[r] tokens (1..k_step + 1) from k_step
        drafts; counts[n]: how many requests produced n. Updates the pooled rates; queues the rows'."""
        # Unobserved positions k_step.. recover towards max(prior, long-run rate) (None: none, or off).
        target = np.maximum(self._long_run[k_step:], self.prior) if k_step < self.k_max and self.recovery else None
        self._pending.append((self._rows(rids), num_out, k_step, target))
        # The pooled EMAs take the batch as one observation per position (their memory is in steps,
        # whatever the batch size): 0-based position i was observed by the requests that produced
        # more than i tokens, accepted by those that produced more than i + 1.
        accepted_here = counts[k_step + 1]
        for i in range(k_step - 1, -1, -1):
            observed_here = accepted_here + counts[i + 1]
            if observed_here:
                rate = accepted_here / observed_here
                self._pooled[i] += self.alpha * (rate - self._pooled[i])
                self._long_run[i] += self.alpha / 10 * (rate - self._long_run[i])
            accepted_here = observed_here
        for i, goal in enumerate(() if target is None else target.tolist(), start=k_step):
            self._pooled[i] += self.recovery * max(goal - self._pooled[i], 0.0)
        if len(self._pending) >= MAX_PENDING_STEPS:
            self._fold_rows()

    def _fold_rows(self) -> None:
        """Folds the queued steps into the requests' rows, in order: each step a running mean /
        EMA per observed position and recovery of the unobserved ones."""
        pending, self._pending = self._pending, []
        k_max, request_alpha, recovery, tables = self.k_max, self.request_alpha, self.recovery, self._outcome_tables
        state = self._state
        for _, steps in itertools.groupby(pending, key=lambda step: id(step[0])):  # a run of one batch's
            steps = list(steps)
            rows = steps[0][0]
            block = state[rows]
            for _, num_out, k_step, target in steps:
                observed, accepted = tables[k_step]
                n = np.asarray(num_out, dtype=np.int64)
                mask, outcome = observed[n], accepted[n]
                rates = block[:, :k_max]
                seen = block[:, k_max:] + mask
                weight = np.maximum(1.0 / (seen + _REQUEST_PRIOR_WEIGHT), request_alpha) * mask
                block[:, :k_max] = rates + weight * (outcome - rates)
                block[:, k_max:] = seen
                if target is not None:
                    tail = block[:, k_step:k_max]
                    block[:, k_step:k_max] = tail + recovery * np.maximum(target[None, :] - tail, 0.0)
            state[rows] = block
        if self._rows_to_free:
            self._free_rows.extend(self._rows_to_free)
            self._rows_to_free = []

    def record_verify(self, rids: list[str], num_out: list[int], k_step: int) -> None:
        """One speculative step with k_step drafts: request rids[r] produced num_out[r] tokens
        (1..k_step + 1). Position i was observed iff num_out >= i and accepted iff num_out >= i + 1."""
        if not 0 <= k_step <= self.k_max:
            raise ValueError(f"record_verify: k_step {k_step} is outside 0..{self.k_max}")
        if k_step == 0 or not rids:
            return
        if min(num_out) < 1 or max(num_out) > k_step + 1:
            rid, n = next((rid, n) for rid, n in zip(rids, num_out) if not 1 <= n <= k_step + 1)
            raise ValueError(
                f"record_verify: request {rid!r} produced {n} tokens from {k_step} drafts (expected 1..{k_step + 1})"
            )
        self._observe(rids, num_out, k_step, np.bincount(num_out, minlength=k_step + 2).tolist())

    def record_probe(self, rids: list[str], hits: list[bool]) -> None:
        """A PLAIN step's free probe: whether the draft's guess d_1 was the target's token. It keeps
        a_1 current while speculation is off, which tells the policy when turning it on would pay."""
        if not rids:
            return
        # A probe is a one-draft step: 2 tokens where the draft was right, else 1.
        num_out = [2 if hit else 1 for hit in hits]
        self._observe(rids, num_out, 1, np.bincount(num_out, minlength=3).tolist())

    def rates(self, rid: Optional[str] = None) -> list[float]:
        """a_1..a_kmax for the request (new_request_rates for one not seen yet), or the pooled
        rates for None."""
        if rid is None:
            return list(self._pooled)
        row = self._per_request.get(rid)
        if row is None:
            return self.new_request_rates()
        if self._pending:
            self._fold_rows()
        return self._rates[row].tolist()

    def expected_tokens(self, k: int, rid: Optional[str] = None) -> float:
        """Expected tokens one verify of k drafts yields: 1 + sum_{i<=k} prod_{j<=i} a_j (the
        bonus token plus each draft, which counts only if all before it were accepted)."""
        prod = expected = 1.0
        for a in self.rates(rid)[:k]:
            prod *= a
            expected += prod
        return expected

    def batch_expected_tokens(self, rids: list[str], k: int) -> list[float]:
        """Sum over the batch of expected_tokens(k', rid) for every k' in 0..k: what the cost
        policy needs each step, in a few array operations."""
        if k == 0 or not rids:
            return [float(len(rids))] * (k + 1)
        if self._pending:
            self._fold_rows()
        if rids == self._last_rids:  # every request of the batch is tracked
            known, unknown = self._last_rows, 0
        else:
            rows = [self._per_request.get(rid) for rid in rids]
            known = np.asarray([row for row in rows if row is not None], dtype=np.int64)
            unknown = len(rows) - len(known)
        # Per position i: the batch's sum of prod_{j<=i} a_j (unknown requests at new_request_rates).
        chains = np.cumprod(self._rates[known, :k], axis=1).sum(axis=0) if len(known) else np.zeros(k)
        if unknown:
            chains = chains + unknown * np.cumprod(self.new_request_rates()[:k])
        totals = float(len(rids)) + np.concatenate([[0.0], np.cumsum(chains)])
        return totals.tolist()

    def forget(self, rid: str) -> None:
        """The request finished: drop its state, so long-running servers do not leak."""
        row = self._per_request.pop(rid, None)
        if row is not None:
            # Queued steps may still update the row: it is reused only once they are folded.
            (self._rows_to_free if self._pending else self._free_rows).append(row)
            self._last_rids, self._last_rows = [], np.zeros(0, dtype=np.int64)  # that row may be reused

    def summary(self) -> dict:
        return {
            "acceptance_rates": [round(a, 4) for a in self._pooled],
            "acceptance_rates_long_run": [round(float(a), 4) for a in self._long_run],
            "expected_tokens": {k: round(self.expected_tokens(k), 4) for k in range(self.k_max + 1)},
            "tracked_requests": len(self._per_request),
        }
