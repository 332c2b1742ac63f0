"""Copying checkpoint tensors into a model's parameters, fusing split projections on the way.

A checkpoint name like `model.layers.0.self_attn.k_proj.weight` lands in rows [q, q + kv) of
`model.layers.0.self_attn.qkv_proj.weight`. Every mismatch fails with the name it concerns.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable

import torch
from torch import nn

IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


@dataclasses.dataclass(frozen=True)
class FusedShard:
    fused_name: str  # module name of the fused projection, e.g. "qkv_proj"
    offset: int  # first output row of this shard
    size: int  # output rows of this shard


def llama_fused_shards(q_size: int, kv_size: int, intermediate_size: int) -> dict[str, FusedShard]:
    """Where a Llama-style layer's q/k/v and gate/up checkpoint weights land in its fused
    `qkv_proj` and `gate_up_proj` (the target models and the EAGLE-3 draft layer)."""
    q, kv, inter = q_size, kv_size, intermediate_size
    return {
        "q_proj": FusedShard("qkv_proj", 0, q),
        "k_proj": FusedShard("qkv_proj", q, kv),
        "v_proj": FusedShard("qkv_proj", q + kv, kv),
        "gate_proj": FusedShard("gate_up_proj", 0, inter),
        "up_proj": FusedShard("gate_up_proj", inter, inter),
    }


def load_named_weights(model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]],
                       fused: dict[str, FusedShard], skip: set[str] = frozenset()) -> None:
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
        if tuple(tensor.shape) != tuple(dest.shape):
            raise ValueError(
                f"weight {ckpt_name!r} has shape {tuple(tensor.shape)} in the checkpoint, "
                f"but the model expects {tuple(dest.shape)} (check config.json)"
            )
        dest.copy_(tensor.to(dest.dtype))
        filled[target] += dest.shape[0] if dest.dim() else 1
        seen.add(ckpt_name)
    _check_complete(params, filled, seen, fused)


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


def _check_complete(params: dict, filled: dict[str, int], seen: set[str],
                    fused: dict[str, FusedShard]) -> None:
    incomplete = [name for name, p in params.items() if filled[name] < (p.shape[0] if p.dim() else 1)]
    # Name what the checkpoint lacks (`k_proj`), not the fused parameter it would fill (`qkv_proj`).
    missing = [ckpt for name in incomplete for ckpt in _checkpoint_names(name, fused) if ckpt not in seen]
    missing = missing or incomplete
    if missing:
        shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise ValueError(f"checkpoint is missing {len(missing)} weight(s): {shown}")


def _checkpoint_names(param_name: str, fused: dict[str, FusedShard]) -> list[str]:
    """The checkpoint names that fill a parameter: its split names if it is fused, else its own."""
    splits = [param_name.replace(f".{shard.fused_name}.", f".{split_name}.")
              for split_name, shard in fused.items() if f".{shard.fused_name}." in param_name]
    return splits or [param_name]
