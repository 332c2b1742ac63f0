"""Where the scheduler loop's time goes, step by step, without a profiler (diagnosis only).

With `SGLANG_STEP_TIMES=PREFIX` the scheduler process times each pass of its loop in phases
(receiving requests, scheduling the step, launching it, processing the step before it, waiting
for the device, collecting outputs, sending them) with `time.perf_counter` marks, about a
microsecond a step in all. Passes are grouped by what they launched (a prefill, a plain decode,
a speculative decode at k) and the batch's size bucket. After each busy period (the loop idled a
full poll interval) it writes PREFIX.N.json, and PREFIX.N.txt with one table line per group:
steps, mean microseconds per phase, and percentiles of the whole pass. Two servers configured
alike can then be compared phase by phase; cProfile cannot do that, as its cost per call changes
what it measures.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Optional

from sglang.srt.bench_hooks import STEP_TIMES_ENV

logger = logging.getLogger(__name__)

PHASES = ("receive", "schedule", "launch", "process", "wait", "collect", "send")
# Whole-pass times kept per group and period for its percentiles (the sums count every pass).
MAX_SAMPLES = 100_000


def size_bucket(batch_size: int) -> int:
    """The power of two at or above `batch_size` (0 for none)."""
    return 0 if batch_size <= 0 else 1 << (batch_size - 1).bit_length()


class NullStepClock:
    """The default: every mark is a no-op."""

    def begin(self) -> None:
        pass

    def lap(self, phase: str) -> None:
        pass

    def waited(self, seconds: float) -> None:
        pass

    def launched(self, kind: str, batch_size: int) -> None:
        pass

    def end(self) -> None:
        pass

    def on_idle(self) -> None:
        pass


class StepClock(NullStepClock):
    """Times each loop pass: `begin`, then `lap(phase)` after each phase (the time since the
    previous mark goes to it), `waited` moves the device wait out of the phase that waited,
    `launched` names the pass's group, `end` adds the pass to its group. A pass that launched
    nothing is grouped as `none`."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.periods = 0
        self.stopped = False
        self._reset()
        self._current = dict.fromkeys(PHASES, 0.0)
        self._kind, self._batch_size = "none", 0
        self._start = self._last = time.perf_counter()

    def _reset(self) -> None:
        self.groups: dict[tuple[str, int], dict] = {}

    def begin(self) -> None:
        self._start = self._last = time.perf_counter()
        for phase in PHASES:
            self._current[phase] = 0.0
        self._kind, self._batch_size = "none", 0

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self._current[phase] += now - self._last
        self._last = now

    def waited(self, seconds: float) -> None:
        """The device wait inside the phase being timed (lap it next): counted as `wait`."""
        self._current["wait"] += seconds
        self._current["process"] -= seconds

    def launched(self, kind: str, batch_size: int) -> None:
        self._kind, self._batch_size = kind, batch_size

    def end(self) -> None:
        if self._kind == "none" and self._last - self._start < 1e-4:
            return  # an empty pass of a loop with nothing to launch: not a step
        key = (self._kind, size_bucket(self._batch_size))
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = {"steps": 0, "requests": 0, "totals": [], **{p: 0.0 for p in PHASES}}
        group["steps"] += 1
        group["requests"] += self._batch_size
        for phase in PHASES:
            group[phase] += self._current[phase]
        if len(group["totals"]) < MAX_SAMPLES:
            group["totals"].append(self._last - self._start)

    def summary(self) -> dict:
        """Per group `KIND/bsBUCKET`: steps, mean batch size, mean microseconds per phase and
        the whole pass's mean and p50 / p90 / p99."""
        out = {}
        for (kind, bucket), group in sorted(self.groups.items()):
            steps = group["steps"]
            totals = sorted(group["totals"])
            row = {"steps": steps, "mean_batch": group["requests"] / steps}
            row.update({f"{p}_us": 1e6 * group[p] / steps for p in PHASES})
            row["pass_us"] = sum(row[f"{p}_us"] for p in PHASES)
            for q in (50, 90, 99):
                row[f"p{q}_us"] = 1e6 * totals[min(len(totals) - 1, len(totals) * q // 100)]
            out[f"{kind}/bs{bucket}"] = row
        return out

    def table(self, summary: Optional[dict] = None) -> str:
        summary = self.summary() if summary is None else summary
        head = f"{'group':18} {'steps':>7} {'bs':>6} " + " ".join(f"{p:>8}" for p in PHASES)
        head += f" {'pass':>8} {'p50':>8} {'p90':>8} {'p99':>8}"
        lines = [head + "   (microseconds per step)"]
        for name, row in summary.items():
            line = f"{name:18} {row['steps']:>7} {row['mean_batch']:>6.1f} "
            line += " ".join(f"{row[p + '_us']:>8.1f}" for p in PHASES)
            line += " " + " ".join(f"{row[q]:>8.1f}" for q in ("pass_us", "p50_us", "p90_us", "p99_us"))
            lines.append(line)
        return "\n".join(lines)

    def on_idle(self) -> None:
        """The loop idled a poll interval: write the busy period that ended, if any."""
        if not self.groups or self.stopped:
            return
        summary = self.summary()
        path = f"{self.prefix}.{self.periods}"
        table = self.table(summary) + "\n"
        if not write_period_files(
            STEP_TIMES_ENV,
            path,
            {".json": lambda p: write_text(p, json.dumps(summary, indent=1)), ".txt": lambda p: write_text(p, table)},
            "step times",
            logger,
        ):
            self.stopped = True
            return
        self.periods += 1
        self._reset()


def write_text(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def write_period_files(env: str, path: str, writers: dict, what: str, log: logging.Logger) -> bool:
    """Writes a diagnosis aid's files of one busy period, PATH + each suffix through its writer
    (suffix -> function of the file's path), and logs where on `log` (the aid's module's). On an
    OSError it logs why and returns False: a diagnosis aid never stops the server, it stops
    itself instead."""
    suffixes = "{" + ",".join(suffix.lstrip(".") for suffix in writers) + "}"
    try:
        for suffix, write in writers.items():
            write(path + suffix)
    except OSError as e:
        log.error("%s: cannot write %s.%s (%s); %s stop", env, path, suffixes, e, what)
        return False
    log.info("%s of a busy period written to %s.%s", what, path, suffixes)
    return True


def make_step_clock(prefix: Optional[str]) -> NullStepClock:
    if not prefix:
        return NullStepClock()
    logger.warning(
        "%s is set: the scheduler times each step's phases, writing %s.N.{json,txt} after each busy period",
        STEP_TIMES_ENV,
        prefix,
    )
    return StepClock(prefix)
