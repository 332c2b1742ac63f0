"""Tests for the radix prefix cache, driven against a real KV slot allocator on CPU."""

from __future__ import annotations

import random

import pytest
import torch

from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.radix_cache import RadixCache, _common_prefix_length

POOL_SIZE = 64


@pytest.fixture
def allocator() -> TokenToKVPoolAllocator:
    return TokenToKVPoolAllocator(POOL_SIZE)


@pytest.fixture
def cache(allocator) -> RadixCache:
    return RadixCache(allocator)


def cache_prompt(cache: RadixCache, tokens: list[int]) -> torch.Tensor:
    """What a finished request does: alloc fresh slots, insert, free the duplicates it owns."""
    slots = cache.allocator.alloc(len(tokens))
    num_cached = cache.insert(tokens, slots)
    cache.allocator.free(slots[:num_cached])
    return slots


def count_tree(cache: RadixCache) -> tuple[int, int]:
    """(total tokens, locked tokens) recounted by walking the tree."""
    total = locked = 0
    for node in cache._iter_nodes():
        total += len(node.key)
        locked += len(node.key) if node.lock_ref > 0 else 0
    return total, locked


def assert_accounting(cache: RadixCache, num_held_by_callers: int = 0) -> None:
    allocator = cache.allocator
    assert allocator.available_size() + cache.total_size() + num_held_by_callers == allocator.size
    assert (cache.total_size(), cache.protected_size()) == count_tree(cache)
    assert cache.evictable_size() + cache.protected_size() == cache.total_size()


# ---- matching and insertion ---------------------------------------------------------------


def test_insert_then_match_returns_same_slots(cache):
    slots = cache_prompt(cache, [1, 2, 3, 4])
    result = cache.match_prefix([1, 2, 3, 4])
    assert result.indices.dtype == torch.int64
    assert torch.equal(result.indices, slots)
    assert result.last_node.key == [1, 2, 3, 4]
    assert_accounting(cache)


def test_match_of_longer_prompt_returns_only_cached_prefix(cache):
    slots = cache_prompt(cache, [1, 2, 3])
    result = cache.match_prefix([1, 2, 3, 4, 5])
    assert torch.equal(result.indices, slots)
    assert result.last_node.key == [1, 2, 3]


def test_match_of_unknown_or_empty_prompt_returns_empty_at_root(cache):
    cache_prompt(cache, [1, 2, 3])
    for tokens in ([7, 8], []):
        result = cache.match_prefix(tokens)
        assert result.indices.numel() == 0 and result.indices.dtype == torch.int64
        assert result.last_node is cache.root_node


def test_partial_match_splits_node_and_both_halves_still_match(cache):
    slots = cache_prompt(cache, [1, 2, 3, 4, 5, 6])
    result = cache.match_prefix([1, 2, 3, 9])
    assert torch.equal(result.indices, slots[:3])
    assert result.last_node.key == [1, 2, 3]
    assert [child.key for child in result.last_node.children.values()] == [[4, 5, 6]]
    assert torch.equal(cache.match_prefix([1, 2, 3, 4, 5, 6]).indices, slots)
    assert torch.equal(cache.match_prefix([1, 2]).indices, slots[:2])
    assert_accounting(cache)


def test_match_stops_where_prompt_ends_inside_a_node(cache):
    slots = cache_prompt(cache, [1, 2, 3, 4])
    result = cache.match_prefix([1, 2])
    assert torch.equal(result.indices, slots[:2])
    assert result.last_node.key == [1, 2]


@pytest.mark.parametrize("mismatch_at", [0, 1, 2, 499, 500, 997, 998, 999])
def test_long_key_common_prefix_finds_the_first_mismatch(mismatch_at):
    key = list(range(1000))
    tokens = key.copy()
    tokens[mismatch_at] = -1
    assert _common_prefix_length(key, tokens, 0) == mismatch_at
    assert _common_prefix_length(key, [5] + tokens, 1) == mismatch_at
    assert _common_prefix_length(key, key[:mismatch_at], 0) == mismatch_at


def test_match_accepts_tensor_and_tuple_prompts(cache):
    slots = cache_prompt(cache, [1, 2, 3])
    assert torch.equal(cache.match_prefix(torch.tensor([1, 2, 3, 4])).indices, slots)
    assert torch.equal(cache.match_prefix((1, 2)).indices, slots[:2])


