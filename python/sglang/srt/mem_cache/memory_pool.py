"""Memory pools: request slot -> KV slots (ReqToTokenPool), and the per-layer KV buffers."""

from __future__ import annotations

import torch


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


class MHATokenToKVPool:
    """Per-layer K and V buffers of shape [size + 1, num_kv_heads, head_dim]; row 0 is padding."""

    def __init__(
        self,
        size: int,
        dtype: torch.dtype,
        num_kv_heads: int,
        head_dim: int,
        num_layers: int,
        device: str | torch.device,
    ):
        self.size = size
        self.dtype = dtype
        shape = (size + 1, num_kv_heads, head_dim)
        self.k_buffer = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v_buffer = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    @staticmethod
    def bytes_per_token(dtype: torch.dtype, num_kv_heads: int, head_dim: int, num_layers: int) -> int:
        return 2 * num_kv_heads * head_dim * num_layers * torch.tensor([], dtype=dtype).element_size()

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self.k_buffer[layer_id]

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self.v_buffer[layer_id]

    def set_kv_buffer(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k_buffer[layer_id][loc] = k.to(self.dtype)
        self.v_buffer[layer_id][loc] = v.to(self.dtype)
