"""FP8 linear layers: weights held in float8_e4m3fn with their scales, activations quantized to e4m3
as the checkpoint's scheme says, and config.json's block-wise `quant_method: fp8`.

On CUDA the product goes through sgl_kernel's FP8 GEMMs (fp8_gemm; fp8_skinny_gemm for a few rows,
unless SGLANG_DISABLE_SKINNY_GEMM=1); elsewhere through their torch references (fp8_reference:
the activation quantized and dequantized as the scheme prescribes, the weight dequantized, both
multiplied in float32), which the kernels are tested to equal."""

from __future__ import annotations

import dataclasses
import enum
from typing import Callable

import torch
from torch import nn

from sgl_kernel import fp8_reference
from sgl_kernel.fp8_reference import FP8, FP8_MAX, quantize, quantize_per_group, scale_of  # noqa: F401
from sglang.srt.distributed.parallel_state import tensor_model_parallel_max, tensor_parallel
from sglang.srt.layers import linear
from sglang.srt.layers.linear import TpSource
from sglang.srt.layers.quantization import linear_method_for

BLOCK = fp8_reference.GROUP  # the one weight_block_size served, [128, 128]; activations in groups of 1 x 128


class WeightScales(enum.Enum):
    BLOCK = "block"  # weight_scale_inv [ceil(N/128), ceil(K/128)]
    CHANNEL = "channel"  # weight_scale [N, 1]
    TENSOR = "tensor"  # weight_scale [1] per checkpoint projection, held once per output row


class Activations(enum.Enum):
    GROUP = "group"  # dynamic, per token and 128 input features
    TOKEN = "token"  # dynamic, per token
    TENSOR = "tensor"  # dynamic, one scale for the whole input
    STATIC = "static"  # the checkpoint's input_scale
    NONE = "none"  # weight-only: activations stay in the model's dtype


@dataclasses.dataclass(frozen=True)
class Fp8Scheme:
    weights: WeightScales
    activations: Activations
    scale_name: str = "weight_scale"  # block-wise checkpoints: "weight_scale_inv"

    def __post_init__(self):
        if (self.weights is WeightScales.BLOCK) != (self.activations is Activations.GROUP):
            raise ValueError(
                f"FP8 {self.weights.value} weight scales with {self.activations.value} activations are not "
                "served; block-wise weights go with per-group activations, and only they"
            )


def fake_quantize_activation(x: torch.Tensor, activations: Activations, input_scale=None) -> torch.Tensor:
    """x [M, K] float32 quantized to e4m3 as `activations` says, and back to float32."""
    return fp8_reference.fake_quantize_activation(x, activations.value, input_scale)


def dequantize_weight(weight: torch.Tensor, scale: torch.Tensor, weights: WeightScales) -> torch.Tensor:
    """The float32 weight [N, K]: each e4m3 entry times its block's, row's or tensor's scale."""
    if weights is WeightScales.BLOCK:
        return fp8_reference.dequantize_block_weight(weight, scale)
    return fp8_reference.dequantize_row_weight(weight, scale)


@dataclasses.dataclass(frozen=True)
class Fp8Gemms:
    """The two FP8 products of one implementation (kernels or references), with their signatures."""

    block: Callable  # (x, weight, weight_scale_inv, bias=None)
    scaled: Callable  # (x, weight, weight_scale, activations, input_scale=None, bias=None)


REFERENCE_GEMMS = Fp8Gemms(fp8_reference.block_fp8_gemm_ref, fp8_reference.scaled_fp8_gemm_ref)


