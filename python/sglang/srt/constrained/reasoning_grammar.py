"""A grammar that starts after the reasoning block: ReasoningGrammar lets every token through while
the model thinks and hands the output to the request's matcher once the block's end tag is written.
It has the matcher's interface (fill, accept, terminated, rollback), so plain steps and speculative
steps (spec_grammar.py walks drafts ahead and rolls them back) use it as they use any matcher."""

from __future__ import annotations

import dataclasses
import enum
from typing import Optional

from sglang.srt.reasoning_parser import REASONING_FORMATS


class ReasoningPhase(enum.Enum):
    OPENING = "opening"  # the first token: it may open a block (the start tag) or begin the answer
    THINKING = "thinking"  # inside the block: nothing is constrained
    ANSWERING = "answering"  # after it: the grammar constrains every token

    def is_free(self) -> bool:
        return self is ReasoningPhase.THINKING


@dataclasses.dataclass(frozen=True)
class ThinkTokens:
    """The reasoning tags of a --reasoning-parser as the tokenizer writes them."""

    end_ids: tuple[int, ...]  # the end tag's tokens (one id for models that made it a token)
    start_id: Optional[int]  # the start tag's token, for formats where the output may open a block
    starts_inside: bool

    @classmethod
    def of(cls, tokenizer, parser: str) -> "ThinkTokens":
        fmt = REASONING_FORMATS[parser]
        start = tokenizer.encode(fmt.start, add_special_tokens=False)
        # An output may open a block only through a one-token start tag; with a longer one the
        # request is taken to think, as if the template had opened the block.
        return cls(
            tuple(tokenizer.encode(fmt.end, add_special_tokens=False)),
            start[0] if len(start) == 1 and not fmt.starts_inside else None,
            fmt.starts_inside or len(start) != 1,
        )


class ReasoningGrammar:
    def __init__(self, grammar, tokens: ThinkTokens):
        self.grammar = grammar  # the request's matcher, used from the end of the block on
        self.tokens = tokens
        self.phase = ReasoningPhase.THINKING if tokens.starts_inside else ReasoningPhase.OPENING
        self.matched = 0  # tokens of the end tag at the end of the block so far
        self.history: list[
            tuple[ReasoningPhase, int]
        ] = []  # (phase, matched) before each token the grammar did not take
        self.num_grammar_tokens = 0  # tokens the grammar took
        self.answer_from: Optional[ReasoningPhase] = None  # OPENING when the first token began the answer

    # ---- what bitmask.fill_masks reads ------------------------------------------------------

    @property
    def thinking(self) -> bool:
        """Every token is allowed now."""
        return self.phase.is_free()

    @property
    def matcher(self):
        """The xgrammar matcher under the wrappers (filled in a batch, then finish_row)."""
        return getattr(self.grammar, "matcher", self.grammar)

    def finish_row(self, bitmask, row: int) -> None:
        finish = getattr(self.grammar, "finish_row", None)
        if finish is not None:
            finish(bitmask, row)
        if self.phase is ReasoningPhase.OPENING:
            word, bit = divmod(self.tokens.start_id, 32)
            bitmask[row, word] |= _bit(bit)

    # ---- the matcher's interface ------------------------------------------------------------

    def fill_next_token_bitmask(self, bitmask, row: int) -> None:
        if self.thinking:
            bitmask[row] = -1  # all ones
            return
        self.grammar.fill_next_token_bitmask(bitmask, row)
        if self.phase is ReasoningPhase.OPENING:
            word, bit = divmod(self.tokens.start_id, 32)
            bitmask[row, word] |= _bit(bit)

    def accept_token(self, token_id: int) -> bool:
        if self.phase is ReasoningPhase.ANSWERING:
            return self._grammar_accept(token_id)
        if self.phase is ReasoningPhase.OPENING:
            if token_id == self.tokens.start_id:
                self._step(ReasoningPhase.THINKING, 0)
                return True
            if not self.grammar.accept_token(token_id):
                return False
            self.answer_from, self.phase, self.num_grammar_tokens = ReasoningPhase.OPENING, ReasoningPhase.ANSWERING, 1
            return True
        end = self.tokens.end_ids
        matched = self.matched + 1 if token_id == end[self.matched] else int(token_id == end[0])
        self._step(ReasoningPhase.ANSWERING if matched == len(end) else ReasoningPhase.THINKING, matched)
        return True

    def is_terminated(self) -> bool:
        return self.phase is ReasoningPhase.ANSWERING and self.grammar.is_terminated()

    def rollback(self, num_tokens: int) -> None:
        undone = min(num_tokens, self.num_grammar_tokens)
        if undone:
            self.grammar.rollback(undone)
            self.num_grammar_tokens -= undone
            if self.num_grammar_tokens == 0 and self.answer_from is not None:
                self.phase, self.answer_from = self.answer_from, None
        for _ in range(num_tokens - undone):
            self.phase, self.matched = self.history.pop()

    def _step(self, phase: ReasoningPhase, matched: int) -> None:
        self.history.append((self.phase, self.matched))
        self.phase, self.matched = phase, matched

    def _grammar_accept(self, token_id: int) -> bool:
        if not self.grammar.accept_token(token_id):
            return False
        self.num_grammar_tokens += 1
        return True


def _bit(bit: int) -> int:
    """Bit `bit` of an int32 word, as a signed value (bit 31 is the sign)."""
    return (1 << bit) - (1 << 32) if bit == 31 else 1 << bit
