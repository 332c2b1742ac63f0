"""The fused MoE kernel (two grouped GEMMs over the experts with tokens) against the layer's torch
reference and the slot-by-slot reference: experts with no tokens, one token, top-k equal to the
number of experts, batches of 1 to 300 tokens, bfloat16; the block alignment it runs on."""

import pytest
import torch
from sglang.srt.layers.moe.fused_moe import fused_experts_reference
from sglang.srt.layers.moe.router import select_experts


def case(num_tokens, num_experts, top_k, hidden=32, inter=48, seed=0, device="cpu", routed=None):
    gen = torch.Generator().manual_seed(seed)
    w13 = torch.randn(num_experts, 2 * inter, hidden, generator=gen) * 0.2
    w2 = torch.randn(num_experts, hidden, inter, generator=gen) * 0.2
    x = torch.randn(num_tokens, hidden, generator=gen)
    logits = torch.randn(num_tokens, num_experts, generator=gen)
    if routed is not None:  # only these experts get tokens
        logits[:, [e for e in range(num_experts) if e not in routed]] = float("-inf")
    weights, ids = select_experts(logits, top_k, renormalize=True)
    return [t.to(device) for t in (x, w13, w2, weights, ids)]


@pytest.mark.parametrize(
    "num_tokens, num_experts, top_k",
    [(1, 8, 2), (1, 4, 4), (2, 16, 1), (7, 4, 4), (33, 8, 3), (129, 8, 2), (300, 6, 2)],
)
def test_kernel_equals_the_references(num_tokens, num_experts, top_k, device):
    from sgl_kernel.fused_moe import fused_experts, fused_experts_ref

    args = case(num_tokens, num_experts, top_k, seed=num_tokens, device=device)
    got = fused_experts(*args)
    torch.testing.assert_close(got, fused_experts_reference(*args), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got, fused_experts_ref(*args), atol=1e-4, rtol=1e-4)


def test_experts_without_tokens_are_not_read(device):
    from sgl_kernel.fused_moe import fused_experts

    x, w13, w2, weights, ids = case(5, 8, 2, device=device, routed=(1, 6))
    for expert in set(range(8)) - {1, 6}:
        w13[expert] = float("nan")
        w2[expert] = float("nan")
    got = fused_experts(x, w13, w2, weights, ids)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, fused_experts_reference(x, w13, w2, weights, ids), atol=1e-4, rtol=1e-4)


def test_bfloat16_and_odd_sizes(device):
    from sgl_kernel.fused_moe import fused_experts, fused_experts_ref

    x, w13, w2, weights, ids = case(19, 5, 2, hidden=80, inter=40, seed=3, device=device)
    got = fused_experts(x.bfloat16(), w13.bfloat16(), w2.bfloat16(), weights, ids)
    expected = fused_experts_ref(x.bfloat16(), w13.bfloat16(), w2.bfloat16(), weights, ids)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), expected.float(), atol=3e-2, rtol=3e-2)


def test_block_alignment_pads_each_expert_to_whole_blocks(device):
    from sgl_kernel.fused_moe import moe_align_block_size

    ids = torch.tensor([[3, 0], [0, 1], [3, 1], [3, 0]], device=device)
    alignment = moe_align_block_size(ids, num_experts=5, block_m=4)
    pad = ids.numel()
    # expert 0: pairs 1, 2, 7; expert 1: 3, 5; expert 3: 0, 4, 6; experts 2 and 4: none.
    rows = alignment.sorted_pairs.tolist()
    assert rows[:12] == [1, 2, 7, pad, 3, 5, pad, pad, 0, 4, 6, pad]
    assert set(rows[12:]) <= {pad}
    assert alignment.num_padded.tolist() == [12]
    assert alignment.block_experts.tolist()[:3] == [0, 1, 3]
