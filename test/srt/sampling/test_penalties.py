"""sampling/penalties.py: PenaltyRows built only for a batch with a penalized row; penalize
against a straightforward per-token reference (OpenAI's frequency / presence, CTRL's repetition
over tokens generated before); the pool of count rows: taken, rebuilt from an output, counted
into, grown, and dropped once the last row is given back."""

from __future__ import annotations

import pytest
import torch

from sglang.srt.sampling import penalties
from sglang.srt.sampling.penalties import MIN_ROWS, PenaltyCounts, PenaltyRows
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
from sglang.srt.sampling.sampling_params import SamplingParams

VOCAB = 8


def reference(logits: list[float], output: list[int], params: SamplingParams) -> list[float]:
    out = []
    for token, logit in enumerate(logits):
        count = output.count(token)
        logit -= params.frequency_penalty * count + params.presence_penalty * (count > 0)
        if count:
            logit = logit / params.repetition_penalty if logit > 0 else logit * params.repetition_penalty
        out.append(logit)
    return out


def test_batch_without_penalties_builds_and_launches_nothing():
    info = SamplingBatchInfo.from_params(
        [SamplingParams(temperature=0), SamplingParams(repetition_penalty=1.0)], [0, 0], VOCAB, "cpu", penalty_rows=None
    )
    assert info.penalties is None
    pool = PenaltyCounts(VOCAB, "cpu")
    logits = torch.randn(2, VOCAB)
    assert pool.apply(logits, None) is logits
    pool.count(torch.tensor([1, 2]), None)
    assert pool.counts is None and pool.summary() == {"penalty_rows": 0, "penalty_rows_capacity": 0}
    # A penalized request in a pass that does not penalize it (a prompt chunk) adds nothing either.
    assert PenaltyRows.build([SamplingParams(presence_penalty=1)], [None], "cpu") is None


def test_penalized_all_greedy_batch_does_not_take_the_shared_neutral_tensors():
    plain = SamplingBatchInfo.from_params([SamplingParams(temperature=0)], [0], VOCAB, "cpu")
    penalized = SamplingBatchInfo.from_params(
        [SamplingParams(temperature=0, presence_penalty=1)], [0], VOCAB, "cpu", penalty_rows=[0]
    )
    assert penalized is not plain and penalized.penalties is not None and plain.penalties is None


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(frequency_penalty=0.7),
        SamplingParams(presence_penalty=-1.5),
        SamplingParams(repetition_penalty=1.8),
        SamplingParams(repetition_penalty=0.4),
        SamplingParams(frequency_penalty=-2, presence_penalty=2, repetition_penalty=1.3),
    ],
)
def test_penalties_match_the_per_token_reference(params):
    outputs = [[3, 3, 5, 0], [], [7, 1, 3]]  # rows 0 and 2 penalized, row 1 not
    pool = PenaltyCounts(VOCAB, "cpu")
    rows = pool.take([outputs[0], outputs[2]])
    batch = [params, SamplingParams(), params]
    info = SamplingBatchInfo.from_params(batch, [0, 0, 0], VOCAB, "cpu", penalty_rows=[rows[0], None, rows[1]])
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(0)) * 3
    raw = logits.clone()
    penalized = pool.apply(logits, info.penalties)
    assert torch.equal(logits, raw), "the raw logits still give logprobs"
    assert torch.equal(penalized[1], raw[1]), "an unpenalized row is untouched"
    for i in (0, 2):
        assert penalized[i].tolist() == pytest.approx(
            reference(raw[i].tolist(), outputs[i], params), rel=1e-6, abs=1e-6
        )  # float32's rounding


def test_counting_after_sampling_penalizes_the_next_step():
    params = SamplingParams(presence_penalty=1.0)
    pool = PenaltyCounts(VOCAB, "cpu")
    rows = pool.take([[], []])
    info = SamplingBatchInfo.from_params([params, params], [0, 0], VOCAB, "cpu", penalty_rows=rows)
    assert info.penalties.batch_rows is None  # every row penalized: no index
    for tokens in ([2, 4], [2, 6], [5, 6]):
        pool.count(torch.tensor(tokens), info.penalties)
    assert pool.counts[rows[0]].tolist() == [0, 0, 2, 0, 0, 1, 0, 0]
    assert pool.counts[rows[1]].tolist() == [0, 0, 0, 0, 1, 0, 2, 0]
    zeros = torch.zeros(2, VOCAB)
    assert pool.apply(zeros, info.penalties)[0].tolist() == [0, 0, -1, 0, 0, -1, 0, 0]


