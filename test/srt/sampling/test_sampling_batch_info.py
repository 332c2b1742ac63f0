"""SamplingBatchInfo's logit_bias: a sparse (row, token, bias) list built only for a batch with a
biased request, added at every position of a row (a verify's [bs, k + 1, vocab] too), on a copy."""

import torch

from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
from sglang.srt.sampling.sampling_params import SamplingParams

VOCAB = 8


def info_of(*params: SamplingParams) -> SamplingBatchInfo:
    return SamplingBatchInfo.from_params(list(params), [0] * len(params), VOCAB, "cpu")


def test_batch_without_bias_adds_nothing():
    info = info_of(SamplingParams(temperature=0), SamplingParams(temperature=0, logit_bias={}))
    logits = torch.randn(2, VOCAB)
    assert info.logit_bias_rows is None and info.apply_logit_bias(logits) is logits


def test_bias_lands_on_its_rows_tokens_at_every_position():
    info = info_of(
        SamplingParams(temperature=0, logit_bias={"3": 5.0, "1": -100}),
        SamplingParams(temperature=0),
        SamplingParams(temperature=0.7, logit_bias={6: 2}),
    )
    expected_bias = torch.zeros(3, VOCAB)
    expected_bias[0, 3], expected_bias[0, 1], expected_bias[2, 6] = 5.0, -100.0, 2.0
    logits = torch.randn(3, VOCAB)
    raw = logits.clone()
    assert torch.equal(info.apply_logit_bias(logits), raw + expected_bias)
    assert torch.equal(logits, raw)  # the raw logits still give logprobs
    verify_logits = torch.randn(3, 4, VOCAB)
    assert torch.equal(info.apply_logit_bias(verify_logits), verify_logits + expected_bias[:, None])
    # A biased all-greedy batch does not take the shared neutral tensors of its size.
    assert info_of(SamplingParams(temperature=0)).logit_bias_rows is None
