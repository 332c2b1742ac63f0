"""The scheduler's own host time per decode step, with the model taken out, on this machine's CPU.

On a small model the scheduler's Python sets the step time (the demo pair on an H200: 1.2 ms of
host time per speculative step at batch 4 and 5.2 ms at batch 256, against 0.5 and 0.9 ms on the
device), so every microsecond it spends per step or per token is throughput lost. Here the real
Scheduler (demo pair, KV pool, radix cache, policy, stats) runs a closed loop of streaming
requests, each replaced by a new one as it finishes, while its worker's forwards return at once
with made-up tokens (speculative steps accept 1 .. k + 1 of them). Each pass is timed by phase as
SGLANG_STEP_TIMES does, and its outputs are pickled as the server loop sends them.

    python benchmark/sched_host_cost.py [--servers always,dynamic,no_draft] [--batch-sizes 4,64,256]
        [--steps 400] [--profile] [--out FILE]

Not a GPU measurement: what it shows is where the scheduler's own time goes and how a change
moves it; the device's share of a step and the CUDA calls are not in it.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pickle
import pstats
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

import torch  # noqa: E402

from sglang import demo  # noqa: E402
from sglang.srt.managers.io_struct import TokenizedGenerateReqInput  # noqa: E402
from sglang.srt.managers.scheduler import Scheduler  # noqa: E402
from sglang.srt.managers.step_times import StepClock  # noqa: E402
from sglang.srt.managers.tp_worker import GenerationBatchResult  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402
from sglang.srt.server_args import ServerArgs  # noqa: E402

K = 3
INPUT_LEN = 128
OUTPUT_LEN = 128
ACCEPT = 0.8  # per position: tokens per verify ~2.95 at k = 3, as the demo pair on code


def measured_costs(repeats: int = 5) -> dict:
    """The demo pair's start-up cost table on an H200 (as policy_host_cost.py), in place of the
    replays a CPU would time: the cost policy then chooses as it would there."""
    from policy_host_cost import PLAIN_MS, SPEC_MS

    return {"plain": {bs: ms / 1e3 for bs, ms in PLAIN_MS.items()},
            "spec": {(bs, k): ms / 1e3 for k, table in SPEC_MS.items() for bs, ms in table.items()}}


def make_scheduler(server: str, max_bs: int) -> Scheduler:
    """`no_draft`, `always` (EAGLE-3, k = 3 every step) or `dynamic` (the default cost policy)."""
    spec = {}
    if server != "no_draft":
        spec = dict(speculative_algorithm="EAGLE3", speculative_draft_model_path=demo.DRAFT_PATH,
                    speculative_num_steps=K, speculative_policy="always" if server == "always" else "cost")
    args = ServerArgs(model_path=demo.TARGET_PATH, device="cpu", dtype="bfloat16", max_running_requests=max_bs,
                      max_total_tokens=max_bs * (INPUT_LEN + OUTPUT_LEN + 2 * K + 8), log_level="warning", **spec)
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

    real = EAGLEWorkerV2.measure_step_costs
    EAGLEWorkerV2.measure_step_costs = lambda self, repeats=5: measured_costs(repeats)
    try:
        scheduler = Scheduler(args)
    finally:
        EAGLEWorkerV2.measure_step_costs = real
    fake_forwards(scheduler, random.Random(0))
    return scheduler


def fake_forwards(scheduler: Scheduler, rng: random.Random) -> None:
    """The worker's forwards return made-up results at once (the scheduler's bookkeeping of
    slots, lengths and stats runs as with a model)."""
    worker = scheduler.tp_worker
    vocab = scheduler.model_config.vocab_size

    def forward(batch):
        bs = batch.batch_size
        if not batch.forward_mode.is_decode() or not scheduler.spec_k:
            result = GenerationBatchResult(None, torch.tensor([rng.randrange(vocab) for _ in range(bs)]))
        else:
            from sglang.srt.speculative.eagle_worker_v2 import SpecStepResult, _StepTimer

            width = batch.spec_steps + 1
            num_out = []
            for _ in range(bs):
                n = 1
                while n < width and rng.random() < ACCEPT:
                    n += 1
                num_out.append(n)
            tokens = torch.tensor([[rng.randrange(vocab) for _ in range(width)] for _ in range(bs)])
            timer = _StepTimer("cpu")
            timer.mark("step")
            result = SpecStepResult(tokens=tokens, num_out=torch.tensor(num_out) if width > 1 else None, timer=timer)
        result.start_copy_to_host()
        return result

    worker.forward_batch_generation = forward


def run(server: str, bs: int, steps: int, profile: bool) -> dict:
    scheduler = make_scheduler(server, bs)
    rng = random.Random(1)
    vocab = scheduler.model_config.vocab_size
    made = 0

    def add(n: int) -> None:
        nonlocal made
        for _ in range(n):
            params = SamplingParams(temperature=0, max_new_tokens=OUTPUT_LEN, ignore_eos=True)
            ids = [rng.randrange(1, vocab) for _ in range(INPUT_LEN)]
            scheduler.add_request(TokenizedGenerateReqInput(f"r{made}", ids, params, stream=True))
            made += 1

    add(bs)
    while len(scheduler.running_reqs) < bs:  # every request prefilled
        scheduler.step()
    clock = scheduler.clock = StepClock("")
    profiler = cProfile.Profile() if profile else None
    tokens = 0
    start = time.perf_counter()
    if profiler:
        profiler.enable()
    for _ in range(steps):
        clock.begin()
        out = scheduler.step()
        if out is not None:
            pickle.dumps(out)  # what the server loop's send_pyobj does first
            tokens += sum(len(ids) for ids in out.new_token_ids)
            add(sum(1 for reason in out.finished_reasons if reason))
        clock.lap("send")
        clock.end()
    seconds = time.perf_counter() - start
    if profiler:
        profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(30)
        print(text.getvalue())
    groups = {name: {key: round(value, 1) if isinstance(value, float) else value for key, value in row.items()}
              for name, row in clock.summary().items() if row["steps"] >= steps // 10}
    return {"server": server, "batch_size": bs, "steps": steps, "us_per_pass": 1e6 * seconds / steps,
            "us_per_token": 1e6 * seconds / max(tokens, 1), "tokens": tokens, "groups": groups}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", default="always,dynamic,no_draft")
    parser.add_argument("--batch-sizes", default="4,64,256")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--profile", action="store_true", help="cProfile the passes, top 30 by own time")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    results = []
    for server in args.servers.split(","):
        for bs in (int(b) for b in args.batch_sizes.split(",")):
            result = run(server, bs, args.steps, args.profile)
            results.append(result)
            print(f"{server:9} bs {bs:4}: {result['us_per_pass']:8.1f} us per pass, {result['us_per_token']:6.2f} us "
                  f"per token", flush=True)
            for name, row in result["groups"].items():
                print(f"    {name:14} {row['steps']:5} steps: schedule {row['schedule_us']:7.1f}, launch "
                      f"{row['launch_us']:6.1f}, process {row['process_us']:7.1f}, collect {row['collect_us']:6.1f}, "
                      f"pickle+refill {row['send_us']:6.1f} us", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"machine": "cpu", "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
