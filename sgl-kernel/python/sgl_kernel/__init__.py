"""sgl_kernel: the engine's hot kernels (Triton, later CUDA C++), each beside a torch reference.

Each module holds its Triton kernels, the wrapper that launches them and a `*_ref` torch
function with the same signature that the tests compare against. Names are imported lazily,
so `import sgl_kernel` stays cheap and triton is imported only when a kernel is asked for
(after the caller has had the chance to set TRITON_INTERPRET on a machine without a GPU).
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "decode_attention_fwd": "decode_attention",
    "decode_workspace": "decode_attention",
    "extend_attention_fwd": "extend_attention",
    "rmsnorm": "norm",
    "fused_add_rmsnorm": "norm",
    "silu_and_mul": "activation",
    "apply_rotary_embedding_": "rotary",
    "apply_rotary_and_store_kv_": "rotary",
    "fused_experts": "fused_moe",
    "moe_align_block_size": "fused_moe",
    "block_fp8_gemm": "fp8_gemm",
    "scaled_fp8_gemm": "fp8_gemm",
    "block_fp8_skinny_gemm": "fp8_skinny_gemm",
    "scaled_fp8_skinny_gemm": "fp8_skinny_gemm",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'sgl_kernel' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"sgl_kernel.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value
