"""Drafting and acceptance for chain speculation (topk = 1).

Greedy rows draft the draft model's argmax and accept the longest prefix of drafts equal to the
target's argmax, plus the target's own next token (the bonus): the output is exactly plain greedy
decoding. Sampled rows draft x ~ q (the draft's distribution under the request's temperature,
top-k, top-p and min-p), accept x with probability min(1, p(x) / q(x)) where p is the target's
distribution under the same filters, and at the first rejection draw from norm(max(0, p - q));
after k acceptances the bonus is drawn from p. Each accepted or resampled token is then
distributed exactly as p, so speculation does not change what a request samples from.

Random numbers come from the counter-based generator keyed by (seed, output index, stream), so
a request's draws never depend on the rest of the batch.
"""

from __future__ import annotations

import dataclasses

import torch

from sglang.srt.layers.sampler import apply_top_k_top_p_min_p, gumbel_noise
from sglang.srt.sampling.random import uniform
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

# Streams of the counter-based generator, apart from the plain sampler's stream 0.
STREAM_DRAFT = 11  # Gumbel noise of a draft token
STREAM_ACCEPT = 12  # the uniform deciding whether a draft token is accepted
STREAM_RESAMPLE = 13  # Gumbel noise of the token drawn at the first rejection (or the bonus)


def filtered_probs(logits: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
    """float32[rows, V]: the distribution each row samples from (one-hot argmax for greedy rows)."""
    logits = logits.float()
    # scatter rather than one_hot, which checks its indices on the host (a device sync).
    greedy = torch.zeros_like(logits).scatter_(1, logits.argmax(-1, keepdim=True), 1.0)
    if info.is_all_greedy:
        return greedy
    probs = torch.softmax(apply_top_k_top_p_min_p(logits / info.temperatures, info), dim=-1)
    return torch.where(info.greedy_mask[:, None], greedy, probs)


def draw_draft(logits: torch.Tensor, info: SamplingBatchInfo, offsets: torch.Tensor) -> torch.Tensor:
    """int64[bs] draft-vocabulary ids: argmax for greedy rows, x ~ q for the others."""
    if info.is_all_greedy:
        return logits.argmax(-1)
    filtered = apply_top_k_top_p_min_p(logits.float() / info.temperatures, info)
    noise = gumbel_noise(info.seeds, offsets, logits.shape[-1], STREAM_DRAFT)
    return torch.where(info.greedy_mask, logits.argmax(-1), (filtered + noise).argmax(-1))


@dataclasses.dataclass
class ChainVerdict:
    tokens: torch.Tensor  # int64[bs, k + 1]: the step's output tokens; the first num_out are real
    num_out: torch.Tensor  # int64[bs], in [1, k + 1]: accepted drafts + 1


def verify_greedy(target_logits: torch.Tensor, drafts: torch.Tensor) -> ChainVerdict:
    """target_logits: [bs, k + 1, V] at the verified positions; drafts: int64[bs, k]."""
    best = target_logits.argmax(-1)
    matches = (best[:, :-1] == drafts).long()
    num_accepted = matches.cumprod(dim=1).sum(dim=1)
    return ChainVerdict(tokens=best, num_out=num_accepted + 1)


def verify_sampled(
    target_logits: torch.Tensor,
    drafts: torch.Tensor,
    draft_probs: torch.Tensor,
    info: SamplingBatchInfo,
    offsets: torch.Tensor,
) -> ChainVerdict:
    """Chain rejection sampling. target_logits: [bs, k + 1, V]; drafts: int64[bs, k] (target ids);
    draft_probs: float32[bs, k, V], each draft's q over the target vocabulary; offsets: int64[bs],
    the output index of each row's first token this step."""
    bs, width, vocab = target_logits.shape
    k = width - 1
    step_info = _repeat_rows(info, width)
    p = filtered_probs(target_logits.reshape(bs * width, vocab), step_info).view(bs, width, vocab)
    step_offsets = (offsets[:, None] + torch.arange(width, device=offsets.device)).reshape(-1)
    p_draft = p[:, :k].gather(2, drafts[:, :, None]).squeeze(2)
    q_draft = draft_probs.gather(2, drafts[:, :, None]).squeeze(2)
    u = uniform(step_info.seeds, step_offsets, 1, STREAM_ACCEPT).view(bs, width)[:, :k]
    # u < p/q  <=>  u * q < p (q > 0 for a drawn draft); greedy rows have one-hot p and q.
    accepted = (u * q_draft < p_draft).long()
    num_accepted = accepted.cumprod(dim=1).sum(dim=1)
    # Where the chain stops: the residual max(0, p - q) after a rejection, p itself after k accepts.
    residual = torch.cat([(p[:, :k] - draft_probs).clamp_min(0), p[:, k:]], dim=1)
    stop = residual.gather(1, num_accepted[:, None, None].expand(bs, 1, vocab)).squeeze(1)
    noise = gumbel_noise(info.seeds, offsets + num_accepted, vocab, STREAM_RESAMPLE)
    # argmax(log w + Gumbel) draws from w / sum(w); zero-weight tokens get -inf.
    resampled = (torch.log(stop) + noise).argmax(-1)
    tokens = torch.cat([drafts, drafts[:, :1]], dim=1)
    tokens.scatter_(1, num_accepted[:, None], resampled[:, None])
    # Greedy rows of a mixed batch take the exact greedy rule (their q is never used).
    greedy = verify_greedy(target_logits, drafts)
    mask = info.greedy_mask
    return ChainVerdict(
        torch.where(mask[:, None], greedy.tokens, tokens), torch.where(mask, greedy.num_out, num_accepted + 1)
    )


def _repeat_rows(info: SamplingBatchInfo, n: int) -> SamplingBatchInfo:
    """The batch info with every row repeated n times (one row per verified position)."""
    rows = ("temperatures", "top_ps", "top_ks", "min_ps", "seeds", "greedy_mask")
    return dataclasses.replace(info, **{name: getattr(info, name).repeat_interleave(n, dim=0) for name in rows})
