"""sgl_kernel's Triton kernels at the engine's real shapes on CUDA, against their torch
references; decode attention inside a CUDA graph; no wrapper synchronizes with the host.
Run on the GPU machine: python -m pytest test/gpu/test_kernels_cuda.py -q

Error measure: sgl_kernel.testing.relative_error, max |out - ref| / max |ref|, with the
references computed in float32 from the same inputs; tolerances sgl_kernel.testing.TOLERANCE
(bf16 1e-2, fp16 2e-3, fp32 1e-4).
"""

import pytest
import torch

from sgl_kernel.activation import silu_and_mul, silu_and_mul_ref
from sgl_kernel.decode_attention import decode_attention_fwd, decode_attention_ref, decode_workspace
from sgl_kernel.extend_attention import extend_attention_fwd, extend_attention_ref
from sgl_kernel.norm import fused_add_rmsnorm, fused_add_rmsnorm_ref, rmsnorm, rmsnorm_ref
from sgl_kernel.rotary import (
    apply_rotary_and_store_kv_,
    apply_rotary_and_store_kv_ref,
    apply_rotary_embedding_,
    apply_rotary_embedding_ref,
)
from sgl_kernel.skinny_gemm import skinny_gemm, skinny_gemm_ref
from sgl_kernel.testing import TOLERANCE, make_paged_kv, relative_error
from sglang.srt.layers.rotary_embedding import RotaryEmbedding

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128  # Llama-3-8B
HIDDEN, INTERMEDIATE = 4096, 14336
DTYPES = [torch.bfloat16, torch.float32]


