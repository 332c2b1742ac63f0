"""The KV slot allocator: slots 1..size handed out once each, freed slots reused first-freed
first-reused after the never-used ones, exact availability, and no aliasing of freed tensors."""

from __future__ import annotations

import torch

from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator


def test_slots_are_unique_and_reused_in_the_order_they_were_freed():
    alloc = TokenToKVPoolAllocator(10)
    first = alloc.alloc(6).tolist()
    assert first == [1, 2, 3, 4, 5, 6] and alloc.available_size() == 4
    alloc.free(torch.tensor([5, 2]))
    alloc.free(torch.tensor([6]))
    assert alloc.available_size() == 7
    # The never-used slots first, then the freed ones in order, across the join.
    assert alloc.alloc(6).tolist() == [7, 8, 9, 10, 5, 2]
    assert alloc.alloc(2) is None  # one slot left: a request for two gets nothing, and loses nothing
    assert alloc.alloc(1).tolist() == [6] and alloc.available_size() == 0


def test_a_freed_tensor_changed_later_does_not_change_the_free_list():
    alloc = TokenToKVPoolAllocator(4)
    slots = alloc.alloc(4)
    view = slots[1:3]
    alloc.free(view)
    view.fill_(99)  # the caller reuses its buffer
    assert sorted(alloc.alloc(2).tolist()) == [2, 3]


def test_many_small_frees_keep_every_slot_exactly_once():
    alloc = TokenToKVPoolAllocator(1000)
    held = alloc.alloc(1000)
    for i in range(0, 1000, 3):
        alloc.free(held[i : i + 3])
    assert alloc.available_size() == 1000
    assert sorted(alloc.alloc(1000).tolist()) == list(range(1, 1001))
    alloc.clear()
    assert alloc.available_size() == 1000


def test_slots_freed_on_a_device_stay_there_until_the_free_slots_on_the_host_run_out():
    """Bringing freed device slots to the host at once would wait for the device (the step in
    flight included) on every release. They are counted as free at once and read only when the
    host's free slots run short. The meta device stands in for the GPU here: its tensors have no
    values, so reading one raises."""
    import pytest

    from sglang.srt.mem_cache import allocator as allocator_module

    alloc = TokenToKVPoolAllocator(10)
    alloc.alloc_host(6)
    for _ in range(allocator_module.MAX_DEVICE_PIECES + 1):  # more pieces than are kept apart
        alloc.free(torch.empty(0, dtype=torch.int32, device="meta"))  # an empty free is nothing
    alloc.free(torch.zeros(3, dtype=torch.int32, device="meta"))
    assert alloc.available_size() == 7
    assert alloc.alloc_host(4).tolist() == [7, 8, 9, 10]  # the never-used slots, nothing read
    assert alloc.device_joins == 0 and alloc.available_size() == 3
    with pytest.raises(NotImplementedError):  # now it reads them: the meta stand-in cannot
        alloc.alloc_host(1)


def test_many_device_pieces_are_joined_on_the_device_and_counted_exactly():
    from sglang.srt.mem_cache import allocator as allocator_module

    alloc = TokenToKVPoolAllocator(5000)
    alloc.alloc_host(5000)
    pieces = 3 * allocator_module.MAX_DEVICE_PIECES + 7
    for _ in range(pieces):
        alloc.free(torch.zeros(1, dtype=torch.int64, device="meta"))
    assert alloc.available_size() == pieces
    assert len(alloc._freed_device) < allocator_module.MAX_DEVICE_PIECES
