"""What a decode step costs: the start-up table of measured step times (CostTable), and the
costs the running server learns over it from its own steps (LearnedCost)."""

from __future__ import annotations

import math
import statistics
from bisect import bisect_left
from collections import deque
from typing import Optional

class CostTable:
    """Measured seconds per decode step: plain[bs] for a PLAIN step and spec[(bs, k)] for a
    speculative step of k drafts (draft + verify + draft extend), at the captured batch-size
    buckets. Measured by replaying the captured graphs at start-up, since the ratio of the two
    depends on model, GPU and batch size in ways no formula gets right."""

    def __init__(self, plain: dict[int, float], spec: dict[tuple[int, int], float],
                 context_seconds: Optional[dict[int, float]] = None):
        """context_seconds[k]: seconds a step of k drafts adds per token of context in the batch
        (its attention reading the KV cache), which the start-up replays on an empty scratch
        row do not see: at batch 128 with 1k-token contexts the target's KV read is larger than
        its weights, and plain and speculative steps pay it alike (a verify reads each
        request's KV once), so leaving it out overstates what speculation costs there."""
        by_k: dict[int, dict[int, float]] = {0: dict(plain)} if plain else {}
        for (bs, k), seconds in spec.items():
            if k < 1:
                raise ValueError(f"CostTable: spec entry ({bs}, {k}) must have k >= 1 (k = 0 is the plain table)")
            by_k.setdefault(k, {})[bs] = seconds
        for k, table in by_k.items():
            for bs, seconds in table.items():
                if bs < 1 or not seconds > 0:
                    raise ValueError(f"CostTable: k={k} batch size {bs}: need batch size >= 1 and seconds > 0, "
                                     f"got {seconds}")
        self.context_seconds = dict(context_seconds or {})
        for k, seconds in self.context_seconds.items():
            if k not in by_k or not seconds >= 0:
                raise ValueError(f"CostTable: context seconds for k={k} need a measured step time and a value "
                                 f">= 0, got {seconds}")
        # k -> (sorted bucket sizes, their seconds), for a bisect per lookup. A step replays the
        # graph of the smallest bucket >= its batch, so a step's true cost cannot fall as the
        # bucket grows: a bucket measured slower than a larger one is timing noise, and takes the
        # larger one's time.
        self._buckets = {}
        for k, table in by_k.items():
            sizes = sorted(table)
            times = [table[bs] for bs in sizes]
            for i in range(len(times) - 2, -1, -1):
                times[i] = min(times[i], times[i + 1])
            self._buckets[k] = (sizes, times)

    @property
    def measured_steps(self) -> tuple[int, ...]:
        """Every k with at least one measurement (0 = plain)."""
        return tuple(sorted(self._buckets))

    def bucket(self, batch_size: int, k: int) -> int:
        """The measured bucket a step of k drafts at this batch size is priced by (the largest
        one beyond the table)."""
        sizes = self._buckets[k][0]
        return sizes[min(bisect_left(sizes, batch_size), len(sizes) - 1)]

    def seconds(self, batch_size: int, k: int, context_tokens: int = 0) -> float:
        """Seconds of one step of k drafts (0 = plain) at this batch size: the smallest measured
        bucket >= batch_size (the graph that would be replayed, padded), plus the KV read of
        `context_tokens` (the batch's summed context). Beyond the largest bucket there is no
        graph; the largest bucket's time is scaled by batch_size / largest, an extrapolation
        that assumes compute-bound steps there (linear in tokens)."""
        entry = self._buckets.get(k)
        if entry is None:
            raise ValueError(f"CostTable: no measured step time for k={k} "
                             f"(measured k: {list(self.measured_steps)})")
        if batch_size < 1:
            raise ValueError(f"CostTable: batch size must be >= 1, got {batch_size}")
        sizes, times = entry
        i = bisect_left(sizes, batch_size)
        step = times[i] if i < len(sizes) else times[-1] * batch_size / sizes[-1]
        return step + context_tokens * self.context_seconds.get(k, 0.0)

    def summary(self) -> dict:
        """{"plain_ms": {bs: ms}, "spec_ms": {k: {bs: ms}}} for logs and /get_server_info."""
        def ms(k: int) -> dict[int, float]:
            sizes, times = self._buckets[k]
            return {bs: round(1e3 * t, 4) for bs, t in zip(sizes, times)}

        return {"plain_ms": ms(0) if 0 in self._buckets else {},
                "spec_ms": {k: ms(k) for k in self.measured_steps if k > 0},
                "context_ns_per_token": {k: round(1e9 * s, 4) for k, s in sorted(self.context_seconds.items())}}


