"""Frequency, presence and repetition penalties: each penalized request's counts of the tokens it
has generated, kept on the device in a pool of rows, and the logits they penalize.

The counts live on the device because with overlap scheduling step N + 1 is launched before the
host has read step N's tokens: each step adds its sampled tokens to the rows right after sampling,
in stream order, so the next step reads counts that include them. A row is taken when a request's
prompt is done (the pass that samples its first kept token) and rebuilt there from its output so
far (a retracted request resumes with the counts of what it already generated); it is given back
when the request finishes, aborts or is retracted. The pool grows by doubling and is dropped when
its last row is given back, so a server without penalized requests holds nothing: a row costs
vocab_size x 4 bytes (float32 counts), and the pool holds at most twice as many rows as penalized
requests have run at once since it was last empty."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Optional

import torch

from sglang.srt.utils import host_to_device, host_to_device_rows

if TYPE_CHECKING:
    from sglang.srt.sampling.sampling_params import SamplingParams

# Rows of the first pool (it doubles from there).
MIN_ROWS = 4
# A verify penalizes at most this many (row, position, token) elements at once: its per-position
# copies of the counts and their temporaries stay near 128 MB each in float32, whatever the batch.
VERIFY_CHUNK_ELEMENTS = 1 << 25


@dataclasses.dataclass
class PenaltyRows:
    """The penalized rows of one batch, on the device; part of its SamplingBatchInfo."""

    batch_rows: Optional[torch.Tensor]  # int64[p] rows of the batch; None when every row is penalized
    count_rows: torch.Tensor  # int64[p] their rows of PenaltyCounts.counts
    frequency: torch.Tensor  # float32[p, 1, 1] (broadcast over positions and the vocabulary)
    presence: torch.Tensor  # float32[p, 1, 1]
    repetition: torch.Tensor  # float32[p, 1, 1]
    ones: torch.Tensor  # float32[p], what a step adds to each row's count of its token

    @classmethod
    def build(cls, params: list[SamplingParams], count_rows: list[Optional[int]], device) -> Optional[PenaltyRows]:
        """`count_rows`: each request's row of the pool, None for a request not penalized in this
        pass (no penalty, or a prompt chunk whose sampled token is dropped). None if no row is."""
        rows = [i for i, row in enumerate(count_rows) if row is not None]
        if not rows:
            return None
        chosen = [params[i] for i in rows]
        batch_rows, counts = host_to_device_rows([rows, [count_rows[i] for i in rows]], device, torch.int64)
        frequency, presence, repetition, ones = host_to_device_rows(
            [
                [p.frequency_penalty for p in chosen],
                [p.presence_penalty for p in chosen],
                [p.repetition_penalty for p in chosen],
                [1.0] * len(rows),
            ],
            device,
            torch.float32,
        )
        every_row = len(rows) == len(params)
        return cls(
            batch_rows=None if every_row else batch_rows,
            count_rows=counts,
            frequency=frequency[:, None, None],
            presence=presence[:, None, None],
            repetition=repetition[:, None, None],
            ones=ones,
        )


def penalize(
    logits: torch.Tensor,
    counts: torch.Tensor,
    frequency: torch.Tensor,
    presence: torch.Tensor,
    repetition: torch.Tensor,
) -> torch.Tensor:
    """float logits [p, positions, vocab] with their penalties: frequency and presence subtracted,
    then repetition's scaling of every token generated before (as upstream SGLang)."""
    seen = counts > 0
    logits = logits - frequency * counts - presence * seen
    scaled = torch.where(logits > 0, logits / repetition, logits * repetition)
    return torch.where(seen, scaled, logits)


