"""The attention kernels over an FP8 KV cache (e4m3 / e5m2, per-tensor k and v scales) against
their float32 references on the dequantized K/V, and the fused rotary + KV store writing FP8
(k / k_scale and v / v_scale, saturated). Tiny shapes: the interpreter runs them on the CPU."""

import pytest
import torch

from sgl_kernel.decode_attention import decode_attention_fwd, decode_attention_ref
from sgl_kernel.extend_attention import extend_attention_fwd, extend_attention_ref
from sgl_kernel.rotary import apply_rotary_and_store_kv_, apply_rotary_and_store_kv_ref
from sgl_kernel.testing import make_paged_kv, relative_error
from sglang.srt.layers.rotary_embedding import RotaryEmbedding

NUM_KV_HEADS = 2
K_SCALE, V_SCALE = 0.037, 0.21
# FP8 K/V widen exactly, and the scales fold into the softmax scale and the output: against a
# reference on the dequantized K/V only the order of float32 roundings differs.
TIGHT = {torch.float32: 2e-6, torch.bfloat16: 1e-2}
FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]


def fp8_paged_kv(seq_lens, head_dim, kv_dtype, device):
    """Random FP8 K/V over the format's range (times 100: e4m3 reaches 448) in the engine's layout."""
    kv = make_paged_kv(seq_lens, NUM_KV_HEADS, head_dim, torch.float32, device)
    kv.k_buffer = (kv.k_buffer * 100).clamp(-448, 448).to(kv_dtype)
    kv.v_buffer = (kv.v_buffer * 100).clamp(-448, 448).to(kv_dtype)
    return kv


def queries(num_tokens, heads, head_dim, dtype, device):
    q = torch.randn(num_tokens, heads, head_dim, generator=torch.Generator().manual_seed(1))
    return q.to(dtype).to(device)


@pytest.mark.parametrize("kv_dtype", FP8)
@pytest.mark.parametrize("dtype, group, head_dim, splits", [(torch.float32, 4, 16, 3), (torch.bfloat16, 2, 32, 2)])
def test_decode_over_fp8_kv_matches_reference_on_dequantized_kv(kv_dtype, dtype, group, head_dim, splits, device):
    seq_lens = [1, 70, 17, 64]
    kv = fp8_paged_kv(seq_lens, head_dim, kv_dtype, device)
    q = queries(len(seq_lens), NUM_KV_HEADS * group, head_dim, dtype, device)
    index = (kv.req_to_token, kv.req_pool_indices, kv.seq_lens, head_dim**-0.5, splits)
    scales = dict(k_scale=K_SCALE, v_scale=V_SCALE)
    out = decode_attention_fwd(q, kv.k_buffer, kv.v_buffer, torch.empty_like(q), *index, **scales)
    want = decode_attention_ref(q, kv.k_buffer, kv.v_buffer, torch.empty_like(q, dtype=torch.float32), *index, **scales)
    assert relative_error(out, want) < TIGHT[dtype]
    # The scales are used: without them the output is another one.
    unscaled = decode_attention_ref(q, kv.k_buffer, kv.v_buffer, torch.empty_like(q, dtype=torch.float32), *index)
    assert relative_error(out, unscaled) > 0.1


def run_extend(prefix_lens, extend_lens, group, head_dim, dtype, kv_dtype, device):
    seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens)]
    kv = fp8_paged_kv(seq_lens, head_dim, kv_dtype, device)
    q = queries(sum(extend_lens) + 2, NUM_KV_HEADS * group, head_dim, dtype, device)
    extend_seq_lens = torch.tensor(extend_lens, device=device)
    extend_start_loc = torch.cumsum(extend_seq_lens, 0) - extend_seq_lens
    args = (kv.k_buffer, kv.v_buffer, kv.req_to_token, kv.req_pool_indices, kv.seq_lens)
    layout = (extend_seq_lens, extend_start_loc, max(extend_lens), head_dim**-0.5, K_SCALE, V_SCALE)
    out = extend_attention_fwd(q, torch.full_like(q, 7.0), *args, *layout)
    want = extend_attention_ref(q, torch.full_like(q, 7.0, dtype=torch.float32), *args, *layout)
    return out, want


