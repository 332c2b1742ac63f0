"""Host time the speculation policy adds to each decode step, per policy and batch size, on this
machine's CPU: the calls the scheduler makes once per pipelined speculative step (choose, then
observe_verify and observe_host_seconds for the step before), in a loop with no model.

On a small model the scheduler's host time sets the step time (the demo pair on an H200: ~1.2 ms
of host time per speculative step at batch 4 against ~0.5 ms on the device), so every
microsecond the cost policy spends beyond `always` is throughput that dynamic speculation loses
where it makes the same choice. Requests come and go as in a closed loop: each finishes after
OUTPUT_LEN tokens and a new one takes its place.

    python benchmark/policy_host_cost.py [--batch-sizes 1,4,16,64,256] [--steps 4000] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from sglang.srt.speculative.spec_policy import CostTable, make_policy  # noqa: E402

K_MAX = 3
OUTPUT_LEN = 128
ACCEPT = (0.8, 0.8, 0.85)  # per-position acceptance, as the demo pair shows on code
# The demo pair's start-up cost table on an H200 (ms), at a few buckets.
PLAIN_MS = {1: 0.28, 2: 0.34, 4: 0.36, 8: 0.37, 16: 0.40, 32: 0.40, 64: 0.45, 128: 0.55, 256: 0.71}
SPEC_MS = {1: {1: 0.36, 2: 0.38, 4: 0.40, 8: 0.41, 16: 0.43, 32: 0.44, 64: 0.49, 128: 0.56, 256: 0.67},
           3: {1: 0.46, 2: 0.49, 4: 0.51, 8: 0.52, 16: 0.59, 32: 0.60, 64: 0.67, 128: 0.77, 256: 0.94}}


def cost_table() -> CostTable:
    spec = {(bs, k): ms / 1e3 for k, table in SPEC_MS.items() for bs, ms in table.items()}
    return CostTable({bs: ms / 1e3 for bs, ms in PLAIN_MS.items()}, spec)


def num_out(rng: random.Random, k: int) -> int:
    n = 1
    for i in range(k):
        if rng.random() >= ACCEPT[i]:
            break
        n += 1
    return n


def run(policy_name: str, batch_size: int, steps: int, seed: int = 0) -> float:
    """Microseconds of host time per step."""
    rng = random.Random(seed)
    policy = make_policy(policy_name, K_MAX, cost=cost_table() if policy_name == "cost" else None)
    batch = [[uuid.uuid4().hex, rng.randrange(OUTPUT_LEN)] for _ in range(batch_size)]  # rid, tokens so far
    context = 256 * batch_size
    k_prev = None
    start = time.perf_counter()
    for _ in range(steps):
        rids = [rid for rid, _ in batch]
        k = policy.choose(rids, context)
        if k_prev:
            outs = [num_out(rng, k_prev) for _ in batch]
            policy.observe_verify(rids, outs, k_prev)
            policy.observe_host_seconds(batch_size, k_prev, 1e-3)
            for entry, n in zip(batch, outs):
                entry[1] += n
        for entry in batch:
            if entry[1] >= OUTPUT_LEN:
                policy.forget(entry[0])
                entry[0], entry[1] = uuid.uuid4().hex, 0
        k_prev = k
    elapsed = time.perf_counter() - start
    # What the loop itself costs (the stand-in acceptance draws and bookkeeping), measured alone.
    rng = random.Random(seed)
    start = time.perf_counter()
    for _ in range(steps):
        rids = [rid for rid, _ in batch]
        outs = [num_out(rng, K_MAX) for _ in batch]
        for entry, n in zip(batch, outs):
            entry[1] += n
        for entry in batch:
            if entry[1] >= OUTPUT_LEN:
                entry[0], entry[1] = uuid.uuid4().hex, 0
    baseline = time.perf_counter() - start
    return 1e6 * max(elapsed - baseline, 0.0) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-sizes", default="1,4,16,64,256")
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--repeats", type=int, default=3, help="the median of this many runs is reported")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args()
    results = {}
    for bs in [int(x) for x in args.batch_sizes.split(",")]:
        row = {}
        for name in ("always", "cost"):
            times = sorted(run(name, bs, args.steps, seed) for seed in range(args.repeats))
            row[name] = round(times[len(times) // 2], 2)
        row["cost_minus_always"] = round(row["cost"] - row["always"], 2)
        results[bs] = row
        print(f"batch {bs:4d}: always {row['always']:7.2f} us/step, cost {row['cost']:7.2f} us/step "
              f"(+{row['cost_minus_always']:.2f})", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"us_per_step": results, "steps": args.steps}, indent=1))


if __name__ == "__main__":
    main()