def randn(*shape, dtype, seed=0, scale=1.0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return (scale * torch.randn(*shape, generator=gen, device="cuda")).to(dtype)


def random_lengths(n, low, high, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(low, high + 1, (n,), generator=gen).tolist()


def decode_inputs(seq_lens, heads, kv_heads, head_dim, dtype, seed=0):
    kv = make_paged_kv(seq_lens, kv_heads, head_dim, dtype, "cuda", seed=seed)
    q = randn(len(seq_lens), heads, head_dim, dtype=dtype, seed=seed + 1, scale=2.0)
    return q, kv


def run_decode(fn, q, kv, num_kv_splits, **kwargs):
    return fn(
        q,
        kv.k_buffer,
        kv.v_buffer,
        torch.empty_like(q),
        kv.req_to_token,
        kv.req_pool_indices,
        kv.seq_lens,
        q.shape[-1] ** -0.5,
        num_kv_splits,
        **kwargs,
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_kv_splits", [8, 16])
def test_decode_batch_64_contexts_up_to_8192(dtype, num_kv_splits):
    seq_lens = [1, 8192, 2, 63, 64, 65] + random_lengths(58, 1, 8192, seed=1)
    q, kv = decode_inputs(seq_lens, HEADS, KV_HEADS, HEAD_DIM, dtype)
    out = run_decode(decode_attention_fwd, q, kv, num_kv_splits)
    assert relative_error(out, run_decode(decode_attention_ref, q, kv, num_kv_splits)) < TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", DTYPES + [torch.float16])
@pytest.mark.parametrize(
    "heads, kv_heads, head_dim", [(8, 8, 64), (64, 8, 128), (16, 2, 256), (12, 2, 128), (4, 4, 16)]
)
def test_decode_other_head_dims_and_groups(dtype, heads, kv_heads, head_dim):
    seq_lens = [1, 3000, 700, 129]
    q, kv = decode_inputs(seq_lens, heads, kv_heads, head_dim, dtype)
    out = run_decode(decode_attention_fwd, q, kv, 8)
    assert relative_error(out, run_decode(decode_attention_ref, q, kv, 8)) < TOLERANCE[dtype]


def test_decode_replays_in_cuda_graph_with_new_lengths_and_rows():
    """Captured once; replay reads seq_lens, req_pool_indices and q from the same tensors,
    refilled in place for another batch of requests (the graph runner's way)."""
    bs, dtype, num_kv_splits = 8, torch.bfloat16, 16
    seq_lens = random_lengths(bs, 1, 300, seed=2) + [1, 4000] + random_lengths(bs - 2, 1, 8192, seed=3)
    q_all, kv = decode_inputs(seq_lens, HEADS, KV_HEADS, HEAD_DIM, dtype)
    q, out = q_all[:bs].clone(), torch.empty_like(q_all[:bs])
    rows, lens = kv.req_pool_indices[:bs].clone(), kv.seq_lens[:bs].clone()
    workspace = decode_workspace(bs, HEADS, HEAD_DIM, num_kv_splits, "cuda")
    args = (kv.k_buffer, kv.v_buffer, out, kv.req_to_token, rows, lens, HEAD_DIM**-0.5, num_kv_splits)

    decode_attention_fwd(q, *args, workspace=workspace)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        decode_attention_fwd(q, *args, workspace=workspace)

    q.copy_(q_all[bs:])
    rows.copy_(kv.req_pool_indices[bs:])
    lens.copy_(kv.seq_lens[bs:])
    graph.replay()
    want = decode_attention_ref(
        q, kv.k_buffer, kv.v_buffer, torch.empty_like(q), kv.req_to_token, rows, lens, HEAD_DIM**-0.5
    )
    assert relative_error(out, want) < TOLERANCE[dtype]


def extend_inputs(prefix_lens, extend_lens, dtype, heads=HEADS, kv_heads=KV_HEADS, head_dim=HEAD_DIM):
    seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens)]
    kv = make_paged_kv(seq_lens, kv_heads, head_dim, dtype, "cuda")
    q = randn(sum(extend_lens), heads, head_dim, dtype=dtype, seed=1, scale=2.0)
    extend_seq_lens = torch.tensor(extend_lens, device="cuda")
    extend_start_loc = torch.cumsum(extend_seq_lens, 0) - extend_seq_lens
    rest = (
        kv.k_buffer,
        kv.v_buffer,
        kv.req_to_token,
        kv.req_pool_indices,
        kv.seq_lens,
        extend_seq_lens,
        extend_start_loc,
        max(extend_lens),
        head_dim**-0.5,
    )
    return q, rest


@pytest.mark.parametrize("dtype", DTYPES)
def test_extend_prefill_and_verify_over_long_prefixes(dtype):
    # A 2048-token prefill, 192 tokens after 8000 cached, one token after 4000, 513 after
    # 1000, and eight TARGET_VERIFY-shaped requests of 4 tokens after up to 4000 cached.
    prefix_lens = [0, 8000, 4000, 1000] + random_lengths(8, 0, 4000, seed=4)
    extend_lens = [2048, 192, 1, 513] + [4] * 8
    q, rest = extend_inputs(prefix_lens, extend_lens, dtype)
    out = extend_attention_fwd(q, torch.empty_like(q), *rest)
    assert relative_error(out, extend_attention_ref(q, torch.empty_like(q), *rest)) < TOLERANCE[dtype]


def test_extend_replays_in_cuda_graph_for_target_verify():
    """TARGET_VERIFY is captured with a fixed k + 1 tokens per request; replay reads new
    prefixes (seq_lens), rows and queries from the same tensors."""
    bs, tokens, dtype = 8, 4, torch.bfloat16
    prefix_lens = random_lengths(bs, 0, 300, seed=5) + [0, 5000] + random_lengths(bs - 2, 0, 8000, seed=6)
    q_all, rest = extend_inputs(prefix_lens, [tokens] * 2 * bs, dtype)
    k_buffer, v_buffer, req_to_token, all_rows, all_lens, extend_lens, starts, _, scale = rest
    q, out = q_all[: bs * tokens].clone(), torch.empty_like(q_all[: bs * tokens])
    rows, lens = all_rows[:bs].clone(), all_lens[:bs].clone()
    args = (k_buffer, v_buffer, req_to_token, rows, lens, extend_lens[:bs], starts[:bs], tokens, scale)

    extend_attention_fwd(q, out, *args)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        extend_attention_fwd(q, out, *args)

    q.copy_(q_all[bs * tokens :])
    rows.copy_(all_rows[bs:])
    lens.copy_(all_lens[bs:])
    graph.replay()
    assert relative_error(out, extend_attention_ref(q, torch.empty_like(q), *args)) < TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", DTYPES + [torch.float16])
@pytest.mark.parametrize("heads, kv_heads, head_dim", [(8, 8, 64), (64, 8, 128), (16, 2, 256), (12, 2, 128)])
def test_extend_other_head_dims_and_groups(dtype, heads, kv_heads, head_dim):
    q, rest = extend_inputs([0, 3000, 77, 500], [300, 4, 1, 129], dtype, heads, kv_heads, head_dim)
    out = extend_attention_fwd(q, torch.empty_like(q), *rest)
    assert relative_error(out, extend_attention_ref(q, torch.empty_like(q), *rest)) < TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
def test_rmsnorm_and_fused_add_rmsnorm_hidden_4096(dtype):
    x, residual = randn(257, HIDDEN, dtype=dtype, seed=0), randn(257, HIDDEN, dtype=dtype, seed=1)
    weight = 1 + randn(HIDDEN, dtype=dtype, seed=2, scale=0.1)
    assert relative_error(rmsnorm(x, weight, 1e-5), rmsnorm_ref(x, weight, 1e-5)) < TOLERANCE[dtype]
    want_x, want_residual = x.clone(), residual.clone()
    fused_add_rmsnorm_ref(want_x, want_residual, weight, 1e-5)
    fused_add_rmsnorm(x, residual, weight, 1e-5)
    assert relative_error(residual, want_residual) < TOLERANCE[dtype]
    assert relative_error(x, want_x) < TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul_intermediate_14336(dtype):
    x = randn(129, 2 * INTERMEDIATE, dtype=dtype, scale=3.0)
    assert relative_error(silu_and_mul(x), silu_and_mul_ref(x)) < TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_llama3_positions_up_to_8192(dtype):
    llama3 = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    cache = RotaryEmbedding(HEAD_DIM, 8192, llama3).cos_sin_cache.cuda()
    positions = torch.randint(0, 8192, (1000,), generator=torch.Generator().manual_seed(0)).cuda()
    q, k = randn(1000, HEADS, HEAD_DIM, dtype=dtype, seed=0), randn(1000, KV_HEADS, HEAD_DIM, dtype=dtype, seed=1)
    want_q, want_k = q.clone(), k.clone()
    apply_rotary_embedding_ref(positions, want_q, want_k, cache)
    apply_rotary_embedding_(positions, q, k, cache)
    assert relative_error(q, want_q) < TOLERANCE[dtype]
    assert relative_error(k, want_k) < TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_and_kv_store_at_batch_256_into_a_large_cache(dtype):
    cache = RotaryEmbedding(HEAD_DIM, 8192, {"rope_type": "default", "rope_theta": 500000.0}).cos_sin_cache.cuda()
    tokens, slots = 256, 100_000
    positions = torch.randint(0, 8192, (tokens,), generator=torch.Generator().manual_seed(0)).cuda()
    loc = torch.randperm(slots, generator=torch.Generator().manual_seed(1))[:tokens].cuda()
    qkv = randn(tokens, (HEADS + 2 * KV_HEADS) * HEAD_DIM, dtype=dtype, seed=2)
    results = []
    for fn in (apply_rotary_and_store_kv_, apply_rotary_and_store_kv_ref):
        x = qkv.clone()
        q = x[:, : HEADS * HEAD_DIM].view(tokens, HEADS, HEAD_DIM)
        k = x[:, HEADS * HEAD_DIM : (HEADS + KV_HEADS) * HEAD_DIM].view(tokens, KV_HEADS, HEAD_DIM)
        v = x[:, (HEADS + KV_HEADS) * HEAD_DIM :].view(tokens, KV_HEADS, HEAD_DIM)
        k_cache = torch.zeros(slots, KV_HEADS, HEAD_DIM, dtype=dtype, device="cuda")
        v_cache = torch.zeros_like(k_cache)
        fn(positions, q, k, v, cache, k_cache, v_cache, loc)
        untouched = torch.ones(slots, dtype=torch.bool, device="cuda")
        untouched[loc] = False
        assert not k_cache[untouched].any() and not v_cache[untouched].any()  # nothing written elsewhere
        results.append((x, k_cache[loc], v_cache[loc]))
    (x, k_rows, v_rows), (want_x, want_k, want_v) = results
    assert relative_error(x, want_x) < TOLERANCE[dtype]
    assert relative_error(k_rows, want_k) < TOLERANCE[dtype]
    assert relative_error(v_rows, want_v) < TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize(
    "n, k",
    [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096)],
    ids=["qkv", "o", "gate_up", "down", "lm_head"],
)
def test_skinny_gemm_at_llama_8b_shapes(dtype, n, k):
    x = randn(16, k, dtype=dtype, seed=3)
    w = randn(n, k, dtype=dtype, seed=4, scale=k**-0.5)
    bias = randn(n, dtype=dtype, seed=5)
    for rows in (1, 2, 7, 16):
        for b in (None, bias):
            assert relative_error(skinny_gemm(x[:rows], w, b), skinny_gemm_ref(x[:rows], w, b)) < TOLERANCE[dtype]


