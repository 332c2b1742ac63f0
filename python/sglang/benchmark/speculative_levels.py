"""Decode speed of plain and speculative decoding through the real Scheduler, in process (no HTTP),
one level (batch size) after another; with `step_times`, every pass timed by phase."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import torch

from sglang.benchmark.code_prompts import code_windows

# The CPU probe around each measurement (work_ms: ~5 ms at full speed on an H200 host, best of 3):
# on a host-bound level, tok/s x probe ms reads the code's speed with the CPU's speed of the
# moment factored out (virtual CPUs may run the same Python at full or half speed).
PROBE_WORK = 50_000


def work_ms(n: int = PROBE_WORK, repeats: int = 3) -> float:
    """A fixed Python loop of `n` iterations, best of `repeats`, in ms, on this process's CPU."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        total = 0
        for i in range(n):
            total += i * i % 7
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def random_prompts(vocab: int, n: int, length: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(10, vocab, (length,), generator=gen).tolist() for _ in range(n)]


def code_prompts(model: str, n: int, length: int) -> list[list[int]]:
    """n windows of `length` tokens of Python standard-library files (the demo model's domain)."""
    from transformers import AutoTokenizer

    prompts = code_windows(AutoTokenizer.from_pretrained(model), n, length)
    return [prompts[i % len(prompts)] for i in range(n)]


def measure(
    model: str,
    draft: str | None,
    k: int,
    batch_sizes: list[int],
    input_len: int,
    output_len: int,
    device: str,
    prompt_kind: str = "random",
    step_graph: bool = True,
    draft_sync: str | None = None,
    dynamic: bool = False,
    step_times: bool = False,
    closed_loop: int = 0,
) -> list[dict]:
    """One Scheduler (KV pool and graphs sized for the largest batch) runs every level in turn.
    draft_sync: the draft is loaded but never used (policy `never`), kept warm or caught up.
    dynamic: the default dynamic policy (cost) instead of always k. step_times: each level's
    decode passes timed by phase (sglang.srt.managers.step_times), as `step_times`.
    closed_loop: > 0 measures a server's steady state instead (see closed_loop_level)."""
    from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.speculative.spec_stats import SpecStats

    spec = (
        dict(
            speculative_algorithm="EAGLE3",
            speculative_draft_model_path=draft,
            speculative_num_steps=k,
            disable_speculative_step_graph=not step_graph,
        )
        if draft
        else {}
    )
    if draft and draft_sync:
        spec.update(speculative_policy="never", speculative_draft_sync=draft_sync)
    if draft and dynamic:
        spec.update(speculative_adaptive=True)
    max_bs = max(batch_sizes)
    args = ServerArgs(
        model_path=model,
        device=device,
        max_running_requests=max_bs,
        cuda_graph_max_bs=max_bs,
        log_level="warning",
        **spec,
    )
    scheduler = Scheduler(args)
    results = []
    for bs in batch_sizes:
        scheduler.flush_cache()  # every level prefills its prompts afresh
        if draft:
            scheduler.tp_worker.stats = SpecStats(k)
        if closed_loop:
            result = closed_loop_level(
                scheduler, model, bs, closed_loop, input_len, output_len, prompt_kind, device, step_times
            )
            result["k"] = k if draft else 0
            if draft:
                state = scheduler.get_internal_state()
                result.update(
                    accept_length=state["avg_spec_accept_length"],
                    phase_ms=state["spec_phase_ms"],
                    steps_by_k=state["spec_steps_by_k"],
                )
                if dynamic:
                    result["config"] = "dynamic"
            results.append(result)
            continue
        prompts = (
            code_prompts(model, bs, input_len)
            if prompt_kind == "code"
            else random_prompts(scheduler.model_config.vocab_size, bs, input_len)
        )
        if device == "cuda":
            torch.cuda.synchronize()
        prefill_start = time.perf_counter()
        for i, ids in enumerate(prompts):
            params = SamplingParams(max_new_tokens=output_len, temperature=0, ignore_eos=True)
            scheduler.add_request(TokenizedGenerateReqInput(f"bs{bs}-r{i}", ids, params, stream=False))
        while scheduler.waiting_queue or scheduler.chunked_req is not None or len(scheduler.running_reqs) < bs:
            scheduler.step()
        if device == "cuda":
            torch.cuda.synchronize()
        prefill_seconds = time.perf_counter() - prefill_start
        first_tokens = sum(len(r.output_ids) + r.num_pending for r in scheduler.running_reqs)
        if device == "cuda":
            torch.cuda.synchronize()
        clock = _clock(scheduler, step_times)
        probe_before = work_ms(PROBE_WORK)
        start = time.perf_counter()
        while scheduler.has_work():
            clock.begin()
            scheduler.step()
            clock.end()
        if device == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        probe_after = work_ms(PROBE_WORK)
        decode_tokens = bs * output_len - first_tokens
        result = {
            "batch_size": bs,
            "k": k if draft else 0,
            "step_graph": bool(draft) and step_graph,
            "decode_tokens": decode_tokens,
            "seconds": seconds,
            "tokens_per_s": decode_tokens / seconds,
            "prefill_seconds": prefill_seconds,
            "prefill_tokens_per_s": bs * input_len / prefill_seconds,
            "cpu_probe_ms": [probe_before, probe_after],
        }
        if step_times:
            result["step_times"] = clock.summary()
        if draft and draft_sync:
            result.update(
                config=f"never, draft {draft_sync}",
                ms_per_step=1e3 * seconds / max(scheduler.get_internal_state()["spec_plain_steps"], 1),
            )
        elif draft:
            state = scheduler.get_internal_state()
            result.update(
                accept_length=state["avg_spec_accept_length"],
                phase_ms=state["spec_phase_ms"],
                ms_per_step=1e3 * seconds / max(state["spec_steps"] + state["spec_plain_steps"], 1),
            )
            if dynamic:
                result.update(config="dynamic", steps_by_k=state["spec_steps_by_k"])
        else:
            result["ms_per_step"] = 1e3 * seconds / max(decode_tokens / bs, 1)
        results.append(result)
    return results


