"""Sweep sgl_kernel.skinny_gemm's launch shapes against torch's F.linear (cuBLAS) on the linear
layers of Llama-3.1-8B at decode batch sizes 1..16, on the GPU.

Each timing replays a CUDA graph of many products over enough weight copies (> 4x the L2 cache)
that every product streams its weight from HBM, as the layers of a decode step do; launch cost is
out of it, as in the engine's decode graphs. Reports GB/s of weight read and writes JSON.

    python benchmark/skinny_gemm_bench.py --out OUT.json
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import time

import torch

from sgl_kernel.skinny_gemm import Config, skinny_gemm

SHAPES = {  # name: (N, K) of Llama-3.1-8B's weights
    "qkv_proj": (6144, 4096),
    "o_proj": (4096, 4096),
    "gate_up_proj": (28672, 4096),
    "down_proj": (4096, 14336),
    "lm_head": (128256, 4096),
}
STREAM_BYTES = 1 << 30  # weight copies per graph: at least this much, > 4x the H200's 50 MB L2


def time_graph(fn, x, weights, replays: int = 5) -> float:
    """Seconds per product: one graph runs fn over every weight copy; median of replays."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for w in weights[:2]:
            fn(x, w)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for w in weights:
            fn(x, w)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / len(weights))
    return sorted(times)[len(times) // 2]


def configs(rows: int):
    if rows == 1:
        for bn, bk, warps, stages in itertools.product((4, 8, 16, 32), (256, 512, 1024), (4, 8), (2, 3, 4)):
            if bn * bk <= 16384:
                yield Config(bn, bk, warps, stages)
    else:
        for bn, bk, warps, stages in itertools.product((16, 32, 64), (128, 256, 512), (4, 8), (3, 4)):
            if bn * bk <= 16384:
                yield Config(bn, bk, warps, stages)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--rows", default="1,8,2,4,16", help="8 before 2, 4, 16: they reuse its ranking")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    args = parser.parse_args()
    torch.manual_seed(0)
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "results": []}
    started = time.perf_counter()
    for name in args.shapes.split(","):
        n, k = SHAPES[name]
        nbytes = n * k * 2
        copies = max(2, -(-STREAM_BYTES // nbytes))
        weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        ranked_dot: list = []  # rows 8's configs, fastest first
        for rows in map(int, args.rows.split(",")):
            x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
            ref = torch.nn.functional.linear(x.float(), weights[0].float())
            t_cublas = time_graph(lambda a, w: torch.nn.functional.linear(a, w), x, weights)
            # The full sweep runs at rows 1 and 8; other row counts time rows 8's best three (the
            # padded tl.dot costs about the same for any rows <= 16).
            candidates = list(configs(rows)) if rows in (1, 8) or not ranked_dot else ranked_dot[:3]
            timed = []
            for cfg in candidates:
                try:
                    y = skinny_gemm(x, weights[0], config=cfg)
                    err = ((y.float() - ref).abs().max() / ref.abs().max()).item()
                    if err > 1e-2:
                        print(f"  {name} rows {rows} {cfg}: error {err:.3g}", flush=True)
                        continue
                    t = time_graph(lambda a, w, c=cfg: skinny_gemm(a, w, config=c), x, weights)
                except Exception as e:  # a shape the compiler refuses (shared memory, registers)
                    print(f"  {name} rows {rows} {cfg}: {type(e).__name__}", flush=True)
                    continue
                timed.append((t, cfg))
            timed.sort(key=lambda tc: tc[0])
            if rows == 8:
                ranked_dot = [cfg for _, cfg in timed]
            default = time_graph(lambda a, w: skinny_gemm(a, w), x, weights)
            row = {"shape": name, "n": n, "k": k, "rows": rows, "cublas_us": t_cublas * 1e6,
                   "cublas_gb_s": nbytes / t_cublas / 1e9, "default_us": default * 1e6,
                   "default_gb_s": nbytes / default / 1e9, "configs_swept": len(timed)}
            if timed:
                best_t, best_cfg = timed[0]
                row.update(best_config=dataclasses.asdict(best_cfg), best_us=best_t * 1e6,
                           best_gb_s=nbytes / best_t / 1e9,
                           top5=[[t * 1e6, dataclasses.asdict(c)] for t, c in timed[:5]])
            report["results"].append(row)
            print(f"{name:13s} rows {rows:2d}: cuBLAS {row['cublas_us']:7.1f} us ({row['cublas_gb_s']:5.0f} GB/s) | "
                  f"default {row['default_us']:7.1f} us ({row['default_gb_s']:5.0f}) | best "
                  f"{row.get('best_us', 0):7.1f} us ({row.get('best_gb_s', 0):5.0f}) {row.get('best_config')}",
                  flush=True)
            with open(args.out, "w") as f:
                json.dump(report, f, indent=1)
        del weights
        torch.cuda.empty_cache()
    report["seconds"] = time.perf_counter() - started
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
