"""Host time of one radix-cache eviction (a slice of 1/64 of the pool, as KVManager takes it) by
the number of cached leaves, on this machine's CPU; the tree holds distinct prompts of 128 tokens
that share prefixes of 0-24 tokens, as a cache full of served requests does.

    python benchmark/evict_cost.py [--leaves 2000,20000] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from sglang.srt.managers.kv_manager import EVICT_SHARE  # noqa: E402
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixCache  # noqa: E402

PROMPT_LEN = 128


def measure(num_leaves: int, evictions: int = 3) -> list[float]:
    """ms per eviction of size // EVICT_SHARE tokens (KVManager's slice), `evictions` in a row."""
    size = num_leaves * PROMPT_LEN
    allocator = TokenToKVPoolAllocator(size)
    cache = RadixCache(allocator)
    slots = allocator.alloc_host(size)
    rng = random.Random(0)
    shared = [rng.randrange(1000) for _ in range(32)]
    for i in range(num_leaves):
        prefix = shared[:(i % 4) * 8]
        ids = prefix + [10_000 + i] + [rng.randrange(1000) for _ in range(PROMPT_LEN - 1 - len(prefix))]
        cache.insert(ids, slots[i * PROMPT_LEN:(i + 1) * PROMPT_LEN])
    times = []
    for _ in range(evictions):
        start = time.perf_counter()
        cache.evict(size // EVICT_SHARE)
        times.append(1e3 * (time.perf_counter() - start))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--leaves", default="2000,20000")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    result = {}
    for n in (int(x) for x in args.leaves.split(",")):
        result[n] = measure(n)
        print(f"{n:7} leaves: ms per eviction {' '.join(f'{t:.2f}' for t in result[n])}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"ms_per_eviction": result}, f, indent=1)


if __name__ == "__main__":
    main()
