"""Grammar masks inside a speculative step. Position j (0 .. k) is masked by each constrained row's
grammar after its output and the drafts d_1 .. d_j: the draft proposes d_{j+1} and verification
scores position j under that mask. The matchers walk the drafts on the host and are rolled back
at the end (the scheduler advances them over the accepted tokens). A forbidden draft (only where
no draft-vocabulary token is allowed) ends its row's walk and is rejected by verification."""

from __future__ import annotations

import torch

from sglang.srt.constrained.bitmask import device_mask
from sglang.srt.speculative.spec_sampling import draw_draft, filtered_probs


class GrammarLookahead:
    def __init__(self, matchers: list, vocab_size: int, device):
        self.matchers = matchers  # one per row, None for an unconstrained row
        self.vocab_size, self.device = vocab_size, device
        self.walked = [0] * len(matchers)  # tokens each matcher accepted ahead (rolled back)
        self.live = [m is not None and not m.is_terminated() for m in matchers]
        self.masks: list[torch.Tensor] = []  # bool[bs, vocab] per position, on the device
        self.constrained_rows = torch.tensor([m is not None for m in matchers], device=device)

    def next_mask(self) -> torch.Tensor:
        """bool[bs, vocab]: the allowed tokens at the next position of the walk."""
        live = [m if ok else None for m, ok in zip(self.matchers, self.live)]
        mask = device_mask(live, self.vocab_size, self.device)
        if mask is None:
            mask = torch.ones(len(self.matchers), self.vocab_size, dtype=torch.bool, device=self.device)
        self.masks.append(mask)
        return mask

    def advance(self, tokens: torch.Tensor) -> None:
        """Walks each live matcher over its row's draft (int64[bs]; read on the host)."""
        for row, token in enumerate(tokens.tolist()):
            if self.live[row]:
                matcher = self.matchers[row]
                accepted = matcher.accept_token(token)
                self.walked[row] += accepted
                self.live[row] = accepted and not matcher.is_terminated()

    def verify_mask(self) -> torch.Tensor:
        """bool[bs, k + 1, vocab]: the masks of the step's positions, in order."""
        return torch.stack(self.masks, dim=1)

    def redraw_first_draft(self, kept_logits, draft_to_target, info, offsets, drafts: list, draft_probs: list) -> None:
        """d_1 of the constrained rows drawn again (same random numbers) from the draft's kept
        logits under the first position's mask, in place in `drafts` and `draft_probs`."""
        logits = masked_draft_logits(kept_logits.float(), self.next_mask(), draft_to_target)
        drafts[0] = torch.where(self.constrained_rows, draft_to_target[draw_draft(logits, info, offsets)], drafts[0])
        if draft_probs:
            draft_probs[0] = torch.where(self.constrained_rows[:, None], filtered_probs(logits, info), draft_probs[0])

    def rollback(self) -> None:
        for matcher, walked in zip(self.matchers, self.walked):
            if walked:
                matcher.rollback(walked)
        self.walked = [0] * len(self.matchers)


def draft_mask(target_mask: torch.Tensor, draft_to_target: torch.Tensor) -> torch.Tensor:
    """bool[bs, draft vocab] from a target-vocabulary mask; a row that allows no draft token is left
    unmasked (its draft is rejected by verification)."""
    mask = target_mask[:, draft_to_target]
    return mask | ~mask.any(dim=-1, keepdim=True)


def masked_draft_logits(logits: torch.Tensor, target_mask: torch.Tensor, draft_to_target: torch.Tensor):
    """The draft's logits (draft vocabulary) with the tokens the grammar forbids at -inf."""
    return logits.masked_fill(~draft_mask(target_mask, draft_to_target), float("-inf"))
