"""utils.HostStaging: a step's small inputs written through numpy into reused host buffers and
sent to the device in one copy each; ReqToTokenPool.write_scattered (a decode step's table
write) goes through it. On the CPU the copies are synchronous; the CUDA path (pinned buffers,
an event per buffer before its reuse) runs in test/gpu."""

from __future__ import annotations

import torch

from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.utils import HostStaging


def test_each_send_carries_what_was_filled_and_buffers_rotate():
    staging = HostStaging(6, "cpu", depth=3, device_buffers=True)
    sent = []
    for step in range(7):
        host = staging.fill()
        host[:] = [step] * 6
        sent.append(staging.send())
    assert [int(t[0]) for t in sent[-3:]] == [4, 5, 6]  # the last three are three live buffers
    assert sent[0] is sent[3] is sent[6]  # depth 3: the fourth send reuses the first buffer
    target = torch.full((6,), -1, dtype=torch.int64)
    staging.fill()[:] = range(6)
    assert staging.send(target) is target and target.tolist() == list(range(6))


def test_a_decode_step_table_write_lands_where_the_scattered_writes_would():
    pool = ReqToTokenPool(size=8, max_context_len=16, device="cpu")
    expected = torch.zeros_like(pool.req_to_token)
    for step in range(6):  # more steps than the staging ring has buffers
        rows = [(3 * step + i) % 8 for i in range(3)]
        columns = [step, step + 1, (2 * step) % 16]
        slots = torch.tensor([100 + 10 * step + i for i in range(3)], dtype=torch.int64)
        device_slots = pool.write_scattered(rows, columns, slots)
        expected[rows, columns] = slots.to(torch.int32)
        assert device_slots.tolist() == slots.tolist()
        assert torch.equal(pool.req_to_token, expected)


def test_a_prefill_table_write_lands_in_each_row_after_its_cached_prefix():
    """KVManager.alloc_for_step for a prefill: every new token's slot goes to its request's row,
    at the columns after the request's KV so far, in one staged copy; a write larger than the
    staging held so far (more tokens than the pool has rows) grows it."""
    from types import SimpleNamespace

    from sglang.srt.managers.kv_manager import KVManager
    from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator

    pool = ReqToTokenPool(size=4, max_context_len=64, device="cpu")
    manager = KVManager(pool, TokenToKVPoolAllocator(512), disable_radix_cache=True)
    expected = torch.zeros_like(pool.req_to_token)
    for step, layout in enumerate([[(0, 3), (5, 2), (0, 1)], [(2, 30), (0, 20)], [(9, 1)], [(1, 4), (0, 7)]]):
        reqs = [
            SimpleNamespace(req_pool_idx=(step + i) % 4, kv_len=kv_len, extend_len=new)
            for i, (kv_len, new) in enumerate(layout)
        ]
        device_slots, host_slots = manager.alloc_for_step(reqs)
        assert device_slots.tolist() == host_slots.tolist() and len(host_slots) == sum(n for _, n in layout)
        at = 0
        for req in reqs:
            expected[req.req_pool_idx, req.kv_len : req.kv_len + req.extend_len] = host_slots[
                at : at + req.extend_len
            ].int()
            at += req.extend_len
        assert torch.equal(pool.req_to_token, expected), f"step {step}"
