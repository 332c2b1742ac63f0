"""What a decode step costs: the start-up table of measured step times (CostTable), and the
costs the running server learns over it from its own steps (LearnedCost)."""

from __future__ import annotations

import math
import statistics
from bisect import bisect_left
from collections import deque
from itertools import accumulate
from typing import Optional


class CostTable:
    """Measured seconds per decode step, replaying the captured graphs at start-up (the ratio of
    plain to speculative steps depends on model, GPU and batch size in ways no formula gets
    right): plain[bs] for a PLAIN step, spec[(bs, k)] for one of k drafts, at the graph buckets.
    context_seconds[k]: what a step of k adds per token of context in the batch (its KV reads),
    which the replays on an empty scratch row do not see; at batch 128 with 1k-token contexts
    the target's KV read outweighs its weights."""

    def __init__(self, plain: dict[int, float], spec: dict[tuple[int, int], float], context_seconds=None):
        by_k: dict[int, dict[int, float]] = {0: dict(plain)} if plain else {}
        for (bs, k), seconds in spec.items():
            by_k.setdefault(k, {})[bs] = seconds
        self.context_seconds = dict(context_seconds or {})
        for k, seconds in self.context_seconds.items():
            if k not in by_k or not seconds >= 0:
                raise ValueError(
                    f"CostTable: context seconds for k={k} need a measured step time and a value >= 0, got {seconds}"
                )
        # k -> (sorted bucket sizes, their seconds). A bucket measured slower than a larger one is
        # timing noise (a step replays the smallest bucket >= its batch): it takes the larger's time.
        self._buckets = {}
        for k, table in by_k.items():
            sizes = sorted(table)
            self._buckets[k] = (sizes, list(accumulate((table[bs] for bs in reversed(sizes)), min))[::-1])

    @property
    def measured_steps(self) -> tuple[int, ...]:  # every measured k (0 = plain)
        return tuple(sorted(self._buckets))

    def bucket(self, batch_size: int, k: int) -> int:
        """The measured bucket a step of k drafts at this batch size is priced by (the largest
        one beyond the table)."""
        sizes = self._buckets[k][0]
        return sizes[min(bisect_left(sizes, batch_size), len(sizes) - 1)]

    def seconds(self, batch_size: int, k: int, context_tokens: int = 0) -> float:
        """Seconds of one step of k drafts (0 = plain): the smallest bucket >= batch_size (beyond
        the largest, its time scaled by batch_size / largest, as compute-bound steps would be),
        plus the KV read of `context_tokens` (the batch's summed context)."""
        entry = self._buckets.get(k)
        if entry is None:
            raise ValueError(f"CostTable: no measured step time for k={k} (measured k: {list(self.measured_steps)})")
        sizes, times = entry
        i = bisect_left(sizes, batch_size)
        step = times[i] if i < len(sizes) else times[-1] * batch_size / sizes[-1]
        return step + context_tokens * self.context_seconds.get(k, 0.0)

    def summary(self) -> dict:
        """{"plain_ms": {bs: ms}, "spec_ms": {k: {bs: ms}}} for logs and /get_server_info."""
        ms = {k: {bs: round(1e3 * t, 4) for bs, t in zip(*sizes_times)} for k, sizes_times in self._buckets.items()}
        return {
            "plain_ms": ms.get(0, {}),
            "spec_ms": {k: ms[k] for k in self.measured_steps if k > 0},
            "context_ns_per_token": {k: round(1e9 * s, 4) for k, s in sorted(self.context_seconds.items())},
        }


LEARN_FIRST_SAMPLES = 3  # a key has its own learned cost from this many samples on
LEARN_WINDOW = 9  # a k's offset is the median of its last this many paired samples at a key
LEVEL_WINDOW = 5  # a key's level is the median of its last this many residuals
MAX_PENDING = 64  # samples given to LearnedCost.observe_later are folded in by this many at the latest
CONTEXT_CLASS_TOKENS = 512  # mean context per request below this is context class 0; each class above doubles it


