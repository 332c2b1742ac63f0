"""CudaGraphRunner: captures a forward shape once per batch-size bucket and replays it.

One runner per (forward mode, tokens per request): plain decode is (DECODE, 1); speculative
decoding adds its own shapes (verify with k + 1 tokens per request, the draft's steps) through
the same class. The graphs of all runners share one memory pool. Replay pads the batch to its
bucket: padded rows write their KV to the padding slot 0 and read a one-token sequence.
"""

from __future__ import annotations

import bisect
import gc
import itertools
import logging
import time
from typing import Callable, Optional

import numpy as np
import torch

from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.utils import HostStaging

logger = logging.getLogger(__name__)


def capture_graph(run: Callable, pool) -> tuple[torch.cuda.CUDAGraph, object]:
    """Run `run` twice outside a graph (lazy initialisation, kernel compiles), then capture it
    into a new graph in `pool`; returns (graph, what the captured call returned).

    The garbage collector is held off during the capture: a collection in the middle of it can
    free an unreachable object holding CUDA state (another engine's graphs or events, which
    tests and benchmarks leave behind), and the runtime call that releases it invalidates the
    capture (seen as CUBLAS_STATUS_INTERNAL_ERROR from the next GEMM). No collection is forced
    before: it is not needed for that, and a speculative server would pay it ~280 times at
    start-up."""
    for _ in range(2):
        run()
    torch.cuda.synchronize()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            out = run()
    finally:
        if was_enabled:
            gc.enable()
    return graph, out


def reserved_bytes(device) -> int:
    """What PyTorch's CUDA caching allocator holds on `device` (0 off CUDA)."""
    return torch.cuda.memory_reserved(device) if torch.device(device).type == "cuda" else 0


def memory_growth(device, before: int) -> str:
    """For a capture's log line: how much the allocator's holding grew since `before`
    (reserved_bytes), '' off CUDA. A family's graphs keep their pool's peak, and their outputs,
    out of the KV cache's reach for the server's life."""
    if torch.device(device).type != "cuda":
        return ""
    return f"; GPU memory held {(reserved_bytes(device) - before) / (1 << 30):+.2f} GiB"


def default_batch_sizes(max_bs: int) -> list[int]:
    """1, 2, 4, 8, then every 8 up to 64, then every 16 up to max_bs."""
    sizes = [bs for bs in (1, 2, 4, 8) if bs <= max_bs]
    sizes += list(range(16, min(max_bs, 64) + 1, 8)) + list(range(80, max_bs + 1, 16))
    if sizes[-1] != max_bs:
        sizes.append(max_bs)
    return sizes


