"""sgl_kernel's FP8 GEMMs (fp8_gemm.py, fp8_skinny_gemm.py) against their dequantizing torch
references (fp8_reference.py, themselves checked against plain loops in test/srt/layers/test_fp8.py),
under the interpreter on CPU: K and N that are not multiples of 128, 1 to 300 rows, block, per-row
and per-tensor weight scales, dynamic and static activation scales, bf16 and fp32 inputs; and the
FP8 linear layers' arguments reaching the kernels."""

import pytest
import torch

from sgl_kernel.fp8_gemm import (
    Config,
    block_fp8_gemm,
    block_fp8_gemm_ref,
    quantize_groups,
    quantize_rows,
    scaled_fp8_gemm,
    scaled_fp8_gemm_ref,
)
from sgl_kernel.fp8_reference import FP8, GROUP, activation_scale, quantize, quantize_per_group
from sgl_kernel.fp8_skinny_gemm import MAX_ROWS, block_fp8_skinny_gemm, scaled_fp8_skinny_gemm
from sgl_kernel.fp8_skinny_gemm import Config as SkinnyConfig

RAGGED = (72, 200)  # (N, K): neither a multiple of 128
STRADDLING = (130, 256)  # two weight-block rows, the second of 2; K whole groups
STATIC_SCALE = torch.tensor([3.0 / 448])  # saturates the inputs past 3


