"""Makes Triton 3.6's CPU interpreter (TRITON_INTERPRET=1, used by the CPU tests) compute what
the GPU computes for our kernels. Nothing here runs on a GPU.

Four gaps, each patched only while interpreting:
- a loop bound read from memory (`range(start, end)`) becomes a Python int through
  int(array), which numpy >= 2.4 refuses for the 1-element arrays the interpreter holds
  (triton-lang/triton#9171, fixed upstream after 3.6): convert through a 0-d view;
- fp32 -> bf16 casts truncate, where the GPU rounds to nearest even: round;
- tl.dot on bf16 tiles multiplies their raw uint16 bits: widen them to fp32 first
  (exact, as on the GPU's tensor cores, which accumulate bf16 products in fp32);
- casts to e4m3 (tl.float8e4nv) and e5m2 (tl.float8e5) truncate (e4m3 without carrying into the
  exponent, wrapping past 448), where the GPU rounds to nearest even and saturates
  (cvt.rn.satfinite): cast through torch, clamped to the format's largest finite value.
"""

from __future__ import annotations

import os

import numpy as np

_applied = False


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def fix_interpreter() -> None:
    global _applied
    if _applied or not interpreting():
        return
    import triton.language as tl
    from triton.runtime import interpreter

    _patch_scalar_index(interpreter)
    _patch_bf16(interpreter, tl)
    _patch_fp8(interpreter, tl)
    _applied = True


def _patch_scalar_index(interpreter) -> None:
    patch_tensor = interpreter._patch_lang_tensor

    def patch_tensor_with_scalar_index(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(())))

    interpreter._patch_lang_tensor = patch_tensor_with_scalar_index


def _patch_bf16(interpreter, tl) -> None:
    builder = interpreter.InterpreterBuilder
    cast_impl, create_dot = builder.cast_impl, builder.create_dot

    def cast_rounding_to_nearest(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            return interpreter.TensorHandle(_fp32_to_bf16_bits(src.data), tl.bfloat16)
        return cast_impl(self, src, dst_type)

    def dot_widening_bf16(self, a, b, d, input_precision, max_num_imprecise_acc):
        a, b = (
            interpreter.TensorHandle(_bf16_bits_to_fp32(t.data), tl.float32) if t.dtype.scalar == tl.bfloat16 else t
            for t in (a, b)
        )
        return create_dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    builder.cast_impl = cast_rounding_to_nearest
    builder.create_dot = dot_widening_bf16


def _fp32_to_bf16_bits(data: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(data, dtype=np.float32).view(np.uint32)
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    return np.where(np.isnan(data), np.uint16(0x7FC0), rounded)


def _bf16_bits_to_fp32(bits: np.ndarray) -> np.ndarray:
    return (np.ascontiguousarray(bits).astype(np.uint32) << 16).view(np.float32)


def _patch_fp8(interpreter, tl) -> None:
    builder = interpreter.InterpreterBuilder
    cast_impl, fp_to_fp = builder.cast_impl, builder.create_fp_to_fp

    def to_fp32(handle) -> np.ndarray:
        if handle.dtype.scalar == tl.bfloat16:
            return _bf16_bits_to_fp32(handle.data)
        return np.asarray(handle.data, dtype=np.float32)

    formats = {tl.float8e4nv: "float8_e4m3fn", tl.float8e5: "float8_e5m2"}

    def cast_fp8(self, src, dst_type, fallback):
        fmt = formats.get(dst_type.scalar)
        if fmt is not None and src.dtype.scalar in (tl.float32, tl.float16, tl.bfloat16):
            return interpreter.TensorHandle(_fp32_to_fp8_bits(to_fp32(src), fmt), dst_type.scalar)
        return fallback()

    builder.cast_impl = lambda self, src, dst_type: cast_fp8(
        self, src, dst_type, lambda: cast_impl(self, src, dst_type)
    )
    builder.create_fp_to_fp = lambda self, src, dst_type, rounding_mode: cast_fp8(
        self, src, dst_type, lambda: fp_to_fp(self, src, dst_type, rounding_mode)
    )


def _fp32_to_fp8_bits(data: np.ndarray, fmt: str) -> np.ndarray:
    import torch

    dtype = getattr(torch, fmt)
    largest = torch.finfo(dtype).max
    values = torch.from_numpy(np.ascontiguousarray(data, dtype=np.float32))
    return values.clamp(-largest, largest).to(dtype).view(torch.uint8).numpy()
