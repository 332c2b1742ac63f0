"""Which waiting requests run next: the order (fcfs / lpm), the budget of one prefill step, and
when waiting requests are worth a prefill step at all (admission batching)."""

from __future__ import annotations

import time
from collections import deque
from typing import Callable, Optional

from sglang.srt.managers.kv_manager import KVManager
from sglang.srt.managers.schedule_batch import Req

# Longest-prefix-match costs one radix walk per waiting request; past this many, use fcfs.
LPM_MAX_QUEUE = 128
# KV kept back for the decode steps of admitted requests: this share of their remaining
# output, each counted up to the clip. Retraction covers the rest if the guess is short.
DECODE_RESERVE_RATIO = 0.4
DECODE_RESERVE_CLIP = 256


class SchedulePolicy:
    def __init__(self, policy: str, kv_manager: KVManager):
        self.policy = policy
        self.kv_manager = kv_manager

    def order(self, waiting: list[Req], running: list[Req] = ()) -> list[Req]:
        if self.policy == "lpm" and len(waiting) <= LPM_MAX_QUEUE:
            # Stable sort: among equal prefixes, arrival order is kept.
            waiting = sorted(waiting, key=lambda r: -self.kv_manager.cached_prefix_len(r))
        return fair_order(waiting, running)


def fair_order(waiting, running) -> list[Req]:
    """`waiting` with each client request's sequences (its prompts x n, `Req.group`) taking turns:
    a sequence goes ahead of those whose request already runs or waits ahead with more of its
    own. So a request that fans out to many sequences cannot hold back the ones that arrive after
    it: each of those waits for at most one of its sequences per request ahead, not for all of them.
    Order among equals (and the whole order, when no request has two sequences) is kept."""
    if len(waiting) <= 1:
        return list(waiting)
    share: dict[str, int] = {}
    for req in running:
        share[req.group] = share.get(req.group, 0) + 1
    keys = []
    for req in waiting:
        count = share.get(req.group, 0)
        share[req.group] = count + 1
        keys.append(count)
    if not any(keys):
        return list(waiting)
    return [req for _, _, req in sorted(zip(keys, range(len(keys)), waiting), key=lambda item: item[:2])]


# Admission batching (--admission-batch-steps): with fewer running requests than this, every
# arrival is admitted at once; with more, arrivals wait until this share of the running number
# is waiting (or as many as the largest prefill graph takes, or a prefill budget of tokens).
ADMISSION_BATCH_MIN_RUNNING = 32
ADMISSION_BATCH_RUNNING_PER_WAITING = 16
ADMISSION_BATCH_MAX_REQS = 16


class AdmissionBatcher:
    """Whether the waiting requests should wait for more to share their prefill pass.

    A prefill pass costs the host about as much for one request as for several (on the small demo
    pair ~1.9 ms for one, ~2.6 ms for three: about two decode steps), and the step in flight is
    finished before it. Under load, arrivals come about one per decode step (a speculative batch's
    requests finish at different steps), so admitting each at once spent 55-65% of the scheduler's
    time on passes of 1-2 requests (session 16's step tables). So while many requests decode,
    arrivals wait for others, as long as the wait stays within what the pass they may save costs:
    the next decode step must end before they have waited one pass's time (both measured here, as
    the time between decode launches), and at most `max_steps` decode steps: where a decode step
    outlasts a prefill pass, nobody waits. They go at once when
    enough wait (see the constants above). Few running requests, a continuing chunk, or
    `max_steps` 0: admitted at once, as before."""

    EMA = 0.1  # weight of the newest measurement of a step's or a pass's time

    def __init__(self, max_steps: int, token_budget: int):
        self.max_steps = max_steps
        self.token_budget = token_budget  # waiting tokens that fill one prefill pass
        self.steps_waited = 0  # decode steps launched while requests waited, since the last pass
        self.step_seconds = 0.0  # a decode step's time, launch to launch, and what a pass adds to it
        self.pass_seconds = 0.0
        self._waiting_since: Optional[float] = None
        self._last_decode_at: Optional[float] = None
        self._passes_since_decode = 0
        self.num_passes = 0  # prefill passes launched, and the requests they took (for /get_server_info)
        self.num_pass_reqs = 0
        self.clock = time.perf_counter

    def defer(self, waiting: deque, num_running: int, now: Optional[float] = None) -> bool:
        if not waiting:
            self._waiting_since = None
            return False
        now = self.clock() if now is None else now
        if self._waiting_since is None:
            self._waiting_since = now
        if self.steps_waited >= self.max_steps or num_running < ADMISSION_BATCH_MIN_RUNNING:
            return False
        if not self.pass_seconds or now - self._waiting_since + self.step_seconds > self.pass_seconds:
            return False
        if len(waiting) >= min(ADMISSION_BATCH_MAX_REQS, num_running / ADMISSION_BATCH_RUNNING_PER_WAITING):
            return False
        return sum(req.seq_len for req in waiting) < self.token_budget

    def launched(
        self, batch_reqs: int, is_decode: bool, num_waiting: int, num_running: int, now: Optional[float] = None
    ) -> None:
        """Counts a launched step (decode steps while requests wait, prefill passes) and times
        both: a decode step from the previous one's launch, passes by what they add to that."""
        now = self.clock() if now is None else now
        if not is_decode:
            self.steps_waited, self._waiting_since = 0, None
            self.num_passes += 1
            self.num_pass_reqs += batch_reqs
            self._passes_since_decode += 1
            if not num_running:  # nothing decodes: the time until the next decode step is no pass's cost
                self._last_decode_at = None
            return
        self.steps_waited = self.steps_waited + 1 if num_waiting else 0
        if self._last_decode_at is not None:
            gap = now - self._last_decode_at
            if self._passes_since_decode:
                spent = max(gap - self.step_seconds, 0.0) / self._passes_since_decode
                self.pass_seconds += self.EMA * (spent - self.pass_seconds) if self.pass_seconds else spent
            else:
                self.step_seconds += self.EMA * (gap - self.step_seconds) if self.step_seconds else gap
        self._last_decode_at, self._passes_since_decode = now, 0

    def summary(self) -> dict:
        return {
            "num_prefill_passes": self.num_passes,
            "mean_reqs_per_prefill_pass": self.num_pass_reqs / self.num_passes if self.num_passes else 0.0,
            "admission_step_ms": self.step_seconds * 1e3,
            "admission_pass_ms": self.pass_seconds * 1e3,
        }


