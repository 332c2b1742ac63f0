"""Req (one request's state across steps) and ScheduleBatch (the requests of one forward,
turned into a ForwardBatch)."""

from __future__ import annotations

import dataclasses
import itertools
import time
from typing import Optional

import torch

from sglang.srt.managers import input_logprobs
from sglang.srt.managers.io_struct import RequestConstants, finish_length, finish_matched
from sglang.srt.managers.stop_strings import IncrementalText, StopState
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.utils import host_to_device_rows


@dataclasses.dataclass
class DraftFollowing:
    """How the draft follows one request, with a draft model loaded. SpecScheduling
    (managers/spec_scheduling.py) alone writes it: as the request is admitted, as it schedules a
    decode step, and as it sees the step launched (the worker's passes at that launch are fixed by
    the fields as they were, so their effect is written then). The worker and the KV manager read it."""

    # The draft skipped the prompt (admitted while the policy would not speculate, or it opted out),
    # or stopped following the request while plain decoding held: no draft state, it decodes
    # plainly, also inside speculative steps. Set at each admission, by a drop and by an adoption.
    cold: bool = False
    # Admitted with the draft only to refresh an acceptance estimate gone low (set at admission,
    # cleared by an undone admission or a drop).
    explorer: bool = False
    # Admitted without the draft, then adopted by it once speculation paid again: the next decode
    # step's launch first runs the draft over the request's whole context (set when the adoption is
    # decided, cleared as that step launches).
    adopting: bool = False
    # --speculative-draft-sync catch-up: the last positions with target KV but no draft KV yet
    # (decoded by plain steps since the draft last caught up); counted as each plain step launches,
    # zeroed as a speculative step (which catches up first) launches.
    behind: int = 0


