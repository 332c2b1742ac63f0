"""The Scheduler in-process: memory pressure, limits, aborts, stop conditions, policies."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

from sglang.srt.managers.io_struct import AbortReq, TokenizedGenerateReqInput
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs

MAX_STEPS = 5000


def make_scheduler(path: str, **kwargs) -> Scheduler:
    return Scheduler(ServerArgs(model_path=path, dtype="float32", device="cpu", **kwargs))


def greedy_req(rid: str, input_ids: list[int], max_new_tokens: int = 40, **params) -> TokenizedGenerateReqInput:
    sampling = SamplingParams(temperature=0, max_new_tokens=max_new_tokens, ignore_eos=True)
    for key, value in params.items():
        setattr(sampling, key, value)
    return TokenizedGenerateReqInput(rid, input_ids, sampling, stream=False)


def run_to_completion(scheduler: Scheduler, on_step=None) -> dict[str, dict]:
    results: dict[str, dict] = {}
    for step in range(MAX_STEPS):
        if not scheduler.has_work():
            break
        out = scheduler.step()
        if on_step:
            on_step(step, scheduler)
        if out is None:
            continue
        for rid, ids, reason in zip(out.rids, out.new_token_ids, out.finished_reasons):
            entry = results.setdefault(rid, {"ids": [], "reason": None, "order": None})
            entry["ids"].extend(ids)
            if reason:
                entry["reason"] = reason
                entry["order"] = sum(1 for r in results.values() if r["reason"])
    else:
        pytest.fail("the scheduler did not finish its work")
    return results


def assert_accounting(scheduler: Scheduler) -> None:
    state = scheduler.get_internal_state()
    assert state["request_slots"] == 0 and state["num_running_reqs"] == 0, state
    assert state["free_slots"] + state["cached_slots"] == state["total_slots"], state


def prompts(n: int, length: int = 15) -> list[list[int]]:
    return [[(7 * i + 13 * j + 1) % 300 + 1 for j in range(length)] for i in range(n)]


def test_retraction_under_kv_pressure_keeps_greedy_output(tiny_model_paths):
    path = tiny_model_paths["llama"]
    roomy = make_scheduler(path)
    for i, ids in enumerate(prompts(6)):
        roomy.add_request(greedy_req(f"r{i}", ids))
    expected = run_to_completion(roomy)

    tight = make_scheduler(path, max_total_tokens=140)
    for i, ids in enumerate(prompts(6)):
        tight.add_request(greedy_req(f"r{i}", ids))
    got = run_to_completion(tight)
    assert tight.num_retractions > 0, "the pool was meant to run out"
    assert {rid: r["ids"] for rid, r in got.items()} == {rid: r["ids"] for rid, r in expected.items()}
    assert_accounting(tight)


def test_a_chunked_prompt_waiting_for_memory_is_not_replaced_by_the_next_prompts_chunk(tiny_model_paths):
    """The last chunk of a chunked prompt also reserves KV for its output; when that does not fit
    yet, the chunk waits for memory (here while the decoding request runs and is retracted). The
    next queued prompt's first chunk, which needs no reserve and fits, must not be admitted in its
    place: it became the chunked request, and the waiting one was dropped, never answered, its KV
    held for good."""
    path = tiny_model_paths["llama"]
    results, waits = [], []
    for max_total_tokens in (None, 130):
        scheduler = make_scheduler(path, chunked_prefill_size=16, max_total_tokens=max_total_tokens)
        scheduler.add_request(greedy_req("decoding", prompts(1, 16)[0], max_new_tokens=100))
        scheduler.step()
        scheduler.add_request(greedy_req("chunked", prompts(2, 48)[1], max_new_tokens=80))
        scheduler.add_request(greedy_req("queued", prompts(3, 48)[2], max_new_tokens=10))
        seen = []

        def watch_chunk(step, scheduler):
            chunked = scheduler.chunked_req
            seen.append((chunked.rid, chunked.kv_len) if chunked is not None else None)

        results.append(run_to_completion(scheduler, watch_chunk))
        waits.append(sum(a == b is not None for a, b in zip(seen, seen[1:])))
        assert_accounting(scheduler)
    expected, got = results
    assert waits[1] > 0, "the tight pool was meant to make the last chunk wait"
    assert {rid: r["ids"] for rid, r in got.items()} == {rid: r["ids"] for rid, r in expected.items()}
    assert all(r["reason"]["type"] == "length" for r in got.values())


def test_request_larger_than_the_pool_is_rejected_not_hung(tiny_model_paths):
    scheduler = make_scheduler(tiny_model_paths["llama"], max_total_tokens=50)
    scheduler.add_request(greedy_req("big", prompts(1, 20)[0], max_new_tokens=40))
    scheduler.add_request(greedy_req("small", prompts(1, 5)[0], max_new_tokens=10))
    results = run_to_completion(scheduler)
    assert results["big"]["reason"]["type"] == "abort"
    assert "max-total-tokens" in results["big"]["reason"]["message"]
    assert len(results["small"]["ids"]) == 10
    assert_accounting(scheduler)


def test_abort_of_a_running_request_frees_its_kv(tiny_model_paths):
    scheduler = make_scheduler(tiny_model_paths["llama"])
    scheduler.add_request(greedy_req("keep", prompts(2)[0], max_new_tokens=30))
    scheduler.add_request(greedy_req("drop", prompts(2)[1], max_new_tokens=30))

    def abort_after_a_few_steps(step, sched):
        if step == 3:
            sched.abort_request(AbortReq("drop"))

    results = run_to_completion(scheduler, abort_after_a_few_steps)
    assert results["drop"]["reason"]["type"] == "abort"
    assert len(results["drop"]["ids"]) < 30
    assert len(results["keep"]["ids"]) == 30
    assert_accounting(scheduler)


def test_abort_of_a_waiting_request_answers_it(tiny_model_paths):
    scheduler = make_scheduler(tiny_model_paths["llama"], max_running_requests=1)
    scheduler.add_request(greedy_req("first", prompts(2)[0], max_new_tokens=10))
    scheduler.add_request(greedy_req("queued", prompts(2)[1], max_new_tokens=10))
    scheduler.abort_request(AbortReq("queued"))
    results = run_to_completion(scheduler)
    assert results["queued"] == {"ids": [], "reason": results["queued"]["reason"], "order": 1}
    assert results["queued"]["reason"]["type"] == "abort"
    assert len(results["first"]["ids"]) == 10


def test_max_running_requests_is_never_exceeded(tiny_model_paths):
    scheduler = make_scheduler(tiny_model_paths["llama"], max_running_requests=2)
    for i, ids in enumerate(prompts(5)):
        scheduler.add_request(greedy_req(f"r{i}", ids, max_new_tokens=8))
    seen = []
    results = run_to_completion(scheduler, lambda step, s: seen.append(len(s.running_reqs)))
    assert max(seen) == 2
    assert all(len(r["ids"]) == 8 for r in results.values()) and len(results) == 5


@pytest.fixture
def model_with_eos(tiny_model_paths, tmp_path):
    """The tiny llama with its EOS id set to a token greedy decoding reaches at step 4."""
    path = tiny_model_paths["llama"]
    greedy = run_to_completion(_single(make_scheduler(path), prompts(1)[0]))["only"]["ids"]
    eos = greedy[3]
    copy = tmp_path / "eos_model"
    shutil.copytree(path, copy)
    for name in ("config.json", "generation_config.json"):
        with open(copy / name) as f:
            cfg = json.load(f)
        cfg["eos_token_id"] = eos
        with open(copy / name, "w") as f:
            json.dump(cfg, f)
    return str(copy), greedy, eos


def _single(scheduler, ids, **params):
    scheduler.add_request(greedy_req("only", ids, **params))
    return scheduler


def test_eos_from_the_model_config_finishes_the_request(model_with_eos):
    path, greedy, eos = model_with_eos
    stopped = run_to_completion(_single(make_scheduler(path), prompts(1)[0], ignore_eos=False))["only"]
    assert stopped["ids"] == greedy[: greedy.index(eos) + 1]
    assert stopped["reason"] == {"type": "stop", "matched": eos}
    ignored = run_to_completion(_single(make_scheduler(path), prompts(1)[0], ignore_eos=True))["only"]
    assert ignored["ids"] == greedy and ignored["reason"]["type"] == "length"


@pytest.mark.parametrize("policy, first", [("lpm", "shares_prefix"), ("fcfs", "fresh")])
def test_schedule_policy_orders_waiting_requests(tiny_model_paths, policy, first):
    scheduler = make_scheduler(tiny_model_paths["llama"], schedule_policy=policy, max_running_requests=1)
    warm = prompts(1, 40)[0]
    run_to_completion(_single(scheduler, warm, max_new_tokens=2))
    scheduler.add_request(greedy_req("fresh", prompts(3, 10)[2], max_new_tokens=4))
    scheduler.add_request(greedy_req("shares_prefix", warm[:30] + [5, 6], max_new_tokens=4))
    results = run_to_completion(scheduler)
    assert results[first]["order"] == 1
    assert_accounting(scheduler)


def test_a_short_request_is_not_starved_by_a_fan_out_ahead_of_it(tiny_model_paths):
    """12 sequences of one request fill the running batch (4) three times over; a request arriving
    after them runs in the second wave, not after the fan-out's last one (fcfs would put it there)."""
    scheduler = make_scheduler(tiny_model_paths["llama"], max_running_requests=4)
    for i, ids in enumerate(prompts(12)):
        scheduler.add_request(dataclasses.replace(greedy_req(f"big-{i}", ids, max_new_tokens=6), group="big"))

    def short_arrives(step, sched):
        if step == 1:
            sched.add_request(greedy_req("short", prompts(13)[12], max_new_tokens=6))

    results = run_to_completion(scheduler, short_arrives)
    assert results["short"]["order"] <= 8, results["short"]
    assert_accounting(scheduler)


