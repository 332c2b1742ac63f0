"""What the machine was doing during each round of an interleaved sweep: the GPU's clocks, power
and utilization and the CPUs' clock over each round's span (serve_lib.sh's start_monitor), beside
the round's throughput, and how far each round's throughput strays from its server's mean at that
level against the same for the SM clock (a host-bound server whose speed follows the GPU's clock
or the CPUs' shows it here), and the CPU each server process and the client used over each round.

    python benchmark/monitor_report.py --monitor OUT/demo_monitor OUT/*.rounds.jsonl"""

from __future__ import annotations

import argparse
import collections
import csv
import datetime
import json
import math
import statistics
import sys

# Our names for nvidia-smi's columns, found by the start of their headers ("clocks.current.sm [MHz]").
GPU_FIELDS = {
    "sm_mhz": ("clocks.current.sm", "clocks.sm"),
    "mem_mhz": ("clocks.current.memory", "clocks.mem"),
    "power_w": ("power.draw",),
    "util_pct": ("utilization.gpu",),
}


def column(row: dict, prefixes: tuple[str, ...]) -> str:
    for header, value in row.items():
        if header and header.strip().split(" ")[0] in prefixes:
            return value or ""
    return ""


def number(text: str) -> float | None:
    try:
        return float(text.strip().split()[0])
    except (ValueError, IndexError):
        return None


