"""Reads `python -m sglang.bench_speculative --step-times` results and prints, per variant and
batch size, the decode throughput of each run (process) and their mean, and the mean
microseconds per phase of the level's own decode group (schedule, launch, process, device wait,
collect). With two files (before, after: the same command on two trees), or one recorded file
holding runs labelled `code: baseline`, the after / before ratio of the mean throughput.

Runs that carry the CPU probe (`cpu_probe_ms`, the same fixed Python loop timed in the
run's process just before and after it measured) also show each run's probe and, with two trees,
the ratio of mean tok/s x probe ms ("x-probe"): the throughput per unit of the CPU's speed at
that moment. It reads host-bound levels (the demo pair from ~32 requests up), where a run on a
CPU at half speed serves half as fast; a device-bound level does not scale with the CPU.

    python -m sglang.benchmark.step_times_report RESULT.json [AFTER.json]

With --servers, it reads what servers wrote under SGLANG_STEP_TIMES=PREFIX instead (PREFIX.N.json,
one file per busy period) and prints, per server and group (`spec_k3/bs16`: what the pass launched,
the batch's size bucket), the steps and mean microseconds per phase over all its periods, weighted
by steps: two servers configured alike but for one thing, compared phase by phase.

    python -m sglang.benchmark.step_times_report --servers PREFIX_A PREFIX_B ...
"""

from __future__ import annotations

import argparse
import glob
import json
import statistics
from collections import defaultdict

from sglang.srt.managers.step_times import PHASES as STEP_PHASES  # every phase a server's step tables give

PHASES = ("schedule", "launch", "process", "wait", "collect")


def variant(result: dict) -> str:
    """`dynamic`, `k0`, `k3`; `@baseline` for a run labelled as the baseline tree's."""
    name = result.get("config") or f"k{result['k']}"
    return name + "@baseline" if result.get("code") == "baseline" else name


def level_group(result: dict) -> dict | None:
    """The level's own decode group: the one at its batch size's bucket with the most steps."""
    bucket = 1 << (result["batch_size"] - 1).bit_length()
    rows = [row for name, row in result.get("step_times", {}).items() if name.endswith(f"/bs{bucket}")]
    return max(rows, key=lambda row: row["steps"]) if rows else None


def summarize(path: str) -> dict:
    """(variant, batch size) -> {"runs": [tok/s per run], "phases": {phase: mean us}}."""
    with open(path) as f:
        results = [r for r in json.load(f)["results"] if "error" not in r]
    runs, phases = defaultdict(list), defaultdict(lambda: defaultdict(list))
    probes = defaultdict(list)
    for r in results:
        key = (variant(r), r["batch_size"])
        runs[key].append(r["tokens_per_s"])
        if r.get("cpu_probe_ms"):
            probes[key].append(statistics.mean(r["cpu_probe_ms"]))
        group = level_group(r)
        if group is not None:
            for phase in PHASES:
                phases[key][phase].append(group[f"{phase}_us"])
    return {
        key: {
            "runs": runs[key],
            "phases": {p: statistics.mean(v) for p, v in phases[key].items()},
            # each run's probe, where every run of the key has one
            "probes": probes[key] if len(probes[key]) == len(runs[key]) else [],
        }
        for key in runs
    }


def probe_scaled(row: dict) -> float | None:
    """Mean over runs of tok/s x probe ms (None without probes)."""
    if not row["probes"]:
        return None
    return statistics.mean(t * p for t, p in zip(row["runs"], row["probes"]))


def merge_periods(prefix: str) -> dict:
    """{group: {"steps", "mean_batch", PHASE_us..., "pass_us"}} over every PREFIX.N.json, weighted by steps."""
    paths = [
        path for path in glob.glob(f"{glob.escape(prefix)}.*.json") if path[len(prefix) + 1 : -len(".json")].isdigit()
    ]
    if not paths:
        raise SystemExit(f"step_times_report: no {prefix}.N.json files (written by a server under SGLANG_STEP_TIMES)")
    sums: dict = defaultdict(lambda: defaultdict(float))
    for path in paths:
        with open(path) as f:
            for group, row in json.load(f).items():
                acc, steps = sums[group], row["steps"]
                acc["steps"] += steps
                acc["mean_batch"] += row["mean_batch"] * steps
                for key in [f"{p}_us" for p in STEP_PHASES] + ["pass_us"]:
                    acc[key] += row[key] * steps
    return {
        group: {key: (value if key == "steps" else value / acc["steps"]) for key, value in acc.items()}
        for group, acc in sums.items()
    }


def group_order(group: str) -> tuple:
    kind, _, bucket = group.partition("/bs")
    return kind, int(bucket) if bucket.isdigit() else 0


def print_servers(prefixes: list[str]) -> None:
    print(
        f"{'server':24} {'group':16} {'steps':>7} {'bs':>6} "
        + " ".join(f"{p:>8}" for p in STEP_PHASES)
        + f" {'pass':>8}   (mean us per step)"
    )
    for prefix in prefixes:
        merged = merge_periods(prefix)
        for group in sorted(merged, key=group_order):
            row = merged[group]
            print(
                f"{prefix.rsplit('/', 1)[-1]:24} {group:16} {int(row['steps']):>7} {row['mean_batch']:>6.1f} "
                + " ".join(f"{row[p + '_us']:>8.1f}" for p in STEP_PHASES)
                + f" {row['pass_us']:>8.1f}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "files", nargs="+", help="bench_speculative results; with --servers, SGLANG_STEP_TIMES prefixes"
    )
    parser.add_argument(
        "--servers",
        action="store_true",
        help="the files are servers' SGLANG_STEP_TIMES prefixes: merge each one's busy periods",
    )
    args = parser.parse_args()
    if args.servers:
        print_servers(args.files)
        return
    tables = [summarize(path) for path in args.files[:2]]
    if len(tables) == 1 and any(name.endswith("@baseline") for name, _ in tables[0]):
        # One file with both trees: the baseline's levels as "before", the current code's as "after".
        both = tables[0]
        tables = [
            {(name[: -len("@baseline")], bs): row for (name, bs), row in both.items() if name.endswith("@baseline")},
            {key: row for key, row in both.items() if not key[0].endswith("@baseline")},
        ]
    head = f"{'variant':9} {'bs':>4} {'tok/s per run':>24} {'mean':>8} " + " ".join(f"{p:>8}" for p in PHASES)
    if len(tables) == 2:
        head += f" {'after/before':>12}"
    print(head + "   (phases: mean us per step)")
    for key in sorted(tables[-1], key=lambda k: (k[0], k[1])):
        for i, table in enumerate(tables):
            if key not in table:
                continue
            row = table[key]
            label = ("before " if i == 0 else "after  ") if len(tables) == 2 else ""
            line = (
                f"{label + key[0]:9} {key[1]:>4} {' '.join(f'{x:.0f}' for x in row['runs']):>24} "
                f"{statistics.mean(row['runs']):>8.0f} " + " ".join(f"{row['phases'].get(p, 0):>8.0f}" for p in PHASES)
            )
            if i == 1 and key in tables[0]:
                line += f" {statistics.mean(row['runs']) / statistics.mean(tables[0][key]['runs']):>12.3f}"
            if row["probes"]:
                line += "   probe ms " + " ".join(f"{p:.1f}" for p in row["probes"])
                scaled, before = (
                    probe_scaled(row),
                    (probe_scaled(tables[0][key]) if i == 1 and key in tables[0] else None),
                )
                if before:
                    line += f"   x-probe after/before {scaled / before:.3f}"
            print(line)


if __name__ == "__main__":
    main()
