"""Is dynamic speculation as fast as the best static configuration? Reads pooled result lines
(interleaved_sweep.py / spec_envelope_gpu.sh with ROUNDS > 0) of one dynamic server, the static
servers it must match (no draft, always k_max, k = 1, ...) and optionally an A/A control (a
second instance of one static kind), and judges each level or a trace.

    python -m sglang.benchmark.envelope --dynamic D.jsonl --static no_draft=N.jsonl \\
        --static always=A.jsonl --static k1=K.jsonl --aa no_draft=N2.jsonl --out report.json

Levels: dynamic / best static >= 0.98, and >= 0.99 x no draft where no draft is best; a miss that
lies within the A/A spread of that level (|1 - control / its twin|) is reported as such. A trace
(lines without a concurrency): dynamic >= 1.05 x the best static on output tokens per second and
on mean time per output token; where the lines carry phases (tokens delivered during each
phase), each phase's dynamic / best static is shown too, with their mean, and the bound an oracle
picking the best static of each phase reaches on the tokens delivered during the phases. Exit status 0 when every goal holds, 1 when one is missed, 2 on
unusable input."""

from __future__ import annotations

import argparse
import json
import sys

GOAL_BEST = 0.98
GOAL_NO_DRAFT = 0.99
GOAL_TRACE = 1.05


def load(path: str) -> dict:
    """{level (None for a trace): line} of a pooled result file; a later line replaces an earlier one."""
    rows = {}
    with open(path, encoding="utf-8") as f:
        for text in f:
            if text.strip():
                row = json.loads(text)
                rows[row.get("max_concurrency")] = row
    if not rows:
        raise ValueError(f"{path}: no result lines")
    return rows


def named(value: str) -> tuple[str, str]:
    name, sep, path = value.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=FILE, got {value!r}")
    return name, path


def judge_level(level, dynamic: dict, statics: dict[str, dict], aa: tuple[str, dict] | None) -> dict:
    tok_s = {name: row["output_throughput"] for name, row in statics.items()}
    best = max(tok_s, key=tok_s.get)
    ratio = dynamic["output_throughput"] / tok_s[best]
    out = {
        "level": level,
        "dynamic_tok_s": round(dynamic["output_throughput"], 1),
        "static_tok_s": {name: round(value, 1) for name, value in tok_s.items()},
        "best_static": best,
        "dynamic_over_best": round(ratio, 4),
        "spec_step_share_by_k": dynamic.get("spec_step_share_by_k"),
    }
    ok = ratio >= GOAL_BEST
    if best == "no_draft":
        out["dynamic_over_no_draft"] = round(ratio, 4)
        ok = ok and ratio >= GOAL_NO_DRAFT
    if aa is not None:
        twin, row = aa
        spread = abs(1 - row["output_throughput"] / statics[twin]["output_throughput"])
        out["aa_spread"] = round(spread, 4)
        goal = GOAL_NO_DRAFT if best == "no_draft" else GOAL_BEST
        out["miss_within_aa"] = not ok and ratio >= goal - spread
    out["ok"] = ok
    return out


def judge_trace(dynamic: dict, statics: dict[str, dict]) -> dict:
    tok_s = {name: row["output_throughput"] for name, row in statics.items()}
    tpot = {name: row["mean_tpot_ms"] for name, row in statics.items()}
    best_tok, best_tpot = max(tok_s, key=tok_s.get), min(tpot, key=tpot.get)
    throughput_gain = dynamic["output_throughput"] / tok_s[best_tok]
    tpot_gain = tpot[best_tpot] / dynamic["mean_tpot_ms"]
    out = {
        "level": "trace",
        "dynamic_tok_s": round(dynamic["output_throughput"], 1),
        "static_tok_s": {n: round(v, 1) for n, v in tok_s.items()},
        "dynamic_mean_tpot_ms": round(dynamic["mean_tpot_ms"], 3),
        "static_mean_tpot_ms": {n: round(v, 3) for n, v in tpot.items()},
        "throughput_over_best": round(throughput_gain, 4),
        "tpot_gain_over_best": round(tpot_gain, 4),
        "ok": throughput_gain >= GOAL_TRACE and tpot_gain >= GOAL_TRACE,
    }
    phases = judge_phases(dynamic, statics)
    if phases:
        out["phases"] = phases
        ratios = [p["dynamic_over_best"] for p in phases if p["dynamic_over_best"] is not None]
        out["mean_phase_ratio"] = round(sum(ratios) / len(ratios), 4) if ratios else None
        out.update(phase_oracle(dynamic, statics))
    return out


def phase_oracle(dynamic: dict, statics: dict[str, dict]) -> dict:
    """What a choice per phase could gain at most: the tokens delivered during the phases by the best
    static of each phase, summed (an oracle that switches between the static servers at the phase
    boundaries), against the best single static's and dynamic's, all over the same phase seconds.
    If the oracle is under the trace goal, no policy that picks among these settings per phase can
    reach it; one that picks per step or per request may do somewhat better."""

    def delivered(line):
        return [phase.get("window_output_tokens", 0) for phase in line["phases"]]

    per_static = {name: delivered(line) for name, line in statics.items()}
    best_single = max(sum(tokens) for tokens in per_static.values())
    oracle = sum(max(tokens[i] for tokens in per_static.values()) for i in range(len(dynamic["phases"])))
    if not best_single:
        return {}
    return {
        "phase_oracle_over_best": round(oracle / best_single, 4),
        "phase_window_dynamic_over_best": round(sum(delivered(dynamic)) / best_single, 4),
    }


