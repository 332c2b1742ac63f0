"""Speculative decoding on the GPU with CUDA graphs for its shapes (verify, draft chain step,
draft extend): the graphs are captured and replayed, and the output is identical to the eager
speculative steps and to plain decoding (float32, greedy), for batch sizes on and between
graph buckets."""

from __future__ import annotations

import pytest
import torch

from sglang import demo
from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.model_executor.cuda_graph_runner import CudaGraphRunner, PrefillGraphRunner
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs
from sglang.test.runner_utils import run_to_completion


# Several schedulers live in one test process: small KV pools, or the first takes the GPU's memory.
POOL_TOKENS = 1 << 15


def make_scheduler(**kwargs) -> Scheduler:
    args = dict(
        model_path=demo.TARGET_PATH,
        device="cuda",
        dtype="float32",
        attention_backend="triton",
        cuda_graph_max_bs=16,
        disable_overlap_schedule=True,
        max_total_tokens=POOL_TOKENS,
    )
    return Scheduler(ServerArgs(**{**args, **kwargs}))


def submit_random(scheduler: Scheduler, max_new: list[int], seed: int = 0, lengths: tuple[int, int] = (8, 3)) -> None:
    """Request i: random prompt of lengths[0] + lengths[1] * i tokens, greedy, max_new[i] tokens."""
    gen = torch.Generator().manual_seed(seed)
    for i, n in enumerate(max_new):
        ids = torch.randint(
            10, scheduler.model_config.vocab_size, (lengths[0] + lengths[1] * i,), generator=gen
        ).tolist()
        params = SamplingParams(max_new_tokens=n, temperature=0, ignore_eos=True)
        scheduler.add_request(TokenizedGenerateReqInput(f"r{i}", ids, params, stream=False))


def outputs(scheduler: Scheduler, num_reqs: int) -> list[list[int]]:
    finished = run_to_completion(scheduler)
    return [finished[f"r{i}"]["ids"] for i in range(num_reqs)]


def run(num_reqs: int, max_new: int = 40, **kwargs) -> tuple[list[list[int]], Scheduler]:
    scheduler = make_scheduler(**kwargs)
    submit_random(scheduler, [max_new] * num_reqs)
    return outputs(scheduler, num_reqs), scheduler


def strict_about_syncs(fn, strict: list[bool], calls: list):
    """`fn`, wrapped: while strict[0], each call runs under torch's sync debug mode "error" (a
    synchronizing CUDA operation raises) and its arguments are appended to `calls`."""

    def checked(*args):
        if not strict[0]:
            return fn(*args)
        torch.cuda.set_sync_debug_mode("error")
        try:
            return fn(*args)
        finally:
            torch.cuda.set_sync_debug_mode("default")
            calls.append(args)

    return checked


def count_replays(runners) -> list[int]:
    counts = [0] * len(runners)
    for i, runner in enumerate(runners):
        replay = runner.replay

        def counted(fb, _i=i, _replay=replay):
            counts[_i] += 1
            return _replay(fb)

        runner.replay = counted
    return counts


@pytest.mark.parametrize("num_reqs", [1, 3, 16])
def test_speculative_graphs_replay_and_match_eager_and_plain(num_reqs):
    spec = dict(speculative_algorithm="EAGLE3", speculative_num_steps=3)
    plain, _ = run(num_reqs)
    eager, _ = run(num_reqs, disable_cuda_graph=True, **spec)
    per_forward, _ = run(num_reqs, disable_speculative_step_graph=True, **spec)
    whole_step, scheduler = run(num_reqs, **spec)
    assert eager == plain
    assert per_forward == plain
    assert whole_step == plain
    assert scheduler.tp_worker.step_graphs[3].graphs
    assert all(n == 40 for n in map(len, whole_step))


def test_speculative_graph_runners_are_used():
    spec = dict(speculative_algorithm="EAGLE3", speculative_num_steps=3, disable_speculative_step_graph=True)
    scheduler = make_scheduler(**{**spec, "cuda_graph_max_bs": 8})
    worker = scheduler.tp_worker
    width = worker.k + 1

    def runner(model_runner, mode, tokens_per_req):
        # The decode-shaped runners (a prefill graph runner of the same mode has no fixed width).
        (found,) = [
            r
            for r in model_runner.graph_runners
            if isinstance(r, CudaGraphRunner) and r.forward_mode == mode and r.tokens_per_req == tokens_per_req
        ]
        return found

    runners = [
        runner(worker.model_runner, ForwardMode.TARGET_VERIFY, width),
        runner(worker.draft_runner, ForwardMode.DECODE, 1),
        runner(worker.draft_runner, ForwardMode.DRAFT_EXTEND, width),
    ]
    counts = count_replays(runners)
    params = SamplingParams(max_new_tokens=24, temperature=0, ignore_eos=True)
    for i in range(3):
        scheduler.add_request(TokenizedGenerateReqInput(f"r{i}", list(range(20 + i, 40)), params, stream=False))
    while scheduler.has_work():
        scheduler.step()
    verify, chain, extend = counts
    assert verify > 0 and extend == verify and chain == 2 * verify  # k - 1 = 2 chain steps per verify


