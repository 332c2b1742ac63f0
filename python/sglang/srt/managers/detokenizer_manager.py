"""Detokenizer process: token ids -> text, incrementally, never splitting a UTF-8 character."""

from __future__ import annotations

import dataclasses
import logging
import os
import signal

import zmq

from sglang.srt.hf_transformers_utils import get_tokenizer
from sglang.srt.managers.io_struct import BatchStrOut, BatchTokenIDOut
from sglang.srt.server_args import PortArgs, ServerArgs
from sglang.srt.utils import configure_logger

logger = logging.getLogger(__name__)
# Tokens decoded again before the new ones, so that merges across the boundary come out right.
CONTEXT_TOKENS = 5


@dataclasses.dataclass
class DecodeState:
    ids: list[int] = dataclasses.field(default_factory=list)
    emitted_text: str = ""
    read_offset: int = 0  # tokens whose text has been emitted


class DetokenizerManager:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.states: dict[str, DecodeState] = {}

    def handle(self, out: BatchTokenIDOut) -> BatchStrOut:
        new_texts = []
        for rid, new_ids, reason, skip in zip(out.rids, out.new_token_ids, out.finished_reasons,
                                              out.skip_special_tokens):
            state = self.states.setdefault(rid, DecodeState())
            state.ids.extend(new_ids)
            new_texts.append(self._final_text(state, skip) if reason else self._incremental_text(state, skip))
            if reason:
                del self.states[rid]
        return BatchStrOut(out.rids, new_texts, out.new_token_ids, out.finished_reasons,
                           out.prompt_tokens, out.completion_tokens, out.cached_tokens)

    def _decode(self, ids: list[int], skip: bool) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip)

    def _incremental_text(self, state: DecodeState, skip: bool) -> str:
        context_start = max(0, state.read_offset - CONTEXT_TOKENS)
        before = self._decode(state.ids[context_start : state.read_offset], skip)
        after = self._decode(state.ids[context_start:], skip)
        if after.endswith("\ufffd") or not after.startswith(before):
            return ""  # an incomplete character: wait for the bytes that finish it
        state.read_offset = len(state.ids)
        delta = after[len(before) :]
        state.emitted_text += delta
        return delta

    def _final_text(self, state: DecodeState, skip: bool) -> str:
        full = self._decode(state.ids, skip)
        if full.startswith(state.emitted_text):
            return full[len(state.emitted_text) :]
        # Decoding in pieces disagreed with decoding at once; keep what was sent, add the tail.
        return self._decode(state.ids[state.read_offset :], skip)


def run_detokenizer_process(server_args: ServerArgs, port_args: PortArgs) -> None:
    configure_logger(server_args.log_level, " Detokenizer")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent_pid = os.getppid()
    manager = DetokenizerManager(get_tokenizer(server_args.tokenizer_path))
    ctx = zmq.Context(2)
    recv = ctx.socket(zmq.PULL)
    recv.bind(port_args.detokenizer_ipc)
    send = ctx.socket(zmq.PUSH)
    send.connect(port_args.tokenizer_ipc)
    while True:
        if not recv.poll(1000):
            if os.getppid() != parent_pid:
                return
            continue
        send.send_pyobj(manager.handle(recv.recv_pyobj()))
