"""The EAGLE-3 worker's CUDA graphs: each forward's (capture_graphs), and whole decode steps, one
graph per batch-size bucket and k (SpecStepGraphs), so a step of any k replays in one launch."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Optional

import torch

from sglang.srt.model_executor.cuda_graph_runner import (
    CudaGraphRunner,
    capture_graph,
    graph_batch_sizes,
    maybe_prefill_graph_runner,
    memory_growth,
    reserved_bytes,
)
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
from sglang.srt.speculative.spec_policy import policy_class
from sglang.srt.utils import HostStaging

if TYPE_CHECKING:
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

logger = logging.getLogger(__name__)


def capture_graphs(worker: "EAGLEWorkerV2", draft_config, target_config, server_args):
    """Each forward's graphs at every plain decode bucket and reachable k (verify, draft extend,
    chain step, the plain step's two), added to the runners; then, unless disabled, the whole-step
    graphs: returns (SpecStepGraphs by k, the target-only plain step's), ({}, None) without."""
    sizes = graph_batch_sizes(worker.model_runner)
    if sizes is None:
        return {}, None
    target, draft, steps = worker.model_runner, worker.draft_runner, worker.reachable_steps
    aux_width = 3 * target_config.hidden_size
    # Verify and draft extend of k + 1 tokens; k = 0 is this worker's plain step: the target decodes
    # with aux capture, the draft extends by one.
    target_runners = [
        CudaGraphRunner(target, sizes, ForwardMode.TARGET_VERIFY if k else ForwardMode.DECODE, k + 1, capture_aux=True)
        for k in [*steps, 0]
    ]
    draft_runners = [
        CudaGraphRunner(draft, sizes, ForwardMode.DRAFT_EXTEND, k + 1, spec_hidden_width=aux_width) for k in [*steps, 0]
    ]
    if any(k > 1 for k in steps):  # the chain's draft steps
        chain_width = draft_config.hidden_size
        draft_runners.append(CudaGraphRunner(draft, sizes, ForwardMode.DECODE, 1, spec_hidden_width=chain_width))
    for runner in target_runners + draft_runners:
        runner.capture()
    # Prefills (and the draft's pass over them) of up to --prefill-cuda-graph-max-tokens; last,
    # so that the fixed shapes above take the batches they fit.
    target_runners.append(maybe_prefill_graph_runner(target, capture_aux=True))
    draft_runners.append(maybe_prefill_graph_runner(draft, ForwardMode.DRAFT_EXTEND, spec_hidden_width=aux_width))
    target.graph_runners += [runner for runner in target_runners if runner is not None]
    draft.graph_runners += [runner for runner in draft_runners if runner is not None]
    if server_args.disable_speculative_step_graph:
        return {}, None
    plain = [0] if policy_class(server_args.speculative_policy).plain_steps_follow_draft else []
    # Built and captured one k after another; k = 0 is the plain step.
    step_graphs = {k: SpecStepGraphs(worker, sizes, k).capture() for k in plain + steps}
    # The plain step of a batch the draft follows not at all: the target alone.
    return step_graphs, SpecStepGraphs(worker, sizes, 0, draft=False).capture()


class SpecStepGraphs:
    """One CUDA graph per batch-size bucket for a whole greedy step with k drafts (spec_body; k = 0:
    plain_body): one replay instead of ~5 replays and ~50 small launches. Padding rows point at the
    worker's scratch row (its position reset inside the graph) and write their KV to slot 0."""

    def __init__(self, worker: "EAGLEWorkerV2", batch_sizes: list[int], k: int, draft: bool = True):
        self.worker, self.k, self.width = worker, k, k + 1
        self.draft = draft  # False (k = 0 only): the target alone, for batches the draft does not follow
        self.batch_sizes, self.max_bs = sorted(batch_sizes), max(batch_sizes)
        self.scratch = torch.tensor([worker.scratch_row], dtype=torch.int64, device=worker.device)
        # A replay's inputs in one device buffer, filled by one copy from host staging: rows, KV
        # slots, and a value per row: plain steps behind (k = 0, catch-up) or opted out (k > 0).
        n = self.max_bs
        self.inputs = torch.zeros(n * (self.width + 2), dtype=torch.int64, device=worker.device)
        self.slots_at, self.per_row_at = n, n + n * self.width
        self.rows, self.slots, self.per_row = self.inputs.split([n, n * self.width, n])  # views
        self.rows.fill_(worker.scratch_row)
        self.staging = HostStaging(self.inputs.numel(), worker.device)
        self.graphs, self.outputs = {}, {}

    def _run(self, bs: int):
        worker, info = self.worker, self.greedy_info[bs]
        rows, slots, per_row = self.rows[:bs], self.slots[: bs * self.width], self.per_row[:bs]
        worker.next_start.index_fill_(0, self.scratch, 0)  # padding rows start at position 0
        if self.k == 0:  # (tokens [bs], probe hits [bs] or None)
            tokens, _, hits = worker.plain_body(rows, slots, info, per_row, capturing=True, draft=self.draft)
            return tokens, hits
        tokens, num_out, _ = worker.spec_body(rows, slots, self.k, info, capturing=True, opted_out=per_row != 0)
        return tokens, num_out

    def capture(self) -> "SpecStepGraphs":
        start, held = time.perf_counter(), reserved_bytes(self.worker.device)
        for runner in (self.worker.model_runner, self.worker.draft_runner):
            runner.attn_backend.init_cuda_graph_state(self.max_bs * self.width)
        # Built before capture: a host-to-device copy inside a graph would read a freed buffer.
        self.greedy_info = {
            bs: SamplingBatchInfo.greedy(bs, self.worker.vocab_size, self.worker.device) for bs in self.batch_sizes
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
        return self

    def _capture_one(self, bs: int) -> None:
        self.graphs[bs], self.outputs[bs] = capture_graph(
            lambda: self._run(bs), self.worker.model_runner.graph_memory_pool()
        )

    def replay(
        self, rows: list[int], slots, behind: Optional[list[int]] = None, opted_out: Optional[list[bool]] = None
    ):
        """(tokens, num_out) of a speculative step, (tokens, probe hits or None) of a plain one, from
        host inputs (`slots`: bs * width KV slots; `opted_out`: None where no row opts out)."""
        bs, width = len(rows), self.width
        graph_bs = next(b for b in self.batch_sizes if b >= bs)
        host = self.staging.fill()
        host[:bs] = rows
        host[bs:graph_bs] = self.worker.scratch_row
        at = self.slots_at
        host[at : at + bs * width] = slots
        host[at + bs * width : at + graph_bs * width] = 0
        at, per_row = self.per_row_at, behind if self.k == 0 else opted_out
        host[at : at + graph_bs] = 0
        if per_row is not None:
            host[at : at + bs] = per_row
        self.staging.send(self.inputs)
        self.graphs[graph_bs].replay()
        tokens, second = self.outputs[graph_bs]
        return tokens[:bs], (second[:bs] if second is not None else None)