class PenaltyCounts:
    """Per request, float32 counts of each token it has generated, on the device; rows only for
    penalized requests. Owned by the model worker (only the rank that samples has one), which
    takes a row when a penalized request's prompt is done and gives it back when it leaves."""

    def __init__(self, vocab_size: int, device):
        self.vocab_size = vocab_size
        self.device = device
        self.counts: Optional[torch.Tensor] = None  # float32[capacity, vocab_size]
        self.free_rows: list[int] = []

    @property
    def rows_in_use(self) -> int:
        return 0 if self.counts is None else self.counts.shape[0] - len(self.free_rows)

    def take(self, outputs: list[list[int]]) -> list[int]:
        """A row for each of len(outputs) requests, holding the counts of its output so far
        (empty for a new request; a retracted one resumes with what it already generated)."""
        self._reserve(len(outputs))
        rows = [self.free_rows.pop() for _ in outputs]
        self.counts.index_fill_(0, host_to_device(rows, self.device), 0.0)
        repeated = [row for row, output in zip(rows, outputs) for _ in output]
        if repeated:
            tokens = [token for output in outputs for token in output]
            count_rows, token_ids = host_to_device_rows([repeated, tokens], self.device, torch.int64)
            self.counts.index_put_(
                (count_rows, token_ids), torch.ones_like(token_ids, dtype=torch.float32), accumulate=True
            )
        return rows

    def give_back(self, row: int) -> None:
        """A request's row is free again (it finished, aborted or was retracted). A step still in
        flight may add its token to the row; the next owner's reset comes after it in stream order."""
        self.free_rows.append(row)
        if self.rows_in_use == 0:
            self.counts, self.free_rows = None, []

    def apply(self, logits: torch.Tensor, rows: Optional[PenaltyRows]) -> torch.Tensor:
        """`logits` ([bs, vocab]) with the penalties of the batch's penalized rows: a new tensor,
        or `logits` itself when no row is penalized (nothing launched)."""
        if rows is None:
            return logits
        no_drafts = torch.empty(logits.shape[0], 0, dtype=torch.int64, device=logits.device)
        return self.apply_verify(logits[:, None, :], no_drafts, rows)[:, 0]

    def apply_verify(self, logits: torch.Tensor, drafts: torch.Tensor, rows: Optional[PenaltyRows]) -> torch.Tensor:
        """A speculative verify's logits ([bs, k + 1, vocab]; position j scores the token after
        the drafts d_1 .. d_j, `drafts` [bs, k] target ids) with each penalized row's penalties at
        every position, counting the drafts before it as generated: what plain decoding would
        penalize had it produced them. A new tensor, or `logits` itself when no row is penalized."""
        if rows is None:
            return logits
        batch_rows = (
            rows.batch_rows if rows.batch_rows is not None else torch.arange(logits.shape[0], device=logits.device)
        )
        width = logits.shape[1]
        result = logits.clone()
        # A few rows at a time: each row's counts are copied per position ([rows, k + 1, vocab]).
        step = max(1, VERIFY_CHUNK_ELEMENTS // (width * logits.shape[2]))
        for start in range(0, batch_rows.shape[0], step):
            part = slice(start, start + step)
            chosen, chosen_drafts = logits[batch_rows[part]], drafts[batch_rows[part]]
            counts = self.counts[rows.count_rows[part]][:, None, :].repeat(1, width, 1)
            row_ids = torch.arange(chosen.shape[0], device=logits.device)[:, None]
            for i in range(chosen_drafts.shape[1]):  # d_{i+1} precedes positions i + 1 .. k
                positions = torch.arange(i + 1, width, device=logits.device)[None, :]
                counts[row_ids, positions, chosen_drafts[:, i : i + 1]] += 1  # one index per (row, position)
            result[batch_rows[part]] = penalize(
                chosen, counts, rows.frequency[part], rows.presence[part], rows.repetition[part]
            ).to(logits.dtype)
        return result

    def count_accepted(self, tokens: torch.Tensor, num_out: torch.Tensor, rows: Optional[PenaltyRows]) -> None:
        """Adds each penalized row's output of a speculative step (`tokens` [bs, k + 1], the first
        `num_out` [bs] of each row kept) to its counts, on the device, in stream order."""
        if rows is None:
            return
        if rows.batch_rows is not None:
            tokens, num_out = tokens[rows.batch_rows], num_out[rows.batch_rows]
        width = tokens.shape[1]
        kept = (torch.arange(width, device=tokens.device)[None, :] < num_out[:, None]).to(torch.float32)
        self.counts.index_put_((rows.count_rows[:, None].expand(-1, width), tokens), kept, accumulate=True)

    def count(self, token_ids: torch.Tensor, rows: Optional[PenaltyRows]) -> None:
        """Adds each penalized row's sampled token (`token_ids`: int64[bs], on the device) to its
        counts, in stream order after the sampling: the next step's `apply` sees it."""
        if rows is None:
            return
        tokens = token_ids if rows.batch_rows is None else token_ids[rows.batch_rows]
        self.counts.index_put_((rows.count_rows, tokens), rows.ones, accumulate=True)

    def _reserve(self, n: int) -> None:
        if len(self.free_rows) >= n:
            return
        old = 0 if self.counts is None else self.counts.shape[0]
        capacity = max(MIN_ROWS, 2 * old, old + n - len(self.free_rows))
        counts = torch.empty(capacity, self.vocab_size, dtype=torch.float32, device=self.device)
        if self.counts is not None:
            counts[:old] = self.counts
        self.counts = counts
        # Lowest rows first (popped from the end).
        self.free_rows = list(range(capacity - 1, old - 1, -1)) + self.free_rows

    def summary(self) -> dict:
        capacity = 0 if self.counts is None else self.counts.shape[0]
        return {"penalty_rows": self.rows_in_use, "penalty_rows_capacity": capacity}