class CudaGraphRunner:
    """`spec_hidden_width` > 0 gives the graph a hidden-state input of that width (an EAGLE-3
    draft's `spec_hidden_states`); `capture_aux` makes the target write its aux hidden states
    into the graph's output (TARGET_VERIFY); extend-shaped modes return every token's logits."""

    def __init__(
        self,
        model_runner,
        batch_sizes: list[int],
        forward_mode: ForwardMode = ForwardMode.DECODE,
        tokens_per_req: int = 1,
        spec_hidden_width: int = 0,
        capture_aux: bool = False,
    ):
        self.model_runner = model_runner
        self.batch_sizes = sorted(batch_sizes)
        self.max_bs = self.batch_sizes[-1]
        self.forward_mode = forward_mode
        self.tokens_per_req = tokens_per_req
        self.spec_hidden_width = spec_hidden_width
        self.capture_aux = capture_aux
        self.device = model_runner.device
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, LogitsProcessorOutput] = {}
        self._alloc_buffers()

    def _alloc_buffers(self) -> None:
        # The integer inputs are views of one buffer (input ids, positions, KV slots, then table
        # rows and sequence lengths), so that a batch with host rows fills them in one copy.
        mt, bs = self.max_bs * self.tokens_per_req, self.max_bs
        self.inputs = torch.zeros(3 * mt + 2 * bs, dtype=torch.int64, device=self.device)
        self.tokens = self.inputs[: 3 * mt].view(3, mt)
        self.input_ids, self.positions, self.out_cache_loc = self.tokens
        self.req_pool_indices = self.inputs[3 * mt : 3 * mt + bs]
        self.seq_lens = self.inputs[3 * mt + bs :]
        self.seq_lens.fill_(self.tokens_per_req)
        self.staging = None  # made at the first replay of a batch with host rows
        self.spec_hidden = None
        self.logits_out = self.aux_hidden_out = None  # made by capture(), at the largest batch size's shapes
        if self.spec_hidden_width:
            self.spec_hidden = torch.zeros(
                mt, self.spec_hidden_width, device=self.device, dtype=self.model_runner.model_config.dtype
            )

    def can_run(self, fb: ForwardBatch) -> bool:
        hidden = fb.spec_hidden_states
        return (
            fb.forward_mode == self.forward_mode
            and fb.batch_size <= self.max_bs
            and fb.input_logprob_rows is None
            and fb.num_tokens == fb.batch_size * self.tokens_per_req
            and fb.capture_aux_hidden_states == self.capture_aux
            and (hidden.shape[-1] if hidden is not None else 0) == self.spec_hidden_width
        )

    def capture(self) -> None:
        start, held = time.perf_counter(), reserved_bytes(self.device)
        self.model_runner.attn_backend.init_cuda_graph_state(self.max_bs)
        self._alloc_outputs()
        # Largest first: later, smaller graphs reuse the pool memory the first one reserved.
        for bs in reversed(self.batch_sizes):
            self._capture_one(bs)
        logger.info(
            "captured %d CUDA graphs (%s, bs %s) in %.1f s%s",
            len(self.graphs),
            self.forward_mode.name,
            self.batch_sizes,
            time.perf_counter() - start,
            memory_growth(self.device, held),
        )

    def _alloc_outputs(self) -> None:
        """The logits and aux hidden states every graph of this runner writes into, shaped by one
        eager forward at the largest batch size. Outputs made inside each capture would stay
        allocated once per batch size: float32 logits for every token of every bucket, for a
        verify at k = 3 over a 128K vocabulary 4 x 2,311 rows (the 23 buckets up to 256), 4.7 GB,
        against 0.5 GB shared."""
        self.logits_out, self.aux_hidden_out = output_buffers(
            self.model_runner.forward_eager(self._static_batch(self.max_bs))
        )

    def _static_batch(self, bs: int) -> ForwardBatch:
        n = bs * self.tokens_per_req
        return ForwardBatch(
            forward_mode=self.forward_mode,
            batch_size=bs,
            input_ids=self.input_ids[:n],
            positions=self.positions[:n],
            req_pool_indices=self.req_pool_indices[:bs],
            seq_lens=self.seq_lens[:bs],
            out_cache_loc=self.out_cache_loc[:n],
            # Sequence lengths vary from replay to replay: only the device tensor holds them.
            seq_lens_cpu=None,
            extend_seq_lens_cpu=[self.tokens_per_req] * bs,
            extend_prefix_lens_cpu=None,
            return_all_logits=self.forward_mode.is_extend(),
            capture_aux_hidden_states=self.capture_aux,
            spec_hidden_states=self.spec_hidden[:n] if self.spec_hidden is not None else None,
            logits_out=self.logits_out,
            aux_hidden_out=self.aux_hidden_out,
        )

    def _capture_one(self, bs: int) -> None:
        self.graphs[bs], self.outputs[bs] = capture_graph(
            lambda: self.model_runner.forward_eager(self._static_batch(bs)), self.model_runner.graph_memory_pool()
        )

    def replay(self, fb: ForwardBatch) -> LogitsProcessorOutput:
        bs = fb.batch_size
        graph_bs = self.batch_sizes[bisect.bisect_left(self.batch_sizes, bs)]
        n, graph_n = fb.num_tokens, graph_bs * self.tokens_per_req
        if fb.positions_host is not None and fb.req_pool_indices_host is not None and fb.seq_lens_cpu is not None:
            self._stage_inputs(fb, bs, graph_bs, n, graph_n)
        else:  # inputs only on the device (a speculative worker's shapes): copy each
            if graph_bs != bs:  # padded rows: a one-step sequence writing to the padding slot
                self.out_cache_loc[n:graph_n].zero_()
                self.seq_lens[bs:graph_bs].fill_(self.tokens_per_req)
                self.positions[n:graph_n].zero_()
            self.input_ids[:n].copy_(fb.input_ids, non_blocking=True)
            self.positions[:n].copy_(fb.positions, non_blocking=True)
            self.out_cache_loc[:n].copy_(fb.out_cache_loc, non_blocking=True)
            self.req_pool_indices[:bs].copy_(fb.req_pool_indices, non_blocking=True)
            self.seq_lens[:bs].copy_(fb.seq_lens, non_blocking=True)
        if self.spec_hidden is not None:
            self.spec_hidden[:n].copy_(fb.spec_hidden_states, non_blocking=True)
        self.graphs[graph_bs].replay()
        out = self.outputs[graph_bs]
        if self.forward_mode.is_extend() and not fb.return_all_logits:  # the graph scored every token
            logits = out.next_token_logits[
                torch.arange(bs, device=self.device) * self.tokens_per_req + self.tokens_per_req - 1
            ]
        else:
            logits = out.next_token_logits[:n]
        aux = out.aux_hidden_states[:n] if out.aux_hidden_states is not None else None
        hidden = out.hidden_states[:n] if out.hidden_states is not None else None
        return LogitsProcessorOutput(next_token_logits=logits, aux_hidden_states=aux, hidden_states=hidden)

    def _stage_inputs(self, fb: ForwardBatch, bs: int, graph_bs: int, n: int, graph_n: int) -> None:
        """The inputs of a batch with host rows (plain decode's) in one copy: ~15 torch calls
        fewer per step than a copy per input and per padding. Rows only on the device (the
        token ids an overlapped step left there) are copied after it."""
        mt, max_bs = self.max_bs * self.tokens_per_req, self.max_bs
        if self.staging is None:
            self.staging = HostStaging(self.inputs.numel(), self.device)
        host = self.staging.fill()
        late = _stage_token_rows(host, fb, self.tokens, mt, n, graph_n)  # padded rows: token 0, position 0, slot 0
        at = 3 * mt
        host[at : at + bs] = fb.req_pool_indices_host
        host[at + bs : at + graph_bs] = 0
        at += max_bs
        host[at : at + bs] = fb.seq_lens_cpu
        host[at + bs : at + graph_bs] = self.tokens_per_req  # a one-step sequence
        self.staging.send(self.inputs)
        for target, tensor in late:
            target.copy_(tensor, non_blocking=True)


