"""--kv-cache-dtype fp8_e4m3 / fp8_e5m2 on CUDA: the triton attention kernels over an FP8 cache at
Llama-3-8B shapes against their float32 references on the dequantized K/V (also inside a CUDA
graph), the fused rotary + KV store writing FP8 as its reference does, and engines (in-process
schedulers, triton backend, CUDA graphs): greedy output with graphs equals eager output, EAGLE-3
over an FP8 target equals its plain decoding, and the pool holds twice the tokens of bf16.
Run on the GPU machine: python -m pytest test/gpu/test_fp8_kv_cuda.py -q
"""

from __future__ import annotations

import gc

import pytest
import torch

from sgl_kernel.decode_attention import decode_attention_fwd, decode_attention_ref, decode_workspace
from sgl_kernel.extend_attention import extend_attention_fwd, extend_attention_ref
from sgl_kernel.rotary import apply_rotary_and_store_kv_, apply_rotary_and_store_kv_ref
from sgl_kernel.testing import TOLERANCE, make_paged_kv, relative_error
from sglang import demo
from sglang.srt.layers.rotary_embedding import RotaryEmbedding
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.server_args import ServerArgs
from sglang.test.runner_utils import OneRank

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128  # Llama-3-8B
FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]
K_SCALE, V_SCALE = 0.037, 0.21
# Widening FP8 is exact and the scales fold into the softmax scale and the output: the error is
# the activations' dtype's alone.
DTYPES = [torch.bfloat16, torch.float32]


def fp8_kv(seq_lens, kv_dtype, seed=0):
    kv = make_paged_kv(seq_lens, KV_HEADS, HEAD_DIM, torch.float32, "cuda", seed=seed)
    kv.k_buffer = (kv.k_buffer * 100).clamp(-448, 448).to(kv_dtype)
    kv.v_buffer = (kv.v_buffer * 100).clamp(-448, 448).to(kv_dtype)
    return kv


def queries(n, dtype, seed=1):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(n, HEADS, HEAD_DIM, generator=gen, device="cuda").to(dtype)


