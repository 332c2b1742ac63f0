"""The reference attention backend: gathers each request's KV from the pool and calls
torch's scaled_dot_product_attention. Correct on CPU and CUDA for every forward mode;
faster backends are tested against it. An FP8 pool's K and V are widened to q's dtype (exact)
and their scales applied as the triton kernels apply them: k_scale to the softmax scale,
v_scale to the output."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch
import torch.nn.functional as F

from sglang.srt.layers.attention.base import AttentionBackend

if TYPE_CHECKING:  # layers sit below model_executor: type names only
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch


class TorchNativeAttnBackend(AttentionBackend):
    def __init__(self, model_runner=None):
        self.batch = None  # the ForwardBatch that the fields below were built for
        self.slots = torch.empty(0, dtype=torch.int64)  # every request's KV slots, one after another
        self.requests: list[tuple[int, int, int, Optional[torch.Tensor]]] = []  # (new, first, end, mask)

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        """Each request's new tokens, KV slots and causal mask: the same in every layer, so built
        once per forward, and the slots of the whole batch gathered in one index per layer (48
        requests decoding 40 tokens each on the demo model, CPU: 4.6 -> 2.9 CPU-s for the
        scheduler's whole run, against slots, masks and gathers per request and layer)."""
        seq_lens = fb.seq_lens_cpu if fb.seq_lens_cpu is not None else fb.seq_lens.tolist()
        new_lens = fb.extend_seq_lens.tolist() if fb.extend_seq_lens is not None else fb.extend_seq_lens_cpu
        device = fb.input_ids.device
        self.batch, self.requests, slots, end = fb, [], [], 0
        for i in range(fb.batch_size):
            new_len, seq_len = new_lens[i], seq_lens[i]
            if new_len == 0:  # a prefill graph's padding request
                self.requests.append((0, end, end, None))
                continue
            slots.append(fb.req_to_token_pool.req_to_token[fb.req_pool_indices[i], :seq_len])
            query_pos = torch.arange(seq_len - new_len, seq_len, device=device)
            mask = torch.arange(seq_len, device=device)[None, :] <= query_pos[:, None]
            self.requests.append((new_len, end, end + seq_len, mask))
            end += seq_len
        self.slots = torch.cat(slots).to(torch.int64) if slots else torch.empty(0, dtype=torch.int64, device=device)

    def forward_extend(self, q, k, v, layer, forward_batch: ForwardBatch, save_kv_cache: bool):
        return self._attend(q, k, v, layer, forward_batch, save_kv_cache)

    def forward_decode(self, q, k, v, layer, forward_batch: ForwardBatch, save_kv_cache: bool):
        return self._attend(q, k, v, layer, forward_batch, save_kv_cache)

    def _attend(self, q, k, v, layer, fb: ForwardBatch, save_kv_cache: bool) -> torch.Tensor:
        pool = fb.token_to_kv_pool
        if save_kv_cache:
            pool.set_kv_buffer(
                layer.layer_id,
                fb.out_cache_loc,
                k.view(-1, layer.num_kv_heads, layer.head_dim),
                v.view(-1, layer.num_kv_heads, layer.head_dim),
            )
        k_cache, v_cache = pool.get_key_buffer(layer.layer_id), pool.get_value_buffer(layer.layer_id)
        k_scale, v_scale = pool.get_kv_scales(layer.layer_id)
        q = q.view(-1, layer.num_heads, layer.head_dim)
        out = torch.empty_like(q)
        start = 0
        assert self.batch is fb, "init_forward_metadata(fb) comes first, once per forward"
        # A loop over requests is the point of a reference backend: each request is
        # computed on its own, so nothing in the batch can leak into it.
        keys, values = k_cache[self.slots], v_cache[self.slots]
        for new_len, first, end, mask in self.requests:
            if new_len == 0:  # a prefill graph's padding request
                continue
            out[start : start + new_len] = _causal_attention(
                q[start : start + new_len], keys[first:end], values[first:end], mask, layer.scaling * k_scale, v_scale
            )
            start += new_len
        return out.view(-1, layer.num_heads * layer.head_dim)


def _causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scaling: float, v_scale: float = 1.0
) -> torch.Tensor:
    """q: [new, H, D] for the last `new` positions of a sequence whose keys are k, v [seq, KV, D]
    (values times v_scale are the real ones); mask: [new, seq], the keys each position sees."""
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0),
        k.to(q.dtype).transpose(0, 1).unsqueeze(0),
        v.to(q.dtype).transpose(0, 1).unsqueeze(0),
        attn_mask=mask,
        scale=scaling,
        enable_gqa=True,
    )
    out = out.squeeze(0).transpose(0, 1)
    return out if v_scale == 1.0 else out * v_scale
