"""Turns logits into next tokens: temperature, top-k / top-p / min-p filtering, then Gumbel-max
with counter-based noise, so a request's n-th token depends only on its seed and n."""

from __future__ import annotations

import torch

from sglang.srt.sampling.random import uniform
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo


class Sampler:
    def precompile(self, vocab_size: int, max_batch_size: int, device) -> None:
        """On CUDA, compile the fused sampling kernel for every form a batch of 1 to
        max_batch_size can take (its chunking follows the batch size), so that the first sampled
        batch of a new size does not compile it while every running request waits."""
        if torch.device(device).type != "cuda":
            return
        from sgl_kernel.sampling import compile_classes, gumbel_max_sample

        for bs in compile_classes(vocab_size, max_batch_size):
            gumbel_max_sample(
                torch.zeros(bs, vocab_size, dtype=torch.float32, device=device),
                torch.ones(bs, dtype=torch.float32, device=device),
                torch.zeros(bs, dtype=torch.int64, device=device),
                torch.zeros(bs, dtype=torch.int64, device=device),
                torch.zeros(bs, dtype=torch.bool, device=device),
            )
        torch.cuda.synchronize(device)

    def __call__(self, logits: torch.Tensor, info: SamplingBatchInfo, offsets: torch.Tensor) -> torch.Tensor:
        """int64[bs] next tokens for float[bs, vocab] logits.

        offsets[i] is the number of tokens request i has generated so far; together with
        its seed it fixes the random noise, whatever else is in the batch.
        """
        if info.is_all_greedy:
            return torch.argmax(logits, dim=-1)
        needs_filters = info.need_top_k_sampling or info.need_top_p_sampling or info.need_min_p_sampling
        if logits.is_cuda and not needs_filters:
            # One fused pass over the logits with the same noise: the same tokens, ~50x faster.
            from sgl_kernel.sampling import gumbel_max_sample

            return gumbel_max_sample(logits, info.temperatures, info.seeds, offsets, info.greedy_mask)
        logits = logits.float()
        greedy_tokens = torch.argmax(logits, dim=-1)
        logits = apply_top_k_top_p_min_p(logits / info.temperatures, info)
        noise = gumbel_noise(info.seeds, offsets, logits.shape[-1])
        sampled_tokens = torch.argmax(logits + noise, dim=-1)
        return torch.where(info.greedy_mask, greedy_tokens, sampled_tokens)


def gumbel_noise(seeds: torch.Tensor, offsets: torch.Tensor, width: int, stream: int = 0) -> torch.Tensor:
    """float32[bs, width] standard Gumbel noise: argmax(logits + noise) draws from
    softmax(logits) without normalising or a cumulative sum."""
    return -torch.log(-torch.log(uniform(seeds, offsets, width, stream)))


