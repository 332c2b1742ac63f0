"""sgl_kernel/rotary.py against its torch reference and the model layer's RotaryEmbedding
(interpreter on CPU)."""

import pytest
import torch

from sgl_kernel.rotary import (
    apply_rotary_and_store_kv_,
    apply_rotary_and_store_kv_ref,
    apply_rotary_embedding_,
    apply_rotary_embedding_ref,
)
from sgl_kernel.testing import TOLERANCE, relative_error
from sglang.srt.layers.rotary_embedding import RotaryEmbedding

HEADS, KV_HEADS, HEAD_DIM, TOKENS = 6, 2, 32, 5
LLAMA3 = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}


def fused_qkv(dtype, device):
    """q and k as views into one [T, (H + 2 KV) * D] projection output, as the model has them."""
    qkv = torch.randn(TOKENS, (HEADS + 2 * KV_HEADS) * HEAD_DIM, generator=torch.Generator().manual_seed(0))
    qkv = qkv.to(dtype).to(device)
    q = qkv[:, : HEADS * HEAD_DIM].view(TOKENS, HEADS, HEAD_DIM)
    k = qkv[:, HEADS * HEAD_DIM : (HEADS + KV_HEADS) * HEAD_DIM].view(TOKENS, KV_HEADS, HEAD_DIM)
    return qkv, q, k


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_rotary_rotates_q_and_k_views_in_place(dtype, device):
    rope = RotaryEmbedding(HEAD_DIM, 256, LLAMA3).to(device)
    positions = torch.tensor([0, 1, 63, 200, 255], device=device)
    qkv, q, k = fused_qkv(dtype, device)
    want_qkv, want_q, want_k = fused_qkv(dtype, device)
    apply_rotary_embedding_(positions, q, k, rope.cos_sin_cache)
    apply_rotary_embedding_ref(positions, want_q, want_k, rope.cos_sin_cache)
    assert relative_error(qkv, want_qkv) < TOLERANCE[dtype]  # V, past q and k, untouched too
    layer_q, layer_k = rope(positions, *fused_qkv(dtype, device)[1:])
    assert relative_error(q, layer_q) < TOLERANCE[dtype]
    assert relative_error(k, layer_k) < TOLERANCE[dtype]


@pytest.mark.parametrize(
    "dtype,cache_dtype",
    [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16), (torch.float32, torch.bfloat16)],
)
def test_rotary_and_kv_store_rotates_in_place_and_fills_exactly_the_given_slots(dtype, cache_dtype, device):
    rope = RotaryEmbedding(HEAD_DIM, 256, LLAMA3).to(device)
    positions = torch.tensor([0, 1, 63, 200, 255], device=device)
    slots = 12
    # Slots out of order, read as a strided column (the batch's slot table has them so).
    table = torch.tensor([[3, 0], [9, 0], [1, 0], [7, 0], [4, 0]], device=device)
    loc = table[:, 0]
    results = []
    for fn in (apply_rotary_and_store_kv_, apply_rotary_and_store_kv_ref):
        qkv, q, k = fused_qkv(dtype, device)
        v = qkv[:, (HEADS + KV_HEADS) * HEAD_DIM :].view(TOKENS, KV_HEADS, HEAD_DIM)
        k_cache = torch.full((slots, KV_HEADS, HEAD_DIM), 7.0, dtype=cache_dtype, device=device)
        v_cache = torch.full((slots, KV_HEADS, HEAD_DIM), 7.0, dtype=cache_dtype, device=device)
        fn(positions, q, k, v, rope.cos_sin_cache, k_cache, v_cache, loc)
        results.append((qkv, k_cache, v_cache))
    (qkv, k_cache, v_cache), (want_qkv, want_k_cache, want_v_cache) = results
    assert relative_error(qkv, want_qkv) < TOLERANCE[dtype]
    assert relative_error(k_cache, want_k_cache) < TOLERANCE[cache_dtype]
    assert relative_error(v_cache, want_v_cache) < TOLERANCE[cache_dtype]
    untouched = torch.ones(slots, dtype=torch.bool)
    untouched[loc.cpu()] = False
    assert (k_cache[untouched.to(device)] == 7.0).all() and (v_cache[untouched.to(device)] == 7.0).all()
    # The cache holds the rotated k and the untouched v of each token.
    assert torch.equal(
        k_cache[loc].float(),
        qkv[:, HEADS * HEAD_DIM : (HEADS + KV_HEADS) * HEAD_DIM]
        .view(TOKENS, KV_HEADS, HEAD_DIM)
        .to(cache_dtype)
        .float(),
    )
    assert torch.equal(
        v_cache[loc].float(),
        qkv[:, (HEADS + KV_HEADS) * HEAD_DIM :].view(TOKENS, KV_HEADS, HEAD_DIM).to(cache_dtype).float(),
    )


