"""Speculative decoding statistics: tokens per verify step (mean and histogram) and the time of
each phase of a step, for the periodic log line, /get_server_info and /metrics."""

from __future__ import annotations

from collections import Counter, deque
from typing import Optional


# Phase times are averaged over this many recent steps.
RECENT_STEPS = 256


class SpecStats:
    def __init__(self, k: int):
        self.k = k
        self.steps_by_k: Counter[int] = Counter()  # decode steps per chosen k (0: plain)
        self.num_verifies = 0  # request-verifies: sum of batch sizes over the speculative steps
        self.num_tokens = 0  # output tokens they produced (accepted drafts + bonus)
        self.num_drafts = 0  # draft tokens they verified (k of each request-verify)
        self.histogram = [0] * (k + 1)  # [i]: request-verifies that produced i + 1 tokens
        self.recent_phase_s: deque[dict[str, float]] = deque(maxlen=RECENT_STEPS)
        self._logged = (0, 0)  # (num_verifies, num_tokens) at the last log line

    def record_step(self, num_out: list[int], phase_seconds: Optional[dict[str, float]], k_step: int) -> None:
        """One speculative step: each request-verify's tokens, and its phase times if timed."""
        self.steps_by_k[k_step] += 1
        self.num_drafts += k_step * len(num_out)
        self.num_verifies += len(num_out)
        self.num_tokens += sum(num_out)
        for n in num_out:
            self.histogram[n - 1] += 1
        if phase_seconds is not None:
            self.recent_phase_s.append(phase_seconds)

    def record_plain_step(self) -> None:
        self.steps_by_k[0] += 1

    def take_window_accept_length(self) -> float:
        """Mean tokens per verify since the last call (for the periodic log line)."""
        verifies, tokens = self.num_verifies - self._logged[0], self.num_tokens - self._logged[1]
        self._logged = (self.num_verifies, self.num_tokens)
        return tokens / verifies if verifies else 0.0

    def mean_phase_ms(self) -> dict[str, float]:
        """Mean ms per recent step of each phase (draft / verify / extend, or `step` for a graph)."""
        totals: dict[str, list[float]] = {}
        for phases in self.recent_phase_s:
            for name, seconds in phases.items():
                totals.setdefault(name, []).append(seconds)
        return {name: 1e3 * sum(values) / len(values) for name, values in totals.items()}

    def summary(self) -> dict:
        return {
            "speculative_num_steps": self.k,
            "spec_steps": self.steps_by_k.total() - self.steps_by_k[0],
            "spec_plain_steps": self.steps_by_k[0],
            "spec_verifies": self.num_verifies,
            "spec_tokens": self.num_tokens,
            # Tokens per verify, bonus included (upstream's `accept len`).
            "avg_spec_accept_length": self.num_tokens / self.num_verifies if self.num_verifies else 0.0,
            "spec_accept_rate": ((self.num_tokens - self.num_verifies) / self.num_drafts if self.num_drafts else 0.0),
            "spec_steps_by_k": {str(k): n for k, n in sorted(self.steps_by_k.items())},
            "spec_accept_length_histogram": list(self.histogram),
            "spec_phase_ms": self.mean_phase_ms(),
        }
