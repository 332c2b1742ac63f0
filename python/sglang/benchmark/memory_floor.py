"""The memory floor of a decode step: the time to read the weights and the batch's KV cache once
at the device's copy bandwidth, which no memory-bound decode step can beat."""

from __future__ import annotations

import time

import torch

from sglang.srt.model_loader.loader import parameter_bytes


def copy_bandwidth(device: str, nbytes: int | None = None, iters: int = 10) -> float:
    """Bytes moved per second (read + write) by a large device-to-device copy."""
    nbytes = nbytes or (2 << 30 if device == "cuda" else 1 << 26)
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)  # first touch, outside the timing
    _sync(device)
    start = time.perf_counter()
    for _ in range(iters):
        dst.copy_(src)
    _sync(device)
    return 2 * nbytes * iters / (time.perf_counter() - start)


def kv_bytes_per_token(kv_pool) -> int:
    """K and V bytes of one token over every layer of an MHATokenToKVPool."""
    return sum(buf[0].numel() * buf.element_size() for buf in (*kv_pool.k_buffer, *kv_pool.v_buffer))


def decode_floor_s(runner, batch_size: int, mean_context: float, bandwidth: float) -> float:
    """Seconds to read the runner's weights and `batch_size` x `mean_context` tokens of KV once."""
    read = parameter_bytes(runner.model) + batch_size * mean_context * kv_bytes_per_token(runner.token_to_kv_pool)
    return read / bandwidth


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()