def test_rotary_and_kv_store_rejects_a_cache_that_does_not_fit(device):
    rope = RotaryEmbedding(HEAD_DIM, 256, LLAMA3).to(device)
    qkv, q, k = fused_qkv(torch.float32, device)
    v = k.clone()
    positions, loc = torch.arange(TOKENS, device=device), torch.arange(TOKENS, device=device)
    wrong = torch.zeros(8, KV_HEADS + 1, HEAD_DIM, device=device)
    with pytest.raises(ValueError, match="KV cache"):
        apply_rotary_and_store_kv_(positions, q, k, v, rope.cos_sin_cache, wrong, wrong, loc)
    cache = torch.zeros(8, KV_HEADS, HEAD_DIM, device=device)
    with pytest.raises(ValueError, match="one slot per token"):
        apply_rotary_and_store_kv_(positions, q, k, v, rope.cos_sin_cache, cache, cache.clone(), loc[:2])


def greedy_ids_fused_and_unfused(monkeypatch, device, prompts, **server_args) -> dict[bool, dict[str, list[int]]]:
    """Six greedy tokens for each prompt, with attention's rotation and KV store in the fused kernel
    (True) and in torch and the backend (False), on `device` (CUDA, or the interpreter on the CPU)."""
    from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.models import llama
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.server_args import ServerArgs
    from sglang.test.runner_utils import run_to_completion

    outputs = {}
    for fused in (False, True):
        monkeypatch.setattr(llama, "fuses_rope_and_kv_store", lambda q, fused=fused: fused)
        args = ServerArgs(
            dtype="float32",
            device=device,
            disable_overlap_schedule=True,
            disable_cuda_graph=True,
            max_total_tokens=512,
            **server_args,
        )
        scheduler = Scheduler(args)
        for i, ids in enumerate(prompts):
            params = SamplingParams(max_new_tokens=6, temperature=0, ignore_eos=True)
            scheduler.add_request(TokenizedGenerateReqInput(f"r{i}", ids, params, stream=False))
        outputs[fused] = {rid: out["ids"] for rid, out in run_to_completion(scheduler).items()}
    return outputs


@pytest.mark.parametrize("spec", [False, True], ids=["plain", "eagle3"])
def test_the_model_path_through_the_fused_kernel_decodes_the_same_tokens(spec, monkeypatch, device):
    """The demo pair (target and EAGLE-3 draft, both built on LlamaAttention) with rotation and
    KV store fused in one kernel (on CUDA, or under the interpreter on the CPU) against the torch
    rotation with the backend's store: prefill, decode and speculative steps read the KV the
    kernel wrote, so any wrong slot, head or rotation changes the greedy tokens."""
    spec_args = dict(speculative_algorithm="EAGLE3", speculative_num_steps=2) if spec else {}
    prompts = [[5, 17, 300, 41, 9, 77], [12, 13, 14, 15, 16, 17, 18, 19, 20]]
    outputs = greedy_ids_fused_and_unfused(monkeypatch, device, prompts, **spec_args)
    assert outputs[True] == outputs[False] and all(len(ids) == 6 for ids in outputs[True].values())


