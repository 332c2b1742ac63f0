"""Python's garbage collector in the server's processes: what start-up leaves is frozen out of its
reach, and its passes are timed.

A server process holds a few hundred thousand objects that Python's cycle collector tracks
(modules, functions, the model's modules, the tokenizer's state). A full collection walks all of
them: about 130-200 ms on a 2-core CPU for the HTTP and scheduler processes of the demo pair,
while every other thread of the process waits, and full collections come back as objects of
running requests accumulate (the demo pair's cost logs on an H100 show decode launches 150-550 ms
apart every few seconds on every server). Those objects live as long as the process,
so `settle_after_startup` collects once and freezes them (gc.freeze): later collections walk only
what was made since."""

from __future__ import annotations

import gc
import logging
import os
import time
from typing import Optional

logger = logging.getLogger(__name__)

NO_FREEZE_ENV = "SGLANG_GC_NO_FREEZE"  # diagnosis: =1 leaves start-up objects in the passes (for A/B runs)


class GcWatch:
    """Times every pass of the collector in this process (a gc callback: a few microseconds a
    pass), counts them per generation and logs each one that paused the process for
    `warn_after_s` or longer (0: none is logged)."""

    def __init__(self, warn_after_s: float = 0.0):
        if not warn_after_s >= 0:
            raise ValueError(f"--gc-warning-threshold-secs must be >= 0, got {warn_after_s}")
        self.warn_after_s = warn_after_s
        self.passes = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self.longest_s = 0.0
        self.frozen_objects = 0  # set once at start-up: gc.get_freeze_count() walks them all (~6 ms per 300K)
        self._started: Optional[float] = None

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        if self._started is None:
            return
        took, self._started = time.perf_counter() - self._started, None
        generation = info["generation"]
        self.passes[generation] += 1
        self.seconds[generation] += took
        self.longest_s = max(self.longest_s, took)
        if self.warn_after_s and took >= self.warn_after_s:
            logger.warning(
                "garbage collection (generation %d) paused this process for %.3f s (%d objects collected)",
                generation,
                took,
                info.get("collected", 0),
            )

    def start(self) -> "GcWatch":
        if self not in gc.callbacks:
            gc.callbacks.append(self)
        return self

    def stop(self) -> None:
        if self in gc.callbacks:
            gc.callbacks.remove(self)

    def summary(self) -> dict:
        """For /get_server_info: the objects frozen at start-up, passes and seconds per generation,
        the longest pause."""
        return {
            "frozen_objects": self.frozen_objects,
            "passes": list(self.passes),
            "seconds": [round(s, 6) for s in self.seconds],
            "longest_s": round(self.longest_s, 6),
        }


def settle_after_startup(process: str, warn_after_s: float = 0.0) -> GcWatch:
    """Collects what start-up left behind, freezes the rest (every later collection skips it) and
    starts timing the collector's passes. Called by each server process once it is ready."""
    watch = GcWatch(warn_after_s)
    if os.environ.get(NO_FREEZE_ENV) == "1":
        logger.warning(
            "%s: %s=1, start-up objects stay in the garbage collector's passes (for comparisons "
            "only: a full pass walks them all)",
            process,
            NO_FREEZE_ENV,
        )
    else:
        gc.collect()
        gc.freeze()
        watch.frozen_objects = gc.get_freeze_count()
        logger.debug(
            "%s: %d objects from start-up frozen out of the garbage collector's passes", process, watch.frozen_objects
        )
    return watch.start()
