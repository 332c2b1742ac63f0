"""Turning one generate request's fields into per-prompt lists: `n` samples as n requests,
per-prompt values broadcast, the logprob arguments checked, and prompt logprobs into meta_info
(TokenizerManager)."""

from __future__ import annotations

import dataclasses
import uuid

from sglang.srt.errors import InvalidRequest, short_repr
from sglang.srt.managers.io_struct import TokenizedGenerateReqInput


def expand_n(req: TokenizedGenerateReqInput) -> list[TokenizedGenerateReqInput]:
    """`n` samples of one prompt are n requests; with a seed, sample j uses seed + j."""
    params = req.sampling_params
    if params.n == 1:
        return [req]
    copies = []
    for j in range(params.n):
        seed = None if params.sampling_seed is None else (params.sampling_seed + j) % 2**63
        copy = dataclasses.replace(params, n=1, sampling_seed=seed)
        copies.append(dataclasses.replace(req, rid=f"{req.rid}-{j}", sampling_params=copy, sample_of=req.rid))
    return copies


MAX_TOP_LOGPROBS = 20


def check_logprob_args(return_logprob, top_logprobs_num, logprob_start_len=-1) -> None:
    if not isinstance(return_logprob, bool):
        raise InvalidRequest("return_logprob must be a boolean", "return_logprob")
    if (
        isinstance(top_logprobs_num, bool)
        or not isinstance(top_logprobs_num, int)
        or not 0 <= top_logprobs_num <= MAX_TOP_LOGPROBS
    ):
        raise InvalidRequest(f"top_logprobs_num must be an integer in [0, {MAX_TOP_LOGPROBS}]", "top_logprobs_num")
    if isinstance(logprob_start_len, bool) or not isinstance(logprob_start_len, int) or logprob_start_len < -1:
        raise InvalidRequest(
            "logprob_start_len must be an integer >= 0, or -1 for no prompt logprobs", "logprob_start_len"
        )


def check_logprob_start(logprob_start_len: int, prompt_len: int) -> None:
    """Prompt logprobs start inside the prompt (checked once it is tokenized)."""
    if logprob_start_len >= prompt_len:
        raise InvalidRequest(
            f"logprob_start_len ({logprob_start_len}) must be smaller than the prompt's length ({prompt_len} tokens)",
            "logprob_start_len",
        )


def input_logprobs_meta(token_logprobs: list, top_logprobs) -> dict:
    """meta_info's prompt logprobs, as upstream: `input_token_logprobs` [(logprob, token_id, None)]
    per prompt position (logprob None at position 0), and with top N `input_top_logprobs` (None at
    position 0, else N such triples)."""
    meta = {"input_token_logprobs": [(logprob, token_id, None) for logprob, token_id in token_logprobs]}
    if top_logprobs is not None:
        meta["input_top_logprobs"] = [
            None if top is None else [(logprob, token_id, None) for logprob, token_id in top] for top in top_logprobs
        ]
    return meta


def wants_whole_context(raw) -> bool:
    return isinstance(raw, dict) and "max_new_tokens" in raw and raw["max_new_tokens"] is None


def as_list(value) -> list:
    return value if isinstance(value, list) else [value]


def as_id_lists(input_ids) -> list[list[int]]:
    if not isinstance(input_ids, list):
        raise InvalidRequest("input_ids must be a list of token ids or a list of such lists", "input_ids")
    if input_ids and isinstance(input_ids[0], list):
        return input_ids
    return [input_ids]


def rids_of(rid, n: int) -> list[str]:
    """One rid per prompt: fresh ones, or the client's (a list for a batch of several prompts:
    one string would name them all the same)."""
    if rid is None:
        return [uuid.uuid4().hex for _ in range(n)]
    if isinstance(rid, str) and n > 1:
        raise InvalidRequest(f"rid must be a list of {n} rids, one per prompt, for a batch of {n} prompts", "rid")
    rids = broadcast(rid, n, "rid")
    for one in rids:  # an empty rid could be aborted by nothing but abort_all
        if not isinstance(one, str) or not one:
            raise InvalidRequest(f"rid must be a non-empty string, got {short_repr(one)}", "rid")
    return rids


def broadcast(value, n: int, field: str) -> list:
    if isinstance(value, list):
        if len(value) != n:
            raise InvalidRequest(f"{field} has {len(value)} entries for {n} prompts", field)
        return value
    return [value] * n
