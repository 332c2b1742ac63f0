"""Replay the speculation policy of this checkout against a server's recorded decode costs.

    python -m sglang.benchmark.cost_log_replay LOG --server-info INFO.json [--seeds N]

LOG is a cost log (SGLANG_SPEC_COST_LOG) of a server that measured every k often, best one with
dense exploration (SGLANG_SPEC_EXPLORE_EVERY; spec_envelope_gpu.sh's dynamic_x); INFO.json its
/get_server_info snapshot, whose cost table (the start-up prior) the replayed policy starts from.
The replay walks the log's decode launches in order (their batch sizes and contexts; a prefill
between two launches breaks the cost-sample chain, as on the server). At each launch the policy
(or a fixed k) picks k; the step costs what the log's cost sample nearest in time at the same
batch-size octave cost (the next octave down where it has none), whatever k it was of, scaled by
the two k's relative cost there (from the log's runs of one k paired with another around them),
and gives each request 1 + accepted drafts at the per-position acceptance rate that the log's
verifies imply. What steps cost at each moment, slow stretches included, is thus charged to
whichever k runs then, each k at its cost relative to the others; what is lost is only how that
relation itself varies from step to step.

Prints tokens per second of decode time for each fixed k and for the policy (per seed), the
policy's decided switches, steps per k and exploration share, and the policy against the best
fixed k. Prefills, admissions and the draft's catch-up are not replayed: this compares choices of
k, not servers."""

from __future__ import annotations

import argparse
import bisect
import json
import random
import statistics
import sys
from collections import defaultdict

from sglang.benchmark.cost_log_report import octave, paired_ratios
from sglang.srt.speculative.cost_model import CostTable
from sglang.srt.speculative.spec_policy import make_policy
from sglang.srt.sampling.simulated_acceptance import simulated_accept_rate


def load_log(lines) -> dict:
    """{"launches": [(batch size, context) or None for a prefill], "sequence": [(octave, k, seconds)]
    (the cost samples in order), "by_octave": {octave: [(launch index, k, seconds)]}, "tokens": {k:
    tokens per request per verify}}."""
    launches, verifies = [], defaultdict(lambda: [0, 0])
    sequence, by_octave = [], defaultdict(list)
    for number, line in enumerate(lines, 1):
        fields = line.split()
        try:
            if not fields:
                continue
            if fields[0] == "L":
                launches.append((int(fields[2]), int(fields[4])))
            elif fields[0] == "P":
                launches.append(None)
            elif fields[0] == "S":
                sample = (octave(int(fields[1])), int(fields[2]), float(fields[4]))
                sequence.append(sample)
                by_octave[sample[0]].append((len(launches), sample[1], sample[2]))
            elif fields[0] == "V":
                verifies[int(fields[1])][0] += int(fields[2])
                verifies[int(fields[1])][1] += int(fields[3])
            else:
                raise ValueError(f"unknown record {fields[0]!r}")
        except (IndexError, ValueError) as e:
            raise ValueError(f"line {number}: {line.strip()!r}: {e}") from None
    if not any(launches):
        raise ValueError("no decode launches (L lines) in the log")
    tokens = {k: t / n for k, (n, t) in verifies.items() if n}
    return {"launches": launches, "sequence": sequence, "by_octave": dict(by_octave), "tokens": tokens}


def prior_from_server_info(info: dict) -> CostTable:
    """The cost table in a /get_server_info snapshot (its speculation policy's cost prior)."""

    def find(node):
        if isinstance(node, dict):
            if isinstance(node.get("prior"), dict) and "plain_ms" in node["prior"]:
                return node["prior"]
            nodes = node.values()
        elif isinstance(node, list):
            nodes = node
        else:
            return None
        for child in nodes:
            found = find(child)
            if found is not None:
                return found
        return None

    prior = find(info)
    if prior is None:
        raise ValueError("the server info has no cost table (was the server started with --speculative-adaptive?)")
    plain = {int(bs): ms / 1e3 for bs, ms in prior["plain_ms"].items()}
    spec = {(int(bs), int(k)): ms / 1e3 for k, by_bs in prior["spec_ms"].items() for bs, ms in by_bs.items()}
    context = {int(k): ns / 1e9 for k, ns in prior.get("context_ns_per_token", {}).items()}
    return CostTable(plain, spec, context)


def acceptance_rate(tokens: dict) -> float:
    """The per-position rate p whose chain of the deepest verified k gives its tokens per verify
    (1 + p + ... + p^k); 0.5 where the log has no verify."""
    if not tokens:
        return 0.5
    k = max(tokens)
    return simulated_accept_rate(tokens[k], k)


