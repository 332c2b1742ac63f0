"""Extend attention: a run of new tokens per request attends to the request's cached prefix
(fully) and to the new tokens before it (causally), reading K/V from the pool through
`req_to_token`. Serves prefill, TARGET_VERIFY (k+1 tokens) and DRAFT_EXTEND.

The new tokens' K/V are already in the pool: query j of a request with `prefix` cached
positions sits at position prefix + j and sees positions [0, prefix + j].

A program's query tile holds BLOCK_T tokens x the GROUP query heads that share one KV head
(GQA), so each K/V block is read once per group; short extends (verify: k+1 tokens) get a
small tile instead of a mostly empty one.

An FP8 KV cache (sgl_kernel.paged_kv) is read as it is stored: tiles widened to q's dtype,
k_scale folded into the softmax scale and v_scale applied to the output.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sgl_kernel._interpreter import fix_interpreter
from sgl_kernel.paged_kv import LOG2E, check_paged_attention_args, dot_precision, gathered_kv, is_fp8_kv

fix_interpreter()


@triton.jit
def _attend_block(
    acc,
    m_i,
    l_i,
    q_tile,
    query_pos,
    block_start,
    kv_end,
    k_buffer,
    v_buffer,
    req_to_token,
    row,
    kv_head,
    qk_scale,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_req,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
    MASKED: tl.constexpr,
):
    """One online-softmax step over KV positions [block_start, block_start + BLOCK_N).
    Unmasked blocks lie wholly before every query of the tile, so all rows see them."""
    pos = block_start + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, HEAD_DIM)
    pos_ok = pos < kv_end
    if MASKED:  # past kv_end the slot is 0, the pool's padding slot: loads stay in bounds
        slots = tl.load(req_to_token + row * stride_req + pos, mask=pos_ok, other=0).to(tl.int64)
    else:
        slots = tl.load(req_to_token + row * stride_req + pos).to(tl.int64)
    k = tl.load(k_buffer + slots[:, None] * stride_kt + kv_head * stride_kh + dims[None, :]).to(q_tile.dtype)
    v = tl.load(v_buffer + slots[:, None] * stride_vt + kv_head * stride_vh + dims[None, :]).to(q_tile.dtype)
    scores = tl.dot(q_tile, tl.trans(k), input_precision=PRECISION) * qk_scale
    if MASKED:
        visible = pos_ok[None, :] & (pos[None, :] <= query_pos[:, None])
        scores = tl.where(visible, scores, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, 1))
    p = tl.exp2(scores - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return acc, m_new, l_i * alpha + tl.sum(p, 1)


@triton.jit
def _extend_kernel(
    q,
    o,
    k_buffer,
    v_buffer,
    req_to_token,
    req_pool_indices,
    seq_lens,
    extend_seq_lens,
    extend_start_loc,
    qk_scale,  # sm_scale * k_scale * log2(e): the kernel works in base 2
    v_scale,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_req,
    GROUP: tl.constexpr,
    GROUP_POW2: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
    KV_FP8: tl.constexpr,
):
    """One program: one request, one KV head, BLOCK_T = BLOCK_M / GROUP_POW2 consecutive new
    tokens; tile row r is token r // GROUP_POW2 with query head r % GROUP_POW2 of the group."""
    BLOCK_T: tl.constexpr = BLOCK_M // GROUP_POW2
    # The last token blocks see the most keys: launch them first.
    b, kv_head, t_block = tl.program_id(0), tl.program_id(1), tl.num_programs(2) - 1 - tl.program_id(2)
    extend_len = tl.load(extend_seq_lens + b).to(tl.int32)
    if t_block * BLOCK_T >= extend_len:
        return
    seq_len = tl.load(seq_lens + b).to(tl.int32)
    prefix_len = seq_len - extend_len
    first_token = tl.load(extend_start_loc + b).to(tl.int64)
    row = tl.load(req_pool_indices + b).to(tl.int64)

    r = tl.arange(0, BLOCK_M)
    new_index = t_block * BLOCK_T + r // GROUP_POW2  # which of the request's new tokens
    in_group = r % GROUP_POW2
    row_ok = (new_index < extend_len) & (in_group < GROUP)
    query_pos = prefix_len + new_index
    dims = tl.arange(0, HEAD_DIM)
    q_rows = (first_token + new_index) * stride_qt + (kv_head * GROUP + in_group) * stride_qh
    q_tile = tl.load(q + q_rows[:, None] + dims[None, :], mask=row_ok[:, None], other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    # Positions before the tile's first token are seen by all its rows; the rest, up to what
    # its last token sees, need the causal mask. Every row sees position 0: none is all -inf.
    unmasked_end = (prefix_len + t_block * BLOCK_T) // BLOCK_N * BLOCK_N
    kv_end = tl.minimum(seq_len, prefix_len + (t_block + 1) * BLOCK_T)
    for block_start in range(0, unmasked_end, BLOCK_N):
        acc, m_i, l_i = _attend_block(
            acc,
            m_i,
            l_i,
            q_tile,
            query_pos,
            block_start,
            kv_end,
            k_buffer,
            v_buffer,
            req_to_token,
            row,
            kv_head,
            qk_scale,
            stride_kt,
            stride_kh,
            stride_vt,
            stride_vh,
            stride_req,
            HEAD_DIM,
            BLOCK_N,
            PRECISION,
            False,
        )
    for block_start in range(unmasked_end, kv_end, BLOCK_N):
        acc, m_i, l_i = _attend_block(
            acc,
            m_i,
            l_i,
            q_tile,
            query_pos,
            block_start,
            kv_end,
            k_buffer,
            v_buffer,
            req_to_token,
            row,
            kv_head,
            qk_scale,
            stride_kt,
            stride_kh,
            stride_vt,
            stride_vh,
            stride_req,
            HEAD_DIM,
            BLOCK_N,
            PRECISION,
            True,
        )

    out = acc / l_i[:, None]
    if KV_FP8:
        out = out * v_scale
    out = out.to(o.dtype.element_ty)
    o_rows = (first_token + new_index) * stride_ot + (kv_head * GROUP + in_group) * stride_oh
    tl.store(o + o_rows[:, None] + dims[None, :], out, mask=row_ok[:, None])


def extend_attention_fwd(
    q: torch.Tensor,
    o: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    max_extend_len: int,
    sm_scale: float,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """q, o: [num_tokens, H, D]; k_buffer, v_buffer: [slots, KV, D] in q's dtype or FP8 (real
    value = stored x k_scale / v_scale); writes o and returns it. `max_extend_len` (a host int,
    at least max(extend_seq_lens)) sizes the grid and the tile."""
    num_heads, head_dim = q.shape[1], q.shape[2]
    check_paged_attention_args(q, o, k_buffer, v_buffer, req_to_token)
    bs, num_kv_heads = seq_lens.shape[0], k_buffer.shape[1]
    if bs == 0 or max_extend_len <= 0:
        return o
    group = num_heads // num_kv_heads
    config = launch_config(head_dim, q.dtype, group, max_extend_len)
    tokens_per_tile = config["BLOCK_M"] // config["GROUP_POW2"]
    _extend_kernel[(bs, num_kv_heads, triton.cdiv(max_extend_len, tokens_per_tile))](
        q,
        o,
        k_buffer,
        v_buffer,
        req_to_token,
        req_pool_indices,
        seq_lens,
        extend_seq_lens,
        extend_start_loc,
        sm_scale * k_scale * LOG2E,
        v_scale,
        q.stride(0),
        q.stride(1),
        o.stride(0),
        o.stride(1),
        k_buffer.stride(0),
        k_buffer.stride(1),
        v_buffer.stride(0),
        v_buffer.stride(1),
        req_to_token.stride(0),
        GROUP=group,
        HEAD_DIM=head_dim,
        PRECISION=dot_precision(q.dtype),
        KV_FP8=is_fp8_kv(k_buffer),
        **config,
    )
    return o


def launch_config(head_dim: int, dtype: torch.dtype, group: int, max_extend_len: int) -> dict:
    """Tile sizes and warps. BLOCK_M rows (tokens x group heads) up to 128 for bf16/fp16 at
    head_dim 128 (measured best on an H200), fewer as a row grows, so that the q tile and the
    pipelined K and V tiles fit in shared memory; no more rows than the longest extend fills."""
    row_bytes = head_dim * dtype.itemsize
    if row_bytes <= 256:
        max_m, block_n = 128, 64
    elif row_bytes <= 512:
        max_m, block_n = 64, 32
    else:
        max_m, block_n = 32, 16 if row_bytes > 1024 else 32
    group_pow2 = triton.next_power_of_2(group)
    block_m = max(16, group_pow2, min(max_m, triton.next_power_of_2(max_extend_len * group_pow2)))
    return dict(BLOCK_M=block_m, BLOCK_N=block_n, GROUP_POW2=group_pow2, num_warps=4, num_stages=3)


def extend_attention_ref(
    q: torch.Tensor,
    o: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    max_extend_len: int,
    sm_scale: float,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """Torch reference, one request at a time in float32 on the dequantized K/V (max_extend_len unused)."""
    group = q.shape[1] // k_buffer.shape[1]
    for i in range(seq_lens.shape[0]):
        seq_len, new_len, first = int(seq_lens[i]), int(extend_seq_lens[i]), int(extend_start_loc[i])
        row = req_pool_indices[i]
        k, v = gathered_kv(k_buffer, v_buffer, req_to_token, row, seq_len, group, k_scale, v_scale)
        scores = torch.einsum("thd,shd->hts", q[first : first + new_len].float(), k) * sm_scale
        query_pos = torch.arange(seq_len - new_len, seq_len, device=q.device)
        visible = torch.arange(seq_len, device=q.device)[None, :] <= query_pos[:, None]
        probs = scores.masked_fill(~visible, float("-inf")).softmax(-1)
        o[first : first + new_len] = torch.einsum("hts,shd->thd", probs, v).to(o.dtype)
    return o
