"""The fused MoE kernel (two grouped GEMMs over the experts with tokens) against the layer's torch
reference and the slot-by-slot reference: experts with no tokens, one token, top-k equal to the
number of experts, batches of 1 to 300 tokens, bfloat16; the block alignment it runs on. Block-wise
FP8 experts (e4m3 weights, a scale per 128 x 128 block, activations quantized per token and 128
features before each GEMM) against the layer's FP8 reference at the same odd shapes, with hidden and
intermediate sizes that are no multiple of 128 (the format's last blocks are partial)."""

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


@pytest.mark.parametrize(
    "num_pairs, num_experts, block_m", [(1, 4, 16), (8, 128, 16), (600, 60, 16), (2048, 128, 32), (5000, 128, 16)]
)
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


def fp8_experts(w13, w2):
    """(w13, w2, w13_scale, w2_scale) of float experts quantized block-wise as a checkpoint stores
    them: gate, up and down each by its own 128 x 128 blocks, the gate's and up's stacked."""
    from sglang.srt.layers.quantization.fp8 import WeightScales
    from sglang.tools.fp8_checkpoint import quantize_weight

    inter = w2.shape[-1]

    def stacked(projections):
        pairs = [quantize_weight(p, WeightScales.BLOCK) for p in projections]
        return torch.stack([q for q, _ in pairs]), torch.stack([s for _, s in pairs])

    gate, gate_s = stacked(w13[:, :inter])
    up, up_s = stacked(w13[:, inter:])
    down, down_s = stacked(w2)
    return torch.cat([gate, up], dim=1), down, torch.cat([gate_s, up_s], dim=1), down_s


def fp8_case(num_tokens, num_experts, top_k, hidden, inter, seed, device, routed=None):
    x, w13, w2, weights, ids = case(num_tokens, num_experts, top_k, hidden, inter, seed, routed=routed)
    w13, w2, w13_scale, w2_scale = fp8_experts(w13 * 0.25, w2 * 0.25)
    return [t.to(device) for t in (x, w13, w2, weights, ids)], dict(
        w13_scale=w13_scale.to(device), w2_scale=w2_scale.to(device)
    )


@pytest.mark.parametrize(
    "num_tokens, num_experts, top_k, hidden, inter",
    [
        (1, 8, 2, 128, 128),
        (1, 4, 4, 200, 96),  # top-k = E, H and I past whole blocks
        (2, 16, 1, 130, 40),
        (7, 4, 4, 256, 256),
        (33, 8, 3, 64, 200),
        (129, 8, 2, 128, 72),
        (300, 6, 2, 136, 40),
    ],
)
def test_fp8_kernel_equals_the_fp8_reference(num_tokens, num_experts, top_k, hidden, inter, device):
    from sgl_kernel.fused_moe import fused_experts

    args, scales = fp8_case(num_tokens, num_experts, top_k, hidden, inter, seed=num_tokens, device=device)
    got = fused_experts(*args, **scales)
    expected = fused_experts_reference(*[t.cpu() for t in args], **{k: v.cpu() for k, v in scales.items()})
    assert_equal_up_to_rounding_flips(got.cpu(), expected)


def assert_equal_up_to_rounding_flips(got, expected, max_rows=2):
    """Both quantize the same inputs to the same e4m3 values and multiply the same weights, so
    they differ by float32 summation order, except where a SwiGLU output (the down GEMM's input,
    quantized per group) falls on opposite sides of an e4m3 rounding boundary in the two: that
    moves its token's row by one e4m3 step of one value (measured: 1 row in 129 tokens x 2 slots,
    by 0.2% of the output's range). So: all but `max_rows` rows within 1e-5, those within 1%."""
    close = (got - expected).abs() <= 1e-5 + 1e-5 * expected.abs()
    flipped = (~close).any(dim=-1).nonzero().flatten().tolist()
    assert len(flipped) <= max_rows, flipped
    torch.testing.assert_close(got, expected, atol=1e-2 * expected.abs().max().item(), rtol=0)


def test_fp8_experts_without_tokens_are_not_read(device):
    from sgl_kernel.fused_moe import fused_experts

    (x, w13, w2, weights, ids), scales = fp8_case(5, 8, 2, 160, 48, seed=1, device=device, routed=(1, 6))
    for expert in set(range(8)) - {1, 6}:
        scales["w13_scale"][expert] = float("nan")
        scales["w2_scale"][expert] = float("nan")
    got = fused_experts(x, w13, w2, weights, ids, **scales)
    assert torch.isfinite(got).all()
    assert_equal_up_to_rounding_flips(got, fused_experts_reference(x, w13, w2, weights, ids, **scales))


def test_fp8_experts_with_bfloat16_activations(device):
    """The serving dtype: bf16 in and out, the SwiGLU output stored in bf16 between the kernels."""
    from sgl_kernel.fused_moe import fused_experts

    (x, w13, w2, weights, ids), scales = fp8_case(19, 5, 2, 144, 80, seed=3, device=device)
    got = fused_experts(x.bfloat16(), w13, w2, weights, ids, **scales)
    expected = fused_experts_reference(x.bfloat16(), w13, w2, weights, ids, **scales)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), expected.float(), atol=2e-2, rtol=2e-2)


def test_fp8_kernel_refuses_scales_of_other_shapes_and_other_k_steps(device):
    from sgl_kernel.fused_moe import TileConfig, fused_experts

    (x, w13, w2, weights, ids), scales = fp8_case(3, 4, 2, 200, 96, seed=2, device=device)
    with pytest.raises(ValueError, match=r"w13_scale must be \(4, 2, 2\)"):
        fused_experts(x, w13, w2, weights, ids, w13_scale=scales["w13_scale"][:, :1], w2_scale=scales["w2_scale"])
    with pytest.raises(ValueError, match="w2_scale must be"):
        fused_experts(x, w13, w2, weights, ids, w13_scale=scales["w13_scale"])
    with pytest.raises(ValueError, match="block_k 64"):
        fused_experts(x, w13, w2, weights, ids, TileConfig(block_k=64), **scales)
