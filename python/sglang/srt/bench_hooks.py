"""Benchmark and diagnosis switches, all behind this one seam: environment variables read once
when a process starts (`from_env`), into a frozen BenchHooks that is passed to whatever needs it.
Each is off by default and then costs nothing: the runtime asks a field set at start-up, never the
environment. None of them changes what a server computes for a user unless named so
(simulated acceptance, draft-follows-all)."""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Mapping, Optional

logger = logging.getLogger(__name__)

# SGLANG_DRAFT_FOLLOWS_ALL=1: the draft reads every prompt (a request that opted out aside), whatever
# the policy says. A `--speculative-policy never` server then runs, on every step, the plain step of
# requests the draft follows (warm: with the draft's one-token extend; catch-up: with the aux states
# kept), which is what the cost policy's k = 0 costs a server that speculates at times.
DRAFT_FOLLOWS_ALL_ENV = "SGLANG_DRAFT_FOLLOWS_ALL"
# SGLANG_SPEC_COST_LOG=PREFIX: each scheduler writes PREFIX.<pid>.txt, one line per decode launch
# ("L time batch_size k context exploration_steps"), other launch ("P time"), cost sample fed to the
# policy ("S batch_size k context seconds") and processed decode step ("V k requests tokens"): what
# the policy saw and chose, for replaying policies offline (sglang.benchmark.cost_log_report). About
# a microsecond of host time per line.
COST_LOG_ENV = "SGLANG_SPEC_COST_LOG"
# SGLANG_SPEC_EXPLORE_EVERY=N: the cost policy runs every other candidate for a burst once N decode
# steps have passed since it last ran at the batch's bucket, up to half of the steps: every k's cost
# measured beside the others' all the time, for the cost log. It costs what the candidates are worse
# by, on a third or more of the steps.
EXPLORE_EVERY_ENV = "SGLANG_SPEC_EXPLORE_EVERY"
# SGLANG_SIMULATE_ACC_LEN=A (upstream's name): verification accepts each draft token at the
# per-position rate whose expected accept length is A, whatever the models say (policies measured
# on random weights); requests may ask for their own (sampling parameter simulated_accept_length).
SIMULATE_ACC_LEN_ENV = "SGLANG_SIMULATE_ACC_LEN"
# SGLANG_STEP_TIMES=PREFIX: the scheduler loop times its phases per step (managers/step_times.py).
STEP_TIMES_ENV = "SGLANG_STEP_TIMES"
# SGLANG_SCHEDULER_PROFILE=PREFIX: the scheduler loop runs under cProfile (scheduler_process.BusyProfiler).
PROFILE_ENV = "SGLANG_SCHEDULER_PROFILE"
# SGLANG_STREAM_EVERY_STEP=1: the tokenizer manager reads one message per wake, so every stream sends
# each step on its own however far behind it is (the front end before coalescing, for A/B runs).
STREAM_EVERY_STEP_ENV = "SGLANG_STREAM_EVERY_STEP"


@dataclasses.dataclass(frozen=True)
class BenchHooks:
    """The switches as read at start-up (the defaults: all off)."""

    draft_follows_all: bool = False  # DRAFT_FOLLOWS_ALL_ENV; read by SpecScheduling
    cost_log_prefix: Optional[str] = None  # COST_LOG_ENV; read by SpecScheduling
    explore_every: Optional[int] = None  # EXPLORE_EVERY_ENV (decode steps); read by SpecScheduling
    simulated_accept_length: Optional[float] = None  # SIMULATE_ACC_LEN_ENV; read by the worker and requests' checks
    step_times_prefix: Optional[str] = None  # STEP_TIMES_ENV; read by the scheduler process
    profile_prefix: Optional[str] = None  # PROFILE_ENV; read by the scheduler process
    stream_every_step: bool = False  # STREAM_EVERY_STEP_ENV; read by the tokenizer manager

    @property
    def simulates_acceptance(self) -> bool:
        return self.simulated_accept_length is not None


OFF = BenchHooks()


def from_env(environ: Mapping[str, str] = os.environ) -> BenchHooks:
    """The switches set in `environ`; a malformed value fails the start-up naming its variable."""
    return BenchHooks(
        draft_follows_all=environ.get(DRAFT_FOLLOWS_ALL_ENV) == "1",
        cost_log_prefix=environ.get(COST_LOG_ENV) or None,
        explore_every=_explore_every(environ.get(EXPLORE_EVERY_ENV)),
        simulated_accept_length=_simulated_accept_length(environ.get(SIMULATE_ACC_LEN_ENV)),
        step_times_prefix=environ.get(STEP_TIMES_ENV) or None,
        profile_prefix=environ.get(PROFILE_ENV) or None,
        stream_every_step=environ.get(STREAM_EVERY_STEP_ENV) == "1",
    )


def _explore_every(value: Optional[str]) -> Optional[int]:
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{EXPLORE_EVERY_ENV}={value!r}: need a whole number of decode steps >= 1")
    return int(value)


def _simulated_accept_length(value: Optional[str]) -> Optional[float]:
    """A negative value (or none) leaves the simulation off, as upstream's variable does."""
    try:
        length = float(value or "-1")
    except ValueError:
        raise ValueError(f"{SIMULATE_ACC_LEN_ENV}={value!r}: need an accept length (a number)") from None
    return length if length >= 0 else None


def open_cost_log(prefix: Optional[str]):
    """The cost log (COST_LOG_ENV) at PREFIX.<pid>.txt, line-buffered, or None where it is not asked
    for; an unwritable path fails the start-up with the reason."""
    if not prefix:
        return None
    path = f"{prefix}.{os.getpid()}.txt"
    try:
        log = open(path, "w", buffering=1)  # line-buffered: a killed server loses nothing
    except OSError as e:
        raise ValueError(f"{COST_LOG_ENV}={prefix}: cannot write {path}: {e}") from e
    logger.warning(
        "%s: every decode launch and cost sample is written to %s (for benchmarks only: about a "
        "microsecond of host time per step)",
        COST_LOG_ENV,
        path,
    )
    return log