def test_flush_cache_is_refused_while_requests_run(tiny_model_paths):
    scheduler = make_scheduler(tiny_model_paths["llama"])
    scheduler.add_request(greedy_req("r", prompts(1)[0], max_new_tokens=5))
    scheduler.step()
    assert scheduler.flush_cache() is False
    run_to_completion(scheduler)
    assert scheduler.get_internal_state()["cached_slots"] > 0
    assert scheduler.flush_cache() is True
    assert scheduler.get_internal_state()["cached_slots"] == 0
    assert_accounting(scheduler)


def _mixed_workload(scheduler: Scheduler) -> None:
    ids = prompts(8, 12)
    for i, prompt in enumerate(ids):
        params = SamplingParams(
            max_new_tokens=6 + 5 * i, temperature=0 if i % 2 else 0.9, sampling_seed=i, ignore_eos=True
        )
        if i == 3:
            params.stop_token_ids = [prompt[0]]  # may or may not be produced: either way both runs agree
        scheduler.add_request(TokenizedGenerateReqInput(f"r{i}", prompt, params, stream=i % 3 == 0))


@pytest.mark.parametrize("max_total_tokens", [None, 160])
def test_overlap_gives_the_tokens_of_sequential_steps(tiny_model_paths, max_total_tokens):
    path = tiny_model_paths["llama"]
    runs = {}
    for overlap in (False, True):
        scheduler = make_scheduler(path, disable_overlap_schedule=not overlap, max_total_tokens=max_total_tokens)
        _mixed_workload(scheduler)
        pipelined = []
        results = run_to_completion(scheduler, lambda step, s: pipelined.append(s.in_flight is not None))
        runs[overlap] = {rid: (r["ids"], r["reason"]) for rid, r in results.items()}
        assert any(pipelined) == overlap  # overlap really kept a step in flight between steps
        assert_accounting(scheduler)
    assert runs[True] == runs[False]