class Req:
    def __init__(
        self,
        rid: str,
        input_ids: list[int],
        sampling_params: SamplingParams,
        seed: int,
        stream: bool,
        eos_token_ids: set[int],
        context_len: int,
        return_logprob: bool = False,
        top_logprobs_num: int = 0,
        group: str = "",
        logprob_start_len: int = -1,
    ):
        self.rid = rid  # set by the tokenizer manager
        self.group = group or rid  # the client request it belongs to (admission is fair between them)
        self.origin_input_ids = list(input_ids)
        self.sampling_params = sampling_params
        self.seed = seed
        self.stream = stream
        self.stop_token_ids = set(sampling_params.stop_token_ids or ())
        if not sampling_params.ignore_eos:
            self.stop_token_ids |= eos_token_ids
        self.context_len = context_len
        self.stop_strs: list[str] = list(sampling_params.stop or ())
        # Matching the stop strings as the output's text grows (set up on the first check).
        self.stop_state: Optional[StopState] = None
        self.stop_text: Optional[IncrementalText] = None
        self.constants_sent = False  # its RequestConstants went out with an earlier message
        self.return_logprob = return_logprob
        self.top_logprobs_num = top_logprobs_num if return_logprob else 0
        self.output_ids: list[int] = []
        self.output_token_logprobs: list[tuple[float, int]] = []  # set by the scheduler, one per output
        self.output_top_logprobs: list[list[tuple[float, int]]] = []
        self._init_input_logprobs(logprob_start_len if return_logprob else -1)
        self.finished_reason: Optional[dict] = None
        # KV state, all set by the scheduler (host values).
        self.req_pool_idx: Optional[int] = None  # row of ReqToTokenPool while admitted
        self.kv_len = 0  # positions whose KV is in the pool (row columns [0, kv_len))
        self.cached_len = 0  # leading positions owned by the radix cache (locked), <= kv_len
        self.last_node = None  # radix node locked for the cached prefix
        self.cached_tokens = 0  # prompt tokens served from the cache at first admission
        self.extend_len = 0  # tokens this step's forward adds
        self.sent_len = 0  # output tokens already reported to the detokenizer
        self.num_pending = 0  # tokens sampled by launched steps, not yet appended (overlap)
        # A penalized request's row of the worker's PenaltyCounts (its output's token counts, on
        # the device): set by the worker from the pass that ends its prompt, None again once it
        # leaves the running batch (TpModelWorker.release_request).
        self.penalty_row: Optional[int] = None
        self.admit_time: Optional[float] = None  # wall clock, first admission to a prefill
        self.first_token_time: Optional[float] = None  # wall clock, first output token
        self.to_abort = False
        self.spec_verify_ct = 0  # speculative verify steps this request took
        self.draft = DraftFollowing()  # with a draft model: how the draft follows this request
        # Constrained decoding: the request's xgrammar matcher, at the state after its output so
        # far (set by the scheduler once the grammar is compiled; advanced by append_tokens).
        self.grammar = None
        self.grammar_future = None  # the compile in flight, while the request waits for it
        # The grammar starts after the reasoning block (set by the scheduler from the request).
        self.require_reasoning = False

    def _init_input_logprobs(self, start: int) -> None:
        # Prompt logprobs (managers/input_logprobs.py), with logprob_start_len >= 0: one entry per
        # prompt position from `start` on, (logprob, token id), None for position 0, filled by the
        # scheduler as prefill passes score them. Position i is scored by the logits at position
        # i - 1: `input_logprob_next` is the first position whose logits are still to come (the
        # prompt's last position once all are scored; a retracted request that resumes then
        # scores nothing again). Both lists go out once, and are dropped then.
        self.logprob_start_len = start
        self.input_logprob_next = len(self.origin_input_ids) - 1
        self.input_token_logprobs: Optional[list[tuple[Optional[float], int]]] = None
        self.input_top_logprobs: Optional[list[Optional[list[tuple[float, int]]]]] = None
        if start < 0:
            return
        self.input_logprob_next = max(start, 1) - 1
        self.input_token_logprobs = [(None, self.origin_input_ids[0])] if start == 0 else []
        if self.top_logprobs_num:
            self.input_top_logprobs = [None] if start == 0 else []

    @property
    def scores_prompt(self) -> bool:
        """Whether prompt positions still wait for their logprobs: their logits must be computed,
        so the radix cache may serve only the positions before them."""
        return self.input_logprob_next < len(self.origin_input_ids) - 1

    def input_logprob_span(self) -> tuple[int, int]:
        """[start, end): the positions of this pass's new tokens whose logits score a prompt token
        still waiting for its logprob (the positions before them are cached or already scored)."""
        start = self.input_logprob_next
        return start, max(start, min(len(self.origin_input_ids) - 1, self.kv_len + self.extend_len))

    def take_input_logprobs(self) -> Optional[tuple[list, Optional[list]]]:
        """(token logprobs, top logprobs) of the prompt once every position is scored, for one
        output message; None before, afterwards, or without them."""
        if self.input_token_logprobs is None or self.scores_prompt:
            return None
        taken = self.input_token_logprobs, self.input_top_logprobs
        self.input_token_logprobs = self.input_top_logprobs = None
        return taken

    @property
    def speculates(self) -> bool:
        """Whether the draft proposes tokens for this request (with a draft model loaded)."""
        return not (self.draft.cold or self.sampling_params.disable_speculative_decoding)

    @property
    def all_ids(self) -> list[int]:
        return self.origin_input_ids + self.output_ids

    def token_slice(self, start: int, end: int) -> list[int]:
        """prompt + output tokens [start, end), without building the whole list."""
        prompt_len = len(self.origin_input_ids)
        if end <= prompt_len:
            return self.origin_input_ids[start:end]
        if start >= prompt_len:
            return self.output_ids[start - prompt_len : end - prompt_len]
        return self.origin_input_ids[start:] + self.output_ids[: end - prompt_len]

    @property
    def seq_len(self) -> int:
        return len(self.origin_input_ids) + len(self.output_ids)

    def finished(self) -> bool:
        return self.finished_reason is not None

    def is_prefill_done(self) -> bool:
        """True once every token but the last sampled one has KV (the request decodes next)."""
        return self.kv_len >= self.seq_len - 1 and self.req_pool_idx is not None

    def append_token(self, token_id: int) -> None:
        self.append_tokens((token_id,), 1)

    def append_tokens(self, tokens, n: int) -> int:
        """Appends tokens[:n] in turn, stopping at the one that finishes the request (a stop
        token past min_new_tokens, max_new_tokens, or the context length); returns how many were
        taken. One call for a speculative step's tokens (a batch of 256 appends ~750 a step)."""
        if n <= 0:
            return 0
        out = self.output_ids
        if not out:
            self.first_token_time = time.time()
        params = self.sampling_params
        stop, min_new, max_new = self.stop_token_ids, params.min_new_tokens, params.max_new_tokens
        room = self.context_len - len(self.origin_input_ids)  # outputs at which the context is full
        grammar = self.grammar
        for j in range(n):
            token_id = tokens[j]
            out.append(token_id)
            count = len(out)
            if grammar is not None and grammar.accept_token(token_id) and grammar.is_terminated():
                self.finished_reason = finish_matched(token_id)  # the grammar's stop token
            elif token_id in stop and count > min_new:
                self.finished_reason = finish_matched(token_id)
            elif count >= max_new:
                self.finished_reason = finish_length(max_new)
            elif count >= room:
                self.finished_reason = finish_length(count)
            else:
                continue
            return j + 1
        return n

    def take_constants(self) -> Optional[RequestConstants]:
        """What stays the same for this request, for its first output message only (its
        admission and first token, if any, came before that message)."""
        if self.constants_sent:
            return None
        self.constants_sent = True
        params = self.sampling_params
        return RequestConstants(
            params.skip_special_tokens,
            params.no_stop_trim,
            tuple(self.stop_strs),
            len(self.origin_input_ids),
            self.cached_tokens,
            self.admit_time,
            self.first_token_time,
        )

    def check_stop_strings(self, decode) -> None:
        """Finish if the output's text now contains a stop string (one that ends past
        min_new_tokens). `decode` maps token ids to text; only the new tokens (and a few before
        them) are decoded, and only the new characters go through the stop automaton."""
        if self.finished_reason is not None or not self.stop_strs:
            return
        if self.stop_state is None:
            self.stop_state, self.stop_text = StopState(self.stop_strs), IncrementalText()
        new_text = self.stop_text.extend(self.output_ids[len(self.stop_text.ids) :], decode)
        matched = self.stop_state.feed(new_text)
        if matched is not None and len(self.output_ids) > self.sampling_params.min_new_tokens:
            self.finished_reason = finish_matched(matched)


