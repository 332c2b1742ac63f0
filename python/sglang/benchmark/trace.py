"""Time-varying loads for bench_serving: a trace is a list of phases, each with a duration, a
concurrency (fixed, or ramping from one value to another) and optionally a mix of simulated
accept lengths, played closed-loop against one server (--trace FILE).

    {"phases": [{"seconds": 30, "concurrency": 1, "accept_mix": {"3.0": 1.0}},
                {"seconds": 30, "concurrency": [1, 256], "accept_mix": {"3.0": 0.5, "1.4": 0.5}},
                {"seconds": 30, "concurrency": 16}]}

A mix (accept length -> weight) makes each request ask a server run with SGLANG_SIMULATE_ACC_LEN
for its own accept length (benchmarks of speculation on random weights only; a server without a
draft ignores it). Requests started in a phase count toward that phase; each phase's `window_*`
fields count instead the output tokens delivered during its seconds, whichever phase their request
started in (what the server served under that phase's load)."""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
import json
import math
import random
import time

from sglang.benchmark.backends import BackendClient, RequestResult
from sglang.benchmark.metrics import summarize


class TraceError(ValueError):
    """A trace file or mix that cannot be played; the message names the problem."""


@dataclasses.dataclass
class Phase:
    seconds: float
    concurrency_from: int
    concurrency_to: int
    accept_mix: list[tuple[float, float]] | None = None  # (accept length, weight)

    def concurrency_at(self, elapsed: float) -> int:
        """The target number of requests in flight `elapsed` seconds into the phase."""
        fraction = min(max(elapsed / self.seconds, 0.0), 1.0)
        return max(1, round(self.concurrency_from + (self.concurrency_to - self.concurrency_from) * fraction))


def parse_mix(value, where: str = "--accept-length-mix") -> list[tuple[float, float]]:
    """'3.0:0.7,1.4:0.3' or {"3.0": 0.7, "1.4": 0.3} -> [(3.0, 0.7), (1.4, 0.3)]."""
    if isinstance(value, str):
        pairs = []
        for part in value.split(","):
            length, _, weight = part.partition(":")
            pairs.append((length, weight or "1"))
    elif isinstance(value, dict):
        pairs = list(value.items())
    else:
        raise TraceError(f"{where}: expected 'LEN:WEIGHT,...' or an object, got {value!r}")
    mix = []
    for length, weight in pairs:
        try:
            length, weight = float(length), float(weight)
        except (TypeError, ValueError):
            raise TraceError(f"{where}: {length!r}:{weight!r} is not a number pair") from None
        if not (1 <= length <= 64 and math.isfinite(weight) and weight > 0):
            raise TraceError(f"{where}: accept length {length} must be in [1, 64] and its weight {weight} > 0")
        mix.append((length, weight))
    if not mix:
        raise TraceError(f"{where}: the mix is empty")
    return mix


def draw_accept_length(mix: list[tuple[float, float]] | None, rng: random.Random) -> float | None:
    if not mix:
        return None
    return rng.choices([length for length, _ in mix], weights=[weight for _, weight in mix])[0]


def load_trace(path: str) -> list[Phase]:
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except (OSError, ValueError) as e:
        raise TraceError(f"--trace {path}: cannot read it as JSON ({e})") from None
    phases = raw.get("phases") if isinstance(raw, dict) else None
    if not isinstance(phases, list) or not phases:
        raise TraceError(f'--trace {path}: expected {{"phases": [...]}} with at least one phase')
    return [_phase(f"--trace {path}: phase {i}", phase) for i, phase in enumerate(phases)]


def _phase(where: str, raw) -> Phase:
    if not isinstance(raw, dict):
        raise TraceError(f"{where}: expected an object, got {raw!r}")
    unknown = sorted(set(raw) - {"seconds", "concurrency", "accept_mix"})
    if unknown:
        raise TraceError(f"{where}: unknown key(s) {unknown}")
    seconds, concurrency = raw.get("seconds"), raw.get("concurrency")
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not 0 < seconds < math.inf:
        raise TraceError(f"{where}: seconds must be a number > 0, got {seconds!r}")
    ramp = concurrency if isinstance(concurrency, list) else [concurrency, concurrency]
    if len(ramp) != 2 or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 1 for c in ramp):
        raise TraceError(f"{where}: concurrency must be an integer >= 1 or [from, to], got {concurrency!r}")
    mix = parse_mix(raw["accept_mix"], f"{where}: accept_mix") if "accept_mix" in raw else None
    return Phase(float(seconds), ramp[0], ramp[1], mix)


async def play_trace(
    client: BackendClient, dataset, rng: random.Random, phases: list[Phase], tick_s: float = 0.02
) -> tuple[list[tuple[int, RequestResult]], float, float]:
    """Keeps each phase's concurrency in flight (closed loop) until the trace's time is up, then
    waits for the requests in flight; returns ((phase index, result) per request, start, duration)."""
    ends = [sum(p.seconds for p in phases[: i + 1]) for i in range(len(phases))]
    results: list[tuple[int, RequestResult]] = []
    pending: set[asyncio.Task] = set()

    async def one(index: int, request) -> None:
        results.append((index, await client.send(request)))

    start = time.perf_counter()
    while (elapsed := time.perf_counter() - start) < ends[-1]:
        index = next(i for i, end in enumerate(ends) if elapsed < end)
        phase = phases[index]
        target = phase.concurrency_at(elapsed - (ends[index] - phase.seconds))
        while len(pending) < target:
            request = dataset.sample(1, rng)[0]
            request.simulated_accept_length = draw_accept_length(phase.accept_mix, rng)
            pending.add(asyncio.create_task(one(index, request)))
        done, pending = await asyncio.wait(pending, timeout=tick_s, return_when=asyncio.FIRST_COMPLETED)
    if pending:
        await asyncio.wait(pending)
    return results, start, time.perf_counter() - start


def trace_line(results: list[tuple[int, RequestResult]], phases: list[Phase], start: float, duration: float) -> dict:
    """The result line of a trace: the whole run's fields, and per phase those of its requests and
    the tokens delivered during it; `drain_*`: the tokens delivered after the trace's time was up."""
    line = summarize([r for _, r in results], start, duration)
    windows = delivered_by_window(results, phases, start)
    line["phases"] = []
    for i, phase in enumerate(phases):
        mine = [r for index, r in results if index == i]
        fields = summarize(mine, start, phase.seconds) if mine else {"completed": 0}
        line["phases"].append(
            {
                "seconds": phase.seconds,
                "target_concurrency": [phase.concurrency_from, phase.concurrency_to],
                "accept_mix": phase.accept_mix,
                **fields,
                "window_output_tokens": windows[i],
                "window_output_throughput": windows[i] / phase.seconds,
            }
        )
    line["drain_seconds"] = max(0.0, duration - sum(phase.seconds for phase in phases))
    line["drain_output_tokens"] = windows[-1]
    return line


def delivered_by_window(results: list[tuple[int, RequestResult]], phases: list[Phase], start: float) -> list[float]:
    """Output tokens of the successful requests by the phase during which they arrived, and last
    those that arrived after the trace's time (len(phases) + 1 entries)."""
    ends = [start + sum(p.seconds for p in phases[: i + 1]) for i in range(len(phases))]
    windows = [0.0] * (len(phases) + 1)
    for _, result in results:
        if not result.success:
            continue
        for arrived, tokens in result.chunks:
            windows[bisect.bisect_right(ends, arrived)] += tokens
    return windows
