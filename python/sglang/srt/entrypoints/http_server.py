"""The HTTP server: FastAPI routes over the TokenizerManager, native and OpenAI-compatible.

`launch_server` starts the scheduler and detokenizer processes, then serves on uvicorn (uvloop)
until SIGTERM / Ctrl-C, or until a child process dies (then it exits non-zero).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import sys
import threading
from contextlib import asynccontextmanager
from typing import Any, Optional, Union

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

import sglang
from sglang.srt.entrypoints.engine import Subprocesses, model_info
from sglang.srt.entrypoints.http_middleware import add_auth, add_cors
from sglang.srt.entrypoints.http_utils import (
    ClientDisconnected,
    cancel_on_disconnect,
    error_response,
    invalid_request_response,
    redact_query_strings,
    sse,
)
from sglang.srt.entrypoints.not_implemented import reject_native_sampling_fields, reject_openai_fields
from sglang.srt.entrypoints.request_body import parse_json_body
from sglang.srt.errors import ABORTED_BY_CLIENT, InvalidRequest
from sglang.srt.gc_pauses import GcWatch, settle_after_startup
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.tokenizer_manager import TokenizerManager
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils import check_port_free

logger = logging.getLogger(__name__)
WATCHDOG_INTERVAL_S = 0.5
EXIT_GRACE_S = 2.0  # after a child dies: time for waiting clients to get their errors
HEALTH_GENERATE_TIMEOUT_S = 30
SHUTDOWN_TIMEOUT_S = 5
READY_MESSAGE = "The server is fired up and ready to roll!"
# Idle HTTP keep-alive connections are closed after this long (clients that reuse one later than
# this race the close; 30 s covers the usual client pools, which drop idle ones sooner).
SERVER_KEEPALIVE_S = 30


class GenerateRequest(BaseModel):
    """The native /generate body (upstream SGLang's names). Strict like the OpenAI routes: a
    string is not a number, a number is not a boolean."""

    model_config = ConfigDict(extra="ignore", strict=True)
    text: Optional[Union[str, list[str]]] = None
    input_ids: Optional[Union[list[int], list[list[int]]]] = None
    sampling_params: Optional[Union[dict[str, Any], list[dict[str, Any]]]] = None
    rid: Optional[Union[str, list[str]]] = None
    stream: bool = False
    return_logprob: Union[bool, list[bool]] = False
    top_logprobs_num: Union[int, list[int]] = 0
    logprob_start_len: Union[int, list[int]] = -1
    # Under --reasoning-parser: the output starts with a reasoning block, and a constraint applies after it.
    require_reasoning: bool = False


class AbortRequest(BaseModel):
    """The /abort_request body (upstream's names)."""

    model_config = ConfigDict(extra="ignore", strict=True)
    rid: str = ""
    abort_all: bool = False


@dataclasses.dataclass
class ServerState:
    server_args: ServerArgs
    subprocesses: Subprocesses
    tokenizer_manager: Optional[TokenizerManager] = None
    ready: bool = False
    exit_code: int = 0
    uvicorn_server: Optional[uvicorn.Server] = None
    gc_watch: Optional[GcWatch] = None  # this process's garbage-collector passes, once ready
    announce_ready: bool = True  # print READY_MESSAGE; a replica leaves it to its launcher


def create_app(state: ServerState) -> FastAPI:
    app = FastAPI(lifespan=_lifespan(state))
    app.state.server = state
    _add_error_handlers(app)
    add_auth(app, state.server_args.api_key)
    add_cors(app)  # after the key check, so outside it: preflights carry no key
    _add_native_routes(app, state)
    _add_openai_routes(app, state)
    return app


def _lifespan(state: ServerState):
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        args = state.server_args
        state.tokenizer_manager = TokenizerManager(
            args,
            state.subprocesses.port_args,
            state.subprocesses.model_info,
            state.subprocesses.why_dead,
            tokenizer=state.subprocesses.tokenizer,
        )
        state.tokenizer_manager.start()
        tasks = [asyncio.create_task(_watchdog(state)), asyncio.create_task(_warm_up_then_ready(state))]
        yield
        for task in tasks:
            task.cancel()
        if state.gc_watch is not None:
            state.gc_watch.stop()
        await state.tokenizer_manager.close()

    return lifespan


async def _warm_up_then_ready(state: ServerState) -> None:
    if not state.server_args.skip_server_warmup:
        try:
            await _generate_once(state.tokenizer_manager, max_new_tokens=1)
        except Exception as e:  # a model that cannot generate one token cannot serve
            logger.error("warm-up generation failed: %s", e)
            _exit(state, 1)
            return
    state.gc_watch = settle_after_startup("HTTP server", state.server_args.gc_warning_threshold_secs)
    state.ready = True
    if state.announce_ready:
        print(READY_MESSAGE, flush=True)  # printed whatever the log level: scripts wait for it
    else:
        logger.info("ready on port %d", state.server_args.port)


async def _generate_once(tm: TokenizerManager, max_new_tokens: int) -> dict:
    obj = GenerateReqInput(input_ids=[0], sampling_params={"max_new_tokens": max_new_tokens, "temperature": 0})
    async for out in tm.generate_request(obj):
        return out


async def _watchdog(state: ServerState) -> None:
    """A dead child makes /health fail at once and the server exit non-zero shortly after."""
    while True:
        await asyncio.sleep(WATCHDOG_INTERVAL_S)
        reason = state.subprocesses.why_dead()
        if reason is None:
            continue
        state.ready = False
        logger.error("%s; the server exits in %.0f s", reason, EXIT_GRACE_S)
        state.tokenizer_manager.fail_all(reason)
        await asyncio.sleep(EXIT_GRACE_S)
        _exit(state, 1)
        return


def _exit(state: ServerState, code: int) -> None:
    state.exit_code = code
    state.ready = False
    if state.uvicorn_server is not None:
        state.uvicorn_server.should_exit = True


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError):
        err = exc.errors()[0] if exc.errors() else {}
        loc = [str(part) for part in err.get("loc", ()) if part != "body"]
        return error_response(
            f"{'.'.join(loc) or 'body'}: {err.get('msg', 'invalid value')}", 400, loc[0] if loc else None
        )

    @app.exception_handler(InvalidRequest)
    async def invalid_request(request: Request, exc: InvalidRequest):
        return invalid_request_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):  # 404, 405, ...
        return error_response(str(exc.detail), exc.status_code)

    @app.exception_handler(ClientDisconnect)
    async def client_gone(request: Request, exc: ClientDisconnect):  # nothing was queued: no traceback
        logger.info("%s %s: the client went away while sending its body", request.method, request.url.path)
        return error_response("the client disconnected while sending the request body", 499)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception):  # uvicorn logs the traceback
        return error_response(f"internal error: {type(exc).__name__}", 500)


