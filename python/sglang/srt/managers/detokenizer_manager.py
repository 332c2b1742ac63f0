"""Detokenizer process: token ids -> text, incrementally, never splitting a UTF-8 character."""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
from typing import Optional

import zmq

from sglang.srt.gc_pauses import settle_after_startup
from sglang.srt.hf_transformers_utils import get_tokenizer
from sglang.srt.managers.io_struct import BatchStrOut, BatchTokenIDOut, RequestConstants
from sglang.srt.managers.stop_strings import IncrementalText, StopState
from sglang.srt.server_args import PortArgs, ServerArgs
from sglang.srt.utils import configure_logger, name_process

logger = logging.getLogger(__name__)
# Bounds how many queued scheduler steps are merged into one message.
MAX_STEPS_PER_MESSAGE = 64


@dataclasses.dataclass
class DecodeState:
    params: RequestConstants
    text: IncrementalText = dataclasses.field(default_factory=IncrementalText)
    stop: Optional[StopState] = None  # text that may start a stop string is held back
    emitted_len: int = 0  # characters of the text already sent

    @classmethod
    def new(cls, params: Optional[RequestConstants]) -> DecodeState:
        params = params or RequestConstants()
        stops = params.stop_strs if not params.no_stop_trim else ()
        return cls(params, stop=StopState(list(stops)) if stops else None)


class DetokenizerManager:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.states: dict[str, DecodeState] = {}

    def handle(self, out: BatchTokenIDOut) -> BatchStrOut:
        new_texts = []
        for i, rid in enumerate(out.rids):
            state = self.states.get(rid)
            if state is None:
                state = self.states[rid] = DecodeState.new(out.constants[i])
            reason = out.finished_reasons[i]
            if reason is None:
                new_texts.append(self._incremental_text(state, out.new_token_ids[i]))
            else:
                state.text.ids.extend(out.new_token_ids[i])
                new_texts.append(self._final_text(state, reason))
                del self.states[rid]
        return BatchStrOut(
            rids=out.rids,
            new_texts=new_texts,
            new_token_ids=out.new_token_ids,
            finished_reasons=out.finished_reasons,
            constants=out.constants,
            completion_tokens=out.completion_tokens,
            new_token_logprobs=out.new_token_logprobs,
            new_top_logprobs=out.new_top_logprobs,
            spec_verify_ct=out.spec_verify_ct,
            input_token_logprobs=out.input_token_logprobs,
            input_top_logprobs=out.input_top_logprobs,
        )

    def _decode(self, ids: list[int], skip: bool) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip)

    def _incremental_text(self, state: DecodeState, new_ids: list[int]) -> str:
        skip = state.params.skip_special_tokens
        new_text = state.text.extend(new_ids, lambda ids: self._decode(ids, skip))
        held = 0
        if state.stop is not None:
            state.stop.feed(new_text)
            held = state.stop.held_len
        # Text that may be the start of a stop string waits until it is known not to be.
        visible = len(state.text.text) - held
        if visible <= state.emitted_len:
            return ""
        delta = state.text.text[state.emitted_len : visible]
        state.emitted_len = visible
        return delta

    def _final_text(self, state: DecodeState, reason: dict) -> str:
        ids, matched = state.text.ids, reason.get("matched")
        if isinstance(matched, int) and not state.params.no_stop_trim and ids and ids[-1] == matched:
            # A stop token (EOS, stop_token_ids) ends the text without being part of it, as
            # upstream; with skip_special_tokens off an EOS would otherwise show as text.
            ids = ids[:-1]
        full = self._decode(ids, state.params.skip_special_tokens)
        if isinstance(matched, str) and not state.params.no_stop_trim:
            cut = full.find(matched)
            full = full if cut < 0 else full[:cut]
        sent = state.text.text[: state.emitted_len]
        # Decoding in pieces can disagree with decoding at once only in what was held back.
        return full[len(sent) :] if full.startswith(sent) else full[len(_common_prefix(full, sent)) :]


def merge_token_outputs(outs: list[BatchTokenIDOut]) -> BatchTokenIDOut:
    """Consecutive scheduler steps as one: per request (in order of first appearance) its new
    ids and logprobs joined, its latest counts, times and finish reason."""
    if len(outs) == 1:
        return outs[0]
    parts: dict[str, list[tuple[BatchTokenIDOut, int]]] = {}
    for out in outs:
        for i, rid in enumerate(out.rids):
            parts.setdefault(rid, []).append((out, i))
    rids = list(parts)
    last = [parts[rid][-1] for rid in rids]

    def joined(field: str) -> list:
        merged = []
        for rid in rids:
            pieces = [getattr(out, field)[i] for out, i in parts[rid]]
            merged.append(None if pieces[-1] is None else [x for piece in pieces for x in piece])
        return merged

    def latest(field: str) -> list:
        return [getattr(out, field)[i] for out, i in last]

    def first_given(field: str) -> Optional[list]:  # None for a field no message carries
        if all(getattr(out, field) is None for out in outs):
            return None
        return [
            next(
                (
                    getattr(out, field)[i]
                    for out, i in parts[rid]
                    if getattr(out, field) is not None and getattr(out, field)[i] is not None
                ),
                None,
            )
            for rid in rids
        ]

    return BatchTokenIDOut(
        rids=rids,
        new_token_ids=joined("new_token_ids"),
        finished_reasons=latest("finished_reasons"),
        constants=first_given("constants"),
        completion_tokens=latest("completion_tokens"),
        new_token_logprobs=joined("new_token_logprobs"),
        new_top_logprobs=joined("new_top_logprobs"),
        spec_verify_ct=None if outs[-1].spec_verify_ct is None else latest("spec_verify_ct"),
        input_token_logprobs=first_given("input_token_logprobs"),
        input_top_logprobs=first_given("input_top_logprobs"),
    )


def _common_prefix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def run_detokenizer_process(server_args: ServerArgs, port_args: PortArgs, tokenizer=None) -> None:
    """tokenizer: the one the launching process loaded, or None to load it here."""
    configure_logger(server_args.log_level, " Detokenizer")
    name_process("sglang-detok")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent_pid = os.getppid()
    if tokenizer is None:
        tokenizer = get_tokenizer(server_args.tokenizer_path, server_args.tokenizer_mode, server_args.trust_remote_code)
    manager = DetokenizerManager(tokenizer)
    ctx = zmq.Context(2)
    recv = ctx.socket(zmq.PULL)
    recv.bind(port_args.detokenizer_ipc)
    send = ctx.socket(zmq.PUSH)
    send.connect(port_args.tokenizer_ipc)
    settle_after_startup("detokenizer", server_args.gc_warning_threshold_secs)
    while True:
        if not recv.poll(1000):
            if os.getppid() != parent_pid:
                return
            continue
        # Steps queued while the last batch was decoded are decoded as one: a request's new ids
        # are decoded once, not once per step, and the HTTP process gets one message for them.
        outs = [recv.recv_pyobj()]
        while len(outs) < MAX_STEPS_PER_MESSAGE:
            try:
                outs.append(recv.recv_pyobj(zmq.NOBLOCK))
            except zmq.Again:
                break
        send.send_pyobj(manager.handle(merge_token_outputs(outs)))
