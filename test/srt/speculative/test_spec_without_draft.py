"""Requests the draft does not follow (issue 8's off state): a request admitted while the
speculation policy would not speculate for the batch it joins skips the draft's pass over its
prompt and decodes plainly to its end, also inside speculative steps. So a server whose policy
stays plain never runs the draft at all; outputs stay plain decoding's; the radix cache keeps
such requests' KV as target-only entries, which they can reuse and which a request the draft
follows takes over (with draft KV) once nobody uses them."""

from __future__ import annotations

import pytest

from sglang import demo
from sglang.srt.managers.io_struct import AbortReq, TokenizedGenerateReqInput
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs
from sglang.test.server_fixture import assert_idle_kv_accounting

PROMPTS = [[205, 300, 1100, 52, 9, 77], [17, 905, 33], list(range(100, 140)), [640, 12, 12, 77, 1500, 8]]
MAX_NEW = [9, 24, 40, 3]
SPEC = dict(speculative_algorithm="EAGLE3", speculative_draft_model_path=demo.DRAFT_PATH, speculative_num_steps=3)
# The requests hold a few hundred tokens of KV at most: a pool of 4096 (the CPU default, 65536,
# takes ~2 s to allocate per scheduler on the demo pair).
MAX_TOTAL_TOKENS = 4096


def make_scheduler(overlap: bool = False, **spec) -> Scheduler:
    kwargs = {**SPEC, **spec} if spec else {}
    return Scheduler(
        ServerArgs(
            model_path=demo.TARGET_PATH,
            dtype="float32",
            device="cpu",
            disable_overlap_schedule=not overlap,
            max_total_tokens=MAX_TOTAL_TOKENS,
            **kwargs,
        )
    )


def count_draft_forwards(scheduler: Scheduler) -> list[int]:
    """Counts every forward of the draft model (eager or through its graphs)."""
    calls = [0]
    runner = scheduler.tp_worker.draft_runner
    for name in ("forward", "forward_eager"):
        original = getattr(runner, name)

        def counted(fb, original=original):
            calls[0] += 1
            return original(fb)

        setattr(runner, name, counted)
    return calls


def submit(scheduler: Scheduler, rid: str, ids: list[int], max_new: int) -> None:
    params = SamplingParams(max_new_tokens=max_new, temperature=0, ignore_eos=True)
    scheduler.add_request(TokenizedGenerateReqInput(rid, ids, params, stream=False))


def drive(scheduler: Scheduler, abort_at: int | None = None) -> dict[str, dict]:
    """Runs the four requests (r2 aborted at step `abort_at`), then r4 with r0's prompt (a radix
    hit); returns {rid: {"ids", "verify_ct", "cached"}}."""
    for i, ids in enumerate(PROMPTS):
        submit(scheduler, f"r{i}", ids, MAX_NEW[i])
    out: dict[str, dict] = {}
    finish = scheduler._finish

    def recorded_finish(req, reason):
        out.setdefault(req.rid, {})["cached"] = req.cached_tokens
        finish(req, reason)

    scheduler._finish = recorded_finish
    step = 0
    while scheduler.has_work():
        if step == abort_at:
            scheduler.abort_request(AbortReq("r2"))
        if "r0" in out and not any(r.startswith("r4") for r in out) and "r4" not in scheduler_rids(scheduler):
            submit(scheduler, "r4", PROMPTS[0], 12)
        result = scheduler.step()
        step += 1
        for j, rid in enumerate(result.rids if result else ()):
            entry = out.setdefault(rid, {})
            entry.setdefault("ids", []).extend(result.new_token_ids[j])
            if result.spec_verify_ct is not None:
                entry["verify_ct"] = result.spec_verify_ct[j]
    assert_idle_kv_accounting(scheduler.get_internal_state())
    return out


def run_prompts(scheduler: Scheduler, max_new: list[int]) -> dict:
    """PROMPTS with `max_new` tokens each, all at once, to the end: {rid: ids, rid + ".verify_ct": n}."""
    for i, ids in enumerate(PROMPTS):
        submit(scheduler, f"r{i}", ids, max_new[i])
    out = {}
    while scheduler.has_work():
        result = scheduler.step()
        for j, rid in enumerate(result.rids if result else ()):
            out.setdefault(rid, []).extend(result.new_token_ids[j])
            if result.spec_verify_ct is not None:
                out[rid + ".verify_ct"] = result.spec_verify_ct[j]
    assert_idle_kv_accounting(scheduler.get_internal_state())
    return out