def test_rows_are_rebuilt_reset_grown_and_dropped():
    pool = PenaltyCounts(VOCAB, "cpu")
    first = pool.take([[1, 1, 4]])  # a retracted request resuming: its output so far
    assert pool.counts[first[0]].tolist() == [0, 2, 0, 0, 1, 0, 0, 0]
    more = pool.take([[]] * MIN_ROWS)  # past the first pool: it doubles, keeping the rows in use
    assert pool.summary() == {"penalty_rows": MIN_ROWS + 1, "penalty_rows_capacity": 2 * MIN_ROWS}
    assert pool.counts[first[0]].tolist() == [0, 2, 0, 0, 1, 0, 0, 0]
    assert len(set(first + more)) == MIN_ROWS + 1
    pool.count(
        torch.tensor([3]),
        SamplingBatchInfo.from_params(
            [SamplingParams(presence_penalty=1)], [0], VOCAB, "cpu", penalty_rows=[more[0]]
        ).penalties,
    )
    pool.give_back(more[0])
    again = pool.take([[]])  # a reused row starts from zero
    assert again == [more[0]] and pool.counts[again[0]].sum() == 0
    for row in first + more[1:] + again:
        pool.give_back(row)
    assert pool.counts is None and pool.summary() == {"penalty_rows": 0, "penalty_rows_capacity": 0}


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(frequency_penalty=0.7, presence_penalty=0.3),
        SamplingParams(repetition_penalty=1.8),
        SamplingParams(frequency_penalty=-2, presence_penalty=2, repetition_penalty=0.6),
    ],
)
@pytest.mark.parametrize("chunk", [None, 4 * VOCAB], ids=["one-piece", "row-by-row"])
def test_verify_positions_are_penalized_as_plain_decoding_after_the_drafts_before_them(params, chunk, monkeypatch):
    """Position j of a verify scores the token after drafts d_1 .. d_j: its penalties count them
    as generated (a draft repeated counts twice), so acceptance judges each draft by the
    distribution plain decoding would sample from there; unpenalized rows are untouched."""
    if chunk is not None:
        monkeypatch.setattr(penalties, "VERIFY_CHUNK_ELEMENTS", chunk)
    outputs = [[3, 3, 5], [], [7, 1]]  # rows 0 and 2 penalized
    drafts = torch.tensor([[5, 2, 5], [1, 1, 1], [1, 1, 6]])  # k = 3, target ids
    pool = PenaltyCounts(VOCAB, "cpu")
    rows = pool.take([outputs[0], outputs[2]])
    info = SamplingBatchInfo.from_params(
        [params, SamplingParams(), params], [0] * 3, VOCAB, "cpu", penalty_rows=[rows[0], None, rows[1]]
    )
    logits = torch.randn(3, 4, VOCAB) * 3
    raw = logits.clone()
    penalized = pool.apply_verify(logits, drafts, info.penalties)
    assert torch.equal(logits, raw) and torch.equal(penalized[1], raw[1])
    for i in (0, 2):
        for j in range(4):
            expected = reference(raw[i, j].tolist(), outputs[i] + drafts[i, :j].tolist(), params)
            assert penalized[i, j].tolist() == pytest.approx(expected, abs=1e-5), (i, j)


def test_a_speculative_steps_kept_tokens_are_counted():
    params = SamplingParams(presence_penalty=1.0)
    pool = PenaltyCounts(VOCAB, "cpu")
    rows = pool.take([[0], []])
    info = SamplingBatchInfo.from_params(
        [SamplingParams(), params, params], [0] * 3, VOCAB, "cpu", penalty_rows=[None, *rows]
    )
    tokens = torch.tensor([[7, 7, 7, 7], [2, 2, 4, 6], [3, 5, 5, 1]])
    pool.count_accepted(tokens, torch.tensor([4, 3, 1]), info.penalties)  # row 1 keeps 3, row 2 keeps 1
    assert pool.counts[rows[0]].tolist() == [1, 0, 2, 0, 1, 0, 0, 0]
    assert pool.counts[rows[1]].tolist() == [0, 0, 0, 1, 0, 0, 0, 0]


def test_a_verify_where_every_row_is_penalized():
    params = SamplingParams(presence_penalty=1.0)
    pool = PenaltyCounts(VOCAB, "cpu")
    rows = pool.take([[4], []])
    info = SamplingBatchInfo.from_params([params, params], [0, 0], VOCAB, "cpu", penalty_rows=rows)
    assert info.penalties.batch_rows is None
    penalized = pool.apply_verify(torch.zeros(2, 3, VOCAB), torch.tensor([[2, 2], [6, 1]]), info.penalties)
    assert penalized[0].tolist() == [[0, 0, 0, 0, -1, 0, 0, 0], [0, 0, -1, 0, -1, 0, 0, 0], [0, 0, -1, 0, -1, 0, 0, 0]]
    assert penalized[1].tolist() == [[0] * 8, [0, 0, 0, 0, 0, 0, -1, 0], [0, -1, 0, 0, 0, 0, -1, 0]]
