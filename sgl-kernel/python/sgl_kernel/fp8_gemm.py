"""y = x @ W.T (+ bias) for an e4m3 weight W [N, K], with the activation x quantized to e4m3 as the
checkpoint's scheme says, products accumulated in fp32 and the output in x's dtype.

- `block_fp8_gemm`: W scaled per 128 x 128 block; x quantized per 1 x 128 group first, once
  (`quantize_groups`: each group's amax, scale = amax / 448, x / scale to e4m3), then one fp8 dot
  per K step of 128, scaled by the group's and the weight block's scales. Quantizing inside the
  GEMM would repeat the correctly rounded division for every column tile: on an H100 that made
  a 512-token prefill of an 8B model 6x slower than bf16.
- `scaled_fp8_gemm`: W scaled per row (or one scale); x quantized per token (dynamic), per tensor
  (dynamic) or by the checkpoint's static scale (`quantize_rows`), or left as it is (weight-only).
  bf16 on Hopper with K and N multiples of 16 goes to torch._scaled_mm (cuBLASLt, row-wise scales);
  everything else to the Triton kernel here.

Few-row products (decode at small batch) go to fp8_skinny_gemm.py. The torch references are in
fp8_reference.py (no triton, so CPU installs use them)."""

from __future__ import annotations

import dataclasses
import functools

import torch
import triton
import triton.language as tl

from sgl_kernel._interpreter import fix_interpreter
from sgl_kernel.fp8_reference import (
    FP8,
    GROUP,
    SCALED_ACTIVATIONS,
    activation_scale,
    block_fp8_gemm_ref,
    scaled_fp8_gemm_ref,
)

fix_interpreter()

__all__ = [
    "block_fp8_gemm",
    "block_fp8_gemm_ref",
    "scaled_fp8_gemm",
    "scaled_fp8_gemm_ref",
    "quantize_groups",
    "quantize_rows",
]

E4M3_MAX = tl.constexpr(448.0)
TINY = tl.constexpr(1.1754943508222875e-38)  # float32's smallest normal: the scale of an all-zero group
GROUP_K = tl.constexpr(GROUP)


@dataclasses.dataclass(frozen=True)
class Config:
    block_m: int
    block_n: int
    block_k: int  # the block-scaled kernel always steps by one group (128)
    group_m: int  # row tiles that walk the column tiles together (L2 reuse of the weight)
    num_warps: int
    num_stages: int


@triton.jit
def scale_of(amax):
    """The e4m3 scale of values whose largest magnitude is amax (fp32), as fp8_reference.scale_of."""
    return tl.maximum(tl.math.div_rn(amax, E4M3_MAX), TINY)


@triton.jit
def quantize(x, scale):
    """x / scale (fp32, correctly rounded as torch divides) to e4m3, saturating at +-448."""
    return tl.clamp(tl.math.div_rn(x, scale), -E4M3_MAX, E4M3_MAX).to(tl.float8e4nv)


