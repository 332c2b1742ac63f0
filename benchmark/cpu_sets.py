"""CPU lists (taskset -c form) for pinning servers in the GPU runs, one per line.

python benchmark/cpu_sets.py servers N   N + 1 lines: four physical cores per server (the first
                                         logical CPU of each) and two for the client where the
                                         machine has them; otherwise its logical CPUs split
                                         evenly (siblings together), two for the client
python benchmark/cpu_sets.py roles       4 lines: two cores each for a server's HTTP process,
                                         scheduler and detokenizer, and for the client; every
                                         server gets the same ones (only one is measured at a
                                         time), so no server's result depends on where the
                                         kernel happened to place it
"""

from __future__ import annotations

import subprocess
import sys


def cores() -> list[list[str]]:
    """Logical CPUs grouped by physical core, in core order."""
    try:
        listing = subprocess.run(["lscpu", "-p=CPU,CORE"], capture_output=True, text=True, check=True).stdout
        rows = [line.split(",") for line in listing.splitlines() if line and not line.startswith("#")]
    except (OSError, subprocess.CalledProcessError):
        rows = [["0", "0"]]
    by_core: dict[int, list[str]] = {}
    for cpu, core in rows:
        by_core.setdefault(int(core), []).append(cpu)
    return [by_core[c] for c in sorted(by_core)]


def split(groups: int, each: int, spare: int) -> list[list[str]]:
    """`groups` sets of `each` cores and one of `spare`, the first logical CPU of each core; if the
    machine has fewer cores, its logical CPUs split evenly (siblings together) with the last set
    taking the rest."""
    found = cores()
    if len(found) >= groups * each + spare:
        firsts = [core[0] for core in found]
        return [firsts[i * each : (i + 1) * each] for i in range(groups)] + [
            firsts[groups * each : groups * each + spare]
        ]
    logical = [cpu for core in found for cpu in core]
    size = max(1, (len(logical) - spare) // groups)
    return [logical[i * size : (i + 1) * size] or logical[:1] for i in range(groups)] + [
        logical[groups * size :] or logical[-1:]
    ]


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "servers" and argv[1].isdigit():
        sets = split(int(argv[1]), 4, 2)
    elif argv == ["roles"]:
        sets = split(3, 2, 2)
    else:
        print(__doc__, file=sys.stderr)
        return 2
    for cpus in sets:
        print(",".join(cpus))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
