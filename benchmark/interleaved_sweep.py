"""bench_serving against several running servers at once, interleaved: at every concurrency level
each server is measured in turn, for several rounds, the order reversed every other round (A B C,
C B A, ...), so a drift of the machine's speed during the run falls on every server alike.

    python benchmark/interleaved_sweep.py --server no_draft=http://127.0.0.1:30000 \\
        --server dynamic=http://127.0.0.1:30001 --rounds 2 --out-dir OUT [bench_serving's options]

Why: on a model whose steps take under a millisecond the host sets the speed, and sweeps run one
after another on the same machine differed by up to 37% between two servers making the same
choices; a sweep per server cannot read a 2% envelope.

Every server gets the same prompts at each level and round (one dataset draw per server, seeded
alike). Writes OUT/NAME.rounds.jsonl (every round's bench_serving line, with "round",
"position" and its wall-clock span "started_unix" / "ended_unix", for monitor_report.py) and
OUT/NAME.jsonl (one line per level, the rounds pooled: throughputs are total tokens over total
measured time, counts and steps per k are summed, latency statistics are the rounds' means),
the layout sglang.benchmark.envelope_report reads. --warmup-rounds N plays N rounds first at each level,
written to OUT/NAME.warmup.jsonl and left out of the pooled line.

    python benchmark/interleaved_sweep.py repool OUT NAME NAME ...

pools again from OUT/NAME.rounds.jsonl alone, rewriting OUT/NAME.jsonl: for a sweep cut short (a time
limit, a server lost), so that the rounds every named server finished at a level or trace are still
reported, the same rounds for each server; a round some server lacks is left out of every pool."""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import statistics
import sys
import time

import aiohttp

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
from sglang.bench_serving import make_parser  # noqa: E402
from sglang.benchmark import runner  # noqa: E402
from sglang.benchmark.datasets import DatasetError  # noqa: E402

SUMMED = (
    "duration",
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
    "token_count_mismatches",
    "spec_prompts_without_draft",
)
ROUND_FIELDS = ("round", "position", "started_unix", "ended_unix")  # one round's, not the pool's
POOLED_RATES = {
    "request_throughput": "completed",
    "input_throughput": "total_input_tokens",
    "output_throughput": "total_output_tokens",
}


def parse_server(value: str) -> tuple[str, str]:
    name, sep, url = value.partition("=")
    plain_name = name.replace("_", "").replace("-", "").replace(".", "")
    if not sep or not plain_name.isalnum() or not url.startswith(("http://", "https://")):
        raise argparse.ArgumentTypeError(
            f"--server takes NAME=http://host:port with NAME of letters, digits, ., _ and -, got {value!r}"
        )
    return name, url.rstrip("/")


def make_sweep_parser() -> argparse.ArgumentParser:
    parser = make_parser()
    parser.description = __doc__
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument(
        "--server",
        type=parse_server,
        action="append",
        required=True,
        help="NAME=URL of one running server (give two or more)",
    )
    parser.add_argument("--rounds", type=int, default=2, help="measurements per server and level (default 2)")
    parser.add_argument(
        "--warmup-rounds",
        type=int,
        default=0,
        help="rounds played before the measured ones at every level (or trace), in the same "
        "rotating order, written to OUT/NAME.warmup.jsonl and left out of the pooled line: "
        "a server that adapts to its load (dynamic speculation learning its costs at a new "
        "batch size) is then measured once it has met the level (default 0)",
    )
    parser.add_argument(
        "--time-budget-s",
        type=float,
        default=None,
        help="seconds the whole sweep may take: a round is started only while the time left "
        "holds one more like the longest so far at that level (the first measured round of a "
        "level always runs), so a sweep under an outer time limit ends with complete rounds "
        "instead of being cut off in one (default: no budget)",
    )
    parser.add_argument("--out-dir", required=True)
    return parser


def round_order(names: list[str], round_index: int) -> list[str]:
    return names if round_index % 2 == 0 else names[::-1]


