"""The scheduler's side of speculation: which requests the draft follows (at admission, by
adoption when the load drops, and no more while plain decoding holds), the policy it asks for
each step's k, the costs it feeds that policy, and processing a speculative step's results.
Functions of the Scheduler whose state they read and update."""

from __future__ import annotations

import logging
import math
import os
from typing import Optional

import numpy as np
import torch

from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
from sglang.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)

# With a draft: one admission in this many (in a row without it) gets the draft although the
# acceptance estimate says speculation would not pay, to refresh that estimate (draft_reads_prompt).
EXPLORE_EVERY = 16
# With a draft: how often (decode steps) the scheduler looks for requests admitted without the
# draft that it should now follow, and when that is worth it: each with at least this many
# tokens left, and their contexts together at most this many tokens per token the shortest of
# them has left (the draft's pass over a context, with the target forward that recomputes its
# aux states, costs about a prefill of it, while speculation saves a part of each decode step).
ADOPT_CHECK_EVERY = 16
ADOPT_MIN_REMAINING = 64
ADOPT_CONTEXT_PER_REMAINING = 16
# With a draft: after this many plain decode steps in a row (and every ADOPT_CHECK_EVERY more), if
# the policy would not speculate for the running batch, the draft stops following the running
# requests (drop_draft_while_plain): a plain step that keeps the draft current costs more than the
# target's step alone (measured 12.6 against 12.1 ms at batch 256 on 8B shapes), and one followed
# request puts the whole batch on it. Adoption takes them back when the load drops.
DROP_AFTER_PLAIN_STEPS = 32
# With a draft: an explorer (draft_reads_prompt) comes at most once in this many decode steps, so
# that at a large batch, where admissions come every step or two, explorers keep the batch on the
# draft-following plain step only now and then.
EXPLORE_MIN_DECODE_STEPS = 256
# Benchmark-only: with SGLANG_DRAFT_FOLLOWS_ALL=1 the draft reads every prompt (a request that opted
# out aside), whatever the policy says. A `--speculative-policy never` server then runs, on every step,
# the plain step of requests the draft follows (warm: with the draft's one-token extend; catch-up: with
# the aux states kept), which is what the cost policy's k = 0 costs a server that speculates at times.
DRAFT_FOLLOWS_ALL_ENV = "SGLANG_DRAFT_FOLLOWS_ALL"
DRAFT_FOLLOWS_ALL = os.environ.get(DRAFT_FOLLOWS_ALL_ENV) == "1"
# Benchmark-only: with SGLANG_SPEC_COST_LOG=PREFIX each scheduler writes PREFIX.<pid>.txt, one line
# per decode launch ("L time batch_size k context exploration_steps"), other launch ("P time"),
# cost sample fed to the policy ("S batch_size k context seconds") and processed decode step ("V k
# requests tokens"): what the policy saw and chose, for replaying policies offline
# (sglang.benchmark.cost_log_report). About a microsecond of host time per line.
COST_LOG_ENV = "SGLANG_SPEC_COST_LOG"
# Benchmark-only: with SGLANG_SPEC_EXPLORE_EVERY=N the cost policy runs every other candidate for a
# burst once N decode steps have passed since it last ran at the batch's bucket, up to half of the
# steps: every k's cost measured beside the others' all the time, for the cost log. It costs what the
# candidates are worse by, on a third or more of the steps.
EXPLORE_EVERY_ENV = "SGLANG_SPEC_EXPLORE_EVERY"


def observe_decode_launch(scheduler, start: float, batch: Optional[ScheduleBatch]) -> None:
    """Feeds the policy's learned costs. A decode step's cost to the server is the wall time
    from its step's start to the next decode step's start, taken only where the launch before
    it was a decode step of the same k with nothing launched between (and nothing between it
    and the next): then the period holds one step's scheduling, launch, the processing of the
    step before (same k) and the wait for the device, as a run of such steps pays them. The
    first steps after a prefill or a switch are left out (their periods hold other work)."""
    if not scheduler.spec_k:
        return
    if batch is None or not batch.forward_mode.is_decode():
        scheduler._decode_launch = None
        if scheduler.spec_cost_log is not None and batch is not None:
            scheduler.spec_cost_log.write(f"P {start:.6f}\n")
        return
    previous, k = scheduler._decode_launch, batch.spec_steps
    scheduler._plain_streak = scheduler._plain_streak + 1 if k == 0 else 0
    scheduler._decode_steps_since_explorer += 1
    log = scheduler.spec_cost_log
    if log is not None:
        exploration = getattr(scheduler.spec_policy, "exploration", None)
        log.write(
            f"L {start:.6f} {batch.batch_size} {k} {scheduler._decode_context} "
            f"{exploration.steps if exploration is not None else 0}\n"
        )
    if previous is not None and previous[4]:
        _, batch_size, previous_k, context, _ = previous
        scheduler.spec_policy.observe_step_seconds(batch_size, previous_k, context, start - previous[0])
        if log is not None:
            log.write(f"S {batch_size} {previous_k} {context} {start - previous[0]:.6f}\n")
    steady = previous is not None and previous[2] == k
    scheduler._decode_launch = (start, batch.batch_size, k, scheduler._decode_context, steady)


