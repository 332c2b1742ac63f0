"""Extend attention: a run of new tokens per request attends to the request's cached prefix
(fully) and to the new tokens before it (causally), reading K/V from the pool through
`req_to_token`. Serves prefill, TARGET_VERIFY (k+1 tokens) and DRAFT_EXTEND.

The new tokens' K/V are already in the pool: query j of a request with `prefix` cached
positions sits at position prefix + j and sees positions [0, prefix + j].
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sgl_kernel._interpreter import fix_interpreter
from sgl_kernel.paged_kv import LOG2E, check_paged_attention_args, dot_precision, gathered_kv

fix_interpreter()


@triton.jit
def _extend_kernel(
    q, o, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens, extend_seq_lens, extend_start_loc,
    qk_scale,  # sm_scale * log2(e): the kernel works in base 2
    stride_qt, stride_qh, stride_ot, stride_oh, stride_kt, stride_kh, stride_vt, stride_vh, stride_req,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """One program: one request, one query head, BLOCK_M consecutive new tokens."""
    b, head, m_block = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    extend_len = tl.load(extend_seq_lens + b).to(tl.int32)
    if m_block * BLOCK_M >= extend_len:
        return
    seq_len = tl.load(seq_lens + b).to(tl.int32)
    prefix_len = seq_len - extend_len
    first_token = tl.load(extend_start_loc + b).to(tl.int64)
    row = tl.load(req_pool_indices + b).to(tl.int64)
    kv_head = head // GROUP

    rows = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < extend_len
    query_pos = prefix_len + rows
    dims = tl.arange(0, HEAD_DIM)
    tokens = first_token + rows
    q_tile = tl.load(q + tokens[:, None] * stride_qt + head * stride_qh + dims[None, :], mask=row_ok[:, None], other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    # The last row of this block sees furthest; every row sees position 0, so no row is all -inf.
    kv_end = tl.minimum(seq_len, prefix_len + (m_block + 1) * BLOCK_M)
    for block_start in range(0, kv_end, BLOCK_N):
        pos = block_start + tl.arange(0, BLOCK_N)
        pos_ok = pos < kv_end
        slots = tl.load(req_to_token + row * stride_req + pos, mask=pos_ok, other=0).to(tl.int64)
        k = tl.load(k_buffer + slots[:, None] * stride_kt + kv_head * stride_kh + dims[None, :], mask=pos_ok[:, None], other=0.0)
        scores = tl.dot(q_tile, tl.trans(k), input_precision=PRECISION) * qk_scale
        visible = pos_ok[None, :] & (pos[None, :] <= query_pos[:, None])
        scores = tl.where(visible, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        p = tl.exp2(scores - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        v = tl.load(v_buffer + slots[:, None] * stride_vt + kv_head * stride_vh + dims[None, :], mask=pos_ok[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new

    out = acc / l_i[:, None]
    tl.store(o + tokens[:, None] * stride_ot + head * stride_oh + dims[None, :], out.to(o.dtype.element_ty), mask=row_ok[:, None])


def extend_attention_fwd(
    q: torch.Tensor, o: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor,
    req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor, extend_start_loc: torch.Tensor, max_extend_len: int, sm_scale: float,
) -> torch.Tensor:
    """q, o: [num_tokens, H, D]; k_buffer, v_buffer: [slots, KV, D]; writes o and returns it.
    `max_extend_len` (a host int, at least max(extend_seq_lens)) sizes the grid."""
    num_heads, head_dim = q.shape[1], q.shape[2]
    check_paged_attention_args(q, o, k_buffer, v_buffer, req_to_token)
    bs = seq_lens.shape[0]
    if bs == 0 or max_extend_len <= 0:
        return o
    block_m, block_n = _block_sizes(head_dim, q.dtype)
    grid = (bs, num_heads, triton.cdiv(max_extend_len, block_m))
    _extend_kernel[grid](
        q, o, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens, extend_seq_lens, extend_start_loc,
        sm_scale * LOG2E,
        q.stride(0), q.stride(1), o.stride(0), o.stride(1),
        k_buffer.stride(0), k_buffer.stride(1), v_buffer.stride(0), v_buffer.stride(1), req_to_token.stride(0),
        GROUP=num_heads // k_buffer.shape[1], HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n,
        PRECISION=dot_precision(q.dtype), num_warps=4 if head_dim <= 64 else 8, num_stages=2,
    )
    return o


def _block_sizes(head_dim: int, dtype: torch.dtype) -> tuple[int, int]:
    # Keep the q, k, v tiles and the accumulator within Hopper's registers / shared memory.
    if head_dim >= 256 or (dtype == torch.float32 and head_dim >= 128):
        return 64, 32
    return 64, 64


def extend_attention_ref(
    q: torch.Tensor, o: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor,
    req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor, extend_start_loc: torch.Tensor, max_extend_len: int, sm_scale: float,
) -> torch.Tensor:
    """Torch reference, one request at a time in float32 (max_extend_len unused)."""
    group = q.shape[1] // k_buffer.shape[1]
    for i in range(seq_lens.shape[0]):
        seq_len, new_len, first = int(seq_lens[i]), int(extend_seq_lens[i]), int(extend_start_loc[i])
        k, v = gathered_kv(k_buffer, v_buffer, req_to_token, req_pool_indices[i], seq_len, group)
        scores = torch.einsum("thd,shd->hts", q[first : first + new_len].float(), k) * sm_scale
        query_pos = torch.arange(seq_len - new_len, seq_len, device=q.device)
        visible = torch.arange(seq_len, device=q.device)[None, :] <= query_pos[:, None]
        probs = scores.masked_fill(~visible, float("-inf")).softmax(-1)
        o[first : first + new_len] = torch.einsum("hts,shd->thd", probs, v).to(o.dtype)
    return o