def pool(lines: list[dict]) -> dict:
    """One level's rounds for one server as one line (see the module docstring)."""
    pooled = {key: value for key, value in lines[0].items() if key not in ROUND_FIELDS}
    for key in SUMMED:
        if key in lines[0]:
            pooled[key] = sum(line[key] or 0 for line in lines)
    for rate, amount in POOLED_RATES.items():
        pooled[rate] = pooled[amount] / pooled["duration"]
    pooled["total_throughput"] = pooled["input_throughput"] + pooled["output_throughput"]
    pooled["concurrency"] = sum(line["concurrency"] * line["duration"] for line in lines) / pooled["duration"]
    averaged = [
        key
        for key, value in lines[0].items()
        if key.endswith("_ms") or key in ("accept_length", "spec_accept_length", "max_output_tokens_per_s")
    ]
    for key in averaged:
        values = [line[key] for line in lines if isinstance(line.get(key), (int, float))]
        pooled[key] = statistics.fmean(values) if values else None
    if "spec_steps_by_k" in lines[0]:
        steps: dict[str, int] = {}
        for line in lines:
            for k, n in line["spec_steps_by_k"].items():
                steps[k] = steps.get(k, 0) + n
        total = sum(steps.values())
        pooled["spec_steps_by_k"] = steps
        pooled["spec_step_share_by_k"] = {k: n / total for k, n in steps.items()} if total else {}
    pooled["errors"] = [error for line in lines for error in line["errors"]]
    pooled["rounds"] = len(lines)
    pooled["round_output_throughput"] = [line["output_throughput"] for line in lines]
    pooled["round_duration"] = [line["duration"] for line in lines]
    return pooled


def pooled_line(lines: list[dict]) -> dict:
    """One server's rounds at one level, or of one trace, as the pooled line."""
    if not lines[0].get("phases"):
        return pool(lines)
    pooled = pool([dict(line, phases=None) for line in lines])
    pooled["phases"] = pool_phases([line["phases"] for line in lines])
    return pooled


def pool_phases(rounds: list[list[dict]]) -> list[dict]:
    """One trace's phases over its rounds: the tokens delivered during each phase over its seconds
    (summed over the rounds), each round's rate, the requests started in it and their mean TPOT."""
    pooled = []
    for i, first in enumerate(rounds[0]):
        same = [phases[i] for phases in rounds]
        seconds = sum(phase["seconds"] for phase in same)
        tokens = sum(phase.get("window_output_tokens", 0) for phase in same)
        tpots = [phase["mean_tpot_ms"] for phase in same if isinstance(phase.get("mean_tpot_ms"), (int, float))]
        pooled.append(
            {
                "seconds": first["seconds"],
                "target_concurrency": first["target_concurrency"],
                "accept_mix": first["accept_mix"],
                "completed": sum(phase["completed"] for phase in same),
                "window_output_tokens": tokens,
                "window_output_throughput": tokens / seconds,
                "round_window_output_throughput": [phase.get("window_output_throughput") for phase in same],
                "mean_tpot_ms": statistics.fmean(tpots) if tpots else None,
            }
        )
    return pooled


async def sweep(args: argparse.Namespace) -> int:
    names = [name for name, _ in args.server]
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=runner.CONNECT_TIMEOUT_S, sock_read=args.request_timeout)
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=runner.CLIENT_KEEPALIVE_S)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        benches = {}
        for name, url in args.server:
            server_args = copy.copy(args)
            server_args.base_url, server_args.label = url, name
            server_args.output_file = None  # written here, with the round and the position
            benches[name] = await runner.connect(server_args, session)
            await runner.warm_up(
                benches[name].client, benches[name].dataset.sample(args.warmup_requests, benches[name].data_rng)
            )
        if args.trace:
            return await sweep_trace(args, names, benches, session)
        levels, empty = args.max_concurrency or [None], []
        for level in levels:

            def measure(name, round_index, level=level):
                desc = f"{name} concurrency {level or 'unlimited'} round {round_index + 1}/{args.rounds}"
                return runner.measure_level(benches[name], level, desc)

            rounds = await run_rounds(args, names, benches, session, measure)
            for name in names:
                pooled = pooled_line(rounds[name])
                runner.append_line(os.path.join(args.out_dir, f"{name}.jsonl"), pooled)
                if not pooled["completed"]:
                    empty.append(f"{name} at concurrency {level}")
            print(
                f"concurrency {level}: "
                + ", ".join(
                    f"{name} {' / '.join(f'{t:.0f}' for t in (r['output_throughput'] for r in rounds[name]))} tok/s"
                    for name in names
                ),
                flush=True,
            )
    if empty:  # as bench_serving: a level where nothing completed is an error
        print(f"error: no request completed for {', '.join(empty)}; see the errors above", file=sys.stderr)
        return 1
    return 0


