"""What a speculative server's decode steps cost, read from its cost log (SGLANG_SPEC_COST_LOG=PREFIX
on the server; spec_envelope_gpu.sh sets it with COST_LOG=1).

    python -m sglang.benchmark.cost_log_report LOG [LOG...] [--json OUT]

For each log: the cost samples per batch-size octave (1, 2-3, 4-7, ...) and k (median, mean and
10th / 90th percentiles in ms), the tokens a verify of each k gave per request, and the paired
cost of each k against the k that ran around it: for every run of samples of one k at an octave,
the ratio of its median to the median of the samples of the other k just before and after it at
the same octave (up to PAIR_NEIGHBOURS each side, within PAIR_MAX_GAP samples). A paired ratio
compares two k's at one moment, so a slowdown common to every k (requests retiring, a busy host)
cancels out of it; the per-octave medians mix moments. From the paired ratios and the tokens per
verify: the value of each k (tokens per request per second) relative to the k it was paired with.
Then, per octave and k, the run's first cost sample against the rest: a sample is the period from
one decode launch to the next, which under overlap waits for the step launched before it, so the
first sample of a run of one k (taken at its second launch) holds its first step, the one right
after a switch; where that one costs more, every short run (exploration's) prices its k high.
Finally the decode steps per k and the switches (a decode launch whose k differs from the one
before it), exploration's steps apart, and the pauses: launch-to-launch gaps of PAUSE_MIN_S to
PAUSE_MAX_S (longer ones are the server idling between plays), counted by whether requests were
still running (the scheduler stood still) or the batch had drained to one (no new requests came:
the front end, or the client, stood still)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict

PAIR_NEIGHBOURS = 8  # samples of the surrounding k taken on each side of a run
PAIR_MAX_GAP = 64  # a neighbour further than this many samples (at any octave) is too old to pair
PAUSE_MIN_S = 0.1  # a launch-to-launch gap this long is a pause (steps of the models served take ms)
PAUSE_MAX_S = 1.0  # longer: the server idle between plays


def octave(batch_size: int) -> int:
    """The batch-size octave's lower bound: 1, 2, 4, 8, ..."""
    return 1 << (max(batch_size, 1).bit_length() - 1)


def octave_label(low: int) -> str:
    return str(low) if low == 1 else f"{low}-{2 * low - 1}"


def parse(lines) -> dict:
    """{"samples": [(octave, k, seconds)], "run_positions": [each sample's step's place in its run of one
    k: 2 for the run's first sample], "launches": [(k, exploration steps)], "verifies": {k: [requests,
    tokens]}, "timeline": [(time, batch size; 0 for a prefill launch)]}. Malformed lines raise ValueError
    naming the line."""
    samples, launches, verifies, timeline = [], [], defaultdict(lambda: [0, 0]), []
    positions, run, sampled_run = [], 0, 0  # run: same-k decode launches ending at the last launch
    for number, line in enumerate(lines, 1):
        fields = line.split()
        if not fields:
            continue
        try:
            kind = fields[0]
            if kind == "S":  # written after the next launch's L line: the sampled step is the one before
                samples.append((octave(int(fields[1])), int(fields[2]), float(fields[4])))
                positions.append(sampled_run)
            elif kind == "L":
                k = int(fields[3])
                sampled_run = run
                run = run + 1 if launches and run and launches[-1][0] == k else 1
                launches.append((k, int(fields[5])))
                timeline.append((float(fields[1]), int(fields[2])))
            elif kind == "V":
                verifies[int(fields[1])][0] += int(fields[2])
                verifies[int(fields[1])][1] += int(fields[3])
            elif kind == "P":
                timeline.append((float(fields[1]), 0))
                run = 0  # a prefill between two launches: the next decode launch starts a run
            else:
                raise ValueError(f"unknown record {kind!r}")
        except (IndexError, ValueError) as e:
            raise ValueError(f"line {number}: {line.strip()!r}: {e}") from None
    return {
        "samples": samples,
        "run_positions": positions,
        "launches": launches,
        "verifies": dict(verifies),
        "timeline": timeline,
    }


