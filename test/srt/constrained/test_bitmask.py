"""Token masks: the torch unpacking of xgrammar's bitmasks agrees with xgrammar's own CPU kernel,
masks are filled per row (unconstrained rows allow everything), and the sampler under a mask is
exact: greedy takes the best allowed token, and sampling draws from the renormalised allowed
distribution (chi-square on a tiny vocabulary)."""

from __future__ import annotations

import numpy as np
import scipy.stats
import torch
import xgrammar

from sglang.srt.constrained.bitmask import allowed_tokens, apply_token_mask, fill_masks
from sglang.srt.layers.sampler import Sampler
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
from sglang.srt.sampling.sampling_params import SamplingParams

VOCAB = 8
LOGITS = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, 0.8])


def bitmask_of(allowed: list[list[bool]]) -> torch.Tensor:
    words = []
    for row in allowed:
        bits = sum(1 << i for i, ok in enumerate(row) if ok)
        words.append([bits - (1 << 32) if bits >= 1 << 31 else bits])
    return torch.tensor(words, dtype=torch.int32)


def test_unpacked_masks_agree_with_xgrammar_on_the_cpu():
    vocab = 70  # three words, the last one partly used
    generator = torch.Generator().manual_seed(0)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (4, 3), dtype=torch.int32, generator=generator)
    logits = torch.randn(4, vocab, generator=generator)
    reference = logits.clone()
    xgrammar.apply_token_bitmask_inplace(reference, bitmask, backend="cpu")
    assert torch.equal(apply_token_mask(logits, allowed_tokens(bitmask, vocab)), reference)
    assert apply_token_mask(logits, None) is logits


class _Matcher:
    """Stands in for a grammar matcher in the mask-filling loop: allows the tokens it is given."""

    def __init__(self, allowed: list[int], terminated: bool = False):
        self.allowed, self.terminated = allowed, terminated

    def is_terminated(self) -> bool:
        return self.terminated

    def fill_next_token_bitmask(self, bitmask, row):
        bitmask[row] = bitmask_of([[i in self.allowed for i in range(VOCAB)]])[0]


def test_rows_without_a_grammar_allow_every_token():
    assert fill_masks([None, None], VOCAB) is None
    masks = allowed_tokens(fill_masks([None, _Matcher([1, 3]), _Matcher([2], terminated=True)], VOCAB), VOCAB)
    assert masks[0].all() and masks[2].all()
    assert masks[1].nonzero().flatten().tolist() == [1, 3]


def test_greedy_and_sampling_are_exact_under_a_mask():
    allowed = torch.tensor([False, True, False, True, True, False, True, False])
    params = [SamplingParams(temperature=0), SamplingParams(temperature=0.7, top_k=3)]
    sampler, draws = Sampler(), 20_000
    logits = apply_token_mask(LOGITS.expand(draws, -1), allowed.expand(draws, -1))
    info = SamplingBatchInfo.from_params([params[1]] * draws, [5] * draws, VOCAB, "cpu")
    tokens = sampler(logits, info, torch.arange(draws)).numpy()
    greedy = sampler(
        logits[:1], SamplingBatchInfo.from_params(params[:1], [0], VOCAB, "cpu"), torch.zeros(1, dtype=torch.long)
    )
    assert greedy.item() == 1  # the best allowed token, not the best token (0)
    # The top 3 of the allowed tokens 1, 3, 4, 6 (logits 1.5, 0.5, 0.0, -1.0): 1, 3 and 4.
    expected = torch.softmax(torch.tensor([1.5, 0.5, 0.0], dtype=torch.float64) / 0.7, dim=0).numpy()
    counts = np.bincount(tokens, minlength=VOCAB)
    assert counts[[0, 2, 5, 6, 7]].sum() == 0
    assert scipy.stats.chisquare(counts[[1, 3, 4]], expected * counts[[1, 3, 4]].sum()).pvalue > 1e-3
