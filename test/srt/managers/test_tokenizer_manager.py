"""The tokenizer manager's receiving side, driven over its real ZMQ sockets by a stand-in
detokenizer (no scheduler or model)."""

from __future__ import annotations

import asyncio
import shutil
import time

import zmq

from sglang.srt.managers.io_struct import BatchStrOut, GenerateReqInput, RequestConstants
from sglang.srt.managers.tokenizer_manager import TokenizerManager
from sglang.srt.server_args import PortArgs, ServerArgs

VOCAB = 384


def _step(rid: str, token: int, done: bool = False) -> BatchStrOut:
    return BatchStrOut(
        rids=[rid],
        new_texts=[f"<{token}>"],
        new_token_ids=[[token]],
        finished_reasons=[{"type": "length", "length": 1} if done else None],
        constants=[RequestConstants(prompt_tokens=3) if token == 1 else None],
        completion_tokens=[token],
        new_token_logprobs=[None],
        new_top_logprobs=[None],
    )


async def _stream_while_steps_arrive_in_bursts(model_path: str, bursts: list[int]) -> list[dict]:
    """One streamed request; the stand-in detokenizer sends `bursts[i]` one-token steps at once
    (all queued before the server's event loop runs again), then waits for the chunk."""
    port_args = PortArgs.create()
    args = ServerArgs(model_path=model_path, device="cpu")
    tm = TokenizerManager(
        args, port_args, {"context_len": 512, "vocab_size": VOCAB, "max_running_requests": 8}, lambda: None
    )
    ctx = zmq.Context()
    detok = ctx.socket(zmq.PUSH)
    detok.connect(port_args.tokenizer_ipc)
    chunks = []
    try:
        agen = tm.generate_request(
            GenerateReqInput(input_ids=[1, 2, 3], rid="r", stream=True, sampling_params={"max_new_tokens": 64})
        )
        reader = asyncio.ensure_future(agen.__anext__())
        await asyncio.sleep(0.05)  # the request is sent; the reader waits for output
        token = 0
        for b, size in enumerate(bursts):
            for _ in range(size):
                token += 1
                detok.send_pyobj(_step("r", token, done=b == len(bursts) - 1 and _ == size - 1))
            time.sleep(0.05)  # blocks the loop: the whole burst is queued when it next runs
            chunks.append(await asyncio.wait_for(reader, 5))
            if b < len(bursts) - 1:
                reader = asyncio.ensure_future(agen.__anext__())
        await agen.aclose()
    finally:
        detok.close(linger=0)
        ctx.term()
        await tm.close()
        shutil.rmtree(port_args.ipc_dir, ignore_errors=True)
    return chunks


def test_a_stream_that_fell_behind_gets_the_missed_steps_in_one_chunk(tiny_model_paths):
    chunks = asyncio.run(_stream_while_steps_arrive_in_bursts(tiny_model_paths["llama"], [1, 5, 3]))
    # One chunk per burst, each carrying everything so far: 1, then 1 + 5, then 1 + 5 + 3 tokens.
    assert [c["output_ids"] for c in chunks] == [[1], [1, 2, 3, 4, 5, 6], list(range(1, 10))]
    assert chunks[-1]["text"] == "".join(f"<{t}>" for t in range(1, 10))
    assert [c["meta_info"]["finish_reason"] for c in chunks] == [None, None, {"type": "length", "length": 1}]


def test_a_finish_that_arrives_while_a_chunk_is_on_its_way_is_still_streamed(tiny_model_paths):
    """The caller takes a chunk; the request's last step arrives and is handled before the caller
    asks for the next one (a busy server's HTTP process writing the chunk out): the stream must
    still send the final chunk, with the finish reason and every token, before it ends."""

    async def run():
        port_args = PortArgs.create()
        args = ServerArgs(model_path=tiny_model_paths["llama"], device="cpu")
        tm = TokenizerManager(
            args, port_args, {"context_len": 512, "vocab_size": VOCAB, "max_running_requests": 8}, lambda: None
        )
        ctx = zmq.Context()
        detok = ctx.socket(zmq.PUSH)
        detok.connect(port_args.tokenizer_ipc)
        try:
            agen = tm.generate_request(
                GenerateReqInput(input_ids=[1, 2, 3], rid="r", stream=True, sampling_params={"max_new_tokens": 64})
            )
            reader = asyncio.ensure_future(agen.__anext__())
            await asyncio.sleep(0.05)
            detok.send_pyobj(_step("r", 1))
            first = await asyncio.wait_for(reader, 5)
            detok.send_pyobj(_step("r", 2, done=True))
            await asyncio.sleep(0.1)  # the receiving loop handles the last step meanwhile
            rest = [chunk async for chunk in agen]
        finally:
            detok.close(linger=0)
            ctx.term()
            await tm.close()
            shutil.rmtree(port_args.ipc_dir, ignore_errors=True)
        return first, rest

    first, rest = asyncio.run(run())
    assert first["output_ids"] == [1] and first["meta_info"]["finish_reason"] is None
    assert [c["output_ids"] for c in rest] == [[1, 2]]
    assert rest[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 1}


def test_the_per_step_diagnosis_sends_one_step_per_chunk(tiny_model_paths, monkeypatch):
    monkeypatch.setenv("SGLANG_STREAM_EVERY_STEP", "1")
    chunks = asyncio.run(_stream_while_steps_arrive_in_bursts(tiny_model_paths["llama"], [1, 5, 3]))
    assert [c["output_ids"] for c in chunks] == [[1], [1, 2], [1, 2, 3]]