def fp8_gemms(x: torch.Tensor) -> Fp8Gemms:
    """The products for x: sgl_kernel's on CUDA, the torch references elsewhere."""
    return kernel_gemms(x.numel() // max(1, x.shape[-1])) if x.is_cuda else REFERENCE_GEMMS


def kernel_gemms(rows: int) -> Fp8Gemms:
    """sgl_kernel's FP8 GEMMs for `rows` activation rows, as they measured on an H100 at Llama-3.1-8B's
    shapes (python -m sglang.benchmark.fp8_gemm): block-scaled weights take the skinny kernel for 1 to
    MAX_ROWS rows (one row: 97 us a layer's four projections against the GEMM's 119; 2-8 rows: its fp8
    dot over pre-quantized rows beat the GEMM by 2-20%); per-row scales take it for one row only
    (1.1-2.0x faster than the GEMM there; at 4-8 rows 1.7-5.8x slower). Imported on first use (triton is
    not a CPU dependency)."""
    from sgl_kernel import fp8_gemm, fp8_skinny_gemm

    skinny = linear.skinny_gemm_enabled
    block_skinny = skinny and rows <= fp8_skinny_gemm.MAX_ROWS
    return Fp8Gemms(
        fp8_skinny_gemm.block_fp8_skinny_gemm if block_skinny else fp8_gemm.block_fp8_gemm,
        fp8_skinny_gemm.scaled_fp8_skinny_gemm if skinny and rows == 1 else fp8_gemm.scaled_fp8_gemm,
    )


def fp8_linear(x, weight, weight_scale, scheme: Fp8Scheme, input_scale=None, bias=None) -> torch.Tensor:
    """x @ W.T (+ bias) of an FP8 weight, in x's dtype."""
    gemms = fp8_gemms(x)
    if scheme.weights is WeightScales.BLOCK:
        return gemms.block(x, weight, weight_scale, bias=bias)
    return gemms.scaled(x, weight, weight_scale, scheme.activations.value, input_scale, bias=bias)


@dataclasses.dataclass(frozen=True)
class ScaleLayout:
    """Where a checkpoint scale lands in its parameter (`param.scale_layout`, read by the loader):
    each entry covers `rows` x `cols` weight entries (`cols` None: all columns). `scalar`: the
    checkpoint holds one value per projection, copied to each of its output rows."""

    rows: int
    cols: int | None
    scalar: bool = False

    def destination(self, param: nn.Parameter, shard) -> tuple[torch.Tensor, TpSource | None]:
        """The view a checkpoint tensor fills (`shard`: the FusedShard of a fused layer, or None)
        and the part of it this rank takes (None: all)."""
        if shard is None:
            return param.data, None if self.scalar else getattr(param, "tp_source", None)
        start, size = _span(shard.offset, shard.size, self.rows, param.shape[0], "fused projection")
        dest = param.data.narrow(0, start, size)
        if self.scalar or tensor_parallel().size == 1:
            return dest, None
        full = shard.source_rows or shard.size
        source_start, _ = _span(shard.source_start, shard.size, self.rows, -(-full // self.rows), "rank's rows")
        return dest, TpSource(0, source_start, size, -(-full // self.rows))

    def fit(self, name: str, tensor: torch.Tensor, dest: torch.Tensor) -> torch.Tensor:
        if not self.scalar:
            return tensor
        if tensor.numel() != 1:
            raise ValueError(f"{name!r} has shape {tuple(tensor.shape)}; a per-tensor scale holds one value")
        return tensor.reshape(1, 1).expand(dest.shape)

    def tp_source(self, weight_source: TpSource | None) -> TpSource | None:
        """A scale's share of its checkpoint tensor, from its weight's (set at creation)."""
        if weight_source is None or self.scalar:
            return None
        block = self.rows if weight_source.dim == 0 else self.cols
        if block is None:  # one scale for all columns: every rank holds it whole
            return None
        full = -(-weight_source.full // block)
        start, size = _span(weight_source.start, weight_source.size, block, full, "rank's share")
        return TpSource(weight_source.dim, start, size, full)


def _span(start: int, size: int, block: int, blocks: int, what: str) -> tuple[int, int]:
    """Entries [start, start + size) in whole blocks: the blocks' (first, count). A span may end
    inside a block only where the tensor ends."""
    first, count = start // block, -(-size // block)
    if start % block or (size % block and first + count != blocks):
        raise ValueError(
            f"a {what} of {size} rows from {start} does not fall on whole {block}-row FP8 scale blocks; "
            f"block-wise FP8 needs each split of a weight to be a multiple of {block}"
        )
    return first, count


class Fp8LinearMethod:
    """A linear layer's FP8 parameters and product under one scheme."""

    def __init__(self, scheme: Fp8Scheme):
        self.scheme = scheme

    def create_weights(self, layer: nn.Module) -> None:
        """Replaces the layer's weight by an e4m3 one of the same shape, and adds its scales."""
        n, k = layer.weight.shape
        source = getattr(layer.weight, "tp_source", None)
        device = layer.weight.device
        layer.weight = _param(torch.empty(n, k, dtype=FP8, device=device), source)
        weights = self.scheme.weights
        if weights is WeightScales.BLOCK:
            layout, shape = ScaleLayout(BLOCK, BLOCK), (-(-n // BLOCK), -(-k // BLOCK))
        else:
            layout, shape = ScaleLayout(1, None, scalar=weights is WeightScales.TENSOR), (n, 1)
        scale = _param(torch.ones(shape, dtype=torch.float32, device=device), layout.tp_source(source), layout)
        layer.register_parameter(self.scheme.scale_name, scale)
        if self.scheme.activations is Activations.STATIC:
            # One value per projection as loaded; a fused layer's projections read one input, so
            # their largest scale serves all of them (process_weights_after_loading).
            layout = ScaleLayout(1, None, scalar=True)
            input_scale = _param(torch.ones(n, 1, dtype=torch.float32, device=device), None, layout)
            layer.register_parameter("input_scale", input_scale)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        if self.scheme.activations is Activations.STATIC:
            layer.input_scale = nn.Parameter(layer.input_scale.data.max().reshape(1), requires_grad=False)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        scale = getattr(layer, self.scheme.scale_name)
        return fp8_linear(x, layer.weight, scale, self.scheme, getattr(layer, "input_scale", None), bias)


class Fp8MoEMethod:
    """A FusedMoE layer's experts in block-wise FP8: the stacked weights e4m3, each expert's
    projections scaled per 128 x 128 block. The gate's and the up's scales are stacked as their
    weights are, each starting on a block row of its own (the gate's ceil(I/128) rows, then the
    up's), so an intermediate size that is no multiple of 128 still gives each block one projection.
    Under tensor parallelism each rank's intermediate rows must be whole blocks."""

    def create_weights(self, layer: nn.Module) -> None:
        num_experts, hidden, inter = layer.w2_weight.shape
        if layer.tp_size > 1 and inter % BLOCK:
            raise ValueError(
                f"--tp-size {layer.tp_size} splits the experts' intermediate size {inter * layer.tp_size} into "
                f"{inter} rows per rank, which is not a multiple of the {BLOCK}-row blocks of "
                f"quantization_config.weight_block_size; use a --tp-size that leaves whole blocks on each rank"
            )
        device = layer.w2_weight.device
        layer.w13_weight = _param(torch.empty(num_experts, 2 * inter, hidden, dtype=FP8, device=device), None)
        layer.w2_weight = _param(torch.empty(num_experts, hidden, inter, dtype=FP8, device=device), None)
        inter_blocks, hidden_blocks = -(-inter // BLOCK), -(-hidden // BLOCK)
        layout = ScaleLayout(BLOCK, BLOCK)
        for name, shape in (
            ("w13_weight_scale_inv", (num_experts, 2 * inter_blocks, hidden_blocks)),
            ("w2_weight_scale_inv", (num_experts, hidden_blocks, inter_blocks)),
        ):
            layer.register_parameter(name, _param(torch.ones(shape, dtype=torch.float32, device=device), None, layout))

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        pass  # the kernels read the checkpoint's layout as loaded


class OnlineFp8LinearMethod(Fp8LinearMethod):
    """`--quantization fp8`: the checkpoint's weight loads as it is, then becomes e4m3 with one
    scale per output row (its amax / 448); activations are quantized per token at run time."""

    def __init__(self):
        super().__init__(Fp8Scheme(WeightScales.CHANNEL, Activations.TOKEN))

    def create_weights(self, layer: nn.Module) -> None:
        pass  # the float weight is loaded first

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        weight = layer.weight.data.float()
        amax = weight.abs().amax(dim=1, keepdim=True)
        source = getattr(layer.weight, "tp_source", None)
        if source is not None and source.dim == 1:
            # A row-parallel rank holds part of each row: the row's scale is its largest over all
            # the ranks, so that N ranks hold the slices of the weight one rank would.
            amax = tensor_model_parallel_max(amax)
        scale = scale_of(amax)
        layer.weight = _param(quantize(weight, scale), source)
        layer.register_parameter("weight_scale", _param(scale, None))


class OnlineFp8Config:
    """`--quantization fp8` on an unquantized checkpoint: every linear layer (not the embedding,
    the head or the norms) quantized per channel at load (OnlineFp8LinearMethod)."""

    def __init__(self):
        self.method = OnlineFp8LinearMethod()

    def linear_method(self, names: list[str]) -> Fp8LinearMethod:
        return self.method


def _param(data: torch.Tensor, tp_source: TpSource | None, layout: ScaleLayout | None = None) -> nn.Parameter:
    param = nn.Parameter(data, requires_grad=False)
    if tp_source is not None and tensor_parallel().size > 1:
        param.tp_source = tp_source
    if layout is not None:
        param.scale_layout = layout
    return param


class Fp8Config:
    """config.json `quantization_config: {quant_method: fp8, fmt: e4m3, activation_scheme: dynamic,
    weight_block_size: [128, 128]}` (Qwen3-*-FP8, DeepSeek style): e4m3 weights with
    `weight_scale_inv` per 128 x 128 block, activations quantized per token and 128 features.
    `modules_to_not_convert` / `ignored_layers` stay in the model's dtype. A mixture-of-experts
    model's routed experts are FP8 the same way (Fp8MoEMethod); its routers never are (the
    published checkpoints list every layer's `mlp.gate`)."""

    def __init__(self, ignore: list[str]):
        self.ignore = ignore
        self.method = Fp8LinearMethod(Fp8Scheme(WeightScales.BLOCK, Activations.GROUP, "weight_scale_inv"))
        self.moe = Fp8MoEMethod()

    @classmethod
    def from_config(cls, raw: dict) -> "Fp8Config":
        fmt = raw.get("fmt", "e4m3")
        if fmt != "e4m3":
            raise ValueError(f"quantization_config.fmt {fmt!r} (fp8) is not served; served: e4m3")
        scheme = raw.get("activation_scheme", "dynamic")
        if scheme != "dynamic":
            raise ValueError(f"quantization_config.activation_scheme {scheme!r} (fp8) is not served; served: dynamic")
        block = raw.get("weight_block_size")
        if list(block or []) != [BLOCK, BLOCK]:
            raise ValueError(
                f"quantization_config.weight_block_size {block!r} (fp8) is not served; served: [{BLOCK}, {BLOCK}]"
            )
        return cls(list(raw.get("modules_to_not_convert") or []) + list(raw.get("ignored_layers") or []))

    def linear_method(self, names: list[str]) -> Fp8LinearMethod | None:
        return linear_method_for(names, self.ignore, self.method, "quantization_config.modules_to_not_convert")

    def moe_method(self, names: list[str]) -> Fp8MoEMethod | None:
        """For a FusedMoE layer whose checkpoint modules (every expert's projections) are `names`."""
        return linear_method_for(names, self.ignore, self.moe, "quantization_config.modules_to_not_convert")
