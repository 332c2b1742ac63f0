"""The memory floor of a decode step: the time to read the weights and the batch's KV cache once
at the device's copy bandwidth, which no memory-bound decode step can beat. Both are counted as
held, in the bytes of their dtypes: an FP8 layer's weight at one byte an entry plus its scales,
an FP8 KV cache at one byte an entry (the pool's element size, not the model's). A mixture-of-experts
layer reads only the experts its tokens are routed to: its floor counts those (recorded over an
eager forward by `recording_routed_experts`), not every expert."""

from __future__ import annotations

import contextlib
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
    """K and V bytes of one token over every layer of an MHATokenToKVPool, in the pool's own dtype."""
    return sum(buf[0].numel() * buf.element_size() for buf in (*kv_pool.k_buffer, *kv_pool.v_buffer))


def decode_floor_s(
    runner, batch_size: int, mean_context: float, bandwidth: float, routed_experts: list[int] | None = None
) -> float:
    """Seconds to read the runner's weights and `batch_size` x `mean_context` tokens of KV once;
    with `routed_experts` (per MoE layer, in model order, the experts a step routes to), of each
    MoE layer's experts only those."""
    read = weight_bytes_read(runner.model, routed_experts)
    read += batch_size * mean_context * kv_bytes_per_token(runner.token_to_kv_pool)
    return read / bandwidth


def expert_layers(model) -> list:
    """The model's FusedMoE layers, in model order (none in a dense model)."""
    from sglang.srt.layers.moe.layer import FusedMoE

    return [module for module in model.modules() if isinstance(module, FusedMoE)]


def weight_bytes_read(model, routed_experts: list[int] | None = None) -> int:
    total = parameter_bytes(model)
    if routed_experts is None:
        return total
    for layer, routed in zip(expert_layers(model), routed_experts, strict=True):
        stacked = parameter_bytes(layer)
        total += routed * stacked // layer.num_experts - stacked
    return total


@contextlib.contextmanager
def recording_routed_experts(model):
    """Yields a list that gets, for each FusedMoE layer an eager forward inside the block runs,
    the number of distinct experts its tokens are routed to (forward hooks: graph replays run none)."""
    counts: list[int] = []

    def record(module, args, output):
        counts.append(int(args[2].unique().numel()))  # forward(hidden, topk_weights, topk_ids)

    hooks = [layer.register_forward_hook(record) for layer in expert_layers(model)]
    try:
        yield counts
    finally:
        for hook in hooks:
            hook.remove()


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()
