"""y = x @ W.T (+ bias) for an e4m3 weight W [N, K] when x has only a few rows (decode at small
batch): the product is a stream over the weight, so each program owns BLOCK_N weight rows and walks
all of K, reading each weight byte once (per-row weights with no second kernel and no activation
buffer).

Block-scaled weights take the activation's 128-feature groups quantized first, once
(fp8_gemm.quantize_groups), so that no program repeats that division; one row streams them with each
feature's group scale times its weight block's scale folded into the running sums, several rows go
one group per step. Per-row weights quantize the activation in the kernel: per token (a first pass
over the row for its amax; the rows are small and cached), by a static scale, or not (weight-only).
One row reduces in fp32 registers, the weight tile widened from e4m3 there; up to MAX_ROWS rows go
through a tl.dot with the rows padded to 16. The
references are fp8_reference.py's, the same as fp8_gemm.py's."""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from sgl_kernel._interpreter import fix_interpreter
from sgl_kernel.fp8_gemm import (
    GROUP_K,
    check_operands,
    quantize,
    quantize_groups,
    row_scales,
    rows_of,
    scale_of,
)
from sgl_kernel.fp8_reference import (
    GROUP,
    SCALED_ACTIVATIONS,
    activation_scale,
    block_fp8_gemm_ref,
    scaled_fp8_gemm_ref,
)

fix_interpreter()

__all__ = ["MAX_ROWS", "block_fp8_skinny_gemm", "block_fp8_skinny_gemm_ref", "scaled_fp8_skinny_gemm"]

MAX_ROWS = 8  # x rows the kernel takes; above this a GEMM's tiling wins
block_fp8_skinny_gemm_ref = block_fp8_gemm_ref
scaled_fp8_skinny_gemm_ref = scaled_fp8_gemm_ref


@dataclasses.dataclass(frozen=True)
class Config:
    block_n: int
    block_k: int  # 128 for block-scaled weights (one activation group per step)
    num_warps: int
    num_stages: int