async def run_rounds(args: argparse.Namespace, names: list[str], benches: dict, session, measure) -> dict:
    """ROUNDS rounds of `measure(name, round)` over the servers in rotating order; each line gets
    its round, position and wall-clock span, goes to OUT/NAME.rounds.jsonl, and a line with
    failures checks that its server is still up. Returns {name: [line per round]}."""
    rounds: dict[str, list[dict]] = {name: [] for name in names}
    warmups = args.warmup_rounds
    longest = 0.0  # seconds of the longest round so far at this level
    for index in range(warmups + args.rounds):
        warmup = index < warmups
        round_index = index if warmup else index - warmups
        if index > warmups and not _time_for_a_round(args, longest):  # the first measured round always runs
            print(f"time budget: {round_index} of {args.rounds} rounds measured", file=sys.stderr, flush=True)
            break
        round_started = _now()
        for position, name in enumerate(round_order(names, index)):
            started = time.time()
            line = await measure(name, round_index)
            line.update(round=round_index, position=position, started_unix=started, ended_unix=time.time())
            kind = "warmup" if warmup else "rounds"
            runner.append_line(os.path.join(args.out_dir, f"{name}.{kind}.jsonl"), line)
            if not warmup:
                rounds[name].append(line)
            if line["failed"]:
                await runner.check_alive(session, benches[name].base_url, line)
        longest = max(longest, _now() - round_started)
    return rounds


def _time_for_a_round(args: argparse.Namespace, longest: float) -> bool:
    """Whether --time-budget-s leaves time for one more round of `longest` seconds."""
    budget = getattr(args, "time_budget_s", None)
    return budget is None or _now() - args.started + longest <= budget


def _now() -> float:
    return time.monotonic()


async def sweep_trace(args: argparse.Namespace, names: list[str], benches: dict, session) -> int:
    """--trace: each round plays the trace against every server in turn (order reversed every
    other round); OUT/NAME.trace.jsonl gets each round's line, OUT/NAME.jsonl the rounds pooled."""
    rounds = await run_rounds(args, names, benches, session, lambda name, _: runner.measure_trace(benches[name]))
    for name in names:
        runner.append_line(os.path.join(args.out_dir, f"{name}.jsonl"), pooled_line(rounds[name]))
    for name in names:
        print(
            f"trace: {name} " + " / ".join(f"{line['output_throughput']:.0f}" for line in rounds[name]) + " tok/s",
            flush=True,
        )
    return 0 if all(line["completed"] for lines in rounds.values() for line in lines) else 1


def repool(out_dir: str, names: list[str]) -> list[str]:
    """OUT/NAME.jsonl for every name, again, from OUT/NAME.rounds.jsonl: at each level (or the trace), in
    the order first played, the rounds that every server finished. Returns a line per level saying
    which rounds were pooled and which were left out."""
    played: dict[str, dict] = {}  # name -> {level: {round: line}}
    for name in names:
        path = os.path.join(out_dir, f"{name}.rounds.jsonl")
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path}: no rounds of {name} to pool (names: {', '.join(names)})")
        levels = played[name] = {}
        with open(path) as f:
            for line in map(json.loads, filter(str.strip, f)):
                level = "trace" if line.get("phases") else line.get("max_concurrency")
                levels.setdefault(level, {})[line["round"]] = line
    order = list(dict.fromkeys(level for name in names for level in played[name]))
    pooled = {name: [] for name in names}
    report = []
    for level in order:
        finished = [set(played[name].get(level, {})) for name in names]
        common, every = sorted(set.intersection(*finished)), sorted(set.union(*finished))
        label = "trace" if level == "trace" else f"concurrency {level}"
        left_out = f", left out {[r for r in every if r not in common]}" if common != every else ""
        report.append(f"{label}: pooled rounds {common}{left_out}")
        if common:
            for name in names:
                pooled[name].append(pooled_line([played[name][level][r] for r in common]))
    for name in names:
        with open(os.path.join(out_dir, f"{name}.jsonl"), "w") as f:
            f.writelines(json.dumps(line) + "\n" for line in pooled[name])
    return report


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["repool"]:
        if len(argv) < 4:
            print("usage: interleaved_sweep.py repool OUT NAME NAME ... (two or more servers)", file=sys.stderr)
            return 2
        try:
            report = repool(argv[1], argv[2:])
        except (OSError, ValueError, KeyError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        print("\n".join(report))
        return 0
    parser = make_sweep_parser()
    args = parser.parse_args(argv)
    names = [name for name, _ in args.server]
    if len(set(names)) != len(names) or len(names) < 2:
        parser.error(f"--server needs two or more servers with distinct names, got {names}")
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    if args.warmup_rounds < 0:
        parser.error(f"--warmup-rounds must be at least 0, got {args.warmup_rounds}")
    if args.time_budget_s is not None and not args.time_budget_s > 0:
        parser.error(f"--time-budget-s must be positive, got {args.time_budget_s}")
    args.started = _now()
    os.makedirs(args.out_dir, exist_ok=True)
    try:
        return asyncio.run(sweep(args))
    except (runner.BenchmarkError, DatasetError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