def read_gpu(path: str) -> list[dict]:
    """nvidia-smi's CSV: one sample per row, its local timestamp turned into Unix time."""
    samples = []
    with open(path, encoding="utf-8") as f:
        for row in csv.DictReader(f, skipinitialspace=True):
            try:
                when = datetime.datetime.strptime(row["timestamp"].strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp()
            except (KeyError, ValueError):
                continue
            sample = {"time": when, "pstate": (row.get("pstate") or "").strip()}
            sample.update({name: number(column(row, prefixes)) for name, prefixes in GPU_FIELDS.items()})
            samples.append(sample)
    return samples


def read_cpu(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [
            {"time": float(row["time"]), "cpu_mhz": float(row["mhz_mean"]), "load1": float(row["load1"])}
            for row in csv.DictReader(f)
        ]


PROCESS_ROLES = ("http", "sched", "detok", "client")


def read_procs(path: str) -> dict[tuple[str, int], dict[int, list[tuple[float, float]]]]:
    """start_monitor's PREFIX.procs.csv: {(role, port): {pid: [(time, CPU seconds so far)]}}."""
    series: dict = collections.defaultdict(lambda: collections.defaultdict(list))
    with open(path, encoding="utf-8") as f:
        for row in csv.DictReader(f):
            series[row["role"], int(row["port"])][int(row["pid"])].append((float(row["time"]), float(row["cpu_s"])))
    return series


def cpu_percent(series: dict, role: str, port: int, start: float, end: float) -> float | None:
    """The CPU the role's processes of the server on `port` used over [start, end], in percent of
    one core (the client's port is 0), between the last sample at or before `start` and the first
    at or after `end`; None where no pair of samples brackets the window."""
    used, seconds = 0.0, None
    for samples in series.get((role, port), {}).values():
        before = [s for s in samples if s[0] <= start]
        after = [s for s in samples if s[0] >= end]
        if before and after:
            used += after[0][1] - before[-1][1]
            seconds = max(seconds or 0.0, after[0][0] - before[-1][0])
    return None if seconds is None else 100 * used / seconds


def server_port(base_url: str) -> int:
    tail = base_url.rstrip("/").rsplit(":", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def window_means(samples: list[dict], start: float, end: float, keys: list[str]) -> dict:
    inside = [s for s in samples if start <= s["time"] <= end]
    means = {}
    for key in keys:
        values = [s[key] for s in inside if isinstance(s.get(key), (int, float))]
        means[key] = statistics.fmean(values) if values else None
    if inside and "pstate" in inside[0]:
        means["pstate"] = collections.Counter(s["pstate"] for s in inside).most_common(1)[0][0]
    return means


def pearson(xs: list[float], ys: list[float]) -> float | None:
    if len(xs) < 3:
        return None
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sx = math.sqrt(sum((x - mx) ** 2 for x in xs))
    sy = math.sqrt(sum((y - my) ** 2 for y in ys))
    return None if sx == 0 or sy == 0 else sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / (sx * sy)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--monitor", required=True, help="the prefix given to start_monitor")
    parser.add_argument("rounds", nargs="+", help="interleaved_sweep.py's NAME.rounds.jsonl files")
    args = parser.parse_args(argv)
    gpu, cpu = [], []
    try:
        gpu = read_gpu(args.monitor + ".gpu.csv")
    except OSError:
        print("no GPU samples (nvidia-smi missing?)")
    try:
        cpu = read_cpu(args.monitor + ".cpu.csv")
    except OSError:
        print("no CPU samples")
    procs = {}
    try:
        procs = read_procs(args.monitor + ".procs.csv")
    except OSError:
        print("no process samples")
    rows = []
    for path in args.rounds:
        with open(path, encoding="utf-8") as f:
            for line in map(json.loads, filter(str.strip, f)):
                if "started_unix" not in line:
                    print(
                        f"error: {path} has no round spans (started_unix); written by an older interleaved_sweep.py",
                        file=sys.stderr,
                    )
                    return 2
                row = {
                    "server": line["label"],
                    "conc": line["max_concurrency"],
                    "round": line["round"],
                    "tok_s": line["output_throughput"],
                }
                row.update(window_means(gpu, line["started_unix"], line["ended_unix"], list(GPU_FIELDS)))
                row.update(window_means(cpu, line["started_unix"], line["ended_unix"], ["cpu_mhz", "load1"]))
                port = server_port(line.get("base_url", ""))
                for role in PROCESS_ROLES:
                    row[role] = cpu_percent(
                        procs, role, 0 if role == "client" else port, line["started_unix"], line["ended_unix"]
                    )
                rows.append(row)
    rows.sort(key=lambda r: (r["conc"], r["round"], r["server"]))

    def show(value, width, digits=0):
        return f"{value:>{width}.{digits}f}" if isinstance(value, (int, float)) else f"{'-':>{width}}"

    print(
        f"{'server':<16} {'conc':>4} {'rnd':>3} {'tok/s':>8} {'SM MHz':>7} {'mem MHz':>7} {'W':>6} {'util%':>5} "
        f"{'pstate':>6} {'CPU MHz':>7} {'load1':>5}"
    )
    for r in rows:
        print(
            f"{r['server']:<16} {r['conc']:>4} {r['round']:>3} {show(r['tok_s'], 8)} {show(r.get('sm_mhz'), 7)} "
            f"{show(r.get('mem_mhz'), 7)} {show(r.get('power_w'), 6, 1)} {show(r.get('util_pct'), 5)} "
            f"{r.get('pstate') or '-':>6} {show(r.get('cpu_mhz'), 7)} {show(r.get('load1'), 5, 2)}"
        )
    if procs:
        print(
            "CPU per process over each round, % of one core (a process near 100% sets the pace): the server's "
            "HTTP front end, scheduler, detokenizer, and the benchmark client"
        )
        print(
            f"{'server':<16} {'conc':>4} {'rnd':>3} {'tok/s':>8} "
            + " ".join(f"{role + '%':>7}" for role in PROCESS_ROLES)
        )
        for r in rows:
            print(
                f"{r['server']:<16} {r['conc']:>4} {r['round']:>3} {show(r['tok_s'], 8)} "
                + " ".join(show(r.get(role), 7) for role in PROCESS_ROLES)
            )
    # Each round against its server's mean at that level: does the spread follow a clock?
    groups = collections.defaultdict(list)
    for r in rows:
        groups[(r["server"], r["conc"])].append(r)
    print("per server and level: mean tok/s over the rounds, and their coefficient of variation")
    for (server, conc), group in sorted(groups.items(), key=lambda item: (item[0][1], item[0][0])):
        values = [r["tok_s"] for r in group]
        cv = statistics.pstdev(values) / statistics.fmean(values) if len(values) > 1 else 0.0
        print(
            f"  {server:<16} conc {conc:>4}: {statistics.fmean(values):9.0f} tok/s over {len(values)} rounds, "
            f"CV {cv:.1%}"
        )
    for key in ("sm_mhz", "cpu_mhz", "util_pct"):
        xs, ys = [], []
        for group in groups.values():
            pairs = [(r["tok_s"], r[key]) for r in group if isinstance(r.get(key), (int, float))]
            if len(pairs) < 2:
                continue
            mean_t, mean_x = statistics.fmean(p[0] for p in pairs), statistics.fmean(p[1] for p in pairs)
            for t, x in pairs:
                ys.append(t / mean_t - 1)
                xs.append(x / mean_x - 1 if mean_x else 0.0)
        r_value = pearson(xs, ys)
        spread = max((abs(y) for y in ys), default=None)
        print(
            f"throughput's deviation from its server-and-level mean vs {key}'s: "
            f"r = {'-' if r_value is None else f'{r_value:.2f}'} over {len(ys)} rounds"
            + ("" if spread is None else f" (largest throughput deviation {spread:.0%})")
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
