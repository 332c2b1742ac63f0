"""KV slot allocator: a free list of token slots, with vectorized alloc and free.

Slot 0 is the padding slot: it is never handed out, so padded positions of a batch
can write their KV there without touching a live request.
"""

from __future__ import annotations

import torch


class TokenToKVPoolAllocator:
    """Hands out slot indices in [1, size]; the KV pools have size + 1 rows.

    The free list lives on the host as a head tensor that `alloc` slices from the front and a
    list of freed pieces that are joined onto the head only when it runs short. So a step's
    alloc and free cost what they touch, not the pool's size (a pool can hold millions of slots,
    and copying its whole free list on every free costs milliseconds per decode step).
    Slots are handed out first-freed, first-reused."""

    def __init__(self, size: int, device: str | torch.device = "cpu"):
        if size <= 0:
            raise ValueError(f"KV pool size must be positive, got {size}")
        self.size = size
        self.device = torch.device(device)
        self.clear()

    def clear(self) -> None:
        self._head = torch.arange(1, self.size + 1, dtype=torch.int64)
        self._freed: list[torch.Tensor] = []
        self._num_freed = 0

    def available_size(self) -> int:
        return int(self._head.numel()) + self._num_freed

    def alloc_host(self, num_tokens: int) -> torch.Tensor | None:
        """Returns `num_tokens` free slot indices (int64, on the host), or None if short."""
        if num_tokens > self._head.numel():
            if num_tokens > self.available_size():
                return None
            self._head = torch.cat([self._head, *self._freed])
            self._freed, self._num_freed = [], 0
        taken = self._head[:num_tokens]
        self._head = self._head[num_tokens:]
        return taken

    def alloc(self, num_tokens: int) -> torch.Tensor | None:
        """Returns `num_tokens` free slot indices (int64, on the device), or None if short."""
        taken = self.alloc_host(num_tokens)
        return None if taken is None else taken.to(self.device, non_blocking=True)

    def free(self, indices: torch.Tensor, owned: bool = False) -> None:
        """Gives the slots back. `owned`: `indices` is a 1-D int64 host tensor nobody else holds
        (kept as it is); otherwise a copy is kept, since the caller's tensor (often a view into a
        request's slot list) may change later."""
        if indices.numel() == 0:
            return
        self._freed.append(indices if owned else indices.to("cpu", torch.int64, copy=True).reshape(-1))
        self._num_freed += int(indices.numel())