def pauses(timeline) -> dict:
    """{"pauses", "pause_s", "busy_s", "with_running", "drained", "after_prefill"}: gaps between launches
    of PAUSE_MIN_S to PAUSE_MAX_S, their seconds, the seconds of every gap under PAUSE_MAX_S, and how many
    began after a decode launch of more than one request (the scheduler stood still with work), of one
    (drained) or after a prefill launch."""
    out = {"pauses": 0, "pause_s": 0.0, "busy_s": 0.0, "with_running": 0, "drained": 0, "after_prefill": 0}
    for (t, batch), (next_t, _) in zip(timeline, timeline[1:]):
        gap = next_t - t
        if gap >= PAUSE_MAX_S:
            continue
        out["busy_s"] += gap
        if gap >= PAUSE_MIN_S:
            out["pauses"] += 1
            out["pause_s"] += gap
            out["with_running" if batch > 1 else "drained" if batch == 1 else "after_prefill"] += 1
    return out


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def cost_table(samples) -> dict:
    """{(octave, k): {"n", "median_ms", "mean_ms", "p10_ms", "p90_ms"}}."""
    by_key = defaultdict(list)
    for low, k, seconds in samples:
        by_key[(low, k)].append(1e3 * seconds)
    return {
        key: {
            "n": len(ms),
            "median_ms": statistics.median(ms),
            "mean_ms": statistics.fmean(ms),
            "p10_ms": _quantile(ms, 0.1),
            "p90_ms": _quantile(ms, 0.9),
        }
        for key, ms in sorted(by_key.items())
    }


def paired_ratios(samples) -> dict:
    """{(octave, k, reference k): [ratio, ...]}: each run of k's samples at an octave against the
    samples of the other k around it there (see the module's docstring)."""
    by_octave = defaultdict(list)  # octave -> [(index in the whole log, k, seconds)]
    for index, (low, k, seconds) in enumerate(samples):
        by_octave[low].append((index, k, seconds))
    out = defaultdict(list)
    for low, seq in by_octave.items():
        start = 0
        while start < len(seq):
            end = start
            while end < len(seq) and seq[end][1] == seq[start][1]:
                end += 1
            k, run = seq[start][1], [s for _, _, s in seq[start:end]]
            # The neighbours: the run before and the run after, if of one other k and recent.
            for reference in {seq[start - 1][1] if start else None, seq[end][1] if end < len(seq) else None} - {None}:
                near = [
                    s
                    for i, kk, s in reversed(seq[max(0, start - PAIR_NEIGHBOURS) : start])
                    if kk == reference and seq[start][0] - i <= PAIR_MAX_GAP
                ]
                near += [
                    s
                    for i, kk, s in seq[end : end + PAIR_NEIGHBOURS]
                    if kk == reference and i - seq[end - 1][0] <= PAIR_MAX_GAP
                ]
                if near:
                    out[(low, k, reference)].append(statistics.median(run) / statistics.median(near))
            start = end
    return dict(out)


def first_in_run(samples, positions) -> dict:
    """{(octave, k): {"first_n", "first_median_ms", "rest_n", "rest_median_ms"}}: each run's first cost
    sample (run position 2) against its later ones, where k has both."""
    split = defaultdict(lambda: ([], []))
    for (low, k, seconds), position in zip(samples, positions):
        split[(low, k)][position > 2].append(1e3 * seconds)
    return {
        key: {
            "first_n": len(first),
            "first_median_ms": statistics.median(first),
            "rest_n": len(rest),
            "rest_median_ms": statistics.median(rest),
        }
        for key, (first, rest) in sorted(split.items())
        if first and rest
    }