def test_abort_while_a_step_is_in_flight_frees_its_kv(tiny_model_paths):
    scheduler = make_scheduler(tiny_model_paths["llama"])
    scheduler.add_request(greedy_req("keep", prompts(2)[0], max_new_tokens=20))
    scheduler.add_request(greedy_req("drop", prompts(2)[1], max_new_tokens=20))

    def abort_when_in_flight(step, sched):
        if sched.in_flight is not None and not sched.get_internal_state()["num_retractions"] and step == 4:
            assert "drop" in [r.rid for r in sched.in_flight[0].reqs]
            sched.abort_request(AbortReq("drop"))

    results = run_to_completion(scheduler, abort_when_in_flight)
    assert results["drop"]["reason"]["type"] == "abort"
    assert len(results["keep"]["ids"]) == 20
    assert_accounting(scheduler)


@pytest.mark.parametrize("overlap", [False, True])
def test_each_request_samples_with_its_own_parameters_as_the_batch_changes(tiny_model_paths, overlap):
    """Requests with different temperatures and seeds join and leave a running batch at
    different steps; each one's tokens must be those it gets alone (its seed and position fix
    its noise), so no step may sample a request with another's parameters or offsets."""
    path = tiny_model_paths["llama"]
    specs = [
        ("hot", dict(temperature=1.5, sampling_seed=1), 30),
        ("greedy", dict(temperature=0), 12),
        ("warm", dict(temperature=0.8, top_k=20, sampling_seed=2), 20),
        ("late", dict(temperature=1.2, top_p=0.9, sampling_seed=3), 16),
    ]

    def request(i):
        rid, params, n = specs[i]
        return TokenizedGenerateReqInput(
            rid, prompts(4)[i], SamplingParams(max_new_tokens=n, ignore_eos=True, **params), stream=False
        )

    alone = {}
    for i in range(len(specs)):
        scheduler = make_scheduler(path, disable_overlap_schedule=not overlap)
        scheduler.add_request(request(i))
        alone.update({rid: r["ids"] for rid, r in run_to_completion(scheduler).items()})
    scheduler = make_scheduler(path, disable_overlap_schedule=not overlap)
    scheduler.add_request(request(0))
    scheduler.add_request(request(1))
    # Two requests arrive together while two others decode: a batch of as many requests as the
    # one before it, but other requests; then the batch grows, and shrinks as requests finish.
    results = run_to_completion(scheduler, lambda step, s: step == 5 and [s.add_request(request(i)) for i in (2, 3)])
    assert {rid: r["ids"] for rid, r in results.items()} == alone
    assert len({tuple(ids) for ids in alone.values()}) == 4 and all(len(alone[rid]) == n for rid, _, n in specs)
    assert_accounting(scheduler)


