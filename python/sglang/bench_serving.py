"""Online serving benchmark: streams requests to a running server and reports throughput,
TTFT, ITL, TPOT, end-to-end latency and achieved concurrency (docs/bench_serving.md).

    python -m sglang.bench_serving --backend sglang --port 30000 --dataset-name random \\
        --random-input-len 1024 --random-output-len 128 --num-prompts 200 \\
        --max-concurrency 1,2,4,8 --output-file results.jsonl
    python -m sglang.bench_serving plot results.jsonl other.jsonl --output compare.png

Exit status: 0 when every level completed requests, 1 on a clear error (server unreachable or
gone, bad arguments, a level where nothing completed), 130 when interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from sglang.benchmark import upstream_flags
from sglang.benchmark.backends import BACKEND_ROUTES, BACKENDS

DATASETS = ("random", "random-ids", "sharegpt", "generated-shared-prefix")


def concurrency_levels(value: str) -> list[int]:
    try:
        levels = [int(part) for part in value.replace(" ", ",").split(",") if part]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers like 1,2,4; got {value!r}") from None
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(f"concurrency levels must be >= 1; got {value!r}")
    return levels


def positive_float(value: str) -> float:
    number = float(value)
    if not number > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 (inf for all at once); got {value!r}")
    return number


def finite_positive(value: str) -> float:
    number = float(value)
    if not 0 < number < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0; got {value!r}")
    return number


def count(minimum: int):
    def parse(value: str) -> int:
        number = int(value)
        if number < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}; got {value!r}")
        return number

    return parse


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sglang.bench_serving",
        description=__doc__.split("\n\n")[0],
        epilog="Plot result files: python -m sglang.bench_serving plot FILE... -o out.png",
    )
    server = parser.add_argument_group("server")
    server.add_argument(
        "--backend",
        choices=BACKENDS,
        default="sglang",
        type=upstream_flags.choice_or_refusal(BACKENDS, upstream_flags.REFUSED_BACKENDS, "--backend"),
        help="sglang, sglang-native: /generate; sglang-oai, vllm, lmdeploy: /v1/completions; "
        "sglang-oai-chat, vllm-chat, lmdeploy-chat: /v1/chat/completions",
    )
    server.add_argument("--base-url", default=None, help="e.g. http://127.0.0.1:30000 (overrides --host/--port)")
    server.add_argument("--host", default="127.0.0.1")
    server.add_argument("--port", type=int, default=None, help="default 30000 (vllm: 8000, lmdeploy: 23333)")
    server.add_argument("--model", default=None, help="model name for OpenAI requests (default: the served one)")
    server.add_argument("--served-model-name", default=None, help="model name sent in requests (overrides --model)")
    server.add_argument("--tokenizer", default=None, help="default: the server's tokenizer path (/get_model_info)")
    server.add_argument("--api-key", default=None, help="sent as a bearer token (default: $OPENAI_API_KEY)")
    server.add_argument(
        "--header",
        type=upstream_flags.header,
        nargs="+",
        default=None,
        metavar="KEY=VALUE",
        help="extra HTTP headers of every request",
    )
    server.add_argument(
        "--request-timeout",
        type=float,
        default=600,
        help="seconds a request may go without receiving a byte before it counts as failed",
    )
    server.add_argument(
        "--ready-check-timeout-sec",
        type=float,
        default=0,
        help="seconds to keep asking a server that does not answer yet (default 0: fail at once)",
    )
    data = parser.add_argument_group("requests")
    data.add_argument(
        "--dataset-name",
        choices=DATASETS,
        default=None,
        type=upstream_flags.choice_or_refusal(DATASETS, upstream_flags.REFUSED_DATASETS, "--dataset-name"),
        help="default: sharegpt with --dataset-path, else random",
    )
    data.add_argument(
        "--dataset-path",
        default=None,
        help="local ShareGPT-layout JSON or JSONL file (random: prompts are cut from its prompts)",
    )
    data.add_argument(
        "--sharegpt-output-len",
        type=count(1),
        default=None,
        help="output tokens per ShareGPT request (default: the reply's length)",
    )
    data.add_argument(
        "--sharegpt-context-len",
        type=count(2),
        default=None,
        help="drop ShareGPT conversations whose prompt and output tokens add up to more",
    )
    data.add_argument(
        "--apply-chat-template",
        action="store_true",
        help="wrap each prompt in the tokenizer's chat template (not with the chat backends)",
    )
    data.add_argument(
        "--tokenize-prompt",
        action="store_true",
        help="send token ids (random datasets with --backend sglang already do)",
    )
    data.add_argument("--random-input-len", type=int, default=1024)
    data.add_argument("--random-output-len", type=int, default=1024)
    data.add_argument(
        "--random-range-ratio",
        type=float,
        default=0.0,
        help="lengths are uniform in [len * ratio, len]; 1 gives fixed lengths",
    )
    data.add_argument("--num-prompts", type=count(1), default=1000, help="measured requests per level")
    data.add_argument(
        "--prompts-per-concurrency",
        type=count(1),
        default=None,
        help="at least this many requests per unit of concurrency at each level",
    )
    data.add_argument(
        "--max-prompts-per-level",
        type=count(1),
        default=None,
        help="at most this many requests at any level (caps --prompts-per-concurrency, so "
        "low levels can run many requests each without the highest running for minutes)",
    )
    data.add_argument("--seed", type=int, default=1)
    gsp = parser.add_argument_group("generated-shared-prefix requests")
    gsp.add_argument("--gsp-num-groups", type=count(1), default=64, help="system prompts")
    gsp.add_argument("--gsp-prompts-per-group", type=count(1), default=16, help="questions per system prompt")
    gsp.add_argument("--gsp-system-prompt-len", type=count(1), default=2048, help="tokens of each system prompt")
    gsp.add_argument("--gsp-question-len", type=count(1), default=128, help="tokens of each question")
    gsp.add_argument("--gsp-output-len", type=count(1), default=256, help="output tokens of every request")
    sampling = parser.add_argument_group("sampling")
    sampling.add_argument(
        "--disable-stream", action="store_true", help="one JSON answer per request: TTFT is the whole latency, no ITL"
    )
    sampling.add_argument(
        "--disable-ignore-eos", action="store_true", help="requests may stop at EOS before their output length"
    )
    sampling.add_argument("--temperature", type=float, default=0.0)
    sampling.add_argument("--top-p", type=float, default=None, help="not sent unless given")
    sampling.add_argument(
        "--extra-request-body",
        type=upstream_flags.json_object,
        default=None,
        metavar="JSON",
        help="merged into every request body last, e.g. '{\"top_k\": 5}' (native backend: "
        'a "sampling_params" object is merged into the sampling parameters)',
    )
    load = parser.add_argument_group("load")
    load.add_argument(
        "--request-rate",
        type=positive_float,
        default=float("inf"),
        help="requests per second, Poisson arrivals; inf sends all at once",
    )
    load.add_argument(
        "--burstiness",
        type=finite_positive,
        default=1.0,
        help="with a finite --request-rate: 1 Poisson arrivals; below 1 burstier, above 1 more "
        "even (gamma-distributed gaps of the same mean)",
    )
    load.add_argument(
        "--max-concurrency",
        type=concurrency_levels,
        default=None,
        help="requests in flight at most; a list (1,2,4) runs a sweep, one level after another",
    )
    load.add_argument("--warmup-requests", type=count(0), default=1, help="unmeasured requests sent first")
    load.add_argument("--flush-cache", action="store_true", help="flush the server's prefix cache before each level")
    load.add_argument(
        "--trace",
        default=None,
        help="play a time-varying load instead of levels: a JSON file of phases, each with seconds, "
        "a concurrency (or a [from, to] ramp) and optionally an accept_mix (docs/bench_serving.md)",
    )
    load.add_argument(
        "--accept-length-mix",
        default=None,
        help="benchmarks of speculation on random weights: each request asks a server run with "
        "SGLANG_SIMULATE_ACC_LEN for its own accept length, drawn from LEN:WEIGHT,... "
        "(e.g. 3.0:0.7,1.4:0.3); --backend sglang only",
    )
    out = parser.add_argument_group("output")
    out.add_argument(
        "--output-file",
        default=None,
        help="append one JSON line per level to this file (default: upstream's "
        "<backend>_<MMDD>_<prompts>_<in>_<out>.jsonl in the current directory)",
    )
    out.add_argument(
        "--output-details",
        action="store_true",
        help="add per-request arrays to each line (input_lens, output_lens, ttfts, itls, generated_texts, errors)",
    )
    out.add_argument("--tag", default=None, help="written as the line's tag field")
    out.add_argument("--label", default=None, help="name of this configuration in plots (default: backend model)")
    out.add_argument("--disable-tqdm", action="store_true")
    upstream_flags.add_refused_flags(parser)
    return parser


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Combinations the parser cannot refuse on its own; errors exit with status 2."""
    if args.max_prompts_per_level is not None and args.max_prompts_per_level < args.num_prompts:
        parser.error(
            f"--max-prompts-per-level {args.max_prompts_per_level} is below --num-prompts "
            f"{args.num_prompts}: every level measures at least --num-prompts requests"
        )
    route = BACKEND_ROUTES[args.backend]
    if (args.trace or args.accept_length_mix) and route != "native":
        parser.error(
            "--trace and --accept-length-mix need --backend sglang (simulated accept lengths are a "
            "sampling parameter of /generate)"
        )
    if args.apply_chat_template and route == "chat":
        parser.error(
            f"--apply-chat-template with --backend {args.backend}: the chat route applies the server's template already"
        )
    if args.tokenize_prompt and (
        route != "native" or args.apply_chat_template or args.dataset_name not in (None, "random", "random-ids")
    ):
        parser.error("--tokenize-prompt needs --backend sglang, a random dataset and no --apply-chat-template")
    if args.burstiness != 1.0 and args.request_rate == float("inf"):
        parser.error("--burstiness shapes the gaps between arrivals: it needs a finite --request-rate")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["plot"]:
        from sglang.benchmark import plot

        return plot.main(argv[1:])
    parser = make_parser()
    args = parser.parse_args(argv)
    check_args(parser, args)
    from sglang.benchmark.datasets import DatasetError
    from sglang.benchmark.runner import BenchmarkError, dataset_name, run

    if args.output_file is None:
        args.output_file = upstream_flags.default_output_file(
            args.backend, dataset_name(args), args.num_prompts, args.random_input_len, args.random_output_len
        )
    from sglang.benchmark.trace import TraceError

    try:
        lines = asyncio.run(run(args))
    except (BenchmarkError, DatasetError, TraceError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    empty = [line["max_concurrency"] for line in lines if line["completed"] == 0]
    if empty:
        print(f"error: no request completed at concurrency {empty}; see the errors above", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