def apply_top_k_top_p_min_p(logits: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
    """Sets the logits of filtered-out tokens to -inf; expects temperature already applied.

    Filters compose in the usual order: top-k, then top-p over the renormalised top-k
    distribution, then min-p (relative to the top token, which every filter keeps).
    The top token always survives. Rows whose filters are off, greedy rows included (the
    batch info neutralises them), come back unchanged.
    """
    if info.need_top_k_sampling or info.need_top_p_sampling:
        logits = _apply_top_k_top_p(logits, info)
    if info.need_min_p_sampling:
        logits = _apply_min_p(logits, info.min_ps)
    return logits


# On the CPU, a batch whose largest top_k is at most this selects its top_k tokens instead of
# sorting the vocabulary: the same kept set, several times faster (measured: 48 rows of 6,144
# tokens with top_k 6 in about 2 ms instead of 26 ms).
MAX_SELECTED_TOP_K = 256


def _apply_top_k_top_p(logits: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
    if not logits.is_cuda:  # the width is read on the host: free on the CPU, a sync on the GPU
        top = _stable_top(logits, info)
        if top is not None:
            sorted_logits, sorted_ids, filtered_rows = top
            drop_sorted = _drop_by_rank(sorted_logits, info, logits.shape[-1])
            kept = torch.full_like(logits, -torch.inf).scatter_(
                -1, sorted_ids, sorted_logits.masked_fill(drop_sorted, -torch.inf)
            )
            return kept if filtered_rows is None else torch.where(filtered_rows[:, None], kept, logits)
    # A stable sort breaks ties by token id, so the kept set never depends on the backend.
    sorted_logits, sorted_ids = torch.sort(logits, dim=-1, descending=True, stable=True)
    drop_sorted = _drop_by_rank(sorted_logits, info, logits.shape[-1])
    drop = torch.empty_like(drop_sorted).scatter_(-1, sorted_ids, drop_sorted)
    return logits.masked_fill(drop, -torch.inf)


def _stable_top(logits: torch.Tensor, info: SamplingBatchInfo):
    """(values, ids, filtered rows or None for all) of the first `width` places of the stable
    descending sort, where every row either keeps at most `width` <= MAX_SELECTED_TOP_K tokens by
    top_k or has no filter; None where a row needs more of the sort (top_p without a small top_k)."""
    filtered = (info.top_ks < logits.shape[-1]) | (info.top_ps < 1.0)
    width = int(info.top_ks[filtered].max()) if bool(filtered.any()) else 0
    if not 0 < width <= MAX_SELECTED_TOP_K:
        return None
    threshold = torch.topk(logits, width, dim=-1).values[:, -1:]
    selected = logits >= threshold
    ids = selected.nonzero()[:, 1]
    if ids.numel() != logits.shape[0] * width:
        # Tokens tied with the width-th value that do not all fit: the sort keeps those of lowest id.
        above = logits > threshold
        ties = selected & ~above
        selected = above | (ties & (ties.cumsum(-1) <= width - above.sum(-1, keepdim=True)))
        ids = selected.nonzero()[:, 1]
        if ids.numel() != logits.shape[0] * width:  # NaN logits: left to the sort
            return None
    ids = ids.view(-1, width)  # ascending token ids within a row
    values, order = torch.sort(logits.gather(-1, ids), dim=-1, descending=True, stable=True)
    return values, ids.gather(-1, order), None if bool(filtered.all()) else filtered


def _drop_by_rank(sorted_logits: torch.Tensor, info: SamplingBatchInfo, vocab_size: int) -> torch.Tensor:
    """Which of each row's first places in the stable descending sort (all of them, or the first
    `width`) top_k and top_p leave out."""
    width = sorted_logits.shape[-1]
    ranks = torch.arange(width, device=sorted_logits.device)
    drop_sorted = ranks[None, :] >= info.top_ks[:, None]
    if info.need_top_p_sampling:
        top_k_logits = sorted_logits.masked_fill(drop_sorted, -torch.inf)
        # Over the whole vocabulary, as the full sort sees it, so that the sums round the same.
        top_k_logits = torch.nn.functional.pad(top_k_logits, (0, vocab_size - width), value=-torch.inf)
        drop_sorted |= _outside_nucleus(top_k_logits, info.top_ps)[:, :width]
    return drop_sorted


def _outside_nucleus(sorted_logits: torch.Tensor, top_ps: torch.Tensor) -> torch.Tensor:
    """Keeps the shortest prefix whose mass reaches top_p: a token goes once the tokens
    before it already hold top_p, so the first token always stays."""
    probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = torch.cumsum(probs, dim=-1) - probs
    # Rounding can push the running sum to 1 before the tail; top_p=1 must keep everything.
    outside = (mass_before >= top_ps[:, None]) & (top_ps[:, None] < 1.0)
    # A top_p below float32's range (1e-46) is stored as 0, where nothing precedes the first token either.
    outside[:, 0] = False
    return outside


def _apply_min_p(logits: torch.Tensor, min_ps: torch.Tensor) -> torch.Tensor:
    # p_i < min_p * p_max  <=>  logit_i < logit_max + log(min_p); min_p=0 gives -inf, a no-op.
    max_logits = logits.max(dim=-1, keepdim=True).values
    return logits.masked_fill(logits < max_logits + torch.log(min_ps)[:, None], -torch.inf)
