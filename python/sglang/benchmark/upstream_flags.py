"""Upstream bench_serving's command line where it differs from ours: its default ports and output
file name, and the flags, backends and datasets we refuse with a reason instead of an
"unrecognized arguments" error (or, worse, silently ignoring them)."""

from __future__ import annotations

import argparse
import datetime
import json

# Upstream picks the port by backend when --port is not given (the others: 30000).
DEFAULT_PORTS = {"vllm": 8000, "lmdeploy": 23333}

NO_LORA = "the engine serves no LoRA adapters"
NO_PD = "the engine has no prefill/decode disaggregation; benchmark the server itself"
NO_PROFILE = "the server has no /start_profile; profile the server process itself"
NO_IMAGES = "the engine serves text models only"
NO_MOONCAKE = "mooncake traces are not supported; --trace plays a time-varying load"
LOGPROBS = 'pass it in the body: --extra-request-body \'{"return_logprob": true, "top_logprobs_num": 5}\''

REFUSED_FLAGS = {
    "--lora-name": NO_LORA,
    "--lora-request-distribution": NO_LORA,
    "--lora-zipf-alpha": NO_LORA,
    "--pd-separated": NO_PD,
    "--profile-prefill-url": NO_PD,
    "--profile-decode-url": NO_PD,
    "--fake-prefill": NO_PD,
    "--profile": NO_PROFILE,
    "--profile-activities": NO_PROFILE,
    "--profile-start-step": NO_PROFILE,
    "--profile-steps": NO_PROFILE,
    "--profile-num-steps": NO_PROFILE,
    "--profile-by-stage": NO_PROFILE,
    "--profile-stages": NO_PROFILE,
    "--profile-output-dir": NO_PROFILE,
    "--profile-prefix": NO_PROFILE,
    "--image-count": NO_IMAGES,
    "--image-resolution": NO_IMAGES,
    "--random-image-count": NO_IMAGES,
    "--image-format": NO_IMAGES,
    "--image-content": NO_IMAGES,
    "--use-trace-timestamps": NO_MOONCAKE,
    "--mooncake-slowdown-factor": NO_MOONCAKE,
    "--mooncake-num-rounds": NO_MOONCAKE,
    "--mooncake-workload": NO_MOONCAKE,
    "--return-logprob": LOGPROBS,
    "--top-logprobs-num": LOGPROBS,
    "--token-ids-logprob": LOGPROBS,
    "--logprob-start-len": LOGPROBS,
    "--return-routed-experts": "the engine runs no mixture-of-experts models",
    "--cache-report": "not implemented; the server's /metrics has sglang:cache_hit_rate",
    "--plot-throughput": "not implemented; `python -m sglang.bench_serving plot FILE` draws result files",
    "--print-requests": "not implemented; --output-details writes every request's text and timings",
    "--prompt-suffix": "not implemented; put the suffix in the dataset file",
    "--flush-cache-timeout": "not implemented; --flush-cache flushes between levels, when nothing is in flight",
    "--gsp-range-ratio": "not implemented; generated-shared-prefix lengths are fixed",
    "--gsp-fast-prepare": "not implemented; generated-shared-prefix prompts are prepared without statistics",
    "--gsp-send-routing-key": "not implemented (a router header)",
    "--gsp-num-turns": "not implemented; generated-shared-prefix requests are single-turn",
    "--gsp-ordered": "not implemented; generated-shared-prefix requests are shuffled with --seed",
    "--gsp-group-distribution": "not implemented; every group gets --gsp-prompts-per-group requests",
    "--gsp-zipf-alpha": "not implemented; every group gets --gsp-prompts-per-group requests",
}

REFUSED_BACKENDS = {
    "trt": "TensorRT-LLM's route is not spoken here",
    "gserver": "upstream does not implement it either",
    "truss": "Truss's route is not spoken here",
    "sglang-embedding": "embedding benchmarks are not supported",
    "vllm-embedding": "embedding benchmarks are not supported",
}

REFUSED_DATASETS = {
    "mmmu": NO_IMAGES,
    "image": NO_IMAGES,
    "mooncake": NO_MOONCAKE,
    "burstgpt": "not implemented",
    "custom": "not implemented",
    "openai": "not implemented",
    "agentic-trace": "not implemented",
    "longbench_v2": "not implemented",
    "speed-bench": "not implemented",
}


class _Refuse(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string} (upstream bench_serving) is not supported here: {REFUSED_FLAGS[option_string]}")


def add_refused_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("upstream flags refused here (each says why)")
    for flag in REFUSED_FLAGS:
        group.add_argument(flag, nargs="*", action=_Refuse, help=argparse.SUPPRESS)


def choice_or_refusal(choices: tuple[str, ...], refused: dict[str, str], what: str):
    """An argparse type: one of `choices`, or an error naming why an upstream choice is refused."""

    def parse(value: str) -> str:
        if value in refused:
            raise argparse.ArgumentTypeError(
                f"{what} {value} (upstream bench_serving) is not supported here: {refused[value]}"
            )
        return value

    return parse


def json_object(value: str) -> dict:
    try:
        body = json.loads(value)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"expected a JSON object, e.g. '{{\"top_p\": 0.9}}': {e}") from None
    if not isinstance(body, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {value!r}")
    return body


def header(value: str) -> tuple[str, str]:
    key, sep, text = value.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected Key=Value, got {value!r}")
    return key, text


def default_output_file(backend: str, dataset_name: str, num_prompts: int, input_len: int, output_len: int) -> str:
    """Upstream's name when --output-file is not given: <backend>_<MMDD>_<prompts>_<in>_<out>.jsonl
    for random datasets, <backend>_<MMDD>_<prompts>_<dataset>.jsonl for the others."""
    today = datetime.date.today().strftime("%m%d")
    if dataset_name.startswith("random"):
        return f"{backend}_{today}_{num_prompts}_{input_len}_{output_len}.jsonl"
    return f"{backend}_{today}_{num_prompts}_{dataset_name}.jsonl"