def random_lengths(n, low, high, seed):
    return torch.randint(low, high + 1, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def decode(fn, q, kv, workspace=None, rows=None, lens=None, out=None):
    rows = kv.req_pool_indices if rows is None else rows
    lens = kv.seq_lens if lens is None else lens
    out = torch.empty_like(q) if out is None else out
    extra = {} if workspace is None else {"workspace": workspace}
    index = (kv.req_to_token, rows, lens, HEAD_DIM**-0.5, 16)
    return fn(q, kv.k_buffer, kv.v_buffer, out, *index, k_scale=K_SCALE, v_scale=V_SCALE, **extra)


@pytest.mark.parametrize("kv_dtype", FP8)
@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_over_fp8_kv_batch_64_contexts_up_to_8192(kv_dtype, dtype):
    seq_lens = [1, 8192, 2, 63, 64, 65] + random_lengths(58, 1, 8192, seed=1)
    kv, q = fp8_kv(seq_lens, kv_dtype), queries(len(seq_lens), dtype)
    assert relative_error(decode(decode_attention_fwd, q, kv), decode(decode_attention_ref, q, kv)) < TOLERANCE[dtype]


@pytest.mark.parametrize("kv_dtype", FP8)
@pytest.mark.parametrize("dtype", DTYPES)
def test_extend_prefill_and_verify_over_fp8_prefixes(kv_dtype, dtype):
    prefix_lens = [0, 8000, 4000, 1000] + random_lengths(8, 0, 4000, seed=4)
    extend_lens = [2048, 192, 1, 513] + [4] * 8  # the last eight: TARGET_VERIFY-shaped
    kv = fp8_kv([p + e for p, e in zip(prefix_lens, extend_lens)], kv_dtype)
    q = queries(sum(extend_lens), dtype)
    lens = torch.tensor(extend_lens, device="cuda")
    rest = (
        kv.k_buffer,
        kv.v_buffer,
        kv.req_to_token,
        kv.req_pool_indices,
        kv.seq_lens,
        lens,
        torch.cumsum(lens, 0) - lens,
    )
    layout = (max(extend_lens), HEAD_DIM**-0.5, K_SCALE, V_SCALE)
    out = extend_attention_fwd(q, torch.empty_like(q), *rest, *layout)
    want = extend_attention_ref(q, torch.empty_like(q), *rest, *layout)
    assert relative_error(out, want) < TOLERANCE[dtype]


def test_fp8_decode_replays_in_cuda_graph_with_new_lengths_and_rows():
    bs = 8
    seq_lens = random_lengths(bs, 1, 300, seed=2) + [1, 4000] + random_lengths(bs - 2, 1, 8192, seed=3)
    kv, q_all = fp8_kv(seq_lens, torch.float8_e4m3fn), queries(2 * bs, torch.bfloat16)
    q, out = q_all[:bs].clone(), torch.empty_like(q_all[:bs])
    rows, lens = kv.req_pool_indices[:bs].clone(), kv.seq_lens[:bs].clone()
    workspace = decode_workspace(bs, HEADS, HEAD_DIM, 16, "cuda")
    decode(decode_attention_fwd, q, kv, workspace, rows, lens, out)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        decode(decode_attention_fwd, q, kv, workspace, rows, lens, out)
    q.copy_(q_all[bs:])
    rows.copy_(kv.req_pool_indices[bs:])
    lens.copy_(kv.seq_lens[bs:])
    graph.replay()
    assert relative_error(out, decode(decode_attention_ref, q, kv, None, rows, lens)) < TOLERANCE[torch.bfloat16]


@pytest.mark.parametrize("cache_dtype", FP8)
@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_store_into_fp8_cache_equals_its_reference(cache_dtype, dtype):
    tokens = 64
    rope = RotaryEmbedding(HEAD_DIM, 4096, {"rope_theta": 500000.0}).to("cuda")
    positions = torch.randint(0, 4096, (tokens,), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    loc = torch.randperm(200, device="cuda")[:tokens] + 1
    gen = torch.Generator(device="cuda").manual_seed(1)
    spread = 30 * torch.finfo(cache_dtype).max / 448  # past the format's largest value (x / K_SCALE): saturates
    base = (torch.randn(tokens, HEADS + 2 * KV_HEADS, HEAD_DIM, generator=gen, device="cuda") * spread).to(dtype)
    caches = []
    for fn in (apply_rotary_and_store_kv_, apply_rotary_and_store_kv_ref):
        qkv = base.clone()
        q, k, v = qkv.split([HEADS, KV_HEADS, KV_HEADS], dim=1)
        k_cache = torch.zeros(256, KV_HEADS, HEAD_DIM, device="cuda").to(cache_dtype)
        v_cache = torch.zeros_like(k_cache)
        fn(positions, q, k, v, rope.cos_sin_cache, k_cache, v_cache, loc, K_SCALE, V_SCALE)
        caches.append((k_cache.float(), v_cache.float()))
    (k_cache, v_cache), (want_k, want_v) = caches
    assert torch.isfinite(k_cache).all() and k_cache.abs().max() == torch.finfo(cache_dtype).max  # saturated
    assert torch.equal(v_cache, want_v)
    # k is rotated in float32 by the kernel and by the reference: a rounding apart at most.
    assert (k_cache != want_k).float().mean() < 1e-3


# ---- engines ---------------------------------------------------------------------------------


def scheduler_args(**kwargs) -> dict:
    args = dict(
        model_path=demo.TARGET_PATH,
        device="cuda",
        dtype="float32",
        attention_backend="triton",
        cuda_graph_max_bs=16,
        disable_overlap_schedule=True,
        max_total_tokens=1 << 15,
        log_level="warning",
    )
    return {**args, **kwargs}


PROMPTS = [
    "def fibonacci(n):",
    "class Stack:\n    def __init__(self):",
    "import os\nimport sys\n",
    "x = [1, 2, 3]\ny = ",
]
GREEDY = {"temperature": 0, "max_new_tokens": 48, "ignore_eos": True}


def greedy(**kwargs) -> list[list[int]]:
    rank = OneRank(**scheduler_args(**kwargs))
    try:
        return rank.generate(PROMPTS, GREEDY)
    finally:
        del rank
        gc.collect()
        torch.cuda.empty_cache()


def test_fp8_engine_with_cuda_graphs_equals_eager_and_speculation_equals_plain():
    graphs = greedy(kv_cache_dtype="fp8_e4m3")
    assert graphs == greedy(kv_cache_dtype="fp8_e4m3", disable_cuda_graph=True)
    spec = greedy(kv_cache_dtype="fp8_e4m3", speculative_algorithm="EAGLE3", speculative_num_steps=3)
    assert spec == graphs
    exact = greedy()
    same_first = sum(a[0] == b[0] for a, b in zip(graphs, exact))
    print(f"first greedy token equal to the float32 cache's on {same_first} of {len(PROMPTS)} prompts")
    assert same_first >= len(PROMPTS) - 1


def test_fp8_pool_holds_twice_the_tokens_of_bf16_in_the_same_memory():
    tokens = {}
    for flag in ("auto", "fp8_e4m3"):
        args = scheduler_args(dtype="bfloat16", kv_cache_dtype=flag, max_total_tokens=None, mem_fraction_static=0.3)
        scheduler = Scheduler(ServerArgs(**args))
        tokens[flag] = scheduler.model_info()["max_total_num_tokens"]
        del scheduler
        gc.collect()
        torch.cuda.empty_cache()
    assert 1.95 < tokens["fp8_e4m3"] / tokens["auto"] < 2.05, tokens
