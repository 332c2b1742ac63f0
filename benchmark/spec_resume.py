"""Acceptance of the first speculative step after N plain steps (issue 8), against steady
speculation, with the draft kept warm by the plain steps (the default strategy).

    python benchmark/spec_resume.py --out result.json [--plain-runs 1,10,100] [--requests 64]

Runs the demo pair through the real Scheduler, greedy, prompts from distinct standard-library
files. For each N the steps go N plain, 1 speculative (k = 3), repeated; the reference run
speculates on every step. Reports the mean accept length (tokens per verify) of each and the
ratio (goal: >= 0.95 after 100 plain steps). Acceptance does not depend on the device, so this
runs on the CPU in float32 (--device cuda works too)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from spec_speed import code_prompts  # noqa: E402


def accept_length(pattern, requests: int, output_len: int, device: str, sync: str) -> tuple[float, int]:
    from sglang import demo
    from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.server_args import ServerArgs

    scheduler = Scheduler(ServerArgs(device=device, dtype="float32" if device == "cpu" else "auto",
                                     speculative_algorithm="EAGLE3", speculative_num_steps=3,
                                     max_running_requests=requests, log_level="warning",
                                     speculative_draft_sync=sync))
    steps = []
    scheduler.spec_steps_for = lambda bs: steps.append(pattern(len(steps))) or steps[-1]
    for i, ids in enumerate(code_prompts(demo.TARGET_PATH, requests, 128)):
        params = SamplingParams(max_new_tokens=output_len, temperature=0, ignore_eos=True)
        scheduler.add_request(TokenizedGenerateReqInput(f"r{i}", ids, params, stream=False))
    while scheduler.has_work():
        scheduler.step()
    state = scheduler.get_internal_state()
    return state["avg_spec_accept_length"], state["spec_verifies"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--plain-runs", default="1,10,100")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=400)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--draft-sync", default="warm", choices=["warm", "catch-up"],
                        help="how the draft follows plain steps (--speculative-draft-sync)")
    args = parser.parse_args()
    start = time.time()
    steady, steady_verifies = accept_length(lambda i: 3, args.requests, args.output_len, args.device,
                                            args.draft_sync)
    results = {"steady_accept_length": steady, "steady_verifies": steady_verifies, "after_plain": []}
    print(f"steady: accept length {steady:.3f} over {steady_verifies} request-verifies", flush=True)
    for n in (int(x) for x in args.plain_runs.split(",")):
        length, verifies = accept_length(lambda i, n=n: 3 if i % (n + 1) == n else 0, args.requests,
                                         args.output_len, args.device, args.draft_sync)
        results["after_plain"].append({"plain_steps": n, "accept_length": length, "verifies": verifies,
                                       "ratio_to_steady": length / steady})
        print(f"after {n} plain steps: accept length {length:.3f} over {verifies} request-verifies "
              f"= {length / steady:.3f} x steady", flush=True)
    results.update(device=args.device, requests=args.requests, output_len=args.output_len, k=3,
                   strategy=args.draft_sync,
                   seconds=time.time() - start, torch=torch.__version__)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
