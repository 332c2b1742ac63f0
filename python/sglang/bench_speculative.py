"""Speculative decoding speed against plain decoding, through the real Scheduler (no HTTP).

    python -m sglang.bench_speculative --out result.json [--pair demo|8b] [--batch-sizes 1,2,4,...]
        [--steps 3] [--input-len 128] [--output-len 128] [--step-times]

For each batch size: plain decoding and EAGLE-3 with k = --steps (a list sweeps k), same
prompts, greedy, ignore_eos. Measured from the moment every request has its first token
(prefill done) to the end: decode tokens per second; for speculation also the mean accept
length (tokens per verify, bonus included) and the mean device time of its phases (draft chain,
verify, draft extend). `--pair demo` is the shipped demo pair prompted with Python
standard-library code (its domain); `--pair 8b` makes Llama-3.1-8B shapes with random weights
and a random EAGLE-3 draft (acceptance ~0: that run measures cost). Each k (0 = plain) runs in
its own process, which loads the model and captures its graphs once and runs the batch sizes
in turn.

`--step-times` times every pass by phase (schedule, launch, process, device wait, collect);
read the result with `python -m sglang.benchmark.step_times_report RESULT.json [AFTER.json]`.
`--off-state` measures what a loaded but unused draft costs (policy `never`, draft kept warm or
caught up) against no draft. `--closed-loop ROUNDS` measures a loaded server's steady state
instead: each batch size is a concurrency kept full by replacing finished requests.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import torch

from sglang.benchmark.speculative_levels import make_pair, measure


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="JSON file to write (rewritten after every variant)")
    parser.add_argument("--pair", choices=["demo", "8b"], default="demo")
    parser.add_argument("--batch-sizes", default="1,2,4,8,16,32,64,128,256")
    parser.add_argument("--steps", default="3", help="k, or a comma list to sweep")
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--workdir", default="/tmp/spec_speed", help="where the 8b pair is made")
    parser.add_argument(
        "--disable-step-graph",
        action="store_true",
        help="speculative steps replay a graph per forward, not one per step (splits the phases)",
    )
    parser.add_argument(
        "--off-state",
        action="store_true",
        help="no draft vs policy never with the draft warm / caught up, instead of the k list",
    )
    parser.add_argument(
        "--dynamic", action="store_true", help="also the default dynamic policy (cost, k up to the largest --steps)"
    )
    parser.add_argument("--step-times", action="store_true", help="time each decode pass by phase at every level")
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="run each variant in this many processes in turn (identical runs: their spread)",
    )
    parser.add_argument("--cpu", type=int, default=None, help="pin every run to this CPU")
    parser.add_argument(
        "--closed-loop",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="a server's steady state instead: finished requests replaced at once by new prompts "
        "(output lengths spread over 0.5-1.5x --output-len), until ROUNDS x concurrency "
        "requests finished",
    )
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: one variant in this process
    parser.add_argument("--pair-paths", default=None, help=argparse.SUPPRESS)  # internal: TARGET,DRAFT
    return parser.parse_args(argv)


def run_one_variant(args, target: str, draft: str) -> None:
    """In a child process: one variant (k, or warm / catch-up / dynamic) at every batch size."""
    batch_sizes = [int(x) for x in args.batch_sizes.split(",")]
    k_max = max(int(k) for k in args.steps.split(","))
    sync = args.one if args.one in ("warm", "catch-up") else None
    dynamic = args.one == "dynamic"
    k = 3 if sync else k_max if dynamic else int(args.one)
    print(
        json.dumps(
            measure(
                target,
                draft if k else None,
                k,
                batch_sizes,
                args.input_len,
                args.output_len,
                args.device,
                "code" if args.pair == "demo" else "random",
                not args.disable_step_graph,
                sync,
                dynamic,
                args.step_times,
                args.closed_loop,
            )
        ),
        flush=True,
    )


def child_command(args, variant: str, target: str, draft: str) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "sglang.bench_speculative",
        "--out",
        args.out,
        "--pair",
        args.pair,
        "--input-len",
        str(args.input_len),
        "--output-len",
        str(args.output_len),
        "--device",
        args.device,
        "--workdir",
        args.workdir,
        "--batch-sizes",
        args.batch_sizes,
        "--steps",
        args.steps,
        "--one",
        variant,
        "--pair-paths",
        f"{target},{draft}",
    ]
    cmd += ["--disable-step-graph"] if args.disable_step_graph else []
    cmd += ["--closed-loop", str(args.closed_loop)] if args.closed_loop else []
    cmd += ["--step-times"] if args.step_times else []
    return cmd + (["--cpu", str(args.cpu)] if args.cpu is not None else [])


def print_result(r: dict, variant: str) -> None:
    unit = "pass" if "passes" in r else f"step, prefill {r['prefill_tokens_per_s']:.0f} tok/s"
    line = (
        f"bs {r['batch_size']} {r.get('config', 'k ' + variant)}: {r['tokens_per_s']:.1f} tok/s, "
        f"{r['ms_per_step']:.2f} ms/{unit}"
    )
    if "accept_length" in r:
        line += f", accept {r['accept_length']:.2f}, phases {r['phase_ms']}"
    if "steps_by_k" in r:
        line += f", steps by k {r['steps_by_k']}"
    print(line, flush=True)
    for group, row in r.get("step_times", {}).items():
        if row["steps"] >= 8:  # the level's decode groups (a few stray passes are left out)
            print(
                f"    {group}: {row['steps']} steps, us per step: schedule {row['schedule_us']:.0f}, "
                f"launch {row['launch_us']:.0f}, process {row['process_us']:.0f}, wait {row['wait_us']:.0f}, "
                f"collect {row['collect_us']:.0f}; pass p50 {row['p50_us']:.0f}, p90 {row['p90_us']:.0f}",
                flush=True,
            )


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    target, draft = args.pair_paths.split(",") if args.pair_paths else make_pair(args.pair, args.workdir)
    if args.one is not None:
        run_one_variant(args, target, draft)
        return
    variants = ["0", "warm", "catch-up"] if args.off_state else ["0"] + args.steps.split(",")
    variants += ["dynamic"] if args.dynamic else []
    results = []
    for run in range(args.repeats):
        for variant in variants:
            proc = subprocess.run(child_command(args, variant, target, draft), capture_output=True, text=True)
            if proc.returncode != 0:
                results.append({"k": variant, "run": run, "error": proc.stderr[-2000:]})
                print(f"k {variant}: failed\n{proc.stderr[-2000:]}", flush=True)
            else:
                for r in json.loads(proc.stdout.strip().splitlines()[-1]):
                    r["run"] = run
                    results.append(r)
                    print_result(r, variant)
            with open(args.out, "w") as f:  # after every variant: a cut-short run keeps what it measured
                json.dump(
                    {
                        "pair": args.pair,
                        "input_len": args.input_len,
                        "output_len": args.output_len,
                        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
                        "results": results,
                    },
                    f,
                    indent=1,
                )


if __name__ == "__main__":
    main()
