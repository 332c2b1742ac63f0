"""Token masks: xgrammar fills int32 bitmasks on the host (bit j of word w allows token 32 w + j);
the sampler applies them on any device with plain torch ops."""

from __future__ import annotations

import os
from typing import Optional, Sequence

import torch

# Constrained rows from which a step's masks are filled on several threads (each fill of a JSON
# grammar costs tens of microseconds of host time).
BATCH_FILL_ROWS = 4
_BATCH_FILLER = None  # xgrammar.BatchGrammarMatcher, made on first use


def allowed_tokens(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """bool[..., vocab_size] from an int32[..., ceil(vocab / 32)] bitmask (on its device)."""
    bits = torch.bitwise_left_shift(
        torch.ones(32, dtype=torch.int32, device=bitmask.device),
        torch.arange(32, dtype=torch.int32, device=bitmask.device),
    )
    words = bitmask[..., None] & bits
    return (words != 0).flatten(-2)[..., :vocab_size]


def apply_token_mask(logits: torch.Tensor, allowed: Optional[torch.Tensor]) -> torch.Tensor:
    """Logits with every forbidden token at -inf (a new tensor); `allowed` None: unchanged."""
    if allowed is None:
        return logits
    return logits.masked_fill(~allowed, float("-inf"))


def fill_masks(matchers: Sequence, vocab_size: int) -> Optional[torch.Tensor]:
    """int32[len(matchers), words] host bitmask: each row the next-token mask of its matcher, all
    ones for a row without one (None) or whose matcher has terminated. None if no row has one.
    From BATCH_FILL_ROWS constrained rows on, xgrammar fills them on several threads."""
    rows = [i for i, m in enumerate(matchers) if _constrains(m)]
    if all(m is None for m in matchers):
        return None
    import xgrammar

    bitmask = xgrammar.allocate_token_bitmask(len(matchers), vocab_size)  # all ones
    if len(rows) < BATCH_FILL_ROWS:
        for row in rows:
            matchers[row].fill_next_token_bitmask(bitmask, row)
        return bitmask
    global _BATCH_FILLER
    if _BATCH_FILLER is None:
        _BATCH_FILLER = xgrammar.BatchGrammarMatcher(max_threads=min(8, os.cpu_count() or 1))
    # A wrapper (JsonMatcher, ReasoningGrammar) holds the xgrammar matcher and finishes its row afterwards.
    _BATCH_FILLER.batch_fill_next_token_bitmask(
        [getattr(matchers[r], "matcher", matchers[r]) for r in rows], bitmask, indices=rows
    )
    for row in rows:
        finish = getattr(matchers[row], "finish_row", None)
        if finish is not None:
            finish(bitmask, row)
    return bitmask


def _constrains(matcher) -> bool:
    """Whether the matcher limits the next token: not a row without one, not one whose grammar has
    ended, not one inside a reasoning block (ReasoningGrammar.thinking)."""
    return matcher is not None and not matcher.is_terminated() and not getattr(matcher, "thinking", False)


def device_mask(matchers: Sequence, vocab_size: int, device) -> Optional[torch.Tensor]:
    """bool[len(matchers), vocab] on `device`, or None when no row is constrained."""
    bitmask = fill_masks(matchers, vocab_size)
    if bitmask is None:
        return None
    if torch.device(device).type == "cuda":
        bitmask = bitmask.pin_memory().to(device, non_blocking=True)
    return allowed_tokens(bitmask, vocab_size)