def output_buffers(probe: LogitsProcessorOutput) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Buffers shaped like a forward's logits and aux hidden states, for a runner's graphs to share."""
    aux = probe.aux_hidden_states
    return torch.empty_like(probe.next_token_logits), None if aux is None else torch.empty_like(aux)


def _stage_token_rows(host, fb: ForwardBatch, tokens: torch.Tensor, width: int, n: int, graph_n: int) -> list:
    """Writes the batch's token ids, positions and KV slots (rows 0-2 of `tokens`, a graph's
    [3, width] static buffer, at the same offsets in `host`, its staging buffer) for its n tokens
    from their host copies, zeros for the padding up to graph_n. Returns (target, device tensor)
    for each row the batch has only on the device: to copy once the staged copy is sent."""
    late = []
    for row, (values, tensor) in enumerate(
        (
            (fb.input_ids_host, fb.input_ids),
            (fb.positions_host, fb.positions),
            (fb.out_cache_loc_host, fb.out_cache_loc),
        )
    ):
        at = row * width
        if values is not None:
            host[at : at + n] = values
        else:
            late.append((tokens[row, :n], tensor))
        host[at + n : at + graph_n] = 0
    return late


# A prefill graph holds up to this many requests; larger prefill batches run eagerly.
PREFILL_GRAPH_REQUEST_BUCKETS = (1, 2, 4, 8, 16)


def prefill_token_buckets(max_tokens: int) -> list[int]:
    """16, 24, 32, 48, 64, 96, 128, ... (powers of two and the points halfway between), ending
    at max_tokens: a prefill pads at most half its tokens."""
    sizes, n = [], 16
    while n < max_tokens:
        sizes.append(n)
        n = n * 3 // 2 if n & (n - 1) == 0 else n * 4 // 3
    return sizes + [max_tokens] if max_tokens >= 1 else []


class PrefillGraphRunner:
    """CUDA graphs of prefill-shaped forwards (EXTEND, or the EAGLE-3 draft's DRAFT_EXTEND over
    a prefill's positions) with any mix of requests and lengths, one graph per (requests bucket,
    tokens bucket). An eager prefill of a small model costs the host far more than the device
    (one Python launch per kernel, ~150 for the demo pair), and stops the decode pipeline while
    it runs; a replay costs a few copies.

    The layout is an input: each request's new-token count, first token, KV length and last
    token's index are copied to the device per replay. The batch's tokens stay packed; the
    padding tokens after them join the last request (positions after all of its real tokens, so
    under causal attention no real token sees them), write their KV to the padding slot 0 and
    read whatever the request's table row holds past its end; padding requests have no tokens.
    Logits are computed at each request's last real token only.

    `keep_if_faster`: on CUDA, after capture each graph's replay (device time included) is timed
    against the host time of merely launching the same forward eagerly; a graph that loses (a
    model bound by the device, where launches hide behind the work and padding only adds work)
    is dropped, and so is every larger one of its requests bucket."""

    def __init__(
        self,
        model_runner,
        forward_mode: ForwardMode,
        max_tokens: int,
        spec_hidden_width: int = 0,
        capture_aux: bool = False,
        keep_if_faster: bool = True,
    ):
        self.model_runner = model_runner
        self.forward_mode = forward_mode
        self.spec_hidden_width = spec_hidden_width
        self.capture_aux = capture_aux
        self.keep_if_faster = keep_if_faster
        self.device = model_runner.device
        self.row_width = model_runner.req_to_token_pool.req_to_token.shape[1]
        self.token_buckets = prefill_token_buckets(min(max_tokens, self.row_width))
        self.request_buckets = [
            bs
            for bs in PREFILL_GRAPH_REQUEST_BUCKETS
            if bs <= min(model_runner.memory.max_running_requests, self.token_buckets[-1])
        ]
        self.max_tokens, self.max_reqs = self.token_buckets[-1], self.request_buckets[-1]
        # Per requests bucket, the token buckets with a graph (ascending).
        self.kept: dict[int, list[int]] = {}
        # Per requests bucket, the tokens bucket from which an eager launch beat the graph (dropped).
        self.eager_from: dict[int, int] = {}
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.outputs: dict[tuple[int, int], LogitsProcessorOutput] = {}
        self.logits_out = self.aux_hidden_out = None  # made by capture(), at the largest graph's shapes
        self.timings: dict[tuple[int, int], tuple[float, float]] = {}  # (replay s, eager launch s)
        # Every integer input is a view of one buffer, which one copy from a host staging buffer
        # fills per replay: input ids, positions and KV slots ([3, max_tokens]), the requests'
        # table rows, and per requests bucket its layout (new tokens, first token, KV length,
        # last token index per request).
        mt = self.max_tokens
        self._layout_at = dict(
            zip(
                self.request_buckets,
                itertools.accumulate((4 * bs for bs in self.request_buckets), initial=3 * mt + self.max_reqs),
            )
        )
        numel = 3 * mt + self.max_reqs + 4 * sum(self.request_buckets)
        self.inputs = torch.zeros(numel, dtype=torch.int64, device=self.device)
        self.tokens = self.inputs[: 3 * mt].view(3, mt)
        self.input_ids, self.positions, self.out_cache_loc = self.tokens
        self.req_pool_indices = self.inputs[3 * mt : 3 * mt + self.max_reqs]
        self.layouts = {bs: self.inputs[at : at + 4 * bs].view(4, bs) for bs, at in self._layout_at.items()}
        self.staging = HostStaging(numel, self.device)
        self.spec_hidden = None
        if spec_hidden_width:
            self.spec_hidden = torch.zeros(
                self.max_tokens, spec_hidden_width, device=self.device, dtype=model_runner.model_config.dtype
            )

    def _key(self, fb: ForwardBatch) -> Optional[tuple[int, int]]:
        return self._bucket(fb.batch_size, fb.num_tokens)

    def _bucket(self, num_reqs: int, num_tokens: int) -> Optional[tuple[int, int]]:
        """The kept graph (requests bucket, tokens bucket) a prefill of this size replays, if any."""
        i = bisect.bisect_left(self.request_buckets, num_reqs)
        if i == len(self.request_buckets):
            return None
        bs = self.request_buckets[i]
        kept = self.kept.get(bs, [])
        j = bisect.bisect_left(kept, num_tokens)
        return (bs, kept[j]) if j < len(kept) else None

    def pass_fits(self, num_reqs: int, num_tokens: int) -> bool:
        """Whether a prefill of this many requests and new tokens runs about as cheaply as the graphs
        allow: a kept graph takes it (the padding's room in the last table row aside: see can_run),
        or it is past where an eager launch beat the graphs of its requests bucket (the largest
        bucket's, past every bucket). Past the graphs with no such measurement (the capture limit,
        or graphs not timed), an eager prefill of a small model costs many graph replays."""
        if self._bucket(num_reqs, num_tokens) is not None:
            return True
        bs = self.request_buckets[
            min(bisect.bisect_left(self.request_buckets, num_reqs), len(self.request_buckets) - 1)
        ]
        return bs in self.eager_from

    def can_run(self, fb: ForwardBatch) -> bool:
        hidden = fb.spec_hidden_states
        # A pass that scores prompt tokens (input_logprob_rows) needs hidden rows a graph does not keep.
        if (
            fb.forward_mode != self.forward_mode
            or fb.return_all_logits
            or fb.seq_lens_cpu is None
            or fb.input_logprob_rows is not None
            or fb.capture_aux_hidden_states
            and not self.capture_aux
            or (hidden.shape[-1] if hidden is not None else 0) != self.spec_hidden_width
        ):
            return False
        key = self._key(fb)
        # The padding extends the last request: its table row must have room for it.
        return key is not None and fb.seq_lens_cpu[-1] + key[1] - fb.num_tokens <= self.row_width

    def capture(self) -> None:
        start, held = time.perf_counter(), reserved_bytes(self.device)
        # One set of outputs for every graph, as CudaGraphRunner's (here up to 2K tokens of aux
        # hidden states per graph, ~50 graphs).
        self._valid_layout(self.max_reqs, self.max_tokens)
        self.logits_out, self.aux_hidden_out = output_buffers(
            self.model_runner.forward_eager(self._static_batch(self.max_reqs, self.max_tokens))
        )
        for bs in reversed(self.request_buckets):  # largest first, as CudaGraphRunner
            for n in reversed(self.token_buckets):
                if n >= bs:
                    self._capture_one(bs, n)
        for bs in self.request_buckets:
            self.kept[bs] = [n for n in self.token_buckets if (bs, n) in self.graphs]
        captured = len(self.graphs)
        if self.keep_if_faster and torch.device(self.device).type == "cuda":
            self._drop_slower_than_eager()
        logger.info(
            "captured %d prefill CUDA graphs (%s, up to %d requests and %d tokens) in %.1f s; kept %d: %s%s",
            captured,
            self.forward_mode.name,
            self.max_reqs,
            self.max_tokens,
            time.perf_counter() - start,
            len(self.graphs),
            {bs: kept[-1] if kept else 0 for bs, kept in self.kept.items()},
            memory_growth(self.device, held),
        )

    def _static_batch(self, bs: int, n: int) -> ForwardBatch:
        lens, starts, seq_lens, last = self.layouts[bs]
        return ForwardBatch(
            forward_mode=self.forward_mode,
            batch_size=bs,
            input_ids=self.input_ids[:n],
            positions=self.positions[:n],
            req_pool_indices=self.req_pool_indices[:bs],
            seq_lens=seq_lens,
            out_cache_loc=self.out_cache_loc[:n],
            seq_lens_cpu=None,
            extend_seq_lens_cpu=[n] + [0] * (bs - 1),  # only bounds the longest request (the grid)
            extend_prefix_lens_cpu=None,
            capture_aux_hidden_states=self.capture_aux,
            spec_hidden_states=self.spec_hidden[:n] if self.spec_hidden is not None else None,
            extend_seq_lens=lens,
            extend_start_loc=starts,
            last_token_index=last,
            logits_out=self.logits_out,
            aux_hidden_out=self.aux_hidden_out,
        )

    def _valid_layout(self, bs: int, n: int) -> None:
        """One request of n tokens: a layout the forward can run (a capture runs it)."""
        self.layouts[bs].zero_()
        self.layouts[bs][0, 0] = self.layouts[bs][2, 0] = n
        self.layouts[bs][3, 0] = n - 1

    def _capture_one(self, bs: int, n: int) -> None:
        self._valid_layout(bs, n)
        self.graphs[bs, n], self.outputs[bs, n] = capture_graph(
            lambda: self.model_runner.forward_eager(self._static_batch(bs, n)), self.model_runner.graph_memory_pool()
        )

    def _drop_slower_than_eager(self, repeats: int = 3) -> None:
        for bs, kept in self.kept.items():
            for i, n in enumerate(kept):
                graph = self.graphs[bs, n]
                graph.replay()
                torch.cuda.synchronize()
                start = time.perf_counter()
                for _ in range(repeats):
                    graph.replay()
                torch.cuda.synchronize()
                replay_s = (time.perf_counter() - start) / repeats
                launch_s = 0.0
                for _ in range(repeats):
                    start = time.perf_counter()
                    self.model_runner.forward_eager(self._static_batch(bs, n))
                    launch_s += (time.perf_counter() - start) / repeats
                    torch.cuda.synchronize()
                self.timings[bs, n] = (replay_s, launch_s)
                if replay_s > launch_s:
                    for m in kept[i:]:
                        del self.graphs[bs, m], self.outputs[bs, m]
                    self.kept[bs] = kept[:i]
                    self.eager_from[bs] = n
                    break

    def replay(self, fb: ForwardBatch) -> LogitsProcessorOutput:
        bs, n = fb.batch_size, fb.num_tokens
        graph_bs, graph_n = self._key(fb)
        mt = self.max_tokens
        host = self.staging.fill()
        # Padding tokens are zeros: token 0 at position 0, KV to the padding slot.
        late = _stage_token_rows(host, fb, self.tokens, mt, n, graph_n)
        at = 3 * mt
        if fb.req_pool_indices_host is not None:
            host[at : at + bs] = fb.req_pool_indices_host
        else:
            late.append((self.req_pool_indices[:bs], fb.req_pool_indices))
        host[at + bs : at + graph_bs] = 0
        # The layout; the padding tokens join the last request, padding requests have none.
        layout = host[self._layout_at[graph_bs] : self._layout_at[graph_bs] + 4 * graph_bs].reshape(4, graph_bs)
        lens = layout[0]
        lens[:bs] = fb.extend_seq_lens_cpu
        lens[bs:] = 0
        np.cumsum(lens[:bs], out=layout[3, :bs])  # each request's end, then its last token
        layout[1, :bs] = layout[3, :bs] - lens[:bs]
        layout[1, bs:] = graph_n
        layout[3, :bs] -= 1
        layout[3, bs:] = 0
        layout[2, :bs] = fb.seq_lens_cpu
        layout[2, bs:] = 0
        lens[bs - 1] += graph_n - n
        layout[2, bs - 1] += graph_n - n
        self.staging.send(self.inputs)
        for target, tensor in late:
            target.copy_(tensor, non_blocking=True)
        if self.spec_hidden is not None:
            self.spec_hidden[:n].copy_(fb.spec_hidden_states, non_blocking=True)
        self.graphs[graph_bs, graph_n].replay()
        out = self.outputs[graph_bs, graph_n]
        aux = out.aux_hidden_states[:n] if out.aux_hidden_states is not None and fb.capture_aux_hidden_states else None
        hidden = out.hidden_states[:n] if out.hidden_states is not None else None
        return LogitsProcessorOutput(
            next_token_logits=out.next_token_logits[:bs], aux_hidden_states=aux, hidden_states=hidden
        )


def graph_batch_sizes(model_runner) -> Optional[list[int]]:
    """The batch-size buckets to capture, or None when graphs are off or cannot be used here."""
    args = model_runner.server_args
    if model_runner.device != "cuda" or args.disable_cuda_graph:
        return None
    if args.attention_backend != "triton":
        logger.info("CUDA graphs need the triton attention backend; running %s eagerly", args.attention_backend)
        return None
    if model_runner.tp_size > 1:
        # The other ranks mirror each forward with inputs sent from rank 0 (tp_mirror), which a
        # replay would not send.
        if model_runner.tp_rank == 0:
            logger.info(
                "--tp-size %d: CUDA graphs are not captured under tensor parallelism; every step runs eagerly",
                model_runner.tp_size,
            )
        return None
    sizes = sorted(set(args.cuda_graph_bs)) if args.cuda_graph_bs else default_batch_sizes(args.cuda_graph_max_bs)
    return [bs for bs in sizes if bs <= model_runner.memory.max_running_requests] or [1]


def maybe_graph_runner(model_runner) -> Optional[CudaGraphRunner]:
    """The decode graph runner, or None when graphs are off or cannot be used here."""
    sizes = graph_batch_sizes(model_runner)
    if sizes is None:
        return None
    runner = CudaGraphRunner(model_runner, sizes)
    runner.capture()
    return runner


def maybe_prefill_graph_runner(
    model_runner, forward_mode: ForwardMode = ForwardMode.EXTEND, spec_hidden_width: int = 0, capture_aux: bool = False
) -> Optional[PrefillGraphRunner]:
    """Prefill graphs up to --prefill-cuda-graph-max-tokens (and the chunk size), captured; None
    when graphs are off or cannot be used here."""
    args = model_runner.server_args
    max_tokens = args.prefill_pass_tokens if args.prefill_cuda_graph_max_tokens else 0
    if max_tokens == 0 or graph_batch_sizes(model_runner) is None:
        return None
    runner = PrefillGraphRunner(model_runner, forward_mode, max_tokens, spec_hidden_width, capture_aux)
    runner.capture()
    return runner