def test_wrappers_never_synchronize_with_the_host():
    dtype = torch.bfloat16
    q, kv = decode_inputs([5, 700], HEADS, KV_HEADS, HEAD_DIM, dtype)
    eq, rest = extend_inputs([0, 30], [17, 4], dtype)
    x, residual, weight = randn(4, HIDDEN, dtype=dtype), randn(4, HIDDEN, dtype=dtype), randn(HIDDEN, dtype=dtype)
    cache = torch.rand(64, HEAD_DIM, device="cuda")
    positions = torch.arange(4, device="cuda")
    qr, kr = randn(4, HEADS, HEAD_DIM, dtype=dtype), randn(4, KV_HEADS, HEAD_DIM, dtype=dtype)
    gate_up = randn(4, 2 * INTERMEDIATE, dtype=dtype)
    skinny_weight = randn(32, HIDDEN, dtype=dtype)

    def run_all():
        run_decode(decode_attention_fwd, q, kv, 8)
        extend_attention_fwd(eq, torch.empty_like(eq), *rest)
        rmsnorm(x, weight, 1e-6)
        fused_add_rmsnorm(x, residual, weight, 1e-6)
        silu_and_mul(gate_up)
        apply_rotary_embedding_(positions, qr, kr, cache)
        apply_rotary_and_store_kv_(
            positions, qr, kr, kr, cache, kv.k_buffer, kv.v_buffer, torch.arange(4, device="cuda")
        )
        skinny_gemm(x[:1], skinny_weight)
        skinny_gemm(x, skinny_weight)

    run_all()  # compile first
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        run_all()
    finally:
        torch.cuda.set_sync_debug_mode("default")
