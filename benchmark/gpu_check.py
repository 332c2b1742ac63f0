"""The GPU path's check, run on the GPU machine in one device call (or a few, by --parts):

    python benchmark/gpu_check.py --out $OUT [--parts tests,exactness,floor,bench,peer]

- tests:     pytest test/gpu (kernels against their torch references at real shapes, sampling)
- exactness: greedy float32 tokens of the tiny models with triton / torch_native attention,
             CUDA graphs on / off, overlap on / off, must all be identical
- floor:     device-to-device copy bandwidth, and per batch size the memory floor of a decode
             step = (weight bytes + KV bytes read) / bandwidth
- bench:     bench_one_batch on Llama-3.1-8B shapes (random bf16 weights, made here), input 1024,
             output 128, batch sizes 1 / 8 / 64; each step as a ratio to its floor
- peer:      transformers generate() on the same directory (dynamic and static cache)
- profile:   where a decode step's device time goes at batch 1 and 8 (kernels summed by name and
             by kind: GEMM, attention, norm, rotary, KV store, ...), to aim the work on the floor

Writes one JSON per part to --out and prints a summary.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCH_SIZES = (1, 8, 64)
INPUT_LEN, OUTPUT_LEN = 1024, 128


def part_tests(args) -> dict:
    junit = os.path.join(args.out, "gpu_tests.xml")
    proc = subprocess.run([sys.executable, "-m", "pytest", "test/gpu", "-q", "-x", f"--junitxml={junit}"],
                          cwd=ROOT, capture_output=True, text=True)
    tail = (proc.stdout + proc.stderr)[-3000:]
    print(tail, flush=True)
    return {"returncode": proc.returncode, "tail": tail}


def part_exactness(args) -> dict:
    import sglang
    from sglang.test.tiny_models import make_tiny_model

    prompts = ["def add(a, b):", "The quick brown fox jumps over", "Hello", "import torch\nx = torch.zeros(3)"]
    params = {"temperature": 0, "max_new_tokens": 48, "ignore_eos": True}
    configs = {
        "torch_native": dict(attention_backend="torch_native", disable_overlap_schedule=True),
        "torch_native_overlap": dict(attention_backend="torch_native"),
        "triton_eager": dict(attention_backend="triton", disable_cuda_graph=True),
        "triton_graph": dict(attention_backend="triton"),
        "triton_graph_no_overlap": dict(attention_backend="triton", disable_overlap_schedule=True),
    }
    report = {}
    for arch in ("llama", "qwen2", "qwen3"):
        path = make_tiny_model(os.path.join(args.workdir, f"tiny-{arch}"), arch)
        outputs = {}
        for name, extra in configs.items():
            engine = sglang.Engine(model_path=path, device="cuda", dtype="float32", log_level="warning",
                                   cuda_graph_max_bs=8, **extra)
            try:
                outputs[name] = [o["output_ids"] for o in engine.generate(prompts, params)]
            finally:
                engine.shutdown()
        same = all(out == outputs["torch_native"] for out in outputs.values())
        report[arch] = {"identical": same, "outputs": outputs}
        print(f"exactness {arch}: identical={same}", flush=True)
    return report


def copy_bandwidth() -> float:
    """Bytes moved (read + write) per second by a large device-to-device copy."""
    n = 2 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    iters = 20
    start.record()
    for _ in range(iters):
        dst.copy_(src)
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1e3 / iters
    return 2 * n / seconds


def model_bytes(path: str) -> dict:
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(path, "model.safetensors.index.json")) as f:
        weights = json.load(f)["metadata"]["total_size"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    kv_per_token = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * head_dim * 2
    return {"weight_bytes": weights, "kv_bytes_per_token": kv_per_token}


def floors(path: str, bandwidth: float) -> dict:
    sizes = model_bytes(path)
    context = INPUT_LEN + OUTPUT_LEN // 2  # the mean context over the decode steps
    return {bs: (sizes["weight_bytes"] + bs * context * sizes["kv_bytes_per_token"]) / bandwidth
            for bs in BATCH_SIZES}


def ensure_8b(args) -> str:
    path = os.path.join(args.workdir, "llama-3.1-8b")
    if not os.path.exists(os.path.join(path, "model.safetensors.index.json")):
        from sglang.tools.make_random_model import make_random_model

        start = time.perf_counter()
        make_random_model(path, "llama-3.1-8b", device="cuda")
        print(f"made random Llama-3.1-8B in {time.perf_counter() - start:.0f} s", flush=True)
    return path


def part_floor(args) -> dict:
    path = ensure_8b(args)
    bandwidth = copy_bandwidth()
    result = {"copy_bandwidth_bytes_per_s": bandwidth, **model_bytes(path),
              "floor_step_s": floors(path, bandwidth)}
    print(f"copy bandwidth {bandwidth / 1e12:.2f} TB/s; floors (ms): "
          + ", ".join(f"bs{bs} {t * 1e3:.2f}" for bs, t in result["floor_step_s"].items()), flush=True)
    return result


def part_bench(args) -> dict:
    from sglang import bench_one_batch

    path = ensure_8b(args)
    extra = args.bench_args.split() if args.bench_args else []
    results = bench_one_batch.main([
        "--model-path", path, "--batch-size", *map(str, BATCH_SIZES), "--input-len", str(INPUT_LEN),
        "--output-len", str(OUTPUT_LEN), "--cuda-graph-max-bs", "64", *extra,
    ])
    floor = floors(path, copy_bandwidth())
    for r in results:
        r["floor_step_s"] = floor[r["batch_size"]]
        r["ratio_to_floor"] = r["decode_median_step_s"] / r["floor_step_s"]
        print(f"bs {r['batch_size']}: {r['decode_median_step_s'] * 1e3:.2f} ms/step = "
              f"{r['ratio_to_floor']:.2f}x floor", flush=True)
    return {"results": results}


def part_profile(args) -> dict:
    """Where a batch-1 decode step's device time goes: the step's kernels (profiled over graph
    replays, which the CUDA profiler sees kernel by kernel), summed per kernel name and per kind
    (GEMM, attention, norm, rotary, KV store, elementwise, other), against the memory floor."""
    from torch.profiler import ProfilerActivity, profile

    from sglang import bench_one_batch
    from sglang.srt.server_args import ServerArgs

    path = ensure_8b(args)
    runner = bench_one_batch.make_runner(ServerArgs(model_path=path, cuda_graph_max_bs=8, max_running_requests=8))
    report = {}
    for bs in (1, 8):
        batch = bench_one_batch.StaticBatch(runner, bs, INPUT_LEN, 64, 0)
        try:
            tokens = batch.prefill()
            for _ in range(8):  # warm up
                tokens = batch.decode(tokens)
            torch.cuda.synchronize()
            steps = 20
            start = time.perf_counter()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(steps):
                    tokens = batch.decode(tokens)
                torch.cuda.synchronize()
            wall = (time.perf_counter() - start) / steps
        finally:
            batch.release()
        kernels: dict[str, float] = {}
        for event in prof.events():
            if event.device_type == torch.autograd.DeviceType.CUDA:
                kernels[event.name] = kernels.get(event.name, 0.0) + event.device_time_total / 1e3 / steps
        kinds: dict[str, float] = {}
        for name, ms in kernels.items():
            kinds[_kernel_kind(name)] = kinds.get(_kernel_kind(name), 0.0) + ms
        top = sorted(kernels.items(), key=lambda kv: -kv[1])[:25]
        report[f"bs{bs}"] = {"wall_ms_per_step_profiled": wall * 1e3, "device_ms_per_step": sum(kernels.values()),
                             "kernel_launches_per_step": sum(1 for e in prof.events()
                                                             if e.device_type == torch.autograd.DeviceType.CUDA) / steps,
                             "by_kind_ms": dict(sorted(kinds.items(), key=lambda kv: -kv[1])),
                             "top_kernels_ms": dict(top)}
        print(f"profile bs {bs}: device {sum(kernels.values()):.2f} ms/step of {wall * 1e3:.2f} wall; by kind "
              + ", ".join(f"{k} {v:.2f}" for k, v in report[f'bs{bs}']['by_kind_ms'].items()), flush=True)
    return report


def _kernel_kind(name: str) -> str:
    lowered = name.lower()
    for kind, keys in (("gemm", ("gemm", "gemv", "cutlass", "sm90", "xmma", "ampere_", "cublas")),
                       ("attention", ("_decode_split", "_decode_merge", "_extend_kernel", "attention", "attn")),
                       ("norm", ("norm",)), ("rotary", ("rotary", "rope")),
                       ("kv_store", ("index_put", "scatter", "indexing_backward")),
                       ("sampling", ("argmax", "gumbel", "_reduce_chunks")),
                       ("elementwise", ("elementwise", "vectorized", "silu", "act_and_mul", "copy"))):
        if any(key in lowered for key in keys):
            return kind
    return "other"


def part_peer(args) -> dict:
    from transformers import AutoModelForCausalLM

    path = ensure_8b(args)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, device_map="cuda").eval()
    report = {}
    for cache in args.peer_caches.split(","):
        for bs in BATCH_SIZES:
            report[f"{cache}_bs{bs}"] = _hf_step_time(model, bs, cache)
            print(f"transformers {cache} cache bs {bs}: {report[f'{cache}_bs{bs}'] * 1e3:.2f} ms/step", flush=True)
    return report


@torch.inference_mode()
def _hf_step_time(model, bs: int, cache: str) -> float:
    """Per decode step: (time for OUTPUT_LEN tokens - time for 1 token) / (OUTPUT_LEN - 1)."""
    ids = torch.randint(0, model.config.vocab_size, (bs, INPUT_LEN), device="cuda")

    def run(new_tokens: int) -> float:
        torch.cuda.synchronize()
        start = time.perf_counter()
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                       min_new_tokens=new_tokens, do_sample=False, cache_implementation=cache,
                       pad_token_id=0)
        torch.cuda.synchronize()
        return time.perf_counter() - start

    run(2)  # warm-up (and compilation of the static cache path)
    return (run(OUTPUT_LEN) - run(1)) / (OUTPUT_LEN - 1)


PARTS = {"tests": part_tests, "exactness": part_exactness, "floor": part_floor, "bench": part_bench,
         "peer": part_peer, "profile": part_profile}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--parts", default="tests,exactness,floor,bench,peer",
                        help="also: profile (where a decode step's device time goes, by kernel)")
    parser.add_argument("--workdir", default="/tmp/gpu_check")
    parser.add_argument("--bench-args", default="", help="extra flags for bench_one_batch")
    parser.add_argument("--peer-caches", default="dynamic,static", help="transformers cache implementations")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(args.workdir, exist_ok=True)
    summary = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    for name in args.parts.split(","):
        start = time.perf_counter()
        try:
            result = PARTS[name](args)
        except Exception as e:  # one part failing must not lose the others' results
            result = {"error": f"{type(e).__name__}: {e}"}
            print(f"part {name} failed: {result['error']}", flush=True)
        result["seconds"] = time.perf_counter() - start
        gc.collect()  # the part's engine, runner and graphs, before the next part sizes its KV cache
        torch.cuda.empty_cache()
        result["free_gib_after"] = torch.cuda.mem_get_info()[0] / 2**30
        summary[name] = result
        with open(os.path.join(args.out, f"gpu_check_{name}.json"), "w") as f:
            json.dump(result, f, indent=1, default=str)
    print(json.dumps({k: v for k, v in summary.items() if not isinstance(v, dict)}), flush=True)


if __name__ == "__main__":
    main()
