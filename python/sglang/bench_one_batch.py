"""Static-batch latency: prefill a batch, then decode step by step, without the scheduler.

    python -m sglang.bench_one_batch --model-path DIR --batch-size 1 8 64 --input-len 1024 \
        --output-len 128 [--memory-floor] [--profile-steps 5] [--result-filename out.jsonl] [any server flag]

With --tp-size N the model is split over N processes as in a server (docs/tensor_parallel.md);
the memory floor is then rank 0's: its share of the weights and KV over one device's bandwidth.

Prints per batch size the prefill latency and throughput and the decode step latency (median,
p90) and throughput, and appends one JSON line per batch size to --result-filename. Each step
is timed to the end of its GPU work (a synchronize per step), as a user's token would be.
--profile-steps N then runs N more decode steps under torch's profiler (CUDA graph replays as
served, or eager launches with --profile-eager) and prints where a step's device time goes, per
kernel (on the CPU: per operator), also written to the JSON line as "profile".
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import statistics
import time

import torch

from sglang.benchmark import memory_floor
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.distributed.parallel_state import destroy_tensor_parallel, init_tensor_parallel
from sglang.srt.managers.scheduler_process import select_gpu
from sglang.srt.managers.tp_follower_process import start_tp_followers
from sglang.srt.model_executor import tp_mirror
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils import free_port

FOLLOWER_EXIT_S = 10  # how long the other tensor-parallel ranks get to exit after the benchmark
PROFILE_TOP = 25  # kernels (operators) listed per batch size with --profile-steps


@dataclasses.dataclass
class BenchArgs:
    batch_size: list[int]
    input_len: int
    output_len: int
    result_filename: str | None
    seed: int
    profile_steps: int = 0
    profile_eager: bool = False


def make_runner(server_args: ServerArgs) -> ModelRunner:
    config = ModelConfig.from_path(
        server_args.model_path,
        server_args.dtype,
        server_args.device,
        server_args.context_length,
        server_args.trust_remote_code,
        server_args.quantization,
    )
    return ModelRunner(config, server_args)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


class StaticBatch:
    """bs requests of input_len random tokens with room for output_len more."""

    def __init__(self, runner: ModelRunner, bs: int, input_len: int, output_len: int, seed: int):
        self.runner, self.bs, self.input_len = runner, bs, input_len
        self.device = runner.device
        gen = torch.Generator().manual_seed(seed)
        self.prompts = torch.randint(0, runner.model_config.vocab_size, (bs, input_len), generator=gen)
        self.rows = [runner.req_to_token_pool.alloc() for _ in range(bs)]
        if None in self.rows:
            raise RuntimeError(f"batch {bs} needs {bs} request rows; raise --max-running-requests")
        total = input_len + output_len
        self.slots = runner.token_to_kv_pool_allocator.alloc(bs * total)
        if self.slots is None:
            raise RuntimeError(f"batch {bs} x {total} tokens does not fit the KV pool; lower the batch")
        for i, row in enumerate(self.rows):
            runner.req_to_token_pool.write(row, 0, self.slots[i * total : (i + 1) * total])
        self.slot_table = self.slots.view(bs, total)
        self.rows_t = torch.tensor(self.rows, dtype=torch.int64, device=self.device)
        self.seq_len = 0
        self.sampling = SamplingBatchInfo.greedy(bs, runner.model_config.vocab_size, self.device)
        self.offsets = torch.zeros(bs, dtype=torch.int64, device=self.device)

    def prefill(self) -> torch.Tensor:
        n = self.input_len
        fb = ForwardBatch(
            forward_mode=ForwardMode.EXTEND,
            batch_size=self.bs,
            input_ids=self.prompts.reshape(-1).to(self.device),
            positions=torch.arange(n, device=self.device).repeat(self.bs),
            req_pool_indices=self.rows_t,
            seq_lens=torch.full((self.bs,), n, device=self.device),
            out_cache_loc=self.slot_table[:, :n].reshape(-1),
            seq_lens_cpu=[n] * self.bs,
            extend_seq_lens_cpu=[n] * self.bs,
            extend_prefix_lens_cpu=[0] * self.bs,
        )
        self.seq_len = n
        return self._sample(self.runner.forward(fb))

    def decode(self, tokens: torch.Tensor, eager: bool = False) -> torch.Tensor:
        pos = self.seq_len
        self.seq_len += 1
        fb = ForwardBatch(
            forward_mode=ForwardMode.DECODE,
            batch_size=self.bs,
            input_ids=tokens,
            positions=torch.full((self.bs,), pos, device=self.device),
            req_pool_indices=self.rows_t,
            seq_lens=torch.full((self.bs,), pos + 1, device=self.device),
            out_cache_loc=self.slot_table[:, pos],
            seq_lens_cpu=[pos + 1] * self.bs,
            extend_seq_lens_cpu=[1] * self.bs,
            extend_prefix_lens_cpu=[pos] * self.bs,
        )
        return self._sample(self.runner.forward(fb, eager=eager))

    def _sample(self, out) -> torch.Tensor:
        return self.runner.sample(out.next_token_logits, self.sampling, self.offsets)

    def release(self) -> None:
        self.runner.token_to_kv_pool_allocator.free(self.slots)
        for row in self.rows:
            self.runner.req_to_token_pool.free(row)


def run_one(runner: ModelRunner, bs: int, args: BenchArgs) -> dict:
    batch = StaticBatch(runner, bs, args.input_len, args.output_len + args.profile_steps, args.seed)
    try:
        _sync(runner.device)
        start = time.perf_counter()
        try:
            tokens = batch.prefill()
            _sync(runner.device)
        except torch.OutOfMemoryError as e:
            raise RuntimeError(
                f"the prefill of batch {bs} x {args.input_len} tokens (one pass of {bs * args.input_len}) ran out "
                "of device memory beside the KV pool; lower --mem-fraction-static (the pool's share), the batch "
                "or --input-len"
            ) from e
        prefill_s = time.perf_counter() - start
        step_s = []
        for _ in range(args.output_len - 1):
            start = time.perf_counter()
            tokens = batch.decode(tokens)
            _sync(runner.device)
            step_s.append(time.perf_counter() - start)
        routed = _routed_experts(runner, batch, tokens)
        profile = profile_decode(batch, tokens, args.profile_steps, args.profile_eager) if args.profile_steps else None
    finally:
        batch.release()
    median = statistics.median(step_s) if step_s else float("nan")
    return {
        "batch_size": bs,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "prefill_latency_s": prefill_s,
        "prefill_throughput_tok_s": bs * args.input_len / prefill_s,
        "decode_median_step_s": median,
        "decode_p90_step_s": _quantile(step_s, 0.9),
        "decode_throughput_tok_s": bs / median if step_s else float("nan"),
        "decode_step_s": step_s,
        **({"routed_experts_per_layer": routed} if routed is not None else {}),
        **({"profile": profile} if profile is not None else {}),
    }


def profile_decode(batch: StaticBatch, tokens: torch.Tensor, steps: int, eager: bool) -> list[dict]:
    """The PROFILE_TOP kernels (on the CPU: operators) with the most self time over `steps` more
    decode steps: [{"name", "calls_per_step", "us_per_step"}], the most first."""
    from torch.profiler import ProfilerActivity, profile

    on_cuda = batch.device == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            tokens = batch.decode(tokens, eager=eager)
        _sync(batch.device)
    rows = []
    for event in prof.key_averages():
        if on_cuda and event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        us = event.self_device_time_total if on_cuda else event.self_cpu_time_total
        if us > 0:
            rows.append({"name": event.key, "calls_per_step": event.count / steps, "us_per_step": us / steps})
    return sorted(rows, key=lambda r: -r["us_per_step"])[:PROFILE_TOP]


def profile_table(rows: list[dict], step_s: float) -> str:
    lines = [f"{'us/step':>9} {'share':>6} {'calls':>6}  kernel"]
    for r in rows:
        share = r["us_per_step"] / (step_s * 1e6)
        lines.append(f"{r['us_per_step']:9.1f} {share:6.1%} {r['calls_per_step']:6.1f}  {r['name'][:90]}")
    return "\n".join(lines)


def _routed_experts(runner: ModelRunner, batch: StaticBatch, tokens: torch.Tensor) -> list[int] | None:
    """For a MoE model, the experts each MoE layer routes the batch to in one more decode step,
    run eagerly (graph replays run no hooks); None for a dense model."""
    if not memory_floor.expert_layers(runner.model):
        return None
    with memory_floor.recording_routed_experts(runner.model) as routed:
        batch.decode(tokens, eager=True)
    return routed


def add_memory_floor(result: dict, runner: ModelRunner, bandwidth: float) -> None:
    mean_context = result["input_len"] + result["output_len"] / 2
    routed = result.get("routed_experts_per_layer")
    floor = memory_floor.decode_floor_s(runner, result["batch_size"], mean_context, bandwidth, routed)
    result.update(
        copy_bandwidth_bytes_per_s=bandwidth,
        memory_floor_step_s=floor,
        ratio_to_floor=result["decode_median_step_s"] / floor,
    )


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ServerArgs.add_cli_args(parser)
    parser.add_argument("--batch-size", type=int, nargs="+", default=[1])
    parser.add_argument("--input-len", type=int, default=1024)
    parser.add_argument("--output-len", type=int, default=16)
    parser.add_argument("--result-filename", type=str, default=None)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--warmup-steps", type=int, default=4, help="decode steps of a throw-away run first")
    parser.add_argument(
        "--profile-steps",
        type=int,
        default=0,
        help="after each batch size's timed steps, profile this many more and print the kernels (on the CPU: "
        f"operators) with the most time per step, the top {PROFILE_TOP}",
    )
    parser.add_argument(
        "--profile-eager",
        action="store_true",
        help="profile eager launches instead of the CUDA graph replays a server runs",
    )
    parser.add_argument(
        "--memory-floor",
        action="store_true",
        help="also each decode step against its memory floor: (weight bytes as held, FP8 weights at one byte "
        "plus their scales, of a MoE layer only the experts the step routes to, + the batch's KV bytes at the "
        "mean context in the KV cache's dtype) / the device's measured copy bandwidth",
    )
    args = parser.parse_args(argv)
    if args.profile_steps < 0:
        parser.error(f"--profile-steps must be 0 or more, got {args.profile_steps}")
    bench = BenchArgs(
        args.batch_size,
        args.input_len,
        args.output_len,
        args.result_filename,
        args.seed,
        args.profile_steps,
        args.profile_eager,
    )
    if args.max_running_requests is None:
        args.max_running_requests = max(args.batch_size)
    server_args = ServerArgs.from_cli_args(args)
    with tensor_parallel_ranks(server_args):
        return _run(make_runner(server_args), bench, args)


@contextlib.contextmanager
def tensor_parallel_ranks(server_args: ServerArgs):
    """With --tp-size N > 1: this process is rank 0 and ranks 1 .. N-1 run in processes of their
    own (as in a server), mirroring every forward; they stop when the benchmark ends."""
    if server_args.tp_size == 1:
        yield
        return
    address = f"127.0.0.1:{free_port()}"
    followers = start_tp_followers(server_args, address)
    try:
        select_gpu(server_args)
        init_tensor_parallel(0, server_args.tp_size, address, server_args.device)
        yield
        tp_mirror.stop()
    finally:
        for proc in followers:
            proc.join(FOLLOWER_EXIT_S)
            if proc.is_alive():
                proc.kill()
        destroy_tensor_parallel()


def _run(runner: ModelRunner, bench: BenchArgs, args) -> list[dict]:
    warmup = dataclasses.replace(
        bench, input_len=min(32, bench.input_len), output_len=args.warmup_steps, profile_steps=0
    )
    run_one(runner, 1, warmup)
    bandwidth = memory_floor.copy_bandwidth(runner.device) if args.memory_floor else None
    results = []
    for bs in bench.batch_size:
        result = run_one(runner, bs, bench)
        result["tp_size"] = runner.tp_size
        if bandwidth:
            add_memory_floor(result, runner, bandwidth)
        results.append(result)
        print(
            f"batch {bs:4d} | prefill {result['prefill_latency_s'] * 1e3:8.2f} ms "
            f"({result['prefill_throughput_tok_s']:9.0f} tok/s) | decode step median "
            f"{result['decode_median_step_s'] * 1e3:7.3f} ms, p90 {result['decode_p90_step_s'] * 1e3:7.3f} ms "
            f"({result['decode_throughput_tok_s']:8.0f} tok/s)"
            + (f" = {result['ratio_to_floor']:.2f}x its memory floor" if bandwidth else ""),
            flush=True,
        )
        if "profile" in result:
            print(profile_table(result["profile"], result["decode_median_step_s"]), flush=True)
        if bench.result_filename:
            with open(bench.result_filename, "a") as f:
                f.write(json.dumps(result) + "\n")
    return results


if __name__ == "__main__":
    main()
