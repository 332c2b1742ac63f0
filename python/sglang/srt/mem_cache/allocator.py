"""KV slot allocator: a free list of token slots, with vectorized alloc and free.

Slot 0 is the padding slot: it is never handed out, so padded positions of a batch
can write their KV there without touching a live request.
"""

from __future__ import annotations

import torch

# Device pieces kept apart before they are joined on the device (a large pool refills rarely).
MAX_DEVICE_PIECES = 1024


class TokenToKVPoolAllocator:
    """Hands out slot indices in [1, size]; the KV pools have size + 1 rows.

    The free list lives on the host as a head tensor that `alloc` slices from the front and
    lists of freed pieces that are joined onto the head only when it runs short. So a step's
    alloc and free cost what they touch, not the pool's size (a pool can hold millions of slots,
    and copying its whole free list on every free costs milliseconds per decode step).

    Pieces freed from the device (a finished request's slots read from its table row, evicted
    cache entries) stay there until the head runs short: bringing them to the host at once
    would wait for the device, the step in flight included, on every release. The join copies
    them all in one transfer, which waits once per refill instead.
    Slots are handed out in the order they were freed, host pieces before device ones."""

    def __init__(self, size: int, device: str | torch.device = "cpu"):
        if size <= 0:
            raise ValueError(f"KV pool size must be positive, got {size}")
        self.size = size
        self.device = torch.device(device)
        self.clear()

    def clear(self) -> None:
        self._head = torch.arange(1, self.size + 1, dtype=torch.int64)
        self._freed: list[torch.Tensor] = []  # on the host
        self._freed_device: list[torch.Tensor] = []  # copies on the device, joined on refill
        self._num_freed = 0
        self.device_joins = 0  # refills that brought device pieces to the host (each waits once)

    def available_size(self) -> int:
        return int(self._head.numel()) + self._num_freed

    def alloc_host(self, num_tokens: int) -> torch.Tensor | None:
        """Returns `num_tokens` free slot indices (int64, on the host), or None if short."""
        if num_tokens > self._head.numel():
            if num_tokens > self.available_size():
                return None
            self._refill()
        taken = self._head[:num_tokens]
        self._head = self._head[num_tokens:]
        return taken

    def alloc(self, num_tokens: int) -> torch.Tensor | None:
        """Returns `num_tokens` free slot indices (int64, on the device), or None if short."""
        taken = self.alloc_host(num_tokens)
        return None if taken is None else taken.to(self.device, non_blocking=True)

    def _refill(self) -> None:
        pieces = [self._head, *self._freed]
        if self._freed_device:
            pieces.append(torch.cat(self._freed_device).cpu())  # the one wait for the device
            self.device_joins += 1
        self._head = torch.cat(pieces)
        self._freed, self._freed_device, self._num_freed = [], [], 0

    def free(self, indices: torch.Tensor, owned: bool = False) -> None:
        """Gives the slots back. `owned`: `indices` is a 1-D int64 host tensor nobody else holds
        (kept as it is); otherwise a copy is kept where the slots are, since the caller's tensor
        (often a view into a request's slot list) may change later. A device tensor's copy is
        made on the device, in stream order, so it never waits for the device."""
        count = indices.numel()
        if count == 0:
            return
        if indices.device.type == "cpu":
            self._freed.append(indices if owned else indices.to(torch.int64, copy=True).reshape(-1))
        else:
            self._freed_device.append(indices.to(torch.int64, copy=True).reshape(-1))
            if len(self._freed_device) >= MAX_DEVICE_PIECES:  # joined on the device: no wait
                self._freed_device = [torch.cat(self._freed_device)]
        self._num_freed += count
