"""One benchmark invocation against one server: read its model info, load its tokenizer, warm
up, then run each concurrency level in turn and append one result line per level."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime
import gc
import json
import math
import os
import random
import time

import aiohttp

from sglang.benchmark.backends import BACKEND_ROUTES, BackendClient, RequestOptions, RequestResult
from sglang.benchmark.datasets import (
    BenchRequest,
    DatasetError,
    RandomDataset,
    SharedPrefixDataset,
    ShareGPTDataset,
    chat_template_text,
    sampleable_token_ids,
    sharegpt_prompt_ids,
)
from sglang.benchmark.metrics import format_summary, request_details, summarize
from sglang.benchmark.upstream_flags import DEFAULT_PORTS
from sglang.benchmark.trace import draw_accept_length, load_trace, parse_mix, play_trace, trace_line

CONNECT_TIMEOUT_S = 10
INFO_TIMEOUT_S = 30


class BenchmarkError(Exception):
    """Ends the benchmark with a one-line message and exit status 1 (so does DatasetError)."""


CLIENT_KEEPALIVE_S = 2.0


@dataclasses.dataclass
class Bench:
    """What every level of one invocation shares."""

    args: argparse.Namespace
    session: aiohttp.ClientSession
    base_url: str
    model: str
    client: BackendClient
    dataset: RandomDataset | ShareGPTDataset | SharedPrefixDataset
    data_rng: random.Random  # draws the prompts of the warm-up and of each level in turn
    tokenizer: object = None  # retokenizes the generated text (total_output_tokens_retokenized)


async def run(args: argparse.Namespace) -> list[dict]:
    """Runs every level of `args.max_concurrency`; returns the result lines written."""
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S, sock_read=args.request_timeout)
    # limit=0: aiohttp's default pool of 100 connections would cap the concurrency.
    # An idle kept-alive connection is dropped after CLIENT_KEEPALIVE_S, well before any server
    # closes it (ours after 30 s): reusing one the server is closing at that moment
    # fails the request with ServerDisconnectedError.
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=CLIENT_KEEPALIVE_S)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        bench = await connect(args, session)
        await warm_up(bench.client, bench.dataset.sample(args.warmup_requests, bench.data_rng))
        if getattr(args, "trace", None):
            return [await measure_trace(bench)]
        levels = args.max_concurrency or [None]
        lines = []
        for index, level in enumerate(levels):
            line = await measure_level(bench, level, f"[{index + 1}/{len(levels)}] concurrency {level or 'unlimited'}")
            lines.append(line)
            if line["failed"]:
                await check_alive(session, bench.base_url, line)
        return lines


async def connect(args: argparse.Namespace, session: aiohttp.ClientSession) -> Bench:
    """Reads the server's model info and loads its tokenizer to build the dataset."""
    port = args.port or DEFAULT_PORTS.get(args.backend, 30000)
    base_url = (args.base_url or f"http://{args.host}:{port}").rstrip("/")
    info = await model_info(session, base_url, getattr(args, "ready_check_timeout_sec", 0))
    tokenizer = load_tokenizer(args.tokenizer or info.get("tokenizer_path") or info["model_path"])
    data_rng = random.Random(args.seed)
    dataset = build_dataset(args, tokenizer, info.get("vocab_size"), data_rng)
    model = (
        getattr(args, "served_model_name", None)
        or args.model
        or info.get("served_model_name")
        or info.get("model_path")
    )
    api_key = args.api_key or os.environ.get("OPENAI_API_KEY")
    client = BackendClient(session, base_url, args.backend, model, api_key, request_options(args))
    return Bench(args, session, base_url, model, client, dataset, data_rng, tokenizer)


