"""Copying checkpoint tensors into a model's parameters, fusing split projections on the way.

A checkpoint name like `model.layers.0.self_attn.k_proj.weight` lands in rows [q, q + kv) of
`model.layers.0.self_attn.qkv_proj.weight`. Under tensor parallelism each rank copies only its
part of a sharded tensor (`FusedShard.source_start`, `param.tp_source`), after checking the whole
tensor's shape. Every mismatch fails with the name it concerns.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable

import torch
from torch import nn

from sglang.srt.distributed.parallel_state import first_kv_head, tensor_parallel
from sglang.srt.layers.linear import TpSource

IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


@dataclasses.dataclass(frozen=True)
class FusedShard:
    fused_name: str  # module name of the fused projection, e.g. "qkv_proj"
    offset: int  # first output row of this shard
    size: int  # output rows of this shard
    # Tensor parallelism: the first checkpoint row this rank takes, and the checkpoint's rows.
    source_start: int = 0
    source_rows: int | None = None  # None: `size`


def llama_fused_shards(attn, mlp) -> dict[str, FusedShard]:
    """Where a Llama-style layer's q/k/v and gate/up checkpoint weights land in its fused
    `qkv_proj` and `gate_up_proj` (the target models and the EAGLE-3 draft layer). `attn` and
    `mlp` are the layer's LlamaAttention and LlamaMLP, which know this rank's heads and rows."""
    tp = tensor_parallel()
    q, kv, inter = attn.q_size, attn.kv_size, mlp.intermediate_size
    kv_start = first_kv_head(attn.total_num_kv_heads, tp.size, tp.rank) * attn.head_dim
    kv_rows = attn.total_num_kv_heads * attn.head_dim
    return {
        "q_proj": FusedShard("qkv_proj", 0, q, tp.rank * q, q * tp.size),
        "k_proj": FusedShard("qkv_proj", q, kv, kv_start, kv_rows),
        "v_proj": FusedShard("qkv_proj", q + kv, kv, kv_start, kv_rows),
        "gate_proj": FusedShard("gate_up_proj", 0, inter, tp.rank * inter, inter * tp.size),
        "up_proj": FusedShard("gate_up_proj", inter, inter, tp.rank * inter, inter * tp.size),
    }


def load_named_weights(
    model: nn.Module,
    weights: Iterable[tuple[str, torch.Tensor]],
    fused: dict[str, FusedShard],
    skip: set[str] = frozenset(),
) -> None:
    params = dict(model.named_parameters())
    # Each parameter's rows, filled as shards arrive; all must be covered at the end.
    filled: dict[str, int] = {name: 0 for name in params}
    seen: set[str] = set()
    for ckpt_name, tensor in weights:
        if ckpt_name in skip or ckpt_name.endswith(IGNORED_SUFFIXES):
            continue
        target, rows = _locate(ckpt_name, fused, params)
        param = params[target]
        dest = param.data if rows is None else param.data.narrow(0, rows.offset, rows.size)
        covered = dest.shape[0] if dest.dim() else 1
        source = _tp_source(param, rows)
        if source is not None:
            tensor, dest = _rank_part(ckpt_name, tensor, dest, source)
        if tuple(tensor.shape) != tuple(dest.shape):
            raise ValueError(
                f"weight {ckpt_name!r} has shape {tuple(tensor.shape)} in the checkpoint, "
                f"but the model expects {tuple(dest.shape)} (check config.json)"
            )
        dest.copy_(tensor.to(dest.dtype))
        filled[target] += covered
        seen.add(ckpt_name)
    _check_complete(params, filled, seen, fused)


def _tp_source(param: nn.Parameter, rows: FusedShard | None) -> TpSource | None:
    """What part of its checkpoint tensor this rank copies into `param` (None: all of it)."""
    if tensor_parallel().size == 1:
        return None
    if rows is not None:
        return TpSource(0, rows.source_start, rows.size, rows.source_rows or rows.size)
    return getattr(param, "tp_source", None)


def _rank_part(ckpt_name: str, tensor: torch.Tensor, dest: torch.Tensor, source: TpSource):
    """This rank's slice of a checkpoint tensor and where it goes, after checking the whole
    tensor against the shape the model expects (the last vocabulary block holds fewer rows than
    its parameter: the rest is padding)."""
    whole = list(dest.shape)
    whole[source.dim] = source.full
    if list(tensor.shape) != whole:
        raise ValueError(
            f"weight {ckpt_name!r} has shape {tuple(tensor.shape)} in the checkpoint, "
            f"but the model expects {tuple(whole)} (check config.json)"
        )
    return tensor.narrow(source.dim, source.start, source.size), dest.narrow(source.dim, 0, source.size)


def _locate(ckpt_name: str, fused: dict[str, FusedShard], params: dict):
    if ckpt_name in params:
        return ckpt_name, None
    for split_name, shard in fused.items():
        marker = f".{split_name}."
        if marker in ckpt_name:
            target = ckpt_name.replace(marker, f".{shard.fused_name}.")
            if target in params:
                return target, shard
    raise ValueError(f"checkpoint weight {ckpt_name!r} does not belong to this model architecture")


def _check_complete(params: dict, filled: dict[str, int], seen: set[str], fused: dict[str, FusedShard]) -> None:
    incomplete = [name for name, p in params.items() if filled[name] < (p.shape[0] if p.dim() else 1)]
    # Name what the checkpoint lacks (`k_proj`), not the fused parameter it would fill (`qkv_proj`).
    missing = [ckpt for name in incomplete for ckpt in _checkpoint_names(name, fused) if ckpt not in seen]
    missing = missing or incomplete
    if missing:
        shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise ValueError(f"checkpoint is missing {len(missing)} weight(s): {shown}")


def _checkpoint_names(param_name: str, fused: dict[str, FusedShard]) -> list[str]:
    """The checkpoint names that fill a parameter: its split names if it is fused, else its own."""
    splits = [
        param_name.replace(f".{shard.fused_name}.", f".{split_name}.")
        for split_name, shard in fused.items()
        if f".{shard.fused_name}." in param_name
    ]
    return splits or [param_name]
