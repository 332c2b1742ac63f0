"""The `triton` attention backend: sgl_kernel's paged decode attention (split-K) and extend
attention over a cached prefix, both reading KV through req_to_token (an FP8 pool's K/V as
stored, with the pool's per-layer scales applied in the kernels). Default on CUDA.

Decode needs no per-batch metadata beyond the batch's own tensors, so a CUDA graph replays
it with only its input buffers refreshed; graphs of extend-shaped modes (verify, draft extend)
build their constant per-row lengths on the device during capture."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from sglang.srt.layers.attention.base import AttentionBackend

if TYPE_CHECKING:  # layers sit below model_executor: type names only
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

# Splits of the KV sequence in decode: enough programs to fill the GPU at batch 1 (132 SMs on
# an H200 over 8 KV-head groups), few enough that the reduction stays cheap.
DEFAULT_NUM_KV_SPLITS = 16


class TritonAttnBackend(AttentionBackend):
    def __init__(self, model_runner):
        from sgl_kernel import decode_attention, extend_attention

        self._decode = decode_attention
        self._extend = extend_attention
        cfg = model_runner.model_config
        # This rank's heads (all of them without tensor parallelism).
        self.num_heads, self.head_dim = model_runner.num_heads, cfg.head_dim
        self.device = model_runner.device
        self.num_kv_splits = DEFAULT_NUM_KV_SPLITS
        self.workspace = None  # decode scratch, grown on demand and reused (also by CUDA graphs)
        # Outgrown workspaces stay allocated: a CUDA graph captured before the growth still
        # writes to the old one, and freed memory would be handed to other tensors (corrupting
        # them, or an illegal address once the allocator released it).
        self.retired_workspaces: list[torch.Tensor] = []
        self.extend_meta = None

    def precompile(self, model_runner) -> None:
        """Compile extend attention now for every tile shape `launch_config` can pick for this
        model. BLOCK_M follows the longest new part of a batch in powers of two, so otherwise the
        first prefill whose longest new part falls in a smaller class (a radix-cache hit that
        leaves a few tokens, a catch-up piece) compiles the kernel while every request waits.
        One request over slot 0 (the pools' padding slot) through a scratch req_to_token row,
        with q laid out both ways the models pass it (a slice of the fused qkv output, and
        contiguous after a q/k norm); the pools are not written."""
        if torch.device(self.device).type != "cuda":
            return
        cfg = model_runner.model_config
        kv_heads, head_dim, dtype = model_runner.num_kv_heads, self.head_dim, cfg.dtype
        pool = model_runner.token_to_kv_pool
        real_rows = model_runner.req_to_token_pool.req_to_token
        rows = torch.zeros((1, real_rows.shape[1]), dtype=real_rows.dtype, device=self.device)
        first_row = torch.zeros(1, dtype=torch.int64, device=self.device)
        compiled = set()
        new_tokens = 1
        while new_tokens <= real_rows.shape[1]:
            tile = self._extend.launch_config(head_dim, dtype, self.num_heads // kv_heads, new_tokens)["BLOCK_M"]
            if tile not in compiled:
                compiled.add(tile)
                qkv = torch.zeros(
                    (new_tokens, (self.num_heads + 2 * kv_heads) * head_dim), dtype=dtype, device=self.device
                )
                lens = torch.full((1,), new_tokens, dtype=torch.int64, device=self.device)
                for q in (
                    qkv[:, : self.num_heads * head_dim].view(new_tokens, self.num_heads, head_dim),
                    torch.zeros((new_tokens, self.num_heads, head_dim), dtype=dtype, device=self.device),
                ):
                    self._extend.extend_attention_fwd(
                        q,
                        torch.empty_like(q),
                        pool.get_key_buffer(0),
                        pool.get_value_buffer(0),
                        rows,
                        first_row,
                        lens,
                        lens,
                        first_row,
                        new_tokens,
                        head_dim**-0.5,
                    )
            new_tokens *= 2
        torch.cuda.synchronize(self.device)

    def _decode_workspace(self, bs: int) -> torch.Tensor:
        if self.workspace is None or self.workspace.shape[0] < bs:
            if self.workspace is not None:
                self.retired_workspaces.append(self.workspace)
            self.workspace = self._decode.decode_workspace(
                bs, self.num_heads, self.head_dim, self.num_kv_splits, self.device
            )
        return self.workspace[:bs]

    def init_cuda_graph_state(self, max_bs: int) -> None:
        """Allocate the decode scratch for the largest graph before capture."""
        self._decode_workspace(max_bs)

    def init_forward_metadata(self, fb: "ForwardBatch") -> None:
        if fb.forward_mode.is_decode():
            return
        if fb.extend_seq_lens is not None:  # a prefill graph's layout, already on the device
            self.extend_meta = (fb.extend_seq_lens, fb.extend_start_loc, max(fb.extend_seq_lens_cpu))
            return
        if fb.input_ids.is_cuda and torch.cuda.is_current_stream_capturing():
            # A graph of an extend-shaped mode (verify, draft extend) has the same number of new
            # tokens in every row; build the metadata on the device, inside the graph, since a
            # host-to-device copy captured from a temporary pinned buffer would dangle.
            per_req = fb.extend_seq_lens_cpu[0]
            assert all(n == per_req for n in fb.extend_seq_lens_cpu), "graphs need equal extend lengths"
            device = fb.input_ids.device
            lens = torch.full((fb.batch_size,), per_req, dtype=torch.int64, device=device)
            starts = torch.arange(0, fb.batch_size * per_req, per_req, dtype=torch.int64, device=device)
            self.extend_meta = (lens, starts, per_req)
            return
        lens = torch.tensor(fb.extend_seq_lens_cpu, dtype=torch.int64)
        starts = torch.cumsum(lens, 0) - lens
        if fb.input_ids.is_cuda:
            lens, starts = lens.pin_memory(), starts.pin_memory()
        device = fb.input_ids.device
        self.extend_meta = (
            lens.to(device, non_blocking=True),
            starts.to(device, non_blocking=True),
            max(fb.extend_seq_lens_cpu),
        )

    def _save_kv(self, k, v, layer, fb: "ForwardBatch") -> None:
        fb.token_to_kv_pool.set_kv_buffer(
            layer.layer_id,
            fb.out_cache_loc,
            k.view(-1, layer.num_kv_heads, layer.head_dim),
            v.view(-1, layer.num_kv_heads, layer.head_dim),
        )

    def forward_extend(self, q, k, v, layer, fb: "ForwardBatch", save_kv_cache: bool):
        if save_kv_cache:
            self._save_kv(k, v, layer, fb)
        pool = fb.token_to_kv_pool
        q = q.view(-1, layer.num_heads, layer.head_dim)
        out = torch.empty_like(q)
        extend_lens, extend_starts, max_extend_len = self.extend_meta
        self._extend.extend_attention_fwd(
            q,
            out,
            pool.get_key_buffer(layer.layer_id),
            pool.get_value_buffer(layer.layer_id),
            fb.req_to_token_pool.req_to_token,
            fb.req_pool_indices,
            fb.seq_lens,
            extend_lens,
            extend_starts,
            max_extend_len,
            layer.scaling,
            *pool.get_kv_scales(layer.layer_id),
        )
        return out.view(-1, layer.num_heads * layer.head_dim)

    def forward_decode(self, q, k, v, layer, fb: "ForwardBatch", save_kv_cache: bool):
        if save_kv_cache:
            self._save_kv(k, v, layer, fb)
        pool = fb.token_to_kv_pool
        k_scale, v_scale = pool.get_kv_scales(layer.layer_id)
        q = q.view(-1, layer.num_heads, layer.head_dim)
        out = torch.empty_like(q)
        self._decode.decode_attention_fwd(
            q,
            pool.get_key_buffer(layer.layer_id),
            pool.get_value_buffer(layer.layer_id),
            out,
            fb.req_to_token_pool.req_to_token,
            fb.req_pool_indices,
            fb.seq_lens,
            layer.scaling,
            self.num_kv_splits,
            workspace=self._decode_workspace(q.shape[0]),
            k_scale=k_scale,
            v_scale=v_scale,
        )
        return out.view(-1, layer.num_heads * layer.head_dim)
