"""FP8 (e4m3) quantization in torch, and the dequantizing references of the FP8 GEMMs
(fp8_gemm.py, fp8_skinny_gemm.py). The kernels quantize activations exactly as here (the same
amax, the same division, round to nearest even, saturating at +-448); the layers' CPU path
multiplies through these functions. No triton: CPU installs import this module.

Activation schemes (`activations`): "group" (dynamic, per token and 128 input features; with
block-scaled weights), "token" (dynamic, per token), "tensor" (dynamic, one scale for the whole
input), "static" (the checkpoint's per-tensor input_scale), "none" (weight-only)."""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max  # 448
GROUP = 128  # weight blocks are GROUP x GROUP, activation groups 1 x GROUP
SCALED_ACTIVATIONS = ("token", "tensor", "static", "none")
_TINY = torch.finfo(torch.float32).tiny  # the scale of an all-zero group


def scale_of(amax: torch.Tensor) -> torch.Tensor:
    return (amax / FP8_MAX).clamp(min=_TINY)


def quantize(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x / scale rounded to e4m3 (saturating at +-448)."""
    return (x / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)


def quantize_per_group(x: torch.Tensor, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] float32 -> (e4m3 [M, K], scales [M, ceil(K/group)]), each group of `group` features
    of a row scaled by its amax / 448 (the last group may be shorter)."""
    rows, k = x.shape
    padded = torch.nn.functional.pad(x, (0, -k % group)).view(rows, -1, group)
    scales = scale_of(padded.abs().amax(dim=-1, keepdim=True))
    return quantize(padded, scales).view(rows, -1)[:, :k], scales.squeeze(-1)


def activation_scale(x: torch.Tensor, activations: str, input_scale: torch.Tensor | None = None) -> torch.Tensor:
    """The float32 scale of x [M, K] for a per-row scheme: [M, 1] ("token"), or one value."""
    if activations == "token":
        return scale_of(x.float().abs().amax(dim=-1, keepdim=True))
    if activations == "tensor":
        return scale_of(x.float().abs().amax()).reshape(1)
    if activations == "static":
        if input_scale is None:
            raise ValueError("static activations need the checkpoint's input_scale")
        return input_scale.float().reshape(1)
    raise ValueError(f"activations {activations!r} have no per-row scale; served: token, tensor, static")


def fake_quantize_activation(x: torch.Tensor, activations: str, input_scale=None) -> torch.Tensor:
    """x [M, K] float32 quantized to e4m3 as `activations` says, and back to float32."""
    if activations == "none":
        return x
    if activations == "group":
        q, scales = quantize_per_group(x)
        return q.float() * scales.repeat_interleave(GROUP, dim=1)[:, : x.shape[1]]
    scale = activation_scale(x, activations, input_scale)
    return quantize(x, scale).float() * scale


def dequantize_block_weight(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The float32 weight [N, K]: each e4m3 entry times its GROUP x GROUP block's scale."""
    n, k = weight.shape
    full = scale.float().repeat_interleave(GROUP, dim=0)[:n].repeat_interleave(GROUP, dim=1)[:, :k]
    return weight.float() * full


def dequantize_row_weight(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The float32 weight [N, K]: each row times its scale ([N], [N, 1], or one value for all)."""
    return weight.float() * scale.float().reshape(-1, 1)


def _matmul(x: torch.Tensor, flat: torch.Tensor, weight: torch.Tensor, bias) -> torch.Tensor:
    out = flat @ weight.T
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype).reshape(*x.shape[:-1], weight.shape[0])


def block_fp8_gemm_ref(x, weight, weight_scale, bias=None, config=None) -> torch.Tensor:
    """x [..., K] @ W.T (+ bias) in x's dtype: x quantized per 1 x 128 group, W e4m3 [N, K] with
    `weight_scale` [ceil(N/128), ceil(K/128)], both dequantized and multiplied in float32."""
    flat = fake_quantize_activation(x.reshape(-1, x.shape[-1]).float(), "group")
    return _matmul(x, flat, dequantize_block_weight(weight, weight_scale), bias)


def scaled_fp8_gemm_ref(x, weight, weight_scale, activations, input_scale=None, bias=None, config=None):
    """x [..., K] @ W.T (+ bias) in x's dtype: x quantized as `activations` says (SCALED_ACTIVATIONS),
    W e4m3 [N, K] with one scale per row ([N] or [N, 1]) or one for all, dequantized in float32."""
    if activations not in SCALED_ACTIVATIONS:
        raise ValueError(f"activations {activations!r} are not served; served: {', '.join(SCALED_ACTIVATIONS)}")
    flat = fake_quantize_activation(x.reshape(-1, x.shape[-1]).float(), activations, input_scale)
    return _matmul(x, flat, dequantize_row_weight(weight, weight_scale), bias)
