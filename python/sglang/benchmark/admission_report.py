"""Prefill passes per level of an interleaved envelope run (spec_envelope_gpu.sh with ROUNDS and
STEP_TIMES=1): for each server and level, the rounds' output tok/s and mean time to first token,
the prefill passes its scheduler ran, the requests per pass, the share of its busy time spent in
prefill passes, and how many passes took more than 8 requests (on the demo pair those are
eager). It reads what shaped admissions (--admission-batch-steps) change: compare a server with a
`_unbatched` twin.

    python -m sglang.benchmark.admission_report DIR [NAME ...]

DIR holds the unpacked `*_servers.tgz` (NAME.rounds.jsonl, NAME.steps.N.json); NAME defaults to
every server there. A server's busy periods are its scheduler's: period 0 is the start-up
generation, 1 the client's warm-up, then one per (level, round) in the order measured. A server
measured last in one round and first in the next serves both without a pause, so its periods
merge and it is skipped (said so)."""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics

BIG_PASS = 8  # requests: a pass larger than this has no prefill graph on the demo pair's defaults


def period_summary(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        groups = json.load(f)
    prefill = [row for name, row in groups.items() if name.startswith("prefill/")]
    passes = sum(row["steps"] for row in prefill)
    busy = sum(row["steps"] * row["pass_us"] for row in groups.values())
    return {
        "passes": passes,
        "reqs_per_pass": sum(row["steps"] * row["mean_batch"] for row in prefill) / passes if passes else 0.0,
        "prefill_share": sum(row["steps"] * row["pass_us"] for row in prefill) / busy if busy else 0.0,
        "big_passes": sum(
            row["steps"]
            for name, row in groups.items()
            if name.startswith("prefill/") and int(name.split("bs")[1]) > BIG_PASS
        ),
    }


def server_levels(directory: str, name: str) -> dict | None:
    """level -> {"tok_s": [...], "ttft_ms": [...], per-round period summaries}; None if periods merged."""
    with open(os.path.join(directory, f"{name}.rounds.jsonl"), encoding="utf-8") as f:
        rounds = [json.loads(line) for line in f if line.strip()]
    periods = sorted(glob.glob(os.path.join(directory, f"{name}.steps.*.json")), key=lambda p: int(p.rsplit(".", 2)[1]))
    measured = periods[2 : 2 + len(rounds)]
    if len(measured) < len(rounds):
        return None
    levels: dict = {}
    for line, path in zip(rounds, measured):
        entry = levels.setdefault(int(line["max_concurrency"]), {"tok_s": [], "ttft_ms": [], "periods": []})
        entry["tok_s"].append(line["output_throughput"])
        entry["ttft_ms"].append(line.get("mean_ttft_ms") or 0.0)
        entry["periods"].append(period_summary(path))
    return levels


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dir")
    parser.add_argument("names", nargs="*")
    args = parser.parse_args(argv)
    names = args.names or sorted(
        os.path.basename(p)[: -len(".rounds.jsonl")] for p in glob.glob(os.path.join(args.dir, "*.rounds.jsonl"))
    )
    print(
        f"{'server':<26} {'conc':>5} {'tok/s per round':>17} {'ttft ms':>8} {'passes':>7} {'req/pass':>8} "
        f"{'prefill%':>8} {'>8 req':>6}"
    )
    for name in names:
        levels = server_levels(args.dir, name)
        if levels is None:
            print(f"{name}: busy periods merged across rounds (measured last then first); skipped")
            continue
        for level, entry in sorted(levels.items()):
            periods = entry["periods"]
            print(
                f"{name:<26} {level:>5} {' / '.join(f'{t:.0f}' for t in entry['tok_s']):>17} "
                f"{statistics.fmean(entry['ttft_ms']):>8.1f} {sum(p['passes'] for p in periods):>7} "
                f"{statistics.fmean(p['reqs_per_pass'] for p in periods):>8.2f} "
                f"{100 * statistics.fmean(p['prefill_share'] for p in periods):>7.0f}% "
                f"{sum(p['big_passes'] for p in periods):>6}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
