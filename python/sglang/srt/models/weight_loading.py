"""Copying checkpoint tensors into a model's parameters, fusing split projections on the way.

A checkpoint name like `model.layers.0.self_attn.k_proj.weight` lands in rows [q, q + kv) of
`model.layers.0.self_attn.qkv_proj.weight`; an expert's `mlp.experts.3.up_proj.weight` lands in
expert 3's up rows of the stacked `mlp.experts.w13_weight` (copied into the stack allocated with
the model, so loading holds no more than the model and the one checkpoint tensor being copied).
Under tensor parallelism each rank copies only its part of a sharded tensor (`FusedShard.source_start`, `param.tp_source`), after checking the whole
tensor's shape. Every mismatch fails with the name it concerns.
"""

from __future__ import annotations

import dataclasses
import re
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


@dataclasses.dataclass(frozen=True)
class ExpertShard:
    """Where one expert's checkpoint projection (`<module>.experts.<e>.<proj>.weight`) lands in
    the layer's stacked parameter `<module>.experts.<stacked_name>`: rows [offset, offset + size)
    of its slab [e]. Under tensor parallelism each rank takes `size` of the checkpoint tensor's
    `tp_full` entries along `tp_dim`, from rank * size (the experts' intermediate dimension)."""

    stacked_name: str  # "w13_weight" or "w2_weight"
    offset: int
    size: int
    tp_dim: int
    tp_full: int


EXPERT_NAME = re.compile(r"^(?P<module>.+\.experts)\.(?P<expert>\d+)\.(?P<proj>[^.]+)\.(?P<kind>weight(_scale_inv)?)$")
SCALE_SUFFIX = "_scale_inv"  # block-wise FP8: `...experts.<e>.<proj>.weight_scale_inv` -> `<stacked>_scale_inv`


def expert_shards(moe, hidden_size: int, gate: str, up: str, down: str) -> dict[str, ExpertShard]:
    """The ExpertShards of a FusedMoE `moe` whose checkpoints name the projections `gate`, `up`
    and `down` (Qwen: gate_proj, up_proj, down_proj; Mixtral: w1, w3, w2)."""
    inter = moe.intermediate_size  # this rank's rows
    full = inter * tensor_parallel().size
    return {
        gate: ExpertShard("w13_weight", 0, inter, 0, full),
        up: ExpertShard("w13_weight", inter, inter, 0, full),
        down: ExpertShard("w2_weight", 0, hidden_size, 1, full),
    }


def llama_fused_shards(attn, mlp) -> dict[str, FusedShard]:
    """Where a Llama-style layer's q/k/v and gate/up checkpoint weights land in its fused
    `qkv_proj` and `gate_up_proj` (the target models and the EAGLE-3 draft layer). `attn` and
    `mlp` are the layer's LlamaAttention and LlamaMLP, which know this rank's heads and rows
    (`mlp` None: attention only, for a model with no dense MLP)."""
    tp = tensor_parallel()
    q, kv = attn.q_size, attn.kv_size
    kv_start = first_kv_head(attn.total_num_kv_heads, tp.size, tp.rank) * attn.head_dim
    kv_rows = attn.total_num_kv_heads * attn.head_dim
    shards = {
        "q_proj": FusedShard("qkv_proj", 0, q, tp.rank * q, q * tp.size),
        "k_proj": FusedShard("qkv_proj", q, kv, kv_start, kv_rows),
        "v_proj": FusedShard("qkv_proj", q + kv, kv, kv_start, kv_rows),
    }
    if mlp is not None:
        inter = mlp.intermediate_size
        shards["gate_proj"] = FusedShard("gate_up_proj", 0, inter, tp.rank * inter, inter * tp.size)
        shards["up_proj"] = FusedShard("gate_up_proj", inter, inter, tp.rank * inter, inter * tp.size)
    return shards


def load_named_weights(
    model: nn.Module,
    weights: Iterable[tuple[str, torch.Tensor]],
    fused: dict[str, FusedShard],
    skip: set[str] = frozenset(),
    experts: dict[str, ExpertShard] | None = None,
) -> None:
    """`fused`: split projection name -> its place in a fused one; `experts`: expert projection
    name -> its place in the stacked expert weights (MoE models)."""
    params = dict(model.named_parameters())
    experts = experts or {}
    # Each parameter's elements, filled as shards arrive; all must be covered at the end.
    filled: dict[str, int] = {name: 0 for name in params}
    seen: set[str] = set()
    for ckpt_name, tensor in weights:
        if ckpt_name in skip or ckpt_name.endswith(IGNORED_SUFFIXES):
            continue
        target, dest, source = _destination(ckpt_name, fused, experts, params)
        covered = dest.numel()
        if source is not None:
            tensor, dest = _rank_part(ckpt_name, tensor, dest, source)
        layout = getattr(params[target], "scale_layout", None)  # a quantized layer's scale
        if layout is not None:
            tensor = layout.fit(ckpt_name, tensor, dest)
        _check_float8(ckpt_name, tensor, dest)
        if tuple(tensor.shape) != tuple(dest.shape):
            raise ValueError(
                f"weight {ckpt_name!r} has shape {tuple(tensor.shape)} in the checkpoint, "
                f"but the model expects {tuple(dest.shape)} (check config.json)"
            )
        dest.copy_(tensor.to(dest.dtype))
        filled[target] += covered
        seen.add(ckpt_name)
        del tensor  # before the next one is read: one checkpoint tensor at a time besides the model
    _check_complete(params, filled, seen, fused, experts)