class _Level:
    """What steps cost at one key now, as a log ratio to the prior: the median of the last
    LEVEL_WINDOW residuals of the chosen k's samples (the last one's k is the anchor)."""

    def __init__(self):
        self.window: deque[float] = deque(maxlen=LEVEL_WINDOW)
        self.anchor: Optional[int] = None

    @property
    def set(self) -> bool:
        return len(self.window) >= LEARN_FIRST_SAMPLES

    @property
    def value(self) -> float:
        """The window's median (of an even count, the lower)."""
        return sorted(self.window)[(len(self.window) - 1) // 2]

    def update(self, k: int, residual: float) -> None:
        self.window.append(residual)
        self.anchor = k


class LearnedCost:
    """Seconds per decode step as the running server pays them, learned online over the start-up
    table (the prior). A sample is the wall time between two consecutive decode launches of the
    same k (the scheduler's sample rule): the step's whole cost to the server, host work included,
    which the start-up replays do not see (on 8B shapes at batch 256 they priced k = 1 a few
    percent better than plain decoding where serving it was 8% worse).

    Costs are learned per key (the octave 1, 2-3, 4-7, ... of the graph bucket, the context class
    of the mean context per request) as a log ratio to the prior: the key's level plus k's offset.
    The level is what steps cost there now (_Level: residuals of the chosen k's samples, less its
    offset). An offset is what k costs beside the chosen k: the median of k's last LEARN_WINDOW
    samples taken while another k was chosen (exploration), each less the level then, pooled with
    the octaves on either side. So a slowdown common to every k moves every price at once instead
    of making a k measured before it look cheaper than the one that runs. A key without a level or
    an offset of its own borrows the nearest key's (doublings of batch size plus classes, within
    one class), else takes the prior as it is."""

    def __init__(self, prior: CostTable):
        self.prior = prior
        self._grouping_k = prior.measured_steps[-1]  # one grouping of batch sizes for every k
        self._measured = frozenset(prior.measured_steps)
        self._octaves: dict[int, int] = {}  # batch size -> bucket()
        self._levels: dict[tuple[int, int], _Level] = {}  # (octave, context class) -> its level
        self._pairs: dict[tuple[int, int, int], deque[float]] = {}  # (octave, context class, k) -> offsets
        self._offset: dict[tuple[int, int, int], float] = {}
        self._borrowed: dict[tuple[int, int, int], tuple[float, Optional[str]]] = {}  # _offset_of, kept
        self._recent: dict[tuple[int, int, int], deque[float]] = {}  # the last log ratios, for the summary
        self.samples: dict[tuple[int, int, int], int] = {}
        self._pending: list[tuple[int, int, int, float, bool]] = []  # observe_later's, not folded in yet
        # (key, k) -> _at's answer, until the next sample (admissions price the same key many times).
        self._at_cache: dict[tuple[tuple[int, int], int], tuple[float, str]] = {}

    def bucket(self, batch_size: int) -> int:
        """The learned costs' batch-size group: the octave (1, 2-3, 4-7, ...) of the graph bucket
        that a step of this batch replays, named by its lower bound."""
        octave = self._octaves.get(batch_size)
        if octave is None:  # a few per step on the host's hot path: each batch size is looked up once
            octave = self._octaves[batch_size] = 1 << (self.prior.bucket(batch_size, self._grouping_k).bit_length() - 1)
        return octave

    def key(self, batch_size: int, context_tokens: int = 0) -> tuple[int, int]:
        """(batch-size octave, context class): steps alike in cost, for the policy's exploration. The
        class of the mean context per request is 0 below CONTEXT_CLASS_TOKENS, then one per doubling
        (1: 512-1023 tokens, 2: 1024-2047, ...)."""
        mean = context_tokens / max(batch_size, 1)
        cls = 0 if mean < CONTEXT_CLASS_TOKENS else 1 + int(math.log2(mean / CONTEXT_CLASS_TOKENS))
        return self.bucket(batch_size), cls

    def observe_later(self, batch_size: int, k: int, context_tokens: int, seconds: float, chosen: bool = True) -> None:
        """`observe`, folded in when a cost is next read: several samples folded together cost the
        host a few us each, against 10-20 us each folded at once (cold code in a serving loop)."""
        self._pending.append((batch_size, k, context_tokens, seconds, chosen))
        if len(self._pending) >= MAX_PENDING:
            self._fold()

    def _fold(self) -> None:
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        for sample in pending:
            self.observe(*sample)

    def observe(self, batch_size: int, k: int, context_tokens: int, seconds: float, chosen: bool = True) -> None:
        """One steady step of k drafts at this batch size and summed context took `seconds`;
        `chosen`: k was the policy's choice (False: another k was, and this step explored k)."""
        self._fold()  # an earlier sample first
        if k not in self._measured or batch_size < 1 or not 0 < seconds < math.inf:
            return
        self._at_cache.clear()
        where = self.key(batch_size, context_tokens)
        key = (*where, k)
        x = math.log(seconds / self.prior.seconds(batch_size, k, context_tokens))
        self.samples[key] = self.samples.get(key, 0) + 1
        self._recent.setdefault(key, deque(maxlen=LEARN_WINDOW)).append(x)
        if chosen:
            self._levels.setdefault(where, _Level()).update(k, x - self._offset_of(key)[0])
        else:
            self._pairs.setdefault(key, deque(maxlen=LEARN_WINDOW)).append(x - self._level_of(where)[0])
            self._pool_offsets(key)

    def _pool_offsets(self, key: tuple[int, int, int]) -> None:
        """Recomputes the offsets that pool this key's window: its own and its neighbours'."""
        self._borrowed.clear()
        bucket, cls, k = key
        for near in (bucket // 2, bucket, 2 * bucket):
            if len(self._pairs.get((near, cls, k), ())) >= LEARN_FIRST_SAMPLES:
                self._offset[(near, cls, k)] = statistics.median(
                    [v for b in (near // 2, near, 2 * near) for v in self._pairs.get((b, cls, k), ())]
                )

    def _nearest(self, keys, bucket: int, cls: int):
        """The key among `keys` ((bucket, class, ...)) nearest to (bucket, cls) within one class."""

        def distance(key):  # doublings of batch size plus classes; between equals the nearer class
            return abs(math.log2(key[0] / bucket)) + abs(key[1] - cls), abs(key[1] - cls), key

        return min((key for key in keys if abs(key[1] - cls) <= 1), key=distance, default=None)

    def _offset_of(self, key: tuple[int, int, int]) -> tuple[float, Optional[str]]:
        """(k's offset at the key, "own" / "near" / None): borrowed from the nearest key with one for
        k, else 0; what a key borrows is kept until exploration's next sample."""
        if key in self._offset:
            return self._offset[key], "own"
        found = self._borrowed.get(key)
        if found is None:
            near = self._nearest([other for other in self._offset if other[2] == key[2]], *key[:2])
            found = self._borrowed[key] = (self._offset[near], "near") if near is not None else (0.0, None)
        return found

    def _level_of(self, where: tuple[int, int]) -> tuple[float, Optional[str]]:
        """(the key's level, "own" / "near" / None): the nearest key's while its own is not set, else 0."""
        level = self._levels.get(where)
        if level is not None and level.set:
            return level.value, "own"
        near = self._nearest([other for other, lv in self._levels.items() if lv.set], *where)
        return (self._levels[near].value, "near") if near is not None else (0.0, None)

    def paired_samples(self, batch_size: int, k: int, context_tokens: int = 0) -> int:
        """How many samples k's offset at this key rests on (its own window and its neighbours')."""
        self._fold()
        bucket, cls = self.key(batch_size, context_tokens)
        return sum(len(self._pairs.get((b, cls, k), ())) for b in (bucket // 2, bucket, 2 * bucket))

    def known(self, batch_size: int, k: int, context_tokens: int = 0) -> bool:
        """Whether this key prices k from its own samples: its level is set, and k has run there
        (chosen, as the last to set the level, or explored beside the chosen k)."""
        return self.source(batch_size, k, context_tokens) == "learned"

    def source(self, batch_size: int, k: int, context_tokens: int = 0) -> str:
        """Where the cost of k here comes from: "learned" (this key's samples), "borrowed" (its
        level or k's offset from a nearby key) or "table" (the prior as it is)."""
        return self._at(self.key(batch_size, context_tokens), k)[1]

    def _at(self, where: tuple[int, int], k: int) -> tuple[float, str]:
        """(log ratio, source) of k at a key."""
        self._fold()
        found = self._at_cache.get((where, k))
        if found is None:
            level, level_from = self._level_of(where)
            offset, offset_from = self._offset_of((*where, k))
            if level_from is None and offset_from is None:
                found = 0.0, "table"
            else:
                learned = level_from == "own" and (offset_from == "own" or self._levels[where].anchor == k)
                found = level + offset, "learned" if learned else "borrowed"
            self._at_cache[(where, k)] = found
        return found

    def seconds(self, batch_size: int, k: int, context_tokens: int = 0) -> float:
        return self.seconds_each(batch_size, (k,), context_tokens)[k]

    def seconds_each(self, batch_size: int, ks, context_tokens: int = 0) -> dict[int, float]:
        """{k: seconds(batch_size, k, context_tokens)} for several k at once: the key is looked up once
        (the policy prices every candidate each time it evaluates)."""
        where = self.key(batch_size, context_tokens)
        prior = self.prior.seconds
        return {k: prior(batch_size, k, context_tokens) * math.exp(self._at(where, k)[0]) for k in ks}

    def summary(self) -> dict:
        """{"learned_ms": {k: {bucket: ms at no context}} (the context class with the most samples),
        "window_mean_ms": (the same from the window's mean: where it differs from the median, steps
        vary), "samples": {k: {bucket: n}}, "learned_ms_by_context": {class label: {k: {bucket:
        ms}}}} beside the prior's table, for logs, /get_server_info and /metrics."""
        self._fold()
        learned, means, samples, by_context = {}, {}, {}, {}  # as the docstring says
        shown: dict[tuple[int, int], int] = {}  # (k, bucket) -> samples of the class shown
        priced = set(self._offset) | {(*where, level.anchor) for where, level in self._levels.items() if level.set}
        for bucket, cls, k in sorted(priced):
            prior_ms = 1e3 * self.prior.seconds(bucket, k)
            ms = round(prior_ms * math.exp(self._at((bucket, cls), k)[0]), 4)
            low = CONTEXT_CLASS_TOKENS << cls >> 1  # class cls > 0: mean contexts low .. 2 * low - 1
            label = f"{low}-{2 * low - 1}" if cls else f"<{CONTEXT_CLASS_TOKENS}"
            by_context.setdefault(label, {}).setdefault(k, {})[bucket] = ms
            n = self.samples[(bucket, cls, k)]
            if n > shown.get((k, bucket), 0):
                shown[(k, bucket)] = n
                learned.setdefault(k, {})[bucket] = ms
                window = self._recent[(bucket, cls, k)]
                means.setdefault(k, {})[bucket] = round(prior_ms * sum(map(math.exp, window)) / len(window), 4)
        for (bucket, _, k), n in sorted(self.samples.items()):
            samples.setdefault(k, {})[bucket] = samples.get(k, {}).get(bucket, 0) + n
        return {
            "prior": self.prior.summary(),
            "learned_ms": learned,
            "window_mean_ms": means,
            "samples": samples,
            "learned_ms_by_context": by_context,
        }