def _add_native_routes(app: FastAPI, state: ServerState) -> None:
    @app.get("/health")
    async def health():
        if state.ready and state.subprocesses.why_dead() is None:
            return Response(status_code=200)
        return error_response(state.subprocesses.why_dead() or "the server is not ready", 503)

    @app.get("/health_generate")
    async def health_generate():
        if not state.ready:
            return error_response("the server is not ready", 503)
        try:
            await asyncio.wait_for(_generate_once(state.tokenizer_manager, 1), HEALTH_GENERATE_TIMEOUT_S)
        except Exception as err:
            return error_response(f"a one-token generation failed: {type(err).__name__} {err}", 503)
        return Response(status_code=200)

    @app.get("/get_model_info")
    @app.get("/model_info")  # the newer name, which sglang-router asks first
    async def get_model_info():
        return model_info(state.server_args, state.subprocesses)

    @app.get("/get_server_info")
    @app.get("/server_info")  # the newer name, which sglang-router asks first
    async def get_server_info():
        internal = await state.tokenizer_manager.control("get_internal_state")
        args = dataclasses.asdict(state.server_args)
        args["api_key"] = None if args["api_key"] is None else "<redacted>"
        return {
            **args,
            **state.subprocesses.model_info,
            "internal_states": [internal],
            "scheduler_pid": state.subprocesses.scheduler.pid,
            "detokenizer_pid": state.subprocesses.detokenizer.pid,
            "version": sglang.__version__,
            "http_gc": state.gc_watch.summary() if state.gc_watch is not None else None,
        }

    @app.get("/get_load")
    async def get_load():
        # One row per data-parallel rank, as upstream: sglang-router sums num_tokens over them.
        return [{"dp_rank": 0, **await state.tokenizer_manager.control("get_load")}]

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache():
        if await state.tokenizer_manager.control("flush_cache"):
            return PlainTextResponse("Cache flushed.\n")
        return error_response("cannot flush the cache while requests are running", 400)

    @app.get("/metrics")
    async def metrics():
        tm = state.tokenizer_manager
        if tm.metrics is None:
            return error_response("metrics are off; start the server with --enable-metrics", 404)
        tm.metrics.update_gauges(await tm.control("get_internal_state"))
        return Response(tm.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/generate")
    async def generate(raw_request: Request):
        body = await parse_json_body(
            raw_request,
            GenerateRequest,
            state.server_args.max_payload_size,
            lambda data: reject_native_sampling_fields(data.get("sampling_params")),
        )
        obj = GenerateReqInput(**body.model_dump())
        agen = state.tokenizer_manager.generate_request(obj)
        try:
            if obj.stream:
                return await _stream_native(agen, raw_request)
            result = await cancel_on_disconnect(_first(agen), raw_request)
        except ClientDisconnected:
            return Response(status_code=ABORTED_BY_CLIENT)
        except RuntimeError as err:  # the engine failed (e.g. its scheduler process died)
            logger.error("request failed: %s", err)
            return error_response(f"internal error: {err}", 500)
        return _native_response(result)

    @app.post("/abort_request")
    async def abort_request(raw_request: Request):
        body = await parse_json_body(raw_request, AbortRequest, state.server_args.max_payload_size)
        state.tokenizer_manager.abort_request(body.rid, body.abort_all)
        return Response(status_code=200)  # also for an unknown rid, as upstream


async def _first(agen):
    try:
        return await agen.__anext__()
    finally:
        await agen.aclose()


def _native_response(result: Union[dict, list[dict]]) -> Response:
    results = result if isinstance(result, list) else [result]
    for r in results:
        reason = r["meta_info"].get("finish_reason") or {}
        if reason.get("type") == "abort" and reason.get("status_code") != ABORTED_BY_CLIENT:
            return error_response(reason.get("message", "aborted"), reason.get("status_code", 500), reason.get("param"))
    return JSONResponse(result)


async def _stream_native(agen, raw_request: Request) -> Response:
    # Pull the first chunk before answering, so a request refused up front gets its status code;
    # a client that leaves while its request still waits in the queue aborts it.
    try:
        first = await cancel_on_disconnect(agen.__anext__(), raw_request)
    except BaseException:
        await agen.aclose()
        raise

    async def events():
        try:
            chunk = first
            while True:
                yield sse(chunk)
                chunk = await agen.__anext__()
        except StopAsyncIteration:
            yield sse("[DONE]")
        except Exception as e:  # the engine went away mid-stream
            yield sse({"error": {"message": str(e), "type": "internal_server_error", "param": None, "code": 500}})
            yield sse("[DONE]")
        finally:
            await agen.aclose()

    return StreamingResponse(events(), media_type="text/event-stream")


def _add_openai_routes(app: FastAPI, state: ServerState) -> None:
    from sglang.srt.entrypoints.openai.models import add_model_routes
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
    from sglang.srt.entrypoints.openai.serving_defaults import model_sampling_defaults
    from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
    from sglang.srt.entrypoints.openai.serving_completions import OpenAIServingCompletion

    add_model_routes(app, state.server_args, state.subprocesses.model_info["context_len"])
    # Read (and logged) at start-up, not at the first chat request.
    model_sampling_defaults(state.server_args.model_path, state.server_args.sampling_defaults)
    serving = {}  # built on first use: the tokenizer manager exists only once the app runs

    def handler(cls):
        if cls not in serving:
            serving[cls] = cls(state.tokenizer_manager)
        return serving[cls]

    @app.post("/v1/completions")
    async def completions(raw_request: Request):
        request = await parse_json_body(
            raw_request, CompletionRequest, state.server_args.max_payload_size, reject_openai_fields
        )
        return await handler(OpenAIServingCompletion).handle_request(request, raw_request)

    @app.post("/v1/chat/completions")
    async def chat_completions(raw_request: Request):
        request = await parse_json_body(
            raw_request, ChatCompletionRequest, state.server_args.max_payload_size, reject_openai_fields
        )
        return await handler(OpenAIServingChat).handle_request(request, raw_request)


def launch_server(server_args: ServerArgs, announce_ready: bool = True) -> int:
    """Runs the server until it is stopped; returns the process exit code. Also what
    `sglang_router.launch_server` runs in each replica's process; our own --dp-size launcher
    passes announce_ready=False and prints the ready message once its router serves."""
    check_port_free(server_args.host, server_args.port)  # before the model loads, not after
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _stop_on_signal)
        signal.signal(signal.SIGINT, _stop_on_signal)
    subprocesses = Subprocesses(server_args, forked=True)
    state = ServerState(server_args, subprocesses, announce_ready=announce_ready)
    try:
        config = uvicorn.Config(
            create_app(state),
            host=server_args.host,
            port=server_args.port,
            loop=_event_loop(),
            log_level=server_args.log_level,
            timeout_keep_alive=SERVER_KEEPALIVE_S,
            timeout_graceful_shutdown=SHUTDOWN_TIMEOUT_S,
        )
        logging.getLogger("uvicorn.access").addFilter(redact_query_strings)
        state.uvicorn_server = uvicorn.Server(config)
        try:
            state.uvicorn_server.run()
        except SystemExit:  # uvicorn re-raises the stop signal after its graceful shutdown
            pass
        if not state.uvicorn_server.started and state.exit_code == 0:
            state.exit_code = 1  # e.g. the port was taken
    finally:
        subprocesses.shutdown()
    return state.exit_code


def _stop_on_signal(signum, frame) -> None:
    # SystemExit unwinds through `finally`, so the child processes and sockets are cleaned up
    # whether the signal comes during start-up or after uvicorn's own shutdown.
    raise SystemExit(0)


def _event_loop() -> str:
    try:
        import uvloop  # noqa: F401

        return "uvloop"
    except ImportError:
        return "asyncio"


def main(argv: list[str]) -> None:
    from sglang.srt.entrypoints.replicas import ReplicaSet, parse_launch_args
    from sglang.srt.utils import configure_logger, name_process

    server_args, router_args = parse_launch_args(argv)
    configure_logger(server_args.log_level)
    signal.signal(signal.SIGTERM, _stop_on_signal)
    signal.signal(signal.SIGINT, _stop_on_signal)
    if server_args.dp_size > 1:
        sys.exit(ReplicaSet(server_args, router_args).run())
    name_process("sglang-http")  # its children: sglang-sched, sglang-detok
    try:
        code = launch_server(server_args)
    except RuntimeError as e:  # start-up failures carry their reason
        logger.error("%s", e)
        code = 1
    sys.exit(code)