@pytest.mark.parametrize("spec", [False, True], ids=["plain", "eagle3"])
@pytest.mark.parametrize("num_reqs", [1, 5])
def test_prefill_graphs_replay_and_match_eager_prefills(spec, num_reqs):
    """Prefills of one request (8 tokens, padded to 16) and of five (70 tokens, padded to eight
    requests and 96 tokens), and the draft's pass over them, replay prefill graphs (kept by the
    start-up timing on this host-bound pair) and give the eager prefills' output."""
    kwargs = dict(speculative_algorithm="EAGLE3", speculative_num_steps=3) if spec else {}
    eager, _ = run(num_reqs, max_new=16, prefill_cuda_graph_max_tokens=0, **kwargs)
    scheduler = make_scheduler(**kwargs)
    model_runners = [scheduler.tp_worker.model_runner] + ([scheduler.tp_worker.draft_runner] if spec else [])
    runners = [r for mr in model_runners for r in mr.graph_runners if isinstance(r, PrefillGraphRunner)]
    assert len(runners) == len(model_runners)
    print(
        {
            r.forward_mode.name: {
                f"{bs}x{n}": [round(t * 1e3, 3) for t in times] for (bs, n), times in r.timings.items()
            }
            for r in runners
        }
    )  # replay / eager launch, ms
    counts = count_replays(runners)
    submit_random(scheduler, [16] * num_reqs)
    assert outputs(scheduler, num_reqs) == eager
    assert all(count == 1 for count in counts), counts


@pytest.mark.parametrize("sync", ["warm", "catch-up"])
def test_switching_with_graphs_matches_plain(sync):
    """The mode switch on the GPU: steps cycle through plain, k = 1 and k = 3 (graphs captured for
    each), with the draft kept warm or caught up (a variable-length draft extend on the triton
    backend, and past the buffer a recomputing target forward): float32 greedy output is plain
    decoding's."""
    spec = dict(
        speculative_algorithm="EAGLE3",
        speculative_num_steps=3,
        speculative_policy="cost",
        speculative_candidate_steps=[0, 1, 3],
        speculative_draft_sync=sync,
    )
    plain, _ = run(5, max_new=120)
    scheduler = make_scheduler(**spec)
    steps = []
    # Runs of 70 plain steps overflow the catch-up buffer (64); short runs do not.
    pattern = [0] * 70 + [3, 1, 0, 0, 3] * 4
    scheduler.spec.plan_step = lambda reqs: steps.append(pattern[len(steps) % len(pattern)]) or steps[-1]
    gen = torch.Generator().manual_seed(0)
    for i in range(5):
        ids = torch.randint(10, scheduler.model_config.vocab_size, (8 + 3 * i,), generator=gen).tolist()
        params = SamplingParams(max_new_tokens=120, temperature=0, ignore_eos=True)
        scheduler.add_request(TokenizedGenerateReqInput(f"r{i}", ids, params, stream=False))
    finished = run_to_completion(scheduler)
    assert [finished[f"r{i}"]["ids"] for i in range(5)] == plain
    assert {0, 1, 3} <= set(steps)


def test_requests_without_the_draft_in_whole_step_graphs_match_plain():
    """Requests the draft does not follow (r1, r3: admitted as if speculation did not pay) share
    speculative steps replayed as one graph (a mask of rows that take plain decoding's token is
    a graph input), then decode alone through the target's plain decode graph: float32 greedy
    output is plain decoding's, and the draft stays out of the all-cold steps."""
    max_new = [30, 90, 30, 90, 30]

    def submit_all(scheduler):
        submit_random(scheduler, max_new, seed=1)
        return outputs(scheduler, 5)

    plain = submit_all(make_scheduler())
    scheduler = make_scheduler(speculative_algorithm="EAGLE3", speculative_num_steps=3, speculative_policy="always")
    worker = scheduler.tp_worker
    scheduler.spec.draft_reads_prompt = lambda req, joining: req.rid not in ("r1", "r3")
    scheduler.spec.review_following = lambda *args: None  # they stay cold (adoption: the test below)
    steps = []
    pattern = [3, 0, 3, 3, 0]
    scheduler.spec.plan_step = lambda reqs: steps.append(pattern[len(steps) % len(pattern)]) or steps[-1]
    draft_calls = [0]
    draft_forward = worker.draft_runner.forward
    late = []  # draft forwards once only r1 and r3 are left

    def counted(fb):
        draft_calls[0] += 1
        if {r.rid for r in scheduler.running_reqs} == {"r1", "r3"}:
            late.append(fb.forward_mode)
        return draft_forward(fb)

    worker.draft_runner.forward = counted
    graphs = worker.step_graphs[3]
    replay = graphs.replay
    whole_step = [0]
    graphs.replay = lambda *a, **k: whole_step.__setitem__(0, whole_step[0] + 1) or replay(*a, **k)
    assert submit_all(scheduler) == plain
    assert whole_step[0] > 0 and draft_calls[0] > 0
    # With only r1 and r3 left, plain steps run the target alone (speculative steps, where the
    # pattern asks for them, replay the whole-step graph, which does not call the runner).
    assert late == []
    state = scheduler.get_internal_state()
    assert state["spec_prompts_without_draft"] == 2