@triton.jit
def _row_scales(x_ptrs, m_ok, K, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """Each row's per-token scale: a pass over its K entries for the amax."""
    offs_k = tl.arange(0, BLOCK_K)
    amax = tl.zeros((BLOCK_M, BLOCK_K), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        xt = tl.load(x_ptrs + k0, mask=m_ok[:, None] & (k0 + offs_k < K)[None, :], other=0.0)
        amax = tl.maximum(amax, tl.abs(xt.to(tl.float32)))
    return scale_of(tl.max(amax, axis=1))


@triton.jit
def _fp8_skinny_gemm_kernel(
    x,
    w,
    w_scale,
    input_scale,
    bias,
    y,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_sn,
    stride_ism,
    stride_ym,
    ACTIVATIONS: tl.constexpr,  # "group" (block-scaled weights), "token", "static", "none"
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    PRECISION: tl.constexpr,
):
    cols_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = cols_n < N
    rows_m = tl.arange(0, BLOCK_M)
    m_ok = rows_m < M
    offs_k = tl.arange(0, BLOCK_K)
    w_ptrs = w + cols_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    x_ptrs = x + rows_m[:, None] * stride_xm + offs_k[None, :]
    block_row = (tl.program_id(0) * BLOCK_N) // GROUP_K  # block-scaled weights' scale row
    if ACTIVATIONS == "token":
        x_scale = _row_scales(x_ptrs, m_ok, K, BLOCK_M, BLOCK_K)
    elif ACTIVATIONS == "static":
        x_scale = tl.load(input_scale) + tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    if BLOCK_M == 1:
        partial = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            wt = tl.load(w_ptrs, mask=n_ok[:, None], other=0.0)
            xt = tl.load(x_ptrs, mask=m_ok[:, None], other=0.0)
        else:
            k_ok = k0 + offs_k < K
            wt = tl.load(w_ptrs, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
            xt = tl.load(x_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        if ACTIVATIONS == "group":  # x is e4m3 already, input_scale its groups' scales [M, groups]
            if BLOCK_M == 1:  # each feature scaled as it is summed (BLOCK_N columns: one block row)
                groups = (k0 + offs_k) // GROUP_K
                in_k = k0 + offs_k < K
                a_s = tl.load(input_scale + groups, mask=in_k, other=0.0)
                w_s = tl.load(w_scale + block_row * stride_sn + groups, mask=in_k, other=0.0)
                partial += wt.to(tl.float32) * (xt.to(tl.float32) * (a_s * w_s)[None, :])
            else:  # one group per step
                w_s = tl.load(w_scale + (cols_n // GROUP_K) * stride_sn + k0 // GROUP_K, mask=n_ok, other=0.0)
                a_s = tl.load(input_scale + rows_m * stride_ism + k0 // GROUP_K, mask=m_ok, other=0.0)
                acc += tl.dot(xt, tl.trans(wt)) * a_s[:, None] * w_s[None, :]
        elif ACTIVATIONS == "none":
            if BLOCK_M == 1:
                partial += wt.to(tl.float32) * xt.to(tl.float32)
            else:
                acc = tl.dot(xt, tl.trans(wt.to(xt.dtype)), acc, input_precision=PRECISION)
        else:
            xq = quantize(xt.to(tl.float32), x_scale[:, None])
            if BLOCK_M == 1:
                partial += wt.to(tl.float32) * xq.to(tl.float32)
            else:
                acc = tl.dot(xq, tl.trans(wt), acc)
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    if BLOCK_M == 1:
        acc = tl.sum(partial, axis=1)[None, :]
    if ACTIVATIONS != "group":
        acc *= tl.load(w_scale + cols_n, mask=n_ok, other=0.0)[None, :]
        if ACTIVATIONS != "none":
            acc *= x_scale[:, None]
    if HAS_BIAS:
        acc += tl.load(bias + cols_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    y_ptrs = y + rows_m[:, None] * stride_ym + cols_n[None, :]
    tl.store(y_ptrs, acc.to(y.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def default_config(rows: int, n: int, k: int, activations: str = "token") -> Config:
    """Launch shapes from python -m sglang.benchmark.fp8_gemm --sweep-skinny on an H100 at
    Llama-3.1-8B's shapes. One row: 8 columns a program where N is wide (qkv, gate_up), and for the
    narrow projections (o, down) block-scaled weights 4 columns with a K step of 2048 on long rows, per-row
    weights 8 columns and 1024 (each 2-14% faster than the bf16 sweep's shapes). Several rows: wide column
    blocks for tl.dot (not yet swept for FP8)."""
    if rows == 1:
        if n > 4096:
            return Config(8, 512, num_warps=4, num_stages=3)
        if activations == "group":
            return Config(4, 2048 if k > 8192 else 512, num_warps=4, num_stages=3)
        return Config(8, 1024, num_warps=4, num_stages=3)
    return Config(block_n=32 if n <= 8192 else 64, block_k=GROUP, num_warps=4, num_stages=4)


def _launch(x, weight, scale, input_scale, bias, activations: str, config: Config | None) -> torch.Tensor:
    n, k = weight.shape
    x2 = rows_of(x, k)
    rows = x2.shape[0]
    if rows > MAX_ROWS:
        raise ValueError(f"the FP8 skinny GEMM takes at most {MAX_ROWS} rows, got {rows}")
    y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    if rows and n:
        cfg = config or default_config(rows, n, k, activations)
        if activations == "group":
            _check_group_config(cfg, rows)
            x2, input_scale = quantize_groups(x2)
        _fp8_skinny_gemm_kernel[(triton.cdiv(n, cfg.block_n),)](
            x2,
            weight,
            scale,
            input_scale if input_scale is not None else scale,
            bias if bias is not None else scale,
            y,
            rows,
            n,
            k,
            x2.stride(0),
            weight.stride(0),
            scale.stride(0),
            input_scale.stride(0) if input_scale is not None and input_scale.dim() == 2 else 0,
            y.stride(0),
            ACTIVATIONS=activations,
            HAS_BIAS=bias is not None,
            BLOCK_M=1 if rows == 1 else 16,
            BLOCK_N=cfg.block_n,
            BLOCK_K=cfg.block_k,
            EVEN_K=k % cfg.block_k == 0,
            PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
            num_warps=cfg.num_warps,
            num_stages=cfg.num_stages,
        )
    return y.reshape(*x.shape[:-1], n)


def _check_group_config(cfg: Config, rows: int) -> None:
    """Block-scaled weights: several rows step K by one group (one scale per row and column a step);
    one row by whole groups, with BLOCK_N columns inside one block row of the weight's scales."""
    if rows > 1 and cfg.block_k != GROUP:
        raise ValueError(f"block-scaled weights step K by one {GROUP}-wide group for {rows} rows, not {cfg.block_k}")
    if rows == 1 and (cfg.block_k % GROUP or GROUP % cfg.block_n):
        raise ValueError(
            f"block-scaled weights need a K step of whole {GROUP}-wide groups and a column block dividing "
            f"{GROUP} for one row, not {cfg.block_k} and {cfg.block_n}"
        )


def block_fp8_skinny_gemm(x, weight, weight_scale, bias=None, config: Config | None = None) -> torch.Tensor:
    """fp8_gemm.block_fp8_gemm for x of at most MAX_ROWS rows (block_fp8_gemm_ref)."""
    n, k = check_operands(x, weight, bias)
    if tuple(weight_scale.shape) != (triton.cdiv(n, GROUP), triton.cdiv(k, GROUP)):
        raise ValueError(f"weight_scale must be [{triton.cdiv(n, GROUP)}, {triton.cdiv(k, GROUP)}] for [{n}, {k}]")
    return _launch(x, weight, weight_scale, None, bias, "group", config)


def scaled_fp8_skinny_gemm(
    x, weight, weight_scale, activations, input_scale=None, bias=None, config: Config | None = None
) -> torch.Tensor:
    """fp8_gemm.scaled_fp8_gemm for x of at most MAX_ROWS rows (scaled_fp8_gemm_ref)."""
    n, k = check_operands(x, weight, bias)
    if activations not in SCALED_ACTIVATIONS:
        raise ValueError(f"activations {activations!r} are not served; served: {', '.join(SCALED_ACTIVATIONS)}")
    if activations == "tensor":  # one amax over every row: computed first, then applied as a static scale
        activations, input_scale = "static", activation_scale(x, "tensor")
    elif activations == "static":
        input_scale = activation_scale(x, "static", input_scale)
    return _launch(x, weight, row_scales(weight_scale, n), input_scale, bias, activations, config)
