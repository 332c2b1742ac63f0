"""The attention backend interface: every backend serves every ForwardMode."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # layers sit below model_executor: type names only
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch


class AttentionBackend(ABC):
    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        """Build whatever per-batch metadata the kernels need, once per forward."""

    def init_cuda_graph_state(self, max_bs: int) -> None:
        """Allocate what graphs of up to max_bs requests need before they are captured."""

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer,
        forward_batch: ForwardBatch,
        save_kv_cache: bool = True,
    ) -> torch.Tensor:
        """q: [tokens, heads * head_dim]; k, v: [tokens, kv_heads * head_dim]. Returns
        [tokens, heads * head_dim]. The new K/V are written to the pool at out_cache_loc first."""
        if forward_batch.forward_mode.is_decode():
            return self.forward_decode(q, k, v, layer, forward_batch, save_kv_cache)
        return self.forward_extend(q, k, v, layer, forward_batch, save_kv_cache)

    @abstractmethod
    def forward_extend(self, q, k, v, layer, forward_batch: ForwardBatch, save_kv_cache: bool) -> torch.Tensor: ...

    @abstractmethod
    def forward_decode(self, q, k, v, layer, forward_batch: ForwardBatch, save_kv_cache: bool) -> torch.Tensor: ...