async def model_info(session: aiohttp.ClientSession, base_url: str, wait_s: float = 0) -> dict:
    """The server's /get_model_info; a server without it (vLLM, lmdeploy) is asked /v1/models
    and its first model stands for the model and tokenizer paths. With `wait_s`, a server that
    does not answer yet is asked again until then (upstream's --ready-check-timeout-sec)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return await get_json(session, f"{base_url}/get_model_info")
        except BenchmarkError as e:
            if "answered HTTP 404" in str(e):
                models = (await get_json(session, f"{base_url}/v1/models")).get("data") or [{}]
                if not models[0].get("id"):
                    raise BenchmarkError(f"{base_url}/v1/models lists no model; pass --model and --tokenizer")
                return {"model_path": models[0]["id"], "served_model_name": models[0]["id"]}
            if time.monotonic() >= deadline:
                raise
        await asyncio.sleep(1)


def request_options(args) -> RequestOptions:
    return RequestOptions(
        stream=not getattr(args, "disable_stream", False),
        ignore_eos=not getattr(args, "disable_ignore_eos", False),
        temperature=getattr(args, "temperature", 0.0),
        top_p=getattr(args, "top_p", None),
        extra_body=getattr(args, "extra_request_body", None) or {},
        headers=dict(getattr(args, "header", None) or []),
    )


def level_prompts(args, level: int | None) -> int:
    """Requests measured at concurrency `level`: --num-prompts, raised to --prompts-per-concurrency
    x level, then capped by --max-prompts-per-level (which the CLI keeps >= --num-prompts)."""
    wanted = max(args.num_prompts, (args.prompts_per_concurrency or 0) * (level or 0))
    return wanted if args.max_prompts_per_level is None else min(wanted, args.max_prompts_per_level)


async def measure_level(bench: Bench, level: int | None, desc: str) -> dict:
    """One run at concurrency `level`: its result line, printed and appended to the output file."""
    args = bench.args
    if args.flush_cache:
        await flush_cache(bench.session, bench.base_url)
    num_prompts = level_prompts(args, level)
    requests = bench.dataset.sample(num_prompts, bench.data_rng)
    mix = parse_mix(args.accept_length_mix) if getattr(args, "accept_length_mix", None) else None
    for request in requests:
        request.simulated_accept_length = draw_accept_length(mix, bench.data_rng)
    # The same arrival times at every level, so levels differ only in their concurrency.
    arrival_rng = random.Random(f"arrivals-{args.seed}")
    before = await server_spec_counters(bench.session, bench.base_url)
    results, start, duration = await run_level(
        bench.client,
        requests,
        level,
        args.request_rate,
        arrival_rng,
        desc,
        args.disable_tqdm,
        getattr(args, "burstiness", 1.0),
    )
    line = {
        **config_fields(args, bench.base_url, bench.model, level, num_prompts),
        **summarize(results, start, duration),
    }
    line["total_output_tokens_retokenized"] = retokenized_output_tokens(bench.tokenizer, results)
    if before is not None:
        line.update(spec_level_fields(before, await server_spec_counters(bench.session, bench.base_url)))
    if before is not None:  # the level's own steps: exact, and not inflated by plain steps' tokens
        line["accept_length"] = line.get("spec_accept_length")
    elif line["accept_length"] is None:
        line["accept_length"] = await server_accept_length(bench.session, bench.base_url)
    print(format_summary(line), flush=True)
    line["server_info"] = await server_info(bench.session, bench.base_url)
    if getattr(args, "output_details", False):  # upstream's arrays; its `errors` is one string per request
        line = {**line, "error_summary": line["errors"], **request_details(results)}
    if args.output_file:
        append_line(args.output_file, line)
    return line


def retokenized_output_tokens(tokenizer, results: list[RequestResult]) -> int | None:
    """The generated texts' tokens by the client's tokenizer (upstream's
    total_output_tokens_retokenized; differs from total_output_tokens where text does not
    round-trip)."""
    if tokenizer is None:
        return None
    texts = [r.generated_text for r in results if r.success and r.generated_text]
    return sum(len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]) if texts else 0


async def server_info(session: aiohttp.ClientSession, base_url: str) -> dict | None:
    try:
        return await get_json(session, f"{base_url}/get_server_info")
    except BenchmarkError:
        return None


async def measure_trace(bench: Bench) -> dict:
    """The --trace run: its result line (the whole trace, and per phase), printed and appended."""
    args = bench.args
    phases = load_trace(args.trace)
    if args.flush_cache:
        await flush_cache(bench.session, bench.base_url)
    before = await server_spec_counters(bench.session, bench.base_url)
    with settled_gc():
        results, start, duration = await play_trace(bench.client, bench.dataset, bench.data_rng, phases)
    line = {
        **config_fields(args, bench.base_url, bench.model, None, len(results)),
        "trace": args.trace,
        **trace_line(results, phases, start, duration),
    }
    if before is not None:
        line.update(spec_level_fields(before, await server_spec_counters(bench.session, bench.base_url)))
        line["accept_length"] = line.get("spec_accept_length")
    print(format_summary(line), flush=True)
    if args.output_file:
        append_line(args.output_file, line)
    return line


@contextlib.contextmanager
def settled_gc():
    """Around a measured run: collect, then freeze what the client holds (its imports, tokenizer and
    dataset: some 300K objects the garbage collector tracks) out of the collector's passes, so that
    a full pass during the run walks only the run's own objects (over all of them, a pass paused the
    client for 140 ms on a 2-core CPU, time its requests would count as the server's); afterwards
    they are the collector's again."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