def test_a_chat_template_file_serves_chat_for_a_tokenizer_without_one(tiny_model_paths, tmp_path):
    """--chat-template: the file's template renders chat prompts, tools included, although the
    tokenizer has no template of its own."""
    import json

    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
    from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat

    model = tmp_path / "model"
    shutil.copytree(tiny_model_paths["llama"], model)
    config_path = model / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.pop("chat_template", None)
    config_path.write_text(json.dumps(config))
    (model / "chat_template.jinja").unlink(missing_ok=True)
    from sglang.srt.hf_transformers_utils import get_tokenizer

    assert not get_tokenizer(str(model)).chat_template
    template = tmp_path / "chat.jinja"
    template.write_text(
        "{% for t in tools or [] %}[{{ t.function.name }}]{% endfor %}"
        "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    )
    port_args = PortArgs.create()
    tm = TokenizerManager(
        ServerArgs(model_path=str(model), device="cpu", chat_template=str(template)),
        port_args,
        {"context_len": 512, "vocab_size": VOCAB, "max_running_requests": 8},
        lambda: None,
    )
    try:
        request = ChatCompletionRequest(
            messages=[{"role": "user", "content": "hi"}], tools=[{"type": "function", "function": {"name": "add"}}]
        )
        prompt = OpenAIServingChat(tm).build_prompts(request).values[0]
        assert tm.tokenizer.decode(prompt) == "[add]user: hi\n"
    finally:
        asyncio.run(tm.close())
        shutil.rmtree(port_args.ipc_dir, ignore_errors=True)


SLOW_SCHEMA = '{"type": "string", "pattern": "(ab|cd){1,4000}"}'  # about 2-3 s to parse on one core


def grammar_check_manager(tiny_model_paths, monkeypatch) -> tuple[TokenizerManager, PortArgs]:
    """A tokenizer manager whose grammar checks time out after 0.3 s (made inside the event loop)."""
    from sglang.srt.managers import tokenizer_manager

    monkeypatch.setattr(tokenizer_manager, "CONSTRAINT_CHECK_TIMEOUT_S", 0.3)
    port_args = PortArgs.create()
    return TokenizerManager(
        ServerArgs(model_path=tiny_model_paths["llama"], device="cpu"),
        port_args,
        {"context_len": 512, "vocab_size": VOCAB, "max_running_requests": 8},
        lambda: None,
    ), port_args


def test_a_grammar_slow_to_parse_is_refused_by_name_while_the_event_loop_keeps_running(tiny_model_paths, monkeypatch):
    """A json_schema whose pattern takes seconds to expand is parsed on the grammar-check threads:
    the event loop keeps ticking meanwhile, and past the time limit the request is refused naming
    json_schema. A grammar that parses quickly is checked the same way and goes through."""
    import pytest

    from sglang.srt.errors import InvalidRequest

    slow = SLOW_SCHEMA

    async def run():
        tm, port_args = grammar_check_manager(tiny_model_paths, monkeypatch)
        ticks = []

        async def ticker():
            while True:
                ticks.append(time.perf_counter())
                await asyncio.sleep(0.01)

        task = asyncio.ensure_future(ticker())
        try:
            started = time.perf_counter()
            with pytest.raises(InvalidRequest) as excinfo:
                await tm.tokenize_request(
                    GenerateReqInput(
                        input_ids=[[1, 2], [3, 4]], sampling_params=[{"json_schema": slow}, {"json_schema": slow}]
                    )
                )  # one check for the two
            took = time.perf_counter() - started
            quick = await tm.tokenize_request(
                GenerateReqInput(input_ids=[1, 2], sampling_params={"regex": "[a-z]+", "max_new_tokens": 4})
            )
        finally:
            task.cancel()
            await tm.close()
            shutil.rmtree(port_args.ipc_dir, ignore_errors=True)
        return excinfo.value, took, ticks, quick

    error, took, ticks, quick = asyncio.run(run())
    assert error.param == "json_schema" and "not parsed within" in str(error)
    assert took < 1.5, took
    gaps = [b - a for a, b in zip(ticks, ticks[1:])]
    assert max(gaps) < 0.2, max(gaps)
    assert len(quick) == 1 and quick[0].sampling_params.regex == "[a-z]+"


def test_requests_repeating_a_grammar_being_parsed_share_its_check(tiny_model_paths, monkeypatch):
    """Three requests with the same slow json_schema at once are refused by name, and take one
    grammar-check thread between them, not all: a quick grammar sent next still parses in time."""
    from sglang.srt.errors import InvalidRequest

    async def run():
        tm, port_args = grammar_check_manager(tiny_model_paths, monkeypatch)
        try:
            refused = await asyncio.gather(
                *[
                    tm.tokenize_request(
                        GenerateReqInput(input_ids=[1, 2], sampling_params={"json_schema": SLOW_SCHEMA})
                    )
                    for _ in range(3)
                ],
                return_exceptions=True,
            )
            checks_running = len(tm.constraint_checks)
            quick = await tm.tokenize_request(
                GenerateReqInput(input_ids=[1, 2], sampling_params={"regex": "[a-z]+", "max_new_tokens": 4})
            )
        finally:
            await tm.close()
            shutil.rmtree(port_args.ipc_dir, ignore_errors=True)
        return refused, checks_running, quick

    refused, checks_running, quick = asyncio.run(run())
    assert all(isinstance(error, InvalidRequest) and error.param == "json_schema" for error in refused), refused
    assert checks_running == 1
    assert len(quick) == 1 and quick[0].sampling_params.regex == "[a-z]+"
