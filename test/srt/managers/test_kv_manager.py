"""KVManager: how it takes slots from the pool when the radix cache holds the rest."""

from __future__ import annotations

from sglang.srt.mem_cache.memory_pool import ReqToTokenPool


def test_an_allocation_short_of_free_slots_evicts_a_slice_of_the_pool_at_once():
    """Once the radix cache fills the pool, every allocation would evict (a walk of the whole
    tree and, on CUDA, a copy that waits for the device). KVManager.alloc_host evicts at least
    1 / EVICT_SHARE of the pool when short, so the allocations after it find free slots."""
    from sglang.srt.managers import kv_manager
    from sglang.srt.managers.kv_manager import KVManager
    from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator

    size = 64 * 40
    manager = KVManager(
        ReqToTokenPool(size=4, max_context_len=64, device="cpu"),
        TokenToKVPoolAllocator(size),
        disable_radix_cache=False,
    )
    slots = manager.alloc_host(size)  # the whole pool, then into the cache as 80 entries of 32 tokens
    for i in range(size // 32):
        manager.tree_cache.insert([10_000 + i] + list(range(31)), slots[32 * i : 32 * (i + 1)])
    assert manager.allocator.available_size() == 0 and manager.tree_cache.evictable_size() == size
    evictions = []
    evict = manager.tree_cache.evict
    manager.tree_cache.evict = lambda n: evictions.append(n) or evict(n)
    for _ in range(size // kv_manager.EVICT_SHARE // 4):  # steps of 4 slots each, a slice's worth
        assert manager.alloc_host(4) is not None
    assert evictions == [size // kv_manager.EVICT_SHARE]  # one eviction, not one per step
    total = manager.allocator.available_size() + manager.tree_cache.evictable_size()
    assert total == size - 4 * (size // kv_manager.EVICT_SHARE // 4)  # nothing lost
