"""Sampler: greedy rows, seeded reproducibility, batch invariance, and the sampled
distributions under temperature, top-k, top-p and min-p checked against numpy references."""

import numpy as np
import pytest
import scipy.stats
import torch

from sglang.srt.layers.sampler import Sampler, apply_top_k_top_p_min_p
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
from sglang.srt.sampling.sampling_params import SamplingParams

VOCAB = 8
LOGITS = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, 0.8])
NUM_DRAWS = 20_000

sampler = Sampler()


def make_info(params, seeds=None, vocab_size=VOCAB):
    seeds = [0] * len(params) if seeds is None else seeds
    return SamplingBatchInfo.from_params(params, seeds, vocab_size, "cpu")


def sample_rows(logits, params, seeds, offsets):
    return sampler(logits, make_info(params, seeds, logits.shape[-1]), torch.tensor(offsets))


def draw_many(params, logits=LOGITS, seed=0, num_draws=NUM_DRAWS):
    """num_draws tokens from one request: same seed, offsets 0..num_draws-1."""
    batch = logits.expand(num_draws, -1)
    return sample_rows(batch, [params] * num_draws, [seed] * num_draws, list(range(num_draws)))


def softmax_np(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def assert_follows(tokens, probs):
    """Tokens with zero probability never appear; the rest pass a chi-square test."""
    counts = np.bincount(tokens.numpy(), minlength=len(probs))
    support = probs > 0
    assert counts[~support].sum() == 0
    expected = probs[support] / probs[support].sum() * counts.sum()
    assert scipy.stats.chisquare(counts[support], expected).pvalue > 1e-3


def test_all_greedy_equals_argmax():
    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(0))
    params = [SamplingParams(temperature=0.0)] * 5
    tokens = sample_rows(logits, params, [1, 2, 3, 4, 5], [0, 1, 2, 3, 4])
    assert tokens.dtype == torch.int64
    assert torch.equal(tokens, logits.argmax(-1))


def test_greedy_accepts_half_precision_logits():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    tokens = sample_rows(logits, [SamplingParams(temperature=0.0)] * 3, [0] * 3, [0] * 3)
    assert torch.equal(tokens, logits.float().argmax(-1))


def test_top_k_one_is_greedy_even_at_high_temperature():
    tokens = draw_many(SamplingParams(temperature=100.0, top_k=1), num_draws=500)
    assert (tokens == LOGITS.argmax()).all()


def test_same_seed_gives_identical_tokens_twice():
    params = SamplingParams(temperature=1.5)
    first = draw_many(params, seed=42, num_draws=200)
    assert torch.equal(first, draw_many(params, seed=42, num_draws=200))


def test_different_seeds_give_different_tokens():
    params = SamplingParams(temperature=1.5)
    first = draw_many(params, seed=1, num_draws=200)
    second = draw_many(params, seed=2, num_draws=200)
    # Two independent draws from this distribution agree about a quarter of the time.
    assert (first != second).float().mean() > 0.5


def test_token_depends_only_on_seed_and_offset():
    params = SamplingParams(temperature=2.0)
    sequence = draw_many(params, seed=7, num_draws=50)
    for offset in (0, 13, 49):
        alone = sample_rows(LOGITS[None], [params], [7], [offset])
        assert alone.item() == sequence[offset].item()
    assert len(set(sequence.tolist())) > 1  # the offset does change the draw


def test_temperature_sampling_follows_softmax():
    tokens = draw_many(SamplingParams(temperature=0.7))
    assert_follows(tokens, softmax_np(LOGITS.numpy().astype(np.float64) / 0.7))


def test_top_k_never_leaves_the_k_largest_and_renormalizes():
    tokens = draw_many(SamplingParams(temperature=1.3, top_k=3))
    probs = softmax_np(LOGITS.numpy().astype(np.float64) / 1.3)
    probs[np.argsort(-LOGITS.numpy())[3:]] = 0
    assert set(tokens.tolist()) <= {0, 1, 2}
    assert_follows(tokens, probs)


def nucleus_np(probs, top_p):
    order = np.argsort(-probs, kind="stable")
    mass_before = np.cumsum(probs[order]) - probs[order]
    kept = np.zeros_like(probs)
    kept[order[mass_before < top_p]] = probs[order[mass_before < top_p]]
    return kept


