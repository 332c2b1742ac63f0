"""The per-step mode switch (issue 8) through the real Scheduler, on the CPU in float32: whatever
each step chooses (a plain step or k drafts, by any policy), greedy output is plain decoding's,
sampled output follows the target's distribution, the KV accounting holds (aborts and radix
hits included), and the choice, the modes' step counts and the cost table are reported.
The policies' own logic (estimates, cost, hysteresis, no flapping) is in test_spec_policy.py."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch

from sglang import demo
from sglang.srt.managers.io_struct import AbortReq, TokenizedGenerateReqInput
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs, prepare_server_args
from sglang.srt.speculative.cost_model import CostTable, LearnedCost
from sglang.srt.speculative.exploration import Exploration
from sglang.srt.speculative.cost_policy import REEVALUATE_EVERY
from sglang.srt.speculative import spec_policy
from sglang.srt.speculative.spec_policy import SpecPolicy, reachable_steps
from sglang.srt.sampling.simulated_acceptance import simulated_accept_rate
from sglang.test.runner_utils import run_to_completion
from sglang.test.sampling_checks import chi_square_pvalue, exact_token_distributions
from sglang.test.server_fixture import assert_idle_kv_accounting
from sglang.test.tiny_models import make_tiny_eagle3_draft

PROMPTS = [[5, 17, 300, 41, 9, 77], [12, 13, 14], list(range(100, 140)), [2000, 1999, 7, 7, 7]]
MAX_NEW = [7, 24, 40, 2]
ABORTED = "r2"


def alternating_k(i: int) -> int:
    """A test-only policy: every k the worker can run, in turn (0 = a plain step)."""
    return [0, 3, 1, 0, 0, 3, 2][i % 7]


POLICIES = {
    "never": dict(speculative_policy="never"),
    "threshold": dict(speculative_policy="threshold", speculative_threshold=2),
    "cost": dict(speculative_adaptive=True),
    "alternating": dict(speculative_policy="always"),  # plan_step replaced below
    "exploring": dict(speculative_adaptive=True),  # made to switch every few steps below
}


# A fixed start-up table (seconds per step at batch buckets 1, 8, 64), so that what the cost policy
# decides does not depend on how fast this machine happens to be while the test runs.
FIXED_PRIOR = CostTable(
    plain={1: 1.0e-3, 8: 1.2e-3, 64: 2.0e-3},
    spec={
        (bs, k): seconds * (1 + 0.3 * k) for bs, seconds in ((1, 1.0e-3), (8, 1.2e-3), (64, 2.0e-3)) for k in (1, 2, 3)
    },
)


def learned_ratio(k: int) -> float:
    """What the server 'learns' a step of k costs, against the prior: steps of 2 and 3 drafts
    twice as costly as the table says, so the learned costs move the choice off the prior's."""
    return 2.0 if k >= 2 else 1.0


def explore_often(scheduler) -> None:
    """The cost policy with exploration bursts of 2 steps every 3 steps and no dwell, deciding
    from a fixed prior and from step times fed by learned_ratio instead of the wall clock: the
    learned costs and the bursts switch k every few steps, the same steps on every run."""
    policy = scheduler.spec.policy
    policy.min_dwell = 1
    policy.far_reevaluate_every = REEVALUATE_EVERY  # however clear a choice looks, re-evaluated every few steps
    policy.exploration = Exploration(steps=2, max_share=1.0, intervals=((math.inf, 3),))
    policy.cost = LearnedCost(FIXED_PRIOR)

    def observe(batch_size: int, k: int, context_tokens: int, seconds: float) -> None:
        policy.cost.observe(
            batch_size, k, context_tokens, FIXED_PRIOR.seconds(batch_size, k, context_tokens) * learned_ratio(k)
        )

    policy.observe_step_seconds = observe


def record_cached_tokens(scheduler) -> dict[str, int]:
    """{rid: prompt tokens served from the radix cache}, filled as requests finish."""
    cached = {}
    finish = scheduler._finish

    def recorded_finish(req, reason):
        cached[req.rid] = req.cached_tokens
        finish(req, reason)

    scheduler._finish = recorded_finish
    return cached


