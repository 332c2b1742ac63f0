"""The FP8 linear reference (layers/quantization/fp8.py) against a plain computation written block
by block: the activation quantized per group of 128 features (or per token, per tensor, by a
static scale), the weight dequantized block by block (or per row), both multiplied, at shapes
whose K and N are not multiples of 128 and batches of 1 to 300."""

from __future__ import annotations

import math

import pytest
import torch

from sglang.srt.layers.linear import Linear, RowParallelLinear
from sglang.srt.layers.quantization.fp8 import (
    FP8,
    Activations,
    Fp8LinearMethod,
    Fp8Scheme,
    WeightScales,
    fp8_linear,
    quantize_per_group,
)
from sglang.tools.fp8_checkpoint import quantize_weight

SHAPES = [(1, 200, 130), (7, 128, 256), (33, 300, 77), (300, 129, 257)]  # (batch, K, N)


def plain_block_dequantize(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    out = torch.empty(weight.shape)
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            rows, cols = slice(128 * i, 128 * (i + 1)), slice(128 * j, 128 * (j + 1))
            out[rows, cols] = weight[rows, cols].float() * scale[i, j]
    return out


def plain_group_fake_quantize(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    for start in range(0, x.shape[1], 128):
        group = x[:, start : start + 128]
        scale = group.abs().amax(dim=1, keepdim=True) / 448.0
        out[:, start : start + 128] = (group / scale).to(FP8).float() * scale
    return out


@pytest.mark.parametrize("batch,k,n", SHAPES)
def test_block_reference_equals_plain_dequantize_then_matmul(batch, k, n):
    gen = torch.Generator().manual_seed(batch + k + n)
    weight, scale = quantize_weight(torch.randn(n, k, generator=gen) * 0.1, WeightScales.BLOCK)
    assert scale.shape == (math.ceil(n / 128), math.ceil(k / 128))
    x, bias = torch.randn(batch, k, generator=gen), torch.randn(n, generator=gen)
    scheme = Fp8Scheme(WeightScales.BLOCK, Activations.GROUP, "weight_scale_inv")
    got = fp8_linear(x, weight, scale, scheme, bias=bias)
    want = plain_group_fake_quantize(x) @ plain_block_dequantize(weight, scale).T + bias
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("batch,k,n", SHAPES)
@pytest.mark.parametrize("activations", [Activations.TOKEN, Activations.TENSOR, Activations.STATIC, Activations.NONE])
@pytest.mark.parametrize("weights", [WeightScales.CHANNEL, WeightScales.TENSOR])
def test_scaled_reference_equals_plain_dequantize_then_matmul(batch, k, n, activations, weights):
    gen = torch.Generator().manual_seed(batch * k + n)
    weight, scale = quantize_weight(torch.randn(n, k, generator=gen) * 0.1, weights)
    x = torch.randn(batch, k, generator=gen)
    input_scale = torch.tensor([3.5 / 448])  # saturates the few entries past 3.5
    x_scale = {
        Activations.TOKEN: x.abs().amax(dim=1, keepdim=True) / 448,
        Activations.TENSOR: x.abs().amax() / 448,
        Activations.STATIC: input_scale,
        Activations.NONE: None,
    }[activations]
    x_seen = x if x_scale is None else (x / x_scale).clamp(-448, 448).to(FP8).float() * x_scale
    want = x_seen @ (weight.float() * scale.reshape(-1, 1)).T
    got = fp8_linear(x, weight, scale.reshape(-1, 1).expand(n, 1), Fp8Scheme(weights, activations), input_scale)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


def test_group_quantization_keeps_each_group_within_e4m3_precision():
    x = torch.randn(5, 300) * torch.logspace(-3, 3, 300)  # groups of very different magnitudes
    q, scales = quantize_per_group(x)
    assert q.dtype == FP8 and scales.shape == (5, 3)
    back = q.float() * scales.repeat_interleave(128, dim=1)[:, :300]
    group_max = scales.repeat_interleave(128, dim=1)[:, :300] * 448
    assert ((back - x).abs() <= x.abs() / 16 + group_max * 2**-9).all()  # 3 mantissa bits, or subnormal


def test_zero_activations_quantize_to_zero():
    weight, scale = quantize_weight(torch.randn(130, 200), WeightScales.BLOCK)
    out = fp8_linear(torch.zeros(2, 200), weight, scale, Fp8Scheme(WeightScales.BLOCK, Activations.GROUP))
    assert torch.equal(out, torch.zeros(2, 130))


@pytest.mark.parametrize("layer_class", [Linear, RowParallelLinear])
def test_quantized_linear_layer_holds_fp8_weight_and_multiplies_by_the_reference(layer_class):
    torch.manual_seed(0)
    layer = layer_class(200, 130, bias=True)
    dense = layer.weight.detach().clone()
    scheme = Fp8Scheme(WeightScales.BLOCK, Activations.GROUP, "weight_scale_inv")
    layer.quantize(Fp8LinearMethod(scheme))
    weight, scale = quantize_weight(dense, WeightScales.BLOCK)
    assert layer.weight.dtype == FP8 and layer.weight_scale_inv.shape == (2, 2)
    layer.weight.data.copy_(weight)
    layer.weight_scale_inv.data.copy_(scale)
    x = torch.randn(3, 200)
    torch.testing.assert_close(layer(x), fp8_linear(x, weight, scale, scheme, bias=layer.bias))
    torch.testing.assert_close(layer(x), x @ dense.T + layer.bias, rtol=0.1, atol=0.2)  # FP8 is close


def test_scale_shares_under_tensor_parallelism_follow_their_weight_in_whole_blocks():
    from sglang.srt.layers.linear import TpSource
    from sglang.srt.layers.quantization.fp8 import ScaleLayout

    block, channel = ScaleLayout(128, 128), ScaleLayout(1, None)
    assert block.tp_source(TpSource(1, 256, 256, 512)) == TpSource(1, 2, 2, 4)  # row-parallel: K blocks
    assert block.tp_source(TpSource(0, 256, 200, 456)) == TpSource(0, 2, 2, 4)  # the last rank's part block
    assert channel.tp_source(TpSource(0, 64, 64, 128)) == TpSource(0, 64, 64, 128)
    assert channel.tp_source(TpSource(1, 64, 64, 128)) is None  # one scale per row: every rank holds all
    assert ScaleLayout(1, None, scalar=True).tp_source(TpSource(0, 64, 64, 128)) is None
    with pytest.raises(ValueError, match="whole 128-row FP8 scale blocks"):
        block.tp_source(TpSource(1, 64, 64, 128))


def test_ignore_lists_match_names_suffixes_parents_regexes_and_wildcards():
    from sglang.srt.layers.quantization import matches

    name = "model.layers.3.mlp.down_proj"
    for listed in (name, "down_proj", "mlp.down_proj", "model.layers.3", r"re:.*layers\.3\..*", "model.layers.*.mlp.*"):
        assert matches(name, [listed]), listed
    for other in ("up_proj", "model.layers.30", "own_proj", r"re:.*layers\.4\..*", "model.layers.*.self_attn.*"):
        assert not matches(name, [other]), other
