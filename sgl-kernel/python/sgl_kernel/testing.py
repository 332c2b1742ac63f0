"""Helpers shared by the CPU (interpreter) and GPU kernel tests: a paged KV pool in the
engine's layout filled with random data, and the error measure and tolerances."""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Tolerances on relative_error against the float32 torch references.
TOLERANCE = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 1e-2}
# Products of e4m3 tiles on fp8 tensor cores (Hopper's), whatever the output dtype: the hardware sums
# an instruction's products at reduced precision (about 14 bits, as DeepSeek-V3's report measured).
# On an H100 at Llama-3.1-8B's shapes the Triton kernels were up to 1.9% of the largest output off the
# exact references when one dot chained all of K = 4096, and up to 1.1% when each 128-wide step's dot
# was added in fp32; Triton's max_num_imprecise_acc = 32 changed neither error.
FP8_MMA_TOLERANCE = 2.5e-2


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |actual - expected| / max |expected|, in float32."""
    diff = (actual.float() - expected.float()).abs().max()
    return float(diff / expected.float().abs().max().clamp_min(1e-30))


@dataclass
class PagedKV:
    """The engine's layout: K/V [num_slots + 1, KV, D] (slot 0 padding), req_to_token [rows, max_len]."""

    k_buffer: torch.Tensor
    v_buffer: torch.Tensor
    req_to_token: torch.Tensor  # int32
    req_pool_indices: torch.Tensor  # int64 [bs]
    seq_lens: torch.Tensor  # int64 [bs]


def make_paged_kv(
    seq_lens: list[int],
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device="cpu",
    seed: int = 0,
    spare_rows: int = 2,
) -> PagedKV:
    """Each request gets randomly scattered slots and a shuffled row of req_to_token, so a
    kernel that assumes contiguous slots, or rows equal to batch positions, fails."""
    gen = torch.Generator().manual_seed(seed)
    num_slots = sum(seq_lens) + 8  # a few slots no request uses
    shape = (num_slots + 1, num_kv_heads, head_dim)
    dev_gen = torch.Generator(device=device).manual_seed(seed)
    k_buffer = torch.randn(shape, generator=dev_gen, device=device).to(dtype)
    v_buffer = torch.randn(shape, generator=dev_gen, device=device).to(dtype)
    bs, max_len = len(seq_lens), max(seq_lens, default=0) + 3
    rows = torch.randperm(bs + spare_rows, generator=gen)[:bs]
    slots = torch.randperm(num_slots, generator=gen).int() + 1
    req_to_token = torch.zeros((bs + spare_rows, max_len), dtype=torch.int32)
    start = 0
    for row, seq_len in zip(rows.tolist(), seq_lens):
        req_to_token[row, :seq_len] = slots[start : start + seq_len]
        start += seq_len
    return PagedKV(
        k_buffer,
        v_buffer,
        req_to_token.to(device),
        rows.to(device),
        torch.tensor(seq_lens, dtype=torch.int64, device=device),
    )