def _pin_admission_costs(scheduler: Scheduler, step_seconds: float = 1e-3, pass_seconds: float = 10.0) -> None:
    """Fixes what AdmissionBatcher has measured (a decode step's time, a prefill pass's), so that
    only the rules under test decide: by default a pass far dearer than any wait."""
    batcher = scheduler.admission
    batcher.EMA, batcher.step_seconds, batcher.pass_seconds = 0.0, step_seconds, pass_seconds


def _loaded(path: str, num_running: int, **kwargs) -> Scheduler:
    """A scheduler with `num_running` long requests all decoding (none waiting)."""
    scheduler = make_scheduler(path, **kwargs)
    _pin_admission_costs(scheduler)
    for i, ids in enumerate(prompts(num_running)):
        scheduler.add_request(greedy_req(f"load{i}", ids, max_new_tokens=200))
    for _ in range(MAX_STEPS):
        scheduler.step()
        if len(scheduler.running_reqs) == num_running and not scheduler.waiting_queue:
            return scheduler
    pytest.fail("the load was never all running")


def _steps_queued(scheduler: Scheduler, rids: list[str]) -> int:
    """Forwards (each scheduler step launches one) launched before the requests' prefill pass."""
    for steps in range(MAX_STEPS):
        scheduler.step()
        if not any(req.rid in rids for req in scheduler.waiting_queue):
            return steps
    pytest.fail("the requests were never admitted")