def plain_outputs(overlap: bool, max_new: list[int]) -> dict:
    """run_prompts with plain decoding (greedy: the same on every call), computed once per
    arguments: the parametrized tests below compare against the same plain runs."""
    key = (overlap, tuple(max_new))
    if key not in _plain_outputs:
        _plain_outputs[key] = run_prompts(make_scheduler(overlap), max_new)
    return _plain_outputs[key]


_plain_outputs: dict[tuple, dict] = {}


def scheduler_rids(scheduler: Scheduler) -> set[str]:
    return {r.rid for r in list(scheduler.waiting_queue) + scheduler.running_reqs}


@pytest.fixture(scope="module")
def plain():
    return drive(make_scheduler(), abort_at=5)


@pytest.mark.parametrize("overlap", [False, True])
def test_a_server_whose_policy_stays_plain_never_runs_the_draft(plain, overlap):
    scheduler = make_scheduler(overlap, speculative_policy="never")
    calls = count_draft_forwards(scheduler)
    out = drive(scheduler, abort_at=5)
    for rid in ("r0", "r1", "r3", "r4"):
        assert out[rid]["ids"] == plain[rid]["ids"], rid
        assert out[rid]["verify_ct"] == 0
    assert out["r4"]["cached"] > 0  # target-only entries serve requests the draft does not follow
    assert calls[0] == 0
    state = scheduler.get_internal_state()
    assert state["spec_prompts_without_draft"] == 5 and state["spec_running_without_draft"] == 0
    assert set(state["spec_steps_by_k"]) == {"0"}


@pytest.mark.parametrize("sync", ["warm", "catch-up"])
def test_draft_follows_all_makes_a_plain_policy_run_the_draft_following_plain_step(monkeypatch, plain, sync):
    """SGLANG_DRAFT_FOLLOWS_ALL=1 (benchmarks only): the draft reads every prompt although the
    policy never speculates, so each plain step is the one of requests the draft follows (warm:
    with the draft's extend; catch-up: aux states kept). Outputs stay plain decoding's."""
    monkeypatch.setenv("SGLANG_DRAFT_FOLLOWS_ALL", "1")  # read as the scheduler starts (bench_hooks)
    scheduler = make_scheduler(True, speculative_policy="never", speculative_draft_sync=sync)
    calls = count_draft_forwards(scheduler)
    out = drive(scheduler, abort_at=5)
    for rid in ("r0", "r1", "r3", "r4"):
        assert out[rid]["ids"] == plain[rid]["ids"], rid
        assert out[rid]["verify_ct"] == 0
    state = scheduler.get_internal_state()
    assert state["spec_prompts_without_draft"] == 0
    assert set(state["spec_steps_by_k"]) == {"0"}
    # The draft's passes over the prompts, and (warm) its extend on every plain step.
    plain_steps = state["spec_steps_by_k"]["0"]
    assert calls[0] > plain_steps if sync == "warm" else 0 < calls[0] < plain_steps


@pytest.mark.parametrize("overlap", [False, True])
def test_requests_with_and_without_the_draft_share_speculative_steps_losslessly(plain, overlap):
    """r1 and r3 (and r4) are admitted without the draft; every k in turn, r2 aborted mid-run."""
    scheduler = make_scheduler(overlap, speculative_policy="always")
    scheduler.spec.draft_reads_prompt = lambda req, joining: req.rid in ("r0", "r2")
    steps = []
    scheduler.spec.plan_step = lambda reqs: steps.append([3, 0, 1, 2, 3][len(steps) % 5]) or steps[-1]
    out = drive(scheduler, abort_at=5)
    for rid in ("r0", "r1", "r3", "r4"):
        assert out[rid]["ids"] == plain[rid]["ids"], rid
    assert out["r1"]["verify_ct"] == out["r3"]["verify_ct"] == out["r4"]["verify_ct"] == 0
    assert out["r0"]["verify_ct"] > 0
    assert {0, 1, 2, 3} <= set(steps)
    assert scheduler.get_internal_state()["spec_prompts_without_draft"] == 3


