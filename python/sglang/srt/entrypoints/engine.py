"""sglang.Engine: the offline entry point. Starts the scheduler and detokenizer processes, and the
other tensor-parallel ranks (the same processes the HTTP server uses), and runs the
TokenizerManager in this process."""

from __future__ import annotations

import asyncio
import atexit
import logging
import shutil
import threading
import time
from typing import AsyncIterator, Iterator, Optional, Union

from sglang.srt.hf_transformers_utils import get_tokenizer
from sglang.srt.managers import child_processes
from sglang.srt.managers.child_processes import (
    WATCHDOG_EXIT_CODE,
    child_context,
    server_child_context,
    start_child,
    start_tp_followers,
)
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.tokenizer_manager import TokenizerManager
from sglang.srt.server_args import PortArgs, ServerArgs, check_model_paths
from sglang.srt.utils import configure_logger

logger = logging.getLogger(__name__)
STARTUP_TIMEOUT_S = 1800  # loading a large checkpoint from a slow disk can take long
SHUTDOWN_GRACE_S = 5
READY_POLL_S = 1.0


class Subprocesses:
    """The scheduler and detokenizer processes of one engine, the other tensor-parallel ranks
    (tp_size > 1), and their IPC directory."""

    def __init__(self, server_args: ServerArgs, preloaded: bool = False, forked: bool = False):
        """preloaded: start them from a fork server that has imported the engine, on the CPU
        (`child_processes.child_context`); forked (the HTTP server): fork them from this process
        on the CPU (`child_processes.server_child_context`)."""
        self.port_args = PortArgs.create(server_args.tp_size)
        self.watchdog_timeout = server_args.watchdog_timeout
        ctx = child_context(server_args.device, preloaded)
        scheduler_ctx = server_child_context(server_args.device) if forked else ctx
        reader, writer = ctx.Pipe(duplex=False)
        self.scheduler = start_child(
            scheduler_ctx, child_processes.SCHEDULER, "sglang-scheduler", (server_args, self.port_args, writer)
        )
        # Closed before any other child starts: one forked later would hold a copy, and the
        # scheduler's exit during start-up would no longer read as the end of the pipe.
        writer.close()
        self.tp_followers = start_tp_followers(server_args, self.port_args.tp_init_address, scheduler_ctx)
        self.detokenizer = None
        try:
            # Loaded while the scheduler starts, and handed to the detokenizer: a process that loads
            # one itself imports most of transformers and torch (about 5 s of CPU) to do so.
            self.tokenizer = get_tokenizer(
                server_args.tokenizer_path, server_args.tokenizer_mode, server_args.trust_remote_code
            )
            self.detokenizer = start_child(
                server_child_context(server_args.device) if forked else ctx,
                child_processes.DETOKENIZER,
                "sglang-detokenizer",
                (server_args, self.port_args, _picklable(self.tokenizer)),
            )
            self.model_info = self._wait_ready(reader)
        except BaseException:
            self.shutdown()
            raise

    def _wait_ready(self, reader) -> dict:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not reader.poll(READY_POLL_S):
            # Rank 0 would wait for a dead rank in a collective until its timeout.
            for proc in self.tp_followers:
                if not proc.is_alive():
                    raise RuntimeError(
                        f"tensor-parallel rank {proc.name.removeprefix('sglang-tp')} exited during "
                        f"start-up (exit code {proc.exitcode}); see its log above"
                    )
            if time.monotonic() > deadline:
                raise RuntimeError(f"the scheduler did not start within {STARTUP_TIMEOUT_S} s")
        try:
            msg = reader.recv()
        except EOFError:
            raise RuntimeError(
                f"the scheduler process exited during start-up (exit code {self.scheduler.exitcode}); see its log above"
            ) from None
        if msg.pop("status") != "ready":
            raise RuntimeError(f"the scheduler failed to start: {msg['message']}")
        return msg

    @property
    def processes(self) -> list:
        return [self.scheduler, *self.tp_followers, *([self.detokenizer] if self.detokenizer is not None else [])]

    def why_dead(self) -> Optional[str]:
        for proc in self.processes:
            if not proc.is_alive():
                if proc is self.scheduler and proc.exitcode == WATCHDOG_EXIT_CODE:
                    return (
                        "the scheduler's watchdog stopped it: a step ran longer than --watchdog-timeout "
                        f"{self.watchdog_timeout:g} s"
                    )
                return f"the {proc.name} process died (exit code {proc.exitcode})"
        return None

    def shutdown(self) -> None:
        for proc in self.processes:
            if proc.is_alive():
                proc.terminate()
        for proc in self.processes:
            proc.join(SHUTDOWN_GRACE_S)
            if proc.is_alive():
                proc.kill()
                proc.join()
        shutil.rmtree(self.port_args.ipc_dir, ignore_errors=True)