def run(pair: tuple[str, str], overlap: bool, spec: dict | None, choose=None) -> tuple[dict, dict]:
    """Four requests; r2 is aborted at step 5; r4 (r0's prompt: a radix hit) arrives once r0 is done."""
    target, draft = pair
    kwargs = (
        dict(speculative_algorithm="EAGLE3", speculative_draft_model_path=draft, speculative_num_steps=3, **spec)
        if spec is not None
        else {}
    )
    scheduler = Scheduler(
        ServerArgs(model_path=target, dtype="float32", device="cpu", disable_overlap_schedule=not overlap, **kwargs)
    )
    if choose is not None:
        steps = []
        scheduler.spec.plan_step = lambda reqs: steps.append(choose(len(steps))) or steps[-1]
    if spec is POLICIES["exploring"]:
        explore_often(scheduler)

    def add(rid: str, ids: list[int], max_new: int) -> None:
        params = SamplingParams(max_new_tokens=max_new, temperature=0, ignore_eos=True)
        scheduler.add_request(TokenizedGenerateReqInput(rid, ids, params, stream=False))

    for i, ids in enumerate(PROMPTS):
        add(f"r{i}", ids, MAX_NEW[i])
    cached = record_cached_tokens(scheduler)
    added = []

    def on_step(step: int) -> None:
        if "r0" in cached and "r4" not in added:
            added.append("r4")
            add("r4", PROMPTS[0], 12)
        if step == 5:
            scheduler.abort_request(AbortReq(ABORTED))

    outputs = run_to_completion(scheduler, on_step)
    state = scheduler.get_internal_state()
    assert_idle_kv_accounting(state)
    state["cached_tokens_by_rid"] = cached
    return outputs, state


@pytest.fixture(scope="module")
def demo_paths():
    return demo.TARGET_PATH, demo.DRAFT_PATH


@pytest.fixture(scope="module")
def tiny_paths(tiny_model_paths, tmp_path_factory):
    target = tiny_model_paths["llama"]
    return target, make_tiny_eagle3_draft(str(tmp_path_factory.mktemp("switch_draft")), target, draft_vocab_size=200)


def plain_reference(pair: tuple[str, str]) -> dict:
    """run(pair)'s outputs with plain decoding (greedy: the same on every call), computed once per
    pair: a dozen tests compare against it."""
    if pair not in _plain_outputs:
        _plain_outputs[pair], _ = run(pair, overlap=False, spec=None)
    return _plain_outputs[pair]


_plain_outputs: dict[tuple[str, str], dict] = {}


def check_against_plain(pair, overlap: bool, policy: str) -> dict:
    reference = plain_reference(pair)
    outputs, state = run(pair, overlap, POLICIES[policy], alternating_k if policy == "alternating" else None)
    assert outputs[ABORTED]["reason"]["type"] == "abort"
    for rid in ("r0", "r1", "r3", "r4"):
        assert outputs[rid] == reference[rid], (policy, overlap, rid)
    assert_radix_hit(state, policy)
    return state


def assert_radix_hit(state: dict, policy: str) -> None:
    """r4 reused r0's prompt from the radix cache. Not asserted for the cost policy: whether the
    draft follows r0 and r4 is decided at admission from step times measured on this CPU (the
    table at start-up, the host's time per step since), and a prompt cached without draft KV is
    no hit for a request the draft follows."""
    if policy not in ("cost", "exploring"):
        assert state["cached_tokens_by_rid"]["r4"] > 0


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("policy", [name for name in POLICIES if name != "exploring"])  # its own test below
def test_every_policy_gives_plain_decodings_output_on_the_demo_pair(demo_paths, policy, overlap):
    state = check_against_plain(demo_paths, overlap, policy)
    steps = {int(k): n for k, n in state["spec_steps_by_k"].items()}
    assert state["spec_policy"]["name"] == (
        "always" if policy == "alternating" else "cost" if policy == "cost" else policy
    )
    if policy == "never":
        assert set(steps) == {0}
    elif policy == "threshold":  # 4 running requests decode plainly, 2 or fewer speculate
        assert steps.get(0, 0) > 0 and steps.get(3, 0) > 0
    elif policy == "alternating":
        assert {0, 1, 2, 3} <= set(steps)
    else:
        assert sum(steps.values()) > 0


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("policy", ["alternating", "cost"])
def test_switching_on_the_tiny_random_pair_gives_plain_decodings_output(tiny_paths, policy, overlap):
    check_against_plain(tiny_paths, overlap, policy)


