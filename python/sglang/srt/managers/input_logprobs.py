"""Prompt (input) logprobs, for requests with return_logprob and logprob_start_len >= 0: which
tokens of a prefill pass score a prompt token (the logits at position i give position i + 1's
logprob), and their scores back into each request. The logits processor computes them
(layers/logits_processor.py: score_tokens); a pass where nobody asks pays nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Optional

if TYPE_CHECKING:  # Req's module imports this one
    from sglang.srt.managers.schedule_batch import Req


class Scoring(NamedTuple):
    spans: list[tuple[int, int]]  # per request, its Req.input_logprob_span
    rows: list[int]  # the pass's tokens (indices into its flattened tokens) whose logits score
    targets: list[int]  # the prompt token each of those rows scores (the one after it)
    top_n: int  # alternatives to return per row: the most any scoring request asked for


def scoring_rows(reqs: list[Req]) -> Optional[Scoring]:
    """What a prefill pass of `reqs` (each with its kv_len and extend_len as launched) scores;
    None when no request of it scores a prompt token."""
    if not any(req.scores_prompt for req in reqs):
        return None
    spans, rows, targets, top_n = [], [], [], 0
    first = 0  # the request's first token in the pass
    for req in reqs:
        start, end = span = req.input_logprob_span()
        spans.append(span)
        if end > start:
            rows.extend(range(first + start - req.kv_len, first + end - req.kv_len))
            targets.extend(req.origin_input_ids[start + 1 : end + 1])
            top_n = max(top_n, req.top_logprobs_num)
        first += req.extend_len
    return Scoring(spans, rows, targets, top_n) if rows else None


def record(reqs: list[Req], spans: list[tuple[int, int]], host: dict) -> None:
    """The pass's scores (host copies of GenerationBatchResult's input_* fields) into its requests."""
    token = host["input_token_logprobs"].tolist()
    top = host["input_top_logprobs"].tolist() if "input_top_logprobs" in host else None
    top_ids = host["input_top_logprob_ids"].tolist() if top is not None else None
    row = 0
    for req, (start, end) in zip(reqs, spans):
        if end <= start:
            continue
        rows = range(row, row + end - start)
        row += end - start
        req.input_token_logprobs.extend(zip(token[rows.start : rows.stop], req.origin_input_ids[start + 1 : end + 1]))
        if req.input_top_logprobs is not None:
            n = req.top_logprobs_num
            req.input_top_logprobs.extend(list(zip(top[r][:n], top_ids[r][:n])) for r in rows)
        req.input_logprob_next = end
