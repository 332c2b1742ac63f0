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

import json
import math
import statistics
from abc import ABC, abstractmethod
from bisect import bisect_left, bisect_right
from typing import Optional

import numpy as np

POLICY_NAMES = ("always", "never", "threshold", "cost")

# Upstream's default --speculative-adaptive-config (batch-size lower bound -> candidate steps),
# kept for reference in the docs. Our default candidate set is {0, 1, k_max} at every batch size:
# the cost model itself decides where each candidate stops paying off.
DEFAULT_ADAPTIVE_CONFIG = {"1": [1, 3, 5, 7], "8": [0, 1, 3], "32": [0, 1], "64": [0]}

# Global (non-bucket) keys of an adaptive config file, with their checks.
_GLOBAL_KEYS = ("ema_alpha", "warmup_batches", "update_interval")
_BUCKET_OBJECT_KEYS = ("candidate_steps", "up_hysteresis", "down_hysteresis")

# A new request's estimates start from the pooled ones, weighted as this many observations of
# its own: its first verifies move it quickly (running mean), later ones at request_alpha.
_REQUEST_PRIOR_WEIGHT = 4
SMALL_BATCH = 8  # record_verify updates batches up to this size element by element (cheaper there)


class AcceptanceEstimator:
    """Per-position acceptance estimates a_1..a_kmax, where a_i = P(draft token i is accepted |
    drafts 1..i-1 were accepted).

    Conditional per-position rates (rather than one mean accept length) are what let the cost
    policy price every k from the same statistics: E[tokens | k] = 1 + sum_{i<=k} prod_{j<=i} a_j,
    even for a k that has not run lately. The pooled estimate is an EMA over recent verifications
    of all requests; per-request estimates capture that some requests (code, repetition) are much
    easier to draft for than others. A request's estimate starts at new_request_rates (the pooled
    one, or the long-run one where that is higher) and follows a running mean (that start
    weighted as _REQUEST_PRIOR_WEIGHT observations) until that is slower than request_alpha, then
    an EMA at request_alpha: quick to tell a new request apart, yet not so noisy that one request's luck flips the decision (an EMA at 0.2 over one
    request's 0/1 outcomes moves by +-0.17 at a_i = 0.5, which at batch 1 swung the choice
    between k = 0, 1 and k_max every few dozen steps).

    A position the current k does not reach is not observed, and a frozen estimate there can
    starve: on the GPU, a short unlucky stretch pulled the demo pair's pooled a_2 from ~0.8 to
    0.23, the policy moved to k = 1, nothing observed position 2 again, and every later request
    started from 0.23 (k = 1 for the rest of the run, at 0.55-0.97x of always speculating). So
    each step moves the positions it did not observe (pooled, and the batch's own rows) a fraction
    `recovery` of the way up to their target, max(prior, long-run rate), the long-run rate being
    a slow EMA (alpha / 10) of what the position showed whenever it was observed. The estimate
    then climbs back until the policy tries the deeper k and sees for itself; if the position is
    really poor, that costs a dwell's worth of steps every few hundred, near the point where the
    two choices are worth about the same. Estimates above the target are left alone: a position
    the policy values highly is one it uses, and so observes.

    Per-request state lives in numpy rows (a row per tracked request, reused after `forget`), so
    a step's update and the policy's sums cost a few array operations, not a Python loop over
    the batch: at batch 256 that loop cost ~0.3 ms per step, a fifth of a small model's step.
    Up to SMALL_BATCH requests, where the array operations' fixed cost dominates (~40 us a
    step on this project's CPU against ~10 us), a verify is folded in element by element."""

    def __init__(self, k_max: int, alpha: float = 0.05, prior: float = 0.5, request_alpha: float = 0.05,
                 recovery: float = 0.002):
        if k_max < 1:
            raise ValueError(f"k_max must be >= 1, got {k_max}")
        for label, value in (("alpha", alpha), ("request_alpha", request_alpha)):
            if not 0.0 < value <= 1.0:
                raise ValueError(f"{label} must be in (0, 1], got {value}")
        if not 0.0 <= recovery <= 1.0:
            raise ValueError(f"recovery must be in [0, 1], got {recovery}")
        if not 0.0 <= prior <= 1.0:
            raise ValueError(f"prior must be in [0, 1], got {prior}")
        self.k_max = k_max
        self.alpha = alpha
        self.request_alpha = request_alpha
        self.prior = float(prior)  # each rate before any evidence
        self._pooled = [float(prior)] * k_max
        self.recovery = float(recovery)
        self._long_run = np.full(k_max, float(prior))  # slow EMA of each position's observed rate
        # rid -> row of _rates / _seen; a row is created when a request is first observed (from
        # then on its own data refine the pool's guess) and freed when it is forgotten.
        self._per_request: dict[str, int] = {}
        self._free_rows: list[int] = []
        self._rates = np.zeros((16, k_max))
        self._seen = np.zeros((16, k_max))
        self._positions = np.arange(k_max)
        self._last_rids: list[str] = []
        self._last_rows = np.zeros(0, dtype=np.int64)

    @property
    def tracked_requests(self) -> int:
        """Requests with per-request state (should return to 0 once all have been forgotten)."""
        return len(self._per_request)

    def _rows(self, rids: list[str]) -> np.ndarray:
        """Each request's row, made (from the pooled rates) for a request seen the first time.
        Consecutive steps mostly see the same batch: its rows are kept for the next call."""
        if rids == self._last_rids:
            return self._last_rows
        rows = []
        for rid in rids:
            row = self._per_request.get(rid)
            if row is None:
                row = self._new_row()
                self._per_request[rid] = row
            rows.append(row)
        self._last_rids, self._last_rows = list(rids), np.asarray(rows, dtype=np.int64)
        return self._last_rows

    def _new_row(self) -> int:
        if not self._free_rows:
            used = len(self._rates)
            self._rates = np.concatenate([self._rates, np.zeros_like(self._rates)])
            self._seen = np.concatenate([self._seen, np.zeros_like(self._seen)])
            self._free_rows = list(range(2 * used - 1, used - 1, -1))
        row = self._free_rows.pop()
        self._rates[row] = self.new_request_rates()
        self._seen[row] = 0
        return row

    def new_request_rates(self) -> list[float]:
        """What a request not seen yet is expected to accept: per position the larger of the pooled
        and the long-run rate. At small batches the pooled EMA follows the few running requests
        step by step, so one prompt the draft cannot predict pulls it far down within tens of
        steps; judged by it, the requests after a hard one were admitted without the draft (and,
        decoding plainly, never showed otherwise). The long-run rate moves ten times slower: a
        workload that stays hard still brings new requests down with it."""
        return [max(pooled, float(long_run)) for pooled, long_run in zip(self._pooled, self._long_run)]

    def _observe(self, rids: list[str], observed: np.ndarray, accepted: np.ndarray) -> None:
        """Fold outcomes into the requests' estimates: request r observed 0-based positions
        0..observed[r]-1, of which the first accepted[r] were accepted (the rest, at most one,
        rejected)."""
        rows = self._rows(rids)
        width = int(observed.max()) if len(observed) else 0
        if width == 0:
            return
        positions = self._positions[:width]
        mask = positions[None, :] < observed[:, None]
        outcome = (positions[None, :] < accepted[:, None]).astype(np.float64)
        seen = self._seen[rows, :width] + mask
        weight = np.maximum(1.0 / (seen + _REQUEST_PRIOR_WEIGHT), self.request_alpha) * mask
        rates = self._rates[rows, :width]
        self._rates[rows, :width] = rates + weight * (outcome - rates)
        self._seen[rows, :width] = seen

    def _update_pooled(self, position: int, rate: float) -> None:
        """Fold one step's observed rate at 0-based `position` into the pooled and long-run EMAs."""
        self._pooled[position] += self.alpha * (rate - self._pooled[position])
        self._long_run[position] += self.alpha / 10 * (rate - self._long_run[position])

    def _recover(self, rids: list[str], first: int) -> None:
        """0-based positions first.. went unobserved this step: move the pooled estimate and the
        batch's rows a fraction `recovery` of the way up to max(prior, long-run rate)."""
        if first >= self.k_max or not self.recovery:
            return
        target = np.maximum(self._long_run[first:], self.prior)
        for i, goal in enumerate(target.tolist(), start=first):
            if self._pooled[i] < goal:
                self._pooled[i] += self.recovery * (goal - self._pooled[i])
        rows = self._rows(rids)
        block = self._rates[rows, first:]
        self._rates[rows, first:] = block + self.recovery * np.maximum(target[None, :] - block, 0.0)

    def record_verify(self, rids: list[str], num_out: list[int], k_step: int) -> None:
        """One speculative step with k_step drafts: request rids[r] produced num_out[r] tokens
        (1..k_step + 1). Position i was observed iff num_out >= i (every earlier draft was
        accepted) and accepted iff num_out >= i + 1; unobserved positions say nothing.

        The pooled EMA takes the whole batch as one observation per position (accepted / observed
        in this batch), so one 256-request step moves it as much as a 1-request step does: the
        estimate's memory is in steps, independent of the batch size."""
        if len(rids) != len(num_out):
            raise ValueError(f"record_verify: {len(rids)} request ids but {len(num_out)} output counts")
        if not 0 <= k_step <= self.k_max:
            raise ValueError(f"record_verify: k_step {k_step} is outside 0..{self.k_max}")
        if k_step == 0 or not rids:
            return
        if len(rids) <= SMALL_BATCH:
            self._record_verify_small(rids, num_out, k_step)
            return
        n = np.asarray(num_out, dtype=np.int64)
        bad = np.flatnonzero((n < 1) | (n > k_step + 1))
        if len(bad):
            self._bad_verify(rids[int(bad[0])], int(n[bad[0]]), k_step)
        # Positions 1..min(n, k_step) were observed; the first n - 1 of them were accepted.
        self._observe(rids, np.minimum(n, k_step), n - 1)
        # Position i is observed by the requests with num_out >= i, accepted by those with >= i + 1.
        at_least = np.bincount(n, minlength=k_step + 2)[::-1].cumsum()[::-1]
        for i in range(1, k_step + 1):
            observed, accepted = at_least[i], at_least[i + 1]
            if observed:
                self._update_pooled(i - 1, accepted / observed)
        self._recover(rids, k_step)

    def _record_verify_small(self, rids: list[str], num_out: list[int], k_step: int) -> None:
        """record_verify for a few requests, element by element: the same updates as the array
        path (a test holds them equal), without its twenty-odd array operations, which cost a
        one-request step ~40 us of host time on a small model whose whole step takes ~0.8 ms."""
        for rid, n in zip(rids, num_out):
            if not 1 <= n <= k_step + 1:
                self._bad_verify(rid, int(n), k_step)
        rows = self._rows(rids).tolist()  # first: a new row may reallocate the arrays
        rates, seen, request_alpha = self._rates, self._seen, self.request_alpha
        observed = [0] * k_step
        accepted = [0] * k_step
        for row, n in zip(rows, num_out):
            for i in range(min(n, k_step)):
                hit = i < n - 1
                count = float(seen[row, i]) + 1.0
                rate = float(rates[row, i])
                rates[row, i] = rate + max(1.0 / (count + _REQUEST_PRIOR_WEIGHT), request_alpha) * (hit - rate)
                seen[row, i] = count
                observed[i] += 1
                accepted[i] += hit
        for i in range(k_step):
            if observed[i]:
                self._update_pooled(i, accepted[i] / observed[i])
        self._recover(rids, k_step)

    @staticmethod
    def _bad_verify(rid: str, n: int, k_step: int) -> None:
        raise ValueError(f"record_verify: request {rid!r} produced {n} tokens from {k_step} drafts "
                         f"(expected 1..{k_step + 1})")

    def record_probe(self, rids: list[str], hits: list[bool]) -> None:
        """A PLAIN step's free probe: whether the draft's top-1 proposal equalled the target's
        token. It observes position 1 only, and keeps a_1 current while speculation is off, which
        is what tells the cost policy when turning it back on would pay."""
        if len(rids) != len(hits):
            raise ValueError(f"record_probe: {len(rids)} request ids but {len(hits)} probe results")
        if not rids:
            return
        accepted = np.asarray(hits, dtype=np.int64)
        self._observe(rids, np.ones(len(rids), dtype=np.int64), accepted)
        self._update_pooled(0, float(accepted.mean()))
        self._recover(rids, 1)

    def rates(self, rid: Optional[str] = None) -> list[float]:
        """a_1..a_kmax for the request (new_request_rates for one not seen yet), or the pooled
        rates for None."""
        if rid is None:
            return list(self._pooled)
        row = self._per_request.get(rid)
        return self.new_request_rates() if row is None else self._rates[row].tolist()

    def expected_tokens(self, k: int, rid: Optional[str] = None) -> float:
        """Expected tokens one verify of k drafts yields: 1 + sum_{i<=k} prod_{j<=i} a_j (the
        bonus token plus each draft, which counts only if all before it were accepted)."""
        if not 0 <= k <= self.k_max:
            raise ValueError(f"expected_tokens: k {k} is outside 0..{self.k_max}")
        prod = expected = 1.0
        for a in self.rates(rid)[:k]:
            prod *= a
            expected += prod
        return expected

    def batch_expected_tokens(self, rids: list[str], k: int) -> list[float]:
        """Sum over the batch of expected_tokens(k', rid) for every k' in 0..k: what the cost
        policy needs each step, in a few array operations."""
        if k == 0 or not rids:
            return [float(len(rids))] + [float(len(rids))] * k
        if len(rids) <= SMALL_BATCH:
            return self._batch_expected_tokens_small(rids, k)
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

    def _batch_expected_tokens_small(self, rids: list[str], k: int) -> list[float]:
        """batch_expected_tokens for a few requests in plain Python: the array path's half-dozen
        numpy calls cost a small batch more than its few multiplications."""
        chains, new_rates = [0.0] * k, None
        for rid in rids:
            row = self._per_request.get(rid)
            if row is None:
                new_rates = new_rates or self.new_request_rates()
                rates = new_rates
            else:
                rates = self._rates[row].tolist()
            prod = 1.0
            for i in range(k):
                prod *= rates[i]
                chains[i] += prod
        totals, running = [float(len(rids))], float(len(rids))
        for chain in chains:
            running += chain
            totals.append(running)
        return totals

    def forget(self, rid: str) -> None:
        """The request finished: drop its state, so long-running servers do not leak."""
        row = self._per_request.pop(rid, None)
        if row is not None:
            self._free_rows.append(row)
            self._last_rids, self._last_rows = [], np.zeros(0, dtype=np.int64)  # that row may be reused

    def summary(self) -> dict:
        return {
            "acceptance_rates": [round(a, 4) for a in self._pooled],
            "acceptance_rates_long_run": [round(float(a), 4) for a in self._long_run],
            "expected_tokens": {k: round(self.expected_tokens(k), 4) for k in range(self.k_max + 1)},
            "tracked_requests": len(self._per_request),
        }