def test_logit_bias_through_graphs_matches_plain():
    """Two of five requests ban (bias -100) a token their unbiased greedy output takes at step 6:
    their output changes there; the plain server (decode graphs) and an EAGLE-3 server with
    whole-step graphs and the overlapped schedule (batches with a bias step eagerly, the others
    replay) give the same tokens, and the unbiased requests keep their unbiased output."""

    def submit(scheduler, biases):
        gen = torch.Generator().manual_seed(2)
        for i in range(5):
            ids = torch.randint(10, scheduler.model_config.vocab_size, (8 + 3 * i,), generator=gen).tolist()
            params = SamplingParams(
                max_new_tokens=40 + 20 * i, temperature=0, ignore_eos=True, logit_bias=biases.get(i)
            )
            scheduler.add_request(TokenizedGenerateReqInput(f"r{i}", ids, params, stream=False))
        return outputs(scheduler, 5)

    unbiased = submit(make_scheduler(), {})
    biases = {i: {str(unbiased[i][6]): -100} for i in (1, 3)}
    plain = submit(make_scheduler(), biases)
    scheduler = make_scheduler(
        speculative_algorithm="EAGLE3",
        speculative_num_steps=3,
        speculative_policy="always",
        disable_overlap_schedule=False,
    )
    graphs = scheduler.tp_worker.step_graphs[3]
    replay = graphs.replay
    whole_step = [0]
    graphs.replay = lambda *a, **k: whole_step.__setitem__(0, whole_step[0] + 1) or replay(*a, **k)
    speculative = submit(scheduler, biases)
    assert speculative == plain
    for i in range(5):
        if i in biases:
            assert plain[i][:6] == unbiased[i][:6] and plain[i][6] != unbiased[i][6]
            assert unbiased[i][6] not in plain[i]
        else:
            assert plain[i] == unbiased[i]
    assert whole_step[0] > 0  # once r1 and r3 are done (r4 runs longest)


def test_penalties_under_overlap_and_graphs_match_plain():
    """Two of five requests are penalized (presence + frequency; repetition), greedy, so their
    output changes: the plain server without and with the overlapped schedule (counts kept on the
    device, added right after each sampling) and an EAGLE-3 server with whole-step graphs and the
    overlapped schedule (penalized verify positions, batches with them step eagerly) give the same tokens;
    the others keep their unpenalized output, and no penalty row is left once all are done."""
    penalties = {1: dict(presence_penalty=1.5, frequency_penalty=0.5), 3: dict(repetition_penalty=1.8)}

    def submit(scheduler, penalized):
        gen = torch.Generator().manual_seed(3)
        for i in range(5):
            ids = torch.randint(10, scheduler.model_config.vocab_size, (8 + 3 * i,), generator=gen).tolist()
            params = SamplingParams(
                max_new_tokens=40 + 20 * i,
                temperature=0,
                ignore_eos=True,
                **(penalties.get(i, {}) if penalized else {}),
            )
            scheduler.add_request(TokenizedGenerateReqInput(f"r{i}", ids, params, stream=False))
        result = outputs(scheduler, 5)
        assert scheduler.get_internal_state()["penalty_rows"] == 0
        return result

    unpenalized = submit(make_scheduler(), False)
    plain = submit(make_scheduler(), True)
    overlapped = submit(make_scheduler(disable_overlap_schedule=False), True)
    speculative = submit(
        make_scheduler(
            speculative_algorithm="EAGLE3",
            speculative_num_steps=3,
            speculative_policy="always",
            disable_overlap_schedule=False,
        ),
        True,
    )
    assert overlapped == plain
    assert speculative == plain
    for i in range(5):
        assert (plain[i] != unpenalized[i]) == (i in penalties)


