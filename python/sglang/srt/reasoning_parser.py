"""`--reasoning-parser`: where a thinking model's reasoning block sits in its output, so that the
chat API returns it as `reasoning_content` apart from the answer, whole or while it streams. A leaf
module: the chat endpoint splits text with it, the grammar backend reads its tags."""

from __future__ import annotations

import dataclasses
from typing import Optional


@dataclasses.dataclass(frozen=True)
class ReasoningFormat:
    start: str  # the tag that opens the block
    end: str  # the tag that closes it
    # The chat template opens the block in the prompt (DeepSeek-R1 and its distills, QwQ), so the
    # output starts inside it, with or without a start tag of its own; otherwise (Qwen3) there is a
    # block only when the output opens with the start tag.
    starts_inside: bool


# Upstream SGLang's parser names (server_args.REASONING_PARSER_CHOICES lists the same).
REASONING_FORMATS = {
    "deepseek-r1": ReasoningFormat("<think>", "</think>", starts_inside=True),
    "qwen3": ReasoningFormat("<think>", "</think>", starts_inside=False),
}


def request_thinks(parser: Optional[str], chat_template_kwargs: Optional[dict]) -> bool:
    """Whether a chat request's output may hold a reasoning block: always under a parser, except
    for Qwen3 asked not to think (`chat_template_kwargs: {"enable_thinking": false}`)."""
    if parser is None:
        return False
    return not (parser == "qwen3" and (chat_template_kwargs or {}).get("enable_thinking", True) is False)


@dataclasses.dataclass(frozen=True)
class ReasoningSplit:
    reasoning: str  # the block's text without its tags, trimmed ("" when there is none)
    block_end: int  # output characters [0, block_end) are the block as written (tags included)
    answer_at: Optional[int]  # where the answer starts (past the block and the blank after it); None: not yet

    def answer(self, text: str) -> str:
        return "" if self.answer_at is None else text[self.answer_at :]


def split_reasoning(text: str, fmt: ReasoningFormat, final: bool = True) -> ReasoningSplit:
    """The output split into its reasoning block and its answer. While it streams (`final` False),
    text that may still turn out to be a tag is held back, so every field only grows as the output
    does and the last split equals the whole output's."""
    lead = len(text) - len(text.lstrip())
    opening = text[lead:]
    if not final and fmt.start.startswith(opening) and opening != fmt.start:
        return ReasoningSplit("", 0, None)  # nothing yet, or the start tag half written
    if opening.startswith(fmt.start):
        body_at = lead + len(fmt.start)
    elif fmt.starts_inside:
        body_at = 0
    else:
        return ReasoningSplit("", 0, 0)  # no block: all of it is the answer
    end_at = text.find(fmt.end, body_at)
    if end_at < 0:
        visible = len(text) if final else len(text) - _partial_suffix_len(text, fmt.end)
        return ReasoningSplit(text[body_at:visible].strip(), visible, None)
    closed_at = end_at + len(fmt.end)
    answer_at = len(text) - len(text[closed_at:].lstrip())
    return ReasoningSplit(text[body_at:end_at].strip(), answer_at, answer_at)


def _partial_suffix_len(text: str, tag: str) -> int:
    """How many trailing characters are a proper prefix of the tag."""
    return max((n for n in range(1, len(tag)) if text.endswith(tag[:n])), default=0)


@dataclasses.dataclass
class ReasoningStream:
    """One streamed choice: what of its reasoning, its block as written and its answer has gone out."""

    fmt: ReasoningFormat
    reasoning_sent: int = 0
    block_sent: int = 0
    answer_sent: int = 0

    def update(self, text: str, final: bool) -> StreamUpdate:
        """What the output so far adds; `final`: the output is complete."""
        split = split_reasoning(text, self.fmt, final)
        answer = split.answer(text)
        update = StreamUpdate(
            split.reasoning[self.reasoning_sent :],
            text[self.block_sent : split.block_end],
            answer[self.answer_sent :],
            answer,
        )
        self.reasoning_sent = max(self.reasoning_sent, len(split.reasoning))
        self.block_sent = max(self.block_sent, split.block_end)
        self.answer_sent = max(self.answer_sent, len(answer))
        return update


@dataclasses.dataclass(frozen=True)
class StreamUpdate:
    reasoning: str  # new reasoning (trimmed, without tags)
    block: str  # new characters of the block as written (tags included)
    answer: str  # new characters of the answer
    answer_so_far: str