class CostTable:
    """Measured seconds per decode step: plain[bs] for a PLAIN step and spec[(bs, k)] for a
    speculative step of k drafts (draft + verify + draft extend), at the captured batch-size
    buckets. Measured by replaying the captured graphs at start-up, since the ratio of the two
    depends on model, GPU and batch size in ways no formula gets right."""

    def __init__(self, plain: dict[int, float], spec: dict[tuple[int, int], float],
                 context_seconds: Optional[dict[int, float]] = None):
        """context_seconds[k]: seconds a step of k drafts adds per token of context in the batch
        (its attention reading the KV cache), which the start-up replays on an empty scratch
        row do not see: at batch 128 with 1k-token contexts the target's KV read is larger than
        its weights, and plain and speculative steps pay it alike (a verify reads each
        request's KV once), so leaving it out overstates what speculation costs there."""
        by_k: dict[int, dict[int, float]] = {0: dict(plain)} if plain else {}
        for (bs, k), seconds in spec.items():
            if k < 1:
                raise ValueError(f"CostTable: spec entry ({bs}, {k}) must have k >= 1 (k = 0 is the plain table)")
            by_k.setdefault(k, {})[bs] = seconds
        for k, table in by_k.items():
            for bs, seconds in table.items():
                if bs < 1 or not seconds > 0:
                    raise ValueError(f"CostTable: k={k} batch size {bs}: need batch size >= 1 and seconds > 0, "
                                     f"got {seconds}")
        self.context_seconds = dict(context_seconds or {})
        for k, seconds in self.context_seconds.items():
            if k not in by_k or not seconds >= 0:
                raise ValueError(f"CostTable: context seconds for k={k} need a measured step time and a value "
                                 f">= 0, got {seconds}")
        # k -> (sorted bucket sizes, their seconds), for a bisect per lookup. A step replays the
        # graph of the smallest bucket >= its batch, so a step's true cost cannot fall as the
        # bucket grows: a bucket measured slower than a larger one is timing noise, and takes the
        # larger one's time.
        self._buckets = {}
        for k, table in by_k.items():
            sizes = sorted(table)
            times = [table[bs] for bs in sizes]
            for i in range(len(times) - 2, -1, -1):
                times[i] = min(times[i], times[i + 1])
            self._buckets[k] = (sizes, times)

    @property
    def measured_steps(self) -> tuple[int, ...]:
        """Every k with at least one measurement (0 = plain)."""
        return tuple(sorted(self._buckets))

    def bucket(self, batch_size: int, k: int) -> int:
        """The measured bucket a step of k drafts at this batch size is priced by (the largest
        one beyond the table)."""
        sizes = self._buckets[k][0]
        return sizes[min(bisect_left(sizes, batch_size), len(sizes) - 1)]

    def seconds(self, batch_size: int, k: int, context_tokens: int = 0) -> float:
        """Seconds of one step of k drafts (0 = plain) at this batch size: the smallest measured
        bucket >= batch_size (the graph that would be replayed, padded), plus the KV read of
        `context_tokens` (the batch's summed context). Beyond the largest bucket there is no
        graph; the largest bucket's time is scaled by batch_size / largest, an extrapolation
        that assumes compute-bound steps there (linear in tokens)."""
        entry = self._buckets.get(k)
        if entry is None:
            raise ValueError(f"CostTable: no measured step time for k={k} "
                             f"(measured k: {list(self.measured_steps)})")
        if batch_size < 1:
            raise ValueError(f"CostTable: batch size must be >= 1, got {batch_size}")
        sizes, times = entry
        i = bisect_left(sizes, batch_size)
        step = times[i] if i < len(sizes) else times[-1] * batch_size / sizes[-1]
        return step + context_tokens * self.context_seconds.get(k, 0.0)

    def summary(self) -> dict:
        """{"plain_ms": {bs: ms}, "spec_ms": {k: {bs: ms}}} for logs and /get_server_info."""
        def ms(k: int) -> dict[int, float]:
            sizes, times = self._buckets[k]
            return {bs: round(1e3 * t, 4) for bs, t in zip(sizes, times)}

        return {"plain_ms": ms(0) if 0 in self._buckets else {},
                "spec_ms": {k: ms(k) for k in self.measured_steps if k > 0},
                "context_ns_per_token": {k: round(1e9 * s, 4) for k, s in sorted(self.context_seconds.items())}}


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

    def choose(self, rids: list[str], context_tokens: int = 0, num_plain_only: int = 0, explore: bool = False) -> int:
        """k for the next decode step of this batch; 0 = PLAIN. rids: its decode requests that may
        speculate; num_plain_only: those that opted out (one token a step whatever k is);
        context_tokens: the summed context length of all of them. A batch with no request that
        may speculate decodes plainly. `explore`: where the policy would decode plainly, take its
        cheapest speculative step instead (to measure acceptance; the scheduler asks for it)."""
        k = 0 if num_plain_only and not rids else self._choose(rids, context_tokens, num_plain_only)
        if explore and k == 0 and rids:
            k = self._explore_k(len(rids) + num_plain_only)
        if k == self.current_k:
            self.steps_in_current += 1
        else:
            if self.current_k is not None:
                self.num_switches += 1
            self.current_k = k
            self.steps_in_current = 1
        self.steps_per_k[k] = self.steps_per_k.get(k, 0) + 1
        return k

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

    def observe_host_seconds(self, batch_size: int, k: int, seconds: float) -> None:
        """The scheduler's own time for one pipelined decode step of k drafts at this batch size
        (the server loop's whole iteration; waits for the device excluded). Only the cost
        policy keeps it, for its summary."""

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
HOST_ALPHA = 0.05  # EMA weight of each new host-time sample
HOST_FIRST_SAMPLES = 5  # a host-time estimate starts from the median of this many samples