def weight_and_scales(n, k, scales, seed=0):
    """An e4m3 weight [N, K] using its whole range, and float32 scales that differ per block / row,
    so that a scale applied to the wrong block or row shows."""
    gen = torch.Generator().manual_seed(seed)
    weight = (torch.randn(n, k, generator=gen) * 120).clamp(-448, 448).to(FP8)
    shape = {"block": (-(-n // GROUP), -(-k // GROUP)), "channel": (n, 1), "tensor": (1,)}[scales]
    return weight, torch.rand(shape, generator=gen) * 1e-3 + 1e-4


def activations(rows, k, dtype, seed=1):
    """x [rows, K] whose 128-feature groups and rows have magnitudes far apart (one scale per row
    or per tensor would lose the small groups), with a few entries past STATIC_SCALE's range."""
    gen = torch.Generator().manual_seed(seed)
    group_magnitude = torch.logspace(-2, 1, -(-k // GROUP))[torch.randperm(-(-k // GROUP), generator=gen)]
    row_magnitude = torch.logspace(-1, 1, rows)[torch.randperm(rows, generator=gen)]
    x = torch.randn(rows, k, generator=gen) * group_magnitude.repeat_interleave(GROUP)[:k] * row_magnitude[:, None]
    return x.to(dtype)


def bias_of(n, dtype, seed=2):
    return torch.randn(n, generator=torch.Generator().manual_seed(seed)).to(dtype)


def assert_matches(out, ref):
    """Equal up to the order of fp32 sums, and one rounding of the output dtype."""
    assert out.shape == ref.shape and out.dtype == ref.dtype
    rtol = 2.0**-7 if out.dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(out.float(), ref.float(), rtol=rtol, atol=rtol * ref.float().abs().max().item())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows", [1, 3, 17, 300])
@pytest.mark.parametrize("n, k", [RAGGED, STRADDLING], ids=["ragged", "straddling"])
def test_block_gemm_quantizes_each_group_like_the_reference(dtype, rows, n, k):
    weight, scale = weight_and_scales(n, k, "block")
    x, bias = activations(rows, k, dtype), bias_of(n, dtype)
    assert_matches(block_fp8_gemm(x, weight, scale, bias), block_fp8_gemm_ref(x, weight, scale, bias))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows", [1, 3, 17, 300])
@pytest.mark.parametrize("acts", ["token", "tensor", "static", "none"])
def test_scaled_gemm_matches_the_reference(dtype, rows, acts):
    weight, scale = weight_and_scales(*RAGGED, "channel")
    x, bias = activations(rows, RAGGED[1], dtype), bias_of(RAGGED[0], dtype)
    out = scaled_fp8_gemm(x, weight, scale, acts, STATIC_SCALE, bias)
    assert_matches(out, scaled_fp8_gemm_ref(x, weight, scale, acts, STATIC_SCALE, bias))


@pytest.mark.parametrize("acts", ["token", "static"])
def test_per_tensor_weight_scale_is_one_value_for_every_row(acts):
    weight, scale = weight_and_scales(*STRADDLING, "tensor")
    x = activations(17, STRADDLING[1], torch.bfloat16)
    for gemm in (scaled_fp8_gemm, scaled_fp8_skinny_gemm):
        rows = x[:MAX_ROWS] if gemm is scaled_fp8_skinny_gemm else x
        ref = scaled_fp8_gemm_ref(rows, weight, scale, acts, STATIC_SCALE)
        assert_matches(gemm(rows, weight, scale, acts, STATIC_SCALE), ref)
        assert_matches(gemm(rows, weight, scale.expand(STRADDLING[0], 1), acts, STATIC_SCALE), ref)  # as layers hold it


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows", [1, 3, MAX_ROWS])
@pytest.mark.parametrize("acts", ["group", "token", "tensor", "static", "none"])
def test_skinny_gemm_matches_the_reference(dtype, rows, acts):
    n, k = RAGGED
    x, bias = activations(rows, k, dtype), bias_of(n, dtype)
    if acts == "group":
        weight, scale = weight_and_scales(n, k, "block")
        out, ref = block_fp8_skinny_gemm(x, weight, scale, bias), block_fp8_gemm_ref(x, weight, scale, bias)
    else:
        weight, scale = weight_and_scales(n, k, "channel")
        out = scaled_fp8_skinny_gemm(x, weight, scale, acts, STATIC_SCALE, bias)
        ref = scaled_fp8_gemm_ref(x, weight, scale, acts, STATIC_SCALE, bias)
    assert_matches(out, ref)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_quantize_rows_gives_the_references_e4m3_bits_and_scales(dtype):
    x = activations(70, 300, dtype)
    for static in (None, STATIC_SCALE):
        q, scale = quantize_rows(x, static)
        want_scale = activation_scale(x, "token") if static is None else static.expand(70, 1)
        assert torch.equal(scale, want_scale)
        assert torch.equal(q.view(torch.uint8), quantize(x.float(), want_scale).view(torch.uint8))
    assert q.float().abs().max() == 448  # saturated, not wrapped


@pytest.mark.parametrize("n, k", [STRADDLING, (300, 1100)], ids=["straddling", "three_block_rows"])
def test_one_row_block_skinny_scales_each_feature_by_its_blocks(n, k):
    """One row streams up to 512 features a step: each feature takes its group's and its weight
    block's scales (columns over several block rows, a last group shorter than 128), under every
    column block that stays inside one block row; one that would not is refused."""
    x = activations(1, k, torch.float32)
    weight, scale = weight_and_scales(n, k, "block")
    ref = block_fp8_gemm_ref(x, weight, scale)
    for cfg in (None, SkinnyConfig(16, 128, 4, 2), SkinnyConfig(64, 256, 4, 3), SkinnyConfig(128, 512, 4, 3)):
        assert_matches(block_fp8_skinny_gemm(x, weight, scale, config=cfg), ref)
    with pytest.raises(ValueError, match="column block dividing 128"):
        block_fp8_skinny_gemm(x, weight, scale, config=SkinnyConfig(48, 512, 4, 3))
    with pytest.raises(ValueError, match="one 128-wide group for 2 rows"):
        block_fp8_skinny_gemm(activations(2, k, torch.float32), weight, scale, config=SkinnyConfig(16, 256, 4, 3))


def test_one_row_default_launch_shapes_cover_long_ragged_rows():
    """One row's default launch shapes for a narrow projection with long rows (as Llama's down
    projection; here K not a multiple of the 2048-wide step), both weight kinds, against the reference."""
    x = activations(1, 8300, torch.float32)
    weight, block_scale = weight_and_scales(72, 8300, "block")
    _, row_scale = weight_and_scales(72, 8300, "channel")
    assert_matches(block_fp8_skinny_gemm(x, weight, block_scale), block_fp8_gemm_ref(x, weight, block_scale))
    assert_matches(
        scaled_fp8_skinny_gemm(x, weight, row_scale, "token"), scaled_fp8_gemm_ref(x, weight, row_scale, "token")
    )


@pytest.mark.parametrize("k", [200, 1100, 2048])
def test_quantize_groups_gives_the_references_e4m3_bits_and_scales(k):
    """The block GEMMs' activations: a short last group, more groups than one program takes, a
    strided input, an all-zero group (its scale the smallest normal, its values zero)."""
    x = torch.zeros(5, k + 7)
    x[:, :k] = activations(5, k, torch.float32) * 1000  # past 448 before scaling
    x[2, :GROUP] = 0.0
    q, scale = quantize_groups(x[:, :k])
    want_q, want_scale = quantize_per_group(x[:, :k])
    assert torch.equal(scale, want_scale)
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
    assert scale[2, 0] == torch.finfo(torch.float32).tiny and not q[2, :GROUP].float().any()


def test_every_launch_shape_covers_every_output():
    """Tiles that do not divide M, N or K: every output computed once (outputs start uninitialised)."""
    x = activations(37, 200, torch.float32)
    weight, block_scale = weight_and_scales(72, 200, "block")
    _, row_scale = weight_and_scales(72, 200, "channel")
    for cfg in (Config(16, 32, 64, 1, 4, 2), Config(32, 64, 128, 4, 4, 3)):
        assert_matches(block_fp8_gemm(x, weight, block_scale, config=cfg), block_fp8_gemm_ref(x, weight, block_scale))
        out = scaled_fp8_gemm(x, weight, row_scale, "token", config=cfg)
        assert_matches(out, scaled_fp8_gemm_ref(x, weight, row_scale, "token"))
    for cfg in (SkinnyConfig(16, 128, 4, 2), SkinnyConfig(64, 256, 4, 3)):
        for rows in (1, 5):
            out = scaled_fp8_skinny_gemm(x[:rows], weight, row_scale, "token", config=cfg)
            assert_matches(out, scaled_fp8_gemm_ref(x[:rows], weight, row_scale, "token"))


def test_zero_activations_and_leading_dims():
    weight, scale = weight_and_scales(*RAGGED, "block")
    bias = bias_of(RAGGED[0], torch.float32)
    zeros = torch.zeros(2, 3, RAGGED[1])
    for gemm in (block_fp8_gemm, block_fp8_skinny_gemm):
        assert torch.equal(gemm(zeros, weight, scale, bias), bias.expand(2, 3, -1))
        assert gemm(zeros[:0], weight, scale).shape == (0, 3, RAGGED[0])


def test_the_kernels_refuse_what_they_cannot_compute():
    weight, scale = weight_and_scales(*RAGGED, "block")
    x = activations(MAX_ROWS + 1, RAGGED[1], torch.bfloat16)
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        block_fp8_gemm(x, weight.float(), scale)
    with pytest.raises(ValueError, match=r"weight_scale must be \[1, 2\]"):
        block_fp8_gemm(x, weight, scale[:, :1])
    with pytest.raises(ValueError, match="at most 8 rows"):
        block_fp8_skinny_gemm(x, weight, scale)
    with pytest.raises(ValueError, match="'group' are not served"):
        scaled_fp8_gemm(x, weight, torch.ones(72), "group")
    with pytest.raises(ValueError, match="static activations need"):
        scaled_fp8_skinny_gemm(x[:1], weight, torch.ones(72), "static")


@pytest.mark.parametrize("rows", [1, 3, 17])
@pytest.mark.parametrize(
    "weights, acts",
    [("BLOCK", "GROUP"), ("CHANNEL", "TOKEN"), ("TENSOR", "STATIC"), ("CHANNEL", "NONE")],
)
def test_fp8_linear_layers_multiply_through_the_kernels(monkeypatch, rows, weights, acts):
    """A quantized Linear as the loader leaves it (scales [N, 1] or per block, input_scale [1]),
    with its product sent to the kernels CUDA would pick for `rows`, equals its CPU reference."""
    from sglang.srt.layers.linear import Linear
    from sglang.srt.layers.quantization import fp8

    scheme = fp8.Fp8Scheme(fp8.WeightScales[weights], fp8.Activations[acts])
    layer = Linear(200, 72, bias=True)
    layer.quantize(fp8.Fp8LinearMethod(scheme))
    weight, scale = weight_and_scales(72, 200, "block" if weights == "BLOCK" else "channel")
    layer.weight.data.copy_(weight)
    layer.weight_scale.data.copy_(scale.expand_as(layer.weight_scale) if weights == "TENSOR" else scale)
    if acts == "STATIC":
        layer.input_scale.data.copy_(STATIC_SCALE * torch.rand(72, 1))  # one per projection as loaded
    layer.quant_method.process_weights_after_loading(layer)
    x = activations(rows, 200, torch.float32)
    with torch.no_grad():
        want = layer(x)
        monkeypatch.setattr(fp8, "fp8_gemms", lambda x: fp8.kernel_gemms(rows))
        assert_matches(layer(x), want)


def test_fp8_layers_pick_the_kernel_that_measured_fastest_for_their_rows():
    """Block-scaled weights: the skinny kernel for 1 to MAX_ROWS rows, the GEMM for more; per-row scales: the skinny kernel for one row only (H100 timings in kernel_gemms)."""
    from sglang.srt.layers.quantization import fp8

    picks = {rows: fp8.kernel_gemms(rows) for rows in (1, 2, MAX_ROWS, MAX_ROWS + 1)}
    assert [picks[r].block for r in picks] == [
        block_fp8_skinny_gemm,
        block_fp8_skinny_gemm,
        block_fp8_skinny_gemm,
        block_fp8_gemm,
    ]
    assert [picks[r].scaled for r in picks] == [
        scaled_fp8_skinny_gemm,
        scaled_fp8_gemm,
        scaled_fp8_gemm,
        scaled_fp8_gemm,
    ]


def test_per_row_products_of_a_few_rows_go_through_triton_even_where_scaled_mm_serves(monkeypatch):
    """backend="auto": up to TRITON_MAX_ROWS rows the Triton GEMM (faster there on an H100), above
    it torch._scaled_mm where it serves (here made to serve, and recorded instead of run)."""
    from sgl_kernel import fp8_gemm

    calls = []

    def scaled_mm(a, b, scale_a, scale_b, out_dtype):
        calls.append(a.shape[0])
        return torch.zeros(a.shape[0], b.shape[1], dtype=out_dtype)

    monkeypatch.setattr(fp8_gemm, "scaled_mm_serves", lambda x, weight, activations: True)
    monkeypatch.setattr(torch, "_scaled_mm", scaled_mm)
    weight, scale = weight_and_scales(72, 200, "channel")
    for rows in (2, fp8_gemm.TRITON_MAX_ROWS):
        x = activations(rows, 200, torch.float32)
        assert_matches(scaled_fp8_gemm(x, weight, scale, "token"), scaled_fp8_gemm_ref(x, weight, scale, "token"))
    assert calls == []
    scaled_fp8_gemm(activations(fp8_gemm.TRITON_MAX_ROWS + 1, 200, torch.float32), weight, scale, "token")
    assert calls == [fp8_gemm.TRITON_MAX_ROWS + 1]
