"""KVManager: the KV memory of requests — admission with a cached prefix, slot allocation
for each step (evicting from the radix cache when short), and release into the cache.

Invariant (checked by `accounting()`): free slots + slots in the radix cache + slots held
only by requests == total slots.
"""

from __future__ import annotations

import itertools
from typing import Optional

import numpy as np
import torch

from sglang.srt.managers.schedule_batch import Req
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.mem_cache.radix_cache import RadixCache


# When short of free slots, evict at least this share (1 / EVICT_SHARE) of the pool.
EVICT_SHARE = 64


class KVManager:
    def __init__(
        self,
        req_to_token_pool: ReqToTokenPool,
        allocator: TokenToKVPoolAllocator,
        disable_radix_cache: bool,
        speculative: bool = False,
    ):
        # With an EAGLE-3 draft, a position's draft KV depends on the token after it, so the last
        # position of a cached prefix is recomputed (its next token may differ for this request)
        # for requests the draft follows.
        self.speculative = speculative
        self.req_to_token_pool = req_to_token_pool
        self.allocator = allocator
        self.tree_cache = RadixCache(allocator, disable=disable_radix_cache)

    def available_tokens(self) -> int:
        """Slots free now or freeable by evicting unlocked cache entries."""
        return self.allocator.available_size() + self.tree_cache.evictable_size()

    def cached_prefix_len(self, req: Req) -> int:
        """How much of the request's prompt the cache holds (without locking it)."""
        return len(self.tree_cache.match_prefix(_matchable_ids(req), self._draft_only(req)).indices)

    def _draft_only(self, req: Req) -> bool:
        # A request the draft follows needs cached positions with draft KV; one it does not
        # follow (Req.draft.cold) can use any.
        return self.speculative and not req.draft.cold

    def admit(self, req: Req) -> bool:
        """Give the request a table row and lock its cached prefix. False if no row is free."""
        row = self.req_to_token_pool.alloc()
        if row is None:
            return False
        match = self.tree_cache.match_prefix(_matchable_ids(req), self._draft_only(req))
        self.tree_cache.inc_lock_ref(match.last_node)
        req.req_pool_idx, req.last_node = row, match.last_node
        indices = match.indices[:-1] if self._draft_only(req) else match.indices
        req.kv_len = req.cached_len = len(indices)
        if req.kv_len:
            self.req_to_token_pool.write(row, 0, indices)
        return True

    def alloc(self, num_tokens: int) -> torch.Tensor | None:
        """`num_tokens` slots on the device (evicting cached prefixes if needed), or None."""
        slots = self.alloc_host(num_tokens)
        return None if slots is None else slots.to(self.allocator.device, non_blocking=True)

    def alloc_host(self, num_tokens: int) -> torch.Tensor | None:
        """`num_tokens` slots on the host (evicting cached prefixes if needed), or None."""
        shortfall = num_tokens - self.allocator.available_size()
        if shortfall > 0:
            # Evicted slots (on CUDA, on the device) reach the host free list in the allocator's
            # next refill, one copy that waits for the device (the step in flight included).
            # Once the cache fills the pool every allocation would evict; evicting a slice of
            # the pool at a time pays that wait once per many steps instead of on most of them.
            self.tree_cache.evict(max(shortfall, self.allocator.size // EVICT_SHARE))
        return self.allocator.alloc_host(num_tokens)

    def alloc_for_step(self, reqs: list[Req]) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
        """Slots for each request's `extend_len` new tokens, recorded in its table row, in one
        copy and one scatter for the whole batch: (on the device, on the host), or None."""
        lens = [req.extend_len for req in reqs]
        slots = self.alloc_host(sum(lens))
        if slots is None:
            return None
        if all(n == 1 for n in lens):  # decode
            rows, columns = [r.req_pool_idx for r in reqs], [r.kv_len for r in reqs]
        else:
            rows = np.repeat([r.req_pool_idx for r in reqs], lens)
            # Each token's column: its index in the batch, less where its request's tokens start,
            # plus the request's KV length.
            shift = np.repeat([r.kv_len - start for r, start in zip(reqs, itertools.accumulate(lens, initial=0))], lens)
            columns = np.arange(len(slots)) + shift
        return self.req_to_token_pool.write_scattered(rows, columns, slots), slots

    def release(self, req: Req) -> None:
        """Hand the request's KV to the radix cache (or free it), unlock its prefix, free its row.
        Used when a request finishes, is aborted, or is retracted to wait for memory."""
        if req.req_pool_idx is None:
            return
        slots = self.req_to_token_pool.read(req.req_pool_idx, 0, req.kv_len)
        # Under overlap the last slot can hold the KV of a token whose id is still in flight:
        # it cannot be cached under a key, so it is freed.
        # Positions the draft has not caught up on have no draft KV: a later request that hit
        # them in the cache would draft from garbage, so they are not cached either. A request
        # the draft never followed caches its positions as target-only entries.
        cacheable = min(req.kv_len - req.draft.behind, req.seq_len)
        ids = req.all_ids[:cacheable]
        # A request marked for adoption whose step never launched has no draft KV yet either.
        has_draft = not (req.draft.cold or req.draft.adopting)
        not_taken = self.tree_cache.insert(ids, slots[:cacheable], draft=has_draft)
        # Slots below cached_len belong to the cache already; the rest of the untaken ones are ours.
        own = slots[req.cached_len : not_taken]
        if self.speculative and has_draft and len(own):
            # Target-only entries nobody uses take our slots, which have draft KV as well.
            taken = self.tree_cache.adopt_draft_slots(ids[:not_taken], slots[:not_taken], req.cached_len)
            # Slices, not a mask: a boolean mask on a device tensor waits for the device.
            for start, end in _false_runs(taken.numpy()):
                self.allocator.free(own[start:end])
        else:
            self.allocator.free(own)
        # The device copies of the slots are freed where they are: nothing here waits for the device.
        self.allocator.free(slots[cacheable:])
        self.tree_cache.dec_lock_ref(req.last_node)
        self.req_to_token_pool.free(req.req_pool_idx)
        req.req_pool_idx, req.last_node = None, None
        # Req.draft is SpecScheduling's: it starts afresh at the request's next admission.
        req.kv_len = req.cached_len = 0

    def flush(self) -> None:
        self.tree_cache.reset()

    def accounting(self, num_held_by_requests: int) -> dict:
        return {
            "total_slots": self.allocator.size,
            "free_slots": self.allocator.available_size(),
            "cached_slots": self.tree_cache.total_size(),
            "evictable_slots": self.tree_cache.evictable_size(),
            "protected_slots": self.tree_cache.protected_size(),
            "request_slots": num_held_by_requests,
        }


def _matchable_ids(req: Req) -> list[int]:
    # The last token is always computed, so its logits exist: match at most len - 1 tokens. A
    # request with prompt positions still to score needs their logits too: it matches only the
    # positions before them (a cached position's logits are never computed again).
    ids = req.all_ids
    limit = min(len(ids) - 1, req.input_logprob_next) if req.scores_prompt else len(ids) - 1
    return ids[:limit]


def _false_runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """(start, end) of each run of False in a 1-D bool array, in order."""
    edges = np.flatnonzero(np.diff(np.concatenate(([True], mask, [True])).astype(np.int8)))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist()))
