"""Issue 4: the decode step of Llama-3.1-8B shapes with the linear layers on cuBLAS only and with
sgl_kernel.skinny_gemm where it is faster (layers/linear.py), two runners in one process, runs
interleaved (off, on, off, on, ...) so both see the same GPU state; each against the memory floor.

    python benchmark/skinny_ab.py --workdir /tmp/spec_envelope --out OUT.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys

import torch

sys.path.insert(0, "benchmark")
from gpu_check import copy_bandwidth, floors  # noqa: E402

from sglang import bench_one_batch  # noqa: E402
from sglang.srt.layers import linear  # noqa: E402
from sglang.srt.server_args import ServerArgs  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workdir", default="/tmp/spec_envelope")
    parser.add_argument("--out", required=True)
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from spec_speed import make_pair

    path = make_pair("8b", args.workdir)[0]
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    runners = {}
    for on in (False, True):  # the routing is read when the decode graphs are captured
        linear.skinny_gemm_enabled = on
        runners[on] = bench_one_batch.make_runner(ServerArgs(
            model_path=path, cuda_graph_max_bs=max(sizes), max_running_requests=max(sizes),
            max_total_tokens=max(sizes) * 1280 + 4096))
    bench = bench_one_batch.BenchArgs(sizes, 1024, 128, None, 1)
    steps: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for bs in sizes:
            for on in (False, True):
                linear.skinny_gemm_enabled = on
                result = bench_one_batch.run_one(runners[on], bs, dataclasses.replace(bench))
                steps.setdefault(f"bs{bs}_{'skinny' if on else 'cublas'}", []).append(result["decode_median_step_s"])
    floor = floors(path, copy_bandwidth())
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "input_len": 1024,
              "output_len": 128, "rounds": args.rounds, "floor_step_s": floor, "results": {}}
    for bs in sizes:
        row = {}
        for mode in ("cublas", "skinny"):
            runs = steps[f"bs{bs}_{mode}"]
            row[mode] = {"median_step_s_per_round": runs, "median_step_s": statistics.median(runs),
                         "ratio_to_floor": statistics.median(runs) / floor[bs]}
        row["skinny_vs_cublas"] = row["skinny"]["median_step_s"] / row["cublas"]["median_step_s"]
        report["results"][f"bs{bs}"] = row
        print(f"bs {bs}: cuBLAS {row['cublas']['median_step_s'] * 1e3:.3f} ms ({row['cublas']['ratio_to_floor']:.3f}x "
              f"floor), skinny {row['skinny']['median_step_s'] * 1e3:.3f} ms ({row['skinny']['ratio_to_floor']:.3f}x "
              f"floor); rounds cuBLAS {[round(t * 1e3, 3) for t in row['cublas']['median_step_s_per_round']]}, "
              f"skinny {[round(t * 1e3, 3) for t in row['skinny']['median_step_s_per_round']]}", flush=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
