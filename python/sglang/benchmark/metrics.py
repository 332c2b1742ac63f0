"""What a run measured: throughputs, latency distributions, achieved concurrency, accept
length, as the JSON fields of one result line, and the summary printed for people."""

from __future__ import annotations

import collections
import math

import numpy as np

from sglang.benchmark.backends import RequestResult

DISTRIBUTIONS = ("e2e_latency", "ttft", "tpot", "itl")
STATS = ("mean", "median", "std", "p90", "p95", "p99")
MAX_ERRORS_KEPT = 5


def distribution(name: str, seconds: list[float]) -> dict:
    """`mean_<name>_ms`, `median_<name>_ms`, ... (null when nothing was measured)."""
    if not seconds:
        return {f"{stat}_{name}_ms": None for stat in STATS}
    ms = np.asarray(seconds, dtype=np.float64) * 1000
    values = (ms.mean(), np.median(ms), ms.std(), *np.percentile(ms, [90, 95, 99]))
    return {f"{stat}_{name}_ms": float(value) for stat, value in zip(STATS, values)}


def peak_output_tokens_per_s(results: list[RequestResult], start: float) -> float:
    """The most output tokens that arrived within one 1-second bucket of the run."""
    buckets = collections.Counter()
    for result in results:
        for arrival, num_tokens in result.chunks:
            buckets[int(arrival - start)] += num_tokens
    return float(max(buckets.values(), default=0))


def peak_concurrent_requests(results: list[RequestResult], start: float) -> int:
    """upstream's max_concurrent_requests: the most completed requests that were in flight during
    one 1-second bucket of the run (a request counts in every bucket from its start to its end)."""
    buckets = collections.Counter()
    for result in results:
        first, last = int(result.start - start), int(result.start + result.latency - start)
        buckets.update(range(max(first, 0), last + 1))
    return max(buckets.values(), default=0)


def request_details(results: list[RequestResult]) -> dict:
    """upstream's --output-details arrays, one entry per request in sending order (failed
    requests: 0 tokens, an empty text and their error)."""
    return {
        "input_lens": [r.prompt_tokens if r.success else r.prompt_len for r in results],
        "output_lens": [r.output_tokens if r.success else 0 for r in results],
        "ttfts": [r.ttft if r.success else 0.0 for r in results],
        "itls": [r.itl if r.success else [] for r in results],
        "generated_texts": [r.generated_text if r.success else "" for r in results],
        "errors": [r.error for r in results],
    }


def accept_length(results: list[RequestResult]) -> float | None:
    """Output tokens per verify step, over the requests whose meta_info counted verify steps."""
    speculated = [r for r in results if r.spec_verify_ct]
    if not speculated:
        return None
    return sum(r.server_output_tokens for r in speculated) / sum(r.spec_verify_ct for r in speculated)


def summarize(results: list[RequestResult], start: float, duration: float) -> dict:
    """The measured fields of a result line; `start` is the perf_counter time of the first send."""
    done = [r for r in results if r.success]
    total_input = sum(r.prompt_tokens for r in done)
    total_output = sum(r.output_tokens for r in done)
    fields = {
        "duration": duration,
        "completed": len(done),
        "failed": len(results) - len(done),
        "errors": _error_counts(results),
        "total_input_tokens": total_input,
        "total_input_text_tokens": total_input,
        "total_input_vision_tokens": 0,
        "total_output_tokens": total_output,
        "token_count_mismatches": sum(not r.token_counts_agree() for r in done),
        "request_throughput": len(done) / duration,
        "input_throughput": total_input / duration,
        "output_throughput": total_output / duration,
        "total_throughput": (total_input + total_output) / duration,
        "concurrency": sum(r.latency for r in results) / duration,
        "accept_length": accept_length(done),
        "max_output_tokens_per_s": peak_output_tokens_per_s(done, start),
        "max_concurrent_requests": peak_concurrent_requests(done, start),
    }
    fields.update(distribution("e2e_latency", [r.latency for r in done]))
    fields.update(distribution("ttft", [r.ttft for r in done]))
    fields.update(distribution("tpot", [r.tpot for r in done if r.tpot is not None]))
    fields.update(distribution("itl", [gap for r in done for gap in r.itl]))
    return fields


def _error_counts(results: list[RequestResult]) -> list[dict]:
    counts = collections.Counter(r.error for r in results if not r.success)
    return [{"error": error, "count": count} for error, count in counts.most_common(MAX_ERRORS_KEPT)]


# ---- the printed summary -------------------------------------------------------------------

_SECTIONS = (
    ("End-to-end latency", "e2e_latency", "E2E latency"),
    ("Time to first token", "ttft", "TTFT"),
    ("Time per output token (after the first)", "tpot", "TPOT"),
    ("Inter-token latency", "itl", "ITL"),
)
_WIDTH = 50


def format_summary(line: dict) -> str:
    rate = line["request_rate"]
    rows = [
        ("Backend", line["backend"]),
        ("Traffic request rate", rate),
        ("Max request concurrency", line["max_concurrency"] or "not set"),
        ("Successful requests", line["completed"]),
        ("Failed requests", line["failed"]),
        ("Benchmark duration (s)", line["duration"]),
        ("Total input tokens", line["total_input_tokens"]),
        ("Total generated tokens", line["total_output_tokens"]),
        *(
            [("Total generated tokens (retokenized)", line["total_output_tokens_retokenized"])]
            if "total_output_tokens_retokenized" in line
            else []
        ),
        ("Request throughput (req/s)", line["request_throughput"]),
        ("Input token throughput (tok/s)", line["input_throughput"]),
        ("Output token throughput (tok/s)", line["output_throughput"]),
        ("Peak output token throughput (tok/s)", line["max_output_tokens_per_s"]),
        ("Peak concurrent requests", line["max_concurrent_requests"]),
        ("Total token throughput (tok/s)", line["total_throughput"]),
        ("Concurrency", line["concurrency"]),
        ("Accept length", line["accept_length"] if line["accept_length"] is not None else "n/a"),
    ]
    if line.get("spec_step_share_by_k"):
        rows.append(
            (
                "Decode steps per k (share)",
                " ".join(f"k={k}: {share:.0%}" for k, share in line["spec_step_share_by_k"].items()),
            )
        )
    out = [" Serving Benchmark Result ".center(_WIDTH, "=")] + [_row(label, value) for label, value in rows]
    for title, name, short in _SECTIONS:
        out.append(f" {title} ".center(_WIDTH, "-"))
        out += [
            _row(f"{stat.capitalize() if stat[0] != 'p' else stat.upper()} {short} (ms)", line[f"{stat}_{name}_ms"])
            for stat in ("mean", "median", "p99")
        ]
    for error in line["errors"]:
        out.append(_row(f"Failed x{error['count']}", error["error"][:_WIDTH]))
    if line["token_count_mismatches"]:
        out.append(_row("Token counts off", f"{line['token_count_mismatches']} requests (see docs)"))
    out.append("=" * _WIDTH)
    return "\n".join(out)


def _row(label: str, value) -> str:
    if value is None:
        value = "n/a"
    elif isinstance(value, float) and math.isfinite(value):
        value = f"{value:.2f}"
    return f"{label + ':':<40} {value}"