LEARN_FIRST_SAMPLES = 3  # a key has its own learned cost from this many samples on
LEARN_WINDOW = 9  # the learned cost is the median of a key's last this many samples
CONTEXT_CLASS_TOKENS = 512  # mean context per request below this is context class 0; each class above doubles it


def context_class(batch_size: int, context_tokens: int) -> int:
    """The class of a batch's mean context per request: 0 below CONTEXT_CLASS_TOKENS, then one
    class per doubling (1: 512-1023 tokens, 2: 1024-2047, 3: 2048-4095, ...)."""
    mean = context_tokens / max(batch_size, 1)
    return 0 if mean < CONTEXT_CLASS_TOKENS else 1 + int(math.log2(mean / CONTEXT_CLASS_TOKENS))


def context_class_label(cls: int) -> str:
    if cls == 0:
        return f"<{CONTEXT_CLASS_TOKENS}"
    low = CONTEXT_CLASS_TOKENS << (cls - 1)
    return f"{low}-{2 * low - 1}"


class LearnedCost:
    """Seconds per decode step as the running server pays them, learned online over the start-up
    table (the prior).

    A sample is the wall time between two consecutive decode launches where the launch before
    them ran the same k with nothing else launched between (spec_scheduling.observe_decode_launch):
    what one step costs the server end to end, with its host work, sampling, result processing
    and the device time the host could not hide. The start-up replays see none of that, nor the
    real batch's contexts; on 8B shapes at batch 256 they priced k = 1 a few percent better than
    plain decoding where serving it was 8% worse.

    The cost is learned per (batch-size bucket, context class, k) as a ratio to the prior, the
    context class being the batch's mean context per request in doublings (context_class). The
    prior's context term (seconds per token of context, per k) scales a ratio within its class;
    across classes it is not trusted: measured beside other servers starting up, it read 10x too
    high, and a ratio learned at 2K-token contexts then priced plain steps at 300 tokens 40% too
    cheap against speculative ones. A key's ratio is the median of its last LEARN_WINDOW samples,
    from LEARN_FIRST_SAMPLES on: one slow sample (a collection, a page fault) moves it not at all,
    a lasting change within a few samples. Exploration brings a few samples at a time, so the
    window of a k that runs rarely spans its last few bursts. Until a key has its own estimate it
    borrows the ratio of the nearest key at the same k, within one context class of its own
    (distance: doublings of batch size plus classes), else takes the prior as it is."""

    def __init__(self, prior: CostTable):
        self.prior = prior
        self._grouping_k = prior.measured_steps[-1]  # one grouping of batch sizes for every k
        self._window: dict[tuple[int, int, int], deque[float]] = {}
        self._log_ratio: dict[tuple[int, int, int], float] = {}  # (bucket, context class, k) -> log ratio
        self.samples: dict[tuple[int, int, int], int] = {}

    @property
    def measured_steps(self) -> tuple[int, ...]:
        return self.prior.measured_steps

    def bucket(self, batch_size: int) -> int:
        return self.prior.bucket(batch_size, self._grouping_k)

    def key(self, batch_size: int, context_tokens: int = 0) -> tuple[int, int]:
        """(batch-size bucket, context class): steps alike in cost, for the policy's exploration."""
        return self.bucket(batch_size), context_class(batch_size, context_tokens)

    def observe(self, batch_size: int, k: int, context_tokens: int, seconds: float) -> None:
        """One steady step of k drafts at this batch size and summed context took `seconds`."""
        if k not in self.prior.measured_steps or batch_size < 1 or not 0 < seconds < math.inf:
            return
        key = (*self.key(batch_size, context_tokens), k)
        window = self._window.get(key)
        if window is None:
            window = self._window[key] = deque(maxlen=LEARN_WINDOW)
        window.append(math.log(seconds / self.prior.seconds(batch_size, k, context_tokens)))
        self.samples[key] = self.samples.get(key, 0) + 1
        if len(window) >= LEARN_FIRST_SAMPLES:
            self._log_ratio[key] = statistics.median(window)

    def known(self, batch_size: int, k: int, context_tokens: int = 0) -> bool:
        """Whether this bucket and context class have their own learned cost for k."""
        return (*self.key(batch_size, context_tokens), k) in self._log_ratio

    def source(self, batch_size: int, k: int, context_tokens: int = 0) -> str:
        """Where the cost of k here comes from: "learned" (this bucket and context class have
        their own samples), "borrowed" (a nearby key's ratio) or "table" (the prior as it is)."""
        return self._lookup(batch_size, k, context_tokens)[1]

    def ratio(self, batch_size: int, k: int, context_tokens: int = 0) -> float:
        """learned / prior for a step of k at this batch size and summed context (borrowed from the
        nearest learned key at the same k within one context class while this one has none; 1
        when there is none)."""
        return math.exp(self._lookup(batch_size, k, context_tokens)[0])

    def _lookup(self, batch_size: int, k: int, context_tokens: int) -> tuple[float, str]:
        """(log ratio, source) of k at this batch size and summed context."""
        bucket, cls = self.key(batch_size, context_tokens)
        value = self._log_ratio.get((bucket, cls, k))
        if value is not None:
            return value, "learned"
        near = [(abs(math.log2(b / bucket)) + abs(c - cls), abs(c - cls), b, r)
                for (b, c, kk), r in self._log_ratio.items() if kk == k and abs(c - cls) <= 1]
        return (min(near)[3], "borrowed") if near else (0.0, "table")

    def seconds(self, batch_size: int, k: int, context_tokens: int = 0) -> float:
        return self.prior.seconds(batch_size, k, context_tokens) * self.ratio(batch_size, k, context_tokens)

    def summary(self) -> dict:
        """{"learned_ms": {k: {bucket: ms at no context}} (per bucket, the context class with the
        most samples), "window_mean_ms": (the same from the mean of the window's ratios instead of
        its median: where the two differ, steps of that kind vary, e.g. a costly step every few),
        "samples": {k: {bucket: n}} (all classes), "learned_ms_by_context": {class label: {k:
        {bucket: ms}}}} beside the prior's table, for logs, /get_server_info and /metrics."""
        learned: dict[int, dict[int, float]] = {}
        means: dict[int, dict[int, float]] = {}
        samples: dict[int, dict[int, int]] = {}
        by_context: dict[str, dict[int, dict[int, float]]] = {}
        shown: dict[tuple[int, int], int] = {}  # (k, bucket) -> samples of the class shown
        for (bucket, cls, k), value in sorted(self._log_ratio.items()):
            prior_ms = 1e3 * self.prior.seconds(bucket, k)
            ms = round(prior_ms * math.exp(value), 4)
            by_context.setdefault(context_class_label(cls), {}).setdefault(k, {})[bucket] = ms
            n = self.samples[(bucket, cls, k)]
            if n > shown.get((k, bucket), 0):
                shown[(k, bucket)] = n
                learned.setdefault(k, {})[bucket] = ms
                window = self._window[(bucket, cls, k)]
                means.setdefault(k, {})[bucket] = round(prior_ms * sum(map(math.exp, window)) / len(window), 4)
        for (bucket, _, k), n in sorted(self.samples.items()):
            samples.setdefault(k, {})[bucket] = samples.get(k, {}).get(bucket, 0) + n
        return {"prior": self.prior.summary(), "learned_ms": learned, "window_mean_ms": means, "samples": samples,
                "learned_ms_by_context": by_context}