def _destination(ckpt_name: str, fused: dict[str, FusedShard], experts: dict[str, ExpertShard], params: dict):
    """(parameter name, the view of it the checkpoint tensor fills, this rank's TpSource or None)."""
    match = EXPERT_NAME.match(ckpt_name)
    if match and match["proj"] in experts:
        shard = experts[match["proj"]]
        scale = match["kind"] != "weight"
        target = f"{match['module']}.{shard.stacked_name}" + (SCALE_SUFFIX if scale else "")
        if target in params:
            return target, *_expert_destination(ckpt_name, params[target], int(match["expert"]), shard, scale)
    target, rows = _locate(ckpt_name, fused, params)
    param = params[target]
    if hasattr(param, "scale_layout"):  # blocks or rows of scales, not of weights (layers/quantization)
        return target, *param.scale_layout.destination(param, rows)
    dest = param.data if rows is None else param.data.narrow(0, rows.offset, rows.size)
    return target, dest, _tp_source(param, rows)


def _expert_destination(ckpt_name: str, param, expert: int, shard: ExpertShard, scale: bool):
    """The rows of expert `expert`'s slab that one checkpoint projection (or its block scales)
    fills, and this rank's part of it. A projection's scales start on a block row of their own."""
    if expert >= param.shape[0]:
        raise ValueError(
            f"checkpoint weight {ckpt_name!r} is for expert {expert}, but config.json gives {param.shape[0]} experts"
        )
    block = param.scale_layout.rows if scale else 1
    dest = param.data[expert].narrow(0, -(-shard.offset // block), -(-shard.size // block))
    tp = tensor_parallel()
    if tp.size == 1:
        return dest, None
    size = dest.shape[shard.tp_dim]  # whole blocks on every rank (Fp8MoEMethod refuses other splits)
    return dest, TpSource(shard.tp_dim, tp.rank * size, size, -(-shard.tp_full // block))


def _check_float8(ckpt_name: str, tensor: torch.Tensor, dest: torch.Tensor) -> None:
    """FP8 values copy only into FP8 parameters of the same format: converting them either way
    would drop or misapply their scales."""
    float8 = [t.dtype for t in (tensor, dest) if t.is_floating_point() and t.element_size() == 1]
    if float8 and tensor.dtype != dest.dtype:
        raise ValueError(
            f"weight {ckpt_name!r} is {tensor.dtype} in the checkpoint, but the model holds it as {dest.dtype} "
            f"(check quantization_config: which layers it quantizes, and their format)"
        )


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
    # The longest name first: `shared_expert.gate_proj` before `gate_proj`.
    for split_name, shard in sorted(fused.items(), key=lambda item: -len(item[0])):
        marker = f".{split_name}."
        if marker in ckpt_name:
            target = ckpt_name.replace(marker, f".{shard.fused_name}.")
            if target in params:
                return target, shard
    raise ValueError(f"checkpoint weight {ckpt_name!r} does not belong to this model architecture")


def _check_complete(
    params: dict, filled: dict[str, int], seen: set[str], fused: dict[str, FusedShard], experts: dict[str, ExpertShard]
) -> None:
    incomplete = [name for name, p in params.items() if filled[name] < p.numel()]
    # Name what the checkpoint lacks (`k_proj`), not the fused parameter it would fill (`qkv_proj`).
    names = [ckpt for name in incomplete for ckpt in _checkpoint_names(name, fused, experts, params[name])]
    missing = [ckpt for ckpt in dict.fromkeys(names) if ckpt not in seen]
    missing = missing or incomplete
    if missing:
        shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise ValueError(f"checkpoint is missing {len(missing)} weight(s): {shown}")


def _checkpoint_names(param_name: str, fused: dict, experts: dict, param) -> list[str]:
    """The checkpoint names that fill a parameter: its experts' projections if it is a stacked
    expert weight, its split names if it is fused, else its own."""
    module, _, stacked = param_name.rpartition(".")
    kind = "weight_scale_inv" if stacked.endswith(SCALE_SUFFIX) else "weight"
    stacked_from = [proj for proj, shard in experts.items() if shard.stacked_name == stacked.removesuffix(SCALE_SUFFIX)]
    if module.endswith(".experts") and stacked_from:
        return [f"{module}.{e}.{proj}.{kind}" for e in range(param.shape[0]) for proj in stacked_from]
    splits = [
        param_name.replace(f".{shard.fused_name}.", f".{split_name}.")
        for split_name, shard in fused.items()
        if f".{shard.fused_name}." in param_name
    ]
    return splits or [param_name]