@dataclasses.dataclass
class ScheduleBatch:
    reqs: list[Req]
    forward_mode: ForwardMode
    # [num_tokens] slots allocated for this step's new tokens, on the device; a speculative
    # worker's decode step has them on the host only (out_cache_loc_host) and copies them itself.
    out_cache_loc: Optional[torch.Tensor]
    # The same slots on the host (int64). A prefill graph stages them with its other inputs; the
    # scheduler frees a speculative step's rejected ones from them.
    out_cache_loc_host: Optional[torch.Tensor] = None
    # DECODE under overlap: this step's input tokens, still on the device (set by the scheduler).
    input_ids_device: Optional[torch.Tensor] = None
    # With a draft model: draft tokens this decode step verifies (0: a plain step); None: the
    # worker's --speculative-num-steps.
    spec_steps: Optional[int] = None
    # With a draft model, DECODE: which requests the draft followed when the step was scheduled.
    speculating: Optional[list[bool]] = None
    # Prompt logprobs: each request's Req.input_logprob_span as launched, or None when the pass
    # scores no prompt token (set by to_forward_batch).
    input_logprob_spans: Optional[list[tuple[int, int]]] = None

    @property
    def batch_size(self) -> int:
        return len(self.reqs)

    @property
    def grammars(self) -> Optional[list]:
        """Each request's grammar matcher (None for an unconstrained one), or None when no
        request of the batch is constrained."""
        matchers = [req.grammar for req in self.reqs]
        return matchers if any(m is not None for m in matchers) else None

    def to_forward_batch(self, device: str) -> tuple[ForwardBatch, torch.Tensor]:
        """Inputs of this step: each request's tokens in [kv_len, kv_len + extend_len), and each
        request's sampling offset (its output position: the random stream of its next token;
        tokens still on their way from an overlapped step count), sent in one copy."""
        if self.forward_mode.is_decode():
            # With overlap the last tokens are still on the device: the previous step's output.
            input_ids = None if self.input_ids_device is not None else [req.output_ids[-1] for req in self.reqs]
            positions = [req.kv_len for req in self.reqs]
        else:
            input_ids, positions = [], []
            for req in self.reqs:
                start, end = req.kv_len, req.kv_len + req.extend_len
                input_ids.extend(req.token_slice(start, end))
                positions.extend(range(start, end))
        prefix_lens = [req.kv_len for req in self.reqs]
        extend_lens = [req.extend_len for req in self.reqs]
        seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens)]
        offsets = [len(req.output_ids) + req.num_pending for req in self.reqs]
        rows = [positions, [req.req_pool_idx for req in self.reqs], seq_lens, offsets]
        extend = not self.forward_mode.is_decode()
        if extend:  # each request's last new token, where the logits are taken
            rows.append(list(itertools.accumulate(extend_lens, initial=-1))[1:])
        scoring = input_logprobs.scoring_rows(self.reqs) if extend else None
        if scoring is not None:  # the tokens whose logits score a prompt token, and those tokens
            self.input_logprob_spans = scoring.spans
            rows += [scoring.rows, scoring.targets]
        if input_ids is not None:
            rows.append(input_ids)
        positions_d, pool_rows_d, seq_lens_d, offsets_d, *more = host_to_device_rows(rows, device)
        last_d = more.pop(0) if extend else None
        scored_d = (more.pop(0), more.pop(0)) if scoring is not None else (None, None)
        fb = ForwardBatch(
            forward_mode=self.forward_mode,
            batch_size=self.batch_size,
            input_ids=more[0] if more else self.input_ids_device,
            positions=positions_d,
            req_pool_indices=pool_rows_d,
            seq_lens=seq_lens_d,
            out_cache_loc=self.out_cache_loc,
            seq_lens_cpu=seq_lens,
            extend_seq_lens_cpu=extend_lens,
            extend_prefix_lens_cpu=prefix_lens,
            last_token_index=last_d,
            input_logprob_rows=scored_d[0],
            input_logprob_targets=scored_d[1],
            input_top_logprobs_num=scoring.top_n if scoring is not None else 0,
        )
        # The host rows, for a graph that stages its inputs from them (None: on the device only).
        fb.input_ids_host, fb.positions_host, fb.req_pool_indices_host = input_ids, positions, rows[1]
        if self.out_cache_loc_host is not None:
            fb.out_cache_loc_host = self.out_cache_loc_host.numpy()
        return fb, offsets_d