def test_the_threshold_policy_admits_past_its_threshold_without_the_draft():
    """threshold 2: the third and fourth requests join a batch of 3 and 4, where the policy would
    not speculate, so the draft skips them; r3 stays plain also once r0 and r2 are done and the
    batch of 2 speculates (too few of its tokens are left for the draft to adopt it)."""
    max_new = [3, 30, 3, 30]

    plain_out = plain_outputs(False, max_new)
    scheduler = make_scheduler(speculative_policy="threshold", speculative_threshold=2)
    out = run_prompts(scheduler, max_new)
    assert all(out[f"r{i}"] == plain_out[f"r{i}"] for i in range(4))
    assert out["r1.verify_ct"] > 0 and out["r2.verify_ct"] == out["r3.verify_ct"] == 0
    state = scheduler.get_internal_state()
    assert state["spec_prompts_without_draft"] == 2
    assert state["spec_steps_by_k"].get("3", 0) > 0 and state["spec_steps_by_k"].get("0", 0) > 0


def run_alone(scheduler: Scheduler, rid: str, ids: list[int], cached: dict) -> list[int]:
    """One request to its end; records its cached prompt tokens in `cached`."""
    submit(scheduler, rid, ids, 8)
    out = []
    while scheduler.has_work():
        result = scheduler.step()
        for j, r in enumerate(result.rids if result else ()):
            out.extend(result.new_token_ids[j])
        for req in scheduler.running_reqs:
            cached[req.rid] = req.cached_tokens
    assert_idle_kv_accounting(scheduler.get_internal_state())
    return out


def test_target_only_cache_entries_are_taken_over_by_a_request_the_draft_follows():
    prompt = [205, 300, 1100, 52, 9, 77, 1500, 12, 40, 41]
    longer = prompt + [7, 8, 9]
    reference = make_scheduler()
    expected = {name: run_alone(reference, name, ids, {}) for name, ids in (("p", prompt), ("l", longer))}

    scheduler = make_scheduler(speculative_policy="always")
    scheduler.spec.draft_reads_prompt = lambda req, joining: req.rid not in ("a", "b")
    cached: dict[str, int] = {}
    assert run_alone(scheduler, "a", prompt, cached) == expected["p"]  # cached as target-only entries
    assert run_alone(scheduler, "b", longer, cached) == expected["l"]
    assert cached["b"] >= len(prompt)  # a request without the draft reuses them
    assert run_alone(scheduler, "c", prompt, cached) == expected["p"]
    assert cached["c"] == 0  # no draft KV there: a request the draft follows recomputes them...
    assert run_alone(scheduler, "d", prompt, cached) == expected["p"]
    # ...and hands its slots to the tree: d hits what a cache with draft KV gives (the prompt but its
    # last token, which is always computed, less the position before it, whose draft KV is redone).
    assert cached["d"] == len(prompt) - 2
    assert scheduler.get_internal_state()["spec_verifies"] > 0


@pytest.mark.parametrize("sync", ["warm", "catch-up"])
def test_an_estimate_gone_low_is_refreshed_by_an_exploring_request(monkeypatch, sync):
    """The cost policy's estimate, pooled and long-run, says the draft never hits, so requests are
    admitted without it and nothing updates the estimate. After EXPLORE_EVERY such admissions in a row the next one
    gets the draft (speculation could pay at batch 1 at the prior): its plain steps' probes (warm)
    or the speculative steps taken while it decodes (catch-up, whose plain steps do not probe)
    show the draft is good now (simulated accept length 3), and the requests after it speculate."""
    from sglang.srt.managers.spec_scheduling import EXPLORE_EVERY
    from sglang.srt.speculative.cost_model import CostTable
    from sglang.srt.speculative.spec_policy import make_policy

    monkeypatch.setenv("SGLANG_SIMULATE_ACC_LEN", "3.0")
    scheduler = make_scheduler(speculative_policy="cost", speculative_draft_sync=sync)
    cost = CostTable({1: 0.010}, {(1, 1): 0.011, (1, 3): 0.013})  # speculation pays at batch 1 if a_1 > ~0.2
    scheduler.spec.policy = make_policy("cost", 3, cost=cost)
    # The table stands for the costs here: learned from this CPU's own steps, the policy would price
    # speculation by what it costs a CPU (often more than it gains) and never explore.
    monkeypatch.setattr(scheduler.spec.policy, "observe_step_seconds", lambda *args: None)
    estimator = scheduler.spec.policy.estimator
    estimator._pooled = [0.0, 0.0, 0.0]  # gone low, for long: new requests are judged at the long-run rates too
    estimator._long_run[:] = 0.0
    verify_ct = []
    for i in range(EXPLORE_EVERY + 8):  # one at a time
        submit(scheduler, f"q{i}", [205, 300 + i, 1100, 52], 24)
        while scheduler.has_work():
            result = scheduler.step()
            for j, rid in enumerate(result.rids if result else ()):
                if result.finished_reasons[j] is not None:
                    verify_ct.append(result.spec_verify_ct[j])
    state = scheduler.get_internal_state()
    assert_idle_kv_accounting(state)
    assert verify_ct[:EXPLORE_EVERY] == [0] * EXPLORE_EVERY  # admitted without the draft
    assert state["spec_draft_explorations"] == 1  # then one explorer refreshed the estimate...
    assert all(n > 0 for n in verify_ct[EXPLORE_EVERY + 1 :]), (
        verify_ct,
        state["spec_policy"],
    )  # ...and the later requests speculate
    assert state["spec_prompts_without_draft"] == EXPLORE_EVERY


