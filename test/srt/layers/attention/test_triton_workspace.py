"""The triton backend's decode scratch: growing it (a larger batch, or a whole-step speculative
graph captured after the plain decode graphs) must not free the smaller one, which graphs
captured earlier still write to. Freed, its memory went to other tensors: a dynamic-speculation
server crashed with an illegal address on its first plain step at batch 24 (8B shapes, H200)."""

from __future__ import annotations

import types

from sglang.srt.layers.attention.triton_backend import TritonAttnBackend


def test_an_outgrown_workspace_stays_allocated():
    config = types.SimpleNamespace(num_attention_heads=4, head_dim=8)
    backend = TritonAttnBackend(types.SimpleNamespace(model_config=config, num_heads=4, num_kv_heads=4, device="cpu"))
    first = backend._decode_workspace(4)
    address = first.data_ptr()
    assert backend._decode_workspace(2).data_ptr() == address  # smaller batches reuse it
    grown = backend._decode_workspace(64)
    assert grown.shape[0] == 64 and grown.data_ptr() != address
    assert [w.data_ptr() for w in backend.retired_workspaces] == [address]  # still held, not freed
