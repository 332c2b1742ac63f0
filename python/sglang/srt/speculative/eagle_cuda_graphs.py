"""CUDA graphs of whole speculative decode steps: one graph per batch-size bucket and k (k = 0: the
plain step), each holding the draft chain, the verify, acceptance and the draft extend, so a step
of any k the policy chooses replays in one launch."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Optional

import torch

from sglang.srt.model_executor.cuda_graph_runner import capture_graph, memory_growth, reserved_bytes
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.utils import HostStaging

if TYPE_CHECKING:
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

logger = logging.getLogger(__name__)


class SpecStepGraphs:
    """One CUDA graph per batch-size bucket for a whole greedy speculative step with k drafts
    (chain, verify, acceptance, draft extend, row updates): a step then costs the host one
    replay instead of ~5 replays and ~50 small launches. k = 0 is the plain step (the target's
    decode, its token, and the draft kept warm or the aux states buffered for a catch-up).
    Padding rows point at the worker's scratch row (whose position is reset inside the graph)
    and write their KV to slot 0."""

    def __init__(self, worker: "EAGLEWorkerV2", batch_sizes: list[int], k: int, draft: bool = True):
        self.worker = worker
        self.k, self.width = k, k + 1
        self.draft = draft  # False (k = 0 only): the target alone, for batches the draft does not follow
        self.batch_sizes = sorted(batch_sizes)
        self.max_bs = self.batch_sizes[-1]
        device = worker.device
        self.scratch = torch.tensor([worker.scratch_row], dtype=torch.int64, device=device)
        # Every input of a replay in one device buffer, which one copy from a host staging
        # buffer fills: request rows, KV slots, plain steps behind (a catch-up plain step), and
        # opted-out flags (a speculative step; 1: the row takes plain decoding's token).
        n, width = self.max_bs, self.width
        self.inputs = torch.zeros(n * (width + 3), dtype=torch.int64, device=device)
        self.slots_at, self.behind_at, self.opted_at = n, n + n * width, 2 * n + n * width
        self.rows = self.inputs[:n]
        self.slots = self.inputs[self.slots_at : self.behind_at]
        self.behind = self.inputs[self.behind_at : self.opted_at]
        self.opted_out = self.inputs[self.opted_at :]
        self.rows.fill_(worker.scratch_row)
        self.staging = HostStaging(self.inputs.numel(), device)
        self.graphs: dict = {}
        self.outputs: dict = {}

    def can_run(self, bs: int, all_greedy: bool, logprobs: bool) -> bool:
        return bs <= self.max_bs and all_greedy and not logprobs

    def _run(self, bs: int):
        """The captured work: the whole step over the static rows and slots of bucket bs."""
        self.worker.next_start.index_fill_(0, self.scratch, 0)  # padding rows start at position 0
        if self.k == 0:  # (tokens [bs], probe hits [bs] or None)
            tokens, _, hits = self.worker.plain_body(
                self.rows[:bs],
                self.slots[:bs],
                self.greedy_info[bs],
                self.behind[:bs],
                capturing=True,
                draft=self.draft,
            )
            return tokens, hits
        tokens, num_out, _ = self.worker.spec_body(
            self.rows[:bs],
            self.slots[: bs * self.width],
            self.k,
            self.greedy_info[bs],
            capturing=True,
            opted_out=self.opted_out[:bs] != 0,
        )
        return tokens, num_out

    def capture(self) -> None:
        start, held = time.perf_counter(), reserved_bytes(self.worker.device)
        runners = (self.worker.model_runner, self.worker.draft_runner)
        for runner in runners:
            runner.attn_backend.init_cuda_graph_state(self.max_bs * self.width)
        # Built before capture: a host-to-device copy inside a graph would read a freed buffer.
        self.greedy_info = {
            bs: SamplingBatchInfo.from_params(
                [SamplingParams(temperature=0)] * bs, [0] * bs, self.worker.vocab_size, self.worker.device
            )
            for bs in self.batch_sizes
        }
        for bs in reversed(self.batch_sizes):
            self._capture_one(bs)
        kind = "speculative" if self.k else "plain" if self.draft else "target-only plain"
        logger.info(
            "captured %d whole-step %s graphs (k = %d, bs %s) in %.1f s%s",
            len(self.graphs),
            kind,
            self.k,
            self.batch_sizes,
            time.perf_counter() - start,
            memory_growth(self.worker.device, held),
        )

    def _capture_one(self, bs: int) -> None:
        self.graphs[bs], self.outputs[bs] = capture_graph(
            lambda: self._run(bs), self.worker.model_runner.graph_memory_pool()
        )

    def replay(
        self, rows: list[int], slots, behind: Optional[list[int]] = None, opted_out: Optional[list[bool]] = None
    ):
        """(tokens, num_out) of a speculative step (`opted_out`: per row, whether it takes plain
        decoding's token; None: none does); (tokens, probe hits or None) of a plain one. All
        inputs are host values (`slots`: the step's KV slots, a host int64 tensor or array of
        bs * width); they reach the device in one copy."""
        bs, width = len(rows), self.width
        graph_bs = next(b for b in self.batch_sizes if b >= bs)
        host = self.staging.fill()
        host[:bs] = rows
        host[bs:graph_bs] = self.worker.scratch_row
        at = self.slots_at
        host[at : at + bs * width] = slots
        host[at + bs * width : at + graph_bs * width] = 0
        if self.k == 0:
            host[self.behind_at : self.behind_at + graph_bs] = 0
            if behind is not None:
                host[self.behind_at : self.behind_at + bs] = behind
        else:
            host[self.opted_at : self.opted_at + graph_bs] = 0
            if opted_out is not None:
                host[self.opted_at : self.opted_at + bs] = opted_out
        self.staging.send(self.inputs)
        self.graphs[graph_bs].replay()
        tokens, second = self.outputs[graph_bs]
        return tokens[:bs], (second[:bs] if second is not None else None)