def judge_phases(dynamic: dict, statics: dict[str, dict]) -> list[dict]:
    """Per phase: the tokens each server delivered during it per second, and dynamic / the best
    static; [] unless every line carries the same phases with delivered tokens."""
    lines = [dynamic, *statics.values()]
    if not all(line.get("phases") for line in lines) or len({len(line["phases"]) for line in lines}) != 1:
        return []
    if not all("window_output_throughput" in phase for line in lines for phase in line["phases"]):
        return []
    rows = []
    for i, phase in enumerate(dynamic["phases"]):
        tok_s = {name: line["phases"][i]["window_output_throughput"] for name, line in statics.items()}
        best = max(tok_s, key=tok_s.get)
        mine = phase["window_output_throughput"]
        rows.append(
            {
                "phase": i,
                "target_concurrency": phase["target_concurrency"],
                "dynamic_tok_s": round(mine, 1),
                "static_tok_s": {n: round(v, 1) for n, v in tok_s.items()},
                "best_static": best,
                "dynamic_over_best": round(mine / tok_s[best], 4) if tok_s[best] else None,
            }
        )
    return rows


def report(dynamic: dict, statics: dict[str, dict], aa: tuple[str, dict] | None) -> list[dict]:
    levels = sorted((set(dynamic).intersection(*statics.values())), key=lambda level: (level is None, level or 0))
    if not levels:
        raise ValueError("the files share no level")
    rows = []
    for level in levels:
        if level is None:
            rows.append(judge_trace(dynamic[level], {name: s[level] for name, s in statics.items()}))
            continue
        twin = (aa[0], aa[1][level]) if aa is not None and level in aa[1] else None
        rows.append(judge_level(level, dynamic[level], {name: s[level] for name, s in statics.items()}, twin))
    return rows


def print_table(rows: list[dict]) -> None:
    for row in rows:
        if row["level"] == "trace":
            print(
                f"trace: dynamic {row['dynamic_tok_s']} tok/s ({row['throughput_over_best']:.3f} x best), mean TPOT "
                f"{row['dynamic_mean_tpot_ms']} ms ({row['tpot_gain_over_best']:.3f} x best) {'ok' if row['ok'] else 'MISS'}"
            )
            for phase in row.get("phases", []):
                low, high = phase["target_concurrency"]
                load = f"{low}" if low == high else f"{low}->{high}"
                print(
                    f"  phase {phase['phase']} (concurrency {load}): dynamic {phase['dynamic_tok_s']} tok/s delivered, "
                    f"best static {phase['best_static']} {phase['static_tok_s'][phase['best_static']]}: "
                    + (
                        f"{phase['dynamic_over_best']:.3f}"
                        if phase["dynamic_over_best"] is not None
                        else "none delivered"
                    )
                )
            if row.get("mean_phase_ratio") is not None:
                print(f"  mean of the phases' dynamic / best: {row['mean_phase_ratio']:.3f}")
            if "phase_oracle_over_best" in row:
                print(
                    f"  tokens delivered during the phases, over the best static's: dynamic "
                    f"{row['phase_window_dynamic_over_best']:.3f}, the best static of each phase (an oracle "
                    f"switching at the boundaries) {row['phase_oracle_over_best']:.3f}"
                )
            continue
        aa = f", A/A spread {row['aa_spread']:.3f}" if "aa_spread" in row else ""
        verdict = "ok" if row["ok"] else ("miss within A/A" if row.get("miss_within_aa") else "MISS")
        print(
            f"concurrency {row['level']}: dynamic {row['dynamic_tok_s']} tok/s, best static {row['best_static']} "
            f"{row['static_tok_s'][row['best_static']]}: {row['dynamic_over_best']:.3f}{aa} {verdict}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sglang.benchmark.envelope", description=__doc__.split("\n")[0])
    parser.add_argument("--dynamic", required=True, help="the dynamic server's pooled result file")
    parser.add_argument(
        "--static",
        type=named,
        action="append",
        required=True,
        help="NAME=FILE of a static server (no_draft, always, k1, ...); give each kind",
    )
    parser.add_argument("--aa", type=named, default=None, help="NAME=FILE: a second instance of static NAME")
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    args = parser.parse_args(argv)
    try:
        statics = {name: load(path) for name, path in args.static}
        aa = None
        if args.aa is not None:
            if args.aa[0] not in statics:
                raise ValueError(f"--aa {args.aa[0]}: no --static of that name")
            aa = (args.aa[0], load(args.aa[1]))
        rows = report(load(args.dynamic), statics, aa)
    except (OSError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print_table(rows)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)
    return 0 if all(row["ok"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
