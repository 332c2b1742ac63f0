"""Paged decode attention, split-K ("flash decoding"): one new query token per request
attends to its whole KV history, gathered from the KV pool through `req_to_token`.

Stage 1 splits each sequence into `num_kv_splits` contiguous chunks and computes, per chunk,
the softmax-weighted sum of V and the chunk's log-sum-exp; stage 2 merges the chunks. The
launch grid depends only on shapes and `seq_lens` is read inside the kernels, so a CUDA
graph captured once replays for any lengths.

An FP8 KV cache (sgl_kernel.paged_kv) is read as it is stored: tiles widened to q's dtype,
k_scale folded into the softmax scale and v_scale applied to each split's output.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sgl_kernel._interpreter import fix_interpreter
from sgl_kernel.paged_kv import LOG2E, check_paged_attention_args, dot_precision, gathered_kv, is_fp8_kv

fix_interpreter()


@triton.jit
def _split_range(seq_len, split, NUM_SPLITS: tl.constexpr, BLOCK: tl.constexpr):
    """[start, end) of the KV positions that `split` covers (empty when start >= end)."""
    chunk = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK) * BLOCK
    start = split * chunk
    return start, tl.minimum(start + chunk, seq_len)


@triton.jit
def _decode_split_kernel(
    q,
    k_buffer,
    v_buffer,
    workspace,
    req_to_token,
    req_pool_indices,
    seq_lens,
    qk_scale,  # sm_scale * k_scale * log2(e)
    v_scale,
    stride_qb,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_wb,
    stride_wh,
    stride_ws,
    stride_req,
    GROUP: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK: tl.constexpr,
    PRECISION: tl.constexpr,
    KV_FP8: tl.constexpr,
):
    """One program: one request, one KV head with the GROUP query heads that share it, one split."""
    b, kv_head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    seq_len = tl.load(seq_lens + b).to(tl.int32)
    row = tl.load(req_pool_indices + b).to(tl.int64)
    start, end = _split_range(seq_len, split, NUM_SPLITS, BLOCK)

    heads = kv_head * GROUP + tl.arange(0, BLOCK_H)
    head_ok = tl.arange(0, BLOCK_H) < GROUP
    dims = tl.arange(0, HEAD_DIM)
    q_tile = tl.load(q + b * stride_qb + heads[:, None] * stride_qh + dims[None, :], mask=head_ok[:, None], other=0.0)

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, HEAD_DIM], tl.float32)
    for block_start in range(start, end, BLOCK):
        pos = block_start + tl.arange(0, BLOCK)
        pos_ok = pos < end
        slots = tl.load(req_to_token + row * stride_req + pos, mask=pos_ok, other=0).to(tl.int64)
        k = tl.load(
            k_buffer + slots[:, None] * stride_kt + kv_head * stride_kh + dims[None, :], mask=pos_ok[:, None], other=0.0
        ).to(q_tile.dtype)
        scores = tl.dot(q_tile, tl.trans(k), input_precision=PRECISION) * qk_scale
        scores = tl.where(pos_ok[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        p = tl.exp2(scores - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        v = tl.load(
            v_buffer + slots[:, None] * stride_vt + kv_head * stride_vh + dims[None, :], mask=pos_ok[:, None], other=0.0
        ).to(q_tile.dtype)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new

    # An empty split stores nothing: stage 2 derives from seq_len which splits exist.
    store_ok = head_ok & (start < end)
    l_i = tl.where(store_ok, l_i, 1.0)
    if KV_FP8:
        acc = acc * v_scale
    part = workspace + b * stride_wb + heads * stride_wh + split * stride_ws
    tl.store(part[:, None] + dims[None, :], acc / l_i[:, None], mask=store_ok[:, None])
    tl.store(part + HEAD_DIM, m_i + tl.log2(l_i), mask=store_ok)


@triton.jit
def _decode_merge_kernel(
    workspace,
    o,
    seq_lens,
    stride_wb,
    stride_wh,
    stride_ws,
    stride_ob,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    SPLITS_POW2: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """One program: one request, one query head; weighs each split by its share of the softmax."""
    b, head = tl.program_id(0), tl.program_id(1)
    seq_len = tl.load(seq_lens + b).to(tl.int32)
    splits = tl.arange(0, SPLITS_POW2)
    start, end = _split_range(seq_len, splits, NUM_SPLITS, BLOCK)
    split_ok = (splits < NUM_SPLITS) & (start < end)
    dims = tl.arange(0, HEAD_DIM)

    part = workspace + b * stride_wb + head * stride_wh + splits * stride_ws
    lse = tl.load(part + HEAD_DIM, mask=split_ok, other=float("-inf"))
    values = tl.load(part[:, None] + dims[None, :], mask=split_ok[:, None], other=0.0)
    # With no split at all (seq_len 0: CUDA-graph padding) the output is zeros, not NaN.
    lse_max = tl.maximum(tl.max(lse, 0), -1e30)
    weights = tl.where(split_ok, tl.exp2(lse - lse_max), 0.0)
    out = tl.sum(values * weights[:, None], 0) / tl.maximum(tl.sum(weights, 0), 1e-30)
    tl.store(o + b * stride_ob + head * stride_oh + dims, out.to(o.dtype.element_ty))


def decode_workspace(bs: int, num_heads: int, head_dim: int, num_kv_splits: int, device) -> torch.Tensor:
    """Stage 1's scratch: per split, D partial outputs then the split's log-sum-exp (base 2)."""
    return torch.empty((bs, num_heads, num_kv_splits, head_dim + 1), dtype=torch.float32, device=device)


def decode_attention_fwd(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    o: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    num_kv_splits: int,
    workspace: torch.Tensor | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """q, o: [bs, H, D]; k_buffer, v_buffer: [slots, KV, D] in q's dtype or FP8 (real value =
    stored x k_scale / v_scale); writes o and returns it."""
    bs, num_heads, head_dim = q.shape
    num_kv_heads = k_buffer.shape[1]
    _check_args(q, o, k_buffer, v_buffer, req_to_token, num_kv_splits)
    if workspace is None:
        workspace = decode_workspace(bs, num_heads, head_dim, num_kv_splits, q.device)
    if workspace.shape != (bs, num_heads, num_kv_splits, head_dim + 1) or workspace.dtype != torch.float32:
        raise ValueError(f"workspace {tuple(workspace.shape)} {workspace.dtype} is not decode_workspace's")
    if bs == 0:
        return o
    group, block_n = num_heads // num_kv_heads, kv_block_size(head_dim, q.dtype)
    _decode_split_kernel[(bs, num_kv_heads, num_kv_splits)](
        q,
        k_buffer,
        v_buffer,
        workspace,
        req_to_token,
        req_pool_indices,
        seq_lens,
        sm_scale * k_scale * LOG2E,
        v_scale,
        q.stride(0),
        q.stride(1),
        k_buffer.stride(0),
        k_buffer.stride(1),
        v_buffer.stride(0),
        v_buffer.stride(1),
        workspace.stride(0),
        workspace.stride(1),
        workspace.stride(2),
        req_to_token.stride(0),
        GROUP=group,
        BLOCK_H=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim,
        NUM_SPLITS=num_kv_splits,
        BLOCK=block_n,
        PRECISION=dot_precision(q.dtype),
        KV_FP8=is_fp8_kv(k_buffer),
        num_warps=4,
        num_stages=2,
    )
    _decode_merge_kernel[(bs, num_heads)](
        workspace,
        o,
        seq_lens,
        workspace.stride(0),
        workspace.stride(1),
        workspace.stride(2),
        o.stride(0),
        o.stride(1),
        HEAD_DIM=head_dim,
        NUM_SPLITS=num_kv_splits,
        SPLITS_POW2=triton.next_power_of_2(num_kv_splits),
        BLOCK=block_n,
        num_warps=4,
    )
    return o


def kv_block_size(head_dim: int, dtype: torch.dtype) -> int:
    """KV positions per inner step (a split's chunk is a multiple of it): 64 for bf16/fp16 at
    head_dim 128, fewer as a row of K grows, so that double-buffered K and V tiles fit in
    shared memory."""
    row_bytes = head_dim * dtype.itemsize
    return max(16, min(64, 16384 // row_bytes))


def _check_args(q, o, k_buffer, v_buffer, req_to_token, num_kv_splits: int) -> None:
    check_paged_attention_args(q, o, k_buffer, v_buffer, req_to_token)
    if num_kv_splits < 1:
        raise ValueError(f"num_kv_splits must be >= 1, got {num_kv_splits}")
    if q.shape[1] // k_buffer.shape[1] > 64:
        raise ValueError(f"a GQA group of {q.shape[1] // k_buffer.shape[1]} query heads per KV head is over 64")


def decode_attention_ref(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    o: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    num_kv_splits: int = 1,
    workspace: torch.Tensor | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """Torch reference, one request at a time in float32 on the dequantized K/V; num_kv_splits
    and workspace are unused."""
    group = q.shape[1] // k_buffer.shape[1]
    for i in range(q.shape[0]):
        row, seq_len = req_pool_indices[i], int(seq_lens[i])
        k, v = gathered_kv(k_buffer, v_buffer, req_to_token, row, seq_len, group, k_scale, v_scale)
        probs = (torch.einsum("hd,shd->hs", q[i].float(), k) * sm_scale).softmax(-1)
        o[i] = torch.einsum("hs,shd->hd", probs, v).nan_to_num(0.0).to(o.dtype)  # seq_len 0 -> zeros
    return o
