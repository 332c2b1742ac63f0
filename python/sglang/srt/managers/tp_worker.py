"""TpModelWorker: runs a ScheduleBatch through the ModelRunner and samples its next tokens."""

from __future__ import annotations

import dataclasses
import time
from typing import Optional

import torch

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.constrained.bitmask import apply_token_mask, device_mask
from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.sampling.penalties import PenaltyCounts
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils import step_stream


class HostCopies:
    """Small step results copied to pinned host memory without waiting: `start_copy_to_host`
    after launching the step, `wait_host` (which waits for this step only) when processing it.
    Subclasses name their tensor fields in `_HOST_FIELDS`; the first one is always set."""

    _HOST_FIELDS: tuple[str, ...] = ()
    waited_s = 0.0  # set by wait_host

    def start_copy_to_host(self) -> None:
        self.host, self.copy_done = {}, None
        for name in self._HOST_FIELDS:
            value = getattr(self, name)
            if value is None:
                continue
            if value.is_cuda:
                self.host[name] = torch.empty(value.shape, dtype=value.dtype, pin_memory=True)
                self.host[name].copy_(value, non_blocking=True)
            else:
                self.host[name] = value
        first = getattr(self, self._HOST_FIELDS[0])
        if first.is_cuda:
            self.copy_done = torch.cuda.Event()
            self.copy_done.record(step_stream(first.device))

    def wait_host(self) -> dict:
        """The host copies, once the step has produced them; `waited_s`: how long that took."""
        self.waited_s = 0.0
        if self.copy_done is not None:
            start = time.perf_counter()
            self.copy_done.synchronize()
            self.waited_s = time.perf_counter() - start
        return self.host


