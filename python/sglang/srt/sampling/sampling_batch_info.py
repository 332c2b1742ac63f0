"""The sampling parameters of one batch, as tensors on the sampling device, plus host-side
flags that let the sampler skip work nobody in the batch asked for."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from sglang.srt.sampling.penalties import PenaltyRows
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.utils import host_to_device_rows


@dataclass
class SamplingBatchInfo:
    """Built by the scheduler with `from_params` once per batch; read by the Sampler.

    Greedy rows carry neutral values (temperature 1, no top-k/top-p/min-p) so that they
    never force the sort; the sampler replaces their result with the argmax.
    """

    # On the device, one row per request.
    temperatures: torch.Tensor  # float32[bs, 1]; 1.0 for greedy rows
    top_ps: torch.Tensor  # float32[bs]; 1.0 means off
    top_ks: torch.Tensor  # int64[bs]; vocab_size means off (top_k=-1 becomes vocab_size)
    min_ps: torch.Tensor  # float32[bs]; 0.0 means off
    seeds: torch.Tensor  # int64[bs]; per-request seed for the counter-based random numbers
    greedy_mask: torch.Tensor  # bool[bs]; True where the request takes the argmax

    # On the host, so that branching on them needs no device sync.
    is_all_greedy: bool
    need_top_p_sampling: bool
    need_top_k_sampling: bool
    need_min_p_sampling: bool

    # logit_bias of the batch's rows as one sparse list (row, token id, bias), on the device; None
    # when no request has one (the sampler's callers then add nothing, not even a launch).
    logit_bias_rows: Optional[torch.Tensor] = None  # int64[n]
    logit_bias_ids: Optional[torch.Tensor] = None  # int64[n]
    logit_bias_values: Optional[torch.Tensor] = None  # float32[n]
    # The rows penalized in this pass and their penalties (sampling/penalties.py), on the device;
    # None when no request is (nothing is built or launched for penalties).
    penalties: Optional[PenaltyRows] = None

    @classmethod
    def greedy(cls, batch_size: int, vocab_size: int, device: torch.device | str) -> SamplingBatchInfo:
        """Every row greedy, unbiased and unpenalized (a CUDA graph's or a timing's sampling)."""
        return cls.from_params([SamplingParams(temperature=0)] * batch_size, [0] * batch_size, vocab_size, device)

    @classmethod
    def from_params(
        cls,
        params: list[SamplingParams],
        seeds: list[int],
        vocab_size: int,
        device: torch.device | str,
        penalty_rows: Optional[list[Optional[int]]] = None,
    ) -> SamplingBatchInfo:
        """`penalty_rows`: each request's row of the worker's PenaltyCounts, None where it is not
        penalized in this pass; None when no request is."""
        greedy = [p.is_greedy for p in params]
        biased = any(p.logit_bias for p in params)
        penalized = penalty_rows is not None and any(row is not None for row in penalty_rows)
        if all(greedy) and not biased and not penalized:
            # Every row takes the argmax, whatever its seed: one set of neutral tensors per batch
            # size serves every such batch (building them costs ~15 host calls a batch, which a
            # prefill pass of a small model pays on the critical path).
            key = (len(params), vocab_size, str(device))
            cached = _ALL_GREEDY.get(key)
            if cached is None:
                cached = _ALL_GREEDY[key] = cls._build(params, [0] * len(params), vocab_size, device, greedy)
            return cached
        info = cls._build(params, seeds, vocab_size, device, greedy)
        if biased:
            info._add_logit_bias(params, device)
        if penalized:
            info.penalties = PenaltyRows.build(params, penalty_rows, device)
        return info

    def _add_logit_bias(self, params: list[SamplingParams], device) -> None:
        rows, ids, values = [], [], []
        for row, p in enumerate(params):
            for token_id, bias in p.token_biases().items():
                rows.append(row)
                ids.append(token_id)
                values.append(bias)
        self.logit_bias_rows, self.logit_bias_ids = host_to_device_rows([rows, ids], device, torch.int64)
        (self.logit_bias_values,) = host_to_device_rows([values], device, torch.float32)

    def apply_logit_bias(self, logits: torch.Tensor) -> torch.Tensor:
        """`logits` ([bs, vocab], or [bs, positions, vocab] for a verify) with each row's
        logit_bias added at every position: a new tensor (the raw logits still give logprobs),
        or `logits` itself when no row has a bias."""
        if self.logit_bias_rows is None:
            return logits
        biased = logits.clone()
        values = self.logit_bias_values.view(-1, *[1] * (logits.dim() - 2)).to(logits.dtype)
        biased[self.logit_bias_rows, ..., self.logit_bias_ids] += values
        return biased

    @classmethod
    def _build(cls, params: list[SamplingParams], seeds: list[int], vocab_size: int, device, greedy: list[bool]):
        # Greedy rows get neutral values: they are argmaxed, and must not trigger the sort.
        temperatures = [1.0 if g else p.temperature for p, g in zip(params, greedy)]
        top_ps = [1.0 if g else p.top_p for p, g in zip(params, greedy)]
        top_ks = [vocab_size if g else _clamp_top_k(p.top_k, vocab_size) for p, g in zip(params, greedy)]
        min_ps = [0.0 if g else p.min_p for p, g in zip(params, greedy)]
        # Two copies to the device (floats, integers) instead of one per field.
        temperatures_d, top_ps_d, min_ps_d = host_to_device_rows([temperatures, top_ps, min_ps], device, torch.float32)
        top_ks_d, seeds_d, greedy_d = host_to_device_rows([top_ks, seeds, greedy], device, torch.int64)
        return cls(
            temperatures=temperatures_d.view(-1, 1),
            top_ps=top_ps_d,
            top_ks=top_ks_d,
            min_ps=min_ps_d,
            seeds=seeds_d,
            greedy_mask=greedy_d != 0,
            is_all_greedy=all(greedy),
            need_top_p_sampling=any(p < 1.0 for p in top_ps),
            need_top_k_sampling=any(k < vocab_size for k in top_ks),
            need_min_p_sampling=any(p > 0.0 for p in min_ps),
        )

    def __len__(self) -> int:
        return self.seeds.shape[0]


# All-greedy batches' infos by (batch size, vocab size, device); only ever read.
_ALL_GREEDY: dict[tuple, SamplingBatchInfo] = {}


def _clamp_top_k(top_k: int, vocab_size: int) -> int:
    return vocab_size if top_k == -1 else min(top_k, vocab_size)