def draft_reads_prompt(scheduler, req: Req, joining: list[Req]) -> bool:
    """Whether the draft runs over this request's prompt as it is admitted, so that it can
    speculate: unless it opted out, if the policy would speculate for the decode batch it joins
    (the running requests, those admitted with it, itself; each counted as if it could
    speculate, so that requests admitted while plain decoding paid do not keep it plain). A
    request without it decodes plainly to its end, and a busy server never pays the draft's
    pass over prompts.

    Only requests the draft follows tell the policy about acceptance (verifies, or the warm
    plain step's free probe). So that an estimate gone low does not keep every request away
    from the draft for good, after EXPLORE_EVERY admissions in a row without the draft the
    next one gets it anyway (an explorer), if speculation could pay for its batch at all (at
    the prior acceptance): a busy server, where it could not, still never runs the draft.
    Deciding changes nothing; `_note_admission` counts once the request is in."""
    scheduler._explorer = None
    if req.sampling_params.disable_speculative_decoding:
        return False
    if DRAFT_FOLLOWS_ALL:
        return True
    running_rids, running_context = scheduler._admission_view or running_view(scheduler)
    joining = joining + [req]
    rids = running_rids + [r.rid for r in joining if not r.sampling_params.disable_speculative_decoding]
    context = running_context + sum(r.seq_len for r in joining)
    batch_size = len(scheduler.running_reqs) + len(joining)
    if scheduler.spec_policy.would_speculate(rids, context, batch_size - len(rids)):
        return True
    if (
        scheduler.admissions_without_draft >= EXPLORE_EVERY
        and scheduler._decode_steps_since_explorer >= EXPLORE_MIN_DECODE_STEPS
        and scheduler.spec_policy.would_speculate_at_prior(batch_size, context)
    ):
        scheduler._explorer = req
        return True
    return False


def running_view(scheduler) -> tuple[list[str], int]:
    """The running requests as draft_reads_prompt counts them: the rids of those that may
    speculate, and their tokens of context."""
    rids = [r.rid for r in scheduler.running_reqs if not r.sampling_params.disable_speculative_decoding]
    return rids, sum(r.seq_len for r in scheduler.running_reqs)


def note_admission(scheduler, req: Req, admitted: bool = True) -> None:
    """Counts an admission (or, `admitted` False, takes back one that was undone) for the
    exploration in draft_reads_prompt and for /get_server_info."""
    if not admitted:
        scheduler.num_prompts_without_draft -= req.draft_cold
        scheduler.admissions_without_draft = max(0, scheduler.admissions_without_draft - req.draft_cold)
        scheduler.num_draft_explorations -= req.draft_explorer
        req.draft_explorer = False
    elif req.draft_cold:
        scheduler.num_prompts_without_draft += 1
        scheduler.admissions_without_draft += 1
    else:
        req.draft_explorer = scheduler._explorer is req
        scheduler.num_draft_explorations += req.draft_explorer
        scheduler.admissions_without_draft = 0
        # A request the draft follows gets DROP_AFTER_PLAIN_STEPS plain steps (an explorer's probes)
        # before drop_draft_while_plain may stop following it.
        scheduler._plain_streak = 0
        if req.draft_explorer:
            scheduler._decode_steps_since_explorer = 0


def adopt_cold_requests(scheduler) -> None:
    """Requests admitted without the draft (Req.draft_cold) when speculation did not pay decode
    plainly; if the load drops, the draft can still adopt them. Every ADOPT_CHECK_EVERY decode
    steps, if the policy would speculate for the running batch counting them as followed,
    those with enough tokens left are adopted, when that repays the draft's passes over their
    contexts (ADOPT_MIN_REMAINING, ADOPT_CONTEXT_PER_REMAINING): the next step's launch
    first runs the draft over their context, from target aux states it recomputes, and they
    speculate from then on. Not while a speculative step is in flight: the host knows the
    positions of their tokens only once it is processed."""
    scheduler._decode_steps_since_adoption_check += 1
    if scheduler._decode_steps_since_adoption_check < ADOPT_CHECK_EVERY:
        return
    if _speculative_step_in_flight(scheduler):
        return
    scheduler._decode_steps_since_adoption_check = 0
    candidates, least_left = [], None
    for req in scheduler.running_reqs:
        left = req.sampling_params.max_new_tokens - len(req.output_ids) - req.num_pending
        if req.draft_cold and not req.sampling_params.disable_speculative_decoding and left >= ADOPT_MIN_REMAINING:
            candidates.append(req)
            least_left = left if least_left is None else min(least_left, left)
    # A draining batch of many long contexts would pay more for the passes than it saves.
    if not candidates or sum(req.kv_len for req in candidates) > ADOPT_CONTEXT_PER_REMAINING * least_left:
        return
    for req in candidates:  # as the policy would see the batch with them followed
        req.draft_cold = False
    if not _would_speculate_for_running(scheduler):
        for req in candidates:
            req.draft_cold = True
        return
    for req in candidates:
        req.draft_adopting = True
    logger.info("the draft adopts %d request(s) admitted without it (the load dropped)", len(candidates))