def test_insert_of_shared_prefix_returns_cached_count_and_caller_frees_duplicates(cache):
    first = cache_prompt(cache, [1, 2, 3, 4])
    slots = cache.allocator.alloc(5)
    num_cached = cache.insert([1, 2, 3, 7, 8], slots)
    assert num_cached == 3
    cache.allocator.free(slots[:num_cached])
    assert_accounting(cache)
    expected = torch.cat((first[:3], slots[3:]))
    assert torch.equal(cache.match_prefix([1, 2, 3, 7, 8]).indices, expected)
    assert torch.equal(cache.match_prefix([1, 2, 3, 4]).indices, first)


def test_insert_after_matched_prefix_takes_only_new_slots(cache):
    # The scheduler path: match, alloc the rest, then insert tree slots + own slots.
    cache_prompt(cache, [1, 2, 3])
    prefix = cache.match_prefix([1, 2, 3, 4, 5]).indices
    own = cache.allocator.alloc(2)
    num_cached = cache.insert([1, 2, 3, 4, 5], torch.cat((prefix, own)))
    assert num_cached == 3  # all three were tree slots; the caller owns nothing to free
    assert_accounting(cache)
    assert torch.equal(cache.match_prefix([1, 2, 3, 4, 5]).indices[3:], own)


def test_insert_of_fully_cached_prompt_takes_no_slots(cache):
    cache_prompt(cache, [1, 2, 3, 4])
    slots = cache.allocator.alloc(3)
    assert cache.insert([1, 2, 3], slots) == 3
    cache.allocator.free(slots)
    assert cache.total_size() == 4
    assert_accounting(cache)


def test_insert_copies_indices_so_caller_may_reuse_its_buffer(cache):
    buffer = cache.allocator.alloc(3)
    expected = buffer.clone()
    cache.insert([1, 2, 3], buffer)
    buffer.fill_(0)
    assert torch.equal(cache.match_prefix([1, 2, 3]).indices, expected)


def test_insert_with_mismatched_lengths_raises(cache):
    with pytest.raises(ValueError):
        cache.insert([1, 2, 3], torch.tensor([1, 2], dtype=torch.int64))


# ---- locking and sizes --------------------------------------------------------------------


def test_lock_sizes_track_inc_and_dec(cache):
    cache_prompt(cache, [1, 2, 3])
    cache_prompt(cache, [1, 2, 3, 4, 5])
    node = cache.match_prefix([1, 2, 3, 4, 5]).last_node
    cache.inc_lock_ref(node)
    cache.inc_lock_ref(node)
    assert (cache.evictable_size(), cache.protected_size()) == (0, 5)
    cache.dec_lock_ref(node)
    assert (cache.evictable_size(), cache.protected_size()) == (0, 5)
    cache.dec_lock_ref(node)
    assert (cache.evictable_size(), cache.protected_size()) == (5, 0)
    assert_accounting(cache)


def test_locking_a_prefix_leaves_its_extension_evictable(cache):
    cache_prompt(cache, [1, 2, 3, 4, 5, 6])
    cache.inc_lock_ref(cache.match_prefix([1, 2, 3, 9]).last_node)
    assert (cache.evictable_size(), cache.protected_size()) == (3, 3)
    assert_accounting(cache)


def test_split_of_locked_node_keeps_sizes_and_locks_both_halves(cache):
    cache_prompt(cache, [1, 2, 3, 4, 5, 6])
    node = cache.match_prefix([1, 2, 3, 4, 5, 6]).last_node
    cache.inc_lock_ref(node)
    cache_prompt(cache, [1, 2, 3, 9, 9])  # splits the locked node after [1, 2, 3]
    assert node.key == [4, 5, 6] and node.parent.key == [1, 2, 3]
    assert node.parent.lock_ref == 1
    assert (cache.evictable_size(), cache.protected_size()) == (2, 6)
    assert_accounting(cache)
    cache.dec_lock_ref(node)
    assert (cache.evictable_size(), cache.protected_size()) == (8, 0)
    assert node.parent.lock_ref == 0
    assert_accounting(cache)


def test_dec_lock_ref_below_zero_raises(cache):
    cache_prompt(cache, [1, 2, 3])
    node = cache.match_prefix([1, 2, 3]).last_node
    cache.inc_lock_ref(node)
    cache.dec_lock_ref(node)
    with pytest.raises(RuntimeError):
        cache.dec_lock_ref(node)
    assert (cache.evictable_size(), cache.protected_size()) == (3, 0)