def _picklable(tokenizer):
    """The tokenizer itself for the detokenizer process, or None (it loads its own) where its class
    is a model's own code (--trust-remote-code), which that process could not import to unpickle."""
    return tokenizer if type(tokenizer).__module__.startswith(("transformers.", "tokenizers.")) else None


ENGINE_MAX_SEQUENCES_PER_REQUEST = 2**31 - 1
_END = object()  # what _next returns when the generator is exhausted


# Parameters of upstream SGLang's Engine.generate that this engine does not implement, and what
# they ask for. Code that forwards every upstream default still runs: a value that asks for
# nothing (None, False, 0, {}, or a list of those) is accepted; any other is refused, not ignored.
UPSTREAM_ONLY_PARAMS = {
    **dict.fromkeys(("image_data", "audio_data", "video_data", "mm_hashes", "mm_content_hashes"), "multimodal input"),
    "token_ids_logprob": "logprobs of chosen token ids",
    "lora_path": "LoRA adapters",
    "custom_logit_processor": "custom logit processors",
    "return_hidden_states": "returning hidden states",
    **dict.fromkeys(("return_routed_experts", "routed_experts_start_len"), "returning routed experts"),
    **dict.fromkeys(
        ("bootstrap_host", "bootstrap_port", "bootstrap_room", "disagg_prefill_dp_rank"),
        "prefill-decode disaggregation",
    ),
    **dict.fromkeys(("routed_dp_rank", "data_parallel_rank"), "data-parallel routing (an Engine is one replica)"),
    **dict.fromkeys(("session_id", "session_params"), "sessions"),
    "priority": "priority scheduling",
    "cache_salt": "cache salts",
    "kv_router_hint": "KV router hints",
    "external_trace_header": "tracing",
}


def _asks_nothing(value) -> bool:
    if isinstance(value, dict):
        return not value
    if isinstance(value, (list, tuple)):
        return all(_asks_nothing(item) for item in value)
    return value is None or value is False or (type(value) is int and value == 0)


def _refuse_upstream_only(params: dict) -> None:
    for name, value in params.items():
        if name not in UPSTREAM_ONLY_PARAMS:
            raise TypeError(f"got an unexpected keyword argument {name!r}")
        if not _asks_nothing(value):
            raise NotImplementedError(
                f"{name}: {UPSTREAM_ONLY_PARAMS[name]} is not supported by this engine; "
                f"leave it out (upstream SGLang's Engine takes it)"
            )


def model_info(server_args: ServerArgs, subprocesses: Subprocesses) -> dict:
    """What a server or Engine serves (GET /get_model_info, Engine.get_model_info)."""
    return {
        "model_path": server_args.model_path,
        "tokenizer_path": server_args.tokenizer_path,
        "is_generation": True,
        "served_model_name": server_args.served_model_name,
        **subprocesses.model_info,
    }


async def _call(fn, *args):
    return fn(*args)


async def _cancel_the_rest() -> None:
    """Before the loop stops: its other tasks cancelled and async generators closed, so that
    nothing submitted to it is left waiting on a loop that never runs again."""
    tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.get_running_loop().shutdown_asyncgens()


async def _first(agen):
    try:
        return await agen.__anext__()
    finally:
        await agen.aclose()


async def _next(agen):
    try:
        return await agen.__anext__()
    except StopAsyncIteration:  # not through a Future: StopAsyncIteration is no error to set there
        return _END


