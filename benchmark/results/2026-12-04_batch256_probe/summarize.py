"""The batch-256 probe's summary (run.sh): output tok/s per server and round, the scheduler's step
tables at batch 129-256 pooled over the measured busy periods, and the dynamic server's learned costs.

    python benchmark/results/2026-12-04_batch256_probe/summarize.py RAW_DIR [--json OUT.json]"""

from __future__ import annotations

import glob
import json
import os
import sys

PHASES = ("receive", "schedule", "launch", "process", "wait", "collect", "send")


def read_lines(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def step_rows(raw: str, name: str) -> dict[str, dict]:
    """Every measured busy period's groups at the bs256 bucket, pooled per kind (step-weighted means;
    p50 / p90 as the step-weighted mean of the periods')."""
    pooled: dict[str, dict] = {}
    for path in sorted(glob.glob(os.path.join(raw, "steps", f"{name}.*.json"))):
        with open(path) as f:
            summary = json.load(f)
        for group, row in summary.items():
            kind, bucket = group.split("/")
            if bucket != "bs256" or row["steps"] < 20:
                continue
            acc = pooled.setdefault(kind, {"steps": 0, "periods": [], **{k: 0.0 for k in
                                    ["mean_batch", "pass_us", "p50_us", "p90_us", *(p + "_us" for p in PHASES)]}})
            n = row["steps"]
            acc["steps"] += n
            acc["periods"].append((os.path.basename(path), n, round(row["pass_us"] / 1e3, 3)))
            for key in acc:
                if key not in ("steps", "periods"):
                    acc[key] += n * row[key]
    for acc in pooled.values():
        for key in acc:
            if key not in ("steps", "periods"):
                acc[key] /= acc["steps"]
    return pooled


def main() -> int:
    raw = sys.argv[1]
    out: dict = {"groups": {}}
    for group in ("a", "b", "c"):
        folder = os.path.join(raw, group)
        names = [os.path.basename(p)[: -len(".rounds.jsonl")] for p in sorted(glob.glob(os.path.join(folder, "*.rounds.jsonl")))]
        if not names:
            continue
        print(f"== group {group}: output tok/s per round (order), pooled; accept length; steps by k; retractions")
        out["groups"][group] = {}
        for name in names:
            rounds = read_lines(os.path.join(folder, f"{name}.rounds.jsonl"))
            pooled = read_lines(os.path.join(folder, f"{name}.jsonl"))[-1]
            info_path = os.path.join(folder, f"{name}.server_info.json")
            state = {}
            if os.path.exists(info_path):
                with open(info_path) as f:
                    state = json.load(f)["internal_states"][0]
            entry = {"round_output_throughput": [r["output_throughput"] for r in rounds],
                     "round_position": [r["position"] for r in rounds], "output_throughput": pooled["output_throughput"],
                     "mean_tpot_ms": pooled.get("mean_tpot_ms"), "accept_length": pooled.get("spec_accept_length"),
                     "spec_steps_by_k": pooled.get("spec_steps_by_k"), "failed": pooled.get("failed"),
                     "num_retractions": state.get("num_retractions"), "steps_bs256": step_rows(raw, name)}
            out["groups"][group][name] = entry
            rounds_text = " / ".join(f"{t:,.0f}" for t in entry["round_output_throughput"])
            print(f"{name:16} {rounds_text:>28}  pooled {entry['output_throughput']:>8,.0f}  "
                  f"tpot {entry['mean_tpot_ms'] or 0:6.2f} ms  accept {entry['accept_length'] or 1:.3f}  "
                  f"k {entry['spec_steps_by_k']}  retractions {entry['num_retractions']}  failed {entry['failed']}")
        print(f"-- group {group}: scheduler pass per step at bucket bs256 (batch 129-256), ms, pooled over measured periods")
        print(f"{'server':16} {'kind':8} {'steps':>6} {'batch':>6} {'pass':>7} {'p50':>7} {'p90':>7} "
              + " ".join(f"{p:>8}" for p in PHASES))
        for name in names:
            for kind, row in out["groups"][group][name]["steps_bs256"].items():
                print(f"{name:16} {kind:8} {row['steps']:>6} {row['mean_batch']:>6.1f} {row['pass_us'] / 1e3:>7.3f} "
                      f"{row['p50_us'] / 1e3:>7.3f} {row['p90_us'] / 1e3:>7.3f} "
                      + " ".join(f"{row[p + '_us'] / 1e3:>8.3f}" for p in PHASES))
                print(f"{'':16} {'':8} per period (file, steps, pass ms): {row['periods']}")
    for info_path in glob.glob(os.path.join(raw, "[bc]", "dynamic.server_info.json")):
        with open(info_path) as f:
            state = json.load(f)["internal_states"][0]
        policy = state["spec_policy"]
        cost = policy["cost"]
        out["dynamic_policy"] = policy
        print(f"== dynamic: draft drops {state.get('spec_draft_drops')}, adoptions {state.get('spec_draft_adoptions')}, "
              f"explorations {state.get('spec_draft_explorations')}, prompts without the draft "
              f"{state.get('spec_prompts_without_draft')}")
        print("== dynamic: learned costs at no context (ms per step), bucket >= 128: learned (median) / window mean / samples; prior")
        for k, by_bucket in sorted(cost["learned_ms"].items()):
            for bucket, ms in sorted(by_bucket.items(), key=lambda kv: int(kv[0])):
                if int(bucket) < 128:
                    continue
                prior = cost["prior"]["plain_ms"][bucket] if k == "0" else cost["prior"]["spec_ms"][k][bucket]
                print(f"k={k} bs{bucket}: learned {ms:.3f}  window mean {cost['window_mean_ms'][k][bucket]:.3f}  "
                      f"samples {cost['samples'][k][bucket]}  prior {prior:.3f}")
        print(f"steps_per_k {policy['steps_per_k']}  switches {policy['switches']}  exploration {policy['exploration']}  "
              f"rates {policy['acceptance_rates']}  last_switch {policy['last_switch']!r}")
    with open(os.path.join(raw, "summary.json"), "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
