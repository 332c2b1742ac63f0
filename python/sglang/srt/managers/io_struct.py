"""Messages between the processes (tokenizer manager <-> scheduler <-> detokenizer).

A leaf module: every process imports it, it imports nothing of theirs.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Union

from sglang.srt.sampling.sampling_params import SamplingParams


@dataclasses.dataclass
class GenerateReqInput:
    """A native generate request: one prompt, or a batch when `text` / `input_ids` is a list."""

    text: Optional[Union[str, list[str]]] = None
    input_ids: Optional[Union[list[int], list[list[int]]]] = None
    sampling_params: Optional[Union[dict, list[dict]]] = None
    rid: Optional[Union[str, list[str]]] = None
    stream: bool = False
    # Log-probabilities of the output tokens (from the raw logits), and the top N alternatives.
    return_logprob: Union[bool, list[bool]] = False
    top_logprobs_num: Union[int, list[int]] = 0
    # With return_logprob, also those of the prompt tokens from this position on (-1: none).
    logprob_start_len: Union[int, list[int]] = -1
    # The client request this belongs to, when a front end splits one into several (an OpenAI
    # stream runs one per choice): admission shares the server fairly between such groups.
    group: Optional[str] = None
    # The output starts with reasoning (a chat request under --reasoning-parser that thinks): a
    # constraint (json_schema, regex, ebnf) applies from the end of the reasoning block on.
    require_reasoning: bool = False

    def is_batch(self) -> bool:
        if self.text is not None:
            return isinstance(self.text, list)
        return bool(self.input_ids) and isinstance(self.input_ids[0], list)


@dataclasses.dataclass
class TokenizedGenerateReqInput:
    rid: str
    input_ids: list[int]
    sampling_params: SamplingParams
    stream: bool
    return_logprob: bool = False
    top_logprobs_num: int = 0
    group: str = ""  # the client request it came from (every prompt and sample of it); see GenerateReqInput
    logprob_start_len: int = -1  # with return_logprob: prompt logprobs from this position (-1: none)
    sample_of: str = ""  # one of the n > 1 samples (rid-0, rid-1, ...) of the request the client named rid
    require_reasoning: bool = False  # see GenerateReqInput


@dataclasses.dataclass
class AbortReq:
    rid: str


@dataclasses.dataclass(frozen=True)
class RequestConstants:
    """What stays the same for a request's whole life: it travels with the request's first output
    message only, not with every step's tokens."""

    # How the detokenizer turns the ids into text.
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    stop_strs: tuple[str, ...] = ()  # text that may start one of these is held back
    # What the tokenizer manager reports.
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens served from the cache at the first admission
    # Wall-clock times (time.time()) of the first prefill admission and the first output token.
    admit_time: Optional[float] = None
    first_token_time: Optional[float] = None


@dataclasses.dataclass
class BatchTokenIDOut:
    """Scheduler -> detokenizer: new token ids of the requests that have something to report."""

    rids: list[str]
    new_token_ids: list[list[int]]  # tokens produced since the last message for that request
    finished_reasons: list[Optional[dict]]
    # Per request: its RequestConstants in the first message about it, None afterwards.
    constants: list[Optional[RequestConstants]]
    completion_tokens: list[int]
    # Per request, for the new tokens: [(logprob, token_id)] and [[(logprob, token_id)] * top N]; None without logprobs.
    new_token_logprobs: list[Optional[list[tuple[float, int]]]]
    new_top_logprobs: list[Optional[list[list[tuple[float, int]]]]]
    # With speculative decoding: verify steps each request took so far; None without.
    spec_verify_ct: Optional[list[int]] = None
    # Prompt logprobs, once per request, in the first message after its prompt was scored: per
    # prompt position from its logprob_start_len, (logprob, token_id) (logprob None at position
    # 0), and the top N alternatives (None at position 0; the whole list None without top N).
    # None per request without them, and the field None when no request of the message has any.
    input_token_logprobs: Optional[list[Optional[list[tuple[Optional[float], int]]]]] = None
    input_top_logprobs: Optional[list[Optional[list[Optional[list[tuple[float, int]]]]]]] = None


@dataclasses.dataclass
class BatchStrOut:
    """Detokenizer -> tokenizer manager: new text and ids, and the final state when finished."""

    rids: list[str]
    new_texts: list[str]
    new_token_ids: list[list[int]]
    finished_reasons: list[Optional[dict]]
    constants: list[Optional[RequestConstants]]  # as in BatchTokenIDOut
    completion_tokens: list[int]
    new_token_logprobs: list[Optional[list[tuple[float, int]]]]
    new_top_logprobs: list[Optional[list[list[tuple[float, int]]]]]
    spec_verify_ct: Optional[list[int]] = None
    input_token_logprobs: Optional[list] = None  # as in BatchTokenIDOut
    input_top_logprobs: Optional[list] = None


@dataclasses.dataclass
class ControlReq:
    """A request to the scheduler answered by a ControlReply with the same `id`:
    `flush_cache` or `get_internal_state`."""

    id: int
    kind: str


@dataclasses.dataclass
class ControlReply:
    id: int
    result: Any


def finish_length(length: int) -> dict:
    return {"type": "length", "length": length}


def finish_matched(matched: Union[int, str]) -> dict:
    return {"type": "stop", "matched": matched}


def finish_abort(message: str, status_code: int = 400, param: Optional[str] = None) -> dict:
    """An abort the engine decided; `param`: the request field at fault, named in the error."""
    reason = {"type": "abort", "message": message, "status_code": status_code}
    return reason if param is None else {**reason, "param": param}
