"""Requests whose grammar is still compiling wait here, beside the waiting queue: a compile runs
on the grammar backend's threads while the scheduler keeps serving everybody else."""

from __future__ import annotations

import concurrent.futures
from typing import Optional

from sglang.srt.constrained.grammar import constraint_key
from sglang.srt.managers.schedule_batch import Req

# With nothing else to do, the scheduler waits this long for a compile before it looks at its
# sockets again.
IDLE_WAIT_S = 0.005


class GrammarQueue:
    def __init__(self, backend):
        self.backend = backend  # a GrammarBackend, or None (--grammar-backend none)
        self.reqs: list[Req] = []

    def __len__(self) -> int:
        return len(self.reqs)

    def add(self, req: Req) -> Optional[str]:
        """Starts the request's compile; returns an error message when it cannot have one."""
        key = constraint_key(req.sampling_params)
        if self.backend is None:
            return f"{key[0]} needs a grammar backend; this server runs with --grammar-backend none"
        req.grammar_future = self.backend.compile(key)
        self.reqs.append(req)
        return None

    def remove(self, req: Req) -> bool:
        if req in self.reqs:
            self.reqs.remove(req)
            return True
        return False

    def pop_ready(self, idle: bool = False) -> list[tuple[Req, Optional[str]]]:
        """(request, error or None) for every request whose compile has ended; a request without
        error has its matcher. `idle`: nothing else to do, so wait a moment for one."""
        if idle and self.reqs:
            concurrent.futures.wait(
                [req.grammar_future for req in self.reqs],
                timeout=IDLE_WAIT_S,
                return_when=concurrent.futures.FIRST_COMPLETED,
            )
        ready = [req for req in self.reqs if req.grammar_future.done()]
        out = []
        for req in ready:
            self.reqs.remove(req)
            future, req.grammar_future = req.grammar_future, None
            error = future.exception()
            if error is None:
                req.grammar = self.backend.matcher(
                    future.result(), constraint_key(req.sampling_params)[0], thinks=req.require_reasoning
                )
            out.append((req, None if error is None else str(error)))
        return out