def closed_loop_level(
    scheduler,
    model: str,
    concurrency: int,
    rounds: int,
    input_len: int,
    output_len: int,
    prompt_kind: str,
    device: str,
    step_times: bool,
) -> dict:
    """A server's steady state without its front end: `concurrency` streaming requests in flight,
    each replaced by a new prompt in the pass that reports it finished, until `rounds` x
    concurrency requests have finished (the first fill is not measured, nor the drain). Output
    lengths are drawn from [output_len / 2, 3 output_len / 2] (seeded: the same for every
    variant), so requests finish spread over the steps and prefill passes of a few requests
    interleave with the decode steps, as in a loaded server. tokens_per_s counts every token
    reported while measuring."""
    import random as _random

    from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
    from sglang.srt.sampling.sampling_params import SamplingParams

    target_done = rounds * concurrency
    total = concurrency + target_done
    prompts = (
        code_prompts(model, total, input_len)
        if prompt_kind == "code"
        else random_prompts(scheduler.model_config.vocab_size, total, input_len)
    )
    lengths = _random.Random(0)
    made = 0

    def add() -> None:
        nonlocal made
        n = lengths.randint(max(1, output_len // 2), max(1, output_len * 3 // 2))
        params = SamplingParams(max_new_tokens=n, temperature=0, ignore_eos=True)
        scheduler.add_request(
            TokenizedGenerateReqInput(f"c{concurrency}-r{made}", prompts[made % total], params, stream=True)
        )
        made += 1

    for _ in range(concurrency):
        add()
    while scheduler.waiting_queue or scheduler.chunked_req is not None or len(scheduler.running_reqs) < concurrency:
        scheduler.step()
    clock = _clock(scheduler, step_times)
    tokens = done = passes = 0
    if device == "cuda":
        torch.cuda.synchronize()
    probe_before = work_ms(PROBE_WORK)
    start = time.perf_counter()
    while done < target_done:
        clock.begin()
        out = scheduler.step()
        passes += 1
        if out is not None:
            tokens += sum(len(ids) for ids in out.new_token_ids)
            finished = sum(1 for reason in out.finished_reasons if reason)
            done += finished
            for _ in range(finished):
                if made < total:
                    add()
        clock.end()
    seconds = time.perf_counter() - start
    probe_after = work_ms(PROBE_WORK)
    while scheduler.has_work():  # the drain, not measured
        scheduler.step()
    result = {
        "batch_size": concurrency,
        "closed_loop_rounds": rounds,
        "requests": done,
        "decode_tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "passes": passes,
        "ms_per_step": 1e3 * seconds / passes,
        "cpu_probe_ms": [probe_before, probe_after],
    }
    if step_times:
        result["step_times"] = clock.summary()
    return result


class _NoClock:
    def begin(self) -> None:
        pass

    def end(self) -> None:
        pass


def _clock(scheduler, step_times: bool):
    """A StepClock on the scheduler (--step-times), else one that does nothing; imported only
    when asked, so that a baseline tree from before step_times.py runs too."""
    if not step_times:
        return _NoClock()
    from sglang.srt.managers.step_times import StepClock

    scheduler.clock = StepClock("")
    return scheduler.clock


def make_pair(kind: str, workdir: str, weights: bool = True) -> tuple[str, str]:
    """(target, draft) directories: the demo pair, or a random pair made under `workdir` once: "8b"
    (Llama-3.1-8B shapes) or any `make_random_model` config name (e.g. "qwen3-30b-a3b-8l"), with a
    random bfloat16 EAGLE-3 draft of the target's hidden size reading three of its layers.
    weights=False writes the target's config.json and tokenizer only (its own directory), for servers
    run with --load-format dummy."""
    if kind == "demo":
        from sglang import demo

        return demo.TARGET_PATH, demo.DRAFT_PATH
    from sglang.test.tiny_models import make_tiny_eagle3_draft
    from sglang.tools.make_random_model import CONFIGS

    config = "llama-3.1-8b" if kind == "8b" else kind
    if config not in CONFIGS:
        raise ValueError(f"unknown model kind {kind!r}: demo, 8b or one of {sorted(CONFIGS)}")
    target = os.path.join(workdir, config if weights else f"{config}-config")
    if not os.path.isfile(os.path.join(target, "config.json")):
        subprocess.run(
            [
                sys.executable,
                "-m",
                "sglang.tools.make_random_model",
                target,
                "--config",
                config,
                *([] if weights else ["--no-weights"]),
            ],
            check=True,
        )
    draft = os.path.join(workdir, f"{config}-eagle3")
    if not os.path.isfile(os.path.join(draft, "config.json")):
        layers = CONFIGS[config]["num_hidden_layers"]
        aux = [1, layers // 2 - 1, layers - 4] if layers >= 8 else None  # EAGLE-3's published choice
        make_tiny_eagle3_draft(draft, target, draft_vocab_size=32000, dtype=torch.bfloat16, aux_layer_ids=aux)
    return target, draft
