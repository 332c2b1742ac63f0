"""Speculative decoding speed against plain decoding, through the real Scheduler (issue 6).

    python benchmark/spec_speed.py --out result.json [--pair demo|8b] [--batch-sizes 1,2,4,...]
        [--steps 3] [--input-len 128] [--output-len 128]

For each batch size: plain decoding and EAGLE-3 with k = --steps (a list sweeps k), same
prompts (random token ids), greedy, ignore_eos. Measured from the moment every request has its
first token (prefill done) to the end: decode tokens per second; for speculation also the mean
accept length (tokens per verify, bonus included) and the mean device time of its phases
(draft chain, verify, draft extend) from the worker's stats.
`--pair demo` is the shipped demo target + draft, prompted with Python standard-library code
(its domain; distinct files per request); `--pair 8b` makes Llama-3.1-8B shapes with
random weights and a random EAGLE-3 draft for them (acceptance ~0: that run measures cost).
Each k (0 = plain) runs in its own process with one Scheduler sized for the largest batch, which
runs the batch sizes in turn (so a model loads and captures its graphs once per k).

`--off-state` measures what a loaded draft costs when it is not used (issue 8): the server
without a draft against the speculative server with `--speculative-policy never`, draft kept
warm and caught up; for each, the prefill time of the batch's prompts and the decode speed.

`--closed-loop ROUNDS` measures a loaded server's steady state without its HTTP front end: each
batch size is a concurrency kept full by replacing finished requests with new prompts (output
lengths spread, so prefill passes of a few requests interleave with decode steps as they do in
a served load at high concurrency), output tokens per second over ROUNDS x concurrency
completions.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cpu_speed_probe import work_ms  # noqa: E402

# The CPU probe around each measurement (cpu_speed_probe.work_ms: ~5 ms at full speed on the GPU
# machine, best of 3): on a host-bound level, tok/s x probe ms reads the code's speed with the
# CPU's speed of the moment factored out (its vCPUs run the same Python at full or half speed).
PROBE_WORK = 50_000


def random_prompts(vocab: int, n: int, length: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(10, vocab, (length,), generator=gen).tolist() for _ in range(n)]


def code_prompts(model: str, n: int, length: int) -> list[list[int]]:
    """n windows of `length` tokens of Python standard-library files (the demo model's domain)."""
    from transformers import AutoTokenizer

    from make_code_dataset import code_windows

    prompts = code_windows(AutoTokenizer.from_pretrained(model), n, length)
    return [prompts[i % len(prompts)] for i in range(n)]


def measure(model: str, draft: str | None, k: int, batch_sizes: list[int], input_len: int, output_len: int,
            device: str, prompt_kind: str = "random", step_graph: bool = True, draft_sync: str | None = None,
            dynamic: bool = False, step_times: bool = False, closed_loop: int = 0) -> list[dict]:
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

    spec = dict(speculative_algorithm="EAGLE3", speculative_draft_model_path=draft, speculative_num_steps=k,
                disable_speculative_step_graph=not step_graph) if draft else {}
    if draft and draft_sync:
        spec.update(speculative_policy="never", speculative_draft_sync=draft_sync)
    if draft and dynamic:
        spec.update(speculative_adaptive=True)
    max_bs = max(batch_sizes)
    args = ServerArgs(model_path=model, device=device, max_running_requests=max_bs, cuda_graph_max_bs=max_bs,
                      log_level="warning", **spec)
    scheduler = Scheduler(args)
    results = []
    for bs in batch_sizes:
        scheduler.flush_cache()  # every level prefills its prompts afresh
        if draft:
            scheduler.tp_worker.stats = SpecStats(k)
        if closed_loop:
            result = closed_loop_level(scheduler, model, bs, closed_loop, input_len, output_len, prompt_kind,
                                       device, step_times)
            result["k"] = k if draft else 0
            if draft:
                state = scheduler.get_internal_state()
                result.update(accept_length=state["avg_spec_accept_length"], phase_ms=state["spec_phase_ms"],
                              steps_by_k=state["spec_steps_by_k"])
                if dynamic:
                    result["config"] = "dynamic"
            results.append(result)
            continue
        prompts = code_prompts(model, bs, input_len) if prompt_kind == "code" else random_prompts(
            scheduler.model_config.vocab_size, bs, input_len)
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
        profiler = None
        if os.environ.get("SPEC_SPEED_PROFILE"):  # a directory: host-side profile of each level's decode
            import cProfile

            profiler = cProfile.Profile()
            profiler.enable()
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
        if profiler is not None:
            import io
            import pstats

            profiler.disable()
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
            path = os.path.join(os.environ["SPEC_SPEED_PROFILE"], f"host_profile_bs{bs}_k{k if draft else 0}.txt")
            with open(path, "w") as f:
                f.write(text.getvalue())
        decode_tokens = bs * output_len - first_tokens
        result = {"batch_size": bs, "k": k if draft else 0, "step_graph": bool(draft) and step_graph,
                  "decode_tokens": decode_tokens, "seconds": seconds,
                  "tokens_per_s": decode_tokens / seconds, "prefill_seconds": prefill_seconds,
                  "prefill_tokens_per_s": bs * input_len / prefill_seconds,
                  "cpu_probe_ms": [probe_before, probe_after]}
        if step_times:
            result["step_times"] = clock.summary()
        if draft and draft_sync:
            result.update(config=f"never, draft {draft_sync}",
                          ms_per_step=1e3 * seconds / max(scheduler.get_internal_state()["spec_plain_steps"], 1))
        elif draft:
            state = scheduler.get_internal_state()
            result.update(accept_length=state["avg_spec_accept_length"], phase_ms=state["spec_phase_ms"],
                          ms_per_step=1e3 * seconds / max(state["spec_steps"] + state["spec_plain_steps"], 1))
            if dynamic:
                result.update(config="dynamic", steps_by_k=state["spec_steps_by_k"])
        else:
            result["ms_per_step"] = 1e3 * seconds / max(decode_tokens / bs, 1)
        results.append(result)
    return results


def closed_loop_level(scheduler, model: str, concurrency: int, rounds: int, input_len: int, output_len: int,
                      prompt_kind: str, device: str, step_times: bool) -> dict:
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
    prompts = code_prompts(model, total, input_len) if prompt_kind == "code" else random_prompts(
        scheduler.model_config.vocab_size, total, input_len)
    lengths = _random.Random(0)
    made = 0

    def add() -> None:
        nonlocal made
        n = lengths.randint(max(1, output_len // 2), max(1, output_len * 3 // 2))
        params = SamplingParams(max_new_tokens=n, temperature=0, ignore_eos=True)
        scheduler.add_request(TokenizedGenerateReqInput(f"c{concurrency}-r{made}", prompts[made % total], params,
                                                        stream=True))
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
    result = {"batch_size": concurrency, "closed_loop_rounds": rounds, "requests": done, "decode_tokens": tokens,
              "seconds": seconds, "tokens_per_s": tokens / seconds, "passes": passes,
              "ms_per_step": 1e3 * seconds / passes, "cpu_probe_ms": [probe_before, probe_after]}
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


def make_pair(kind: str, workdir: str) -> tuple[str, str]:
    if kind == "demo":
        from sglang import demo

        return demo.TARGET_PATH, demo.DRAFT_PATH
    from sglang.test.tiny_models import make_tiny_eagle3_draft

    target = os.path.join(workdir, "llama-3.1-8b")
    if not os.path.isfile(os.path.join(target, "config.json")):
        subprocess.run([sys.executable, "-m", "sglang.tools.make_random_model", target, "--config", "llama-3.1-8b"],
                       check=True)
    draft = os.path.join(workdir, "llama-3.1-8b-eagle3")
    if not os.path.isfile(os.path.join(draft, "config.json")):
        make_tiny_eagle3_draft(draft, target, draft_vocab_size=32000, dtype=torch.bfloat16,
                               aux_layer_ids=[1, 15, 28])
    return target, draft


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--pair", choices=["demo", "8b"], default="demo")
    parser.add_argument("--batch-sizes", default="1,2,4,8,16,32,64,128,256")
    parser.add_argument("--steps", default="3", help="k, or a comma list to sweep")
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--workdir", default="/tmp/spec_speed")
    parser.add_argument("--disable-step-graph", action="store_true",
                        help="speculative steps replay a graph per forward, not one per step")
    parser.add_argument("--off-state", action="store_true",
                        help="no draft vs policy never with the draft warm / caught up, instead of the k list")
    parser.add_argument("--dynamic", action="store_true",
                        help="also the default dynamic policy (cost, k up to the largest --steps)")
    parser.add_argument("--step-times", action="store_true",
                        help="time each decode pass by phase (SGLANG_STEP_TIMES' table) at every level")
    parser.add_argument("--repeats", type=int, default=1,
                        help="run each variant in this many processes in turn (identical runs: their spread)")
    parser.add_argument("--baseline-python", default=None,
                        help="a directory holding another tree's `sglang` package (benchmark/stage_baseline.sh): "
                             "every run of every variant is made with it too, right after the current code's, "
                             "labelled code=baseline (with --step-times where that tree has step_times.py)")
    parser.add_argument("--cpu", type=int, default=None, help="pin every run to this CPU")
    parser.add_argument("--closed-loop", type=int, default=0, metavar="ROUNDS",
                        help="a server's steady state instead: each batch size is a concurrency, finished "
                             "requests replaced at once by new prompts (output lengths spread over 0.5-1.5x "
                             "--output-len), measured until ROUNDS x concurrency requests finished; prefill "
                             "passes count (closed_loop_level)")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: one variant in this process
    parser.add_argument("--pair-paths", default=None, help=argparse.SUPPRESS)  # internal: TARGET,DRAFT
    args = parser.parse_args()
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    target, draft = args.pair_paths.split(",") if args.pair_paths else make_pair(args.pair, args.workdir)
    batch_sizes = [int(x) for x in args.batch_sizes.split(",")]
    k_max = max(int(k) for k in args.steps.split(","))
    if args.one is not None:
        sync = args.one if args.one in ("warm", "catch-up") else None
        dynamic = args.one == "dynamic"
        k = 3 if sync else k_max if dynamic else int(args.one)
        print(json.dumps(measure(target, draft if k else None, k, batch_sizes, args.input_len, args.output_len,
                                 args.device, "code" if args.pair == "demo" else "random",
                                 not args.disable_step_graph, sync, dynamic, args.step_times, args.closed_loop)),
              flush=True)
        return
    results = []
    variants = ["0", "warm", "catch-up"] if args.off_state else ["0"] + args.steps.split(",")
    if args.dynamic:
        variants.append("dynamic")
    codes = ["current"] + (["baseline"] if args.baseline_python else [])
    # A baseline from before step_times.py (session 13) runs without --step-times.
    baseline_times = bool(args.baseline_python) and os.path.isfile(
        os.path.join(args.baseline_python, "sglang", "srt", "managers", "step_times.py"))
    # Odd repeats run the baseline first: a process that runs first (after a variant switch, or on a
    # machine just started) must not always be the same tree's.
    for run, k, code in [(run, k, code) for run in range(args.repeats) for k in variants
                         for code in (codes if run % 2 == 0 else codes[::-1])]:
        cmd = [sys.executable, __file__, "--out", args.out, "--pair", args.pair, "--input-len", str(args.input_len),
               "--output-len", str(args.output_len), "--device", args.device, "--workdir", args.workdir,
               "--batch-sizes", args.batch_sizes, "--steps", args.steps, "--one", k, "--pair-paths", f"{target},{draft}"]
        cmd += ["--disable-step-graph"] if args.disable_step_graph else []
        cmd += ["--closed-loop", str(args.closed_loop)] if args.closed_loop else []
        cmd += ["--step-times"] if args.step_times and (code == "current" or baseline_times) else []
        cmd += ["--cpu", str(args.cpu)] if args.cpu is not None else []
        env = None
        if code == "baseline":
            path = os.path.abspath(args.baseline_python)
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [path, os.environ.get("PYTHONPATH")])))
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            results.append({"k": k, "run": run, "code": code, "error": proc.stderr[-2000:]})
            print(f"k {k} ({code}): failed\n{proc.stderr[-2000:]}", flush=True)
        else:
            for r in json.loads(proc.stdout.strip().splitlines()[-1]):
                r["run"], r["code"] = run, code
                results.append(r)
                print(f"bs {r['batch_size']} {r.get('config', 'k ' + k)} ({code}): {r['tokens_per_s']:.1f} tok/s, "
                      f"{r['ms_per_step']:.2f} ms/" + ("pass" if "passes" in r else f"step, prefill {r['prefill_tokens_per_s']:.0f} tok/s")
                      + (f", accept {r['accept_length']:.2f}, phases {r['phase_ms']}" if 'accept_length' in r else "")
                      + (f", steps by k {r['steps_by_k']}" if 'steps_by_k' in r else ""), flush=True)
                for group, row in r.get("step_times", {}).items():
                    if row["steps"] >= 8:  # the level's decode groups (a few stray passes are left out)
                        print(f"    run {run} {group}: {row['steps']} steps, us per step: schedule "
                              f"{row['schedule_us']:.0f}, launch {row['launch_us']:.0f}, process {row['process_us']:.0f}, "
                              f"wait {row['wait_us']:.0f}, collect {row['collect_us']:.0f}; pass p50 {row['p50_us']:.0f}, "
                              f"p90 {row['p90_us']:.0f}", flush=True)
        with open(args.out, "w") as f:  # after every k: a cut-short run keeps what it measured
            json.dump({"pair": args.pair, "input_len": args.input_len, "output_len": args.output_len,
                       "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
                       "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
