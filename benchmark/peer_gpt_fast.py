"""Decode step time of gpt-fast (pytorch-labs/gpt-fast) on Llama-3.1-8B shapes, random bf16 weights.

    python benchmark/peer_gpt_fast.py --gpt-fast-dir .peers/gpt-fast --batch-sizes 1,8 \
        --input-len 1024 --steps 128 --out result.json

gpt-fast's own `model.py` is imported from --gpt-fast-dir (git-ignored; never copied into this
repository). Its commit is read from COMMIT beside it unless --gpt-fast-commit is given.

Per batch size, on a fresh model and KV cache: prefill `input_len` random tokens per row with an
eager forward (as gpt-fast's generate.py does), then decode one token per step with the forward
and sampling compiled by torch.compile(mode="reduce-overhead", fullgraph=True), with math SDPA so
Inductor generates the attention, under the Inductor settings gpt-fast's generate.py sets.
Warm-up steps compile and record the CUDA graphs (reported as compile_s); then `steps` decode
steps are timed as one loop, positions advancing from input_len to input_len + steps. The step
includes gpt-fast's per-step host work: advancing the position tensor and cloning the token.
Greedy by default, as our bench_one_batch; --sampling topk uses gpt-fast's default
(temperature 0.8, top-k 200). Unlike gpt-fast's decode_n_tokens, the per-step probabilities are
not copied out (that copy only serves its speculative decoding).

CPU smoke test: add --tiny --no-compile --device cpu.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import sys
import time

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

LLAMA_31_8B = {
    "block_size": 131072,
    "n_layer": 32,
    "n_head": 32,
    "n_local_heads": 8,
    "dim": 4096,
    "intermediate_size": 14336,
    "vocab_size": 128256,
    "rope_base": 500000,
}
LLAMA_31_ROPE_SCALING = {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
TINY = {
    "block_size": 2048,
    "n_layer": 2,
    "n_head": 4,
    "n_local_heads": 2,
    "dim": 64,
    "intermediate_size": 128,
    "vocab_size": 512,
    "rope_base": 500000,
}
# What gpt-fast's generate.py sets before compiling: (config module, attribute, value).
COMPILE_SETTINGS = [
    ("inductor", "coordinate_descent_tuning", True),
    ("inductor", "triton.unique_kernel_names", True),
    ("inductor", "fx_graph_cache", True),
    ("functorch", "enable_autograd_cache", True),
]


def load_gpt_fast(path: str):
    if not os.path.isfile(os.path.join(path, "model.py")):
        raise SystemExit(
            f"no gpt-fast checkout at {path!r} (its model.py is missing): clone "
            f"pytorch-labs/gpt-fast there, or pass --gpt-fast-dir"
        )
    sys.path.insert(0, os.path.abspath(path))
    import model as gpt_fast_model

    return gpt_fast_model


def model_args(gpt_fast, tiny: bool):
    """gpt-fast's own llama-3.1-8b entry when it has one; else the same shapes built here."""
    if not tiny and "llama-3.1-8b" in getattr(gpt_fast, "transformer_configs", {}):
        return gpt_fast.ModelArgs.from_name("llama-3.1-8b")
    fields = {f.name for f in dataclasses.fields(gpt_fast.ModelArgs)}
    extra = {"rope_scaling": LLAMA_31_ROPE_SCALING} if "rope_scaling" in fields else {}
    return gpt_fast.ModelArgs(**(TINY if tiny else LLAMA_31_8B), **extra)


def build_model(gpt_fast, args, device: str) -> torch.nn.Module:
    """Random bf16 weights made on the device: built on meta, then allocated and filled."""
    with torch.device("meta"):
        model = gpt_fast.Transformer(args)
    model = model.to(dtype=torch.bfloat16).to_empty(device=device)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 1:  # RMSNorm weights
                param.fill_(1.0)
            else:
                param.normal_(0.0, 0.02)
    return model.eval().requires_grad_(False)


def apply_compile_settings() -> dict:
    modules = {"inductor": torch._inductor.config, "functorch": torch._functorch.config}
    applied = {}
    for module, name, value in COMPILE_SETTINGS:
        owner = modules[module]
        *parents, attr = name.split(".")
        for parent in parents:
            owner = getattr(owner, parent)
        if hasattr(owner, attr):  # a setting a torch version dropped is reported, not fatal
            setattr(owner, attr, value)
            applied[name] = value
    return applied


def greedy(logits: torch.Tensor) -> torch.Tensor:
    return torch.argmax(logits[:, -1], dim=-1, keepdim=True).to(torch.int)


def top_k_sample(logits: torch.Tensor, temperature: float = 0.8, top_k: int = 200) -> torch.Tensor:
    """Top-k sampling without a host sync: argmax of probs / Exp(1) noise draws from probs."""
    logits = logits[:, -1].float() / temperature
    kth_largest = torch.topk(logits, top_k).values[:, -1:]
    probs = torch.softmax(logits.masked_fill(logits < kth_largest, float("-inf")), dim=-1)
    noise = torch.empty_like(probs).exponential_(1)
    return torch.argmax(probs / noise, dim=-1, keepdim=True).to(torch.int)


SAMPLERS = {"greedy": greedy, "topk": top_k_sample}