@pytest.mark.parametrize("kv_dtype", FP8)
@pytest.mark.parametrize("dtype, group, head_dim", [(torch.float32, 3, 16), (torch.bfloat16, 2, 32)])
def test_extend_over_cached_fp8_prefix_matches_reference(kv_dtype, dtype, group, head_dim, device):
    # A prefill with no prefix over two query blocks, extends after 60 and 3 cached positions.
    out, want = run_extend([0, 60, 3], [70, 5, 4], group, head_dim, dtype, kv_dtype, device)
    assert relative_error(out, want) < TIGHT[dtype]


def test_verify_shaped_extend_over_fp8_kv_matches_reference_and_leaves_padding(device):
    # TARGET_VERIFY: k + 1 = 4 causal tokens per request after its cached prefix.
    out, want = run_extend([10, 33, 1], [4, 4, 4], 4, 16, torch.float32, torch.float8_e4m3fn, device)
    assert relative_error(out[:-2], want[:-2]) < TIGHT[torch.float32]
    assert torch.all(out[-2:] == 7.0)


def test_mismatched_k_and_v_dtypes_are_refused(device):
    kv = fp8_paged_kv([3], 16, torch.float8_e4m3fn, device)
    q = queries(1, 2, 16, torch.float32, device)
    with pytest.raises(ValueError, match="FP8"):
        decode_attention_fwd(
            q,
            kv.k_buffer,
            kv.v_buffer.to(torch.float8_e5m2),
            torch.empty_like(q),
            kv.req_to_token,
            kv.req_pool_indices,
            kv.seq_lens,
            0.25,
            1,
        )


@pytest.mark.parametrize("cache_dtype", FP8)
def test_rotary_store_into_fp8_cache_divides_by_the_scales_and_saturates(cache_dtype, device):
    tokens, heads, head_dim = 5, 4, 32
    rope = RotaryEmbedding(head_dim, 64, {"rope_theta": 10000.0}).to(device)
    positions = torch.tensor([0, 3, 9, 17, 63], device=device)
    loc = torch.tensor([3, 9, 1, 7, 4], device=device)
    gen = torch.Generator().manual_seed(0)
    # Values past the format's largest finite one (x / scale > 448 for e4m3, 57344 for e5m2) must saturate.
    spread = 30 * torch.finfo(cache_dtype).max / 448
    base = (torch.randn(tokens, heads + 2 * NUM_KV_HEADS, head_dim, generator=gen) * spread).to(device)
    results = []
    for fn in (apply_rotary_and_store_kv_, apply_rotary_and_store_kv_ref):
        qkv = base.clone()
        q, k, v = qkv.split([heads, NUM_KV_HEADS, NUM_KV_HEADS], dim=1)
        k_cache = torch.zeros(12, NUM_KV_HEADS, head_dim, device=device).to(cache_dtype)
        v_cache = torch.zeros_like(k_cache)
        fn(positions, q, k, v, rope.cos_sin_cache, k_cache, v_cache, loc, K_SCALE, V_SCALE)
        results.append((qkv, k_cache, v_cache))
    (qkv, k_cache, v_cache), (want_qkv, want_k, want_v) = results
    assert relative_error(qkv, want_qkv) < 1e-5
    assert torch.equal(k_cache.float(), want_k.float()) and torch.equal(v_cache.float(), want_v.float())
    limit = torch.finfo(cache_dtype).max
    assert k_cache.float().isfinite().all() and k_cache.float().abs().max() == limit
    # Stored x scale is the value the cache holds: v within FP8's rounding of v.
    v_real = v_cache[loc].float() * V_SCALE
    v_in = base[:, heads + NUM_KV_HEADS :]
    unsaturated = v_in.abs() < limit * V_SCALE
    rounding = 2.0**-3 if cache_dtype == torch.float8_e4m3fn else 2.0**-2
    assert ((v_real - v_in).abs() <= rounding * v_in.abs() + 1e-6)[unsaturated].all()
