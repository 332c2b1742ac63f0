"""Memory pools: request slot -> KV slots (ReqToTokenPool), and the per-layer KV buffers."""

from __future__ import annotations

import math
import mmap

import torch


def zeros(shape: tuple[int, ...], dtype: torch.dtype, device: str | torch.device) -> torch.Tensor:
    """torch.zeros, but on the CPU in a private anonymous mapping: the kernel hands out its pages
    zero-filled on first touch, so a KV pool sized for 65,536 tokens costs only the pages that
    requests write (torch.zeros wrote all of them: 0.8 CPU-s for the demo model's 1.3 GB)."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes == 0:
        return torch.zeros(shape, dtype=dtype)
    pages = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return torch.frombuffer(pages, dtype=torch.uint8).view(dtype).view(shape)  # the tensor keeps the mapping


class ReqToTokenPool:
    """[size, max_context_len] int32 table: row = a running request, column = a position,
    value = the KV slot holding that position's keys and values."""

    def __init__(self, size: int, max_context_len: int, device: str | torch.device):
        self.size = size
        self.max_context_len = max_context_len
        self.req_to_token = torch.zeros((size, max_context_len), dtype=torch.int32, device=device)
        self.free_rows = list(range(size))
        self._staging = None  # write_scattered's host buffers (made on first use) and their size
        self._capacity = 0

    def available_size(self) -> int:
        return len(self.free_rows)

    def alloc(self) -> int | None:
        return self.free_rows.pop() if self.free_rows else None

    def free(self, row: int) -> None:
        self.free_rows.append(row)

    def write(self, row: int, start: int, slots: torch.Tensor) -> None:
        self.req_to_token[row, start : start + slots.numel()] = slots.to(torch.int32)

    def write_scattered(self, rows, columns, slots: torch.Tensor) -> torch.Tensor:
        """req_to_token[rows[i], columns[i]] = slots[i] (`slots`: host int64; rows and columns:
        int sequences or arrays of its length), in one scatter; returns the slots on the device.
        Rows, columns and slots travel in one copy (a decode step's one per request, a prefill's
        one per new token; each separate copy of a few values costs the host ~20-30 us on CUDA)."""
        n = len(slots)
        if self._staging is None or n > self._capacity:  # grows to the largest write seen
            from sglang.srt.utils import HostStaging

            self._capacity = max(self.size, 1 << (n - 1).bit_length())
            self._staging = HostStaging(3 * self._capacity, self.req_to_token.device, device_buffers=True)
        cap = self._capacity
        host = self._staging.fill()
        host[:n] = rows
        host[cap : cap + n] = columns
        host[2 * cap : 2 * cap + n] = slots.numpy()
        sent = self._staging.send()
        device_slots = sent[2 * cap : 2 * cap + n]
        self.req_to_token.index_put_((sent[:n], sent[cap : cap + n]), device_slots.to(torch.int32))
        return device_slots

    def read(self, row: int, start: int, end: int) -> torch.Tensor:
        return self.req_to_token[row, start:end].to(torch.int64)


# --kv-cache-dtype values besides "auto" (the model's dtype), and the torch dtype each stores.
FP8_KV_CACHE_DTYPES = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


def kv_cache_dtype(flag: str, model_dtype: torch.dtype) -> torch.dtype:
    """The dtype the KV pool stores for --kv-cache-dtype `flag` (validated by ServerArgs)."""
    return model_dtype if flag == "auto" else FP8_KV_CACHE_DTYPES[flag]


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype in FP8_KV_CACHE_DTYPES.values()


def quantize_kv(x: torch.Tensor, inv_scale: float, dtype: torch.dtype) -> torch.Tensor:
    """x * inv_scale saturated to dtype's finite range and rounded to it (a plain cast would
    turn values past e4m3's 448 into NaN)."""
    limit = torch.finfo(dtype).max
    return (x.float() * inv_scale).clamp_(-limit, limit).to(dtype)


class MHATokenToKVPool:
    """Per-layer K and V buffers of shape [size + 1, num_kv_heads, head_dim]; row 0 is padding.

    In FP8 (e4m3 / e5m2) each layer has a K and a V scale (from the checkpoint, else 1.0): a
    stored value times its scale is the real one. Writes divide by the scale and saturate; the
    attention backends read the raw buffers and apply the scales in their kernels."""

    def __init__(
        self,
        size: int,
        dtype: torch.dtype,
        num_kv_heads: int,
        head_dim: int,
        num_layers: int,
        device: str | torch.device,
        kv_scales: dict[int, tuple[float, float]] | None = None,
    ):
        """kv_scales: {layer id: (k_scale, v_scale)}, FP8 only; a layer not in it gets 1.0."""
        self.size = size
        self.dtype = dtype
        self.is_fp8 = is_fp8(dtype)
        if kv_scales and not self.is_fp8:
            raise ValueError(f"KV scales apply to an FP8 KV cache, not to {dtype}")
        scales = [(kv_scales or {}).get(layer, (1.0, 1.0)) for layer in range(num_layers)]
        self.k_scales = [float(k) for k, _ in scales]
        self.v_scales = [float(v) for _, v in scales]
        shape = (size + 1, num_kv_heads, head_dim)
        self.k_buffer = [zeros(shape, dtype, device) for _ in range(num_layers)]
        self.v_buffer = [zeros(shape, dtype, device) for _ in range(num_layers)]

    @staticmethod
    def bytes_per_token(dtype: torch.dtype, num_kv_heads: int, head_dim: int, num_layers: int) -> int:
        return 2 * num_kv_heads * head_dim * num_layers * dtype.itemsize

    @property
    def token_bytes(self) -> int:
        """The bytes one token's K and V take over every layer."""
        return len(self.k_buffer) * 2 * self.k_buffer[0][0].numel() * self.k_buffer[0].element_size()

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self.k_buffer[layer_id]

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self.v_buffer[layer_id]

    def get_kv_scales(self, layer_id: int) -> tuple[float, float]:
        """(k_scale, v_scale) of a layer: 1.0 and 1.0 unless the pool is FP8 with checkpoint scales."""
        return self.k_scales[layer_id], self.v_scales[layer_id]

    def set_kv_buffer(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        if self.is_fp8:
            k = quantize_kv(k, 1.0 / self.k_scales[layer_id], self.dtype)
            v = quantize_kv(v, 1.0 / self.v_scales[layer_id], self.dtype)
        self.k_buffer[layer_id][loc] = k.to(self.dtype)
        self.v_buffer[layer_id][loc] = v.to(self.dtype)

    def dequantized(self, layer_id: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of `slots` as float32 real values (tests and references)."""
        k_scale, v_scale = self.get_kv_scales(layer_id)
        return (
            self.k_buffer[layer_id][slots].float() * k_scale,
            self.v_buffer[layer_id][slots].float() * v_scale,
        )
