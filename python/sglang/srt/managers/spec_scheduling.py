"""The scheduler's side of speculation, owned by one object (SpecScheduling, the Scheduler's
`spec`): which requests the draft follows (at admission, by adoption when the load drops, and no
more while plain decoding holds; Req.draft), the policy it asks for each step's k, the costs it
feeds that policy, and what a decode step's results tell them. The Scheduler calls it in each phase
of a step: schedule (admissions, `review_following`, `plan_step`), run (`on_launch`), process
(`on_step_result`)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
from typing import Optional

from sglang.srt import bench_hooks
from sglang.srt.bench_hooks import BenchHooks
from sglang.srt.managers.schedule_batch import DraftFollowing, Req, ScheduleBatch
from sglang.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)

# One admission in this many (in a row without the draft) gets the draft although the acceptance
# estimate says speculation would not pay, to refresh that estimate (draft_reads_prompt).
EXPLORE_EVERY = 16
# How often (decode steps) the scheduler looks for requests admitted without the draft that it
# should now follow, and when that is worth it: each with at least this many tokens left, and their
# contexts together at most this many tokens per token the shortest of them has left (the draft's
# pass over a context, with the target forward that recomputes its aux states, costs about a
# prefill of it, while speculation saves a part of each decode step).
ADOPT_CHECK_EVERY = 16
ADOPT_MIN_REMAINING = 64
ADOPT_CONTEXT_PER_REMAINING = 16
# After this many plain decode steps in a row (and every ADOPT_CHECK_EVERY more), if the policy
# would not speculate for the running batch, the draft stops following the running requests
# (_drop_while_plain): a plain step that keeps the draft current costs more than the target's step
# alone (measured 12.6 against 12.1 ms at batch 256 on 8B shapes), and one followed request puts
# the whole batch on it. Adoption takes them back when the load drops.
DROP_AFTER_PLAIN_STEPS = 32
# An explorer (draft_reads_prompt) comes at most once in this many decode steps, so that at a large
# batch, where admissions come every step or two, explorers keep the batch on the draft-following
# plain step only now and then.
EXPLORE_MIN_DECODE_STEPS = 256


@dataclasses.dataclass(frozen=True)
class DecodeLaunch:
    """A decode step as it was launched, kept until the next launch prices it."""

    start: float  # the step's start (time.perf_counter)
    batch_size: int
    k: int  # draft tokens verified; 0: a plain step
    context: int  # the batch's summed context
    steady: bool  # the launch before it was a decode step of the same k, with nothing launched between


class SpecScheduling:
    """Everything the scheduler decides about speculation, and the state those decisions need.
    Its callers pass what they have (the running requests, a launched batch); it reads no
    Scheduler field."""

    def __init__(self, server_args: ServerArgs, worker, hooks: BenchHooks = bench_hooks.OFF):
        self.worker = worker  # the EAGLEWorkerV2: its step costs (at start-up) and SpecStats
        self.catch_up = server_args.speculative_draft_sync == "catch-up"
        self.draft_follows_all = hooks.draft_follows_all
        self.cost_log = bench_hooks.open_cost_log(hooks.cost_log_prefix)
        self.policy = make_spec_policy(server_args, worker, hooks)
        # Reported in /get_server_info and /metrics.
        self.num_prompts_without_draft = 0  # admissions the draft skipped (draft_reads_prompt)
        self.num_draft_explorations = 0  # admissions given the draft to refresh the estimate
        self.num_draft_adoptions = 0  # requests adopted mid-decode, counted as the draft's pass launches
        self.num_draft_drops = 0  # running requests the draft stopped following (_drop_while_plain)
        # Admissions.
        self.admissions_without_draft = 0  # in a row, for draft_reads_prompt's exploration
        self._explorer: Optional[Req] = None  # the request draft_reads_prompt last chose to explore
        self._admission_view: Optional[tuple] = None  # (rids, context, size) of the running batch, in `admitting`
        # Decode steps.
        self._decode_steps_since_adoption_check = 0
        self._decode_steps_since_explorer = EXPLORE_MIN_DECODE_STEPS
        self._plain_streak = 0  # decode launches in a row with k = 0
        self._adoption_marked = False  # requests were marked for adoption; their launch is to come
        self._any_behind = False  # a catch-up plain step left followed requests behind the target
        self._decode_context = 0  # summed context of the batch plan_step last chose for
        # The last decode launch, for the policy's learned costs (_observe_decode_launch); None
        # after anything else.
        self._decode_launch: Optional[DecodeLaunch] = None

    # ---- admissions ----------------------------------------------------------------------

    @contextlib.contextmanager
    def admitting(self, running_reqs: list[Req]):
        """Around one step's admissions: the running requests do not change while they are
        decided, so their view is taken once, not once per admission (O(running) each)."""
        rids = [r.rid for r in running_reqs if not r.sampling_params.disable_speculative_decoding]
        self._admission_view = (rids, sum(r.seq_len for r in running_reqs), len(running_reqs))
        try:
            yield
        finally:
            self._admission_view = None

    def decide_admission(self, req: Req, joining: list[Req]) -> None:
        """Before the request's prefix match (a request without draft state can use more of the
        cache): whether the draft follows it from its prompt on. Its draft state starts afresh."""
        req.draft = DraftFollowing(cold=not self.draft_reads_prompt(req, joining))

    def draft_reads_prompt(self, req: Req, joining: list[Req]) -> bool:
        """Whether the draft runs over this request's prompt as it is admitted, so that it can
        speculate: unless it opted out, if the policy would speculate for the decode batch it joins
        (the running requests, those admitted with it, itself; each counted as if it could
        speculate, so that requests admitted while plain decoding paid do not keep it plain). A
        request without it decodes plainly to its end, and a busy server never pays the draft's
        pass over prompts. Called inside `admitting`.

        Only requests the draft follows tell the policy about acceptance (verifies, or the warm
        plain step's free probe). So that an estimate gone low does not keep every request away
        from the draft for good, after EXPLORE_EVERY admissions in a row without the draft the
        next one gets it anyway (an explorer), if speculation could pay for its batch at all (at
        the prior acceptance): a busy server, where it could not, still never runs the draft.
        Deciding changes nothing; `on_admission` counts once the request is in."""
        self._explorer = None
        if req.sampling_params.disable_speculative_decoding:
            return False
        if self.draft_follows_all:
            return True
        running_rids, running_context, num_running = self._admission_view
        joining = joining + [req]
        rids = running_rids + [r.rid for r in joining if not r.sampling_params.disable_speculative_decoding]
        context = running_context + sum(r.seq_len for r in joining)
        batch_size = num_running + len(joining)
        if self.policy.would_speculate(rids, context, batch_size - len(rids)):
            return True
        if (
            self.admissions_without_draft >= EXPLORE_EVERY
            and self._decode_steps_since_explorer >= EXPLORE_MIN_DECODE_STEPS
            and self.policy.would_speculate_at_prior(batch_size, context)
        ):
            self._explorer = req
            return True
        return False

    def on_admission(self, req: Req) -> None:
        """Counts an admission, for the exploration in draft_reads_prompt and for the summary."""
        if req.draft.cold:
            self.num_prompts_without_draft += 1
            self.admissions_without_draft += 1
            return
        req.draft.explorer = self._explorer is req
        self.num_draft_explorations += req.draft.explorer
        self.admissions_without_draft = 0
        # A request the draft follows gets DROP_AFTER_PLAIN_STEPS plain steps (an explorer's probes)
        # before _drop_while_plain may stop following it.
        self._plain_streak = 0
        if req.draft.explorer:
            self._decode_steps_since_explorer = 0

    def on_undone_admission(self, req: Req) -> None:
        """Takes back on_admission's count of a request whose admission was undone."""
        self.num_prompts_without_draft -= req.draft.cold
        self.admissions_without_draft = max(0, self.admissions_without_draft - req.draft.cold)
        self.num_draft_explorations -= req.draft.explorer
        req.draft.explorer = False

    # ---- decode steps --------------------------------------------------------------------

    def review_following(self, running_reqs: list[Req], spec_step_in_flight: bool) -> None:
        """Before a decode step is scheduled: whether the draft stops following the running
        requests, or adopts some it does not follow. Not while a speculative step is in flight:
        its cold rows' kv_len is over-counted on the host until it is processed."""
        self._drop_while_plain(running_reqs, spec_step_in_flight)
        self._adopt_cold_requests(running_reqs, spec_step_in_flight)

    def plan_step(self, running_reqs: list[Req]) -> int:
        """Draft tokens for the next decode step of these requests (0: a plain step), as the
        speculation policy chooses (--speculative-policy)."""
        rids = [req.rid for req in running_reqs if req.speculates]
        self._decode_context = sum(req.kv_len for req in running_reqs)
        return self.policy.choose(
            rids,
            self._decode_context,
            num_plain_only=len(running_reqs) - len(rids),
            explore=self._explore_now(running_reqs),
        )

    def _explore_now(self, running_reqs: list[Req]) -> bool:
        """Under --speculative-draft-sync catch-up plain steps give no probe: while an explorer
        decodes, the policy is asked for a speculative step, so that its verifies refresh the
        estimate (warm plain steps probe by themselves)."""
        return self.catch_up and self.num_draft_explorations > 0 and any(req.draft.explorer for req in running_reqs)

    def _adopt_cold_requests(self, running_reqs: list[Req], spec_step_in_flight: bool) -> None:
        """Requests admitted without the draft (Req.draft.cold) when speculation did not pay decode
        plainly; if the load drops, the draft can still adopt them. Every ADOPT_CHECK_EVERY decode
        steps, if the policy would speculate for the running batch counting them as followed,
        those with enough tokens left are adopted, when that repays the draft's passes over their
        contexts (ADOPT_MIN_REMAINING, ADOPT_CONTEXT_PER_REMAINING): the next step's launch
        first runs the draft over their context, from target aux states it recomputes, and they
        speculate from then on. Not while a speculative step is in flight: the host knows the
        positions of their tokens only once it is processed."""
        self._decode_steps_since_adoption_check += 1
        if self._decode_steps_since_adoption_check < ADOPT_CHECK_EVERY or spec_step_in_flight:
            return
        self._decode_steps_since_adoption_check = 0
        candidates, least_left = [], None
        for req in running_reqs:
            left = req.sampling_params.max_new_tokens - len(req.output_ids) - req.num_pending
            if req.draft.cold and not req.sampling_params.disable_speculative_decoding and left >= ADOPT_MIN_REMAINING:
                candidates.append(req)
                least_left = left if least_left is None else min(least_left, left)
        # A draining batch of many long contexts would pay more for the passes than it saves.
        if not candidates or sum(req.kv_len for req in candidates) > ADOPT_CONTEXT_PER_REMAINING * least_left:
            return
        for req in candidates:  # as the policy would see the batch with them followed
            req.draft.cold = False
        if not self._would_speculate_for(running_reqs):
            for req in candidates:
                req.draft.cold = True
            return
        for req in candidates:
            req.draft.adopting = True
        self._adoption_marked = True
        logger.info("the draft adopts %d request(s) admitted without it (the load dropped)", len(candidates))

    def _drop_while_plain(self, running_reqs: list[Req], spec_step_in_flight: bool) -> None:
        """While plain decoding holds (DROP_AFTER_PLAIN_STEPS decode steps in a row since the last
        speculative step or admission with the draft, checked every ADOPT_CHECK_EVERY after that)
        and the policy would not speculate for the running batch, the draft stops following the
        running requests: they become as if admitted without it (Req.draft.cold), so the batch's
        plain steps run the target alone, and adoption takes them back when the load drops. Their
        positions go to the radix cache as target-only entries (the draft's KV there is no longer
        kept current)."""
        streak = self._plain_streak
        if (
            self.draft_follows_all
            or streak < DROP_AFTER_PLAIN_STEPS
            or (streak - DROP_AFTER_PLAIN_STEPS) % ADOPT_CHECK_EVERY
        ):
            return
        if spec_step_in_flight:
            return
        followed = [req for req in running_reqs if req.speculates and not req.draft.adopting]
        if not followed or self._would_speculate_for(running_reqs):
            return
        for req in followed:
            req.draft.cold, req.draft.behind, req.draft.explorer = True, 0, False
        self.num_draft_drops += len(followed)
        logger.info(
            "the draft stops following %d running request(s) after %d plain steps at batch %d (speculation would not pay)",
            len(followed),
            streak,
            len(running_reqs),
        )

    def _would_speculate_for(self, running_reqs: list[Req]) -> bool:
        """The policy's fresh judgement for the running batch as the draft follows it now."""
        rids = [req.rid for req in running_reqs if req.speculates]
        context = sum(req.kv_len for req in running_reqs)
        return self.policy.would_speculate(rids, context, len(running_reqs) - len(rids))

    # ---- launches ------------------------------------------------------------------------

    def on_launch(self, start: float, batch: Optional[ScheduleBatch]) -> None:
        """After the step that began at `start` launched `batch` (None: nothing): the draft state
        its launch changed, and the step costs the policy learns from."""
        if batch is None or not batch.forward_mode.is_decode():
            self._decode_launch = None
            if self.cost_log is not None and batch is not None:
                self.cost_log.write(f"P {start:.6f}\n")
            return
        self._note_draft_passes(batch)
        self._observe_decode_launch(start, batch)

    def _note_draft_passes(self, batch: ScheduleBatch) -> None:
        """What the worker's launch of this decode step did to each request's draft state (it read
        Req.draft as it was): the requests marked for adoption were adopted (a pass over their
        context); a speculative step first caught every request up; a catch-up plain step left each
        followed request one position further behind."""
        if self._adoption_marked:
            self._adoption_marked = False
            for req in batch.reqs:
                if req.draft.adopting:
                    req.draft.adopting = False
                    self.num_draft_adoptions += 1
        if batch.spec_steps:
            if self._any_behind:
                self._any_behind = False
                for req in batch.reqs:
                    req.draft.behind = 0
        elif self.catch_up:
            for req in batch.reqs:
                if req.speculates:
                    req.draft.behind += 1
                    self._any_behind = True

    def _observe_decode_launch(self, start: float, batch: ScheduleBatch) -> None:
        """Feeds the policy's learned costs. A decode step's cost to the server is the wall time
        from its step's start to the next decode step's start, taken only where the launch before
        it was a decode step of the same k with nothing launched between (and nothing between it
        and the next): then the period holds one step's scheduling, launch, the processing of the
        step before (same k) and the wait for the device, as a run of such steps pays them. The
        first steps after a prefill or a switch are left out (their periods hold other work)."""
        previous, k = self._decode_launch, batch.spec_steps
        self._plain_streak = self._plain_streak + 1 if k == 0 else 0
        self._decode_steps_since_explorer += 1
        log = self.cost_log
        if log is not None:
            exploration = getattr(self.policy, "exploration", None)
            log.write(
                f"L {start:.6f} {batch.batch_size} {k} {self._decode_context} "
                f"{exploration.steps if exploration is not None else 0}\n"
            )
        if previous is not None and previous.steady:
            seconds = start - previous.start
            self.policy.observe_step_seconds(previous.batch_size, previous.k, previous.context, seconds)
            if log is not None:
                log.write(f"S {previous.batch_size} {previous.k} {previous.context} {seconds:.6f}\n")
        steady = previous is not None and previous.k == k
        self._decode_launch = DecodeLaunch(start, batch.batch_size, k, self._decode_context, steady)

    # ---- results -------------------------------------------------------------------------

    def on_step_result(self, batch: ScheduleBatch, host: dict, num_out: list[int], live_rows: list[int], timer):
        """What a processed decode step says about acceptance, before any of its requests finishes
        (and is forgotten): `num_out` tokens per row, `live_rows` the rows not finished while it was
        in flight, `timer` its phase timer (timed steps only)."""
        width = batch.spec_steps + 1
        if width == 1:
            self.worker.stats.record_plain_step()
            if "probe_hits" in host:  # a warm draft's free probe (catch-up plain steps have none)
                hits = host["probe_hits"].tolist()
                probed = [i for i in live_rows if batch.speculating[i]]  # the others have no draft state
                self.policy.observe_probe([batch.reqs[i].rid for i in probed], [bool(hits[i]) for i in probed])
            return
        # Requests that do not speculate took one token without verifying anything.
        verified = [i for i in live_rows if batch.speculating[i]]
        phases = timer.seconds() if timer is not None else None
        self.worker.stats.record_step([num_out[i] for i in verified], phases, width - 1)
        self.policy.observe_verify([batch.reqs[i].rid for i in verified], [num_out[i] for i in verified], width - 1)
        if self.cost_log is not None:
            self.cost_log.write(f"V {width - 1} {len(verified)} {sum(num_out[i] for i in verified)}\n")

    def forget(self, req: Req) -> None:
        """The request left the running batch for good (finished or aborted)."""
        self.policy.forget(req.rid)

    # ---- reports -------------------------------------------------------------------------

    def summary(self, running_reqs: list[Req]) -> dict:
        """Speculation's part of /get_server_info (and of /metrics)."""
        return {
            **self.worker.stats.summary(),
            "spec_policy": self.policy.summary(),
            "spec_prompts_without_draft": self.num_prompts_without_draft,
            "spec_draft_explorations": self.num_draft_explorations,
            "spec_draft_adoptions": self.num_draft_adoptions,
            "spec_draft_drops": self.num_draft_drops,
            "spec_running_without_draft": sum(not req.speculates for req in running_reqs),
        }

    def log_fields(self) -> str:
        """Speculation's part of the decode log line: the acceptance since the last line, the k of
        the moment and (with a cost policy) the tokens per second it expects of that k."""
        k = self.policy.current_k
        line = f"accept len: {self.worker.stats.take_window_accept_length():.2f}, spec k: {k}, "
        expected = self.policy.last_objective.get(k)
        return line + (f"expected (token/s): {expected:.0f}, " if expected else "")

    def close(self) -> None:
        if self.cost_log is not None:
            self.cost_log.close()


def make_spec_policy(args: ServerArgs, worker, hooks: BenchHooks):
    """The policy --speculative-policy names (spec_policy's registry), priced where it needs it by
    the worker's start-up step costs."""
    from sglang.srt.speculative.spec_policy import policy_from_args

    if hooks.draft_follows_all:
        logger.warning(
            "%s=1: the draft reads every prompt whatever the policy says (for benchmarks only: "
            "a plain-deciding server pays for a draft it does not use)",
            bench_hooks.DRAFT_FOLLOWS_ALL_ENV,
        )
    return policy_from_args(args, worker.measure_step_costs, dense_exploration(hooks.explore_every))


def dense_exploration(every: Optional[int]):
    """The benchmark-only exploration of bench_hooks.EXPLORE_EVERY_ENV (None where it is off)."""
    from sglang.srt.speculative.exploration import Exploration

    if every is None:
        return None
    logger.warning(
        "%s=%s: every candidate k runs %s decode steps after it last ran at a bucket, up to half of all "
        "steps (for benchmarks only: the server runs worse k's on purpose)",
        bench_hooks.EXPLORE_EVERY_ENV,
        every,
        every,
    )
    return Exploration(max_share=0.5, intervals=((math.inf, every),))
