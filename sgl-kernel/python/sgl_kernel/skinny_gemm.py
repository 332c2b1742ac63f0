"""y = x @ weight.T (+ bias) when x has only a few rows: the linear layers of a decode step at
small batch, where the step is a stream over the weights and cuBLAS's split-K kernels (plus their
reduce) leave part of the memory bandwidth unused.

Each program owns BLOCK_N output columns (rows of the weight) and walks all of K, so no partial
sums cross programs and no second kernel runs. One row of x reduces in fp32 registers; up to 16
rows go through tl.dot with the rows padded to 16 (the step is bound by reading the weight, not by
the padded arithmetic).
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from sgl_kernel._interpreter import fix_interpreter

fix_interpreter()

MAX_ROWS = 16  # x rows the kernel takes; above this a GEMM's own tiling wins


@dataclasses.dataclass(frozen=True)
class Config:
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


@triton.jit
def _skinny_gemm_kernel(
    x,
    w,
    bias,
    y,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_ym,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    FP32: tl.constexpr,
):
    cols_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = cols_n < N
    rows_m = tl.arange(0, BLOCK_M)
    m_ok = rows_m < M
    offs_k = tl.arange(0, BLOCK_K)
    w_ptrs = w + cols_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    x_ptrs = x + rows_m[:, None] * stride_xm + offs_k[None, :]
    if BLOCK_M == 1:
        partial = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            wt = tl.load(w_ptrs, mask=n_ok[:, None], other=0.0)
            xt = tl.load(x_ptrs, mask=m_ok[:, None], other=0.0)
        else:
            k_ok = k0 + offs_k < K
            wt = tl.load(w_ptrs, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
            xt = tl.load(x_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        if BLOCK_M == 1:
            partial += wt.to(tl.float32) * xt.to(tl.float32)
        elif FP32:  # full fp32 products, not tf32
            acc = tl.dot(xt, tl.trans(wt), acc, input_precision="ieee")
        else:
            acc = tl.dot(xt, tl.trans(wt), acc)
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    if BLOCK_M == 1:
        acc = tl.sum(partial, axis=1)[None, :]
    if HAS_BIAS:
        acc += tl.load(bias + cols_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    y_ptrs = y + rows_m[:, None] * stride_ym + cols_n[None, :]
    tl.store(y_ptrs, acc.to(y.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def default_config(rows: int, n: int, k: int) -> Config:
    """The launch shape for a [rows, k] x [n, k]^T product, from the sweep of
    benchmark/skinny_gemm_bench.py on the H200 (Llama-3.1-8B's five weights): one row wants about
    1000 programs or more in flight (4 weight rows each for N = 4096, 8 for 6144, 16 from 16k);
    2-16 rows want wide column blocks for tl.dot."""
    if rows == 1:
        block_n = 16 if n >= 16384 else 8 if n > 4096 else 4
        return Config(block_n=block_n, block_k=256 if block_n == 16 else 512, num_warps=4, num_stages=3)
    return Config(block_n=64, block_k=128, num_warps=4, num_stages=4)


def faster_than_cublas(rows: int, n: int, k: int) -> bool:
    """Where the sweep measured this kernel ahead of cuBLAS: every product of one row (by 4-19%),
    and vocabulary-sized products (N >= 16 K, the logits) of up to 16 rows (by 14%). For 2-16 rows
    against the layers' weights cuBLAS is level or ahead (up to 4%)."""
    return rows == 1 or (rows <= MAX_ROWS and n >= 16 * k)


def skinny_gemm(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, config: Config | None = None
) -> torch.Tensor:
    """x: [..., K] with at most MAX_ROWS rows in all; weight: [N, K]; bias: [N] or None.
    Returns x @ weight.T + bias, [..., N], in x's dtype (products accumulated in fp32)."""
    if weight.dim() != 2 or weight.stride(-1) != 1:
        raise ValueError(f"weight must be [N, K] with a contiguous last dimension, got {tuple(weight.shape)}")
    n, k = weight.shape
    if x.shape[-1] != k:
        raise ValueError(f"x's last dimension is {x.shape[-1]}, the weight's K is {k}")
    if bias is not None and tuple(bias.shape) != (n,):
        raise ValueError(f"bias must be [{n}], got {tuple(bias.shape)}")
    if x.dtype != weight.dtype:
        raise ValueError(f"x is {x.dtype} but the weight is {weight.dtype}")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    rows = x2.shape[0]
    if rows > MAX_ROWS:
        raise ValueError(f"skinny_gemm takes at most {MAX_ROWS} rows, got {rows}")
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    if rows and n:
        cfg = config or default_config(rows, n, k)
        _skinny_gemm_kernel[(triton.cdiv(n, cfg.block_n),)](
            x2,
            weight,
            bias if bias is not None else weight,
            y,
            rows,
            n,
            k,
            x2.stride(0),
            weight.stride(0),
            y.stride(0),
            HAS_BIAS=bias is not None,
            BLOCK_M=1 if rows == 1 else 16,
            BLOCK_N=cfg.block_n,
            BLOCK_K=cfg.block_k,
            EVEN_K=k % cfg.block_k == 0,
            FP32=x.dtype == torch.float32,
            num_warps=cfg.num_warps,
            num_stages=cfg.num_stages,
        )
    return y.reshape(*lead, n)


def skinny_gemm_ref(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, config: Config | None = None
) -> torch.Tensor:
    return torch.nn.functional.linear(x.float(), weight.float(), None if bias is None else bias.float()).to(x.dtype)
