"""Prompt logprobs on the GPU, prefill graphs captured: a pass that scores prompt tokens runs
eagerly (the graphs keep the passes that score nothing), launches without waiting for the device,
and gives the CPU's scores, plain and with the EAGLE-3 worker, chunked and past a cached prefix."""

from __future__ import annotations

import pytest
import torch

from sglang import demo
from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.model_executor.cuda_graph_runner import PrefillGraphRunner
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs

POOL_TOKENS = 1 << 15
# (prompt length, logprob_start_len): one pass, one past a cached prefix, one over three chunks.
CASES = [(12, 0), (30, 17), (150, 0)]


def make_scheduler(device: str, **kwargs) -> Scheduler:
    args = dict(
        model_path=demo.TARGET_PATH,
        device=device,
        dtype="float32",
        max_total_tokens=POOL_TOKENS,
        chunked_prefill_size=64,
        disable_overlap_schedule=True,
    )
    if device == "cuda":
        args.update(attention_backend="triton", cuda_graph_max_bs=8)
    return Scheduler(ServerArgs(**{**args, **kwargs}))


def prompt_scores(scheduler: Scheduler) -> list[tuple[list, list]]:
    """Each case's (prompt logprobs, top 3) from `scheduler`; a warm-up request without logprobs
    first puts the second case's prompt in the radix cache."""
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, scheduler.model_config.vocab_size, (n,), generator=gen).tolist() for n, _ in CASES]
    params = SamplingParams(max_new_tokens=4, temperature=0, ignore_eos=True)
    scheduler.add_request(TokenizedGenerateReqInput("warm", prompts[1], params, stream=False))
    while scheduler.has_work():
        scheduler.step()
    for i, (ids, (_, start)) in enumerate(zip(prompts, CASES)):
        scheduler.add_request(
            TokenizedGenerateReqInput(
                f"r{i}", ids, params, stream=False, return_logprob=True, top_logprobs_num=3, logprob_start_len=start
            )
        )
    got = {}
    while scheduler.has_work():
        out = scheduler.step()
        if out is not None and out.input_token_logprobs is not None:
            got.update(
                (rid, (tokens, top))
                for rid, tokens, top in zip(out.rids, out.input_token_logprobs, out.input_top_logprobs)
                if tokens is not None
            )
    return [got.get(f"r{i}") for i in range(len(CASES))]


def assert_same_scores(got, want) -> None:
    for (tokens, top), (want_tokens, want_top) in zip(got, want):
        assert [t for _, t in tokens] == [t for _, t in want_tokens]
        assert [lp for lp, _ in tokens[1:]] == pytest.approx([lp for lp, _ in want_tokens[1:]], abs=2e-3)
        assert [[t for _, t in alt] for alt in top[1:]] == [[t for _, t in alt] for alt in want_top[1:]]


@pytest.mark.parametrize("spec", [False, True], ids=["plain", "eagle3"])
def test_scoring_passes_run_eagerly_without_syncs_and_match_the_cpu(spec):
    kwargs = dict(speculative_algorithm="EAGLE3", speculative_num_steps=3) if spec else {}
    want = prompt_scores(make_scheduler("cpu", **kwargs))
    scheduler = make_scheduler("cuda", **kwargs)
    runners = [r for r in scheduler.tp_worker.model_runner.graph_runners if isinstance(r, PrefillGraphRunner)]
    assert runners, "the prefill graphs were captured"
    replays, eager = {True: 0, False: 0}, {True: 0, False: 0}  # by whether the pass scores prompt tokens
    replay, forward_eager = runners[0].replay, scheduler.tp_worker.model_runner.forward_eager

    def counted(counts, run):
        def wrapped(fb):
            counts[fb.input_logprob_rows is not None] += 1
            return run(fb)

        return wrapped

    runners[0].replay = counted(replays, replay)
    scheduler.tp_worker.model_runner.forward_eager = counted(eager, forward_eager)
    launch = scheduler.tp_worker.forward_batch_generation

    def strict_launch(batch):  # a scoring pass's launch never waits for the device either
        if batch.input_logprob_spans is None and any(req.scores_prompt for req in batch.reqs):
            torch.cuda.set_sync_debug_mode("error")
        try:
            return launch(batch)
        finally:
            torch.cuda.set_sync_debug_mode("default")

    scheduler.tp_worker.forward_batch_generation = strict_launch
    got = prompt_scores(scheduler)
    assert_same_scores(got, want)
    assert replays[True] == 0 and eager[True] >= 3, "every scoring pass (the long prompt's 3 chunks) ran eagerly"
    assert replays[False] >= 1, "the warm-up request's pass, which scores nothing, replayed its graph"
    state = scheduler.get_internal_state()
    assert state["free_slots"] + state["cached_slots"] == state["total_slots"]