class EveryOtherStepPolicy(SpecPolicy):
    """A policy a test adds: k_max on every other decode step, plain steps between."""

    name = "every-other"
    help = "k_max on every other step"

    def _choose(self, rids: list[str], context_tokens: int, num_plain_only: int) -> int:
        return self.k_max if sum(self.steps_per_k.values()) % 2 else 0

    def _would_speculate(self, rids: list[str], context_tokens: int, num_plain_only: int) -> bool:
        return True


def test_a_policy_registered_from_outside_serves_plain_decodings_output(demo_paths, monkeypatch, capsys):
    """Adding a policy is a SpecPolicy subclass and register_policy: --speculative-policy takes its
    name and --help lists it, and the real scheduler serves with it (its plain and speculative steps
    giving plain decoding's output)."""
    monkeypatch.setattr(spec_policy, "_POLICIES", dict(spec_policy._POLICIES))
    spec_policy.register_policy("every-other", EveryOtherStepPolicy)
    with pytest.raises(SystemExit):
        prepare_server_args(["--help"])
    assert "every-other (k_max on every other step)" in " ".join(capsys.readouterr().out.split())
    args = ["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3"]
    assert prepare_server_args(args + ["--speculative-policy", "every-other"]).speculative_policy == "every-other"
    reference = plain_reference(demo_paths)
    outputs, state = run(demo_paths, overlap=True, spec=dict(speculative_policy="every-other"))
    for rid in ("r0", "r1", "r3", "r4"):
        assert outputs[rid] == reference[rid], rid
    assert state["spec_policy"]["name"] == "every-other"
    assert {int(k) for k in state["spec_steps_by_k"]} == {0, 3}, state["spec_steps_by_k"]


@pytest.mark.parametrize("overlap", [False, True])
def test_exploration_and_learned_costs_switching_every_few_steps_give_plain_decodings_output(demo_paths, overlap):
    """The cost policy with exploration on and its learned costs deciding, switching every few
    steps over mixed batches, an abort and a radix hit: plain decoding's output, KV accounted."""
    state = check_against_plain(demo_paths, overlap, "exploring")
    policy = state["spec_policy"]
    assert policy["exploration"]["bursts"] >= 2 and policy["switches"] >= 4, policy  # in ~15 decode steps
    assert len(policy["steps_per_k"]) >= 2, policy
    assert policy["cost"]["samples"], "the learned costs were fed"
    assert policy["decisions"] >= 1, "the learned costs moved the choice, not exploration alone"


@pytest.mark.parametrize("sync", ["warm", "catch-up", "exploring"])
def test_sampling_stays_exact_under_switching(sync):
    """Chi-square of output tokens 2 and 3 against the target's exact distribution (top-k 6,
    temperature 1) when steps alternate between plain, k = 1 and k = 2 (or, "exploring", when the
    cost policy's exploration and learned costs switch every few steps)."""
    prompt_ids, top_k, num_samples = [205, 300, 1100, 52, 9], 6, 1200
    policy = dict(speculative_adaptive=True) if sync == "exploring" else dict(speculative_draft_sync=sync)
    scheduler = Scheduler(
        ServerArgs(
            dtype="float32",
            device="cpu",
            speculative_algorithm="EAGLE3",
            speculative_num_steps=2,
            disable_radix_cache=True,
            max_running_requests=64,
            **policy,
        )
    )
    choices = []
    if sync == "exploring":
        explore_often(scheduler)
    else:
        scheduler.spec.plan_step = lambda reqs: choices.append([0, 2, 1][len(choices) % 3]) or choices[-1]
    for seed in range(num_samples):
        params = SamplingParams(max_new_tokens=3, temperature=1.0, top_k=top_k, ignore_eos=True, sampling_seed=seed)
        scheduler.add_request(TokenizedGenerateReqInput(f"s{seed}", prompt_ids, params, stream=False))
    outputs = run_to_completion(scheduler)
    state = scheduler.get_internal_state()
    assert_idle_kv_accounting(state)
    assert len(state["spec_steps_by_k"]) >= 2 and 0 < state["spec_accept_rate"] < 1, state["spec_steps_by_k"]
    exact = exact_token_distributions(demo.TARGET_PATH, prompt_ids, top_k)
    for position in (1, 2):
        samples = [outputs[f"s{seed}"]["ids"][position] for seed in range(num_samples)]
        assert chi_square_pvalue(samples, exact[position]) > 1e-3, position