# No request's decode_reserve exceeds this.
DECODE_RESERVE_MAX = int(DECODE_RESERVE_CLIP * DECODE_RESERVE_RATIO)


def decode_reserve(req: Req) -> int:
    remaining = req.sampling_params.max_new_tokens - len(req.output_ids)
    return int(min(max(remaining, 0), DECODE_RESERVE_CLIP) * DECODE_RESERVE_RATIO)


def running_decode_reserve(running: list[Req], free_slots: int, token_budget: int, free_running_slots: int) -> int:
    """The decode reserve of the running requests, as a prefill step's admissions see it. Its
    exact value walks every running request (~80 us at 256 on a fast CPU, every prefill pass);
    it only matters when memory is short. So while the free slots (which no admission's prefix
    lock can take) cover the reserve's bound (every request at the clip), a whole token budget
    and the reserve of every request that could join (a continuing chunk's too), the bound stands
    in for it: no admission of this step can then fail for memory under either value, so both
    admit the same."""
    bound = len(running) * DECODE_RESERVE_MAX
    if free_slots - bound >= token_budget + (free_running_slots + 1) * DECODE_RESERVE_MAX:
        return bound
    return sum(decode_reserve(r) for r in running)


class PrefillAdder:
    """Accumulates the requests of one prefill step within the token budget, the KV memory
    (minus what running requests are expected to need) and the running-request limit.

    `pass_fits(num_reqs, num_tokens)`, given while requests decode: whether a prefill of that size
    runs about as cheaply as the prefill graphs allow (a graph takes it, or eager launches beat the
    graphs there: PrefillGraphRunner.pass_fits; None: no graphs). A second or later request joins
    only if the pass still does: on a small model an eager pass of many requests stalls the
    running batch for far longer than a few graph passes take (session 16, demo pair: 17-48 ms
    for 10-38 requests, against 2-7 ms for up to 9 in a graph); the first request is taken
    whatever its size, as before."""

    def __init__(
        self,
        token_budget: int,
        available_kv: int,
        free_running_slots: int,
        running_reserve: int = 0,
        pass_fits: Optional[Callable[[int, int], Optional[bool]]] = None,
    ):
        self.pass_fits = pass_fits
        self.token_budget = token_budget
        self.available_kv = available_kv
        self.free_running_slots = free_running_slots
        self.running_reserve = running_reserve  # decode_reserve of the running requests
        self.reqs: list[Req] = []
        self.planned = 0  # extend_len of the requests added
        self.reserved = 0  # their decode_reserve, each counted whether or not its prompt fit whole
        self.limit = "waiting queue"  # what kept the next request out of this pass (the log's debug line)

    def try_add(self, req: Req, continuing_chunk: bool = False) -> bool:
        """Sets req.extend_len and returns True if it fits (possibly as a first chunk); else
        `limit` names what stopped it."""
        if self.token_budget <= 0 or (not continuing_chunk and self.free_running_slots <= 0):
            self.limit = "token budget" if self.token_budget <= 0 else "running requests"
            return False
        remaining = req.seq_len - req.kv_len
        extend_len = min(remaining, self.token_budget)
        reserve = decode_reserve(req) if extend_len == remaining else 0
        if extend_len + reserve > self.available_kv:
            self.limit = "KV memory"
            return False
        if (
            self.reqs
            and self.pass_fits is not None
            and self.pass_fits(len(self.reqs) + 1, self.planned + extend_len) is False
        ):
            self.limit = "prefill graphs"
            return False
        req.extend_len = extend_len
        self.token_budget -= extend_len
        self.available_kv -= extend_len + reserve
        if not continuing_chunk:
            self.free_running_slots -= 1
        self.reqs.append(req)
        self.planned += extend_len
        self.reserved += decode_reserve(req)
        return True