def test_lock_and_unlock_of_root_is_a_no_op(cache):
    cache.inc_lock_ref(cache.root_node)
    cache.dec_lock_ref(cache.root_node)
    assert cache.protected_size() == 0


# ---- eviction -----------------------------------------------------------------------------


def test_locked_nodes_survive_evict_while_unlocked_ones_go(cache):
    locked = cache_prompt(cache, [1, 2, 3])
    cache_prompt(cache, [4, 5, 6])
    cache.inc_lock_ref(cache.match_prefix([1, 2, 3]).last_node)
    assert cache.evict(100) == 3
    assert torch.equal(cache.match_prefix([1, 2, 3]).indices, locked)
    assert cache.match_prefix([4, 5, 6]).indices.numel() == 0
    assert_accounting(cache)


def test_evict_takes_least_recently_used_branch_first(cache):
    cache_prompt(cache, [1, 2, 3])
    cache_prompt(cache, [4, 5, 6])
    cache.match_prefix([1, 2, 3])  # now [4, 5, 6] is the older branch
    assert cache.evict(3) == 3
    assert cache.match_prefix([1, 2, 3]).indices.numel() == 3
    assert cache.match_prefix([4, 5, 6]).indices.numel() == 0


def test_evict_takes_older_sibling_before_shared_parent(cache):
    cache_prompt(cache, [1, 2, 3, 4])
    cache_prompt(cache, [1, 2, 5, 6])
    cache.match_prefix([1, 2, 3, 4])
    assert cache.evict(1) == 2
    assert cache.match_prefix([1, 2, 5, 6]).indices.numel() == 2
    assert cache.match_prefix([1, 2, 3, 4]).indices.numel() == 4
    assert_accounting(cache)


def test_evict_removes_parent_once_its_children_are_gone(cache):
    cache_prompt(cache, [1, 2])
    cache_prompt(cache, [1, 2, 3, 4])
    assert cache.evict(4) == 4
    assert cache.total_size() == 0
    assert cache.root_node.children == {}
    assert_accounting(cache)


def test_evict_does_not_take_a_locked_parent_after_its_child(cache):
    cache_prompt(cache, [1, 2])
    cache_prompt(cache, [1, 2, 3, 4])
    cache.inc_lock_ref(cache.match_prefix([1, 2]).last_node)
    assert cache.evict(100) == 2
    assert cache.match_prefix([1, 2, 3, 4]).indices.numel() == 2
    assert_accounting(cache)


def test_evict_returns_slots_to_allocator(cache, allocator):
    cache_prompt(cache, [1, 2, 3])
    cache_prompt(cache, [4, 5, 6, 7])
    before = allocator.available_size()
    num_evicted = cache.evict(5)
    assert num_evicted == 7
    assert allocator.available_size() == before + num_evicted
    assert allocator.available_size() == POOL_SIZE
    assert_accounting(cache)


def test_evict_of_zero_tokens_evicts_nothing(cache):
    cache_prompt(cache, [1, 2, 3])
    assert cache.evict(0) == 0
    assert cache.total_size() == 3


# ---- reset and disabled cache -------------------------------------------------------------


def test_reset_returns_all_slots(cache, allocator):
    cache_prompt(cache, [1, 2, 3])
    cache_prompt(cache, [1, 2, 4, 5])
    cache.reset()
    assert allocator.available_size() == POOL_SIZE
    assert cache.total_size() == 0
    assert cache.match_prefix([1, 2, 3]).indices.numel() == 0
    assert_accounting(cache)


def test_reset_with_locked_node_raises(cache):
    cache_prompt(cache, [1, 2, 3])
    cache.inc_lock_ref(cache.match_prefix([1, 2, 3]).last_node)
    with pytest.raises(RuntimeError):
        cache.reset()


def test_disabled_cache_matches_nothing_and_insert_returns_len(allocator):
    cache = RadixCache(allocator, disable=True)
    slots = allocator.alloc(3)
    assert cache.insert([1, 2, 3], slots) == 3
    allocator.free(slots)
    result = cache.match_prefix([1, 2, 3])
    assert result.indices.numel() == 0 and result.last_node is cache.root_node
    cache.inc_lock_ref(result.last_node)
    cache.dec_lock_ref(result.last_node)
    assert cache.evict(10) == 0
    assert (cache.total_size(), cache.evictable_size(), cache.protected_size()) == (0, 0, 0)
    cache.reset()
    assert_accounting(cache)


