"""What the decode and extend attention kernels share: the checks of the paged KV layout
(per layer K/V [slots, KV, D], req_to_token [rows, max_len]), tl.dot's precision, and the
references' gather.

K/V are in q's dtype, or FP8 (e4m3 / e5m2) with a per-tensor k_scale and v_scale (stored value x
scale = real value). FP8 tiles are widened to q's dtype on load, exactly (both FP8 formats fit
in bf16, fp16 and fp32), and the scales fold into the softmax scale (K) and the output (V)."""

from __future__ import annotations

import torch

LOG2E = 1.4426950408889634  # the kernels exponentiate in base 2: exp(x) = exp2(x * LOG2E)
FP8_KV_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def dot_precision(dtype: torch.dtype) -> str:
    """tl.dot's input_precision: full fp32 products for fp32 inputs, since TF32 (Triton's
    default) would miss a 1e-4 tolerance; bf16 and fp16 ignore it."""
    return "ieee" if dtype == torch.float32 else "tf32"


def check_head_dim(head_dim: int) -> None:
    if head_dim < 16 or head_dim & (head_dim - 1):
        raise ValueError(f"head_dim must be a power of two >= 16, got {head_dim}")


def check_paged_attention_args(q, o, k_buffer, v_buffer, req_to_token) -> None:
    """q, o: [tokens, H, D]; k_buffer, v_buffer: [slots, KV, D] with H a multiple of KV."""
    num_heads, head_dim = q.shape[1], q.shape[2]
    check_head_dim(head_dim)
    if k_buffer.dim() != 3 or k_buffer.shape[2] != head_dim or v_buffer.shape != k_buffer.shape:
        raise ValueError(
            f"K/V buffers {tuple(k_buffer.shape)}, {tuple(v_buffer.shape)} do not match head_dim {head_dim}"
        )
    if num_heads % k_buffer.shape[1]:
        raise ValueError(f"{num_heads} query heads are not a multiple of {k_buffer.shape[1]} KV heads")
    kv_ok = k_buffer.dtype == v_buffer.dtype and k_buffer.dtype in (q.dtype, *FP8_KV_DTYPES)
    if q.dtype != o.dtype or not kv_ok or q.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(
            f"q and o must share one dtype among fp32, fp16, bf16, and K, V theirs or one FP8 format "
            f"(e4m3fn, e5m2); got {q.dtype}, {o.dtype}, {k_buffer.dtype}, {v_buffer.dtype}"
        )
    if o.shape != q.shape:
        raise ValueError(f"o {tuple(o.shape)} must match q {tuple(q.shape)}")
    if any(t.stride(-1) != 1 for t in (q, o, k_buffer, v_buffer, req_to_token)):
        raise ValueError("q, o, the K/V buffers and req_to_token need a contiguous last dimension")


def is_fp8_kv(k_buffer: torch.Tensor) -> bool:
    return k_buffer.dtype in FP8_KV_DTYPES


def gathered_kv(k_buffer, v_buffer, req_to_token, row, seq_len: int, group: int, k_scale=1.0, v_scale=1.0):
    """For the references: one request's K and V as float32 [seq_len, H, D] (dequantized:
    times their scales), KV heads repeated."""
    slots = req_to_token[row, :seq_len].long()
    k = (k_buffer[slots].float() * k_scale).repeat_interleave(group, dim=1)
    v = (v_buffer[slots].float() * v_scale).repeat_interleave(group, dim=1)
    return k, v