def test_a_policy_that_cannot_pay_never_explores():
    """Under `never` (and above a threshold) speculation could not pay at any acceptance: however
    many requests are admitted without the draft, none gets it."""
    for spec in (dict(speculative_policy="never"), dict(speculative_policy="threshold", speculative_threshold=0)):
        scheduler = make_scheduler(**spec)
        calls = count_draft_forwards(scheduler)
        for i in range(40):
            submit(scheduler, f"q{i}", [205, 300 + i, 1100], 2)
        while scheduler.has_work():
            scheduler.step()
        state = scheduler.get_internal_state()
        assert calls[0] == 0 and state["spec_draft_explorations"] == 0, spec
        assert state["spec_prompts_without_draft"] == 40


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("sync", ["warm", "catch-up"])
def test_a_request_admitted_without_the_draft_speculates_once_the_load_drops(overlap, sync):
    """threshold 2: r2 and r3 join batches of 3 and 4 and are admitted without the draft. Once
    r0, r1 and r2 are done, r3 (long, with most of its tokens still to come) decodes alone, where
    the policy would speculate: the draft is run over its context (from recomputed target aux
    states) and it speculates for the rest of its run, with plain decoding's output."""
    max_new = [3, 3, 3, 120]

    plain_out = plain_outputs(overlap, max_new)
    scheduler = make_scheduler(
        overlap, speculative_policy="threshold", speculative_threshold=2, speculative_draft_sync=sync
    )
    out = run_prompts(scheduler, max_new)
    assert all(out[f"r{i}"] == plain_out[f"r{i}"] for i in range(4))
    state = scheduler.get_internal_state()
    assert state["spec_prompts_without_draft"] == 2 and state["spec_draft_adoptions"] == 1
    assert out["r2.verify_ct"] == 0  # too short to be worth the draft's pass over its context
    # r3 decoded alone for ~117 tokens; adopted within ADOPT_CHECK_EVERY steps, it verified for most.
    assert out["r3.verify_ct"] > 20, out["r3.verify_ct"]