def drop_draft_while_plain(scheduler) -> None:
    """While plain decoding holds (DROP_AFTER_PLAIN_STEPS decode steps in a row since the last
    speculative step or admission with the draft, checked every ADOPT_CHECK_EVERY after that) and
    the policy would not speculate for the running batch, the draft stops following the running
    requests: they become as if admitted without it (Req.draft_cold), so the batch's plain steps
    run the target alone, and adopt_cold_requests takes them back when the load drops. Their
    positions go to the radix cache as target-only entries (the draft's KV there is no longer
    kept current)."""
    streak = scheduler._plain_streak
    if DRAFT_FOLLOWS_ALL or streak < DROP_AFTER_PLAIN_STEPS or (streak - DROP_AFTER_PLAIN_STEPS) % ADOPT_CHECK_EVERY:
        return
    if _speculative_step_in_flight(scheduler):
        return
    followed = [req for req in scheduler.running_reqs if req.speculates and not req.draft_adopting]
    if not followed or _would_speculate_for_running(scheduler):
        return
    for req in followed:
        req.draft_cold, req.draft_behind, req.draft_explorer = True, 0, False
    scheduler.num_draft_drops += len(followed)
    logger.info(
        "the draft stops following %d running request(s) after %d plain steps at batch %d (speculation would not pay)",
        len(followed),
        streak,
        len(scheduler.running_reqs),
    )


def _speculative_step_in_flight(scheduler) -> bool:
    # Its cold rows' kv_len is over-counted on the host until it is processed.
    return scheduler.in_flight is not None and bool(scheduler.in_flight[0].spec_steps)


def _would_speculate_for_running(scheduler) -> bool:
    """The policy's fresh judgement for the running batch as the draft follows it now."""
    rids = [req.rid for req in scheduler.running_reqs if req.speculates]
    context = sum(req.kv_len for req in scheduler.running_reqs)
    return scheduler.spec_policy.would_speculate(rids, context, len(scheduler.running_reqs) - len(rids))


def explore_now(scheduler) -> bool:
    """Under --speculative-draft-sync catch-up plain steps give no probe: while an explorer
    decodes, the policy is asked for a speculative step, so that its verifies refresh the
    estimate (warm plain steps probe by themselves)."""
    return (
        scheduler.server_args.speculative_draft_sync == "catch-up"
        and scheduler.num_draft_explorations > 0
        and any(req.draft_explorer for req in scheduler.running_reqs)
    )


def make_spec_policy(scheduler, args: ServerArgs):
    from sglang.srt.configs.speculative_adaptive import parse_adaptive_config
    from sglang.srt.speculative.cost_model import CostTable
    from sglang.srt.speculative.spec_policy import make_policy

    config = parse_adaptive_config(args.speculative_adaptive_config) if args.speculative_adaptive_config else {}
    if DRAFT_FOLLOWS_ALL:
        logger.warning(
            "%s=1: the draft reads every prompt whatever the policy says (for benchmarks only: "
            "a plain-deciding server pays for a draft it does not use)",
            DRAFT_FOLLOWS_ALL_ENV,
        )
    scheduler.spec_cost_log = open_cost_log(os.environ.get(COST_LOG_ENV))
    exploration = dense_exploration(os.environ.get(EXPLORE_EVERY_ENV))
    cost = None
    if args.speculative_policy == "cost":
        measured = scheduler.tp_worker.measure_step_costs()
        cost = CostTable(measured["plain"], measured["spec"], measured.get("context"))
        logger.debug("speculation cost table (ms per decode step, measured at start-up): %s", cost.summary())
    return make_policy(
        args.speculative_policy,
        scheduler.spec_k,
        threshold=args.speculative_threshold,
        candidates=args.speculative_candidate_steps,
        candidates_by_bs=config.get("candidates_by_bs"),
        hysteresis_by_bs=config.get("hysteresis_by_bs"),
        cost=cost,
        ema_alpha=config.get("ema_alpha"),
        exploration=exploration,
    )