def switches(launches) -> dict:
    """{"steps_per_k", "switches", "exploration_steps"}: switches counts decode launches whose k
    differs from the launch before it, exploration_steps the launches exploration chose."""
    steps, count, explored, previous = defaultdict(int), 0, 0, None
    for k, exploration_steps in launches:
        steps[k] += 1
        if previous is not None:
            count += k != previous[0]
            explored += exploration_steps > previous[1]
        previous = (k, exploration_steps)
    return {"steps_per_k": dict(sorted(steps.items())), "switches": count, "exploration_steps": explored}


def report(log: dict) -> dict:
    tokens = {k: tokens / requests for k, (requests, tokens) in sorted(log["verifies"].items()) if requests}
    tokens.setdefault(0, 1.0)
    pairs = paired_ratios(log["samples"])
    paired = {}
    for (low, k, reference), ratios in sorted(pairs.items()):
        cost = statistics.median(ratios)
        entry = {"runs": len(ratios), "cost_ratio": cost}
        if k in tokens and reference in tokens:
            entry["value_ratio"] = tokens[k] / tokens[reference] / cost
        paired[f"{octave_label(low)} k{k}/k{reference}"] = entry
    costs = {f"{octave_label(low)} k{k}": row for (low, k), row in cost_table(log["samples"]).items()}
    first = first_in_run(log["samples"], log.get("run_positions", ()))
    return {
        "costs": costs,
        "first_in_run": {f"{octave_label(low)} k{k}": row for (low, k), row in first.items()},
        "tokens_per_verify": tokens,
        "paired": paired,
        **switches(log["launches"]),
        **pauses(log["timeline"]),
    }


def render(name: str, rep: dict) -> str:
    lines = [
        f"== {name}: decode steps per k {rep['steps_per_k']}, {rep['switches']} switches "
        f"({rep['exploration_steps']} exploration steps); tokens per request per verify: "
        + ", ".join(f"k{k} {t:.2f}" for k, t in rep["tokens_per_verify"].items()),
        f"pauses of {1e3 * PAUSE_MIN_S:.0f}-{1e3 * PAUSE_MAX_S:.0f} ms between launches: {rep['pauses']} "
        f"({rep['pause_s']:.2f} s of {rep['busy_s']:.1f} s busy; {rep['with_running']} with requests running, "
        f"{rep['drained']} with the batch drained to one, {rep['after_prefill']} after a prefill)",
        f"{'octave k':<14}{'n':>7}{'median ms':>11}{'mean ms':>9}{'p10':>8}{'p90':>8}",
    ]
    for key, row in rep["costs"].items():
        lines.append(
            f"{key:<14}{row['n']:>7}{row['median_ms']:>11.3f}{row['mean_ms']:>9.3f}"
            f"{row['p10_ms']:>8.3f}{row['p90_ms']:>8.3f}"
        )
    lines.append(f"{'paired':<22}{'runs':>6}{'cost ratio':>12}{'value ratio':>13}")
    for key, row in rep["paired"].items():
        value = f"{row['value_ratio']:>13.3f}" if "value_ratio" in row else f"{'':>13}"
        lines.append(f"{key:<22}{row['runs']:>6}{row['cost_ratio']:>12.3f}{value}")
    lines.append(f"{'first sample of a run':<22}{'n':>6}{'median ms':>11}{'rest n':>8}{'median ms':>11}{'ratio':>8}")
    for key, row in rep["first_in_run"].items():
        ratio = row["first_median_ms"] / row["rest_median_ms"]
        lines.append(
            f"{key:<22}{row['first_n']:>6}{row['first_median_ms']:>11.3f}{row['rest_n']:>8}"
            f"{row['rest_median_ms']:>11.3f}{ratio:>8.3f}"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("logs", nargs="+", help="cost logs (PREFIX.<pid>.txt)")
    parser.add_argument("--json", help="write every log's report here")
    args = parser.parse_args(argv)
    reports = {}
    for path in args.logs:
        try:
            with open(path) as f:
                reports[path] = report(parse(f))
        except (OSError, ValueError) as e:
            print(f"{path}: {e}", file=sys.stderr)
            return 1
        print(render(path, reports[path]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(reports, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