@dataclasses.dataclass
class GenerationBatchResult(HostCopies):
    logits_output: LogitsProcessorOutput
    next_token_ids: torch.Tensor  # [bs] int64, on the device
    # With logprobs asked for: [bs] logprob of each chosen token, [bs, N] top logprobs and ids.
    next_token_logprobs: Optional[torch.Tensor] = None
    top_logprobs: Optional[torch.Tensor] = None
    top_logprob_ids: Optional[torch.Tensor] = None
    # Prompt logprobs of a prefill pass that scores some (LogitsProcessorOutput's input_* fields).
    input_token_logprobs: Optional[torch.Tensor] = None
    input_top_logprobs: Optional[torch.Tensor] = None
    input_top_logprob_ids: Optional[torch.Tensor] = None

    _HOST_FIELDS = (
        "next_token_ids",
        "next_token_logprobs",
        "top_logprobs",
        "top_logprob_ids",
        "input_token_logprobs",
        "input_top_logprobs",
        "input_top_logprob_ids",
    )


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, top_n: int) -> tuple:
    """(log p of `tokens` [...], the top_n log p [..., top_n] and their ids, or None, None) from
    logits [..., V]: the raw logits (before temperature and filters), as the model scores tokens."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    chosen = logprobs.gather(-1, tokens[..., None]).squeeze(-1)
    return (chosen, *logprobs.topk(top_n, dim=-1)) if top_n > 0 else (chosen, None, None)


class TpModelWorker:
    # The last batch's requests, their sampling tensors, and whether a penalized one had no
    # penalty row yet (see sampling_info).
    _sampling_cache: tuple[tuple[Req, ...], Optional[SamplingBatchInfo], bool] = ((), None, False)

    def __init__(self, server_args: ServerArgs, model_config: ModelConfig):
        self.device = server_args.device
        self.model_config = model_config
        self.model_runner = ModelRunner(model_config, server_args)
        self.penalty_counts = PenaltyCounts(model_config.vocab_size, self.device)

    def forward_batch_generation(self, batch: ScheduleBatch) -> GenerationBatchResult:
        """Launch the step and return at once; the tokens are on the device and on their way
        to the host (`wait_host`)."""
        forward_batch, offsets = batch.to_forward_batch(self.device)
        result, _ = self.forward_and_sample(batch, forward_batch, offsets)
        result.start_copy_to_host()
        return result

    def forward_and_sample(
        self, batch: ScheduleBatch, forward_batch: ForwardBatch, offsets: torch.Tensor
    ) -> tuple[GenerationBatchResult, SamplingBatchInfo]:
        """The forward, its next tokens sampled (and counted for the penalties) and, where asked
        for, their logprobs; with the batch's sampling info."""
        logits_output = self.model_runner.forward(forward_batch)
        info = self.sampling_info(batch.reqs)
        logits = self.adjust_logits(logits_output.next_token_logits, batch.grammars, info)
        next_token_ids = self.model_runner.sample(logits, info, offsets)
        self.penalty_counts.count(next_token_ids, info.penalties)
        result = GenerationBatchResult(logits_output, next_token_ids)
        if any(req.return_logprob for req in batch.reqs):
            self._add_logprobs(result, max(req.top_logprobs_num for req in batch.reqs))
        return result, info

    def constrain(self, logits: torch.Tensor, grammars: Optional[list]) -> torch.Tensor:
        """The logits with the tokens each row's grammar forbids at -inf (`grammars`: one matcher
        or None per row, at the state after the row's output so far; None: no row is constrained)."""
        if grammars is None:
            return logits
        return apply_token_mask(logits, device_mask(grammars, self.model_config.vocab_size, logits.device))

    def adjust_logits(self, logits: torch.Tensor, grammars: Optional[list], info: SamplingBatchInfo) -> torch.Tensor:
        """The logits the sampler draws from (and the greedy argmax takes): the grammar mask, then
        the penalties, then logit_bias. Each is skipped, launching nothing, for a batch without it;
        the raw logits stay untouched (logprobs come from them)."""
        logits = self.penalty_counts.apply(self.constrain(logits, grammars), info.penalties)
        return info.apply_logit_bias(logits)

    def release_request(self, req: Req) -> None:
        """The request left the running batch (finished, aborted or retracted): its penalty row,
        if it has one, is free (a retracted request gets one again, rebuilt, when it resumes)."""
        if req.penalty_row is not None:
            self.penalty_counts.give_back(req.penalty_row)
            req.penalty_row = None
            self._sampling_cache = ((), None, False)  # it may name the row

    def prefill_pass_fits(self, num_reqs: int, num_tokens: int) -> Optional[bool]:
        """Whether a prefill of this many requests and new tokens runs about as cheaply as the
        prefill graphs allow; None without prefill graphs (ModelRunner.prefill_pass_fits)."""
        return self.model_runner.prefill_pass_fits(num_reqs, num_tokens)

    def sampling_info(self, reqs: list[Req]) -> SamplingBatchInfo:
        """The requests' sampling parameters and seeds as device tensors, one row each. A decode
        batch keeps its requests for many steps, so the last batch's tensors are reused while
        the same requests come in the same order (held by reference: a new request can never
        pass for an old one) and none of them has just been given a penalty row (only a batch
        built while a penalized request was still a prompt chunk can get one); the tensors are
        only read."""
        cached_reqs, cached, unassigned = self._sampling_cache
        same = cached is not None and len(cached_reqs) == len(reqs) and all(a is b for a, b in zip(cached_reqs, reqs))
        if same and not unassigned:
            return cached
        assigned, unassigned = self._assign_penalty_rows(reqs)
        if same and not assigned:
            return cached
        rows = [r.penalty_row for r in reqs]
        info = SamplingBatchInfo.from_params(
            [r.sampling_params for r in reqs],
            [r.seed for r in reqs],
            self.model_config.vocab_size,
            self.device,
            penalty_rows=rows if any(row is not None for row in rows) else None,
        )
        self._sampling_cache = (tuple(reqs), info, unassigned)
        return info

    def _assign_penalty_rows(self, reqs: list[Req]) -> tuple[bool, bool]:
        """Penalty rows for the penalized requests without one whose pass samples a token they
        keep (a prompt chunk's token is dropped, so a chunk is not penalized). Returns whether
        any was assigned, and whether a penalized request is left without one (a chunk)."""
        waiting = [req for req in reqs if req.penalty_row is None and req.sampling_params.penalized]
        new = [req for req in waiting if req.kv_len + req.extend_len >= req.seq_len]
        if new:
            for req, row in zip(new, self.penalty_counts.take([req.output_ids for req in new])):
                req.penalty_row = row
        return bool(new), len(new) < len(waiting)

    @staticmethod
    def _add_logprobs(result: GenerationBatchResult, top_n: int) -> None:
        output = result.logits_output
        logprobs = token_logprobs(output.next_token_logits, result.next_token_ids, top_n)
        result.next_token_logprobs, result.top_logprobs, result.top_logprob_ids = logprobs
        result.input_token_logprobs = output.input_token_logprobs
        result.input_top_logprobs = output.input_top_logprobs
        result.input_top_logprob_ids = output.input_top_logprob_ids
