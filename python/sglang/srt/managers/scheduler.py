"""Scheduler: continuous batching. Each `step()` either prefills waiting requests (with
cached prefixes and chunking) or decodes the running ones, and returns what to report.

The same class runs inside the scheduler process (see scheduler_process.py) for the server
and for `sglang.Engine`; it does no I/O itself.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from typing import Optional

import numpy as np
import torch

from sglang.srt import bench_hooks
from sglang.srt.bench_hooks import BenchHooks
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.errors import ABORTED_BY_CLIENT
from sglang.srt.hf_transformers_utils import get_tokenizer
from sglang.srt.managers.io_struct import AbortReq, BatchTokenIDOut, TokenizedGenerateReqInput, finish_abort
from sglang.srt.constrained.grammar import constraint_key
from sglang.srt.constrained.grammar_backend import make_grammar_backend
from sglang.srt.managers import input_logprobs
from sglang.srt.managers.grammar_queue import GrammarQueue
from sglang.srt.managers.kv_manager import KVManager
from sglang.srt.managers.output_logprobs import LogprobRows
from sglang.srt.managers.request_limits import unservable_reason
from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
from sglang.srt.managers.schedule_policy import AdmissionBatcher, PrefillAdder, SchedulePolicy, running_decode_reserve
from sglang.srt.managers.spec_scheduling import SpecScheduling
from sglang.srt.managers.step_times import NullStepClock
from sglang.srt.managers.tp_worker import TpModelWorker
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.model_executor.kernel_compiles import WATCH as COMPILE_WATCH
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils import eos_token_ids

logger = logging.getLogger(__name__)

# A "Decode batch" log line every this many decode steps.
DECODE_LOG_INTERVAL = 40


class Scheduler:
    def __init__(self, server_args: ServerArgs, hooks: Optional[BenchHooks] = None):
        self.server_args = server_args
        # Benchmark and diagnosis switches, read once for this process unless given.
        self.hooks = hooks if hooks is not None else bench_hooks.from_env()
        self.model_config = ModelConfig.from_path(
            server_args.model_path,
            server_args.dtype,
            server_args.device,
            server_args.context_length,
            server_args.trust_remote_code,
            server_args.quantization,
        )
        if str(server_args.device).startswith("cuda"):
            COMPILE_WATCH.install()  # start-up compiles counted; from the end of __init__, warned about
        self.tp_worker = self._make_worker()
        self.gc_watch = None  # the garbage collector's passes, timed once the process is ready (gc_pauses)
        # Speculation's decisions and their state: None without a draft model.
        self.spec = SpecScheduling(server_args, self.tp_worker, self.hooks) if server_args.speculative_enabled else None
        runner = self.tp_worker.model_runner
        self.memory = runner.memory
        self.kv_manager = KVManager(
            runner.req_to_token_pool,
            runner.token_to_kv_pool_allocator,
            server_args.disable_radix_cache,
            speculative=self.spec is not None,
        )
        self.policy = SchedulePolicy(server_args.schedule_policy, self.kv_manager)
        self.admission = AdmissionBatcher(server_args.admission_batch_steps, server_args.prefill_pass_tokens)
        self.eos_token_ids = eos_token_ids(server_args.model_path, server_args.tokenizer_path)
        self.seed_rng = np.random.default_rng(server_args.random_seed)
        self.waiting_queue: deque[Req] = deque()
        self.grammar_queue = GrammarQueue(self._make_grammar_backend())
        self.running_reqs: list[Req] = []
        self.chunked_req: Optional[Req] = None
        self.pending_outputs: list[Req] = []
        self.num_generated_tokens = 0
        self.num_retractions = 0
        self.last_step_time = time.perf_counter()
        self.last_step_throughput = 0.0
        # Tokens and busy seconds (steps' intervals, idle time left out) since the last decode log line.
        self._window_tokens, self._window_seconds = 0, 0.0
        self._idle = True  # nothing waited, ran or was in flight after the last step
        self.tokenizer = None
        self.overlap = not server_args.disable_overlap_schedule
        self.num_decode_steps = 0
        self.in_flight = None  # (ScheduleBatch, GenerationBatchResult) launched, not yet processed
        self.clock = NullStepClock()  # the server loop sets a StepClock under SGLANG_STEP_TIMES
        COMPILE_WATCH.mark_serving()

    def _make_worker(self) -> TpModelWorker:
        args = self.server_args
        if not args.speculative_enabled:
            return TpModelWorker(args, self.model_config)
        from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

        return EAGLEWorkerV2(args, self.model_config, self.hooks)

    def _make_grammar_backend(self):
        args = self.server_args
        return make_grammar_backend(
            args.grammar_backend,
            args.tokenizer_path,
            self.model_config.vocab_size,
            self.eos_token_ids,
            args.reasoning_parser,
            args.tokenizer_mode,
            args.trust_remote_code,
        )

    def model_info(self) -> dict:
        return {
            "max_total_num_tokens": self.memory.max_total_num_tokens,
            "max_running_requests": self.memory.max_running_requests,
            "context_len": self.memory.context_len,
            "vocab_size": self.model_config.vocab_size,
            "architecture": self.model_config.architecture,
        }

    # ---- input -------------------------------------------------------------------------

    def add_request(self, recv: TokenizedGenerateReqInput) -> None:
        params = recv.sampling_params
        seed = params.sampling_seed if params.sampling_seed is not None else int(self.seed_rng.integers(2**62))
        req = Req(
            recv.rid,
            recv.input_ids,
            params,
            seed,
            recv.stream,
            self.eos_token_ids,
            self.memory.context_len,
            recv.return_logprob,
            recv.top_logprobs_num,
            group=recv.group,
            logprob_start_len=recv.logprob_start_len,
        )
        req.require_reasoning = recv.require_reasoning
        memory, field = self.memory, None
        error = unservable_reason(req, memory.context_len, memory.max_total_num_tokens, self.model_config.vocab_size)
        if not error and params.constrained:  # it waits for its grammar beside the queue
            error, field = self.grammar_queue.add(req), constraint_key(params)[0]
            if not error:
                return
        if error:
            req.finished_reason = finish_abort(error, param=field)
            self.pending_outputs.append(req)
            return
        self.waiting_queue.append(req)

    def _take_compiled_grammars(self) -> None:
        for req, error in self.grammar_queue.pop_ready(self._is_idle()):
            if error:
                req.finished_reason = finish_abort(error, param=constraint_key(req.sampling_params)[0])
                self.pending_outputs.append(req)
            else:
                self.waiting_queue.append(req)

    def abort_request(self, recv: AbortReq) -> None:
        for req in list(self.grammar_queue.reqs):
            if req.rid == recv.rid and self.grammar_queue.remove(req):
                req.finished_reason = finish_abort("aborted by the client", ABORTED_BY_CLIENT)
                self.pending_outputs.append(req)
        for req in list(self.waiting_queue):
            if req.rid == recv.rid:
                self.waiting_queue.remove(req)
                self._finish(req, finish_abort("aborted by the client", ABORTED_BY_CLIENT))
        for req in self.running_reqs + ([self.chunked_req] if self.chunked_req else []):
            if req.rid == recv.rid:
                req.to_abort = True

    # ---- one step ----------------------------------------------------------------------

    def has_work(self) -> bool:
        return bool(
            self.waiting_queue
            or self.running_reqs
            or self.chunked_req
            or self.pending_outputs
            or self.in_flight
            or self.grammar_queue
        )

    def step(self) -> Optional[BatchTokenIDOut]:
        """Launch at most one forward and process what has finished; return the outputs.

        With overlap, consecutive decode steps pipeline: step N is launched from the tokens
        step N-1 left on the device, then N-1's results are processed while N runs. Anything
        else (a prefill, a retraction, an idle queue) first processes the step in flight.
        Speculative steps pipeline the same way: step N reads its inputs from the device rows
        step N-1 updated, so it does not wait for N-1's accepted lengths."""
        if self.spec is not None and self.in_flight is not None and self._any_abort():
            # A request's KV extent is exact only once no speculative step of it is in flight.
            self._process_in_flight()
        start = time.perf_counter()
        if self._idle:  # the time since the last step was idle: the next step's interval starts now
            self.last_step_time = start
        self._drop_aborted()
        if self.grammar_queue:
            self._take_compiled_grammars()
        clock = self.clock
        if self._can_overlap_decode():
            batch = self._schedule_decode(overlapped=True)
            clock.lap("schedule")
            if batch is not None:
                previous = self.in_flight
                self.in_flight = (batch, self._launch(batch, start))
                clock.lap("launch")
                self._process(*previous)
                clock.waited(previous[1].waited_s)
                clock.lap("process")
                outputs = self._collect_outputs()
                clock.lap("collect")
                self._idle = False
                return outputs
        if self.in_flight is not None:
            result = self.in_flight[1]
            self._process_in_flight()
            clock.waited(result.waited_s)
            clock.lap("process")
        batch = (None if self._defer_admission() else self._schedule_prefill()) or self._schedule_decode()
        clock.lap("schedule")
        result = self._launch(batch, start)
        if batch is not None:
            clock.lap("launch")
            # A constrained request's next mask needs this step's tokens: it never pipelines.
            if self.overlap and batch.forward_mode.is_decode() and batch.grammars is None:
                self.in_flight = (batch, result)
            else:
                self._process(batch, result)
                clock.waited(result.waited_s)
                clock.lap("process")
        outputs = self._collect_outputs()
        clock.lap("collect")
        self._idle = self._is_idle()
        return outputs

    def _is_idle(self) -> bool:
        """Nothing waits, runs or is in flight."""
        return not (self.waiting_queue or self.running_reqs or self.chunked_req or self.in_flight)

    def _any_abort(self) -> bool:
        return any(r.to_abort for r in self.running_reqs) or (
            self.chunked_req is not None and self.chunked_req.to_abort
        )

    def _can_overlap_decode(self) -> bool:
        if not self.overlap or self.in_flight is None or not self.in_flight[0].forward_mode.is_decode():
            return False
        # Prefill has priority: a request that could be admitted now needs exact state first.
        could_prefill = self.chunked_req is not None or (
            self.waiting_queue and self._free_running_slots() > 0 and not self._defer_admission()
        )
        return not could_prefill

    def _defer_admission(self) -> bool:
        """Whether the waiting requests wait for more to share their prefill pass (AdmissionBatcher)."""
        return self.chunked_req is None and self.admission.defer(self.waiting_queue, len(self.running_reqs))

    def _process_in_flight(self) -> None:
        if self.in_flight is not None:
            batch, result = self.in_flight
            self.in_flight = None
            self._process(batch, result)

    def _schedule_prefill(self) -> Optional[ScheduleBatch]:
        if not self.waiting_queue and self.chunked_req is None:
            return None
        budget, free_running = self.server_args.prefill_token_budget, self._free_running_slots()
        reserve = running_decode_reserve(
            self.running_reqs, self.kv_manager.allocator.available_size(), budget, free_running
        )
        adder = PrefillAdder(
            budget,
            self.kv_manager.available_tokens() - reserve,
            free_running,
            running_reserve=reserve,
            pass_fits=self.tp_worker.prefill_pass_fits if self._shape_passes() else None,
        )
        # A chunk in progress goes first; while it waits for memory nobody else is admitted, since
        # another prompt's first chunk would take its place as `chunked_req` and drop it, KV and all.
        if self.chunked_req is not None and not adder.try_add(self.chunked_req, continuing_chunk=True):
            return None
        with self.spec.admitting(self.running_reqs) if self.spec is not None else contextlib.nullcontext():
            for req in self.policy.order(self.waiting_queue, self.running_reqs):
                if not self._admit(req, adder):
                    break
        if not adder.reqs:
            return None
        logger.debug(
            "prefill pass: %d requests, %d tokens, %d running; kept to this size by the %s",
            len(adder.reqs), adder.planned, len(self.running_reqs), adder.limit,
        )  # fmt: skip
        slots = self.kv_manager.alloc_for_step(adder.reqs)
        if slots is None:  # the estimate above said it fits; memory says no
            self._undo_admission(adder.reqs)
            return None
        return ScheduleBatch(adder.reqs, ForwardMode.EXTEND, *slots)

    def _shape_passes(self) -> bool:
        """Whether this prefill pass stays within what runs cheaply (PrefillAdder.pass_fits): while
        requests decode, unless --admission-batch-steps 0 asks for admissions as they come."""
        return bool(self.running_reqs) and self.server_args.admission_batch_steps > 0

    def _free_running_slots(self) -> int:
        return self.memory.max_running_requests - len(self.running_reqs) - (self.chunked_req is not None)

    def _admit(self, req: Req, adder: PrefillAdder) -> bool:
        if adder.free_running_slots <= 0 or adder.token_budget <= 0:
            adder.limit = "token budget" if adder.token_budget <= 0 else "running requests"
            return False
        if self.spec is not None:  # before the prefix match: a request without draft state can use more of the cache
            self.spec.decide_admission(req, adder.reqs)
        if not self.kv_manager.admit(req):
            adder.limit = "KV memory"
            return False
        if not req.output_ids:  # first admission (a retracted request keeps its first count)
            req.cached_tokens = req.cached_len
            req.admit_time = req.admit_time or time.time()
        adder.available_kv = min(adder.available_kv, self._available_after_admission(adder))
        if not adder.try_add(req):
            self.kv_manager.release(req)
            return False
        self.waiting_queue.remove(req)
        if self.spec is not None:
            self.spec.on_admission(req)
        return True

    def _available_after_admission(self, adder: PrefillAdder) -> int:
        # Locking a cached prefix makes it unevictable: re-read what is still available.
        return self.kv_manager.available_tokens() - adder.planned - adder.reserved - adder.running_reserve

    def _undo_admission(self, reqs: list[Req]) -> None:
        for req in reversed(reqs):
            if req is self.chunked_req:
                continue
            self.kv_manager.release(req)
            self.waiting_queue.appendleft(req)
            if self.spec is not None:
                self.spec.on_undone_admission(req)

    def _schedule_decode(self, overlapped: bool = False) -> Optional[ScheduleBatch]:
        """A decode step over the running requests. Overlapped, their inputs are the step in
        flight's tokens, and running out of KV returns None (the caller syncs, then retracts)."""
        spec = self.spec
        if spec is not None:
            spec.review_following(self.running_reqs, self._spec_step_in_flight())
        while self.running_reqs:
            # With a draft: this step verifies k drafts (0: a plain step), k + 1 slots each.
            k = spec.plan_step(self.running_reqs) if spec is not None else 0
            batch = self._decode_batch(k, overlapped)
            if batch is not None or overlapped:
                return batch
            self._retract(self.running_reqs.pop())
        return None

    def _spec_step_in_flight(self) -> bool:
        return self.in_flight is not None and bool(self.in_flight[0].spec_steps)

    def _decode_batch(self, k: int, overlapped: bool) -> Optional[ScheduleBatch]:
        """The decode step of every running request at k, or None where its KV slots do not fit."""
        reqs = self.running_reqs
        for req in reqs:
            req.extend_len = k + 1
        if self.spec is not None:
            # The worker records the slots, at positions only the device knows; it copies
            # them to the device with the step's other inputs (ScheduleBatch.out_cache_loc_host).
            slots_host = self.kv_manager.alloc_host(len(reqs) * (k + 1))
            if slots_host is None:
                return None
            batch = ScheduleBatch(list(reqs), ForwardMode.DECODE, None, slots_host, spec_steps=k)
            # As launched: an adoption may change it before the step is processed.
            batch.speculating = [req.speculates for req in reqs]
            return batch
        out_cache_loc, slots_host = self.kv_manager.alloc_for_step(reqs) or (None, None)
        if out_cache_loc is None and slots_host is None:
            return None
        batch = ScheduleBatch(list(reqs), ForwardMode.DECODE, out_cache_loc, slots_host)
        if overlapped:
            batch.input_ids_device = self._tokens_in_flight(batch.reqs)
        return batch

    def _tokens_in_flight(self, reqs: list[Req]) -> torch.Tensor:
        previous_batch, previous_result = self.in_flight
        row = {id(req): i for i, req in enumerate(previous_batch.reqs)}
        rows = [row[id(req)] for req in reqs]
        if rows == list(range(len(previous_batch.reqs))):
            return previous_result.next_token_ids
        index = torch.tensor(rows, dtype=torch.int64).to(previous_result.next_token_ids.device, non_blocking=True)
        return previous_result.next_token_ids.index_select(0, index)

    def _retract(self, req: Req) -> None:
        """Out of KV: put the newest running request back in the queue. Its KV goes to the
        radix cache, so it resumes cheaply if memory frees up before it is evicted."""
        self.kv_manager.release(req)
        self.tp_worker.release_request(req)
        self.waiting_queue.appendleft(req)
        self.num_retractions += 1
        logger.warning(
            "KV cache is full: request %s goes back to the queue (%d retractions so far)", req.rid, self.num_retractions
        )

    def _launch(self, batch: Optional[ScheduleBatch], start: float):
        """Start the step that began at `start` on the device (None: nothing to launch). The KV
        of its tokens is being written from now on, so kv_len counts them; a request gets a
        pending token unless this is a prefill chunk."""
        result = None if batch is None else self.tp_worker.forward_batch_generation(batch)
        if self.spec is not None:  # after the worker read the requests' draft state
            self.spec.on_launch(start, batch)
        if batch is None:
            return None
        self.admission.launched(
            batch.batch_size, batch.forward_mode.is_decode(), len(self.waiting_queue), len(self.running_reqs)
        )
        if not batch.forward_mode.is_decode():
            self.clock.launched("prefill", batch.batch_size)
        elif batch.spec_steps:
            self.clock.launched(f"spec_k{batch.spec_steps}", batch.batch_size)
        else:
            self.clock.launched("decode", batch.batch_size)
        for req in batch.reqs:
            req.kv_len += req.extend_len
            if req.kv_len >= req.seq_len:
                req.num_pending += 1
        return result

    def _process(self, batch: ScheduleBatch, result) -> None:
        if self.spec is not None and batch.forward_mode.is_decode():
            self._process_spec_decode(batch, result)
            return
        host = result.wait_host()
        if batch.input_logprob_spans is not None:
            input_logprobs.record(batch.reqs, batch.input_logprob_spans, host)
        next_token_ids = host["next_token_ids"].tolist()
        logprobs = LogprobRows(host)
        new_tokens = 0
        for i, (req, token_id) in enumerate(zip(batch.reqs, next_token_ids)):
            if req.finished():  # finished (or aborted) while this step was in flight
                continue
            if req.kv_len < req.seq_len:  # a prefill chunk: more of the prompt to come
                self.chunked_req = req
                continue
            req.num_pending -= 1
            if req is self.chunked_req:
                self.chunked_req = None
            if batch.forward_mode == ForwardMode.EXTEND:
                self.running_reqs.append(req)
            if req.return_logprob:
                logprobs.record(req, i, token_id)
            self._append(req, token_id)
            new_tokens += 1
        self._count_step(new_tokens, batch.forward_mode.is_decode())

    def _process_spec_decode(self, batch: ScheduleBatch, result) -> None:
        """A decode step of the speculative worker: each request gets 1 .. k + 1 tokens; the KV
        slots of the rejected positions are freed."""
        host = result.wait_host()
        # A request that finished while this step was in flight gave all its slots back then.
        live_rows = [i for i, req in enumerate(batch.reqs) if not req.finished()]
        if batch.spec_steps == 0:  # a plain step: one token each, nothing rejected
            num_out = [1] * batch.batch_size
        else:
            num_out = self._free_rejected(batch, host["num_out"].numpy(), len(live_rows))
        self.spec.on_step_result(batch, host, num_out, live_rows, result.timer)
        self._append_step_tokens(batch, host, num_out)

    def _free_rejected(self, batch: ScheduleBatch, counts: np.ndarray, num_live: int) -> list[int]:
        """Frees the KV slots of the positions each row rejected (`counts`: tokens per row);
        returns the counts as a list."""
        width = batch.spec_steps + 1
        # numpy, not torch: each torch op on these few host values costs 5-30 us of host time.
        rejected = np.arange(width) >= counts[:, None]
        if num_live < batch.batch_size:  # the finished gave their slots back already
            rejected[[i for i, req in enumerate(batch.reqs) if req.finished()]] = False
        # The host copy of the slots: reading the device's would wait for the step launched after this one.
        freed = batch.out_cache_loc_host.numpy().reshape(-1, width)[rejected]  # a copy
        self.kv_manager.allocator.free(torch.from_numpy(freed), owned=True)
        return counts.tolist()

    def _append_step_tokens(self, batch: ScheduleBatch, host: dict, num_out: list[int]) -> None:
        """Each request's num_out tokens of a speculative worker's decode step, in turn."""
        width = batch.spec_steps + 1
        tokens = host["tokens"].tolist()
        token_logprobs = host["token_logprobs"].tolist() if "token_logprobs" in host else None
        top = (host["top_logprobs"].tolist(), host["top_logprob_ids"].tolist()) if "top_logprobs" in host else None
        new_tokens = 0
        for i, req in enumerate(batch.reqs):
            if req.finished():  # finished while this step was in flight: its tokens are dropped
                continue
            req.kv_len -= width - num_out[i]
            req.num_pending -= 1
            # A plain step verifies nothing; nor does a speculative one for a request that opted out.
            req.spec_verify_ct += width > 1 and batch.speculating[i]
            if not (req.return_logprob or req.stop_strs) and req.sampling_params.max_new_tokens:
                # The common request: its tokens in one call, then finished or streamed once.
                new_tokens += req.append_tokens(tokens[i], num_out[i])
                if req.finished():
                    self.running_reqs.remove(req)
                    self._finish(req, req.finished_reason)
                else:
                    self.stream_if_due(req)
                continue
            for j, token_id in enumerate(tokens[i][: num_out[i]]):
                if req.return_logprob:
                    req.output_token_logprobs.append((token_logprobs[i][j], token_id))
                    if req.top_logprobs_num:
                        n = req.top_logprobs_num
                        req.output_top_logprobs.append(list(zip(top[0][i][j][:n], top[1][i][j][:n])))
                self._append(req, token_id)
                new_tokens += 1
                if req.finished():
                    break
        self._count_step(new_tokens, is_decode=True)

    def _count_step(self, new_tokens: int, is_decode: bool) -> None:
        now = time.perf_counter()
        self.num_generated_tokens += new_tokens
        self.last_step_throughput = new_tokens / max(now - self.last_step_time, 1e-9)
        self._window_tokens += new_tokens
        self._window_seconds += now - self.last_step_time
        self.last_step_time = now
        if not is_decode:
            return
        self.num_decode_steps += 1
        if self.num_decode_steps % DECODE_LOG_INTERVAL == 0:
            self._log_decode()

    def _log_decode(self) -> None:
        """Every DECODE_LOG_INTERVAL decode steps: the batch, the KV in use, the speculation of the
        moment (with a cost policy, the tokens per second it expects of its k, to set beside the
        served throughput) and the tokens per second generated since the last such line, over
        the time the scheduler was busy."""
        state = self.kv_manager.accounting(0)
        line = (
            f"Decode batch. #running-req: {len(self.running_reqs)}, "
            f"#token: {state['total_slots'] - state['free_slots']}, "
            f"token usage: {1 - state['free_slots'] / state['total_slots']:.2f}, "
        )
        if self.spec is not None:
            line += self.spec.log_fields()
        window = self._window_tokens / max(self._window_seconds, 1e-9)
        self._window_tokens, self._window_seconds = 0, 0.0
        line += f"gen throughput (token/s): {window:.2f}, #queue-req: {len(self.waiting_queue)}"
        logger.info(line)

    def _append(self, req: Req, token_id: int) -> None:
        if req.sampling_params.max_new_tokens == 0:
            req.finished_reason = {"type": "length", "length": 0}
            req.output_token_logprobs.clear()
            req.output_top_logprobs.clear()
        else:
            req.append_token(token_id)
            if req.stop_strs:
                req.check_stop_strings(self._decode)
        if req.finished():
            self.running_reqs.remove(req)
            self._finish(req, req.finished_reason)
        else:
            self.stream_if_due(req)

    def stream_if_due(self, req: Req) -> None:
        """A streaming request's new tokens go out once --stream-interval of them are ready (its
        last ones go out as it finishes, however few)."""
        if req.stream and len(req.output_ids) - req.sent_len >= self.server_args.stream_interval:
            self.pending_outputs.append(req)

    def _decode(self, token_ids: list[int]) -> str:
        if self.tokenizer is None:  # loaded on the first request with stop strings
            args = self.server_args
            self.tokenizer = get_tokenizer(args.tokenizer_path, args.tokenizer_mode, args.trust_remote_code)
        return self.tokenizer.decode(token_ids)

    def _finish(self, req: Req, reason: dict) -> None:
        if self.spec is not None:
            self.spec.forget(req)
        req.finished_reason = reason
        self.kv_manager.release(req)
        self.tp_worker.release_request(req)
        self.pending_outputs.append(req)

    def _drop_aborted(self) -> None:
        for req in [r for r in self.running_reqs if r.to_abort]:
            self.running_reqs.remove(req)
            self._finish(req, finish_abort("aborted by the client", ABORTED_BY_CLIENT))
        if self.chunked_req is not None and self.chunked_req.to_abort:
            req, self.chunked_req = self.chunked_req, None
            self._finish(req, finish_abort("aborted by the client", ABORTED_BY_CLIENT))

    def _collect_outputs(self) -> Optional[BatchTokenIDOut]:
        if not self.pending_outputs:
            return None
        reqs = list(dict.fromkeys(self.pending_outputs))  # a request once, in order
        self.pending_outputs.clear()
        out = BatchTokenIDOut(
            rids=[req.rid for req in reqs],
            new_token_ids=[req.output_ids[req.sent_len :] for req in reqs],
            finished_reasons=[req.finished_reason for req in reqs],
            constants=[req.take_constants() for req in reqs],
            completion_tokens=[len(req.output_ids) for req in reqs],
            new_token_logprobs=[
                req.output_token_logprobs[req.sent_len :] if req.return_logprob else None for req in reqs
            ],
            new_top_logprobs=[
                req.output_top_logprobs[req.sent_len :] if req.top_logprobs_num else None for req in reqs
            ],
            spec_verify_ct=[req.spec_verify_ct for req in reqs] if self.spec is not None else None,
        )
        prompt_scores = [req.take_input_logprobs() for req in reqs]
        if any(prompt_scores):
            out.input_token_logprobs = [s and s[0] for s in prompt_scores]
            out.input_top_logprobs = [s and s[1] for s in prompt_scores]
        for req in reqs:
            req.sent_len = len(req.output_ids)
        return out

    # ---- control -----------------------------------------------------------------------

    def flush_cache(self) -> bool:
        """Drop the radix cache; refused (False) while requests are in flight."""
        if self.waiting_queue or self.running_reqs or self.chunked_req:
            return False
        self.kv_manager.flush()
        return True

    def get_internal_state(self) -> dict:
        in_flight = self.running_reqs + ([self.chunked_req] if self.chunked_req else [])
        held = sum(req.kv_len - req.cached_len for req in in_flight)
        state = self.kv_manager.accounting(held)
        state.update(
            num_running_reqs=len(self.running_reqs),
            num_queue_reqs=len(self.waiting_queue) + (1 if self.chunked_req else 0) + len(self.grammar_queue),
            token_usage=1 - state["free_slots"] / state["total_slots"],
            num_generated_tokens=self.num_generated_tokens,
            num_retractions=self.num_retractions,
            last_step_throughput=self.last_step_throughput,
            **self.admission.summary(),
            **COMPILE_WATCH.summary(),
            **self.tp_worker.penalty_counts.summary(),
        )
        if self.gc_watch is not None:
            state["gc"] = self.gc_watch.summary()
        if self.spec is not None:
            state.update(self.spec.summary(self.running_reqs))
        return state
