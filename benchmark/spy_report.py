"""Reads py-spy's raw (collapsed) stacks, `frame;frame;... COUNT` per line, and prints where the
sampled process spent its time: by function inclusive of callees, and by own time. With two
files, the difference (second minus first) in microseconds per scheduler step, which is what
tells two servers' host cost apart (sched_spy_gpu.sh writes one file per server and level).

    python benchmark/spy_report.py FILE [FILE2] [--steps N [N2]] [--top 30] [--match sglang]

--steps: the steps each file's window covered (from the server's decode log, or samples'
duration x steps per second); without them the numbers are shares of the samples.
"""

from __future__ import annotations

import argparse
import collections
from pathlib import Path

IDLE_MARKERS = ("epoll_wait", "epoll_pwait", "poll (libc", "select (", "zmq_poll", "_poll (")


def frame_name(frame: str) -> str:
    """`function (file:line)` -> `function (file)`: lines of one function are pooled."""
    name, _, where = frame.partition(" (")
    path = where.rsplit(":", 1)[0] if ":" in where else where.rstrip(")")
    short = path.split("/site-packages/")[-1].split("/python/")[-1]
    return f"{name} ({short})"


def load(path: str) -> tuple[collections.Counter, collections.Counter, int, int]:
    """(inclusive counts, own counts, samples, idle samples) per function."""
    inclusive, own = collections.Counter(), collections.Counter()
    total = idle = 0
    for line in Path(path).read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [frame_name(f) for f in stack.split(";")]
        total += n
        if any(marker in frames[-1] for marker in IDLE_MARKERS):
            idle += n
        own[frames[-1]] += n
        for name in set(frames):
            inclusive[name] += n
    return inclusive, own, total, idle


def print_one(path: str, top: int, match: str) -> None:
    inclusive, own, total, idle = load(path)
    print(f"== {path}: {total} samples, {idle} idle ({100 * idle / max(total, 1):.0f}%)")
    print("  inclusive %  function")
    for name, n in inclusive.most_common():
        if match in name:
            print(f"  {100 * n / total:10.1f}  {name}")
            top -= 1
            if top == 0:
                break
    print("  own %  function (any)")
    for name, n in own.most_common(20):
        print(f"  {100 * n / total:6.1f}  {name}")


def print_diff(first: str, second: str, top: int, match: str, steps: list[int] | None, rate: float) -> None:
    a, _, total_a, _ = load(first)
    b, _, total_b, _ = load(second)
    if steps:
        unit = "us/step"
        scale_a, scale_b = 1e6 / rate / steps[0], 1e6 / rate / steps[-1]
    else:
        unit = "% of samples"
        scale_a, scale_b = 100 / total_a, 100 / total_b
    print(f"== {second} minus {first} ({unit}, inclusive)")
    names = set(a) | set(b)
    rows = sorted(names, key=lambda name: -abs(b[name] * scale_b - a[name] * scale_a))
    for name in rows:
        if match not in name:
            continue
        before, after = a[name] * scale_a, b[name] * scale_b
        print(f"  {after - before:+9.1f}  ({before:8.1f} -> {after:8.1f})  {name}")
        top -= 1
        if top == 0:
            break


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--steps", type=int, nargs="*", default=None)
    parser.add_argument("--rate", type=float, default=200.0, help="py-spy's samples per second")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--match", default="", help="only functions whose name or file contains this")
    args = parser.parse_args()
    if len(args.files) == 1:
        print_one(args.files[0], args.top, args.match)
    else:
        for path in args.files[:2]:
            print_one(path, args.top, args.match)
        print_diff(args.files[0], args.files[1], args.top, args.match, args.steps, args.rate)


if __name__ == "__main__":
    main()
