"""Speculative decoding statistics: tokens per verify step (mean and histogram) and the time of
each phase of a step, for the periodic log line, /get_server_info and /metrics."""

from __future__ import annotations

import time
from collections import deque
from typing import Optional

import torch

from sglang.srt.utils import step_stream

# Phase times are averaged over this many recent steps.
RECENT_STEPS = 256


class SpecStats:
    def __init__(self, k: int):
        self.k = k
        self.num_steps = 0  # speculative steps (one verify each, over a batch)
        self.num_plain_steps = 0  # decode steps that did not speculate
        self.num_verifies = 0  # request-verifies: sum of batch sizes over those steps
        self.num_tokens = 0  # output tokens they produced (accepted drafts + bonus)
        self.num_drafts = 0  # draft tokens they verified (k of each request-verify)
        self.steps_by_k: dict[int, int] = {}  # decode steps per chosen k (0: plain)
        self.histogram = [0] * (k + 1)  # [i]: request-verifies that produced i + 1 tokens
        self.recent_phase_s: deque[dict[str, float]] = deque(maxlen=RECENT_STEPS)
        # Since the last log line.
        self.window_verifies = 0
        self.window_tokens = 0

    def record_step(self, num_out: list[int], phase_seconds: Optional[dict[str, float]], k_step: int) -> None:
        """One speculative step: each request-verify's tokens, and its phase times if timed."""
        self.steps_by_k[k_step] = self.steps_by_k.get(k_step, 0) + 1
        self.num_steps += 1
        self.num_drafts += k_step * len(num_out)
        self.num_verifies += len(num_out)
        self.num_tokens += sum(num_out)
        self.window_verifies += len(num_out)
        self.window_tokens += sum(num_out)
        for n in num_out:
            self.histogram[n - 1] += 1
        if phase_seconds is not None:
            self.recent_phase_s.append(phase_seconds)

    def record_plain_step(self) -> None:
        self.steps_by_k[0] = self.steps_by_k.get(0, 0) + 1
        self.num_plain_steps += 1

    @property
    def mean_accept_length(self) -> float:
        """Tokens per verify, bonus included (upstream's `accept len`)."""
        return self.num_tokens / self.num_verifies if self.num_verifies else 0.0

    def take_window_accept_length(self) -> float:
        """Mean tokens per verify since the last call (for the periodic log line)."""
        mean = self.window_tokens / self.window_verifies if self.window_verifies else 0.0
        self.window_verifies = self.window_tokens = 0
        return mean

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
            "spec_steps": self.num_steps,
            "spec_plain_steps": self.num_plain_steps,
            "spec_verifies": self.num_verifies,
            "spec_tokens": self.num_tokens,
            "avg_spec_accept_length": self.mean_accept_length,
            "spec_accept_rate": ((self.num_tokens - self.num_verifies) / self.num_drafts if self.num_drafts else 0.0),
            "spec_steps_by_k": {str(k): n for k, n in sorted(self.steps_by_k.items())},
            "spec_accept_length_histogram": list(self.histogram),
            "spec_phase_ms": self.mean_phase_ms(),
        }


class PhaseTimer:
    """Wall time of the phases of one step (CUDA events on the GPU, read when the step is done)."""

    def __init__(self, device: str):
        self.cuda = device == "cuda"
        self.marks: list[tuple[str, object]] = [("start", self._now())]

    def _now(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record(step_stream("cuda"))
            return event
        return time.perf_counter()

    def mark(self, name: str) -> None:
        self.marks.append((name, self._now()))

    def seconds(self) -> dict[str, float]:
        """Phase -> seconds; on the GPU only once the step has finished."""
        out = {}
        for (_, a), (name, b) in zip(self.marks, self.marks[1:]):
            out[name] = a.elapsed_time(b) / 1e3 if self.cuda else b - a
        return out
