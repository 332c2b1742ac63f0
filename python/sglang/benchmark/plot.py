"""Draws result files of concurrency sweeps side by side: output throughput and median
inter-token latency against concurrency, one line per file (per label, if a file holds several).

    python -m sglang.bench_serving plot a.jsonl b.jsonl --output compare.png
"""

from __future__ import annotations

import argparse
import json
import os

PANELS = (("output_throughput", "Output throughput (tok/s)"), ("median_itl_ms", "Median ITL (ms)"))


def read_results(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def series(paths: list[str]) -> dict[str, list[dict]]:
    """Line name -> result lines sorted by concurrency. A line is a (file, label) pair; a later
    row at the same concurrency replaces an earlier one (a re-run appended to the same file)."""
    lines: dict[tuple[str, str], dict[float, dict]] = {}
    for path in paths:
        stem = os.path.splitext(os.path.basename(path))[0]
        for row in read_results(path):
            lines.setdefault((path, row.get("label") or stem), {})[concurrency_of(row)] = row
    labels = [label for _, label in lines]
    return {
        label if labels.count(label) == 1 else f"{label} ({path})": [rows[x] for x in sorted(rows)]
        for (path, label), rows in lines.items()
    }


def concurrency_of(row: dict) -> float:
    """The concurrency limit of the run, or what it reached when there was none."""
    return row["max_concurrency"] if row.get("max_concurrency") else row["concurrency"]


def plot(paths: list[str], output: str, title: str | None = None):
    """Writes the PNG and returns the matplotlib figure. The labels drawn are stored in the
    PNG's text metadata under "bench_serving_lines" (a JSON list)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = series(paths)
    levels = sorted({concurrency_of(row) for rows in lines.values() for row in rows})
    fig, axes = plt.subplots(1, len(PANELS), figsize=(6 * len(PANELS), 4.5))
    for ax, (field, ylabel) in zip(axes, PANELS):
        for label, rows in lines.items():
            points = [(concurrency_of(r), r[field]) for r in rows if r.get(field) is not None]
            ax.plot([x for x, _ in points], [y for _, y in points], marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [f"{x:g}" for x in levels])
        ax.set_ylim(bottom=0)
        ax.set_xlabel("Concurrency")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle(title or "bench_serving: " + " vs ".join(lines))
    fig.tight_layout()
    fig.savefig(output, dpi=120, metadata={"bench_serving_lines": json.dumps(list(lines))})
    plt.close(fig)
    return fig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sglang.bench_serving plot", description="Plot result files of bench_serving sweeps."
    )
    parser.add_argument("result_files", nargs="+", help="JSON-lines files written by --output-file")
    parser.add_argument("--output", "-o", default="bench_serving.png", help="PNG to write")
    parser.add_argument("--title", default=None)
    args = parser.parse_args(argv)
    try:
        plot(args.result_files, args.output, args.title)
    except (OSError, ValueError, KeyError) as e:
        parser.exit(1, f"error: cannot plot {', '.join(args.result_files)}: {e!r}\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
