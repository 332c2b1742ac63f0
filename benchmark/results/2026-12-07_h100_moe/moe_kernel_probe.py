"""Probe: fused MoE kernel tile sweep at Qwen3-30B-A3B expert shapes, and a profile of a MoE decode step.

python benchmark/moe_kernel_probe.py OUT_JSON MODEL_DIR_4_LAYERS
"""

import itertools
import json
import sys
import time

import torch
from sgl_kernel.fused_moe import TileConfig, fused_experts, fused_experts_ref
from sglang.srt.layers.moe.router import select_experts

E, TOPK, H, INTER = 128, 8, 2048, 768
dev = "cuda"


def graph_time(fn, reps=50):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(10):
            fn()
    g.replay()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        g.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / reps / 10


def main():
    out = {"profile": profile_step(sys.argv[2])}
    json.dump(out, open(sys.argv[1], "w"), indent=1)
    torch.manual_seed(0)
    w13 = torch.randn(E, 2 * INTER, H, device=dev, dtype=torch.bfloat16) * 0.02
    w2 = torch.randn(E, H, INTER, device=dev, dtype=torch.bfloat16) * 0.02
    # copy bandwidth
    a = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    b = torch.empty_like(a)
    bw = 2 * a.numel() / graph_time(lambda: b.copy_(a), reps=5)

    out["copy_bw"] = bw
    rows = []
    for T in [1, 8, 32, 64, 256]:
        x = torch.randn(T, H, device=dev, dtype=torch.bfloat16)
        logits = torch.randn(T, E, device=dev)
        wts, ids = select_experts(logits, TOPK, renormalize=True)
        routed = ids.unique().numel()
        floor = routed * (3 * INTER * H * 2) / bw
        ref = fused_experts_ref(x, w13, w2, wts, ids).float()
        best = None
        for bm, bn, bk, nw, ns in itertools.product([16, 32, 64], [32, 64, 128], [64, 128], [4], [3, 4]):
            tiles = TileConfig(bm, bn, bk, nw, ns)
            try:
                got = fused_experts(x, w13, w2, wts, ids, tiles).float()
                err = (got - ref).abs().max().item()
                if err > 2e-2 * ref.abs().max().item() + 1e-3:
                    rows.append(dict(T=T, tiles=list(tiles.__dict__.values()), error=err))
                    continue
                t = graph_time(lambda: fused_experts(x, w13, w2, wts, ids, tiles))
            except Exception as e:  # noqa: BLE001 - out of shared memory etc.
                rows.append(dict(T=T, tiles=[bm, bn, bk, nw, ns], fail=str(e)[:80]))
                continue
            r = dict(T=T, tiles=[bm, bn, bk, nw, ns], us=t * 1e6, floor_us=floor * 1e6, ratio=t / floor)
            rows.append(r)
            if best is None or t < best["us"] / 1e6:
                best = r
        default = graph_time(lambda: fused_experts(x, w13, w2, wts, ids))
        print(f"T={T} routed={routed} floor {floor * 1e6:.1f}us default {default * 1e6:.1f}us best {best}", flush=True)
        out[f"T{T}"] = dict(routed=routed, floor_us=floor * 1e6, default_us=default * 1e6, best=best)
    out["rows"] = rows
    json.dump(out, open(sys.argv[1], "w"), indent=1)


def profile_step(model_dir):
    """A 4-layer Qwen3-30B-A3B decode step at batch 1 and 8: graph replay time and eager kernels."""
    from sglang.bench_one_batch import StaticBatch, make_runner
    from sglang.srt.server_args import ServerArgs

    runner = make_runner(
        ServerArgs(
            model_path=model_dir,
            load_format="dummy",
            device="cuda",
            max_running_requests=64,
            max_total_tokens=1 << 16,
            cuda_graph_max_bs=64,
        )
    )
    res = {}
    for bs in (1, 8, 64):
        batch = StaticBatch(runner, bs, 256, 64, 0)
        tokens = batch.prefill()
        for _ in range(5):
            tokens = batch.decode(tokens)
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(20):
            tokens = batch.decode(tokens)
        torch.cuda.synchronize()
        graph_ms = (time.perf_counter() - t) / 20 * 1e3
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                tokens = batch.decode(tokens, eager=True)
            torch.cuda.synchronize()
        table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=30)
        print(f"bs {bs}: graph step {graph_ms:.3f} ms\n{table}", flush=True)
        res[bs] = dict(graph_ms=graph_ms, table=table)
        batch.release()
    return res


if __name__ == "__main__":
    main()