def relative_costs(log: dict) -> dict:
    """{(octave, k): what a step of k costs relative to one of the deepest k at that octave}: the
    median over the log's runs of one paired with the other around it (cost_log_report.paired_ratios), else the ratio of their medians at the octave."""
    pairs = paired_ratios(log["sequence"])
    by_key = defaultdict(list)
    for low, k, seconds in log["sequence"]:
        by_key[(low, k)].append(seconds)
    out = {}
    for low in {low for low, _ in by_key}:
        ks = sorted(k for lo, k in by_key if lo == low)
        deep = ks[-1]
        for k in ks:
            if k == deep:
                out[(low, k)] = 1.0
            elif (low, k, deep) in pairs:
                out[(low, k)] = statistics.median(pairs[(low, k, deep)])
            elif (low, deep, k) in pairs:
                out[(low, k)] = 1.0 / statistics.median(pairs[(low, deep, k)])
            else:
                out[(low, k)] = statistics.median(by_key[(low, k)]) / statistics.median(by_key[(low, deep)])
    return out


def step_cost(log: dict, relative: dict, batch_size: int, k: int, index: int) -> float:
    """What a step of k at this batch size costs at launch `index`: the log's cost sample nearest
    in time at the batch's octave (the next octave down where it has none), whatever k it was of,
    scaled by the two k's relative cost there. A slow stretch in the log is thus charged to
    whatever k the replay runs then, and k's cost beside the others is the log's paired one."""
    low = octave(batch_size)
    while low >= 1:
        seq = log["by_octave"].get(low)
        if seq and (low, k) in relative:
            i = bisect.bisect_left(seq, (index,))
            _, k_sampled, seconds = min(seq[max(0, i - 1) : i + 1], key=lambda s: abs(s[0] - index))
            return seconds * relative[(low, k)] / relative[(low, k_sampled)]
        low //= 2
    for (lo, kk), _ in sorted(relative.items(), key=lambda item: -item[0][0]):  # above the batch's octave
        if kk == k:
            return step_cost(log, relative, lo, k, index)
    raise ValueError(f"the log has no cost sample of k = {k}")


def replay(log: dict, prior: CostTable, k_max: int, fixed: int | None = None, seed: int = 0) -> dict:
    rng = random.Random(seed)
    relative = relative_costs(log)
    rate = acceptance_rate(log["tokens"])
    policy = make_policy("cost", k_max, cost=prior)
    tokens = seconds = 0.0
    previous, index = None, 0
    for launch in log["launches"]:
        if launch is None:
            previous = None
            continue
        index += 1
        batch_size, context = launch
        rids = [f"r{i}" for i in range(batch_size)]
        k = fixed if fixed is not None else policy.choose(rids, context)
        cost = step_cost(log, relative, batch_size, k, index)
        seconds += cost
        out = []
        for _ in rids:
            n = 1
            while n <= k and rng.random() < rate:
                n += 1
            out.append(n)
        tokens += sum(out)
        if fixed is None:
            if previous == k:
                policy.observe_step_seconds(batch_size, k, context, cost)
            if k:
                policy.observe_verify(rids, out, k)
            else:
                policy.observe_probe(rids, [rng.random() < rate for _ in rids])
        previous = k
    result = {"tok_s": tokens / seconds}
    if fixed is None:
        summary = policy.summary()
        result.update(
            decisions=summary["decisions"],
            steps_per_k=summary["steps_per_k"],
            exploration_share=summary["exploration"]["share"],
        )
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log", help="a cost log (PREFIX.<pid>.txt)")
    parser.add_argument("--server-info", required=True, help="the server's /get_server_info snapshot (JSON)")
    parser.add_argument(
        "--seeds", type=int, default=3, help="replays of the policy, each with its own acceptance draws"
    )
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error("--seeds must be >= 1")
    try:
        with open(args.log) as f:
            log = load_log(f)
        with open(args.server_info) as f:
            prior = prior_from_server_info(json.load(f))
    except (OSError, ValueError) as e:
        print(f"cost_log_replay: {e}", file=sys.stderr)
        return 1
    k_max = max(prior.measured_steps)
    logged = {k for _, k, _ in log["sequence"]}
    fixed = {k: replay(log, prior, k_max, fixed=k) for k in prior.measured_steps if k in logged}
    best = max(fixed, key=lambda k: fixed[k]["tok_s"])
    for k, result in fixed.items():
        print(f"k = {k} on every step: {result['tok_s']:.0f} tok/s")
    policies = [replay(log, prior, k_max, seed=seed) for seed in range(args.seeds)]
    for seed, result in enumerate(policies):
        print(
            f"policy (seed {seed}): {result['tok_s']:.0f} tok/s, {result['tok_s'] / fixed[best]['tok_s']:.3f} x k = "
            f"{best}; {result['decisions']} decided switches, steps per k {result['steps_per_k']}, exploration "
            f"{result['exploration_share']:.2%} of steps"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "fixed": fixed,
                    "best_fixed": best,
                    "policy": policies,
                    "acceptance_rate": acceptance_rate(log["tokens"]),
                },
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
