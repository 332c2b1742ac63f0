"""How fast each CPU of this machine runs the same Python work, alone and all at once, and how
far apart fresh processes on one CPU land (issue 8: on the H200 machine two identical demo
servers, even two identical in-process schedulers, ran the same load 6-45% apart, every phase of
their steps alike slower; this tells whether the machine's CPUs differ).

    python benchmark/cpu_speed_probe.py --out cpu_speed.json [--rounds 3] [--work 200000]

Each probe is a fresh process pinned to one CPU that times a fixed loop of scheduler-like
Python (objects, lists, dicts, attribute updates), best of 3 repeats; reported in ms.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

class _Req:
    __slots__ = ("a", "b", "out")

    def __init__(self, a):
        self.a, self.b, self.out = a, 0, []


def _work(n: int) -> int:
    """Scheduler-like Python: objects, lists, dicts, attribute updates."""
    reqs = [_Req(i) for i in range(256)]
    d = {}
    for i in range(n):
        r = reqs[i & 255]
        r.b += r.a
        r.out.append(i)
        if len(r.out) > 64:
            r.out.clear()
        d[i & 1023] = r.b
    return sum(d.values())


def work_ms(n: int = 200_000, repeats: int = 3) -> float:
    """The fixed loop of `n` iterations, best of `repeats`, in ms: in this process, on its CPU."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        _work(n)
        best = min(best, time.perf_counter() - start)
    return best * 1e3


# A fresh process pinned to CPU argv[1] prints work_ms(argv[2]).
PROBE = ("import os, sys; sys.path.insert(0, {here!r}); os.sched_setaffinity(0, {{int(sys.argv[1])}}); "
         "from cpu_speed_probe import work_ms; print(work_ms(int(sys.argv[2])))").format(
    here=os.path.dirname(os.path.abspath(__file__)))


def probe(cpu: int, work: int, variant: str = "default") -> subprocess.Popen:
    """variant: default; hashseed0 (PYTHONHASHSEED=0); no_aslr (setarch -R: the same addresses
    in every process)."""
    env = dict(os.environ, PYTHONHASHSEED="0") if variant == "hashseed0" else None
    cmd = [sys.executable, "-c", PROBE, str(cpu), str(work)]
    if variant == "no_aslr":
        cmd = ["setarch", os.uname().machine, "-R"] + cmd
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work", type=int, default=200_000)
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    alone = {cpu: [] for cpu in cpus}
    together = {cpu: [] for cpu in cpus}
    for _ in range(args.rounds):
        for cpu in cpus:  # one at a time
            p = probe(cpu, args.work)
            alone[cpu].append(float(p.communicate()[0]))
        procs = {cpu: probe(cpu, args.work) for cpu in cpus}  # all at once
        for cpu, p in procs.items():
            together[cpu].append(float(p.communicate()[0]))
        time.sleep(0.2)
    # Fresh processes on one CPU in turn: does a process keep a speed of its own, and does it
    # follow its hash seed or its address layout?
    same_cpu = {variant: [] for variant in ("default", "hashseed0", "no_aslr")}
    for _ in range(8):
        for variant, times in same_cpu.items():
            p = probe(cpus[len(cpus) // 2], args.work, variant)
            value = p.communicate()[0].strip()
            times.append(float(value) if value else None)  # no setarch: None
    rows = {cpu: {"alone_ms": alone[cpu], "together_ms": together[cpu]} for cpu in cpus}
    medians = [statistics.median(v["alone_ms"]) for v in rows.values()]
    out = {"cpus": rows, "same_cpu_fresh_processes_ms": same_cpu,
           "alone_median_spread": max(medians) / min(medians)}
    for cpu, row in rows.items():
        print(f"cpu {cpu:2}: alone {' '.join(f'{x:6.1f}' for x in row['alone_ms'])}   "
              f"together {' '.join(f'{x:6.1f}' for x in row['together_ms'])}")
    for variant, times in same_cpu.items():
        print(f"fresh processes on cpu {cpus[len(cpus) // 2]}, {variant:9}: "
              f"{' '.join('-' if x is None else f'{x:.1f}' for x in times)} ms")
    print(f"slowest / fastest CPU alone (medians): {out['alone_median_spread']:.3f}")
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
