"""Output logprobs: a decode or prefill step's logprobs of the sampled tokens (and the top ones a
request asks for), copied to the host once per step and appended to each request's output."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req


class LogprobRows:
    """The step's logprobs (host copies), handed out per request."""

    def __init__(self, host: dict):
        self.token = host["next_token_logprobs"].tolist() if "next_token_logprobs" in host else None
        has_top = "top_logprobs" in host
        self.top = host["top_logprobs"].tolist() if has_top else None
        self.top_ids = host["top_logprob_ids"].tolist() if has_top else None

    def record(self, req: Req, row: int, token_id: int) -> None:
        req.output_token_logprobs.append((self.token[row], token_id))
        if req.top_logprobs_num:
            n = req.top_logprobs_num
            req.output_top_logprobs.append(list(zip(self.top[row][:n], self.top_ids[row][:n])))
