"""TokenizerManager: runs in the caller's process (the HTTP server or sglang.Engine).
Tokenizes and validates requests, sends them to the scheduler, and gathers the
detokenizer's output per request."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
import logging
import pickle
import time
from concurrent.futures import ThreadPoolExecutor
from typing import AsyncIterator, Callable, Optional

import zmq
import zmq.asyncio

from sglang.srt import bench_hooks
from sglang.srt.constrained.grammar import CONSTRAINT_FIELDS, check_constraint, constraint_key
from sglang.srt.errors import InvalidRequest, short_repr
from sglang.srt.hf_transformers_utils import get_tokenizer, load_chat_template
from sglang.srt.managers import request_input
from sglang.srt.managers.io_struct import (
    AbortReq,
    BatchStrOut,
    ControlReply,
    ControlReq,
    GenerateReqInput,
    RequestConstants,
    TokenizedGenerateReqInput,
)
from sglang.srt.managers.request_limits import RequestLimits, longest_token_chars
from sglang.srt.managers.request_logger import RequestLogger
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import PortArgs, ServerArgs

logger = logging.getLogger(__name__)
WATCHDOG_INTERVAL_S = 1.0
# Bounds how long the streams wait while queued outputs are read (each message is one step).
MAX_MESSAGES_PER_WAKE = 64
# Prompts up to this many characters in all are tokenized on the event loop (well under a
# millisecond); longer ones on a worker thread. Two threads: one long prompt does not hold up
# the others' tokenization.
INLINE_TOKENIZE_CHARS = 2048
TOKENIZE_THREADS = 2
# A request's grammar (json_schema, regex, ebnf) is parsed before it is queued, to refuse a bad
# one by name. Parsing can take minutes (a pattern "[a-z]{1,30000}" expands to thousands of rules),
# so it runs on its own worker threads (xgrammar releases the GIL), never on the event loop, and a
# grammar not parsed within the time below is refused.
CONSTRAINT_CHECK_THREADS = 2
CONSTRAINT_CHECK_TIMEOUT_S = 10.0


@dataclasses.dataclass
class ReqState:
    created: float  # perf_counter, for e2e latency
    created_wall: float = dataclasses.field(default_factory=time.time)  # to compare with scheduler times
    text: str = ""
    output_ids: list[int] = dataclasses.field(default_factory=list)
    meta: dict = dataclasses.field(default_factory=dict)
    finished: bool = False
    event: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    constants: RequestConstants = dataclasses.field(default_factory=RequestConstants)
    sample_of: str = ""  # TokenizedGenerateReqInput.sample_of
    abandoned: bool = False  # the caller went away; the rid stays taken until the scheduler's last output


class TokenizerManager:
    def __init__(
        self,
        server_args: ServerArgs,
        port_args: PortArgs,
        model_info: dict,
        children_alive: Callable[[], Optional[str]],
        tokenizer=None,
    ):
        self.server_args = server_args
        self.hooks = bench_hooks.from_env()  # benchmark and diagnosis switches, read once
        self.model_info = model_info
        self.context_len = model_info["context_len"]
        self.vocab_size = model_info["vocab_size"]
        # tokenizer: the one the engine loaded while its processes started (loaded here if None)
        self.tokenizer = (
            tokenizer
            if tokenizer is not None
            else get_tokenizer(server_args.tokenizer_path, server_args.tokenizer_mode, server_args.trust_remote_code)
        )
        if server_args.chat_template:  # --chat-template: used for chat whether or not the tokenizer has one
            self.tokenizer.chat_template = load_chat_template(server_args.chat_template)
        self.children_alive = children_alive  # returns why a child died, or None
        self.ctx = zmq.asyncio.Context(2)
        self.send_to_scheduler = self.ctx.socket(zmq.PUSH)
        self.send_to_scheduler.connect(port_args.scheduler_input_ipc)
        self.recv_from_workers = self.ctx.socket(zmq.PULL)
        self.recv_from_workers.bind(port_args.tokenizer_ipc)
        self.recv_queued = zmq.Socket.shadow(self.recv_from_workers.underlying)  # the same socket, not awaited
        self.rid_to_state: dict[str, ReqState] = {}
        # The rids of n > 1 requests in flight -> how many of their samples (rid-0, rid-1, ...) are:
        # such a rid stays taken, since aborting it aborts those samples.
        self.samples_in_flight: dict[str, int] = {}
        self.messages_per_wake = MAX_MESSAGES_PER_WAKE
        if self.hooks.stream_every_step:
            logger.warning(
                "%s=1: streams send every step on its own, even when behind (diagnosis only)",
                bench_hooks.STREAM_EVERY_STEP_ENV,
            )
            self.messages_per_wake = 1
        self.control_waiters: dict[int, asyncio.Future] = {}
        self.control_ids = itertools.count()
        self.dead_reason: Optional[str] = None
        self.handle_loop_task: Optional[asyncio.Task] = None
        self.limits = RequestLimits(
            server_args, self.context_len, model_info["max_running_requests"], longest_token_chars(self.tokenizer)
        )
        self.tokenize_pool = ThreadPoolExecutor(TOKENIZE_THREADS, thread_name_prefix="sglang-tokenize")
        self.constraint_pool = ThreadPoolExecutor(CONSTRAINT_CHECK_THREADS, thread_name_prefix="sglang-grammar-check")
        # Grammar -> its check while it runs: requests repeating a grammar being parsed wait for that
        # check instead of each taking a thread (a parse past the time limit runs on to its end).
        self.constraint_checks: dict[tuple, asyncio.Future] = {}
        self.request_logger = RequestLogger(server_args.log_requests_level) if server_args.log_requests else None
        self.metrics = None
        if server_args.enable_metrics:
            from sglang.srt.metrics.collector import MetricsCollector  # only with --enable-metrics

            self.metrics = MetricsCollector(server_args.served_model_name)

    # ---- requests ----------------------------------------------------------------------

    async def tokenize_request(self, obj: GenerateReqInput) -> list[TokenizedGenerateReqInput]:
        """Validate and tokenize every prompt of the request; raise InvalidRequest naming the field.
        Everything cheap is checked first; long prompts are tokenized on a worker thread (the
        tokenizer releases the GIL), so the event loop keeps serving meanwhile."""
        prompts = request_input.as_list(obj.text) if obj.text is not None else None
        ids_list = request_input.as_id_lists(obj.input_ids) if obj.input_ids is not None else None
        if (prompts is None) == (ids_list is None):
            raise InvalidRequest("exactly one of text / prompt and input_ids must be given", "text")
        n = len(prompts) if prompts is not None else len(ids_list)
        if n == 0:
            raise InvalidRequest("the batch of prompts is empty", "text")
        params_list = request_input.broadcast(obj.sampling_params, n, "sampling_params")
        rids = request_input.rids_of(obj.rid, n)
        return_logprobs = request_input.broadcast(obj.return_logprob, n, "return_logprob")
        top_nums = request_input.broadcast(obj.top_logprobs_num, n, "top_logprobs_num")
        starts = request_input.broadcast(obj.logprob_start_len, n, "logprob_start_len")
        params = [self._sampling_params(raw) for raw in params_list]
        self.limits.check_sequences(n, max(p.n for p in params), sum(p.n for p in params))
        for i in range(n):
            request_input.check_logprob_args(return_logprobs[i], top_nums[i], starts[i])
        await self._check_constraints(params)
        ids_list = await self._encode_all(prompts) if prompts is not None else ids_list
        group = obj.group or rids[0]
        out = []
        for i in range(n):
            if request_input.wants_whole_context(params_list[i]):
                params[i].max_new_tokens = max(self.context_len - len(ids_list[i]), 0)  # None: up to the context
            self._check_lengths(ids_list[i], params[i])
            start = starts[i] if return_logprobs[i] else -1
            request_input.check_logprob_start(start, len(ids_list[i]))
            req = TokenizedGenerateReqInput(
                rids[i],
                ids_list[i],
                params[i],
                obj.stream,
                bool(return_logprobs[i]),
                top_nums[i],
                group=group,
                logprob_start_len=start,
                require_reasoning=obj.require_reasoning,
            )
            out.extend(request_input.expand_n(req))
        return out

    def _sampling_params(self, raw) -> SamplingParams:
        params = SamplingParams.from_dict(raw)
        if request_input.wants_whole_context(raw):
            params.max_new_tokens = self.context_len  # the exact value is known once the prompt is tokenized
        params.verify(self.vocab_size)
        params.verify_simulation(self.server_args.speculative_enabled, self.hooks.simulates_acceptance)
        self.limits.check_stop(params)
        if params.constrained:
            if self.server_args.grammar_backend == "none":
                field = constraint_key(params)[0]
                raise InvalidRequest(
                    f"{field} needs a grammar backend; this server runs with --grammar-backend none", field
                )
        return params

    async def _check_constraints(self, params: list[SamplingParams]) -> None:
        """Each distinct grammar of the request parses (check_constraint), on the grammar-check
        threads, within CONSTRAINT_CHECK_TIMEOUT_S; else InvalidRequest naming its field."""
        loop = asyncio.get_running_loop()
        distinct = {tuple(getattr(p, field) for field in CONSTRAINT_FIELDS): p for p in params if p.constrained}
        for key, p in distinct.items():
            field = constraint_key(p)[0]
            started = time.perf_counter()
            check = self.constraint_checks.get(key)
            if check is None:
                check = self.constraint_checks[key] = loop.run_in_executor(self.constraint_pool, check_constraint, p)
                check.add_done_callback(functools.partial(self._constraint_checked, key))
            try:  # shielded: a request that gives up leaves the check to the others waiting for it
                await asyncio.wait_for(asyncio.shield(check), CONSTRAINT_CHECK_TIMEOUT_S)
            except asyncio.TimeoutError:
                logger.warning("refused a %s not parsed within %.0f s", field, time.perf_counter() - started)
                raise InvalidRequest(
                    f"{field} was not parsed within {CONSTRAINT_CHECK_TIMEOUT_S:.0f} s: simplify it "
                    f"(large repetition counts such as {{1,10000}} and deep nesting expand into "
                    f"many grammar rules), or retry if the server is parsing other large grammars",
                    field,
                ) from None

    def _constraint_checked(self, key: tuple, check: asyncio.Future) -> None:
        self.constraint_checks.pop(key, None)
        if not check.cancelled():
            check.exception()  # retrieved: when every request waiting for it gave up, nobody else reads it

    async def _encode_all(self, prompts: list) -> list[list[int]]:
        num_chars = 0
        for text in prompts:
            if not isinstance(text, str):
                raise InvalidRequest(f"text must be a string, got {type(text).__name__}", "text")
            self.limits.check_prompt_chars(len(text))
            num_chars += len(text)
        if num_chars <= INLINE_TOKENIZE_CHARS:
            return [self._encode(text) for text in prompts]
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.tokenize_pool, lambda: [self._encode(text) for text in prompts])

    def _encode(self, text: str) -> list[int]:
        try:
            return self.tokenizer.encode(text)
        except (TypeError, ValueError, UnicodeError):  # e.g. a lone surrogate, which UTF-8 cannot hold
            raise InvalidRequest("text is not valid Unicode (it holds a lone surrogate code point)", "text") from None

    def _check_capacity(self, num_new: int) -> None:
        """Refuse work beyond what can run plus --max-queued-requests, before it is queued."""
        limit = self.server_args.max_queued_requests
        if limit is None:
            return
        capacity = self.model_info["max_running_requests"] + limit
        if len(self.rid_to_state) + num_new > capacity:
            raise InvalidRequest(
                f"the server is overloaded: {len(self.rid_to_state)} requests are in flight "
                f"and at most {limit} may wait in the queue; retry later",
                status_code=503,
            )

    def _check_lengths(self, input_ids: list[int], params: SamplingParams) -> None:
        if not input_ids:
            raise InvalidRequest("the prompt is empty", "text")
        if len(input_ids) >= self.context_len:  # before the per-token check: a long list costs it seconds
            raise InvalidRequest(
                f"the prompt has {len(input_ids)} tokens, more than the context length ({self.context_len}) allows",
                "text",
            )
        if any(not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < self.vocab_size for t in input_ids):
            raise InvalidRequest(f"input_ids must be integers in [0, {self.vocab_size})", "input_ids")
        if len(input_ids) + params.max_new_tokens > self.context_len:
            raise InvalidRequest(
                f"the prompt ({len(input_ids)} tokens) + max_new_tokens ({params.max_new_tokens}) "
                f"is longer than the context length ({self.context_len})",
                "max_new_tokens",
            )

    async def generate_request(self, obj: GenerateReqInput) -> AsyncIterator:
        """Yields the result dict (a list of them for a batch); several times when streaming."""
        self._ensure_running()
        reqs = await self.tokenize_request(obj)
        if obj.stream and len(reqs) > 1:
            raise InvalidRequest("stream is supported for a single prompt with n = 1 only", "stream")
        if self.request_logger is not None:
            self.request_logger.received(obj, reqs)
        self._check_capacity(len(reqs))
        self._check_rids_free(reqs)
        states: list[ReqState] = []
        try:
            for req in reqs:  # inside the try: if a send fails, the ones sent before are aborted
                states.append(self._send(req))
            if obj.stream:
                async for out in self._stream(reqs[0].rid, states[0]):
                    yield out
            else:
                results = [await self._wait_finished(req.rid, state) for req, state in zip(reqs, states)]
                yield results if obj.is_batch() or len(results) > 1 else results[0]
        finally:
            for req, state in zip(reqs, states):
                # The caller went away before the end. Compared by identity: a finished rid may
                # already belong to another caller's request.
                if self.rid_to_state.get(req.rid) is state:
                    self._abort_abandoned(req.rid, state)

    def _check_rids_free(self, reqs: list[TokenizedGenerateReqInput]) -> None:
        """Before any of the request is sent: a clash found halfway would leave the part already
        sent running with nobody to collect or abort it, and its rid taken for good."""
        seen, parents = set(), set()
        for req in reqs:
            if (
                req.rid in seen
                or req.rid in parents
                or req.rid in self.rid_to_state
                or req.rid in self.samples_in_flight
            ):
                raise InvalidRequest(f"rid {short_repr(req.rid)} is already in use", "rid")
            # An n > 1 request's own rid names its samples (POST /abort_request aborts them all).
            if req.sample_of and (req.sample_of in seen or req.sample_of in self.rid_to_state):
                raise InvalidRequest(f"rid {short_repr(req.sample_of)} is already in use", "rid")
            seen.add(req.rid)
            if req.sample_of:
                parents.add(req.sample_of)

    def _send(self, req: TokenizedGenerateReqInput) -> ReqState:
        state = ReqState(created=time.perf_counter(), sample_of=req.sample_of)
        self.send_to_scheduler.send_pyobj(req)
        # Registered once sent (no reply can be handled in between: both run on this loop), so a
        # send that fails leaves no rid behind.
        self.rid_to_state[req.rid] = state
        if req.sample_of:
            self.samples_in_flight[req.sample_of] = self.samples_in_flight.get(req.sample_of, 0) + 1
        return state

    def _forget(self, rid: str) -> None:
        """The request leaves the table: its rid (and, with its last sample, its n > 1 request's) is free."""
        state = self.rid_to_state.pop(rid, None)
        if state is not None and state.sample_of:
            left = self.samples_in_flight.pop(state.sample_of) - 1
            if left:
                self.samples_in_flight[state.sample_of] = left

    async def _stream(self, rid: str, state: ReqState):
        while True:
            await self._wait(state)
            # Whether this chunk is the last, read with the chunk: the last step may be handled
            # while the caller writes the chunk out, and it must then get a chunk of its own.
            finished = state.finished
            yield self._result(rid, state)
            if finished:
                self._forget(rid)
                return

    async def _wait_finished(self, rid: str, state: ReqState) -> dict:
        while not state.finished:
            await self._wait(state)
        self._forget(rid)
        return self._result(rid, state)

    async def _wait(self, state: ReqState) -> None:
        await state.event.wait()
        state.event.clear()
        if self.dead_reason:
            raise RuntimeError(self.dead_reason)

    def _result(self, rid: str, state: ReqState) -> dict:
        meta = dict(state.meta, id=rid, e2e_latency=time.perf_counter() - state.created)
        for key in ("output_token_logprobs", "output_top_logprobs"):
            if key in meta:
                meta[key] = list(meta[key])
        return {"text": state.text, "output_ids": list(state.output_ids), "meta_info": meta}

    def abort_request(self, rid: str = "", abort_all: bool = False) -> list[str]:
        """Aborts requests on behalf of someone other than their callers (POST /abort_request,
        Engine.abort_request): the request `rid` (an `n > 1` request runs as `rid-0`, `rid-1`, ...:
        all of those), or every request in flight with `abort_all`. Their callers still get their
        results, finished with type "abort". Unknown rids, and an empty one without `abort_all`,
        are ignored. Returns the rids aborted."""
        if abort_all:
            rids = list(self.rid_to_state)
        else:  # the samples of an n > 1 request by what they are, not by name: "job-1" may be another's
            rids = [
                known for known, state in self.rid_to_state.items() if rid and (known == rid or state.sample_of == rid)
            ]
        if not self.dead_reason:
            for known in rids:
                self.send_to_scheduler.send_pyobj(AbortReq(known))
        return rids

    def _abort_abandoned(self, rid: str, state: ReqState) -> None:
        """The caller went away: nobody waits for the result. Until the scheduler's last output
        for it arrives the rid stays taken, so that a new request reusing it gets none of this
        one's outputs."""
        if state.finished or self.dead_reason:
            self._forget(rid)
            return
        state.abandoned = True
        self.send_to_scheduler.send_pyobj(AbortReq(rid))

    async def control(self, kind: str):
        self._ensure_running()
        future = asyncio.get_running_loop().create_future()
        req_id = next(self.control_ids)
        self.control_waiters[req_id] = future
        self.send_to_scheduler.send_pyobj(ControlReq(req_id, kind))
        return await future

    # ---- receiving -----------------------------------------------------------------------

    def start(self) -> None:
        """Start receiving (idempotent); needs a running event loop."""
        if self.handle_loop_task is None or self.handle_loop_task.done():
            self.handle_loop_task = asyncio.get_running_loop().create_task(self.handle_loop())

    def _ensure_running(self) -> None:
        if self.dead_reason:
            raise RuntimeError(self.dead_reason)
        self.start()

    async def handle_loop(self) -> None:
        while not self.dead_reason:
            if not await self.recv_from_workers.poll(WATCHDOG_INTERVAL_S * 1000):
                self._check_children()
                continue
            # Every message already queued is handled before the waiting streams run: a stream
            # that fell behind sends the steps it missed as one chunk instead of one per step, so
            # the front end's work per token drops as its load rises. The reads are synchronous:
            # an awaited receive hands control to the streams after each message.
            for _ in range(self.messages_per_wake):
                try:
                    msg = pickle.loads(self.recv_queued.recv(zmq.NOBLOCK))
                except zmq.Again:
                    break
                self._dispatch(msg)

    def _dispatch(self, msg) -> None:
        if isinstance(msg, BatchStrOut):
            self._handle_str_out(msg)
        elif isinstance(msg, ControlReply):
            future = self.control_waiters.pop(msg.id, None)
            if future is not None and not future.done():
                future.set_result(msg.result)

    def _handle_str_out(self, out: BatchStrOut) -> None:
        for i, rid in enumerate(out.rids):
            state = self.rid_to_state.get(rid)
            if state is None:
                continue
            if state.abandoned:
                if out.finished_reasons[i] is not None:
                    self._forget(rid)
                continue
            state.text += out.new_texts[i]
            state.output_ids.extend(out.new_token_ids[i])
            constants = out.constants[i]  # the request's first message carries them
            if constants is not None:
                state.constants = constants
                state.meta.update(
                    finish_reason=None,
                    prompt_tokens=constants.prompt_tokens,
                    completion_tokens=0,
                    cached_tokens=constants.cached_tokens,
                )
            state.meta.update(finish_reason=out.finished_reasons[i], completion_tokens=out.completion_tokens[i])
            if out.spec_verify_ct is not None:
                verifies = out.spec_verify_ct[i]
                state.meta["spec_verify_ct"] = verifies
                if verifies:
                    state.meta["spec_accept_length"] = out.completion_tokens[i] / verifies
            if out.new_token_logprobs[i] is not None:
                state.meta.setdefault("output_token_logprobs", []).extend(
                    (logprob, token_id, None) for logprob, token_id in out.new_token_logprobs[i]
                )
            if out.new_top_logprobs[i] is not None:
                state.meta.setdefault("output_top_logprobs", []).extend(
                    [(logprob, token_id, None) for logprob, token_id in top] for top in out.new_top_logprobs[i]
                )
            if out.input_token_logprobs is not None and out.input_token_logprobs[i] is not None:
                state.meta.update(
                    request_input.input_logprobs_meta(out.input_token_logprobs[i], out.input_top_logprobs[i])
                )
            state.finished = out.finished_reasons[i] is not None
            if state.finished and self.metrics is not None:
                self._observe(state)
            if state.finished and self.request_logger is not None:
                self.request_logger.finished(rid, state.text, state.meta)
            state.event.set()

    def _observe(self, state: ReqState) -> None:
        admit_time, first_token_time = state.constants.admit_time, state.constants.first_token_time
        meta = dict(state.meta, e2e_latency=time.perf_counter() - state.created)
        ttft = None if first_token_time is None else first_token_time - state.created_wall
        queue = None if admit_time is None else admit_time - state.created_wall
        self.metrics.observe_finished(meta, ttft, queue)

    def _check_children(self) -> None:
        reason = self.children_alive()
        if reason is not None:
            self.fail_all(reason)

    def fail_all(self, reason: str) -> None:
        """The engine is gone: every waiting caller gets `reason` as an error, now and later."""
        if self.dead_reason:
            return
        self.dead_reason = reason
        logger.error("%s; failing %d pending request(s)", reason, len(self.rid_to_state))
        for state in self.rid_to_state.values():
            state.event.set()
        for future in self.control_waiters.values():
            if not future.done():
                future.set_exception(RuntimeError(reason))

    async def close(self) -> None:
        if self.handle_loop_task is not None and not self.handle_loop_task.done():
            self.handle_loop_task.cancel()
            try:
                await self.handle_loop_task
            except asyncio.CancelledError:
                pass
        self.ctx.destroy(linger=0)
        self.tokenize_pool.shutdown(wait=False, cancel_futures=True)
        self.constraint_pool.shutdown(wait=False, cancel_futures=True)