async def get_json(session: aiohttp.ClientSession, url: str) -> dict:
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=INFO_TIMEOUT_S)) as response:
            if response.status != 200:
                raise BenchmarkError(f"{url} answered HTTP {response.status}; is this an SGLang server?")
            return await response.json(content_type=None)
    except (asyncio.TimeoutError, aiohttp.ClientError, ConnectionError, ValueError) as e:
        reason = "timed out" if isinstance(e, asyncio.TimeoutError) else f"{type(e).__name__}: {e}"
        raise BenchmarkError(f"cannot reach the server at {url} ({reason}); is it running?") from None


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise BenchmarkError(
            f"cannot load the tokenizer from {path!r} ({type(e).__name__}); pass --tokenizer with a local copy"
        ) from None


def dataset_name(args) -> str:
    """--dataset-name, else as upstream (whose default is sharegpt) when --dataset-path is given,
    else random."""
    return args.dataset_name or ("sharegpt" if args.dataset_path else "random")


def build_dataset(args, tokenizer, vocab_size: int | None, rng: random.Random):
    name = dataset_name(args)
    wrap = (lambda text: chat_template_text(tokenizer, text)) if getattr(args, "apply_chat_template", False) else None
    if name in ("random", "random-ids"):
        if wrap is not None:
            to_text = lambda ids: wrap(tokenizer.decode(ids))  # noqa: E731
        else:
            to_text = tokenizer.decode if BACKEND_ROUTES[args.backend] == "chat" else None
        source = sharegpt_prompt_ids(args.dataset_path, tokenizer) if name == "random" and args.dataset_path else None
        return RandomDataset(
            sampleable_token_ids(tokenizer, vocab_size),
            args.random_input_len,
            args.random_output_len,
            args.random_range_ratio,
            to_text,
            source,
        )
    if name == "generated-shared-prefix":
        return SharedPrefixDataset(
            tokenizer,
            sampleable_token_ids(tokenizer, vocab_size),
            rng,
            args.gsp_num_groups,
            args.gsp_prompts_per_group,
            args.gsp_system_prompt_len,
            args.gsp_question_len,
            args.gsp_output_len,
            wrap,
        )
    if not args.dataset_path:
        raise DatasetError(
            "--dataset-name sharegpt needs --dataset-path (a local JSON or JSONL file); nothing is downloaded"
        )
    return ShareGPTDataset(
        args.dataset_path, tokenizer, rng, args.sharegpt_output_len, getattr(args, "sharegpt_context_len", None), wrap
    )


async def warm_up(client: BackendClient, requests: list[BenchRequest]) -> None:
    """Requests that are not measured; one that fails means the server cannot serve the run."""
    for result in await asyncio.gather(*(client.send(r) for r in requests)):
        if not result.success:
            raise BenchmarkError(f"the warm-up request failed: {result.error}")


async def run_level(
    client: BackendClient,
    requests: list[BenchRequest],
    max_concurrency: int | None,
    request_rate: float,
    arrival_rng: random.Random,
    desc: str,
    disable_tqdm: bool,
    burstiness: float = 1.0,
) -> tuple[list[RequestResult], float, float]:
    """Sends `requests` with Poisson arrivals at `request_rate` (inf: all at once), at most
    `max_concurrency` in flight; returns (results, start time, duration). `burstiness` other
    than 1 draws the gaps from a gamma distribution of the same mean (vLLM's --burstiness:
    below 1 burstier, above 1 more even)."""
    from tqdm.asyncio import tqdm

    limit = asyncio.Semaphore(max_concurrency) if max_concurrency else contextlib.nullcontext()
    progress = tqdm(total=len(requests), desc=desc, disable=disable_tqdm)

    async def one(request: BenchRequest) -> RequestResult:
        async with limit:
            result = await client.send(request)
        progress.update(1)
        return result

    with settled_gc():
        start = time.perf_counter()
        tasks = []
        for request in requests:
            tasks.append(asyncio.create_task(one(request)))
            if math.isfinite(request_rate):
                await asyncio.sleep(arrival_gap(arrival_rng, request_rate, burstiness))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
    progress.close()
    return results, start, duration


def arrival_gap(rng: random.Random, request_rate: float, burstiness: float = 1.0) -> float:
    if burstiness == 1.0:
        return rng.expovariate(request_rate)
    return rng.gammavariate(burstiness, 1.0 / (request_rate * burstiness))


