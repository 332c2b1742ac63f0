"""The bounds one request must keep before the engine does any work for it: how many sequences it
fans out to, its stop list, and a prompt too long to be worth tokenizing. Each refusal is an
InvalidRequest naming the field and the flag that sets the limit (docs/http_api.md, "Limits")."""

from __future__ import annotations

from typing import Optional

from sglang.srt.errors import InvalidRequest
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs


def longest_token_chars(tokenizer) -> int:
    """The most characters one token's text can have: the longest vocabulary entry (byte-level
    entries spell one character per byte, so they count bytes, which is at least the characters)."""
    vocab = tokenizer.get_vocab()
    return max((len(piece) for piece in vocab), default=1) + 1


class RequestLimits:
    def __init__(self, server_args: ServerArgs, context_len: int, max_running_requests: int, token_chars: int):
        self.max_sequences = server_args.max_sequences_per_request
        self.max_sequences_flag = "--max-sequences-per-request"
        if server_args.max_queued_requests is not None:  # what the server can hold at once
            capacity = max_running_requests + server_args.max_queued_requests
            if capacity < self.max_sequences:
                self.max_sequences, self.max_sequences_flag = capacity, "--max-running-requests + --max-queued-requests"
        self.max_stop_strings = server_args.max_stop_strings
        self.max_stop_str_len = server_args.max_stop_str_len
        # A prompt of more characters than this has more tokens than the context holds, so it is
        # refused without being tokenized (tokenizing megabytes takes seconds).
        self.max_prompt_chars = context_len * token_chars
        self.context_len = context_len

    def check_sequences(self, num_prompts: int, n: int, num_sequences: Optional[int] = None) -> None:
        total = num_prompts * n if num_sequences is None else num_sequences
        if total <= self.max_sequences:
            return
        field = "n" if n > 1 else "text"
        raise InvalidRequest(
            f"this request asks for {total} sequences ({num_prompts} prompt(s) x n); the server "
            f"takes at most {self.max_sequences} per request ({self.max_sequences_flag})",
            field,
        )

    def check_stop(self, params: SamplingParams) -> None:
        stops = params.stop or []
        if len(stops) > self.max_stop_strings:
            raise InvalidRequest(
                f"stop has {len(stops)} strings; the server takes at most {self.max_stop_strings} (--max-stop-strings)",
                "stop",
            )
        for stop in stops:
            if len(stop) > self.max_stop_str_len:
                raise InvalidRequest(
                    f"a stop string has {len(stop)} characters; the server takes at most "
                    f"{self.max_stop_str_len} (--max-stop-str-len)",
                    "stop",
                )

    def check_prompt_chars(self, num_chars: int, field: str = "text") -> None:
        if num_chars > self.max_prompt_chars:
            raise InvalidRequest(
                f"the prompt has {num_chars} characters, more tokens than the context length "
                f"({self.context_len}) allows",
                field,
            )


def unservable_reason(req, context_len: int, max_total_tokens: int, vocab_size: int) -> Optional[str]:
    """Why the scheduler cannot serve this tokenized request, or None. The tokenizer manager checks
    these too; the scheduler does not trust its inputs (an Engine or a replica may send them)."""
    prompt_len, max_new = len(req.origin_input_ids), req.sampling_params.max_new_tokens
    if prompt_len == 0:
        return "the prompt is empty"
    if prompt_len + max_new > context_len:
        return f"prompt ({prompt_len} tokens) + max_new_tokens ({max_new}) exceeds the context length ({context_len})"
    if prompt_len + max_new > max_total_tokens:
        return (
            f"prompt ({prompt_len} tokens) + max_new_tokens ({max_new}) needs more KV slots than "
            f"the pool holds ({max_total_tokens}); raise --max-total-tokens"
        )
    if max(req.origin_input_ids) >= vocab_size or min(req.origin_input_ids) < 0:
        return f"input_ids must be in [0, {vocab_size})"
    if req.logprob_start_len >= prompt_len:
        return f"logprob_start_len ({req.logprob_start_len}) must be smaller than the prompt ({prompt_len} tokens)"
    return None