@pytest.mark.parametrize("overlap", [False, True])
def test_under_load_an_arrival_waits_a_few_steps_to_share_its_prefill_pass(tiny_model_paths, overlap):
    """With 40 requests decoding, one arrival waits --admission-batch-steps decode steps for
    company, then is admitted; three arrivals (1/16 of 40 and more) go at once; 0 turns it off."""
    path = tiny_model_paths["llama"]
    for steps in (0, 3):
        scheduler = _loaded(path, 40, admission_batch_steps=steps, disable_overlap_schedule=not overlap)
        for _ in range(6):  # decode steps with nobody waiting do not count against the next arrival
            scheduler.step()
        passes = scheduler.admission.num_passes
        scheduler.add_request(greedy_req("late", prompts(41)[40], max_new_tokens=8))
        assert _steps_queued(scheduler, ["late"]) == steps
        assert scheduler.admission.num_passes == passes + 1

    scheduler = _loaded(path, 40, admission_batch_steps=3, disable_overlap_schedule=not overlap)
    group = [f"late{i}" for i in range(3)]
    for rid, ids in zip(group, prompts(43)[40:]):
        scheduler.add_request(greedy_req(rid, ids, max_new_tokens=8))
    assert _steps_queued(scheduler, group) == 0


def test_a_lightly_loaded_server_admits_arrivals_at_once(tiny_model_paths):
    scheduler = _loaded(tiny_model_paths["llama"], 20, admission_batch_steps=8)
    scheduler.add_request(greedy_req("late", prompts(21)[20], max_new_tokens=8))
    assert _steps_queued(scheduler, ["late"]) == 0


def test_arrivals_never_wait_where_a_decode_step_outlasts_a_prefill_pass(tiny_model_paths):
    """A model bound by the device (decode steps longer than a pass): waiting costs more than it saves."""
    scheduler = _loaded(tiny_model_paths["llama"], 40, admission_batch_steps=8)
    _pin_admission_costs(scheduler, step_seconds=0.02, pass_seconds=0.01)
    scheduler.add_request(greedy_req("late", prompts(41)[40], max_new_tokens=8))
    assert _steps_queued(scheduler, ["late"]) == 0


def test_arrivals_wait_no_longer_than_a_prefill_pass_takes(tiny_model_paths):
    """A pass measured at 2.5 decode steps: an arrival waits two steps (the third would end past
    one pass's time), though --admission-batch-steps allows eight."""
    scheduler = _loaded(tiny_model_paths["llama"], 40, admission_batch_steps=8)
    now, launch = [0.0], scheduler.tp_worker.forward_batch_generation

    def launch_taking_a_second(batch):
        now[0] += 1.0
        return launch(batch)

    scheduler.tp_worker.forward_batch_generation = launch_taking_a_second
    scheduler.admission.clock = lambda: now[0]
    _pin_admission_costs(scheduler, step_seconds=1.0, pass_seconds=2.5)
    scheduler.add_request(greedy_req("late", prompts(41)[40], max_new_tokens=8))
    assert _steps_queued(scheduler, ["late"]) == 2


def test_arrivals_that_fill_a_prefill_pass_with_tokens_go_at_once(tiny_model_paths):
    """Two waiting prompts of 300 tokens fill a 512-token pass: no reason to wait for more."""
    scheduler = _loaded(tiny_model_paths["llama"], 40, admission_batch_steps=8, chunked_prefill_size=512)
    scheduler.add_request(greedy_req("long", prompts(1, 300)[0], max_new_tokens=4))
    scheduler.step()  # the first waits (300 tokens, one request)
    scheduler.add_request(greedy_req("long2", prompts(2, 300)[1], max_new_tokens=4))
    assert _steps_queued(scheduler, ["long", "long2"]) == 0