# ---- randomized ---------------------------------------------------------------------------


class Workload:
    """Requests that match, lock, alloc, insert and unlock like the scheduler does."""

    def __init__(self, seed: int, pool_size: int = 200):
        self.rng = random.Random(seed)
        self.allocator = TokenToKVPoolAllocator(pool_size)
        self.cache = RadixCache(self.allocator)
        self.bases = [[self.rng.randrange(4) for _ in range(30)] for _ in range(4)]
        self.running = []  # (tokens, prefix slots, own slots, locked node)
        self.slot_owner = {}  # slot -> the token prefix whose last token's KV it holds

    def random_prompt(self) -> list[int]:
        base = self.rng.choice(self.bases)
        tokens = base[: self.rng.randrange(1, len(base) + 1)]
        return tokens + [self.rng.randrange(4) for _ in range(self.rng.randrange(0, 6))]

    def held_by_callers(self) -> int:
        return sum(own.numel() for _, _, own, _ in self.running)

    def check_match(self, tokens: list[int]) -> None:
        result = self.cache.match_prefix(tokens)
        for position, slot in enumerate(result.indices.tolist()):
            assert self.slot_owner[slot] == tuple(tokens[: position + 1])

    def start_request(self) -> None:
        tokens = self.random_prompt()
        result = self.cache.match_prefix(tokens)
        self.cache.inc_lock_ref(result.last_node)
        num_new = len(tokens) - result.indices.numel()
        own = self.allocator.alloc(num_new)
        if own is None:
            self.cache.evict(num_new - self.allocator.available_size())
            own = self.allocator.alloc(num_new)
        if own is None:
            self.cache.dec_lock_ref(result.last_node)
            return
        for position, slot in enumerate(own.tolist(), start=result.indices.numel()):
            self.slot_owner[slot] = tuple(tokens[: position + 1])
        self.running.append((tokens, result.indices, own, result.last_node))

    def finish_request(self) -> None:
        tokens, prefix, own, node = self.running.pop(self.rng.randrange(len(self.running)))
        num_cached = self.cache.insert(tokens, torch.cat((prefix, own)))
        assert num_cached >= prefix.numel()  # the locked prefix is still cached
        self.allocator.free(own[: num_cached - prefix.numel()])
        self.cache.dec_lock_ref(node)
        assert self.cache.match_prefix(tokens).indices.numel() == len(tokens)

    def step(self) -> None:
        choice = self.rng.random()
        if choice < 0.4:
            self.start_request()
        elif choice < 0.75 and self.running:
            self.finish_request()
        elif choice < 0.9:
            self.check_match(self.random_prompt())
        else:
            self.cache.evict(self.rng.randrange(1, 40))


@pytest.mark.parametrize("seed", range(20))
def test_random_workload_keeps_accounting_and_matches_inserted_slots(seed):
    workload = Workload(seed)
    for _ in range(400):
        workload.step()
        assert_accounting(workload.cache, workload.held_by_callers())
    while workload.running:
        workload.finish_request()
    assert workload.cache.protected_size() == 0
    workload.cache.reset()
    assert workload.allocator.available_size() == workload.allocator.size


# --- Entries without draft KV (a request the EAGLE-3 draft did not follow) -------------------


def test_draft_only_match_stops_before_target_only_entries(cache, allocator):
    with_draft = allocator.alloc(4)
    cache.insert([1, 2, 3, 4], with_draft)
    target_only = allocator.alloc(3)
    cache.insert([1, 2, 3, 4, 5, 6, 7], torch.cat((with_draft, target_only)), draft=False)
    assert torch.equal(cache.match_prefix([1, 2, 3, 4, 5, 6, 7]).indices, torch.cat((with_draft, target_only)))
    assert torch.equal(cache.match_prefix([1, 2, 3, 4, 5, 6, 7], draft_only=True).indices, with_draft)
    # A split keeps the flag on both halves.
    cache_prompt(cache, [1, 2, 3, 4, 5, 9])
    assert torch.equal(cache.match_prefix([1, 2, 3, 4, 5], draft_only=True).indices, with_draft)
    assert len(cache.match_prefix([1, 2, 3, 4, 5, 6, 7], draft_only=True).indices) == 4
    assert count_tree(cache) == (cache.total_size(), 0)