def qk_norm_weights(dtype, device):
    """Per-head RMSNorm weights for q and k, spread away from 1 so that leaving one out shows."""
    gen = torch.Generator().manual_seed(1)
    return [(1 + 0.5 * torch.randn(HEAD_DIM, generator=gen)).to(dtype).to(device) for _ in range(2)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_and_kv_store_normalizes_each_head_first_as_the_separate_norm_does(dtype, device):
    """Qwen3's q_norm and k_norm folded into the rotary-and-store kernel: the same q, k and cache
    as the reference, and as the norm kernel run on each head before the unnormalized kernel."""
    from sgl_kernel.norm import rmsnorm

    rope = RotaryEmbedding(HEAD_DIM, 256, LLAMA3).to(device)
    positions = torch.tensor([0, 1, 63, 200, 255], device=device)
    loc = torch.tensor([3, 9, 1, 7, 4], device=device)
    q_norm, k_norm = qk_norm_weights(dtype, device)
    results = {}
    for name in ("kernel", "reference", "separate norm", "no norm"):
        qkv, q, k = fused_qkv(dtype, device)
        v = qkv[:, (HEADS + KV_HEADS) * HEAD_DIM :].view(TOKENS, KV_HEADS, HEAD_DIM)
        k_cache = torch.zeros((12, KV_HEADS, HEAD_DIM), dtype=dtype, device=device)
        v_cache = torch.zeros_like(k_cache)
        args = (positions, q, k, v, rope.cos_sin_cache, k_cache, v_cache, loc)
        if name == "kernel":
            apply_rotary_and_store_kv_(*args, q_norm=q_norm, k_norm=k_norm, norm_eps=1e-5)
        elif name == "reference":
            apply_rotary_and_store_kv_ref(*args, q_norm=q_norm, k_norm=k_norm, norm_eps=1e-5)
        else:
            if name == "separate norm":
                for x, weight in ((q, q_norm), (k, k_norm)):
                    x.copy_(rmsnorm(x.reshape(-1, HEAD_DIM), weight, 1e-5).view(x.shape))
            apply_rotary_and_store_kv_(*args)
        results[name] = (qkv, k_cache, v_cache)
    for name in ("reference", "separate norm"):
        for got, want in zip(results["kernel"], results[name]):
            assert relative_error(got, want) < TOLERANCE[dtype], name
    assert relative_error(results["kernel"][1], results["no norm"][1]) > 0.1  # the norm did something
    assert torch.equal(results["kernel"][2], results["no norm"][2])  # v is stored as it is


def test_rotary_and_kv_store_rejects_a_lone_or_misshapen_norm(device):
    rope = RotaryEmbedding(HEAD_DIM, 256, LLAMA3).to(device)
    qkv, q, k = fused_qkv(torch.float32, device)
    v = k.clone()
    positions, loc = torch.arange(TOKENS, device=device), torch.arange(TOKENS, device=device)
    cache = torch.zeros(8, KV_HEADS, HEAD_DIM, device=device)
    q_norm, k_norm = qk_norm_weights(torch.float32, device)
    args = (positions, q, k, v, rope.cos_sin_cache, cache, cache.clone(), loc)
    with pytest.raises(ValueError, match="come together"):
        apply_rotary_and_store_kv_(*args, q_norm=q_norm)
    with pytest.raises(ValueError, match="k_norm must be a contiguous"):
        apply_rotary_and_store_kv_(*args, q_norm=q_norm, k_norm=k_norm[:-1])


def test_a_qwen3_moe_model_with_its_head_norms_fused_decodes_the_same_tokens(tmp_path, monkeypatch, device):
    """A tiny Qwen3-MoE (q_norm and k_norm on every layer) with norms, rotation and KV store in one
    kernel (on CUDA, or under the interpreter on the CPU) against the separate norms and the torch
    rotation: the same greedy tokens."""
    from sglang.test.tiny_moe_models import make_tiny_moe_model

    path = make_tiny_moe_model(str(tmp_path / "qwen3_moe"), "qwen3_moe")
    prompts = [[5, 17, 30, 41, 9, 77], [12, 13, 14, 15, 16, 17, 18, 19, 20]]
    outputs = greedy_ids_fused_and_unfused(monkeypatch, device, prompts, model_path=path)
    assert outputs[True] == outputs[False] and all(len(ids) == 6 for ids in outputs[True].values())
