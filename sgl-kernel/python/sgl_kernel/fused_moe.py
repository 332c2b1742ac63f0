"""The routed experts of a MoE layer as two grouped GEMMs over the experts that received tokens.

Routing (softmax, top k, renormalising) is one kernel (`route`). The (token, slot) pairs the router
chose are then sorted by expert in one more (`moe_align_block_size`: a decode step at batch 1 spent
more time in the dozen small torch kernels this replaced than in its experts), each expert's run
padded to a multiple of BLOCK_M, so a block of rows belongs to one expert. Kernel 1
multiplies a block's tokens by that expert's gate and up rows and stores silu(gate) * up; kernel 2
multiplies those by the expert's down projection and by the router's weight. The top-k weighted
sum is the sum over each token's slots at the end. Blocks past the routed rows do nothing, so an
expert no token goes to is never read; every size is fixed by the token count (CUDA graphs).

Block-wise FP8 experts (`w13_scale`, `w2_scale` given; the FP8 constexpr, so the bf16 kernels
compile as before): e4m3 weights with a float32 scale per 128 x 128 block. Each K step is one
128-wide group: each GEMM's input (the hidden states, then the SwiGLU output as stored) is quantized
per row and group first, once (fp8_gemm.quantize_groups: amax / 448, as fp8_reference), then one fp8
dot per step, its partial product scaled by the rows' and the weight block's scales before it is
added in fp32.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from sgl_kernel._interpreter import fix_interpreter
from sgl_kernel.fp8_gemm import quantize_groups
from sgl_kernel.fp8_reference import FP8, GROUP
from sgl_kernel.paged_kv import dot_precision

fix_interpreter()

BLOCK_M = 16


@dataclasses.dataclass(frozen=True)
class BlockAlignment:
    """The pairs (flat index token * top_k + slot) sorted by expert, each expert's run padded to a
    multiple of the block size with the index num_pairs (no pair); all on the device."""

    sorted_pairs: torch.Tensor  # [num_blocks * block_m] int32
    block_experts: torch.Tensor  # [num_blocks] int32: the expert of each block
    num_padded: torch.Tensor  # [1] int32: rows in use (blocks from num_padded / block_m on do nothing)


@triton.jit
def _route_kernel(
    logits,
    weights,
    ids,
    num_experts,
    stride_l,
    TOP_K: tl.constexpr,
    RENORM: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_E: tl.constexpr,
):
    """One token per program: softmax over its router logits in float32, the top k by repeated
    argmax (ties to the lower expert id, as torch.topk), renormalised if asked."""
    row = tl.program_id(0).to(tl.int64)
    experts = tl.arange(0, BLOCK_E)
    x = tl.load(logits + row * stride_l + experts, mask=experts < num_experts, other=float("-inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=0))
    probs = tl.where(experts < num_experts, e / tl.sum(e, axis=0), -1.0)
    slots = tl.arange(0, BLOCK_K)
    top_w = tl.zeros((BLOCK_K,), dtype=tl.float32)
    top_i = tl.zeros((BLOCK_K,), dtype=tl.int32)
    for slot in tl.static_range(TOP_K):
        best = tl.argmax(probs, axis=0)
        top_w = tl.where(slots == slot, tl.max(probs, axis=0), top_w)
        top_i = tl.where(slots == slot, best, top_i)
        probs = tl.where(experts == best, -2.0, probs)
    if RENORM:
        top_w = top_w / tl.sum(top_w, axis=0)
    tl.store(weights + row * TOP_K + slots, top_w, mask=slots < TOP_K)
    tl.store(ids + row * TOP_K + slots, top_i, mask=slots < TOP_K)


def route(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """select_experts in one kernel: (weights [T, k] float32, ids [T, k] int32), descending weight."""
    num_tokens, num_experts = router_logits.shape
    weights = torch.empty(num_tokens, top_k, dtype=torch.float32, device=router_logits.device)
    ids = torch.empty(num_tokens, top_k, dtype=torch.int32, device=router_logits.device)
    if num_tokens:
        _route_kernel[(num_tokens,)](
            router_logits, weights, ids, num_experts, router_logits.stride(0), TOP_K=top_k, RENORM=renormalize,
            BLOCK_K=triton.next_power_of_2(top_k), BLOCK_E=triton.next_power_of_2(num_experts),
        )  # fmt: skip
    return weights, ids


@triton.jit
def _align_kernel(
    topk_ids,
    sorted_pairs,
    block_experts,
    num_padded,
    num_pairs,
    num_experts,
    num_blocks,
    BLOCK_M: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_E: tl.constexpr,
):
    """One program: each expert's pair count, the padded runs' starts, every row set to padding, then
    every pair's row (its expert's start, plus the pairs of that expert before it: stable order) and
    each block's expert. Counting runs through one-hot [BLOCK_P, BLOCK_E] tiles in registers: no
    sort, no atomics."""
    experts = tl.arange(0, BLOCK_E)
    counts = tl.zeros((BLOCK_E,), dtype=tl.int32)
    for p0 in range(0, num_pairs, BLOCK_P):
        pairs = p0 + tl.arange(0, BLOCK_P)
        ids = tl.load(topk_ids + pairs, mask=pairs < num_pairs, other=-1)
        counts += tl.sum((ids[:, None] == experts[None, :]).to(tl.int32), axis=0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    padded_end = tl.cumsum(padded, axis=0)
    seen = padded_end - padded  # the next free row of each expert's run
    lanes = tl.arange(0, BLOCK_P)
    # Every row starts as padding (num_pairs), written here rather than by a fill launch before.
    for r0 in range(0, num_blocks * BLOCK_M, BLOCK_P):
        rows = r0 + lanes
        tl.store(sorted_pairs + rows, tl.zeros((BLOCK_P,), tl.int32) + num_pairs, mask=rows < num_blocks * BLOCK_M)
    tl.debug_barrier()  # the padding lands before any thread writes a pair over it
    for p0 in range(0, num_pairs, BLOCK_P):
        pairs = p0 + lanes
        ok = pairs < num_pairs
        ids = tl.load(topk_ids + pairs, mask=ok, other=-1)
        onehot = (ids[:, None] == experts[None, :]).to(tl.int32)
        base = tl.sum(onehot * seen[None, :], axis=1)
        earlier = ((ids[:, None] == ids[None, :]) & (lanes[None, :] < lanes[:, None])).to(tl.int32)
        tl.store(sorted_pairs + base + tl.sum(earlier, axis=1), pairs, mask=ok)
        seen += tl.sum(onehot, axis=0)
    in_use = tl.sum(padded, axis=0)
    tl.store(num_padded, in_use)
    live = experts < num_experts
    for b0 in range(0, num_blocks, BLOCK_P):
        blocks = b0 + lanes
        before = (padded_end[None, :] <= blocks[:, None] * BLOCK_M) & live[None, :]
        expert = tl.minimum(tl.sum(before.to(tl.int32), axis=1), num_experts - 1)
        tl.store(block_experts + blocks, expert, mask=blocks < num_blocks)


# _align_kernel is one program, so its time grows with the pairs: at decode sizes it costs a few us
# where the sort below cost ~30 (batch 1 to 64, H100), but prefill passes of Qwen3-30B-A3B took 9%
# longer with it at 4,096 tokens (32K pairs) and 14% at 32,768. Past this many pairs the sort does it.
ALIGN_KERNEL_MAX_PAIRS = 4096


def moe_align_block_size(topk_ids: torch.Tensor, num_experts: int, block_m: int = BLOCK_M) -> BlockAlignment:
    num_pairs = topk_ids.numel()
    # At most min(E, pairs) experts have tokens, each padding fewer than block_m rows.
    num_blocks = triton.cdiv(num_pairs + min(num_experts, num_pairs) * (block_m - 1), block_m)
    if num_pairs > ALIGN_KERNEL_MAX_PAIRS:
        return _align_by_sort(topk_ids.reshape(-1).long(), num_experts, block_m, num_blocks)
    flat = topk_ids.reshape(-1).to(torch.int32)
    sorted_pairs = torch.empty(num_blocks * block_m, dtype=torch.int32, device=flat.device)  # the kernel pads
    block_experts = torch.empty(num_blocks, dtype=torch.int32, device=flat.device)
    num_padded = torch.empty(1, dtype=torch.int32, device=flat.device)
    block_e = triton.next_power_of_2(num_experts)
    block_p = max(16, min(128, 8192 // block_e, triton.next_power_of_2(num_pairs)))
    _align_kernel[(1,)](
        flat, sorted_pairs, block_experts, num_padded, num_pairs, num_experts, num_blocks,
        BLOCK_M=block_m, BLOCK_P=block_p, BLOCK_E=block_e, num_warps=8 if block_p * block_e >= 8192 else 4,
    )  # fmt: skip
    return BlockAlignment(sorted_pairs, block_experts, num_padded)


def _align_by_sort(flat: torch.Tensor, num_experts: int, block_m: int, num_blocks: int) -> BlockAlignment:
    """moe_align_block_size in torch ops: a stable sort of the pairs by expert (no host reads)."""
    num_pairs = flat.numel()
    counts = torch.zeros(num_experts, dtype=torch.int64, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))  # bincount's size would need a host read
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = torch.cumsum(padded, 0)
    order = torch.argsort(flat, stable=True)
    experts = flat[order]
    rank = torch.arange(num_pairs, device=flat.device) - (torch.cumsum(counts, 0) - counts)[experts]
    sorted_pairs = torch.full((num_blocks * block_m,), num_pairs, dtype=torch.int32, device=flat.device)
    sorted_pairs[(padded_end - padded)[experts] + rank] = order.to(torch.int32)
    block_starts = torch.arange(num_blocks, device=flat.device) * block_m
    block_experts = torch.searchsorted(padded_end, block_starts, right=True).clamp_(max=num_experts - 1)
    return BlockAlignment(sorted_pairs, block_experts.to(torch.int32), padded_end[-1:].to(torch.int32))


@triton.jit
def _fp8_step(aq, a_scale, w_ptrs, w_mask, w_scale):
    """One 128-wide K step of an FP8 product: the quantized activations times the e4m3 weight tile
    [128, N] in fp32, scaled by the rows' scales and the weight's block scales [N]."""
    w = tl.load(w_ptrs, mask=w_mask, other=0.0)
    return tl.dot(aq, w) * a_scale[:, None] * w_scale[None, :]


@triton.jit
def _gate_up_kernel(
    hidden,
    hidden_scale,
    w13,
    w13_scale,
    sorted_pairs,
    block_experts,
    num_padded,
    act,
    num_pairs,
    top_k,
    N,
    K,
    stride_h,
    stride_hs,
    stride_we,
    stride_wn,
    stride_act,
    stride_se,
    stride_sn,
    up_scale_row,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
    FP8: tl.constexpr,
):
    """FP8: hidden is e4m3 with hidden_scale [T, ceil(K / 128)] (quantize_groups); w13_scale
    [E, 2 * ceil(N / 128), ceil(K / 128)], the gate's block rows, then the up's from `up_scale_row`."""
    pid_m = tl.program_id(0)
    if pid_m * BLOCK_M < tl.load(num_padded):
        pairs = tl.load(sorted_pairs + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        valid = pairs < num_pairs
        tokens = pairs // top_k
        expert = tl.load(block_experts + pid_m).to(tl.int64)
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
            gate_ptrs = w_base + cols[None, :] * stride_wn + ks[:, None]
            up_ptrs = w_base + (cols[None, :] + N) * stride_wn + ks[:, None]
            if FP8:
                s_base = w13_scale + expert * stride_se + k0 // BLOCK_K
                gate_s = tl.load(s_base + (cols // BLOCK_K) * stride_sn, mask=col_ok, other=0.0)
                up_s = tl.load(s_base + (up_scale_row + cols // BLOCK_K) * stride_sn, mask=col_ok, other=0.0)
                a_scale = tl.load(hidden_scale + tokens * stride_hs + k0 // BLOCK_K, mask=valid, other=0.0)
                acc_gate += _fp8_step(a, a_scale, gate_ptrs, w_mask, gate_s)
                acc_up += _fp8_step(a, a_scale, up_ptrs, w_mask, up_s)
            else:
                gate = tl.load(gate_ptrs, mask=w_mask, other=0.0)
                up = tl.load(up_ptrs, mask=w_mask, other=0.0)
                acc_gate = tl.dot(a, gate, acc_gate, input_precision=PRECISION)
                acc_up = tl.dot(a, up, acc_up, input_precision=PRECISION)
        y = acc_gate / (1.0 + tl.exp(-acc_gate)) * acc_up
        out_ptrs = act + pairs[:, None] * stride_act + cols[None, :]
        tl.store(out_ptrs, y.to(act.dtype.element_ty), mask=valid[:, None] & col_ok[None, :])


@triton.jit
def _down_kernel(
    act,
    act_scale,
    w2,
    w2_scale,
    sorted_pairs,
    block_experts,
    num_padded,
    topk_weights,
    out,
    num_pairs,
    N,
    K,
    stride_act,
    stride_as,
    stride_we,
    stride_wn,
    stride_out,
    stride_se,
    stride_sn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
    FP8: tl.constexpr,
):
    """FP8: act is e4m3 with act_scale [pairs, ceil(K / 128)]; w2_scale [E, ceil(N / 128), ceil(K / 128)]."""
    pid_m = tl.program_id(0)
    if pid_m * BLOCK_M < tl.load(num_padded):
        pairs = tl.load(sorted_pairs + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        valid = pairs < num_pairs
        expert = tl.load(block_experts + pid_m).to(tl.int64)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < N
        w_base = w2 + expert * stride_we
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < K
            a = tl.load(act + pairs[:, None] * stride_act + ks[None, :], mask=valid[:, None] & k_ok[None, :], other=0.0)
            w_ptrs = w_base + cols[None, :] * stride_wn + ks[:, None]
            w_mask = k_ok[:, None] & col_ok[None, :]
            if FP8:
                s_ptrs = w2_scale + expert * stride_se + (cols // BLOCK_K) * stride_sn + k0 // BLOCK_K
                a_scale = tl.load(act_scale + pairs * stride_as + k0 // BLOCK_K, mask=valid, other=0.0)
                acc += _fp8_step(a, a_scale, w_ptrs, w_mask, tl.load(s_ptrs, mask=col_ok, other=0.0))
            else:
                acc = tl.dot(a, tl.load(w_ptrs, mask=w_mask, other=0.0), acc, input_precision=PRECISION)
        weight = tl.load(topk_weights + pairs, mask=valid, other=0.0)
        acc = acc * weight[:, None]
        out_ptrs = out + pairs[:, None] * stride_out + cols[None, :]
        tl.store(out_ptrs, acc.to(out.dtype.element_ty), mask=valid[:, None] & col_ok[None, :])


@dataclasses.dataclass(frozen=True)
class TileConfig:
    """Tile sizes of both kernels: rows per expert block, output columns and the reduction step."""

    block_m: int = BLOCK_M
    block_n: int = 64
    block_k: int = 128
    num_warps: int = 4
    num_stages: int = 3


def fused_experts(
    hidden: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    tiles: TileConfig | None = None,
    *,
    w13_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """hidden [T, H]; w13 [E, 2 * I, H] (gate rows, then up rows); w2 [E, H, I]; topk_weights and
    topk_ids [T, k]. Returns [T, H] in hidden's dtype: sum over slots of weight * expert(token).
    Block-wise FP8 experts: w13 and w2 e4m3 with w13_scale [E, 2 * ceil(I/128), ceil(H/128)] (the
    gate's block rows, then the up's) and w2_scale [E, ceil(H/128), ceil(I/128)] float32."""
    num_tokens, top_k = topk_ids.shape
    num_experts, hidden_size, inter = w2.shape
    if w13.shape != (num_experts, 2 * inter, hidden_size) or hidden.shape != (num_tokens, hidden_size):
        raise ValueError(
            f"shapes do not fit: hidden {tuple(hidden.shape)}, w13 {tuple(w13.shape)}, w2 {tuple(w2.shape)}"
        )
    fp8 = _check_block_scales(w13, w2, w13_scale, w2_scale)
    hidden, w13, w2 = hidden.contiguous(), w13.contiguous(), w2.contiguous()
    num_pairs = num_tokens * top_k
    per_pair = hidden.new_empty(num_pairs, hidden_size)
    if num_pairs == 0:
        return per_pair
    # Measured on an H100 at Qwen3-30B-A3B's experts (128 x 768 x 2048, top 8): within 2% of the
    # best tile set found from 1 to 256 tokens; 32-row blocks pay from about 1,000 routed pairs.
    tiles = tiles or (TileConfig(block_m=32) if num_pairs >= 1024 else TileConfig())
    if fp8 and tiles.block_k != GROUP:
        raise ValueError(f"FP8 experts step K by one {GROUP}-wide scale group; got block_k {tiles.block_k}")
    alignment = moe_align_block_size(topk_ids, num_experts, tiles.block_m)
    act = hidden.new_empty(num_pairs, inter)
    weights = topk_weights.reshape(-1).float().contiguous()
    num_blocks = alignment.block_experts.numel()
    precision = dot_precision(hidden.dtype)
    block_n, block_k = tiles.block_n, tiles.block_k
    launch = dict(BLOCK_M=tiles.block_m, BLOCK_N=block_n, BLOCK_K=block_k, PRECISION=precision, FP8=fp8)
    launch.update(num_warps=tiles.num_warps, num_stages=tiles.num_stages)
    s13, s2 = (w13_scale.contiguous(), w2_scale.contiguous()) if fp8 else (weights, weights)  # unread unless FP8
    s13_strides = (s13.stride(0), s13.stride(1)) if fp8 else (0, 0)
    s2_strides = (s2.stride(0), s2.stride(1)) if fp8 else (0, 0)
    # FP8: each GEMM's input quantized per 128-feature group once, not in every column tile.
    a, a_scale = quantize_groups(hidden) if fp8 else (hidden, weights)
    _gate_up_kernel[(num_blocks, triton.cdiv(inter, block_n))](
        a, a_scale, w13, s13, alignment.sorted_pairs, alignment.block_experts, alignment.num_padded, act,
        num_pairs, top_k, inter, hidden_size, a.stride(0), a_scale.stride(0), w13.stride(0), w13.stride(1),
        act.stride(0), *s13_strides, triton.cdiv(inter, GROUP), **launch,
    )  # fmt: skip
    a, a_scale = quantize_groups(act) if fp8 else (act, weights)
    _down_kernel[(num_blocks, triton.cdiv(hidden_size, block_n))](
        a, a_scale, w2, s2, alignment.sorted_pairs, alignment.block_experts, alignment.num_padded, weights,
        per_pair, num_pairs, hidden_size, inter, a.stride(0), a_scale.stride(0), w2.stride(0), w2.stride(1),
        per_pair.stride(0), *s2_strides, **launch,
    )  # fmt: skip
    return per_pair.view(num_tokens, top_k, hidden_size).sum(dim=1)


def _check_block_scales(w13, w2, w13_scale, w2_scale) -> bool:
    """Whether the experts are block-wise FP8 (both scales given, for e4m3 weights of their shapes)."""
    if w13_scale is None and w2_scale is None:
        return False
    num_experts, hidden_size, inter = w2.shape
    gate_blocks, hidden_blocks = triton.cdiv(inter, GROUP), triton.cdiv(hidden_size, GROUP)
    shapes = {
        "w13_scale": (w13_scale, (num_experts, 2 * gate_blocks, hidden_blocks)),
        "w2_scale": (w2_scale, (num_experts, hidden_blocks, gate_blocks)),
    }
    for name, (scale, shape) in shapes.items():
        if scale is None or tuple(scale.shape) != shape:
            got = None if scale is None else tuple(scale.shape)
            raise ValueError(f"{name} must be {shape} for w13 {tuple(w13.shape)}, w2 {tuple(w2.shape)}; got {got}")
    if w13.dtype != FP8 or w2.dtype != FP8:
        raise ValueError(f"block-scaled experts must be {FP8}; got {w13.dtype} and {w2.dtype}")
    return True


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
