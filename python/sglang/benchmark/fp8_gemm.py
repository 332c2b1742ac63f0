"""bf16 matmul against each FP8 GEMM path at Llama-3.1-8B's linear shapes (qkv, o, gate_up, down)
and 1, 8, 64, 256 rows, each call timed inside a CUDA graph (with its activation quantization), the
weights rotated through copies that overflow L2 so every call streams its weight from memory as a
model's layers do. Prints a table (microseconds per call, and bf16 / path) and writes JSON.

    python -m sglang.benchmark.fp8_gemm --out fp8_gemm.json            # one H100: about a minute
    python -m sglang.benchmark.fp8_gemm --out dry.json --dry-run       # CPU: tiny shapes, interpreter
    python -m sglang.benchmark.fp8_gemm --out sweep.json --sweep-skinny --rows 1   # the skinny kernel's launch
        configs at each shape (block and per-token paths): the default's time, the fastest three

Paths: bf16 (torch.nn.functional.linear); block (block_fp8_gemm), block_skinny; token_scaled_mm,
token_triton, token_skinny (per-row weight scales, per-token activations); static_scaled_mm,
static_triton, static_skinny. The FP8 layers use the skinny kernel up to its MAX_ROWS rows, else
block, or scaled_mm where it serves (bf16 on sm90), else triton.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

LLAMA_8B = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
DRY_RUN_SHAPES = {"down": (72, 200)}  # N and K not multiples of 128
ROWS = (1, 8, 64, 256)
DRY_RUN_ROWS = (1, 17)
# --sweep-skinny's grid for one row: (block_n, block_k, num_warps, num_stages); several rows step K by
# one 128-feature group (block-scaled weights require it).
SWEEP_ONE_ROW = [(n, k, w, s) for n in (4, 8, 16) for k in (512, 1024, 2048) for w in (4, 8) for s in (3, 4)]
SWEEP_ROWS = [(n, 128, w, s) for n in (16, 32, 64) for w in (4, 8) for s in (3, 4)]
DRY_RUN_SWEEP = [(8, 128, 4, 3), (4, 256, 4, 3)]
L2_OVERFLOW_BYTES = 128 << 20  # H100's L2 is 50 MB


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--rows", type=int, nargs="+", help=f"activation rows (default {ROWS})")
    parser.add_argument("--shapes", nargs="+", choices=sorted(LLAMA_8B), help="default: all")
    parser.add_argument("--calls-per-graph", type=int, default=20)
    parser.add_argument("--replays", type=int, default=10)
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU under the Triton interpreter")
    parser.add_argument(
        "--sweep-skinny",
        action="store_true",
        help="instead of the paths, time the skinny kernel's launch configs (block_skinny, token_skinny) at "
        f"each shape and each --rows up to its MAX_ROWS; one row: {len(SWEEP_ONE_ROW)} configs",
    )
    return parser.parse_args(argv)


def path_calls(x, weights: dict, rows: int, on_cuda: bool):
    """name -> a function of the copy index that runs that path once on `rows` rows."""
    from sgl_kernel.fp8_gemm import block_fp8_gemm, scaled_fp8_gemm
    from sgl_kernel.fp8_skinny_gemm import MAX_ROWS, block_fp8_skinny_gemm, scaled_fp8_skinny_gemm
    import torch

    a, static = x[:rows], weights["input_scale"]
    calls = {
        "bf16": lambda i: torch.nn.functional.linear(a, weights["bf16"][i]),
        "block": lambda i: block_fp8_gemm(a, *weights["block"][i]),
        "token_triton": lambda i: scaled_fp8_gemm(a, *weights["row"][i], "token", backend="triton"),
        "static_triton": lambda i: scaled_fp8_gemm(a, *weights["row"][i], "static", static, backend="triton"),
    }
    if on_cuda:
        calls["token_scaled_mm"] = lambda i: scaled_fp8_gemm(a, *weights["row"][i], "token", backend="scaled_mm")
        calls["static_scaled_mm"] = lambda i: scaled_fp8_gemm(
            a, *weights["row"][i], "static", static, backend="scaled_mm"
        )
    if rows <= MAX_ROWS:
        calls["block_skinny"] = lambda i: block_fp8_skinny_gemm(a, *weights["block"][i])
        calls["token_skinny"] = lambda i: scaled_fp8_skinny_gemm(a, *weights["row"][i], "token")
        calls["static_skinny"] = lambda i: scaled_fp8_skinny_gemm(a, *weights["row"][i], "static", static)
    return calls


def reference(path: str, x, weights: dict, rows: int):
    """What `path` computes on the first weight copy, by the dequantizing torch reference."""
    from sgl_kernel.fp8_reference import block_fp8_gemm_ref, scaled_fp8_gemm_ref

    a = x[:rows]
    if path.startswith("block"):
        return block_fp8_gemm_ref(a, *weights["block"][0])
    activations = path.split("_")[0]
    return scaled_fp8_gemm_ref(a, *weights["row"][0], activations, weights["input_scale"])


def make_weights(n: int, k: int, device: str, copies: dict) -> dict:
    """Random weights of one shape: `copies[kind]` copies of each kind."""
    import torch

    from sgl_kernel.fp8_reference import GROUP, quantize

    def fp8_pair(block: bool):
        w = torch.randn(n, k, device=device) * k**-0.5
        shape = (-(-n // GROUP), -(-k // GROUP)) if block else (n, 1)
        scale = torch.full(shape, float(w.abs().max()) / 448, device=device)
        return quantize(w, scale.max()), scale

    return {
        "bf16": [torch.randn(n, k, device=device).mul_(k**-0.5).bfloat16() for _ in range(copies["bf16"])],
        "block": [fp8_pair(True) for _ in range(copies["fp8"])],
        "row": [fp8_pair(False) for _ in range(copies["fp8"])],
        "input_scale": torch.tensor([4.0 / 448], device=device),
    }


def time_cuda_graph(call, copies: int, calls_per_graph: int, replays: int) -> float:
    """Microseconds per call: `calls_per_graph` calls (cycling through the weight copies) captured
    in one graph, replayed `replays` times."""
    import torch

    for i in range(copies):  # compile, and warm the allocator outside the graph
        call(i)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls_per_graph):
            call(i % copies)
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / (replays * calls_per_graph)


def time_cpu(call, copies: int) -> float:
    call(0)
    start = time.perf_counter()
    call(0)
    return (time.perf_counter() - start) * 1e6


def shapes_of(args) -> dict[str, tuple[int, int]]:
    """The shapes to time: --shapes of Llama-3.1-8B's, or the dry run's."""
    return DRY_RUN_SHAPES if args.dry_run else {name: LLAMA_8B[name] for name in (args.shapes or LLAMA_8B)}


def weight_copies(n: int, k: int, args) -> dict[str, int]:
    """Copies of each weight kind (bf16, fp8) that together overflow L2 (one in a dry run)."""
    if args.dry_run:
        return {"bf16": 1, "fp8": 1}
    return {kind: max(1, min(8, -(-L2_OVERFLOW_BYTES // (n * k * size)))) for kind, size in (("bf16", 2), ("fp8", 1))}


def time_call(call, copies: int, args) -> float:
    """Microseconds per call: in CUDA graphs on a GPU, one call on the CPU in a dry run."""
    return time_cpu(call, copies) if args.dry_run else time_cuda_graph(call, copies, args.calls_per_graph, args.replays)


def measure(args) -> list[dict]:
    import torch

    from sgl_kernel.testing import FP8_MMA_TOLERANCE, relative_error

    on_cuda = not args.dry_run
    device = "cuda" if on_cuda else "cpu"
    results = []
    for shape, (n, k) in shapes_of(args).items():
        copies = weight_copies(n, k, args)
        weights = make_weights(n, k, device, copies)
        x = torch.randn(max(args.rows), k, device=device).bfloat16()
        for rows in args.rows:
            for path, call in path_calls(x, weights, rows, on_cuda).items():
                count = copies["bf16" if path == "bf16" else "fp8"]
                if path != "bf16":  # a path that computes something else is not timed
                    error = relative_error(call(0), reference(path, x, weights, rows))
                    if error > FP8_MMA_TOLERANCE:
                        raise AssertionError(f"{path} at {shape} x {rows} rows differs from its reference by {error}")
                us = time_call(call, count, args)
                results.append({"shape": shape, "n": n, "k": k, "rows": rows, "path": path, "us": round(us, 2)})
        del weights
    return results


def sweep_skinny(args) -> list[dict]:
    """Each shape, each rows <= MAX_ROWS, block_skinny and token_skinny: us per call of every config
    in the grid that computes the reference's product (a config a path refuses is left out)."""
    import torch
    from sgl_kernel.fp8_skinny_gemm import (
        MAX_ROWS,
        Config,
        block_fp8_skinny_gemm,
        default_config,
        scaled_fp8_skinny_gemm,
    )
    from sgl_kernel.testing import FP8_MMA_TOLERANCE, relative_error

    device = "cpu" if args.dry_run else "cuda"
    results = []
    for shape, (n, k) in shapes_of(args).items():
        copies = weight_copies(n, k, args)["fp8"]
        weights = make_weights(n, k, device, {"bf16": 1, "fp8": copies})
        x = torch.randn(max(args.rows), k, device=device).bfloat16()
        for rows in (r for r in args.rows if r <= MAX_ROWS):
            a = x[:rows]
            paths = {
                "block_skinny": lambda i, c: block_fp8_skinny_gemm(a, *weights["block"][i], config=c),
                "token_skinny": lambda i, c: scaled_fp8_skinny_gemm(a, *weights["row"][i], "token", config=c),
            }
            grid = DRY_RUN_SWEEP if args.dry_run else SWEEP_ONE_ROW if rows == 1 else SWEEP_ROWS
            for path, run in paths.items():
                default = default_config(rows, n, k, "group" if path == "block_skinny" else "token")
                expected = reference(path, x, weights, rows)
                for cfg in dict.fromkeys([default] + [Config(*c) for c in grid]):
                    try:
                        error = relative_error(run(0, cfg), expected)
                    except ValueError:  # a launch shape the path refuses
                        continue
                    if error > FP8_MMA_TOLERANCE:
                        raise AssertionError(f"{path} {cfg} at {shape} x {rows} rows: error {error}")
                    call = lambda i, cfg=cfg: run(i, cfg)  # noqa: E731
                    us = time_call(call, copies, args)
                    results.append(
                        {
                            "shape": shape,
                            "rows": rows,
                            "path": path,
                            "config": list(dataclasses.astuple(cfg)),
                            "default": cfg == default,
                            "us": round(us, 2),
                        }
                    )
    return results


