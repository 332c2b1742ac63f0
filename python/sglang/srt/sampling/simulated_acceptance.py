"""Simulated acceptance (benchmarks only; SGLANG_SIMULATE_ACC_LEN, upstream's name, read by
bench_hooks): verification accepts each draft at a per-position rate whatever the models say, so
the cost and the policies of speculation can be measured on random weights. The output is not
the target's."""

from __future__ import annotations

import array
import functools
import logging
import zlib

import torch

logger = logging.getLogger(__name__)


class SimulatedAcceptance:
    """The speculative worker's simulation: each request row's rate and random stream, on the
    device. A request may ask for its own accept length (sampling parameter
    simulated_accept_length), so one trace can mix easy and hard requests."""

    def __init__(self, accept_length: float, k_max: int, rows: int, device):
        self.k_max, self.device = k_max, device
        self.rate = simulated_accept_rate(accept_length, k_max)
        logger.warning(
            "SGLANG_SIMULATE_ACC_LEN=%s: verification accepts each draft with probability %.3f whatever "
            "the models say; the output is not the target's (for benchmarks only; requests may set their "
            "own accept length with simulated_accept_length)",
            accept_length,
            self.rate,
        )
        self.rates = torch.full((rows,), self.rate, dtype=torch.float64, device=device)
        # Each row's draws are keyed by its request's prompt (simulated_stream), not by the row:
        # a request then has the same luck on every server, whichever row it lands in.
        self.streams = torch.zeros((rows,), dtype=torch.int64, device=device)

    def admit(self, reqs, rows: torch.Tensor) -> None:
        """Each request's rate and stream into its row (at its prefill)."""
        rates = [
            self.rate
            if req.sampling_params.simulated_accept_length is None
            else simulated_accept_rate(req.sampling_params.simulated_accept_length, self.k_max)
            for req in reqs
        ]
        self.rates[rows] = torch.tensor(rates, dtype=torch.float64).to(self.device, non_blocking=True)
        streams = [simulated_stream(req.origin_input_ids) for req in reqs]
        self.streams[rows] = torch.tensor(streams, dtype=torch.int64).to(self.device, non_blocking=True)

    def verdict(self, target_logits, drafts, positions, rows) -> tuple[torch.Tensor, torch.Tensor]:
        return simulate_acceptance(target_logits, drafts, positions, self.rates[rows], self.streams[rows])

    def probe_hits(self, positions, rows) -> torch.Tensor:
        return simulated_probe_hits(positions, self.rates[rows], self.streams[rows])


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
) -> tuple[torch.Tensor, torch.Tensor]:
    """A verdict that accepts each draft with probability `rate` (given the earlier ones were
    accepted), whatever the models say: accepted drafts are output as drafted, followed by the
    target's greedy token. Draws come from an integer hash of (position, draft index), so the
    step stays deterministic and can be captured in a CUDA graph. Returns (tokens [bs, k + 1],
    num_out [bs]), as spec_sampling.ChainVerdict holds them."""
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
    return tokens, accepted + 1