def test_a_request_with_draft_kv_takes_over_unused_target_only_entries(cache, allocator):
    target_only = allocator.alloc(6)
    cache.insert([1, 2, 3, 4, 5, 6], target_only, draft=False)
    free_before = allocator.available_size()
    own = allocator.alloc(6)
    assert cache.insert([1, 2, 3, 4, 5, 6], own) == 6  # the tree had them all
    taken = cache.adopt_draft_slots([1, 2, 3, 4, 5, 6], own, start=0)
    assert taken.tolist() == [True] * 6
    assert allocator.available_size() == free_before - 6 + 6  # the target-only slots were freed
    assert torch.equal(cache.match_prefix([1, 2, 3, 4, 5, 6], draft_only=True).indices, own)
    assert cache.total_size() + allocator.available_size() == POOL_SIZE


def test_locked_target_only_entries_and_the_callers_cached_prefix_are_not_taken_over(cache, allocator):
    first = allocator.alloc(3)
    cache.insert([1, 2, 3], first, draft=False)
    second = allocator.alloc(3)
    cache.insert([1, 2, 3, 4, 5, 6], torch.cat((first, second)), draft=False)
    user = cache.match_prefix([1, 2, 3])  # a request without the draft is using [1, 2, 3]
    cache.inc_lock_ref(user.last_node)
    own = allocator.alloc(6)
    cache.insert([1, 2, 3, 4, 5, 6], own)
    taken = cache.adopt_draft_slots([1, 2, 3, 4, 5, 6], own, start=0)
    assert taken.tolist() == [False] * 3 + [True] * 3
    allocator.free(own[:3])
    assert len(cache.match_prefix([1, 2, 3, 4, 5, 6], draft_only=True).indices) == 0  # [1, 2, 3] still target-only
    cache.dec_lock_ref(user.last_node)
    # Positions below `start` are the caller's cached prefix (the tree's slots): never taken.
    again = allocator.alloc(6)
    taken = cache.adopt_draft_slots([1, 2, 3, 4, 5, 6], again, start=3)
    assert taken.tolist() == [False] * 3
    allocator.free(again)
    assert cache.total_size() + allocator.available_size() == POOL_SIZE


def _walk_order_eviction(cache: RadixCache, num_tokens: int) -> list[int]:
    """The ids of the nodes an eviction of `num_tokens` takes, by a walk of the whole tree: every
    unlocked leaf by (last access, id), a parent joining once its last child is gone. Reads the
    tree without changing it."""
    import heapq

    nodes = list(cache._iter_nodes())
    children = {id(node): len(node.children) for node in nodes}
    heap = [(n.last_access_time, n.id, n) for n in nodes if not n.children and n.lock_ref == 0]
    heapq.heapify(heap)
    taken, evicted = [], 0
    while heap and evicted < num_tokens:
        _, _, node = heapq.heappop(heap)
        taken.append(node.id)
        evicted += len(node.key)
        parent = node.parent
        children[id(parent)] = children.get(id(parent), 0) - 1
        if parent is not cache.root_node and children[id(parent)] == 0 and parent.lock_ref == 0:
            heapq.heappush(heap, (parent.last_access_time, parent.id, parent))
    return taken


@pytest.mark.parametrize("seed", range(20))
def test_evictions_take_exactly_what_a_walk_of_the_whole_tree_would(seed):
    """The cache keeps its eviction candidates as the tree changes instead of walking every node
    on each eviction; under matches (which touch nodes), splits, locks, inserts and evictions of
    a random workload, every eviction takes the same nodes in the same order as the walk."""
    workload = Workload(seed, pool_size=120)
    cache = workload.cache
    removed = []
    remove = cache._remove_leaf
    cache._remove_leaf = lambda leaf: removed.append(leaf.id) or remove(leaf)
    evict = cache.evict
    checked = [0]

    def checked_evict(num_tokens):
        expected = _walk_order_eviction(cache, num_tokens)
        removed.clear()
        count = evict(num_tokens)
        assert removed == expected
        checked[0] += bool(expected)
        return count

    cache.evict = checked_evict
    for _ in range(600):
        workload.step()
        assert_accounting(cache, workload.held_by_callers())
    assert checked[0] > 20  # evictions that took something were compared
    assert len(cache._heap) <= 2 * cache._num_nodes + 64  # stale candidates do not pile up
