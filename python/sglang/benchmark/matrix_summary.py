"""Summary of a matrix run (run.sh): per load and level, each server's pooled output tok/s, its
rounds' spread (max / min - 1: what the same server read between rounds seconds apart), dynamic /
best static and dynamic's share of steps per k, then dynamic's learned costs.

    python -m sglang.benchmark.matrix_summary RAW_DIR"""

from __future__ import annotations

import json
import os
import sys
from collections import defaultdict


def server_names(folder: str) -> list[str]:
    """The servers with a pooled result file in a load's folder, in a fixed order."""
    order = ("no_draft", "always", "k1", "dynamic")
    names = [
        f[: -len(".jsonl")] for f in os.listdir(folder) if f.endswith(".jsonl") and not f.endswith(".rounds.jsonl")
    ]
    return sorted(
        names, key=lambda n: (order.index(n.removesuffix("_b")) if n.removesuffix("_b") in order else len(order), n)
    )


def rows(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def main(raw: str) -> None:
    for load in sorted(os.listdir(raw)):
        folder = os.path.join(raw, load)
        if not os.path.isdir(folder) or not os.path.exists(os.path.join(folder, "dynamic.jsonl")):
            continue
        print(f"== {load}")
        pooled = {
            name: {r["max_concurrency"]: r for r in rows(os.path.join(folder, f"{name}.jsonl"))}
            for name in server_names(folder)
        }
        rounds = defaultdict(list)
        for name in pooled:
            for r in rows(os.path.join(folder, f"{name}.rounds.jsonl")):
                rounds[(name, r["max_concurrency"])].append(r["output_throughput"])
        print(f"{'conc':>5} " + " ".join(f"{n:>16}" for n in pooled) + "  dyn/best  best      dynamic k share")
        for level in sorted(pooled["dynamic"]):
            cells, tok = [], {}
            for name in pooled:
                row = pooled[name].get(level)
                if row is None:
                    cells.append(f"{'-':>16}")
                    continue
                tok[name] = row["output_throughput"]
                per = rounds[(name, level)]
                spread = max(per) / min(per) - 1 if per and min(per) > 0 else float("nan")
                cells.append(f"{tok[name]:>9.0f} ±{100 * spread:4.1f}%")
            statics = {n: v for n, v in tok.items() if not n.startswith("dynamic") and not n.endswith("_b")}
            best = max(statics, key=statics.get)
            share = pooled["dynamic"][level].get("spec_step_share_by_k") or {}
            share_text = " ".join(f"k{k}:{v:.2f}" for k, v in sorted(share.items()))
            print(f"{level:>5} " + " ".join(cells) + f"  {tok['dynamic'] / statics[best]:.4f}  {best:<9} {share_text}")
        info = os.path.join(folder, "dynamic.server_info.json")
        if os.path.exists(info):
            with open(info, encoding="utf-8") as f:
                state = json.load(f)
            policy = (state.get("internal_states") or [state])[0].get("spec_policy", {})
            cost = policy.get("cost", {})
            print(
                "dynamic learned ms:", json.dumps(cost.get("learned_ms")), "samples:", json.dumps(cost.get("samples"))
            )
            print("dynamic prior ms:", json.dumps(cost.get("prior")))
            print(
                "exploration:",
                json.dumps(policy.get("exploration")),
                "switches:",
                policy.get("switches"),
                "decisions:",
                policy.get("decisions"),
                "last switch:",
                policy.get("last_switch"),
            )
        report = os.path.join(folder, "report.txt")
        if os.path.exists(report):
            with open(report, encoding="utf-8") as f:
                print(f.read())


if __name__ == "__main__":
    main(sys.argv[1])