def test_top_p_stays_in_nucleus_and_renormalizes():
    probs = softmax_np(LOGITS.numpy().astype(np.float64))
    nucleus = nucleus_np(probs, 0.7)
    assert 1 < (nucleus > 0).sum() < VOCAB  # the test means something
    tokens = draw_many(SamplingParams(top_p=0.7))
    assert_follows(tokens, nucleus)


@pytest.mark.parametrize("top_p", [1e-6, 1e-46, 5e-324], ids=["tiny", "below_float32", "smallest_double"])
def test_tiny_top_p_keeps_the_top_token(top_p):
    # The top token is not token 0: a row with every token filtered out would also pick token 0.
    logits = LOGITS.roll(3)
    tokens = draw_many(SamplingParams(temperature=3.0, top_p=top_p), logits=logits, num_draws=300)
    assert (tokens == logits.argmax()).all()


def test_min_p_masks_tokens_below_fraction_of_top():
    probs = softmax_np(LOGITS.numpy().astype(np.float64))
    probs[probs < 0.3 * probs.max()] = 0
    assert 1 < (probs > 0).sum() < VOCAB
    tokens = draw_many(SamplingParams(min_p=0.3))
    assert_follows(tokens, probs)


def test_mixed_batch_rows_match_each_row_alone():
    generator = torch.Generator().manual_seed(3)
    vocab = 300
    logits = torch.randn(6, vocab, generator=generator) * 3
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.8, top_k=20),
        SamplingParams(temperature=1.0, top_k=5, top_p=1.0, sampling_seed=1),
        SamplingParams(temperature=1.2, top_p=0.5),
        SamplingParams(temperature=2.0, top_k=1),
        SamplingParams(temperature=0.9, top_p=0.9, top_k=50, min_p=0.05),
    ]
    seeds, offsets = [11, 12, 13, 14, 15, 16], [0, 5, 9, 2, 4, 100]
    for _ in range(3):  # several steps, so sampled rows hit different noise
        batch = sample_rows(logits, params, seeds, offsets)
        for i in range(6):
            row = slice(i, i + 1)
            alone = sample_rows(logits[row], params[row], seeds[row], offsets[row])
            assert batch[i] == alone[0]
        assert batch[0] == logits[0].argmax() and batch[4] == logits[4].argmax()
        offsets = [o + 1 for o in offsets]


def test_batch_invariance_under_reordering_and_padding():
    generator = torch.Generator().manual_seed(4)
    logits = torch.randn(16, 1000, generator=generator)
    params = [SamplingParams(temperature=1.0, top_p=0.95, top_k=200) for _ in range(16)]
    seeds, offsets = list(range(100, 116)), list(range(16))
    tokens = sample_rows(logits, params, seeds, offsets)
    order = torch.randperm(16, generator=generator)
    shuffled = sample_rows(
        logits[order],
        [params[i] for i in order],
        [seeds[i] for i in order],
        [offsets[i] for i in order],
    )
    assert torch.equal(shuffled, tokens[order])
    # Adding a greedy row that needs no filtering does not change the sampled rows.
    padded_logits = torch.cat([logits, torch.zeros(1, 1000)])
    greedy = SamplingParams(temperature=0)
    padded = sample_rows(padded_logits, params + [greedy], seeds + [0], offsets + [0])
    assert torch.equal(padded[:16], tokens)


def filter_reference(logits, top_k, top_p, min_p):
    """numpy float64: top-k, then top-p on the renormalised remainder, then min-p."""
    kept = np.ones_like(logits, dtype=bool)
    order = np.argsort(-logits, kind="stable")
    kept[order[top_k:]] = False
    probs = softmax_np(np.where(kept, logits, -np.inf))
    kept &= nucleus_np(probs, top_p) > 0 if top_p < 1 else kept
    probs = softmax_np(logits)
    kept &= probs >= min_p * probs.max()
    return kept