def _bucket_lookup(keys: list[int], table: dict, batch_size: int, default):
    """The entry with the largest key <= batch_size (keys sorted), else default."""
    i = bisect_right(keys, batch_size)
    return table[keys[i - 1]] if i else default


class CostPolicy(SpecPolicy):
    """Pick the k with the most expected tokens per second at this batch:
    sum over requests of expected_tokens(k, rid) / seconds(batch size, k).

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

    def __init__(self, candidates: list[int], cost: CostTable, estimator: AcceptanceEstimator,
                 hysteresis: float = 0.05, min_dwell: int = 8,
                 candidates_by_bs: Optional[dict[int, list[int]]] = None,
                 hysteresis_by_bs: Optional[dict[int, dict[str, float]]] = None):
        super().__init__(estimator.k_max, estimator)
        if hysteresis < 0:
            raise ValueError(f"hysteresis must be >= 0, got {hysteresis}")
        if min_dwell < 1:
            raise ValueError(f"min_dwell must be >= 1, got {min_dwell}")
        self.candidates = _checked_candidates(candidates, estimator.k_max, "candidates")
        self.candidates_by_bs = {bs: _checked_candidates(steps, estimator.k_max, f"candidates_by_bs[{bs}]")
                                 for bs, steps in sorted((candidates_by_bs or {}).items())}
        self._bs_keys = list(self.candidates_by_bs)
        self.hysteresis = hysteresis
        self.hysteresis_by_bs = dict(sorted((hysteresis_by_bs or {}).items()))
        self._hyst_keys = list(self.hysteresis_by_bs)
        self.min_dwell = min_dwell
        self.cost = cost
        # Fail at start-up, not at the first decode step that would reach a missing k.
        needed = set(self.candidates).union(*self.candidates_by_bs.values())
        missing = sorted(needed - set(cost.measured_steps))
        if missing:
            raise ValueError(f"CostPolicy: the cost table has no step time for k in {missing} "
                             f"(measured k: {list(cost.measured_steps)})")
        # The objective at the last step that evaluated it (steps held by dwell do not), for
        # logs and tests.
        self.last_objective: dict[int, float] = {}
        # One grouping of batch sizes into buckets for every k: the largest k's.
        self._grouping_k = cost.measured_steps[-1]
        self._evaluated_key: Optional[tuple] = None  # (graph bucket, candidate set) of the last evaluation
        # (bucket, speculative?) -> EMA of the host's seconds per pipelined step, and the first
        # samples of a key until there are enough to start it (observe_host_seconds).
        self._host_seconds: dict[tuple[int, bool], float] = {}
        self._host_first: dict[tuple[int, bool], list[float]] = {}

    def candidates_for(self, batch_size: int) -> list[int]:
        return _bucket_lookup(self._bs_keys, self.candidates_by_bs, batch_size, self.candidates)

    def objective(self, rids: list[str], candidates: list[int], context_tokens: int = 0,
                  num_plain_only: int = 0) -> dict[int, float]:
        """Expected tokens per second of each candidate for this batch (requests that opted out
        of speculation add one token and their share of the step's cost)."""
        bs = len(rids) + num_plain_only
        totals = self.estimator.batch_expected_tokens(rids, max(candidates))
        return {k: (totals[k] + num_plain_only) / self.seconds(bs, k, context_tokens) for k in candidates}

    def seconds(self, batch_size: int, k: int, context_tokens: int = 0) -> float:
        """What a step of k drafts takes, from the cost table's device times.

        The host's own time per step is measured (observe_host_seconds, `host_ms` in the
        summary) but not priced. On a host-bound small model (the demo pair on an H200, session
        8) the steady-step host times misstated what a step costs the server: 0.29 ms plain and
        0.95 ms speculative at batch 4, where the sweeps' throughput gives 0.56 and 1.32 ms of
        wall time per step. Priced at those, the policy admitted 576 of ~8400 prompts without
        the draft, although always speculating was 27% faster than not at that load; kept per
        k, one slow early sample held k = 3 off for a whole level. The device times
        favour more tokens per step whenever acceptance is good, which is what the host-bound
        server needs too (its cost is mostly per step and per request, not per token)."""
        return self.cost.seconds(batch_size, k, context_tokens)

    def observe_host_seconds(self, batch_size: int, k: int, seconds: float) -> None:
        """One host-time sample, kept per bucket for plain and for speculative steps (pooled over
        k) and shown as `host_ms`: next to the table's device times it tells whether the server
        is bound by the host. An estimate starts at the median of its first HOST_FIRST_SAMPLES
        samples (the first steps at a new shape carry one-off work), then follows an EMA."""
        if k not in self.cost.measured_steps or batch_size < 1 or not 0 < seconds < math.inf:
            return
        key = self.cost.bucket(batch_size, self._grouping_k), k > 0
        previous = self._host_seconds.get(key)
        if previous is not None:
            self._host_seconds[key] = previous + HOST_ALPHA * (seconds - previous)
            return
        first = self._host_first.setdefault(key, [])
        first.append(seconds)
        if len(first) == HOST_FIRST_SAMPLES:
            self._host_seconds[key] = statistics.median(first)
            del self._host_first[key]

    def _margin(self, batch_size: int, current: int, best: int) -> float:
        margins = _bucket_lookup(self._hyst_keys, self.hysteresis_by_bs, batch_size, {})
        return margins.get("up" if best > current else "down", self.hysteresis)

    def _choose(self, rids: list[str], context_tokens: int, num_plain_only: int) -> int:
        cur = self.current_k
        if not rids:  # nothing to decode: no evidence either way
            return cur if cur is not None else self.candidates[0]
        bs = len(rids) + num_plain_only
        candidates = self.candidates_for(bs)
        # Batch sizes that replay the same graphs cost the same per step, so within a bucket (and
        # candidate set) only the requests' estimates move the choice, by alpha per step.
        key = (self.cost.bucket(bs, self._grouping_k), id(candidates))
        if cur is not None and cur in candidates:
            if self.steps_in_current < self.min_dwell:
                return cur
            # Past the dwell, an unchanged bucket is re-evaluated every REEVALUATE_EVERY steps: the
            # objective costs the host ~10-30 us, a few percent of a small model's step. A batch
            # that grows or shrinks by a request within its bucket (at concurrency 4, every few
            # steps) is no reason to evaluate afresh.
            if key == self._evaluated_key and self.steps_in_current % REEVALUATE_EVERY:
                return cur
        self._evaluated_key = key
        obj = self.objective(rids, candidates, context_tokens, num_plain_only)
        self.last_objective = obj
        best = _best(obj)
        if cur is None or cur not in candidates:
            return best
        if best != cur and obj[best] > obj[cur] * (1.0 + self._margin(bs, cur, best)):
            return best
        return cur

    def _would_speculate(self, rids: list[str], context_tokens: int, num_plain_only: int) -> bool:
        candidates = self.candidates_for(len(rids) + num_plain_only)
        return _best(self.objective(rids, candidates, context_tokens, num_plain_only)) > 0

    def _explore_k(self, batch_size: int) -> int:
        return min((k for k in self.candidates_for(batch_size) if k > 0), default=self.k_max)

    def _at_prior(self, batch_size: int, context_tokens: int) -> bool:
        # Every request at the prior: 1 + p + ... + p^k tokens per verify of k drafts.
        prior = self.estimator.prior
        return _best({k: batch_size * sum(prior ** i for i in range(k + 1)) / self.seconds(batch_size, k, context_tokens)
                      for k in self.candidates_for(batch_size)}) > 0

    def summary(self) -> dict:
        return {**super().summary(), "candidates": self.candidates,
                "candidates_by_bs": self.candidates_by_bs, "hysteresis": self.hysteresis,
                "min_dwell": self.min_dwell, "cost": self.cost.summary(),
                "host_ms": {mode: {bs: round(1e3 * t, 4) for (bs, spec), t in sorted(self._host_seconds.items())
                                   if spec == (mode == "spec")}
                            for mode in ("plain", "spec")}}


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


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _parse_steps(path: str, key: str, steps) -> list[int]:
    where = f"--speculative-adaptive-config {path}: batch size {key!r}"
    if not isinstance(steps, list):
        raise ValueError(f"{where}: candidate steps must be a list of integers, got {steps!r}")
    if not steps:
        raise ValueError(f"{where}: the candidate step list is empty")
    for k in steps:
        if not _is_int(k) or k < 0:
            raise ValueError(f"{where}: candidate step {k!r} is not a non-negative integer")
    return sorted(set(steps))


def _parse_bucket(path: str, key: str, value) -> tuple[list[int], dict[str, float]]:
    """A bucket's value: a list of steps, or {"candidate_steps": [...], "up_hysteresis": x,
    "down_hysteresis": y} with the margins optional."""
    if not isinstance(value, dict):
        return _parse_steps(path, key, value), {}
    where = f"--speculative-adaptive-config {path}: batch size {key!r}"
    unknown = sorted(set(value) - set(_BUCKET_OBJECT_KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown} (allowed: {list(_BUCKET_OBJECT_KEYS)})")
    if "candidate_steps" not in value:
        raise ValueError(f"{where}: the object needs \"candidate_steps\"")
    margins = {}
    for name in ("up_hysteresis", "down_hysteresis"):
        if name in value:
            margin = value[name]
            if not isinstance(margin, (int, float)) or isinstance(margin, bool) or margin < 0:
                raise ValueError(f"{where}: {name} must be a number >= 0, got {margin!r}")
            margins[name.split("_")[0]] = float(margin)
    return _parse_steps(path, key, value["candidate_steps"]), margins


def _parse_global(path: str, key: str, value):
    where = f"--speculative-adaptive-config {path}: {key}"
    if key == "ema_alpha":
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value <= 1:
            raise ValueError(f"{where} must be a number in (0, 1], got {value!r}")
        return float(value)
    lowest = 0 if key == "warmup_batches" else 1
    if not _is_int(value) or value < lowest:
        raise ValueError(f"{where} must be an integer >= {lowest}, got {value!r}")
    return value


def parse_adaptive_config(path: str) -> dict:
    """Read an upstream-style --speculative-adaptive-config JSON file.

    Integer-string keys are batch-size lower bounds, each mapping to a list of candidate steps
    or to {"candidate_steps": [...], "up_hysteresis": x, "down_hysteresis": y}; the other keys
    are global settings (ema_alpha, warmup_batches, update_interval). The margins are relative
    objective gains needed to move to a larger ("up") or smaller ("down") k at that batch size. Returns
    {"candidates_by_bs": {bs: [k, ...]}, "hysteresis_by_bs": {bs: {"up": x, "down": y}} (only
    buckets that set a margin), "ema_alpha", "warmup_batches", "update_interval" (None when
    absent)}. ema_alpha feeds the estimator; warmup_batches and update_interval are validated and
    returned for the caller, since upstream configs carry them. Every problem is a ValueError
    naming the file and the offending key or value, because the file is read at start-up and a
    vague error there costs a restart."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ValueError(f"--speculative-adaptive-config {path}: cannot read the file ({e})") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"--speculative-adaptive-config {path}: invalid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"--speculative-adaptive-config {path}: expected a JSON object, got "
                         f"{type(raw).__name__}")
    out: dict = {"candidates_by_bs": {}, "hysteresis_by_bs": {},
                 **{key: None for key in _GLOBAL_KEYS}}
    for key, value in raw.items():
        if key in _GLOBAL_KEYS:
            out[key] = _parse_global(path, key, value)
            continue
        try:
            bs = int(key)
        except ValueError:
            try:
                float(key)
            except ValueError:
                raise ValueError(f"--speculative-adaptive-config {path}: unknown key {key!r} (batch-size "
                                 f"keys are positive integers; global keys: {list(_GLOBAL_KEYS)})") from None
            bs = None
        if bs is None or bs < 1:
            raise ValueError(f"--speculative-adaptive-config {path}: batch-size key {key!r} is not a "
                             "positive integer")
        steps, margins = _parse_bucket(path, key, value)
        out["candidates_by_bs"][bs] = steps
        if margins:
            out["hysteresis_by_bs"][bs] = margins
    if not out["candidates_by_bs"]:
        raise ValueError(f"--speculative-adaptive-config {path}: no batch-size keys (e.g. \"1\": [0, 1, 3])")
    out["candidates_by_bs"] = dict(sorted(out["candidates_by_bs"].items()))
    return out


def make_policy(name: str, k_max: int, *, threshold: Optional[int] = None,
                candidates: Optional[list[int]] = None,
                candidates_by_bs: Optional[dict[int, list[int]]] = None,
                cost: Optional[CostTable] = None, ema_alpha: Optional[float] = None,
                hysteresis: float = 0.05, min_dwell: int = 8,
                hysteresis_by_bs: Optional[dict[int, dict[str, float]]] = None) -> SpecPolicy:
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
            raise ValueError("--speculative-policy threshold needs --speculative-threshold N >= 0 "
                             f"(speculate while the decode batch has at most N requests), got {threshold}")
        return ThresholdPolicy(k_max, threshold, estimator)
    if cost is None:
        raise ValueError("--speculative-policy cost needs a measured cost table (step times of the "
                         "captured graphs); none was given")
    if candidates is None:
        candidates = sorted({0, 1, k_max})
    if not candidates:
        raise ValueError("--speculative-candidate-steps: the list is empty")
    for k in candidates:
        if not _is_int(k) or not 0 <= k <= k_max:
            raise ValueError(f"--speculative-candidate-steps: {k!r} is outside 0..{k_max} "
                             f"(k_max = --speculative-num-steps = {k_max})")
    for bs, steps in (candidates_by_bs or {}).items():
        for k in steps:
            if not _is_int(k) or not 0 <= k <= k_max:
                raise ValueError(f"--speculative-adaptive-config: batch size {bs} lists step {k!r}, outside "
                                 f"0..{k_max} (k_max = --speculative-num-steps = {k_max})")
    return CostPolicy(candidates, cost, estimator, hysteresis=hysteresis, min_dwell=min_dwell,
                      candidates_by_bs=candidates_by_bs, hysteresis_by_bs=hysteresis_by_bs)