def sweep_table(results: list[dict]) -> str:
    lines = ["us per call: the default config, then the fastest three (block_n, block_k, num_warps, num_stages)"]
    for key in dict.fromkeys((r["shape"], r["rows"], r["path"]) for r in results):
        rows = [r for r in results if (r["shape"], r["rows"], r["path"]) == key]
        default = next(r for r in rows if r["default"])
        best = sorted(rows, key=lambda r: r["us"])[:3]
        cells = "  ".join(f"{tuple(r['config'])} {r['us']:.1f}" for r in best)
        lines.append(
            f"{key[0]:>8} {key[1]:>2} {key[2]:<13} default {tuple(default['config'])} {default['us']:.1f}  best {cells}"
        )
    return "\n".join(lines)


def table(results: list[dict]) -> str:
    paths = list(dict.fromkeys(r["path"] for r in results))
    cells = {(r["shape"], r["rows"], r["path"]): r["us"] for r in results}
    keys = list(dict.fromkeys((r["shape"], r["rows"]) for r in results))
    lines = ["us per call (bf16 / path); - where the path takes no such rows"]
    lines.append(f"{'shape':>8} {'rows':>5} " + " ".join(f"{p:>18}" for p in paths))
    for shape, rows in keys:
        base = cells[(shape, rows, "bf16")]
        row = []
        for p in paths:
            us = cells.get((shape, rows, p))
            row.append(f"{'-':>18}" if us is None else f"{us:>9.1f} ({base / us:4.2f}x)")
        lines.append(f"{shape:>8} {rows:>5} " + " ".join(row))
    return "\n".join(lines)


def main(argv=None) -> None:
    args = parse_args(argv)
    args.rows = args.rows or (DRY_RUN_ROWS if args.dry_run else ROWS)
    if args.dry_run:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels' modules are imported
    import torch
    import triton

    if not args.dry_run and not torch.cuda.is_available():
        sys.exit("no CUDA device; --dry-run runs tiny shapes on the CPU")
    results = sweep_skinny(args) if args.sweep_skinny else measure(args)
    print(sweep_table(results) if args.sweep_skinny else table(results))
    device = torch.cuda.get_device_name() if not args.dry_run else "cpu (interpreter)"
    report = {
        "device": device,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "dry_run": args.dry_run,
        "sweep_skinny": args.sweep_skinny,
        "calls_per_graph": args.calls_per_graph,
        "replays": args.replays,
        "results": results,
    }
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
