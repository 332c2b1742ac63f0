"""How busy the GPU is during steady decode, through the real Scheduler, with and without overlap.

    python benchmark/overlap_busy.py --model-path DIR [--batch-size 64] [--input-len 1024] \
        [--output-len 128] [--out result.json]

Two measures of the GPU's busy share during the decode steps of the scheduler loop:
- `busy_share`: the device time of one decode step, measured by replaying its CUDA graph and
  sampling back to back with nothing else queued, divided by the loop's wall time per step. This
  is the share of each step the GPU really computes.
- `bracket_share` (an upper bound): every launched step is bracketed by CUDA events; sum of the
  spans / wall. A span starts when the stream reaches the start event, which is at once if the
  GPU is idle, so host-side preparation after that point is counted as busy.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import torch

from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs


def instrument(scheduler: Scheduler, spans: list) -> None:
    """Wrap the worker's launch so every decode step records (start, end) events."""
    worker = scheduler.tp_worker
    launch = worker.forward_batch_generation

    def timed(batch):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        result = launch(batch)
        end.record()
        if batch.forward_mode == ForwardMode.DECODE:
            spans.append((start, end, time.perf_counter()))
        return result

    worker.forward_batch_generation = timed


def run(model_path: str, overlap: bool, bs: int, input_len: int, output_len: int) -> dict:
    args = ServerArgs(model_path=model_path, disable_overlap_schedule=not overlap, max_running_requests=bs,
                      cuda_graph_max_bs=max(bs, 1))
    scheduler = Scheduler(args)
    gen = torch.Generator().manual_seed(0)
    vocab = scheduler.model_config.vocab_size
    for i in range(bs):
        ids = torch.randint(0, vocab, (input_len,), generator=gen).tolist()
        params = SamplingParams(max_new_tokens=output_len, temperature=0, ignore_eos=True)
        scheduler.add_request(TokenizedGenerateReqInput(f"r{i}", ids, params, stream=False))
    spans: list = []
    instrument(scheduler, spans)
    while scheduler.has_work():
        scheduler.step()
    torch.cuda.synchronize()
    steady = spans[2:]  # the first decode steps still overlap the prefill's tail
    bracket = sum(s.elapsed_time(e) for s, e, _ in steady) / 1e3
    wall = steady[0][0].elapsed_time(steady[-1][1]) / 1e3
    step_s = wall / len(steady)
    device_step_s = device_time_per_step(scheduler, bs)
    return {"overlap": overlap, "batch_size": bs, "decode_steps": len(steady), "wall_s": wall,
            "mean_step_ms": step_s * 1e3, "device_step_ms": device_step_s * 1e3,
            "busy_share": device_step_s / step_s, "bracket_share": bracket / wall}


def device_time_per_step(scheduler: Scheduler, bs: int, iters: int = 50) -> float:
    """One decode step's device time: its graph replay + sampling, queued back to back."""
    runner = scheduler.tp_worker.model_runner
    graphs = runner.graph_runner
    graph_bs = min(b for b in graphs.batch_sizes if b >= bs)
    logits = graphs.outputs[graph_bs].next_token_logits[:bs]
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

    info = SamplingBatchInfo.from_params([SamplingParams(temperature=0)] * bs, [0] * bs,
                                         scheduler.model_config.vocab_size, "cuda")
    offsets = torch.zeros(bs, dtype=torch.int64, device="cuda")

    def one_step():
        graphs.graphs[graph_bs].replay()
        runner.sample(logits, info, offsets)

    for _ in range(5):
        one_step()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        one_step()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=1024)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--out", default=None)
    parser.add_argument("--only", choices=["on", "off"], default=None,
                        help="one setting in this process (the default runs each in its own process, so the "
                             "first one's KV pool and graphs are gone before the second plans its memory)")
    args = parser.parse_args()
    if args.only is not None:
        result = run(args.model_path, args.only == "on", args.batch_size, args.input_len, args.output_len)
        print(json.dumps(result), flush=True)
        return
    results = []
    for setting in ("on", "off"):
        proc = subprocess.run([sys.executable, __file__, "--model-path", args.model_path, "--batch-size",
                               str(args.batch_size), "--input-len", str(args.input_len), "--output-len",
                               str(args.output_len), "--only", setting], capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"overlap {setting} failed:\n{proc.stderr[-3000:]}")
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    for r in results:
        print(f"overlap={r['overlap']}: {r['mean_step_ms']:.2f} ms/step in the loop, {r['device_step_ms']:.2f} ms "
              f"of device work: GPU busy {r['busy_share'] * 100:.1f}% (bracketed {r['bracket_share'] * 100:.1f}%) "
              f"over {r['decode_steps']} decode steps", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