def make_decode_step(sampler):
    def decode_step(model, token, input_pos):
        return sampler(model(token, input_pos))

    return decode_step


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def decode_loop(decode_step, model, token, input_pos, steps: int) -> torch.Tensor:
    with sdpa_kernel(SDPBackend.MATH):  # as gpt-fast: Inductor codegens the decode attention
        for _ in range(steps):
            # Clone: a CUDA-graph output is overwritten by the next replay.
            token = decode_step(model, token, input_pos).clone()
            input_pos += 1
    return token


@torch.no_grad()
def bench_batch_size(gpt_fast, cli, batch_size: int) -> dict:
    device = cli.device
    args = model_args(gpt_fast, cli.tiny)
    model = build_model(gpt_fast, args, device)
    with torch.device(device):
        model.setup_caches(
            max_batch_size=batch_size, max_seq_length=cli.input_len + max(cli.steps, cli.warmup_steps) + 8
        )
    decode_step = make_decode_step(SAMPLERS[cli.sampling])
    if not cli.no_compile:
        decode_step = torch.compile(decode_step, mode="reduce-overhead", fullgraph=True)

    prompt = torch.randint(0, args.vocab_size, (batch_size, cli.input_len), dtype=torch.int, device=device)
    first = SAMPLERS[cli.sampling](model(prompt, torch.arange(cli.input_len, device=device)))
    input_pos = torch.tensor([cli.input_len], dtype=torch.int, device=device)

    compile_s, warmup_s = warm_up(decode_step, model, first, input_pos, cli.warmup_steps, device)
    input_pos.fill_(cli.input_len)  # the timed steps decode from context input_len again
    seconds, event_seconds = timed_decode(decode_step, model, first, input_pos, cli.steps, device)
    result = {
        "batch_size": batch_size,
        "ms_per_step": seconds * 1e3 / cli.steps,
        "tokens_per_s": batch_size * cli.steps / seconds,
        "compile_s": compile_s,
        "warmup_s": warmup_s,
    }
    if event_seconds is not None:
        result["ms_per_step_cuda_events"] = event_seconds * 1e3 / cli.steps
    del model, decode_step, prompt, first, input_pos
    return result


def warm_up(decode_step, model, token, input_pos, steps: int, device: str) -> tuple[float, float]:
    """Seconds of the first step (the compilation) and of all warm-up steps (+ CUDA-graph record)."""
    sync(device)
    start = time.perf_counter()
    decode_loop(decode_step, model, token, input_pos, 1)
    sync(device)
    compile_s = time.perf_counter() - start
    decode_loop(decode_step, model, token, input_pos, steps - 1)
    sync(device)
    return compile_s, time.perf_counter() - start


def timed_decode(decode_step, model, token, input_pos, steps: int, device: str):
    """Wall seconds (and CUDA-event seconds on a GPU) for the whole loop of `steps` decode steps."""
    events = None
    if device.startswith("cuda"):
        events = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    sync(device)
    start = time.perf_counter()
    if events:
        events[0].record()
    decode_loop(decode_step, model, token, input_pos, steps)
    if events:
        events[1].record()
    sync(device)
    seconds = time.perf_counter() - start
    return seconds, (events[0].elapsed_time(events[1]) / 1e3 if events else None)


def free_between_batch_sizes(device: str) -> None:
    """A new batch size must compile afresh (not as a dynamic-shape graph) and start with free memory."""
    torch._dynamo.reset()  # also drops the CUDA-graph trees and their memory pools
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def read_commit(cli) -> str:
    if cli.gpt_fast_commit:
        return cli.gpt_fast_commit
    path = os.path.join(cli.gpt_fast_dir, "COMMIT")
    return open(path).read().strip() if os.path.exists(path) else "unknown"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpt-fast-dir", default=".peers/gpt-fast", help="folder holding gpt-fast's model.py")
    parser.add_argument("--gpt-fast-commit", default="", help="default: COMMIT beside model.py")
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument("--input-len", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=128, help="timed decode steps")
    parser.add_argument("--warmup-steps", type=int, default=16, help="compile + CUDA-graph record")
    parser.add_argument("--sampling", choices=sorted(SAMPLERS), default="greedy")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--no-compile", action="store_true", help="eager (CPU smoke tests)")
    parser.add_argument("--tiny", action="store_true", help="a tiny config instead of Llama-3.1-8B")
    parser.add_argument("--out", required=True, help="JSON file to write")
    return parser.parse_args(argv)


def main(argv=None) -> dict:
    cli = parse_args(argv)
    gpt_fast = load_gpt_fast(cli.gpt_fast_dir)
    settings = {} if cli.no_compile else apply_compile_settings()
    report = {
        "peer": "gpt-fast",
        "commit": read_commit(cli),
        "device": torch.cuda.get_device_name() if cli.device.startswith("cuda") else cli.device,
        "torch": torch.__version__,
        "model": "tiny" if cli.tiny else "llama-3.1-8b (random bf16)",
        "input_len": cli.input_len,
        "steps": cli.steps,
        "sampling": cli.sampling,
        "compiled": not cli.no_compile,
        "compile_settings": settings,
        "results": [],
    }
    for batch_size in map(int, cli.batch_sizes.split(",")):
        result = bench_batch_size(gpt_fast, cli, batch_size)
        report["results"].append(result)
        print(
            f"gpt-fast bs {batch_size}: {result['ms_per_step']:.2f} ms/step, "
            f"{result['tokens_per_s']:.0f} tok/s, compile {result['compile_s']:.1f} s",
            flush=True,
        )
        free_between_batch_sizes(cli.device)
    with open(cli.out, "w") as f:
        json.dump(report, f, indent=2)
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