@pytest.mark.parametrize("overlap", [False, True])
def test_batched_admissions_keep_every_requests_tokens(tiny_model_paths, overlap):
    """Arrivals during a 36-request load, admitted at once or batched: the same greedy tokens,
    fewer prefill passes when batched, and every KV slot back."""
    path = tiny_model_paths["llama"]
    runs, passes = {}, {}
    for steps in (0, 4):
        scheduler = make_scheduler(path, admission_batch_steps=steps, disable_overlap_schedule=not overlap)
        _pin_admission_costs(scheduler)
        all_prompts = prompts(60, 12)
        for i in range(36):
            scheduler.add_request(greedy_req(f"r{i}", all_prompts[i], max_new_tokens=30 + i % 7))

        def arrive(step, sched):  # one arrival every other step while the load runs
            i = 36 + step // 2
            if step % 2 == 0 and i < 60:
                sched.add_request(greedy_req(f"r{i}", all_prompts[i], max_new_tokens=10 + i % 5))

        results = run_to_completion(scheduler, arrive)
        runs[steps] = {rid: r["ids"] for rid, r in results.items()}
        passes[steps] = scheduler.get_internal_state()["num_prefill_passes"]
        assert_accounting(scheduler)
    assert len(runs[4]) == 60 and runs[4] == runs[0]
    assert passes[4] < passes[0]


def test_bad_admission_batch_steps_is_refused_naming_the_flag_and_help_documents_it(capsys):
    from sglang.srt.server_args import prepare_server_args

    with pytest.raises(ValueError, match="--admission-batch-steps"):
        ServerArgs(admission_batch_steps=-1)
    with pytest.raises(SystemExit):
        prepare_server_args(["--help"])
    assert "--admission-batch-steps" in capsys.readouterr().out


@pytest.mark.parametrize("overlap", [False, True])
def test_while_requests_decode_a_prefill_pass_stays_within_a_graph(tiny_model_paths, overlap):
    """With graphs of up to 2 requests (stood in for: the CPU has none), five arrivals join a
    running batch 2, 2 and 1 per pass; on an idle server they go in one pass. Tokens as without."""
    path = tiny_model_paths["llama"]
    runs = {}
    for capped in (False, True):
        # Arrivals are not held (nothing is timed on this CPU), and with the flag at 0 nothing is capped.
        scheduler = make_scheduler(path, admission_batch_steps=4 if capped else 0, disable_overlap_schedule=not overlap)
        if capped:
            scheduler.tp_worker.prefill_pass_fits = lambda n, t: n <= 2
        sizes = []
        launch = scheduler.tp_worker.forward_batch_generation

        def recorded(batch):
            if not batch.forward_mode.is_decode():
                sizes.append(batch.batch_size)
            return launch(batch)

        scheduler.tp_worker.forward_batch_generation = recorded
        all_prompts = prompts(10)
        for i in range(5):
            scheduler.add_request(greedy_req(f"r{i}", all_prompts[i], max_new_tokens=20))
        scheduler.step()
        for i in range(5, 10):
            scheduler.add_request(greedy_req(f"r{i}", all_prompts[i], max_new_tokens=20))
        runs[capped] = {rid: r["ids"] for rid, r in run_to_completion(scheduler).items()}
        assert sizes == ([5, 2, 2, 1] if capped else [5, 5])
        assert_accounting(scheduler)
    assert runs[True] == runs[False] and len(runs[True]) == 10


