"""The routed experts of a MoE layer as two grouped GEMMs over the experts that received tokens.

The (token, slot) pairs the router chose are sorted by expert and each expert's run is padded to
a multiple of BLOCK_M (`moe_align_block_size`), so a block of rows belongs to one expert. Kernel 1
multiplies a block's tokens by that expert's gate and up rows and stores silu(gate) * up; kernel 2
multiplies those by the expert's down projection and by the router's weight. The top-k weighted
sum is the sum over each token's slots at the end. Blocks past the routed rows do nothing, so an
expert no token goes to is never read; every size is fixed by the token count (CUDA graphs).
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from sgl_kernel._interpreter import fix_interpreter
from sgl_kernel.paged_kv import dot_precision

fix_interpreter()

BLOCK_M = 16


@dataclasses.dataclass(frozen=True)
class BlockAlignment:
    """The pairs (flat index token * top_k + slot) sorted by expert, each expert's run padded to a
    multiple of the block size with the index num_pairs (no pair); all on the device."""

    sorted_pairs: torch.Tensor  # [num_blocks * block_m] int64
    block_experts: torch.Tensor  # [num_blocks] int64: the expert of each block
    num_padded: torch.Tensor  # [1] int64: rows in use (blocks from num_padded / block_m on do nothing)


def moe_align_block_size(topk_ids: torch.Tensor, num_experts: int, block_m: int = BLOCK_M) -> BlockAlignment:
    flat = topk_ids.reshape(-1).long()
    num_pairs = flat.numel()
    counts = torch.zeros(num_experts, dtype=torch.int64, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))  # bincount's size would need a host read
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = torch.cumsum(padded, 0)
    order = torch.argsort(flat, stable=True)
    experts = flat[order]
    rank = torch.arange(num_pairs, device=flat.device) - (torch.cumsum(counts, 0) - counts)[experts]
    # At most min(E, pairs) experts have tokens, each padding fewer than block_m rows.
    num_blocks = triton.cdiv(num_pairs + min(num_experts, num_pairs) * (block_m - 1), block_m)
    sorted_pairs = torch.full((num_blocks * block_m,), num_pairs, dtype=torch.int64, device=flat.device)
    sorted_pairs[(padded_end - padded)[experts] + rank] = order
    block_starts = torch.arange(num_blocks, device=flat.device) * block_m
    block_experts = torch.searchsorted(padded_end, block_starts, right=True).clamp_(max=num_experts - 1)
    return BlockAlignment(sorted_pairs, block_experts, padded_end[-1:])


@triton.jit
def _gate_up_kernel(
    hidden,
    w13,
    sorted_pairs,
    block_experts,
    num_padded,
    act,
    num_pairs,
    top_k,
    N,
    K,
    stride_h,
    stride_we,
    stride_wn,
    stride_act,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
):
    pid_m = tl.program_id(0)
    if pid_m * BLOCK_M < tl.load(num_padded):
        pairs = tl.load(sorted_pairs + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
        valid = pairs < num_pairs
        tokens = pairs // top_k
        expert = tl.load(block_experts + pid_m)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < N
        w_base = w13 + expert * stride_we
        acc_gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < K
            a = tl.load(
                hidden + tokens[:, None] * stride_h + ks[None, :], mask=valid[:, None] & k_ok[None, :], other=0.0
            )
            w_mask = k_ok[:, None] & col_ok[None, :]
            gate = tl.load(w_base + cols[None, :] * stride_wn + ks[:, None], mask=w_mask, other=0.0)
            up = tl.load(w_base + (cols[None, :] + N) * stride_wn + ks[:, None], mask=w_mask, other=0.0)
            acc_gate = tl.dot(a, gate, acc_gate, input_precision=PRECISION)
            acc_up = tl.dot(a, up, acc_up, input_precision=PRECISION)
        y = acc_gate / (1.0 + tl.exp(-acc_gate)) * acc_up
        out_ptrs = act + pairs[:, None] * stride_act + cols[None, :]
        tl.store(out_ptrs, y.to(act.dtype.element_ty), mask=valid[:, None] & col_ok[None, :])


@triton.jit
def _down_kernel(
    act,
    w2,
    sorted_pairs,
    block_experts,
    num_padded,
    topk_weights,
    out,
    num_pairs,
    N,
    K,
    stride_act,
    stride_we,
    stride_wn,
    stride_out,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
):
    pid_m = tl.program_id(0)
    if pid_m * BLOCK_M < tl.load(num_padded):
        pairs = tl.load(sorted_pairs + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
        valid = pairs < num_pairs
        expert = tl.load(block_experts + pid_m)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < N
        w_base = w2 + expert * stride_we
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < K
            a = tl.load(act + pairs[:, None] * stride_act + ks[None, :], mask=valid[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(
                w_base + cols[None, :] * stride_wn + ks[:, None], mask=k_ok[:, None] & col_ok[None, :], other=0.0
            )
            acc = tl.dot(a, w, acc, input_precision=PRECISION)
        weight = tl.load(topk_weights + pairs, mask=valid, other=0.0)
        acc = acc * weight[:, None]
        out_ptrs = out + pairs[:, None] * stride_out + cols[None, :]
        tl.store(out_ptrs, acc.to(out.dtype.element_ty), mask=valid[:, None] & col_ok[None, :])


@dataclasses.dataclass(frozen=True)
class TileConfig:
    """Tile sizes of both kernels: rows per expert block, output columns and the reduction step."""

    block_m: int = BLOCK_M
    block_n: int = 64
    block_k: int = 64
    num_warps: int = 4
    num_stages: int = 2


def fused_experts(
    hidden: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    tiles: TileConfig | None = None,
) -> torch.Tensor:
    """hidden [T, H]; w13 [E, 2 * I, H] (gate rows, then up rows); w2 [E, H, I]; topk_weights and
    topk_ids [T, k]. Returns [T, H] in hidden's dtype: sum over slots of weight * expert(token)."""
    num_tokens, top_k = topk_ids.shape
    num_experts, hidden_size, inter = w2.shape
    if w13.shape != (num_experts, 2 * inter, hidden_size) or hidden.shape != (num_tokens, hidden_size):
        raise ValueError(
            f"shapes do not fit: hidden {tuple(hidden.shape)}, w13 {tuple(w13.shape)}, w2 {tuple(w2.shape)}"
        )
    hidden, w13, w2 = hidden.contiguous(), w13.contiguous(), w2.contiguous()
    num_pairs = num_tokens * top_k
    per_pair = hidden.new_empty(num_pairs, hidden_size)
    if num_pairs == 0:
        return per_pair
    tiles = tiles or TileConfig()
    alignment = moe_align_block_size(topk_ids, num_experts, tiles.block_m)
    act = hidden.new_empty(num_pairs, inter)
    weights = topk_weights.reshape(-1).float().contiguous()
    num_blocks = alignment.block_experts.numel()
    precision = dot_precision(hidden.dtype)
    block_n, block_k = tiles.block_n, tiles.block_k
    launch = dict(BLOCK_M=tiles.block_m, BLOCK_N=block_n, BLOCK_K=block_k, PRECISION=precision)
    launch.update(num_warps=tiles.num_warps, num_stages=tiles.num_stages)
    _gate_up_kernel[(num_blocks, triton.cdiv(inter, block_n))](
        hidden, w13, alignment.sorted_pairs, alignment.block_experts, alignment.num_padded, act,
        num_pairs, top_k, inter, hidden_size, hidden.stride(0), w13.stride(0), w13.stride(1), act.stride(0), **launch,
    )  # fmt: skip
    _down_kernel[(num_blocks, triton.cdiv(hidden_size, block_n))](
        act, w2, alignment.sorted_pairs, alignment.block_experts, alignment.num_padded, weights, per_pair,
        num_pairs, hidden_size, inter, act.stride(0), w2.stride(0), w2.stride(1), per_pair.stride(0), **launch,
    )  # fmt: skip
    return per_pair.view(num_tokens, top_k, hidden_size).sum(dim=1)


def fused_experts_ref(
    hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
) -> torch.Tensor:
    """Slot by slot with each token's expert weights gathered (memory grows with tokens x top_k:
    for tests), in float32."""
    inter = w2.shape[-1]
    x = hidden.float()
    out = torch.zeros_like(x)
    for slot in range(topk_ids.shape[1]):
        ids = topk_ids[:, slot]
        gate_up = torch.einsum("th,tnh->tn", x, w13[ids].float())
        act = torch.nn.functional.silu(gate_up[:, :inter]) * gate_up[:, inter:]
        out += topk_weights[:, slot, None].float() * torch.einsum("ti,thi->th", act, w2[ids].float())
    return out.to(hidden.dtype)
