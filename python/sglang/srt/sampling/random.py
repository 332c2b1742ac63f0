"""Counter-based random numbers for sampling: every value is a hash of (seed, offset, stream,
column), so a request's draws depend on nothing else in the batch and can be replayed.

The hash is MurmurHash3 (x86_32) over six 32-bit words, written in plain torch integer ops on
int64 tensors that hold uint32 values, so CPU, CUDA and CUDA-graph replay give the same bits.
"""

from __future__ import annotations

import torch

_MASK32 = 0xFFFFFFFF
_BLOCK_C1 = 0xCC9E2D51
_BLOCK_C2 = 0x1B873593
_BLOCK_ADD = 0xE6546B64
_FMIX_C1 = 0x85EBCA6B
_FMIX_C2 = 0xC2B2AE35
_HASH_SEED = 0x9747B28C  # any fixed value; changing it changes every sampled token
_NUM_WORDS = 6  # seed lo/hi, offset lo/hi, stream, column
_MANTISSA_BITS = 23


def uniform(seeds: torch.Tensor, offsets: torch.Tensor, width: int, stream: int = 0) -> torch.Tensor:
    """float32[bs, width] in the open interval (0, 1).

    Row i depends only on (seeds[i], offsets[i], stream) and the column index. `stream`
    picks an independent sequence for the same (seed, offset), e.g. for rejection sampling.
    """
    h = _hash_row_words(seeds.long(), offsets.long(), stream)
    columns = torch.arange(width, dtype=torch.int64, device=seeds.device)
    # The column is the last block: its per-column part is computed once over [width] and
    # only the state update and finaliser run over the full [bs, width] matrix.
    h = _mix_block(h[:, None], columns[None, :])
    h = _fmix32(h ^ (4 * _NUM_WORDS))
    return _to_open_unit_interval(h)


def _hash_row_words(seeds: torch.Tensor, offsets: torch.Tensor, stream: int) -> torch.Tensor:
    h = torch.full_like(seeds, _HASH_SEED)
    for value in (seeds, offsets):
        h = _mix_block(h, value & _MASK32)
        h = _mix_block(h, (value >> 32) & _MASK32)
    return _mix_block(h, stream & _MASK32)


def _to_open_unit_interval(h: torch.Tensor) -> torch.Tensor:
    # float32 has 24 significant bits, so just below 1 it can only step by 2**-24. Taking 23
    # bits k and returning (2k + 1) / 2**24 (k plus half a step) keeps every value exact,
    # evenly spaced and strictly inside (0, 1), so log(u) and log(-log(u)) stay finite.
    bits = h >> (32 - _MANTISSA_BITS)
    return (2 * bits + 1).to(torch.float32) * (2.0 ** -(_MANTISSA_BITS + 1))


def _mul32(x, c: int):
    """x * c mod 2**32 for uint32 x and constant c, without int64 overflow: splitting x into
    16-bit halves keeps every partial product below 2**48."""
    high = x >> 16
    low = x & 0xFFFF
    return ((((high * c) & 0xFFFF) << 16) + low * c) & _MASK32


def _rotl32(x, r: int):
    return ((x << r) | (x >> (32 - r))) & _MASK32


def _mix_block(h, word):
    """One MurmurHash3 body step: absorb a 32-bit word into the state h."""
    k = _mul32(word, _BLOCK_C1)
    k = _rotl32(k, 15)
    k = _mul32(k, _BLOCK_C2)
    h = _rotl32(h ^ k, 13)
    return (h * 5 + _BLOCK_ADD) & _MASK32  # h * 5 < 2**35, no overflow


def _fmix32(h):
    """MurmurHash3's finaliser: every input bit flips each output bit with probability ~1/2."""
    h = h ^ (h >> 16)
    h = _mul32(h, _FMIX_C1)
    h = h ^ (h >> 13)
    h = _mul32(h, _FMIX_C2)
    return h ^ (h >> 16)
