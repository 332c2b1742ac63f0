"""KV slot allocator: a free list of token slots, with vectorized alloc and free.

Slot 0 is the padding slot: it is never handed out, so padded positions of a batch
can write their KV there without touching a live request.
"""

from __future__ import annotations

import torch


class TokenToKVPoolAllocator:
    """Hands out slot indices in [1, size]; the KV pools have size + 1 rows."""

    def __init__(self, size: int, device: str | torch.device = "cpu"):
        if size <= 0:
            raise ValueError(f"KV pool size must be positive, got {size}")
        self.size = size
        self.device = torch.device(device)
        self.clear()

    def clear(self) -> None:
        # The free list lives on the host: alloc/free are slices and cats, no per-token loop.
        self.free_slots = torch.arange(1, self.size + 1, dtype=torch.int64)

    def available_size(self) -> int:
        return int(self.free_slots.numel())

    def alloc(self, num_tokens: int) -> torch.Tensor | None:
        """Returns `num_tokens` free slot indices (int64, on the device), or None if short."""
        if num_tokens > self.free_slots.numel():
            return None
        taken = self.free_slots[:num_tokens]
        self.free_slots = self.free_slots[num_tokens:]
        return taken.to(self.device, non_blocking=True)

    def free(self, indices: torch.Tensor) -> None:
        if indices.numel() == 0:
            return
        self.free_slots = torch.cat((self.free_slots, indices.to("cpu", torch.int64)))
