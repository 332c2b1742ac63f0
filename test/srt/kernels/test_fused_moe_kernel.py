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


@pytest.mark.parametrize(
    "num_tokens, num_experts, top_k, renormalize",
    [(1, 8, 2, True), (3, 5, 5, False), (17, 60, 3, True), (300, 128, 8, True), (40, 6, 1, False)],
)
def test_routing_kernel_equals_softmax_topk(num_tokens, num_experts, top_k, renormalize, device):
    """The one-kernel routing (CUDA's path) gives select_experts' torch weights and ids."""
    from sgl_kernel.fused_moe import route

    logits = torch.randn(num_tokens, num_experts, generator=torch.Generator().manual_seed(num_experts)) * 3
    weights, ids = route(logits.to(device), top_k, renormalize)
    probs = torch.softmax(logits, dim=-1)
    expected_w, expected_ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        expected_w = expected_w / expected_w.sum(dim=-1, keepdim=True)
    assert ids.dtype == torch.int32 and ids.cpu().long().tolist() == expected_ids.tolist()
    torch.testing.assert_close(weights.cpu(), expected_w, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("num_pairs, num_experts, block_m", [(1, 4, 16), (8, 128, 16), (600, 60, 16), (2048, 128, 32)])
def test_block_alignment_keeps_each_experts_pairs_in_order(num_pairs, num_experts, block_m, device):
    """Every pair lands once, in its expert's run, in the order the pairs came; each block's
    expert is the run it lies in; the rows in use are the padded runs' total."""
    from sgl_kernel.fused_moe import moe_align_block_size

    ids = torch.randint(0, num_experts, (num_pairs,), generator=torch.Generator().manual_seed(num_pairs))
    alignment = moe_align_block_size(ids.to(device), num_experts, block_m)
    rows, blocks = alignment.sorted_pairs.cpu().long(), alignment.block_experts.cpu().long()
    expected = []
    for expert in range(num_experts):
        pairs = (ids == expert).nonzero().flatten().tolist()
        if pairs:
            expected += pairs + [num_pairs] * (-len(pairs) % block_m)
    assert rows[: len(expected)].tolist() == expected
    assert (rows[len(expected) :] == num_pairs).all()
    assert alignment.num_padded.cpu().tolist() == [len(expected)]
    in_use = len(expected) // block_m
    assert blocks[:in_use].tolist() == [ids[rows[b * block_m]].item() for b in range(in_use)]
