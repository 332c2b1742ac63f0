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

import array
import dataclasses
import functools
import zlib

import torch

from sglang.srt.layers.sampler import apply_top_k_top_p_min_p, gumbel_noise
from sglang.srt.sampling.random import uniform
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

# Streams of the counter-based generator, apart from the plain sampler's stream 0.
STREAM_DRAFT = 11  # Gumbel noise of a draft token
STREAM_ACCEPT = 12  # the uniform deciding whether a draft token is accepted
STREAM_RESAMPLE = 13  # Gumbel noise of the token drawn at the first rejection (or the bonus)


def filtered_probs(logits: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
    """float32[rows, V]: the distribution each row samples from (one-hot at the argmax for
    greedy rows). `info` has one row per logits row."""
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
    """Chain rejection sampling.

    target_logits: [bs, k + 1, V]; drafts: int64[bs, k] (target ids); draft_probs: float32
    [bs, k, V], q of each draft step over the target vocabulary (zero outside the draft's);
    offsets: int64[bs], the output index of each row's first token this step."""
    bs, width, vocab = target_logits.shape
    k = width - 1
    step_info = _repeat_rows(info, width)
    p = filtered_probs(target_logits.reshape(bs * width, vocab), step_info).view(bs, width, vocab)
    step_offsets = (offsets[:, None] + torch.arange(width, device=offsets.device)).reshape(-1)
    p_draft = p[:, :k].gather(2, drafts[:, :, None]).squeeze(2)
    q_draft = draft_probs.gather(2, drafts[:, :, None]).squeeze(2)
    u = uniform(_repeat(info.seeds, width), step_offsets, 1, STREAM_ACCEPT).view(bs, width)[:, :k]
    # u < p/q  <=>  u * q < p (q > 0 for a drawn draft); greedy rows have one-hot p and q.
    accepted = (u * q_draft < p_draft).long()
    num_accepted = accepted.cumprod(dim=1).sum(dim=1)
    # Where the chain stops: the residual max(0, p - q) after a rejection, p itself after k accepts.
    residual = torch.cat([(p[:, :k] - draft_probs).clamp_min(0), p[:, k:]], dim=1)
    stop = residual.gather(1, num_accepted[:, None, None].expand(bs, 1, vocab)).squeeze(1)
    stop_offsets = offsets + num_accepted
    noise = gumbel_noise(info.seeds, stop_offsets, vocab, STREAM_RESAMPLE)
    # argmax(log w + Gumbel) draws from w / sum(w); zero-weight tokens get -inf.
    resampled = (torch.log(stop) + noise).argmax(-1)
    tokens = torch.cat([drafts, drafts[:, :1]], dim=1)
    tokens.scatter_(1, num_accepted[:, None], resampled[:, None])
    # Greedy rows of a mixed batch take the exact greedy rule (their q is never used).
    greedy = verify_greedy(target_logits, drafts)
    mask = info.greedy_mask
    return ChainVerdict(
        tokens=torch.where(mask[:, None], greedy.tokens, tokens),
        num_out=torch.where(mask, greedy.num_out, num_accepted + 1),
    )


def _repeat(t: torch.Tensor, n: int) -> torch.Tensor:
    return t.repeat_interleave(n, dim=0)


def _repeat_rows(info: SamplingBatchInfo, n: int) -> SamplingBatchInfo:
    """The batch info with every row repeated n times (one row per verified position)."""
    return dataclasses.replace(
        info,
        temperatures=_repeat(info.temperatures, n),
        top_ps=_repeat(info.top_ps, n),
        top_ks=_repeat(info.top_ks, n),
        min_ps=_repeat(info.min_ps, n),
        seeds=_repeat(info.seeds, n),
        greedy_mask=_repeat(info.greedy_mask, n),
    )


# ---- simulated acceptance (benchmarks only) ----------------------------------------------------

SIMULATE_ACC_LEN_ENV = "SGLANG_SIMULATE_ACC_LEN"


@functools.lru_cache(maxsize=256)
def simulated_accept_rate(accept_length: float, k_max: int) -> float:
    """The per-position acceptance rate r with 1 + r + r^2 + ... + r^k_max = accept_length
    (clamped to the reachable 1 .. k_max + 1): the same r then prices every smaller k, as a real
    draft's per-position acceptance does."""
    target = min(max(accept_length, 1.0), k_max + 1.0)
    low, high = 0.0, 1.0
    for _ in range(60):  # bisection: the sum grows with r
        mid = (low + high) / 2
        if sum(mid**i for i in range(k_max + 1)) < target:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def simulated_stream(prompt_ids: list[int]) -> int:
    """A request's stream for its simulated draws: a 24-bit hash of its prompt, so that a request
    accepts alike on every server it is sent to (a benchmark's servers get the same prompts),
    whichever request-table row it lands in. Keyed by the row instead, a benchmark's few requests
    at low concurrency reuse the same rows round after round, and one server's luck stays with
    it: two servers at k = 3 read accept length 1.69 and 2.02 for requests asking 2.0. Requests
    with one prompt draw alike."""
    return zlib.crc32(array.array("q", prompt_ids).tobytes()) & 0xFFFFFF


def _hashed_uniform(positions: torch.Tensor, k: int, streams: torch.Tensor | None = None) -> torch.Tensor:
    """float64[bs, k] in [0, 1): an integer hash of (position, draft index) and, when given, each
    row's stream (its request-table row), the same on every device and inside a CUDA graph (no
    generator state). Without streams, requests at the same position draw alike: a batch of
    prompts of one length then accepts or rejects together, and its acceptance per step is 0 or 1."""
    index = torch.arange(k, device=positions.device)
    mask = 0xFFFFFFFF  # 32-bit words: every product below stays inside int64
    h = (positions[:, None] * 0x9E3779B1 + index * 0x85EBCA77 + 0x165667B1) & mask
    if streams is not None:
        h = (h ^ ((streams[:, None] * 0xC2B2AE3D) & mask)) & mask
    h = h ^ (h >> 15)
    h = (h * 0x2C1B3C6D) & mask
    h = h ^ (h >> 12)
    h = (h * 0x297A2D39) & mask
    h = h ^ (h >> 15)
    return h.to(torch.float64) / float(1 << 32)


def simulated_probe_hits(positions: torch.Tensor, rate, streams: torch.Tensor | None = None) -> torch.Tensor:
    """bool[bs]: a plain step's probe under simulated acceptance. The real draft's guess says
    nothing about the simulated rate, so the probe hits with probability `rate`, drawn as the
    first draft of a speculative step at the same position would be. `rate`: a float, or one per
    row."""
    return _hashed_uniform(positions, 1, streams)[:, 0] < rate


def simulate_acceptance(
    target_logits: torch.Tensor,
    drafts: torch.Tensor,
    positions: torch.Tensor,
    rate,
    streams: torch.Tensor | None = None,
) -> ChainVerdict:
    """A verdict that accepts each draft with probability `rate` (given the earlier ones were
    accepted), whatever the models say: accepted drafts are output as drafted, followed by the
    target's greedy token. Draws come from an integer hash of (position, draft index), so the
    step stays deterministic and can be captured in a CUDA graph. For measuring the cost and the
    policies of speculation on random weights (SGLANG_SIMULATE_ACC_LEN, upstream's name); the
    output is not the target's."""
    bs, k = drafts.shape
    uniform = _hashed_uniform(positions, k, streams)
    if isinstance(rate, torch.Tensor):  # one rate per row
        rate = rate[:, None]
    accepted = (uniform < rate).long().cumprod(dim=1).sum(dim=1)
    best = target_logits.argmax(-1)
    tokens = torch.cat([drafts, best[:, -1:]], dim=1)
    last = accepted[:, None]
    tokens = torch.where(
        torch.arange(k + 1, device=drafts.device) == last, best.gather(1, last).expand(-1, k + 1), tokens
    )
    return ChainVerdict(tokens=tokens, num_out=accepted + 1)
