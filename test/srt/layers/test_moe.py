"""Routing and the experts' torch reference against plain per-token torch: the top-k weights
(renormalised or not, ties, every expert chosen, masked experts) and the weighted sum of SwiGLU
experts over batches with experts that get no tokens, one token, or every token."""

import pytest
import torch
from sglang.srt.layers.moe.fused_moe import align_tokens_to_experts, fused_experts_reference
from sglang.srt.layers.moe.router import select_experts


def plain_routing(logits: torch.Tensor, top_k: int, renormalize: bool):
    """Token by token: the softmax, its k largest entries, renormalised."""
    weights, ids = [], []
    for row in logits.float():
        probs = torch.softmax(row, dim=-1).tolist()
        chosen = sorted(range(len(probs)), key=lambda e: (-probs[e], e))[:top_k]
        picked = [probs[e] for e in chosen]
        total = sum(picked) if renormalize else 1.0
        weights.append([p / total for p in picked])
        ids.append(chosen)
    return torch.tensor(weights), torch.tensor(ids)


def plain_experts(hidden, w13, w2, topk_weights, topk_ids):
    """Token by token and slot by slot: weight * down(silu(gate x) * up x)."""
    inter = w2.shape[-1]
    out = torch.zeros_like(hidden)
    for t in range(hidden.shape[0]):
        for weight, expert in zip(topk_weights[t].tolist(), topk_ids[t].tolist()):
            gate, up = (w13[expert] @ hidden[t]).split(inter)
            out[t] += weight * (w2[expert] @ (torch.nn.functional.silu(gate) * up))
    return out


@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("num_experts, top_k", [(8, 2), (4, 1), (4, 4), (60, 4)])
def test_routing_matches_plain_softmax_top_k(num_experts, top_k, renormalize):
    logits = torch.randn(33, num_experts, generator=torch.Generator().manual_seed(num_experts + top_k))
    weights, ids = select_experts(logits, top_k, renormalize)
    expected_weights, expected_ids = plain_routing(logits, top_k, renormalize)
    assert weights.dtype == torch.float32 and ids.shape == (33, top_k)
    assert torch.equal(ids, expected_ids)
    torch.testing.assert_close(weights, expected_weights, atol=1e-6, rtol=0)
    if renormalize:
        torch.testing.assert_close(weights.sum(-1), torch.ones(33))


def test_routing_edge_cases():
    # Equal logits: three distinct experts (torch.topk's pick, as transformers'), equal weights.
    weights, ids = select_experts(torch.zeros(2, 6), 3, renormalize=True)
    assert all(len(set(row)) == 3 for row in ids.tolist())
    torch.testing.assert_close(weights, torch.full((2, 3), 1 / 3))
    # Top-1 renormalised is weight one; not renormalised it is the softmax's largest probability.
    logits = torch.tensor([[0.5, 2.0, -1.0]])
    assert select_experts(logits, 1, True)[0].tolist() == [[1.0]]
    torch.testing.assert_close(select_experts(logits, 1, False)[0], torch.softmax(logits, -1)[:, 1:2])
    # Every expert chosen: the whole softmax, in descending order (renormalising changes nothing).
    weights, ids = select_experts(logits, 3, renormalize=False)
    assert ids.tolist() == [[1, 0, 2]]
    torch.testing.assert_close(weights, torch.softmax(logits, -1)[:, [1, 0, 2]])
    # A masked expert (-inf) is never chosen while others remain.
    masked = torch.tensor([[float("-inf"), 0.0, 1.0, 0.5]])
    assert 0 not in select_experts(masked, 3, True)[1].tolist()[0]
    # bfloat16 logits route in float32.
    assert select_experts(logits.bfloat16(), 2, True)[0].dtype == torch.float32
    with pytest.raises(ValueError, match="top_k 5"):
        select_experts(logits, 5, True)


def random_experts(num_experts, hidden, inter, seed):
    gen = torch.Generator().manual_seed(seed)
    w13 = torch.randn(num_experts, 2 * inter, hidden, generator=gen) * 0.2
    w2 = torch.randn(num_experts, hidden, inter, generator=gen) * 0.2
    return w13, w2, gen