def test_adoption_waits_for_enough_tokens_left_and_is_never_under_a_policy_that_cannot_pay():
    from sglang.srt.managers.spec_scheduling import ADOPT_MIN_REMAINING

    for spec, max_new in (
        (dict(speculative_policy="never"), 200),
        (dict(speculative_policy="threshold", speculative_threshold=2), ADOPT_MIN_REMAINING - 10),
    ):
        scheduler = make_scheduler(**spec)
        for i, ids in enumerate(PROMPTS):
            submit(scheduler, f"r{i}", ids, [3, 3, 3, max_new][i])
        while scheduler.has_work():
            scheduler.step()
        state = scheduler.get_internal_state()
        assert_idle_kv_accounting(state)
        assert state["spec_draft_adoptions"] == 0, spec
        if spec["speculative_policy"] == "never":
            assert state["spec_verifies"] == 0


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("sync", ["warm", "catch-up"])
def test_adoption_gives_the_draft_the_kv_it_would_have_had_following_the_request_all_along(monkeypatch, sync, overlap):
    """The draft's KV at every position of an adopted request (r3, as above) is what it is for
    the same request followed from its admission: adoption leaves no position uncovered."""
    import torch

    from sglang.srt.speculative.draft_catch_up import DraftCatchUp

    def draft_kv(scheduler, req, upto):
        table = scheduler.tp_worker.model_runner.req_to_token_pool.req_to_token
        slots = table[req.req_pool_idx, :upto].long()
        pool = scheduler.tp_worker.draft_runner.token_to_kv_pool
        return torch.stack([pool.get_key_buffer(0)[slots], pool.get_value_buffer(0)[slots]])

    adopted = {}
    adopt = DraftCatchUp.adopt

    def recording_adopt(self, batch, rows):
        reqs = [req for req in batch.reqs if req.draft.adopting]
        adopt(self, batch, rows)
        for req in reqs:
            adopted[req.rid] = (req.kv_len, req.all_ids[: req.kv_len], draft_kv(scheduler, req, req.kv_len))

    monkeypatch.setattr(DraftCatchUp, "adopt", recording_adopt)
    scheduler = make_scheduler(
        overlap, speculative_policy="threshold", speculative_threshold=2, speculative_draft_sync=sync
    )
    for i, ids in enumerate(PROMPTS):
        submit(scheduler, f"r{i}", ids, [3, 3, 3, 120][i])
    while scheduler.has_work():
        scheduler.step()
    ((upto, ids, kv),) = adopted.values()
    assert upto > len(PROMPTS[3]) + 10  # adopted after plain steps of its own

    reference = make_scheduler(speculative_policy="always")
    submit(reference, "r3", PROMPTS[3], 120)
    want = None
    while reference.has_work() and want is None:
        reference.step()
        req = reference.running_reqs[0]
        if req.kv_len >= upto + 8:  # positions below upto are final (rewritten by draft extends)
            assert req.all_ids[:upto] == ids
            want = draft_kv(reference, req, upto)
    assert want is not None
    torch.testing.assert_close(kv, want, rtol=1e-3, atol=1e-3)


def test_a_draining_batch_of_many_long_contexts_is_not_adopted():
    """Four requests with long contexts admitted without the draft (threshold 0 at admission),
    then the policy would speculate (threshold raised): their contexts together are more than
    ADOPT_CONTEXT_PER_REMAINING tokens per token left, so the passes are not worth it."""
    from sglang.srt.managers.spec_scheduling import ADOPT_CONTEXT_PER_REMAINING, ADOPT_MIN_REMAINING

    scheduler = make_scheduler(speculative_policy="threshold", speculative_threshold=0)
    max_new = ADOPT_MIN_REMAINING + 20
    length = ADOPT_CONTEXT_PER_REMAINING * max_new // 4 + 10  # four of them exceed the budget
    for i in range(4):
        submit(scheduler, f"r{i}", [(37 * i + j) % 5000 + 10 for j in range(length)], max_new)
    scheduler.step()  # admitted without the draft
    scheduler.spec.policy.threshold = 8  # now speculation would pay for the batch
    while scheduler.has_work():
        scheduler.step()
    state = scheduler.get_internal_state()
    assert_idle_kv_accounting(state)
    assert state["spec_prompts_without_draft"] == 4 and state["spec_draft_adoptions"] == 0


def test_a_request_released_before_its_adoption_launches_leaves_target_only_cache_entries():
    """r3 is marked for adoption, then retracted (as when the step's KV allocation fails) before
    a step runs the draft over its context: its positions have no draft KV, so the cache must keep
    them as target-only entries, which a request the draft follows does not match."""
    from sglang.srt.managers.spec_scheduling import ADOPT_CHECK_EVERY

    scheduler = make_scheduler(speculative_policy="threshold", speculative_threshold=2)
    for i, ids in enumerate(PROMPTS):
        submit(scheduler, f"r{i}", ids, [3, 3, 3, 120][i])
    while {req.rid for req in scheduler.running_reqs} != {"r3"}:
        scheduler.step()
    (r3,) = scheduler.running_reqs
    assert r3.draft.cold
    for _ in range(ADOPT_CHECK_EVERY):  # one adoption check is due within these
        scheduler.spec.review_following(scheduler.running_reqs, spec_step_in_flight=False)
    assert r3.draft.adopting and not r3.draft.cold
    scheduler._retract(scheduler.running_reqs.pop())
    tree = scheduler.kv_manager.tree_cache
    assert len(tree.match_prefix(r3.all_ids).indices) > len(PROMPTS[3])  # cached...
    assert len(tree.match_prefix(r3.all_ids, draft_only=True).indices) == 0  # ...as target-only
    assert scheduler.get_internal_state()["spec_draft_adoptions"] == 0  # counted when the draft runs
    while scheduler.has_work():  # r3 resumes (now followed by the draft) and finishes
        scheduler.step()
    assert_idle_kv_accounting(scheduler.get_internal_state())