@pytest.mark.parametrize("sync", ["warm", "catch-up"])
def test_requests_adopted_by_the_draft_mid_decode_match_plain_through_graphs(sync):
    """threshold 2: r2 and r3 are admitted without the draft (batches of 3 and 4); once r0..r2 are
    done the draft adopts r3 (long) and it speculates through the whole-step graphs, with plain
    decoding's float32 greedy output."""
    max_new = [20, 20, 20, 160]

    def run_four(**spec):
        scheduler = make_scheduler(**spec)
        submit_random(scheduler, max_new, seed=2, lengths=(12, 5))
        return outputs(scheduler, 4), scheduler.get_internal_state()

    plain, _ = run_four()
    out, state = run_four(
        speculative_algorithm="EAGLE3",
        speculative_num_steps=3,
        speculative_policy="threshold",
        speculative_threshold=2,
        speculative_draft_sync=sync,
    )
    assert out == plain
    assert state["spec_prompts_without_draft"] == 2 and state["spec_draft_adoptions"] == 1
    assert state["spec_steps_by_k"].get("3", 0) > 0


def test_launches_never_wait_for_the_device():
    """What the scheduler launches under overlap (prefills with the draft's pass over the prompt,
    plain and speculative steps) never synchronizes with the device: a hidden sync would stall
    the pipeline the overlap builds, and on a small model the host is the bottleneck. Every
    launch of the second pass runs under torch's sync debug mode "error"; the first pass runs
    the same shapes (first-time work, such as a kernel's compile, is not the point)."""
    spec = dict(
        speculative_algorithm="EAGLE3",
        speculative_num_steps=3,
        speculative_policy="cost",
        speculative_candidate_steps=[0, 1, 3],
        disable_overlap_schedule=False,
    )
    scheduler = make_scheduler(**spec)
    pattern = [3, 0, 1, 3, 3, 0]
    steps = []
    scheduler.spec.plan_step = lambda reqs: steps.append(pattern[len(steps) % len(pattern)]) or steps[-1]
    strict, calls = [False], []
    worker = scheduler.tp_worker
    worker.forward_batch_generation = strict_about_syncs(worker.forward_batch_generation, strict, calls)
    for attempt in range(2):
        strict[0] = attempt == 1
        submit_random(scheduler, [24, 24, 24], seed=attempt)
        run_to_completion(scheduler)
    launched = [(batch.forward_mode, batch.spec_steps) for (batch,) in calls]
    assert any(mode == ForwardMode.EXTEND for mode, _ in launched)
    assert {0, 1, 3} <= {k for mode, k in launched if mode.is_decode()}


def test_freeing_device_slots_does_not_wait_for_the_device():
    """The allocator keeps slots freed from the device there (in stream order) until the host's
    free slots run short: a free returns while the device is still busy, and the slots come
    back exactly once."""
    from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator

    alloc = TokenToKVPoolAllocator(64, device="cuda")
    held = alloc.alloc(64)
    torch.cuda._sleep(200_000_000)  # ~0.1 s of device time queued ahead of the frees
    done = torch.cuda.Event()
    done.record()
    torch.cuda.set_sync_debug_mode("error")
    try:
        alloc.free(held[10:20])
        alloc.free(held[:5])
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert not done.query()  # the device is still sleeping: neither free waited for it
    assert alloc.available_size() == 15
    assert alloc.alloc_host(15).tolist() == list(range(11, 21)) + list(range(1, 6))  # in the order freed
    assert alloc.alloc_host(1) is None


def test_releasing_finished_requests_never_waits_for_the_device():
    """A finished request's KV goes back (into the radix cache, its uncached tail and duplicate
    positions to the free list) without waiting for the device: under overlap a wait would stall
    the step in flight. Requests finish mid-step at different lengths; the second pass repeats
    the prompts, so the cache holds them (duplicates, adoption of target-only entries). Every
    release of the second pass runs under torch's sync debug mode "error"; the output is plain
    decoding's and every slot comes back exactly once."""
    max_new = [9, 14, 23, 31]
    plain = make_scheduler()
    submit_random(plain, max_new, seed=5)
    expected = outputs(plain, len(max_new))
    del plain
    scheduler = make_scheduler(
        speculative_algorithm="EAGLE3",
        speculative_num_steps=3,
        speculative_policy="always",
        disable_overlap_schedule=False,
    )
    strict, released = [False], []
    scheduler.kv_manager.release = strict_about_syncs(scheduler.kv_manager.release, strict, released)
    for attempt in range(2):
        strict[0] = attempt == 1
        submit_random(scheduler, max_new, seed=5)
        assert outputs(scheduler, len(max_new)) == expected
    assert len(released) >= len(max_new)
    state = scheduler.get_internal_state()
    assert state["free_slots"] + state["cached_slots"] == state["total_slots"]
    assert scheduler.flush_cache()
    allocator = scheduler.kv_manager.allocator
    assert sorted(allocator.alloc_host(allocator.size).tolist()) == list(range(1, allocator.size + 1))