class Engine:
    """`Engine(model_path=..., **server_args)`: keyword names are ServerArgs fields; without
    model_path it runs the demo code model shipped in sglang/demo.

    The TokenizerManager lives on the engine's own event loop, run by a background thread, so
    the blocking methods work from any thread (or inside a running loop) and `async_generate`
    from any event loop; concurrent async calls are batched together by the scheduler."""

    def __init__(self, **kwargs):
        # An offline batch is the caller's own: no fan-out limit unless one is asked for (the HTTP
        # server's default keeps one client from slowing the others).
        kwargs.setdefault("max_sequences_per_request", ENGINE_MAX_SEQUENCES_PER_REQUEST)
        self.server_args = ServerArgs.from_kwargs(**kwargs)
        if self.server_args.dp_size > 1:
            raise ValueError(
                "dp_size > 1 runs replicas behind sglang-router, which an Engine is not: start them "
                "with python -m sglang.launch_server --dp-size N (docs/scaling_out.md)"
            )
        check_model_paths(self.server_args)
        configure_logger(self.server_args.log_level)
        self._closed = False
        self.subprocesses = Subprocesses(self.server_args, preloaded=True)
        self.loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self.loop.run_forever, name="sglang-engine-loop", daemon=True)
        self._loop_thread.start()
        try:
            self.tokenizer_manager = TokenizerManager(
                self.server_args,
                self.subprocesses.port_args,
                self.subprocesses.model_info,
                self.subprocesses.why_dead,
                tokenizer=self.subprocesses.tokenizer,
            )
        except BaseException:
            self._stop_loop()
            self.subprocesses.shutdown()
            raise
        atexit.register(self.shutdown)

    def generate(
        self,
        prompt: Optional[Union[str, list[str]]] = None,
        sampling_params: Optional[Union[dict, list[dict]]] = None,
        input_ids: Optional[Union[list[int], list[list[int]]]] = None,
        *,
        stream: bool = False,
        rid: Optional[Union[str, list[str]]] = None,
        return_logprob: Optional[Union[bool, list[bool]]] = False,
        logprob_start_len: Optional[Union[int, list[int]]] = None,
        top_logprobs_num: Optional[Union[int, list[int]]] = None,
        require_reasoning: bool = False,
        **upstream_only,
    ) -> Union[dict, list[dict], Iterator[dict]]:
        """One result dict per prompt (`text`, `output_ids`, `meta_info`); a list for a list of
        prompts; an iterator of growing results when `stream=True`. Keywords past `input_ids` are
        upstream's names, keyword-only: upstream's fourth positional parameter is `image_data`.
        With `return_logprob` and `logprob_start_len` L >= 0, meta_info also has the prompt's
        logprobs from position L (`input_token_logprobs`, and `input_top_logprobs` with
        `top_logprobs_num`); `require_reasoning` (under --reasoning-parser): the output starts with a
        reasoning block, and a json_schema / regex / ebnf constrains what follows it; the upstream
        parameters in UPSTREAM_ONLY_PARAMS raise NotImplementedError unless they ask for nothing."""
        obj = self._request_input(
            prompt,
            sampling_params,
            input_ids,
            stream,
            rid,
            return_logprob,
            logprob_start_len,
            top_logprobs_num,
            upstream_only,
            require_reasoning,
        )
        agen = self.tokenizer_manager.generate_request(obj)
        if stream:
            return self._iterate(agen)
        return self._run(_first(agen))

    async def async_generate(
        self,
        prompt: Optional[Union[str, list[str]]] = None,
        sampling_params: Optional[Union[dict, list[dict]]] = None,
        input_ids: Optional[Union[list[int], list[list[int]]]] = None,
        *,
        stream: bool = False,
        rid: Optional[Union[str, list[str]]] = None,
        return_logprob: Optional[Union[bool, list[bool]]] = False,
        logprob_start_len: Optional[Union[int, list[int]]] = None,
        top_logprobs_num: Optional[Union[int, list[int]]] = None,
        require_reasoning: bool = False,
        **upstream_only,
    ) -> Union[dict, list[dict], AsyncIterator[dict]]:
        """`generate` for asyncio callers, on any event loop: awaits the result, or with
        `stream=True` returns an async iterator of growing results. Cancelling the awaiting task
        aborts the request."""
        obj = self._request_input(
            prompt,
            sampling_params,
            input_ids,
            stream,
            rid,
            return_logprob,
            logprob_start_len,
            top_logprobs_num,
            upstream_only,
            require_reasoning,
        )
        agen = self.tokenizer_manager.generate_request(obj)
        if stream:
            return self._aiterate(agen)
        return await self._await(_first(agen))

    def _request_input(
        self,
        prompt,
        sampling_params,
        input_ids,
        stream,
        rid,
        return_logprob,
        logprob_start_len,
        top_logprobs_num,
        upstream_only: dict,
        require_reasoning: bool = False,
    ) -> GenerateReqInput:
        self._check_open()
        _refuse_upstream_only(upstream_only)
        # None is upstream's default for these; ours are the values it stands for.
        return GenerateReqInput(
            text=prompt,
            input_ids=input_ids,
            sampling_params=sampling_params,
            rid=rid,
            stream=stream,
            return_logprob=False if return_logprob is None else return_logprob,
            logprob_start_len=-1 if logprob_start_len is None else logprob_start_len,
            top_logprobs_num=0 if top_logprobs_num is None else top_logprobs_num,
            require_reasoning=bool(require_reasoning),
        )

    def _iterate(self, agen) -> Iterator[dict]:
        try:
            while (chunk := self._run(_next(agen))) is not _END:
                yield chunk
        finally:
            if not self._closed:
                self._run(agen.aclose())

    async def _aiterate(self, agen) -> AsyncIterator[dict]:
        try:
            while (chunk := await self._await(_next(agen))) is not _END:
                yield chunk
        finally:
            if not self._closed:
                await self._await(agen.aclose())

    def _run(self, coro, while_open: bool = True):
        """Runs `coro` on the engine's loop and blocks for its result; an interrupt (Ctrl-C)
        cancels it there, which aborts its request. After shutdown (while_open), the clear error,
        also for a stream iterator kept across it."""
        if while_open and self._closed:
            coro.close()
            self._check_open()
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    async def _await(self, coro):
        if self._closed:
            coro.close()
            self._check_open()
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this Engine has been shut down; start a new sglang.Engine")

    def abort_request(self, rid: str = "", abort_all: bool = False) -> list[str]:
        """Aborts requests in flight on behalf of someone other than their callers, as POST
        /abort_request does: the request `rid` (all the samples of an n > 1 request), or all of
        them with `abort_all`. Their callers get their tokens so far, finished with type "abort".
        Returns the rids aborted."""
        self._check_open()
        # The manager's state and its ZMQ socket belong to the engine's loop thread.
        return self._run(_call(self.tokenizer_manager.abort_request, rid, abort_all))

    def flush_cache(self) -> bool:
        """Drop the radix cache. False while requests are in flight."""
        self._check_open()
        return self._run(self.tokenizer_manager.control("flush_cache"))

    def get_server_info(self) -> dict:
        """Server args, model info, and live scheduler state, including the KV accounting
        (`total_slots`, `free_slots`, `cached_slots`, `request_slots`). `internal_states` holds
        the same state as a one-element list, the shape upstream's Engine returns."""
        self._check_open()
        state = self._run(self.tokenizer_manager.control("get_internal_state"))
        return {
            **vars(self.server_args),
            **self.subprocesses.model_info,
            "internal_state": state,
            "internal_states": [state],
        }

    def get_model_info(self) -> dict:
        """What the engine serves: the fields GET /get_model_info answers with."""
        self._check_open()
        return model_info(self.server_args, self.subprocesses)

    def shutdown(self) -> None:
        """Stops the engine's processes; idempotent. Requests still waiting fail with an error."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.shutdown)
        # Waiting callers first (with the reason), then the processes (seconds each at worst).
        self._run(self._close_tokenizer_manager(), while_open=False)
        self.subprocesses.shutdown()
        self._stop_loop()

    async def _close_tokenizer_manager(self) -> None:
        manager = self.tokenizer_manager
        if manager.rid_to_state or manager.control_waiters:
            manager.fail_all("the engine was shut down")
        await manager.close()

    def _stop_loop(self) -> None:
        if self.loop.is_running():
            self._run(_cancel_the_rest(), while_open=False)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._loop_thread.join()
        self.loop.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()