def dense_exploration(every: Optional[str]):
    """The benchmark-only exploration of EXPLORE_EVERY_ENV (None where it is not set)."""
    from sglang.srt.speculative.exploration import Exploration

    if not every:
        return None
    if not every.isdigit() or int(every) < 1:
        raise ValueError(f"{EXPLORE_EVERY_ENV}={every!r}: need a whole number of decode steps >= 1")
    logger.warning(
        "%s=%s: every candidate k runs %s decode steps after it last ran at a bucket, up to half of all "
        "steps (for benchmarks only: the server runs worse k's on purpose)",
        EXPLORE_EVERY_ENV,
        every,
        every,
    )
    return Exploration(max_share=0.5, intervals=((math.inf, int(every)),))


def open_cost_log(prefix: Optional[str]):
    """The benchmark-only cost log (COST_LOG_ENV) at PREFIX.<pid>.txt, or None where it is not
    asked for; an unwritable path fails the start-up with the reason."""
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


def process_spec(scheduler, batch: ScheduleBatch, result) -> None:
    """Each request gets 1 .. k + 1 tokens; the KV slots of the rejected positions are freed."""
    host = result.wait_host()
    width = batch.spec_steps + 1
    tokens = host["tokens"].tolist()
    # A request that finished while this step was in flight gave all its slots back then.
    live_rows = [i for i, req in enumerate(batch.reqs) if not req.finished()]
    if width == 1:  # a plain step: one token each, nothing rejected
        num_out = [1] * batch.batch_size
    else:
        # numpy, not torch: each torch op on these few host values costs 5-30 us of host time.
        counts = host["num_out"].numpy()
        num_out = counts.tolist()
        rejected = np.arange(width) >= counts[:, None]
        if len(live_rows) < batch.batch_size:  # the finished gave their slots back already
            rejected[[i for i, req in enumerate(batch.reqs) if req.finished()]] = False
        # The host copy of the slots: reading the device's would wait for the step launched after this one.
        freed = batch.out_cache_loc_host.numpy().reshape(-1, width)[rejected]  # a copy
        scheduler.kv_manager.allocator.free(torch.from_numpy(freed), owned=True)
    token_logprobs = host["token_logprobs"].tolist() if "token_logprobs" in host else None
    top = (host["top_logprobs"].tolist(), host["top_logprob_ids"].tolist()) if "top_logprobs" in host else None
    # What this step says about acceptance, before any request finishes (and is forgotten).
    if width > 1:
        # Requests that do not speculate took one token without verifying anything.
        verified = [i for i in live_rows if batch.speculating[i]]
        phases = result.timer.seconds() if result.timer is not None else None  # timed steps only
        scheduler.tp_worker.stats.record_step([num_out[i] for i in verified], phases, width - 1)
        scheduler.spec_policy.observe_verify(
            [batch.reqs[i].rid for i in verified], [num_out[i] for i in verified], width - 1
        )
        if scheduler.spec_cost_log is not None:
            scheduler.spec_cost_log.write(f"V {width - 1} {len(verified)} {sum(num_out[i] for i in verified)}\n")
    else:
        scheduler.tp_worker.stats.record_plain_step()
        if "probe_hits" in host:  # a warm draft's free probe (catch-up plain steps have none)
            hits = host["probe_hits"].tolist()
            probed = [i for i in live_rows if batch.speculating[i]]  # the others have no draft state
            scheduler.spec_policy.observe_probe([batch.reqs[i].rid for i in probed], [bool(hits[i]) for i in probed])
    new_tokens = 0
    for i, req in enumerate(batch.reqs):
        if req.finished():  # finished while this step was in flight: its tokens are dropped
            continue
        req.kv_len -= width - num_out[i]
        req.num_pending -= 1
        # A plain step verifies nothing; nor does a speculative one for a request that opted out.
        req.spec_verify_ct += width > 1 and batch.speculating[i]
        if not (req.return_logprob or req.stop_strs) and req.sampling_params.max_new_tokens:
            # The common request: its tokens in one call, then finished or streamed once.
            new_tokens += req.append_tokens(tokens[i], num_out[i])
            if req.finished():
                scheduler.running_reqs.remove(req)
                scheduler._finish(req, req.finished_reason)
            else:
                scheduler.stream_if_due(req)
            continue
        for j, token_id in enumerate(tokens[i][: num_out[i]]):
            if req.return_logprob:
                req.output_token_logprobs.append((token_logprobs[i][j], token_id))
                if req.top_logprobs_num:
                    n = req.top_logprobs_num
                    req.output_top_logprobs.append(list(zip(top[0][i][j][:n], top[1][i][j][:n])))
            scheduler._append(req, token_id)
            new_tokens += 1
            if req.finished():
                break
    scheduler._count_step(new_tokens, is_decode=True)