def test_filters_match_numpy_reference():
    generator = torch.Generator().manual_seed(5)
    vocab, batch = 64, 40
    logits = torch.randn(batch, vocab, generator=generator, dtype=torch.float64) * 2
    # top_k=1 is greedy: the batch info neutralises those rows, the sampler argmaxes them.
    top_ks = torch.randint(2, vocab + 1, (batch,), generator=generator).tolist()
    top_ps = (torch.rand(batch, generator=generator, dtype=torch.float64) * 0.9 + 0.1).tolist()
    min_ps = (torch.rand(batch, generator=generator, dtype=torch.float64) * 0.2).tolist()
    top_ps[:5], min_ps[5:10], top_ks[10:15] = [1.0] * 5, [0.0] * 5, [vocab] * 5
    params = [SamplingParams(top_k=k, top_p=p, min_p=m) for k, p, m in zip(top_ks, top_ps, min_ps)]
    filtered = apply_top_k_top_p_min_p(logits, make_info(params, vocab_size=vocab))
    for i in range(batch):
        want = filter_reference(logits[i].numpy(), top_ks[i], top_ps[i], min_ps[i])
        assert np.array_equal(torch.isfinite(filtered[i]).numpy(), want), i
        assert torch.equal(filtered[i][want], logits[i][want])  # kept logits untouched


def test_filters_are_a_no_op_when_nobody_uses_them():
    logits = torch.randn(4, 32)
    info = make_info([SamplingParams(temperature=0.5)] * 4, vocab_size=32)
    assert not (info.need_top_k_sampling or info.need_top_p_sampling or info.need_min_p_sampling)
    assert apply_top_k_top_p_min_p(logits, info) is logits


def test_batch_info_tensors():
    params = [
        SamplingParams(temperature=0.0, top_k=3, top_p=0.5),
        SamplingParams(temperature=0.5, top_k=-1),
        SamplingParams(top_k=1000, min_p=0.1),
    ]
    info = make_info(params, seeds=[1, 2, 2**62], vocab_size=100)
    assert info.temperatures.shape == (3, 1) and info.temperatures.dtype == torch.float32
    assert info.temperatures.flatten().tolist() == [1.0, 0.5, 1.0]
    assert info.top_ks.tolist() == [100, 100, 100] and info.top_ks.dtype == torch.int64
    assert info.top_ps.tolist() == [1.0, 1.0, 1.0]
    assert info.min_ps.tolist() == pytest.approx([0.0, 0.0, 0.1])
    assert info.seeds.tolist() == [1, 2, 2**62]
    assert info.greedy_mask.tolist() == [True, False, False]
    assert not info.is_all_greedy and info.need_min_p_sampling
    # The greedy row's top_k and top_p are ignored, so nobody needs the sort.
    assert not info.need_top_k_sampling and not info.need_top_p_sampling
    assert len(info) == 3


def test_batch_info_of_an_empty_batch():
    info = make_info([], seeds=[], vocab_size=10)
    assert len(info) == 0 and info.temperatures.shape == (0, 1) and info.greedy_mask.dtype == torch.bool


@pytest.mark.parametrize("seed", range(6))
def test_selecting_the_top_k_keeps_exactly_what_the_full_sort_keeps(seed, monkeypatch):
    """The CPU's selection of a small top_k against the stable sort of the whole vocabulary, on
    logits with many ties (at the k-th place too), -inf entries (grammar masks), top_p on some
    rows, and rows without filters in the same batch."""
    from sglang.srt.layers import sampler as sampler_module

    generator = torch.Generator().manual_seed(seed)
    vocab, batch = 500, 48
    logits = torch.randint(-4, 4, (batch, vocab), generator=generator).float() / 2
    logits[batch // 2 :] = torch.randn(batch - batch // 2, vocab, generator=generator)  # no ties at all
    logits[torch.rand(batch, vocab, generator=generator) < 0.3] = -torch.inf
    logits[0, :] = -torch.inf  # every token masked
    logits[1, :] = 1.0  # every token tied
    top_ks = torch.randint(1, 40 if seed % 2 else sampler_module.MAX_SELECTED_TOP_K + 1, (batch,), generator=generator)
    top_ps = torch.rand(batch, generator=generator).clamp(min=0.05)
    top_ps[::3] = 1.0
    params = [SamplingParams(top_k=int(k), top_p=float(p)) for k, p in zip(top_ks, top_ps)]
    params[5:8] = [SamplingParams(temperature=0.7)] * 3  # no filter in a filtered batch
    info = make_info(params, vocab_size=vocab)
    selected = apply_top_k_top_p_min_p(logits, info)
    monkeypatch.setattr(sampler_module, "MAX_SELECTED_TOP_K", 0)  # the full sort
    assert torch.equal(selected, apply_top_k_top_p_min_p(logits, info))