def test_cost_policy_measures_its_table_and_reports_its_choices(demo_paths):
    outputs, state = run(demo_paths, overlap=True, spec=POLICIES["cost"])
    policy = state["spec_policy"]
    cost = policy["cost"]["prior"]
    assert set(cost["spec_ms"]) == {1, 3}  # the default candidates: 0, 1 and k_max
    assert all(ms > 0 for ms in cost["plain_ms"].values())
    # Each token of context costs a step its KV read: the target's once, the draft's once per
    # draft forward (k chain steps and the extend). Same heads and head size here: the bytes go
    # by layer count.
    per_token = cost["context_ns_per_token"]
    assert set(per_token) == {0, 1, 3} and 0 < per_token[0] < per_token[1] < per_token[3]
    layers = [json.load(open(os.path.join(path, "config.json")))["num_hidden_layers"] for path in demo_paths]
    target, draft = layers
    assert per_token[3] / per_token[1] == pytest.approx((target + 4 * draft) / (target + 2 * draft), rel=1e-6)
    steps_by_k = {int(k): n for k, n in state["spec_steps_by_k"].items()}
    chosen = {int(k): n for k, n in policy["steps_per_k"].items()}
    # Every step the policy chose ran with that k (a retraction may ask it once more).
    assert set(steps_by_k) <= set(chosen) <= {0, 1, 3}
    assert all(chosen[k] >= n for k, n in steps_by_k.items())
    assert policy["k"] in chosen and policy["switches"] <= sum(chosen.values()) - 1
    # The learned cost of a step, per k and bucket, from steady decode steps (on the CPU the
    # forward runs on the host, so these are whole steps), only for the k that ran.
    learned, samples = policy["cost"]["learned_ms"], policy["cost"]["samples"]
    assert set(samples) <= set(chosen) and set(learned) <= set(samples), policy["cost"]
    assert sum(n for by_bucket in samples.values() for n in by_bucket.values()) > 0, policy["cost"]
    assert all(ms > 0 for by_bucket in learned.values() for ms in by_bucket.values())
    exploration = policy["exploration"]
    assert 0 <= exploration["share"] <= 1 and exploration["steps"] <= sum(chosen.values()), exploration
    json.dumps(state)  # /get_server_info serves it as JSON


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--speculative-policy", "sometimes"], "--speculative-policy"),
        (["--speculative-policy", "threshold"], "--speculative-threshold"),
        (["--speculative-threshold", "4"], "--speculative-threshold applies to --speculative-policy threshold"),
        (["--speculative-adaptive", "--speculative-candidate-steps", "0,5"], "--speculative-candidate-steps"),
        (["--speculative-adaptive", "--speculative-candidate-steps", "0,x"], "--speculative-candidate-steps"),
    ],
)
def test_bad_switch_flags_are_refused_naming_the_flag(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        prepare_server_args(["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3"] + argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_switch_flags_need_a_draft(capsys):
    with pytest.raises(SystemExit):
        prepare_server_args(["--speculative-adaptive"])
    assert "--speculative-adaptive needs --speculative-algorithm" in capsys.readouterr().err


def test_adaptive_config_file_sets_the_candidates(tmp_path, capsys):
    good = tmp_path / "adaptive.json"
    good.write_text(json.dumps({"1": [0, 1, 3], "16": {"candidate_steps": [0, 1]}, "64": [0], "ema_alpha": 0.1}))
    args = prepare_server_args(
        [
            "--speculative-algorithm",
            "EAGLE3",
            "--speculative-num-steps",
            "3",
            "--speculative-adaptive-config",
            str(good),
        ]
    )
    assert args.speculative_policy == "cost"
    assert reachable_steps(args) == [1, 3]
    too_many = tmp_path / "too_many.json"
    too_many.write_text(json.dumps({"1": [0, 5]}))
    with pytest.raises(SystemExit):
        prepare_server_args(
            [
                "--speculative-algorithm",
                "EAGLE3",
                "--speculative-num-steps",
                "3",
                "--speculative-adaptive-config",
                str(too_many),
            ]
        )
    assert "too_many.json" in capsys.readouterr().err


def test_help_documents_the_switch_flags(capsys):
    with pytest.raises(SystemExit):
        prepare_server_args(["--help"])
    text = capsys.readouterr().out
    for flag in (
        "--speculative-adaptive",
        "--speculative-adaptive-config",
        "--speculative-policy",
        "--speculative-threshold",
        "--speculative-candidate-steps",
    ):
        assert flag in text


def test_the_draft_state_after_plain_steps_is_the_state_after_speculative_ones(demo_paths):
    """Why resuming costs no acceptance with the draft kept warm: at every position both runs
    reach, the draft's next guess d_1 and its hidden state after plain steps (of a request admitted
    while speculating paid) equal those after speculative steps, so the first speculative step
    after any number of plain steps drafts exactly as in steady speculation."""
    prompt = [205, 300, 1100, 52, 9, 77, 1500, 12]

    def states(policy: str) -> dict[int, tuple[int, "torch.Tensor"]]:
        scheduler = Scheduler(
            ServerArgs(
                dtype="float32",
                device="cpu",
                speculative_algorithm="EAGLE3",
                speculative_num_steps=3,
                speculative_policy="always",
                disable_overlap_schedule=True,
            )
        )
        if policy == "plain":
            scheduler.spec.plan_step = lambda reqs: 0
        worker = scheduler.tp_worker
        params = SamplingParams(max_new_tokens=60, temperature=0, ignore_eos=True)
        scheduler.add_request(TokenizedGenerateReqInput("r", prompt, params, stream=False))
        seen = {}
        while scheduler.has_work():
            scheduler.step()
            if scheduler.running_reqs:
                row = scheduler.running_reqs[0].req_pool_idx
                seen[int(worker.next_start[row])] = (int(worker.next_draft[row]), worker.next_hidden[row].clone())
        return seen

    plain, spec = states("plain"), states("always")
    common = sorted(set(plain) & set(spec))
    assert len(common) >= 10, common  # speculation skipped positions, but met plain decoding often
    for position in common:
        assert plain[position][0] == spec[position][0], position
        torch.testing.assert_close(plain[position][1], spec[position][1], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("accept_length", [1.0, 2.0, 3.0])
def test_simulated_acceptance_gives_the_asked_accept_length(tiny_paths, monkeypatch, accept_length):
    """SGLANG_SIMULATE_ACC_LEN (benchmarks on random weights): a random draft accepts nothing,
    yet the engine verifies as if the draft were this good, with consistent KV accounting."""
    monkeypatch.setenv("SGLANG_SIMULATE_ACC_LEN", str(accept_length))
    target, draft = tiny_paths
    scheduler = Scheduler(
        ServerArgs(
            model_path=target,
            dtype="float32",
            device="cpu",
            speculative_algorithm="EAGLE3",
            speculative_draft_model_path=draft,
            speculative_num_steps=3,
        )
    )
    for i in range(8):
        params = SamplingParams(max_new_tokens=100, temperature=0, ignore_eos=True)
        scheduler.add_request(TokenizedGenerateReqInput(f"r{i}", [10 + i, 20, 30 + 2 * i], params, stream=False))
    outputs = run_to_completion(scheduler)
    state = scheduler.get_internal_state()
    assert_idle_kv_accounting(state)
    assert all(len(out["ids"]) == 100 for out in outputs.values())
    assert state["avg_spec_accept_length"] == pytest.approx(accept_length, rel=0.1)


def test_plain_steps_probe_at_the_simulated_rate(tiny_paths, monkeypatch):
    """Under SGLANG_SIMULATE_ACC_LEN the plain step's free probe hits at the simulated rate, not at
    the random draft's real ~0: a policy that went plain at high load must see speculation pay
    again when the load drops."""
    monkeypatch.setenv("SGLANG_SIMULATE_ACC_LEN", "3.0")
    target, draft = tiny_paths
    scheduler = Scheduler(
        ServerArgs(
            model_path=target,
            dtype="float32",
            device="cpu",
            speculative_algorithm="EAGLE3",
            speculative_draft_model_path=draft,
            speculative_num_steps=3,
            speculative_policy="always",
        )
    )
    scheduler.spec.plan_step = lambda reqs: 0  # plain steps of requests the draft follows
    for i in range(4):
        params = SamplingParams(max_new_tokens=80, temperature=0, ignore_eos=True)
        scheduler.add_request(TokenizedGenerateReqInput(f"r{i}", [10 + i, 20, 30 + 2 * i], params, stream=False))
    run_to_completion(scheduler)
    state = scheduler.get_internal_state()
    assert state["spec_steps_by_k"] == {"0": state["spec_plain_steps"]} and state["spec_plain_steps"] >= 80
    a_1 = state["spec_policy"]["acceptance_rates"][0]
    assert a_1 == pytest.approx(simulated_accept_rate(3.0, 3), abs=0.15)


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("policy", ["alternating", "threshold", "cost"])
def test_catch_up_strategy_gives_plain_decodings_output(demo_paths, policy, overlap):
    """--speculative-draft-sync catch-up: plain steps run the target only; the next speculative
    step first extends the draft over the positions it missed. Output, aborts, radix hits and
    the KV accounting as with the warm draft."""
    spec = {**POLICIES[policy], "speculative_draft_sync": "catch-up"}
    reference = plain_reference(demo_paths)
    outputs, state = run(demo_paths, overlap, spec, alternating_k if policy == "alternating" else None)
    for rid in ("r0", "r1", "r3", "r4"):
        assert outputs[rid] == reference[rid], (policy, overlap, rid)
    assert_radix_hit(state, policy)
    if policy != "cost":  # the cost policy's choices follow CPU timings measured at start-up
        assert state["spec_steps_by_k"].get("0", 0) > 0 and len(state["spec_steps_by_k"]) > 1


@pytest.mark.parametrize(
    "plain_run, catch_up_tokens",
    [
        (5, None),
        (80, None),  # 80 > CATCH_UP_BUFFER: the aux states are recomputed
        (5, 3),
        (80, 7),  # catch-ups split into forwards of at most 3 / 7 positions
    ],
)
def test_catch_up_leaves_the_draft_as_warm_plain_steps_do(demo_paths, plain_run, catch_up_tokens):
    """After a run of plain steps, the first speculative step of a catch-up draft proposes what a
    warm draft proposes: the same accept counts step by step, and the same output; also when
    the catch-up is split into several forwards."""
    prompt = [205, 300, 1100, 52, 9, 77, 1500, 12]

    def accepts(sync: str, overlap: bool):
        scheduler = Scheduler(
            ServerArgs(
                dtype="float32",
                device="cpu",
                speculative_algorithm="EAGLE3",
                speculative_num_steps=3,
                speculative_draft_sync=sync,
                disable_overlap_schedule=not overlap,
            )
        )
        if catch_up_tokens is not None:
            scheduler.tp_worker.draft_catch_up.tokens_per_forward = catch_up_tokens
        steps = []
        scheduler.spec.plan_step = lambda reqs: (
            steps.append(0 if len(steps) % (plain_run + 2) < plain_run else 3) or steps[-1]
        )
        record = scheduler.tp_worker.stats.record_step
        counts = []
        scheduler.tp_worker.stats.record_step = lambda num_out, phases, k: (
            counts.append(list(num_out)) or record(num_out, phases, k)
        )
        for i in range(2):
            params = SamplingParams(max_new_tokens=3 * plain_run + 30, temperature=0, ignore_eos=True)
            scheduler.add_request(TokenizedGenerateReqInput(f"r{i}", prompt[i:], params, stream=False))
        outputs = run_to_completion(scheduler)
        assert_idle_kv_accounting(scheduler.get_internal_state())
        return counts, outputs

    if plain_run not in _warm_accepts:  # the catch-up split plays no part in a warm draft's run
        _warm_accepts[plain_run] = accepts("warm", overlap=False)
    warm_counts, warm_out = _warm_accepts[plain_run]
    for overlap in (False, True):
        counts, out = accepts("catch-up", overlap)
        assert out == warm_out
        assert counts == warm_counts and any(n > 1 for step in counts for n in step), overlap


_warm_accepts: dict[int, tuple[list, dict]] = {}  # {plain_run: the warm draft's accept counts and outputs}


@pytest.mark.parametrize("sync, cached_beyond_prompt", [("warm", True), ("catch-up", False)])
def test_positions_without_draft_kv_are_not_cached(demo_paths, sync, cached_beyond_prompt):
    """A request that ends after plain steps the draft never caught up on leaves those positions
    out of the radix cache (a later hit would draft from missing KV); a warm draft caches them."""
    scheduler = Scheduler(
        ServerArgs(
            dtype="float32",
            device="cpu",
            speculative_algorithm="EAGLE3",
            speculative_num_steps=3,
            speculative_policy="always",
            speculative_draft_sync=sync,
            disable_overlap_schedule=True,
        )
    )
    scheduler.spec.plan_step = lambda reqs: 0  # plain steps of requests the draft follows
    prompt = [205, 300, 1100, 52, 9, 77, 1500, 12]
    params = SamplingParams(max_new_tokens=20, temperature=0, ignore_eos=True)
    scheduler.add_request(TokenizedGenerateReqInput("a", prompt, params, stream=False))
    first = run_to_completion(scheduler)["a"]["ids"]
    scheduler.add_request(TokenizedGenerateReqInput("b", prompt + first[:10], params, stream=False))
    cached = record_cached_tokens(scheduler)
    run_to_completion(scheduler)
    assert_idle_kv_accounting(scheduler.get_internal_state())
    assert (cached["b"] > len(prompt)) == cached_beyond_prompt, cached


def test_the_adaptive_config_reaches_the_running_policy(demo_paths, tmp_path):
    config = tmp_path / "adaptive.json"
    config.write_text(
        json.dumps({"1": {"candidate_steps": [0, 3], "up_hysteresis": 0.2}, "8": [0, 1], "ema_alpha": 0.1})
    )
    scheduler = Scheduler(
        ServerArgs(
            dtype="float32",
            device="cpu",
            speculative_algorithm="EAGLE3",
            speculative_num_steps=3,
            speculative_adaptive_config=str(config),
        )
    )
    policy = scheduler.spec.policy
    assert policy.name == "cost" and policy.candidates_for(1) == [0, 3] and policy.candidates_for(16) == [0, 1]
    assert policy.hysteresis_by_bs[1]["up"] == 0.2
    assert policy.estimator.alpha == 0.1
    assert set(scheduler.tp_worker.reachable_steps) == {1, 3}


@pytest.mark.parametrize("overlap", [False, True])
def test_batched_admissions_under_switching_give_plain_decodings_output(tiny_paths, overlap):
    """36 requests decode while 20 more arrive, one every other step: with admissions batched
    (--admission-batch-steps) and every k in turn, each request's greedy tokens are those of plain
    decoding admitting every arrival at once, in fewer prefill passes, and every KV slot is back."""
    target, draft = tiny_paths
    prompts = [[(11 * i + 7 * j) % 400 + 1 for j in range(6 + i % 5)] for i in range(56)]

    def serve(spec: dict, batch_steps: int) -> tuple[dict, dict]:
        scheduler = Scheduler(
            ServerArgs(
                model_path=target,
                dtype="float32",
                device="cpu",
                disable_overlap_schedule=not overlap,
                admission_batch_steps=batch_steps,
                **spec,
            )
        )
        # A prefill pass far dearer than a step (not left to this CPU's timings): arrivals wait.
        batcher = scheduler.admission
        batcher.EMA, batcher.step_seconds, batcher.pass_seconds = 0.0, 1e-3, 10.0
        if spec:
            steps = []
            scheduler.spec.plan_step = lambda reqs: steps.append(alternating_k(len(steps))) or steps[-1]

        def add(i: int) -> None:
            params = SamplingParams(max_new_tokens=12 + i % 9, temperature=0, ignore_eos=True)
            scheduler.add_request(TokenizedGenerateReqInput(f"r{i}", prompts[i], params, stream=False))

        for i in range(36):
            add(i)
        arrivals = iter(range(36, 56))

        def arrive(step: int) -> None:
            i = next(arrivals, None) if step % 2 == 0 else None
            if i is not None:
                add(i)

        outputs = run_to_completion(scheduler, arrive)
        state = scheduler.get_internal_state()
        assert_idle_kv_accounting(state)
        return outputs, state

    reference, plain_state = serve({}, 0)
    spec = dict(
        speculative_algorithm="EAGLE3",
        speculative_draft_model_path=draft,
        speculative_num_steps=3,
        speculative_policy="always",
    )
    outputs, state = serve(spec, 4)
    assert len(outputs) == 56 and outputs == reference
    assert state["num_prefill_passes"] < plain_state["num_prefill_passes"]
