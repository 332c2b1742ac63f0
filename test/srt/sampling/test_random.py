"""Counter-based uniform random numbers: bit-exact against a plain-Python MurmurHash3,
batch invariant, and statistically uniform."""

import struct

import numpy as np
import pytest
import scipy.stats
import torch

from sglang.srt.sampling import random as sampling_random
from sglang.srt.sampling.random import uniform

MASK32 = 0xFFFFFFFF


def murmur3_32_reference(data: bytes, seed: int) -> int:
    """MurmurHash3 x86_32 with unbounded Python ints, as the torch code's reference."""

    def rotl(x, r):
        return ((x << r) | (x >> (32 - r))) & MASK32

    def scramble(k):
        return (rotl((k * 0xCC9E2D51) & MASK32, 15) * 0x1B873593) & MASK32

    h = seed
    num_blocks = len(data) // 4
    for i in range(num_blocks):
        h = rotl(h ^ scramble(int.from_bytes(data[4 * i : 4 * i + 4], "little")), 13)
        h = (h * 5 + 0xE6546B64) & MASK32
    tail = data[4 * num_blocks :]
    if tail:
        h ^= scramble(int.from_bytes(tail, "little"))
    h ^= len(data)
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & MASK32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & MASK32
    return h ^ (h >> 16)


@pytest.mark.parametrize(
    "data, seed, expected",
    [
        (b"", 0, 0),
        (b"", 1, 0x514E28B7),
        (b"", 0xFFFFFFFF, 0x81F16F39),
        (b"\0\0\0\0", 0, 0x2362F9DE),
        (b"aaaa", 0x9747B28C, 0x5A97808A),
        (b"abcd", 0x9747B28C, 0xF0478627),
        (b"Hello, world!", 0x9747B28C, 0x24884CBA),
        (b"The quick brown fox jumps over the lazy dog", 0x9747B28C, 0x2FA826CD),
    ],
)
def test_reference_matches_published_murmur3_vectors(data, seed, expected):
    assert murmur3_32_reference(data, seed) == expected


def expected_uniform(seed: int, offset: int, stream: int, column: int) -> float:
    words = struct.pack(
        "<6I",
        seed & MASK32,
        (seed >> 32) & MASK32,
        offset & MASK32,
        (offset >> 32) & MASK32,
        stream,
        column,
    )
    bits = murmur3_32_reference(words, sampling_random._HASH_SEED) >> 9
    return (2 * bits + 1) / 2**24


def test_uniform_is_bit_exact_against_reference():
    seeds = [0, 1, 12345, 2**32 - 1, 2**32, 2**63 - 1, -1]
    offsets = [0, 7, 2**31, 2**32 + 5, 2**40, 3, 2**62]
    for stream in (0, 1, 0xFFFFFFFF):
        u = uniform(torch.tensor(seeds), torch.tensor(offsets), 5, stream)
        want = [[expected_uniform(s, o, stream, c) for c in range(5)] for s, o in zip(seeds, offsets)]
        assert torch.equal(u, torch.tensor(want, dtype=torch.float32))


def test_mul32_matches_python_modular_product_without_overflow():
    x = torch.tensor([0, 1, 0xFFFF, 0x10000, 0xDEADBEEF, MASK32])
    for c in (0x85EBCA6B, 0xC2B2AE35, MASK32):
        want = torch.tensor([(v * c) & MASK32 for v in x.tolist()])
        assert torch.equal(sampling_random._mul32(x, c), want)


def test_values_strictly_inside_unit_interval():
    u = uniform(torch.arange(64), torch.arange(64) * 3, 4096)
    assert u.dtype == torch.float32 and u.shape == (64, 4096)
    assert (u > 0).all() and (u < 1).all()
    extremes = sampling_random._to_open_unit_interval(torch.tensor([0, MASK32]))
    assert extremes[0] > 0 and extremes[1] < 1
    assert torch.isfinite(torch.log(-torch.log(extremes))).all()


def test_row_independent_of_rest_of_batch():
    seeds = torch.tensor([5, 9, 5, 2**40])
    offsets = torch.tensor([0, 3, 1, 17])
    batch = uniform(seeds, offsets, 100, stream=2)
    for i in range(4):
        alone = uniform(seeds[i : i + 1], offsets[i : i + 1], 100, stream=2)
        assert torch.equal(batch[i], alone[0])
    permuted = uniform(seeds.flip(0), offsets.flip(0), 100, stream=2)
    assert torch.equal(permuted, batch.flip(0))


def test_width_prefix_is_stable():
    # Column c does not depend on the width, so a padded vocabulary keeps the same noise.
    seeds, offsets = torch.tensor([3, 4]), torch.tensor([1, 2])
    assert torch.equal(uniform(seeds, offsets, 50), uniform(seeds, offsets, 80)[:, :50])


@pytest.mark.parametrize("other", [dict(seed=8), dict(offset=1), dict(stream=1)], ids=["seed", "offset", "stream"])
def test_changing_seed_offset_or_stream_changes_values(other):
    base = dict(seed=7, offset=0, stream=0)
    changed = {**base, **other}

    def draw(seed, offset, stream):
        return uniform(torch.tensor([seed]), torch.tensor([offset]), 1000, stream)

    a, b = draw(**base), draw(**changed)
    assert (a != b).float().mean() > 0.99
    # Independent, not merely different: no linear relation between the two sequences.
    assert abs(np.corrcoef(a[0].numpy(), b[0].numpy())[0, 1]) < 0.1


def test_distribution_is_uniform():
    u = uniform(torch.arange(100), torch.arange(100) * 1000, 1000).flatten().double().numpy()
    assert scipy.stats.kstest(u, "uniform").pvalue > 1e-3
    # Consecutive offsets of one seed are what a request sees token after token.
    first_column = uniform(torch.zeros(100_000, dtype=torch.int64), torch.arange(100_000), 1)
    assert scipy.stats.kstest(first_column.flatten().double().numpy(), "uniform").pvalue > 1e-3


def test_low_bits_are_uniform_too():
    # Weak hashes show up in the low bits first; check the 256 buckets of the last 8 bits.
    u = uniform(torch.arange(50), torch.zeros(50, dtype=torch.int64), 2048).flatten().double()
    bits = ((u * 2**24 - 1) / 2).long()
    counts = torch.bincount(bits & 0xFF, minlength=256).numpy()
    assert scipy.stats.chisquare(counts).pvalue > 1e-3
