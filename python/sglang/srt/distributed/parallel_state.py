"""Tensor parallelism's process group: this process's rank, the group's size, and the collectives
the sharded layers call. Without `init_tensor_parallel` (tp_size 1) every collective is a no-op.

One process per rank. Tensors travel over the TP group (NCCL on CUDA, gloo on the CPU); rank 0's
commands to the other ranks travel as pickled objects over a gloo group (the same group on the CPU).
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Optional

import torch
import torch.distributed as dist

# How long a rank waits for the others at start-up and at any collective before it gives up.
TP_TIMEOUT_S = 1800


@dataclasses.dataclass(frozen=True)
class TensorParallel:
    rank: int
    size: int
    group: Optional[object]  # tensors (NCCL on CUDA, gloo on the CPU)
    command_group: Optional[object]  # pickled objects (gloo)


_state = TensorParallel(rank=0, size=1, group=None, command_group=None)


def init_tensor_parallel(rank: int, size: int, init_address: str, device: str) -> None:
    """Join the group of `size` ranks that meet at `init_address` (host:port)."""
    global _state
    if size == 1:
        return
    backend = "nccl" if device == "cuda" else "gloo"
    timeout = datetime.timedelta(seconds=TP_TIMEOUT_S)
    kwargs = {"device_id": torch.device("cuda", torch.cuda.current_device())} if device == "cuda" else {}
    dist.init_process_group(
        backend, init_method=f"tcp://{init_address}", rank=rank, world_size=size, timeout=timeout, **kwargs
    )
    group = dist.group.WORLD
    command_group = dist.new_group(backend="gloo", timeout=timeout) if backend == "nccl" else group
    _state = TensorParallel(rank=rank, size=size, group=group, command_group=command_group)


def destroy_tensor_parallel() -> None:
    global _state
    if _state.size > 1 and dist.is_initialized():
        dist.destroy_process_group()
    _state = TensorParallel(rank=0, size=1, group=None, command_group=None)


def tensor_parallel() -> TensorParallel:
    return _state


def get_tensor_model_parallel_rank() -> int:
    return _state.rank


def get_tensor_model_parallel_world_size() -> int:
    return _state.size


def tensor_model_parallel_all_reduce(x: torch.Tensor) -> torch.Tensor:
    """The sum of `x` over the ranks, in place (every rank gets the same bits)."""
    if _state.size > 1:
        dist.all_reduce(x, group=_state.group)
    return x


def tensor_model_parallel_max(x: torch.Tensor) -> torch.Tensor:
    """The elementwise largest `x` over the ranks, in place."""
    if _state.size > 1:
        dist.all_reduce(x, op=dist.ReduceOp.MAX, group=_state.group)
    return x


def tensor_model_parallel_all_gather(x: torch.Tensor) -> torch.Tensor:
    """The ranks' `x` side by side along the last dimension, in rank order."""
    if _state.size == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(_state.size)]
    dist.all_gather(parts, x.contiguous(), group=_state.group)
    return torch.cat(parts, dim=-1)


def broadcast_command(command=None):
    """Rank 0 sends `command` (any picklable object); every other rank returns what rank 0 sent."""
    box = [command]
    dist.broadcast_object_list(box, src=0, group=_state.command_group)
    return box[0]


def broadcast_tensor(x: torch.Tensor) -> torch.Tensor:
    """Rank 0's `x` on every rank (`x`: the tensor to send on rank 0, a buffer of its shape elsewhere)."""
    dist.broadcast(x, src=0, group=_state.group)
    return x


def kv_heads_per_rank(num_kv_heads: int, tp_size: int) -> int:
    """Each rank's KV heads: an equal share, or one (replicated) when there are fewer than ranks."""
    return max(1, num_kv_heads // tp_size)


def first_kv_head(num_kv_heads: int, tp_size: int, rank: int) -> int:
    """The first KV head a rank holds: its own share, or the head its query heads read."""
    return rank * num_kv_heads // tp_size


def check_shardable(config, tp_size: int, what: str = "the model") -> None:
    """A clear start-up error when `config` (a Hugging Face config) cannot be split over tp_size ranks."""
    if tp_size == 1:
        return
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    intermediate = getattr(config, "intermediate_size", None)
    problems = []
    if heads is not None and heads % tp_size:
        problems.append(f"its {heads} attention heads do not divide by {tp_size}")
    if kv_heads is not None and kv_heads % tp_size and tp_size % kv_heads:
        problems.append(f"its {kv_heads} key-value heads neither divide by {tp_size} nor divide it")
    if intermediate is not None and intermediate % tp_size:
        problems.append(f"its intermediate_size {intermediate} does not divide by {tp_size}")
    if not problems:
        problems = _block_scale_problems(config, tp_size)
    if problems:
        raise ValueError(f"--tp-size {tp_size} cannot split {what}: {'; '.join(problems)}")


def _block_scale_problems(config, tp_size: int) -> list[str]:
    """Block-scaled weights (quantization_config.weight_block_size [rows, cols]: block-wise FP8)
    split with their scales, so each rank's share of a weight must be whole blocks: its output
    rows of q/k/v and gate/up (column-parallel) and its input columns of o_proj and down_proj
    (row-parallel). A share that would cut a block is named here rather than loaded wrong."""
    quantization = getattr(config, "quantization_config", None)
    block = quantization.get("weight_block_size") if isinstance(quantization, dict) else None
    if not block:
        return []
    rows, cols = block
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    q_rows = heads // tp_size * head_dim
    shares = [  # (what, entries per rank, the block side it must be a multiple of)
        ("query rows of q_proj", q_rows, rows),
        ("key-value rows of k_proj and v_proj", kv_heads_per_rank(kv_heads, tp_size) * head_dim, rows),
        ("input columns of o_proj", q_rows, cols),
    ]
    for key in ("intermediate_size", "moe_intermediate_size"):
        size = getattr(config, key, None)
        if size:
            shares.append((f"{key} rows of gate_proj and up_proj", size // tp_size, rows))
            shares.append((f"{key} input columns of down_proj", size // tp_size, cols))
    return [
        f"block-wise quantization (weight_block_size {list(block)}) splits the scales with the weights, but "
        f"each rank's {count} {share} are not a multiple of {side}"
        for share, count, side in shares
        if count % side
    ]


def tensor_model_parallel_min(value: int, device: str) -> int:
    """The least of the ranks' `value` (an int), on every rank."""
    if _state.size == 1:
        return value
    box = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(box, op=dist.ReduceOp.MIN, group=_state.group)
    return int(box.item())
