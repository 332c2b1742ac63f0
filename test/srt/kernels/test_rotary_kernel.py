"""sgl_kernel/rotary.py against its torch reference and the model layer's RotaryEmbedding
(interpreter on CPU)."""

import pytest
import torch

from sgl_kernel.rotary import apply_rotary_embedding_, apply_rotary_embedding_ref
from sgl_kernel.testing import TOLERANCE, relative_error
from sglang.srt.layers.rotary_embedding import RotaryEmbedding

HEADS, KV_HEADS, HEAD_DIM, TOKENS = 6, 2, 32, 5
LLAMA3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 64}


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