def test_an_arrival_held_for_company_can_be_aborted(tiny_model_paths):
    scheduler = _loaded(tiny_model_paths["llama"], 40, admission_batch_steps=8)
    scheduler.add_request(greedy_req("held", prompts(41)[40], max_new_tokens=8))
    scheduler.step()
    assert any(req.rid == "held" for req in scheduler.waiting_queue), "held back under load"
    scheduler.abort_request(AbortReq("held"))
    results = run_to_completion(scheduler)
    assert results["held"]["reason"]["type"] == "abort" and results["held"]["ids"] == []
    assert all(len(results[f"load{i}"]["ids"]) == 200 for i in range(40))
    assert_accounting(scheduler)


def test_decode_log_line_reads_the_throughput_of_its_window_without_idle_time(tiny_model_paths, caplog, monkeypatch):
    """The log line's gen throughput is the tokens of the steps since the last line over the time
    they took (a last step slowed by anything no longer sets it), and time the server sat idle
    does not count."""
    import logging
    import types

    from sglang.srt.managers import scheduler as scheduler_module

    scheduler = make_scheduler(tiny_model_paths["llama"], max_total_tokens=4096)
    now = [1000.0]
    monkeypatch.setattr(scheduler_module, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    scheduler.step()  # idle: nothing to run
    now[0] += 500.0  # idle for a long while
    scheduler.step()
    interval = scheduler_module.DECODE_LOG_INTERVAL
    with caplog.at_level(logging.INFO, logger="sglang.srt.managers.scheduler"):
        for i in range(interval):
            now[0] += 0.01 if i < interval - 1 else 1.0  # the last step of the window is slow
            scheduler._count_step(4, True)
    line = next(r.getMessage() for r in caplog.records if "Decode batch." in r.getMessage())
    window = 4 * interval / (0.01 * (interval - 1) + 1.0)
    assert f"gen throughput (token/s): {window:.2f}," in line, line


def _prefill_token_counts(scheduler: Scheduler) -> list[int]:
    """The prompt tokens of each prefill step the scheduler launches, recorded as it launches them."""
    counts = []
    forward = scheduler.tp_worker.forward_batch_generation

    def recording(batch):
        if not batch.forward_mode.is_decode():
            counts.append(sum(req.extend_len for req in batch.reqs))
        return forward(batch)

    scheduler.tp_worker.forward_batch_generation = recording
    return counts


def test_max_prefill_tokens_caps_the_prompt_tokens_of_one_prefill_step(tiny_model_paths):
    """Upstream's --max-prefill-tokens: four 15-token prompts, 60 tokens, fill one step by default;
    under a cap of 40 no step takes more (the third prompt is chunked) and the outputs are the same."""
    outputs, steps = {}, {}
    for cap in (None, 40):
        scheduler = make_scheduler(
            tiny_model_paths["llama"], admission_batch_steps=0, **({"max_prefill_tokens": cap} if cap else {})
        )
        steps[cap] = _prefill_token_counts(scheduler)
        for i, ids in enumerate(prompts(4)):
            scheduler.add_request(greedy_req(f"r{i}", ids, max_new_tokens=6))
        outputs[cap] = {rid: r["ids"] for rid, r in run_to_completion(scheduler).items()}
        assert_accounting(scheduler)
    assert steps[None] == [60]
    assert max(steps[40]) <= 40 and sum(steps[40]) == 60 and steps[40][0] == 40, steps[40]
    assert outputs[40] == outputs[None]


@pytest.mark.parametrize("overlap", [True, False])
def test_stream_interval_sends_a_streaming_requests_tokens_n_at_a_time_and_the_last_ones(tiny_model_paths, overlap):
    chunks = {}
    for interval in (1, 4):
        scheduler = make_scheduler(
            tiny_model_paths["llama"], stream_interval=interval, disable_overlap_schedule=not overlap
        )
        request = greedy_req("streamed", prompts(1)[0], max_new_tokens=10)
        scheduler.add_request(dataclasses.replace(request, stream=True))
        sizes = []
        while scheduler.has_work():
            out = scheduler.step()
            sizes += [len(ids) for ids in (out.new_token_ids if out else ())]
        chunks[interval] = sizes
    assert chunks[1] == [1] * 10
    assert chunks[4] == [4, 4, 2]