@pytest.mark.parametrize(
    "num_tokens, num_experts, top_k",
    [(1, 8, 2), (3, 8, 1), (17, 4, 4), (64, 8, 2), (300, 16, 3)],
    ids=["one-token", "idle-experts", "top-k-is-every-expert", "batch-64", "batch-300"],
)
def test_reference_equals_per_token_experts(num_tokens, num_experts, top_k):
    w13, w2, gen = random_experts(num_experts, 32, 24, seed=num_tokens)
    hidden = torch.randn(num_tokens, 32, generator=gen)
    weights, ids = select_experts(torch.randn(num_tokens, num_experts, generator=gen), top_k, True)
    got = fused_experts_reference(hidden, w13, w2, weights, ids)
    torch.testing.assert_close(got, plain_experts(hidden, w13, w2, weights, ids), atol=1e-5, rtol=1e-5)


def test_reference_reads_only_the_routed_experts():
    # NaN in every expert no token goes to: the output stays finite.
    w13, w2, gen = random_experts(8, 16, 8, seed=1)
    ids = torch.tensor([[2, 5], [5, 2], [2, 5]])
    for expert in set(range(8)) - {2, 5}:
        w13[expert] = float("nan")
        w2[expert] = float("nan")
    out = fused_experts_reference(torch.randn(3, 16, generator=gen), w13, w2, torch.full((3, 2), 0.5), ids)
    assert torch.isfinite(out).all()


def test_empty_batch_and_alignment():
    w13, w2, _ = random_experts(4, 16, 8, seed=2)
    empty = fused_experts_reference(torch.zeros(0, 16), w13, w2, torch.zeros(0, 2), torch.zeros(0, 2, dtype=torch.long))
    assert empty.shape == (0, 16)
    ids = torch.tensor([[3, 0], [0, 1], [3, 1]])
    alignment = align_tokens_to_experts(ids, 4)
    assert alignment.tokens_per_expert.tolist() == [2, 2, 0, 2]
    assert ids.reshape(-1)[alignment.sorted_pairs].tolist() == [0, 0, 1, 1, 3, 3]
    assert alignment.sorted_pairs.tolist() == [1, 2, 3, 5, 0, 4]  # token order within an expert


def test_fp8_reference_is_the_dequantized_experts_within_activation_rounding():
    """Block-wise FP8 experts whose gate and up differ in scale a hundredfold and whose
    intermediate size (96) leaves each projection a partial block of its own: the reference is the
    float experts of the dequantized weights up to e4m3 rounding of the activations (a few percent),
    so each projection's scales are read from its own block rows (swapping them moves the output
    past twice the tolerance)."""
    from sgl_kernel.fp8_reference import dequantize_block_weight
    from sglang.srt.layers.quantization.fp8 import WeightScales
    from sglang.tools.fp8_checkpoint import quantize_weight

    w13, w2, gen = random_experts(4, 160, 96, seed=5)
    w13[:, 96:] *= 100  # up rows
    quantized = [[quantize_weight(p, WeightScales.BLOCK) for p in (w[:96], w[96:])] for w in w13]
    q13 = torch.stack([torch.cat([gate[0], up[0]]) for gate, up in quantized])
    s13 = torch.stack([torch.cat([gate[1], up[1]]) for gate, up in quantized])
    q2, s2 = (torch.stack(t) for t in zip(*(quantize_weight(w, WeightScales.BLOCK) for w in w2)))
    dequantized13 = torch.stack(
        [torch.cat([dequantize_block_weight(g[0], g[1]), dequantize_block_weight(u[0], u[1])]) for g, u in quantized]
    )
    dequantized2 = torch.stack([dequantize_block_weight(q, s) for q, s in zip(q2, s2)])
    hidden = torch.randn(9, 160, generator=gen)
    weights, ids = select_experts(torch.randn(9, 4, generator=gen), 2, True)
    got = fused_experts_reference(hidden, q13, q2, weights, ids, w13_scale=s13, w2_scale=s2)
    expected = plain_experts(hidden, dequantized13, dequantized2, weights, ids)
    scale = expected.abs().max().item()
    torch.testing.assert_close(got, expected, atol=0.05 * scale, rtol=0)
    swapped = torch.cat([s13[:, 1:], s13[:, :1]], dim=1)
    wrong = fused_experts_reference(hidden, q13, q2, weights, ids, w13_scale=swapped, w2_scale=s2)
    assert (wrong - expected).abs().max() > 2 * 0.05 * scale  # the tolerance above catches a misread
