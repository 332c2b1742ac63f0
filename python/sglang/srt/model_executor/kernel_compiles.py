"""Triton kernels compiled while the server serves.

Triton compiles a kernel again for every new specialization it meets: new constexprs (a tile
size picked from the batch's shape) or a different answer to "is this pointer 16-byte aligned,
is this integer 1 or a multiple of 16". A compile in the middle of serving stalls every running
request for its duration (0.3-1 s on the H200), which shows as a p99 time-to-first-token spike
the first time a batch takes the new shape. The engine avoids the known sources (aligned packed
copies, `TritonAttnBackend.precompile`, `Sampler.precompile`); this watch reports the rest: once
the engine is ready, each compile is logged as a warning naming the kernel and its
specialization, and counted in `/get_server_info` (`kernel_compiles_while_serving`,
`kernel_compile_seconds_while_serving`).
"""

from __future__ import annotations

import logging
import time

logger = logging.getLogger(__name__)

# Loads of an already-compiled kernel from Triton's disk cache take milliseconds; these are not
# worth a warning (still counted).
WARN_SECONDS = 0.05
MAX_LISTED = 16


class KernelCompileWatch:
    def __init__(self) -> None:
        self.serving = False
        self.compiles = 0
        self.compiles_while_serving = 0
        self.seconds_while_serving = 0.0
        self.kernels_while_serving: list[str] = []  # the first MAX_LISTED, for the summary
        self._started: dict[str, float] = {}
        self._installed = False

    def install(self) -> None:
        """Hook Triton's JIT (once per process; other hooks already set keep being called)."""
        if self._installed:
            return
        from triton import knobs

        before_start, before_done = knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook

        def on_start(**kwargs):
            self.started(kwargs["repr"])
            return before_start(**kwargs) if before_start else None  # a true value would skip the compile

        def on_done(**kwargs):
            self.finished(kwargs["repr"])
            return before_done(**kwargs) if before_done else None

        knobs.runtime.jit_cache_hook = on_start
        knobs.runtime.jit_post_compile_hook = on_done
        self._installed = True

    def mark_serving(self) -> None:
        """From now on compiles hold up requests."""
        self.serving = True

    def started(self, kernel: str) -> None:
        self._started[kernel] = time.perf_counter()

    def finished(self, kernel: str) -> None:
        start = self._started.pop(kernel, None)
        seconds = time.perf_counter() - start if start is not None else 0.0
        self.compiles += 1
        if not self.serving:
            return
        self.compiles_while_serving += 1
        self.seconds_while_serving += seconds
        if len(self.kernels_while_serving) < MAX_LISTED:
            self.kernels_while_serving.append(kernel)
        if seconds >= WARN_SECONDS:
            logger.warning(
                "Triton compiled a kernel while serving (%.2f s; running requests waited): %s", seconds, kernel
            )

    def summary(self) -> dict:
        return {
            "kernel_compiles": self.compiles,
            "kernel_compiles_while_serving": self.compiles_while_serving,
            "kernel_compile_seconds_while_serving": round(self.seconds_while_serving, 3),
            "kernels_compiled_while_serving": list(self.kernels_while_serving),
        }


WATCH = KernelCompileWatch()