@triton.jit
def _tile(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """This program's (row tile, column tile): GROUP_M row tiles sweep the column tiles together."""
    pid = tl.program_id(0)
    tiles_m, tiles_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    group_size = tl.minimum(tiles_m - first_m, GROUP_M)
    return first_m + (pid % per_group) % group_size, (pid % per_group) // group_size


@triton.jit
def load_tiles(x_ptrs, w_ptrs, m_ok, n_ok, k_ok, EVEN_K: tl.constexpr):
    """An activation tile [rows, K step] and a weight tile [columns, K step], zero past the edges."""
    if EVEN_K:
        x_mask, w_mask = m_ok[:, None], n_ok[:, None]
    else:
        x_mask, w_mask = m_ok[:, None] & k_ok[None, :], n_ok[:, None] & k_ok[None, :]
    return tl.load(x_ptrs, mask=x_mask, other=0.0), tl.load(w_ptrs, mask=w_mask, other=0.0)


@triton.jit
def _store(y, acc, bias, rows, cols, m_ok, n_ok, stride_ym, HAS_BIAS: tl.constexpr):
    if HAS_BIAS:
        acc += tl.load(bias + cols, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    y_ptrs = y + rows[:, None].to(tl.int64) * stride_ym + cols[None, :]
    tl.store(y_ptrs, acc.to(y.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _block_fp8_gemm_kernel(
    a,
    a_scale,
    w,
    w_scale,
    bias,
    y,
    M,
    N,
    K,
    stride_am,
    stride_asm,
    stride_wn,
    stride_sn,
    stride_ym,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    """a: e4m3 activations with a scale per row and 128-wide group (quantize_groups)."""
    pid_m, pid_n = _tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok, n_ok = rows < M, cols < N
    offs_k = tl.arange(0, GROUP_K)
    a_ptrs = a + rows[:, None].to(tl.int64) * stride_am + offs_k[None, :]
    w_ptrs = w + cols[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    as_ptrs = a_scale + rows.to(tl.int64) * stride_asm
    s_ptrs = w_scale + (cols // GROUP_K) * stride_sn
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for group in range(0, tl.cdiv(K, GROUP_K)):
        at, wt = load_tiles(a_ptrs, w_ptrs, m_ok, n_ok, offs_k + group * GROUP_K < K, EVEN_K)
        a_s = tl.load(as_ptrs + group, mask=m_ok, other=0.0)
        w_s = tl.load(s_ptrs + group, mask=n_ok, other=0.0)
        acc += tl.dot(at, tl.trans(wt)) * a_s[:, None] * w_s[None, :]
        a_ptrs += GROUP_K
        w_ptrs += GROUP_K
    _store(y, acc, bias, rows, cols, m_ok, n_ok, stride_ym, HAS_BIAS)


@triton.jit
def _quantize_groups_kernel(x, q, scale, K, stride_xm, GROUPS: tl.constexpr):
    """One row's GROUPS consecutive 128-wide groups (program (row, chunk)) to e4m3 and their scales."""
    row = tl.program_id(0).to(tl.int64)
    groups = tl.program_id(1) * GROUPS + tl.arange(0, GROUPS)
    cols = groups[:, None] * GROUP_K + tl.arange(0, GROUP_K)[None, :]
    ok = cols < K
    xt = tl.load(x + row * stride_xm + cols, mask=ok, other=0.0).to(tl.float32)
    s = scale_of(tl.max(tl.abs(xt), axis=1))
    tl.store(q + row * K + cols, quantize(xt, s[:, None]), mask=ok)
    n_groups = tl.cdiv(K, GROUP_K)
    tl.store(scale + row * n_groups + groups, s, mask=groups < n_groups)


@triton.jit
def _quantize_rows_kernel(
    x, q, scale, static_scale, M, K, stride_xm, STATIC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = rows < M
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x + rows[:, None].to(tl.int64) * stride_xm + offs_k[None, :]
    q_ptrs = q + rows[:, None].to(tl.int64) * K + offs_k[None, :]
    if STATIC:
        s = tl.load(static_scale) + tl.zeros((BLOCK_M,), tl.float32)
    else:
        amax = tl.zeros((BLOCK_M, BLOCK_K), tl.float32)
        for k0 in range(0, K, BLOCK_K):
            xt = tl.load(x_ptrs + k0, mask=m_ok[:, None] & (k0 + offs_k < K)[None, :], other=0.0)
            amax = tl.maximum(amax, tl.abs(xt.to(tl.float32)))
        s = scale_of(tl.max(amax, axis=1))
    for k0 in range(0, K, BLOCK_K):
        mask = m_ok[:, None] & (k0 + offs_k < K)[None, :]
        xt = tl.load(x_ptrs + k0, mask=mask, other=0.0)
        tl.store(q_ptrs + k0, quantize(xt.to(tl.float32), s[:, None]), mask=mask)
    tl.store(scale + rows, s, mask=m_ok)


@triton.jit
def _scaled_fp8_gemm_kernel(
    a,
    a_scale,
    w,
    w_scale,
    bias,
    y,
    M,
    N,
    K,
    stride_am,
    stride_wn,
    stride_ym,
    A_FP8: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """a: e4m3 with a per-row scale (A_FP8), or the model's activations as they are (weight-only:
    the weight tile is widened to a's dtype, exactly, and the row scale applied at the end)."""
    pid_m, pid_n = _tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok, n_ok = rows < M, cols < N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a + rows[:, None].to(tl.int64) * stride_am + offs_k[None, :]
    w_ptrs = w + cols[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        at, wt = load_tiles(a_ptrs, w_ptrs, m_ok, n_ok, k0 + offs_k < K, EVEN_K)
        if A_FP8:
            acc = tl.dot(at, tl.trans(wt), acc)
        else:
            acc = tl.dot(at, tl.trans(wt.to(at.dtype)), acc, input_precision=PRECISION)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    acc *= tl.load(w_scale + cols, mask=n_ok, other=0.0)[None, :]
    if A_FP8:
        acc *= tl.load(a_scale + rows, mask=m_ok, other=0.0)[:, None]
    _store(y, acc, bias, rows, cols, m_ok, n_ok, stride_ym, HAS_BIAS)


def default_config(rows: int, n: int, k: int) -> Config:
    """Tiles by row count; not yet tuned on a GPU (python -m sglang.benchmark.fp8_gemm measures them)."""
    if rows <= 64:
        block_m = max(16, triton.next_power_of_2(rows))
        return Config(block_m, 64, 128, 8, num_warps=4, num_stages=4)
    return Config(128, 128, 128, 8, num_warps=8, num_stages=3)


def check_operands(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> tuple[int, int]:
    """(N, K) of an e4m3 weight [N, K] that x [..., K] (bf16, fp16 or fp32) can be multiplied by."""
    if weight.dim() != 2 or weight.dtype != FP8 or weight.stride(-1) != 1:
        raise ValueError(
            f"weight must be float8_e4m3fn [N, K] with a contiguous last dimension, got {weight.dtype} "
            f"{tuple(weight.shape)}"
        )
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"x must be bfloat16, float16 or float32, got {x.dtype}")
    n, k = weight.shape
    if x.shape[-1] != k:
        raise ValueError(f"x's last dimension is {x.shape[-1]}, the weight's K is {k}")
    if bias is not None and tuple(bias.shape) != (n,):
        raise ValueError(f"bias must be [{n}], got {tuple(bias.shape)}")
    return n, k


def rows_of(x: torch.Tensor, k: int) -> torch.Tensor:
    x2 = x.reshape(-1, k)
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def row_scales(weight_scale: torch.Tensor, n: int) -> torch.Tensor:
    """A weight's per-row scales as float32 [N] (one value for all rows expanded)."""
    scale = weight_scale.reshape(-1).float()
    if scale.numel() == 1:
        return scale.expand(n).contiguous()
    if scale.numel() != n:
        raise ValueError(f"weight_scale has {scale.numel()} values; a per-row scale needs {n} (or 1)")
    return scale.contiguous()


def block_fp8_gemm(x, weight, weight_scale, bias=None, config: Config | None = None) -> torch.Tensor:
    """x [..., K] @ W.T (+ bias), [..., N] in x's dtype; W e4m3 [N, K] with `weight_scale`
    [ceil(N/128), ceil(K/128)] float32, x quantized per 1 x 128 group (block_fp8_gemm_ref)."""
    n, k = check_operands(x, weight, bias)
    if tuple(weight_scale.shape) != (triton.cdiv(n, GROUP), triton.cdiv(k, GROUP)):
        raise ValueError(f"weight_scale must be [{triton.cdiv(n, GROUP)}, {triton.cdiv(k, GROUP)}] for [{n}, {k}]")
    x2 = rows_of(x, k)
    rows = x2.shape[0]
    y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    if rows and n:
        a, a_scale = quantize_groups(x2)
        cfg = config or default_config(rows, n, k)
        grid = (triton.cdiv(rows, cfg.block_m) * triton.cdiv(n, cfg.block_n),)
        _block_fp8_gemm_kernel[grid](
            a,
            a_scale,
            weight,
            weight_scale,
            bias if bias is not None else a_scale,
            y,
            rows,
            n,
            k,
            a.stride(0),
            a_scale.stride(0),
            weight.stride(0),
            weight_scale.stride(0),
            y.stride(0),
            HAS_BIAS=bias is not None,
            BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n,
            GROUP_M=cfg.group_m,
            EVEN_K=k % GROUP == 0,
            num_warps=cfg.num_warps,
            num_stages=cfg.num_stages,
        )
    return y.reshape(*x.shape[:-1], n)


def quantize_groups(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (last dimension contiguous) -> (e4m3 [M, K], float32 scales [M, ceil(K/128)]): each
    row's 128-feature groups by their own amax / 448, as fp8_reference.quantize_per_group."""
    rows, k = x.shape
    n_groups = triton.cdiv(k, GROUP)
    q = torch.empty((rows, k), dtype=FP8, device=x.device)
    scale = torch.empty((rows, n_groups), dtype=torch.float32, device=x.device)
    if rows and k:
        groups = min(8, triton.next_power_of_2(n_groups))  # 1,024 features a program
        _quantize_groups_kernel[(rows, triton.cdiv(n_groups, groups))](x, q, scale, k, x.stride(0), GROUPS=groups)
    return q, scale


def quantize_rows(x: torch.Tensor, static_scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (e4m3 [M, K], float32 scales [M, 1]): each row by its own amax / 448, or all by
    `static_scale` (one value), as fp8_reference.quantize."""
    rows, k = x.shape
    q = torch.empty((rows, k), dtype=FP8, device=x.device)
    scale = torch.empty((rows, 1), dtype=torch.float32, device=x.device)
    if rows:
        static = static_scale is not None
        block_m = min(16, triton.next_power_of_2(max(1, rows // 64)))  # some 64 programs or more
        _quantize_rows_kernel[(triton.cdiv(rows, block_m),)](
            x,
            q,
            scale,
            static_scale.float() if static else scale,
            rows,
            k,
            x.stride(0),
            STATIC=static,
            BLOCK_M=block_m,
            BLOCK_K=min(4096 // block_m, triton.next_power_of_2(max(k, 16))),
        )
    return q, scale


def quantized_activations(x2: torch.Tensor, activations: str, input_scale) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(activations for the product, their per-row scales [M, 1], None for weight-only)."""
    if activations not in SCALED_ACTIVATIONS:
        raise ValueError(f"activations {activations!r} are not served; served: {', '.join(SCALED_ACTIVATIONS)}")
    if activations == "none":
        return x2, None
    static = None if activations == "token" else activation_scale(x2, activations, input_scale)
    return quantize_rows(x2, static)


# Up to this many rows the Triton GEMM beat torch._scaled_mm by 5-20% at every Llama-3.1-8B shape, both
# given the same quantized activations (H100, two runs: python -m sglang.benchmark.fp8_gemm --rows 1 4 8;
# per layer at 4 rows 130 against 150 us); above it torch._scaled_mm stays the default where it serves.
TRITON_MAX_ROWS = 8


@functools.lru_cache(maxsize=None)
def _is_hopper_or_newer(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index) >= (9, 0)


def scaled_mm_serves(x: torch.Tensor, weight: torch.Tensor, activations: str) -> bool:
    """Whether torch._scaled_mm computes this product: bf16 output, quantized activations, K and N
    multiples of 16, row-wise scales (which its cuBLASLt / CUTLASS paths take from sm90 on)."""
    n, k = weight.shape
    return (
        x.is_cuda
        and x.dtype == torch.bfloat16
        and activations != "none"
        and n % 16 == 0
        and k % 16 == 0
        and hasattr(torch, "_scaled_mm")
        and _is_hopper_or_newer(x.device.index if x.device.index is not None else torch.cuda.current_device())
    )


def scaled_fp8_gemm(
    x, weight, weight_scale, activations, input_scale=None, bias=None, config: Config | None = None, backend="auto"
) -> torch.Tensor:
    """x [..., K] @ W.T (+ bias), [..., N] in x's dtype; W e4m3 [N, K] with float32 scales per row
    ([N] or [N, 1]) or one for all; x quantized as `activations` says (scaled_fp8_gemm_ref).
    backend: "auto" (torch._scaled_mm where it serves, above TRITON_MAX_ROWS rows), "triton", "scaled_mm"."""
    n, k = check_operands(x, weight, bias)
    x2 = rows_of(x, k)
    a, a_scale = quantized_activations(x2, activations, input_scale)
    w_scale = row_scales(weight_scale, n)
    use_scaled_mm = backend == "scaled_mm" or (
        backend == "auto" and x2.shape[0] > TRITON_MAX_ROWS and scaled_mm_serves(x, weight, activations)
    )
    if use_scaled_mm:
        y = torch._scaled_mm(a, weight.t(), scale_a=a_scale, scale_b=w_scale.view(1, n), out_dtype=x.dtype)
        y = y if bias is None else y.add_(bias)
    else:
        y = _triton_scaled_gemm(a, a_scale, weight, w_scale, bias, x.dtype, config)
    return y.reshape(*x.shape[:-1], n)


def _triton_scaled_gemm(a, a_scale, weight, w_scale, bias, dtype, config: Config | None) -> torch.Tensor:
    rows, k = a.shape
    n = weight.shape[0]
    y = torch.empty((rows, n), dtype=dtype, device=a.device)
    if rows and n:
        cfg = config or default_config(rows, n, k)
        grid = (triton.cdiv(rows, cfg.block_m) * triton.cdiv(n, cfg.block_n),)
        _scaled_fp8_gemm_kernel[grid](
            a,
            a_scale if a_scale is not None else w_scale,
            weight,
            w_scale,
            bias if bias is not None else w_scale,
            y,
            rows,
            n,
            k,
            a.stride(0),
            weight.stride(0),
            y.stride(0),
            A_FP8=a_scale is not None,
            HAS_BIAS=bias is not None,
            BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n,
            BLOCK_K=cfg.block_k,
            GROUP_M=cfg.group_m,
            EVEN_K=k % cfg.block_k == 0,
            PRECISION="ieee" if a.dtype == torch.float32 else "tf32",
            num_warps=cfg.num_warps,
            num_stages=cfg.num_stages,
        )
    return y
