"""The models' linear layers: x @ weight.T (+ bias).

A CUDA decode step at small batch multiplies a few rows by every weight, and its time is the time
to stream the weights from memory. Where `sgl_kernel.skinny_gemm` reads them faster than cuBLAS's
split-K kernels (one row, or the logits of up to 16; `faster_than_cublas`) the product goes
through it (bf16 / fp16); everything else (prefill, larger batches, fp32, the CPU) through torch.
SGLANG_DISABLE_SKINNY_GEMM=1 sends every product through torch (for comparisons).

Under tensor parallelism a Llama layer is split Megatron-style: `qkv_proj` and `gate_up_proj` are
plain `Linear`s over each rank's output rows (column-parallel; the loader picks the rows),
`o_proj` and `down_proj` are `RowParallelLinear` (one all-reduce each), and the vocabulary of the
embedding and the lm_head is split by `VocabParallelEmbedding`.
"""

from __future__ import annotations

import dataclasses
import os

import torch
from torch import nn

from sglang.srt.distributed.parallel_state import (
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
    tensor_parallel,
)

SKINNY_GEMM_ENV = "SGLANG_DISABLE_SKINNY_GEMM"
skinny_gemm_enabled = os.environ.get(SKINNY_GEMM_ENV, "0").lower() not in ("1", "true", "yes", "on")


_kernel_module = None


def _skinny():
    """sgl_kernel.skinny_gemm, imported on first use (triton is not a CPU dependency)."""
    global _kernel_module
    if _kernel_module is None:
        from sgl_kernel import skinny_gemm as module

        _kernel_module = module
    return _kernel_module


def uses_skinny_gemm(x: torch.Tensor, weight: torch.Tensor) -> bool:
    if not (
        skinny_gemm_enabled
        and x.is_cuda
        and x.dtype in (torch.bfloat16, torch.float16)
        and weight.dtype == x.dtype
        and weight.dim() == 2
        and weight.stride(-1) == 1
        and x.shape[-1] > 0
    ):
        return False
    return _skinny().faster_than_cublas(x.numel() // x.shape[-1], *weight.shape)  # rows <= MAX_ROWS included


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    if uses_skinny_gemm(x, weight):
        return _skinny().skinny_gemm(x, weight, bias)
    return torch.nn.functional.linear(x, weight, bias)


class Linear(nn.Linear):
    """nn.Linear (same parameters and checkpoint names) whose product goes through `linear`, or
    through its quantization method where the checkpoint quantizes it (layers/quantization)."""

    quant_method = None  # set by `quantize`
    quantizable = True  # False: kept in the model's dtype whatever the checkpoint's quantization (routers)

    def quantize(self, method) -> None:
        """Hold the weight as `method` stores it (it replaces the weight and adds its scales)."""
        method.create_weights(self)
        self.quant_method = method

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self.quant_method is not None:
            return self.quant_method.apply(self, x, bias)
        return linear(x, self.weight, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.matmul(x, self.bias)


@dataclasses.dataclass(frozen=True)
class TpSource:
    """The part of a checkpoint tensor this rank's parameter holds: `size` entries from `start`
    along `dim`, of the `full` entries the checkpoint has there. Set as `param.tp_source`."""

    dim: int
    start: int
    size: int
    full: int


class RowParallelLinear(Linear):
    """Each rank holds a slice of the weight's input columns and multiplies its slice of x; the
    partial products are summed over the ranks (one all-reduce) and the bias, held whole, is added
    once after the sum."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        tp = tensor_parallel()
        if in_features % tp.size:
            raise ValueError(
                f"--tp-size {tp.size} does not divide the {in_features} input features of a row-parallel layer"
            )
        per_rank = in_features // tp.size
        super().__init__(per_rank, out_features, bias=bias)
        self.tp_size = tp.size
        if tp.size > 1:
            self.weight.tp_source = TpSource(1, tp.rank * per_rank, per_rank, in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return self.matmul(x, self.bias)
        out = tensor_model_parallel_all_reduce(self.matmul(x, None))
        return out if self.bias is None else out + self.bias


class VocabParallelEmbedding(nn.Embedding):
    """An embedding (or lm_head) whose vocabulary rows are split over the ranks in equal blocks,
    the last block padded with zero rows. A lookup takes the rows a rank holds and sums over the
    ranks; logits are gathered (`gather_logits`)."""

    def __init__(self, num_embeddings: int, embedding_dim: int):
        tp = tensor_parallel()
        per_rank = -(-num_embeddings // tp.size)
        super().__init__(per_rank if tp.size > 1 else num_embeddings, embedding_dim)
        self.full_shape = (num_embeddings, embedding_dim)
        self.tp_size = tp.size
        self.vocab_start = tp.rank * per_rank
        if tp.size > 1:
            held = max(0, min(per_rank, num_embeddings - self.vocab_start))
            self.weight.tp_source = TpSource(0, self.vocab_start, held, num_embeddings)
            with torch.no_grad():
                self.weight[held:].zero_()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return super().forward(input_ids)
        local = input_ids - self.vocab_start
        held = (local >= 0) & (local < self.num_embeddings)
        rows = nn.functional.embedding(torch.where(held, local, 0), self.weight)
        return tensor_model_parallel_all_reduce(rows * held.unsqueeze(-1).to(rows.dtype))

    def gather_logits(self, local_logits: torch.Tensor) -> torch.Tensor:
        """The logits over the whole vocabulary from each rank's logits over its rows."""
        if self.tp_size == 1:
            return local_logits
        return tensor_model_parallel_all_gather(local_logits)[..., : self.full_shape[0]]


class ParallelLMHead(VocabParallelEmbedding):
    """The output projection over the vocabulary, split like the embedding (tied or not)."""
