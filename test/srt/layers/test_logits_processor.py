"""LogitsProcessor's prompt scoring (score_tokens): the log-softmax of the raw logits at the rows
asked for, computed a bounded piece of rows at a time, equal to scoring every row at once."""

from __future__ import annotations

import torch
from torch import nn

from sglang.srt.layers import logits_processor
from sglang.srt.layers.logits_processor import score_tokens


class CountingHead(nn.Module):
    """An lm_head whose logits calls are recorded (the rows each one scores)."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.rows_per_call: list[int] = []

    def gather_logits(self, logits: torch.Tensor) -> torch.Tensor:
        self.rows_per_call.append(logits.shape[0])
        return logits


def test_rows_are_scored_in_bounded_pieces_equal_to_one_log_softmax(monkeypatch):
    gen = torch.Generator().manual_seed(0)
    vocab, hidden_size = 50, 16
    head = CountingHead(torch.randn(vocab, hidden_size, generator=gen))
    hidden = torch.randn(40, hidden_size, generator=gen)
    rows = torch.tensor([3, 4, 5, 6, 7, 20, 21, 22, 30, 31, 39])
    targets = torch.randint(0, vocab, (len(rows),), generator=gen)
    monkeypatch.setattr(logits_processor, "SCORE_MAX_ELEMENTS", 4 * vocab)  # four rows a piece
    token, top, top_ids = score_tokens(hidden, head, rows, targets, top_n=3)
    assert head.rows_per_call == [4, 4, 3], "never more rows at once than the bound"
    expected = torch.log_softmax(hidden[rows] @ head.weight.T, dim=-1)
    torch.testing.assert_close(token, expected.gather(1, targets[:, None]).squeeze(1))
    values, ids = expected.topk(3, dim=-1)
    torch.testing.assert_close(top, values)
    assert torch.equal(top_ids, ids)
    assert score_tokens(hidden, head, rows, targets, top_n=0)[1:] == (None, None)


def test_the_piece_is_capped_in_rows_whatever_the_vocabulary():
    head = CountingHead(torch.zeros(3, 4))  # so small a vocabulary would allow millions of rows
    rows = torch.arange(logits_processor.SCORE_MAX_ROWS + 5)
    score_tokens(torch.zeros(len(rows), 4), head, rows, torch.zeros(len(rows), dtype=torch.int64), top_n=0)
    assert head.rows_per_call == [logits_processor.SCORE_MAX_ROWS, 5]
