"""What admitting a request costs a running decode batch, through the real Scheduler (issue 8:
on the demo pair the speculative server loses to plain decoding at concurrency 8-32 because it
admits requests one at a time, each in its own eager prefill forward).

    python benchmark/prefill_cost.py --out prefill_cost.json [--pair demo|8b] [--batch 16]
        [--input-len 256] [--new 1,4] [--repeats 20] [--prefill-graph-max-tokens 0,2048]

For no draft and EAGLE-3 at k = 3, each with every --prefill-graph-max-tokens value (0: prefills
run eagerly; each configuration in its own process): a decode batch of --batch requests
runs in steady overlapped steps; then, --repeats times, --new requests of --input-len tokens
arrive with max_new_tokens 1 (so they finish at their prefill and the batch stays as it was), and
the steps until the batch is back in steady state are timed. Reported per configuration:
- steady_step_ms: the mean wall time of a steady decode step;
- admission_ms: the wall time of the steps from the arrival until steady again, less as many
  steady steps (what one admission costs the running requests, in milliseconds);
- prefill_launch_ms: the host's time to launch the prefill forward (target, and the draft's);
- prefill_wall_ms: the wall time of the step that runs the prefill, launch to processed.
Medians over the repeats."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from spec_speed import code_prompts, make_pair, random_prompts  # noqa: E402

STEADY_STEPS = 8


def measure(model: str, draft: str | None, batch: int, input_len: int, new_counts: list[int], repeats: int,
            device: str, prompt_kind: str, prefill_graph_max_tokens: int) -> list[dict]:
    from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.server_args import ServerArgs

    spec = {}
    if draft:
        spec = dict(speculative_algorithm="EAGLE3", speculative_draft_model_path=draft, speculative_num_steps=3)
    most = batch + max(new_counts)
    args = ServerArgs(model_path=model, device=device, max_running_requests=most, cuda_graph_max_bs=most,
                      log_level="warning", prefill_cuda_graph_max_tokens=prefill_graph_max_tokens, **spec)
    scheduler = Scheduler(args)
    worker = scheduler.tp_worker
    launches: list[float] = []
    forward = worker.forward_batch_generation

    def timed_forward(b):  # the host's time to launch a prefill (returns before the device is done)
        start = time.perf_counter()
        out = forward(b)
        if not b.forward_mode.is_decode():
            launches.append(time.perf_counter() - start)
        return out

    worker.forward_batch_generation = timed_forward
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    vocab = scheduler.model_config.vocab_size
    context = scheduler.model_config.context_len
    # Distinct prompts for every request (a prefix-cache hit would make a prefill cheaper), the
    # running batch's replacements included.
    n = 2 * batch + repeats * (sum(new_counts) + batch)
    pool = code_prompts(model, n, input_len) if prompt_kind == "code" else random_prompts(vocab, n, input_len)
    counter = iter(range(1 << 30))

    def add(name: str, max_new_tokens: int) -> None:
        i = next(counter)
        params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0, ignore_eos=True)
        scheduler.add_request(TokenizedGenerateReqInput(f"{name}{i}", pool[i % len(pool)], params, stream=False))

    def run_until(done, what: str) -> None:
        for _ in range(100_000):
            if done():
                return
            scheduler.step()
        raise RuntimeError(f"no progress towards {what}")

    def top_up() -> None:
        """Refills the running batch (a request that reached the context length is replaced),
        then runs it into steady overlapped decoding; not timed."""
        for _ in range(batch - len(scheduler.running_reqs)):
            add("run", min(context - input_len - 8, 4096))
        run_until(lambda: not scheduler.waiting_queue and len(scheduler.running_reqs) >= batch, "a full batch")
        for _ in range(2 * STEADY_STEPS):
            scheduler.step()

    results = []
    for new in new_counts:
        admission, steady, prefill_wall, prefill_launch = [], [], [], []
        for r in range(repeats):
            top_up()
            sync()
            start = time.perf_counter()
            for _ in range(STEADY_STEPS):
                scheduler.step()
            step_s = (time.perf_counter() - start) / STEADY_STEPS
            steady.append(step_s)
            for _ in range(new):
                add("new", 1)
            launches.clear()
            start, steps, overlapped = time.perf_counter(), 0, 0
            # Until the admitted requests are done and two decode steps have run overlapped again.
            while overlapped < 2 or scheduler.waiting_queue:
                if steps > 1000:
                    raise RuntimeError("the batch did not return to steady decoding after an admission")
                was_in_flight, launched = scheduler.in_flight is not None, len(launches)
                t0 = time.perf_counter()
                scheduler.step()
                steps += 1
                if len(launches) > launched and len(prefill_wall) <= r:
                    prefill_wall.append(time.perf_counter() - t0)
                steady_now = was_in_flight and scheduler.in_flight is not None and len(launches) == launched
                overlapped = overlapped + 1 if steady_now else 0
            prefill_launch.append(sum(launches))
            admission.append(time.perf_counter() - start - steps * step_s)
        results.append({"config": "EAGLE-3 k=3" if draft else "no draft",
                        "prefill_graph_max_tokens": prefill_graph_max_tokens, "batch": batch, "new": new,
                        "input_len": input_len, "repeats": repeats,
                        "steady_step_ms": 1e3 * statistics.median(steady),
                        "admission_ms": 1e3 * statistics.median(admission),
                        "prefill_launch_ms": 1e3 * statistics.median(prefill_launch),
                        "prefill_wall_ms": 1e3 * statistics.median(prefill_wall)})
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--pair", choices=["demo", "8b"], default="demo")
    parser.add_argument("--batch", type=int, default=16, help="running requests")
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--new", default="1,4", help="requests admitted together (a comma list)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--workdir", default="/tmp/spec_envelope")
    parser.add_argument("--prefill-graph-max-tokens", default="0,2048",
                        help="--prefill-cuda-graph-max-tokens values to compare (a comma list; 0: eager prefills)")
    parser.add_argument("--one", choices=["plain", "spec"], default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    new_counts = [int(x) for x in args.new.split(",")]
    graph_limits = [int(x) for x in args.prefill_graph_max_tokens.split(",")]
    if args.batch < 1 or args.repeats < 1 or min(new_counts) < 1:
        parser.error("--batch, --repeats and every --new count must be at least 1")
    target, draft = make_pair(args.pair, args.workdir)
    kind = "code" if args.pair == "demo" else "random"
    if args.one:
        print(json.dumps(measure(target, draft if args.one == "spec" else None, args.batch, args.input_len,
                                 new_counts, args.repeats, args.device, kind, graph_limits[0])), flush=True)
        return 0
    results = []
    # Each in its own process: one engine per process.
    for one, limit in [(one, limit) for one in ("plain", "spec") for limit in graph_limits]:
        proc = subprocess.run([sys.executable, __file__, "--out", args.out, "--pair", args.pair, "--batch",
                               str(args.batch), "--input-len", str(args.input_len), "--new", args.new, "--repeats",
                               str(args.repeats), "--device", args.device, "--workdir", args.workdir, "--one", one,
                               "--prefill-graph-max-tokens", str(limit)], capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"{one}, prefill graphs up to {limit}: failed\n{proc.stderr[-3000:]}", flush=True)
            results.append({"config": one, "prefill_graph_max_tokens": limit, "error": proc.stderr[-3000:]})
            continue
        for r in json.loads(proc.stdout.strip().splitlines()[-1]):
            results.append(r)
            print(f"{r['config']}, prefill graphs up to {limit} tokens, batch {r['batch']} + {r['new']} new of "
                  f"{r['input_len']} tokens: steady step "
                  f"{r['steady_step_ms']:.2f} ms, admission costs {r['admission_ms']:.2f} ms, prefill launch "
                  f"{r['prefill_launch_ms']:.2f} ms, prefill step {r['prefill_wall_ms']:.2f} ms", flush=True)
    with open(args.out, "w") as f:
        json.dump({"pair": args.pair, "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
                   "results": results}, f, indent=1)
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