@pytest.mark.parametrize("sync", ["warm", "catch-up"])
def test_the_draft_stops_following_while_plain_decoding_holds_and_adopts_when_the_load_drops(sync):
    """threshold 2: r0 and r1 are admitted with the draft, r2 and r3 without; at batch 4 the policy
    decodes plainly. After DROP_AFTER_PLAIN_STEPS plain steps the draft stops following r0 and r1,
    so the plain steps run the target alone (no draft forward); once r0 and r1 are done, the draft
    adopts r2 and r3, which speculate. Outputs stay plain decoding's, and the dropped requests'
    positions are cached as target-only entries."""
    from sglang.srt.managers.spec_scheduling import DROP_AFTER_PLAIN_STEPS

    max_new = [60, 60, 200, 200]
    plain_out = plain_outputs(True, max_new)
    scheduler = make_scheduler(
        True, speculative_policy="threshold", speculative_threshold=2, speculative_draft_sync=sync
    )
    calls = count_draft_forwards(scheduler)
    for i, ids in enumerate(PROMPTS):
        submit(scheduler, f"r{i}", ids, max_new[i])
    out, calls_while_dropped, finish = {}, [], scheduler._finish
    scheduler._finish = lambda req, reason: (
        out.setdefault(req.rid + ".all_ids", list(req.all_ids)) and finish(req, reason)
    )
    while scheduler.has_work():
        result = scheduler.step()
        for j, rid in enumerate(result.rids if result else ()):
            out.setdefault(rid, []).extend(result.new_token_ids[j])
            out[rid + ".verify_ct"] = result.spec_verify_ct[j]
        if scheduler.spec.num_draft_drops and len(scheduler.running_reqs) == 4:
            calls_while_dropped.append(calls[0])
    state = scheduler.get_internal_state()
    assert_idle_kv_accounting(state)
    assert all(out[f"r{i}"] == plain_out[f"r{i}"] for i in range(4))
    assert state["spec_draft_drops"] == 2 and state["spec_draft_adoptions"] == 2
    # From the drop until r0 and r1 finish (60 - DROP_AFTER_PLAIN_STEPS steps), the draft never runs.
    assert len(calls_while_dropped) >= 60 - DROP_AFTER_PLAIN_STEPS - 8 and len(set(calls_while_dropped)) == 1
    assert out["r0.verify_ct"] == out["r1.verify_ct"] == 0 < out["r2.verify_ct"]
    tree = scheduler.kv_manager.tree_cache
    ids = out["r0.all_ids"][:-1]
    assert len(tree.match_prefix(ids).indices) > len(PROMPTS[0])
    assert len(tree.match_prefix(ids, draft_only=True).indices) == 0


def test_explorers_are_spaced_by_decode_steps():
    """At a large batch admissions come every step or two: an explorer (a request given the draft
    to refresh the acceptance estimate) comes at most once in EXPLORE_MIN_DECODE_STEPS decode steps,
    however many admissions without the draft came in a row."""
    from sglang.srt.managers.spec_scheduling import EXPLORE_EVERY, EXPLORE_MIN_DECODE_STEPS

    scheduler = make_scheduler(speculative_policy="always")
    submit(scheduler, "x", [205, 300, 1100], 8)
    req, spec = scheduler.waiting_queue[0], scheduler.spec
    spec.admissions_without_draft = EXPLORE_EVERY
    spec.policy.would_speculate = lambda *args: False  # the estimate says no...
    spec.policy.would_speculate_at_prior = lambda *args: True  # ...but it could pay
    spec._decode_steps_since_explorer = EXPLORE_MIN_DECODE_STEPS - 1
    with spec.admitting(scheduler.running_reqs):
        spec.decide_admission(req, [])
    assert req.draft.cold
    spec._decode_steps_since_explorer = EXPLORE_MIN_DECODE_STEPS
    with spec.admitting(scheduler.running_reqs):
        spec.decide_admission(req, [])
    spec.on_admission(req)
    assert not req.draft.cold and req.draft.explorer and spec.num_draft_explorations == 1
