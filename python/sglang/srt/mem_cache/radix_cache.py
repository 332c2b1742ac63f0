"""Radix prefix cache: maps token-id prefixes to the KV slots that already hold them.

Page size 1. Running requests lock the path they use (a locked node is never evicted);
unlocked leaves are evicted least recently used first, their slots going back to the allocator.

With an EAGLE-3 draft, a node also says whether its slots hold the draft's KV besides the
target's (`draft`): a request that skipped the draft's pass over its prompt (it was admitted
while speculation did not pay) caches target-only entries. A request that will speculate
matches only entries with draft KV (`match_prefix(..., draft_only=True)`) and, when it is
done, hands its own slots for a target-only entry nobody is using to the tree
(`adopt_draft_slots`), so the entry serves both kinds of request from then on.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch

from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator

_node_ids = itertools.count()


class TreeNode:
    """One edge of the tree: `key` token ids whose KV lives in the `value` slots."""

    __slots__ = ("children", "key", "value", "parent", "lock_ref", "last_access_time", "id", "draft")

    def __init__(
        self,
        key: list[int],
        value: torch.Tensor,
        parent: TreeNode | None,
        last_access_time: int = 0,
        draft: bool = True,
    ):
        self.children: dict[int, TreeNode] = {}  # keyed by the first token id of the child's key
        self.key = key
        self.value = value  # int64 slot indices, one per token of `key`, on the allocator's device
        self.parent = parent
        self.lock_ref = 0  # running requests whose prefix passes through this node
        self.last_access_time = last_access_time  # a tick of the cache's clock, for LRU
        self.id = next(_node_ids)  # breaks ties between nodes touched on the same tick
        self.draft = draft  # the slots hold the draft model's KV too (always True without a draft)

    def is_leaf(self) -> bool:
        return not self.children

    def __lt__(self, other: TreeNode) -> bool:
        # Heap order for eviction: least recently used first.
        return (self.last_access_time, self.id) < (other.last_access_time, other.id)


@dataclass
class MatchResult:
    indices: torch.Tensor  # int64 slots of the longest cached prefix, on the allocator's device
    last_node: TreeNode  # the node that ends exactly at that prefix; the root when nothing matched


class RadixCache:
    """Token-level radix tree over KV slots, reference counted, with LRU eviction.

    Accounting the scheduler relies on, after every call:
    `allocator.available_size() + total_size() + slots held by callers == allocator.size`.
    """

    def __init__(self, allocator: TokenToKVPoolAllocator, disable: bool = False):
        self.allocator = allocator
        self.device = allocator.device
        self.disable = disable
        self._empty = torch.empty(0, dtype=torch.int64, device=self.device)
        self._clock = 0
        self._new_tree()

    def _new_tree(self) -> None:
        self.root_node = TreeNode([], self._empty, None)
        self._evictable_size = 0  # tokens in nodes with lock_ref == 0
        self._protected_size = 0  # tokens in nodes with lock_ref > 0
        # Eviction candidates, kept as the tree changes so that an eviction does not walk the
        # whole tree (~11 ms at 20K leaves on a fast CPU): (last access time, id, node) of every
        # unlocked leaf, plus stale entries that `evict` drops or re-files when it meets them
        # (the node was touched since, locked, given a child or removed). Each unlocked leaf has
        # an entry no later than its last access, so least recently used still goes first.
        self._heap: list[tuple[int, int, TreeNode]] = []
        self._num_nodes = 0

    # ---- lookup and insertion -------------------------------------------------------------

    def match_prefix(self, token_ids: Sequence[int], draft_only: bool = False) -> MatchResult:
        """Longest cached prefix of `token_ids`; touches every node on the matched path.
        `draft_only`: stop before the first entry without draft KV."""
        tokens = _as_list(token_ids)
        if self.disable or not tokens:
            return MatchResult(self._empty, self.root_node)
        node, _, values = self._walk(tokens, draft_only)
        return MatchResult(torch.cat(values) if values else self._empty, node)

    def insert(self, token_ids: Sequence[int], indices: torch.Tensor, draft: bool = True) -> int:
        """Stores the (token, slot) pairs of `token_ids` that the tree does not hold yet.

        `indices[i]` is the slot holding the KV of `token_ids[i]`. Returns how many LEADING
        tokens were NOT taken over by the tree: the tree keeps its own slots for the prefix it
        already had, so the caller must free whichever of `indices[:returned]` it owns (slots it
        got from `match_prefix` are the tree's and are not freed). The slots after that prefix
        now belong to the tree. A disabled cache takes nothing and returns `len(token_ids)`.
        `draft`: whether the new entries' slots hold draft KV too.
        """
        tokens = _as_list(token_ids)
        if len(tokens) != len(indices):
            raise ValueError(f"{len(tokens)} tokens but {len(indices)} slot indices")
        if self.disable:
            return len(tokens)
        node, num_cached, _ = self._walk(tokens)
        if num_cached < len(tokens):
            self._add_leaf(node, tokens[num_cached:], indices[num_cached:], draft)
        return num_cached

    def adopt_draft_slots(self, token_ids: Sequence[int], indices: torch.Tensor, start: int) -> torch.Tensor:
        """After `insert(token_ids, indices)` by a request with draft KV: each entry on the path
        that lies in positions >= `start` (the caller's own slots), has no draft KV and is not
        locked takes the caller's slots for its tokens instead of its own, which are freed.
        Returns bool[len(token_ids) - start]: which of the caller's slots the tree took."""
        tokens = _as_list(token_ids)
        taken = torch.zeros(max(len(tokens) - start, 0), dtype=torch.bool)
        if self.disable:
            return taken
        node, position = self.root_node, 0
        while position < len(tokens):
            child = node.children.get(tokens[position])
            if (
                child is None
                or position + len(child.key) > len(tokens)
                or child.key != tokens[position : position + len(child.key)]
            ):
                break
            end = position + len(child.key)
            if not child.draft and child.lock_ref == 0 and position >= start:
                self.allocator.free(child.value)
                child.value = indices[position:end].to(device=self.device, dtype=torch.int64, copy=True)
                child.draft = True
                taken[position - start : end - start] = True
            node, position = child, end
        return taken

    def _walk(self, tokens: list[int], draft_only: bool = False) -> tuple[TreeNode, int, list[torch.Tensor]]:
        """Follows `tokens` down from the root, splitting the node where the match stops midway
        (`draft_only`: stopping before the first node without draft KV).

        Returns the last matched node, the matched length and the slot tensors along the path.
        """
        self._clock += 1
        node, position, values = self.root_node, 0, []
        while position < len(tokens):
            child = node.children.get(tokens[position])
            if child is None or (draft_only and not child.draft):
                break
            length = _common_prefix_length(child.key, tokens, position)
            if length < len(child.key):
                # After the split the remaining tokens diverge, so the loop ends next round.
                child = self._split(child, length)
            child.last_access_time = self._clock
            values.append(child.value)
            node, position = child, position + length
        return node, position, values

    def _split(self, node: TreeNode, length: int) -> TreeNode:
        """Cuts `node` after `length` tokens; returns the new parent holding the front part."""
        front = TreeNode(node.key[:length], node.value[:length], node.parent, node.last_access_time, node.draft)
        self._num_nodes += 1  # `node` keeps its place in the eviction heap: it is the back part
        # Both halves carry the same locks, so evictable/protected sizes are unchanged.
        front.lock_ref = node.lock_ref
        front.children = {node.key[length]: node}
        node.parent.children[node.key[0]] = front
        node.key = node.key[length:]
        node.value = node.value[length:]
        node.parent = front
        return front

    def _add_leaf(self, parent: TreeNode, key: list[int], indices: torch.Tensor, draft: bool) -> None:
        # Copy: callers often pass a view of a buffer (e.g. a req_to_token row) they reuse.
        value = indices.to(device=self.device, dtype=torch.int64, copy=True)
        leaf = TreeNode(key, value, parent, self._clock, draft)
        parent.children[key[0]] = leaf
        self._evictable_size += len(key)
        self._num_nodes += 1
        self._push_candidate(leaf)

    def _push_candidate(self, node: TreeNode) -> None:
        heapq.heappush(self._heap, (node.last_access_time, node.id, node))
        if len(self._heap) > 2 * self._num_nodes + 64:  # mostly stale: rebuilt, O(1) a push amortized
            self._heap = [(n.last_access_time, n.id, n) for n in self._iter_nodes() if n.is_leaf() and n.lock_ref == 0]
            heapq.heapify(self._heap)

    # ---- reference counting ---------------------------------------------------------------

    def inc_lock_ref(self, node: TreeNode) -> None:
        """Locks every node from `node` up to (not including) the root against eviction."""
        while node is not self.root_node:
            if node.lock_ref == 0:
                self._evictable_size -= len(node.key)
                self._protected_size += len(node.key)
            node.lock_ref += 1
            node = node.parent

    def dec_lock_ref(self, node: TreeNode) -> None:
        """Undoes one `inc_lock_ref(node)`."""
        # An ancestor's lock_ref is never below a descendant's, so checking `node` suffices.
        if node is not self.root_node and node.lock_ref == 0:
            raise RuntimeError("dec_lock_ref on an unlocked node: unbalanced lock/unlock")
        while node is not self.root_node:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._evictable_size += len(node.key)
                self._protected_size -= len(node.key)
                if not node.children:
                    self._push_candidate(node)
            node = node.parent

    # ---- eviction -------------------------------------------------------------------------

    def evict(self, num_tokens: int) -> int:
        """Frees at least `num_tokens` slots if it can, least recently used unlocked leaves first.

        Returns the number of tokens evicted (may exceed `num_tokens` by part of a leaf, or
        fall short when everything left is locked).
        """
        if self.disable or num_tokens <= 0:
            return 0
        freed, num_evicted = [], 0
        while self._heap and num_evicted < num_tokens:  # (not a local: a push may rebuild the heap)
            filed, _, leaf = heapq.heappop(self._heap)
            if leaf.parent is None or leaf.children or leaf.lock_ref:  # removed, not a leaf, or locked
                continue
            if filed != leaf.last_access_time:  # touched since: file it again under its last access
                heapq.heappush(self._heap, (leaf.last_access_time, leaf.id, leaf))
                continue
            freed.append(leaf.value)
            num_evicted += len(leaf.key)
            parent = self._remove_leaf(leaf)
            if parent is not self.root_node and parent.is_leaf() and parent.lock_ref == 0:
                self._push_candidate(parent)
        if freed:
            self.allocator.free(torch.cat(freed))
        return num_evicted

    def _remove_leaf(self, leaf: TreeNode) -> TreeNode:
        parent = leaf.parent
        del parent.children[leaf.key[0]]
        self._evictable_size -= len(leaf.key)
        self._num_nodes -= 1
        leaf.parent = None  # out of the tree: its heap entries are dropped when met
        return parent

    def reset(self) -> None:
        """Frees every cached slot and empties the tree; nothing may be locked."""
        if self._protected_size:
            raise RuntimeError(f"reset with {self._protected_size} tokens still locked")
        values = [node.value for node in self._iter_nodes()]
        if values:
            self.allocator.free(torch.cat(values))
        self._new_tree()

    def _iter_nodes(self) -> Iterator[TreeNode]:
        """Every node except the root, parents before children."""
        stack = list(self.root_node.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    # ---- sizes ----------------------------------------------------------------------------

    def evictable_size(self) -> int:
        return self._evictable_size

    def protected_size(self) -> int:
        return self._protected_size

    def total_size(self) -> int:
        return self._evictable_size + self._protected_size


def _as_list(token_ids: Sequence[int]) -> list[int]:
    if isinstance(token_ids, torch.Tensor):
        return token_ids.tolist()
    # A caller's list is only read and sliced (slices copy), so it need not be copied here.
    return token_ids if isinstance(token_ids, list) else list(token_ids)


def _common_prefix_length(key: list[int], tokens: list[int], start: int) -> int:
    """Length of the common prefix of `key` and `tokens[start:]`, compared by slices."""
    segment = tokens[start : start + len(key)]
    key_part = key if len(segment) == len(key) else key[: len(segment)]
    if key_part == segment:
        return len(segment)
    # There is a mismatch inside `segment`: bisect on slice equality. Each round compares
    # only the untested half, so the whole search is O(len(key)) comparisons, all in C.
    low, high = 0, len(segment)  # key[:low] == segment[:low], key[:high] != segment[:high]
    while high - low > 1:
        middle = (low + high) // 2
        if key[low:middle] == segment[low:middle]:
            low = middle
        else:
            high = middle
    return low