def config_fields(args, base_url: str, model: str, level: int | None, num_prompts: int) -> dict:
    return {
        "tag": getattr(args, "tag", None),
        "backend": args.backend,
        "label": args.label or f"{args.backend} {model}",
        "base_url": base_url,
        "model": model,
        "dataset_name": dataset_name(args),
        "dataset_path": args.dataset_path,
        "sharegpt_output_len": getattr(args, "sharegpt_output_len", None),
        "num_prompts": num_prompts,
        "request_rate": args.request_rate if math.isfinite(args.request_rate) else "inf",
        "burstiness": getattr(args, "burstiness", 1.0),
        "max_concurrency": level,
        "random_input_len": args.random_input_len,
        "random_output_len": args.random_output_len,
        "random_range_ratio": args.random_range_ratio,
        "seed": args.seed,
        "warmup_requests": args.warmup_requests,
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
    }


async def server_accept_length(session: aiohttp.ClientSession, base_url: str) -> float | None:
    """The scheduler's mean accept length, for backends whose responses do not carry it."""
    try:
        state = (await get_json(session, f"{base_url}/get_server_info"))["internal_states"][0]
    except (BenchmarkError, KeyError, IndexError, TypeError):
        return None
    value = state.get("avg_spec_accept_length", state.get("spec_accept_length"))
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


async def server_spec_counters(session: aiohttp.ClientSession, base_url: str) -> dict | None:
    """A speculative server's step counters (None for a server without a draft or without them)."""
    try:
        state = (await get_json(session, f"{base_url}/get_server_info"))["internal_states"][0]
    except (BenchmarkError, KeyError, IndexError, TypeError):
        return None
    if not isinstance(state.get("spec_steps_by_k"), dict):
        return None
    return {
        "steps_by_k": {int(k): int(n) for k, n in state["spec_steps_by_k"].items()},
        "verifies": int(state.get("spec_verifies", 0)),
        "tokens": int(state.get("spec_tokens", 0)),
        "prompts_without_draft": int(state.get("spec_prompts_without_draft", 0)),
    }


def spec_level_fields(before: dict, after: dict | None) -> dict:
    """What the server did during one level: decode steps per chosen k (0: plain), each k's share
    of the steps, the accept length of the level's speculative steps alone (the cumulative
    /get_server_info value mixes in earlier levels and the warm-up), and how many prompts were
    admitted without the draft (those requests decode plainly even in speculative steps)."""
    if after is None:
        return {}
    steps = {
        k: after["steps_by_k"].get(k, 0) - before["steps_by_k"].get(k, 0)
        for k in sorted(set(after["steps_by_k"]) | set(before["steps_by_k"]))
    }
    steps = {k: n for k, n in steps.items() if n > 0}
    total = sum(steps.values())
    verifies = after["verifies"] - before["verifies"]
    return {
        "spec_steps_by_k": {str(k): n for k, n in steps.items()},
        "spec_step_share_by_k": {str(k): n / total for k, n in steps.items()} if total else {},
        "spec_accept_length": (after["tokens"] - before["tokens"]) / verifies if verifies > 0 else None,
        "spec_prompts_without_draft": after.get("prompts_without_draft", 0) - before.get("prompts_without_draft", 0),
    }


async def flush_cache(session: aiohttp.ClientSession, base_url: str) -> None:
    try:
        async with session.post(f"{base_url}/flush_cache") as response:
            if response.status != 200:
                raise BenchmarkError(f"/flush_cache answered HTTP {response.status}: {await response.text()}")
    except (asyncio.TimeoutError, aiohttp.ClientError, ConnectionError) as e:
        raise BenchmarkError(f"cannot flush the server's cache ({type(e).__name__}: {e})") from None


async def check_alive(session: aiohttp.ClientSession, base_url: str, line: dict) -> None:
    """After failures: a server that no longer answers ends the sweep with an error."""
    try:
        async with session.get(f"{base_url}/health", timeout=aiohttp.ClientTimeout(total=10)) as response:
            if response.status == 200:
                return
            reason = f"/health answers HTTP {response.status}"
    except (asyncio.TimeoutError, aiohttp.ClientError, ConnectionError) as e:
        reason = f"{type(e).__name__}"
    raise BenchmarkError(
        f"the server at {base_url} is down ({reason}); {line['failed']} of "
        f"{line['num_prompts']} requests failed at concurrency {line['max_concurrency']}"
    )


def append_line(path: str, line: dict) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")
