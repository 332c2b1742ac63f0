"""Gumbel-max sampling in one pass over the logits: the counter-based noise of
`sglang.srt.sampling.random.uniform` is hashed in the kernel, never stored.

Reference: `sglang.srt.layers.sampler.Sampler` without top-k / top-p / min-p. Token choices
match it exactly: the same MurmurHash3 words, the same 23-bit floats, IEEE division by the
temperature, logarithms with torch's CUDA bits, and torch.argmax's order (a NaN wins, ties
go to the lowest index). Each row is split into chunks of whole blocks, one program per
(row, chunk), and a second small kernel reduces the chunks' winners.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_MASK32 = 0xFFFFFFFF
# Programs per launch to aim for: one program walking a 150k-column row is slow, and on an
# H200 (Triton 3.6, vocab 152k) batch 256 ran in 120 us split 30 ways, 223 us split 3 ways.
_TARGET_PROGRAMS = 8192


def gumbel_max_sample(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    seeds: torch.Tensor,
    offsets: torch.Tensor,
    greedy_mask: torch.Tensor,
    stream: int = 0,
    num_chunks: int | None = None,
    block_size: int = 1024,
    num_warps: int = 4,
) -> torch.Tensor:
    """int64[bs] tokens: argmax(logits / T + gumbel(seed, offset, stream)) per row, or the
    plain argmax of the logits where greedy_mask is set.

    logits: float[bs, vocab] of any float dtype; temperatures: float32[bs] or [bs, 1];
    seeds, offsets: int64[bs]; greedy_mask: bool[bs]. The grid depends only on (bs, vocab)
    and nothing is read back, so the call can be captured in a CUDA graph.
    Tuning knobs: `num_chunks` (programs per row), `block_size` (columns per step, a power of
    two), `num_warps`; the defaults were fastest, or within 3%, on an H200 at bs 1 to 256.
    """
    batch_size, vocab_size = logits.shape
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    temperatures = temperatures.reshape(batch_size).contiguous()
    num_chunks, blocks_per_chunk = _split_vocab(batch_size, vocab_size, num_chunks, block_size)
    device = logits.device
    chunk_values = torch.empty(batch_size, num_chunks, dtype=torch.float32, device=device)
    chunk_tokens = torch.empty(batch_size, num_chunks, dtype=torch.int64, device=device)
    _gumbel_max_chunk_kernel[(batch_size, num_chunks)](
        logits,
        logits.stride(0),
        temperatures,
        seeds.contiguous(),
        offsets.contiguous(),
        greedy_mask.contiguous(),
        chunk_values,
        chunk_tokens,
        vocab_size,
        stream & _MASK32,
        num_chunks,
        BLOCKS_PER_CHUNK=blocks_per_chunk,
        BLOCK=block_size,
        num_warps=num_warps,
    )
    if num_chunks == 1:
        return chunk_tokens.view(batch_size)
    tokens = torch.empty(batch_size, dtype=torch.int64, device=device)
    _reduce_chunks_kernel[(batch_size,)](
        chunk_values,
        chunk_tokens,
        tokens,
        num_chunks,
        BLOCK=triton.next_power_of_2(num_chunks),
        num_warps=1,
    )
    return tokens


def uniform_kernel(seeds: torch.Tensor, offsets: torch.Tensor, width: int, stream: int = 0) -> torch.Tensor:
    """float32[bs, width]: the kernel's uniforms, to check against `random.uniform`."""
    return _debug_noise(seeds, offsets, width, stream, gumbel=False)


def gumbel_noise_kernel(seeds: torch.Tensor, offsets: torch.Tensor, width: int, stream: int = 0) -> torch.Tensor:
    """float32[bs, width]: the kernel's Gumbel noise, to check against `gumbel_noise`."""
    return _debug_noise(seeds, offsets, width, stream, gumbel=True)


def _split_vocab(batch_size: int, vocab_size: int, num_chunks: int | None, block_size: int) -> tuple[int, int]:
    """(chunks per row, blocks per chunk). Chunks hold whole blocks, so they start aligned;
    blocks per chunk is a compile-time constant that takes only a few values."""
    blocks_per_row = triton.cdiv(vocab_size, block_size)
    if num_chunks is None:
        num_chunks = triton.cdiv(_TARGET_PROGRAMS, batch_size)
    blocks_per_chunk = triton.cdiv(blocks_per_row, max(1, min(num_chunks, blocks_per_row)))
    return triton.cdiv(blocks_per_row, blocks_per_chunk), blocks_per_chunk


def compile_classes(vocab_size: int, max_batch_size: int, block_size: int = 1024) -> list[int]:
    """One batch size per distinct compiled form of `gumbel_max_sample` for batches of 1 to
    max_batch_size: the chunking follows the batch size, BLOCKS_PER_CHUNK and the reduce's BLOCK
    are compile-time constants, and Triton specializes the chunk count on being 1 or a multiple
    of 16. Sampling once at each of these sizes compiles everything a server can meet."""
    seen, sizes = set(), []
    for batch_size in range(1, max_batch_size + 1):
        chunks, per_chunk = _split_vocab(batch_size, vocab_size, None, block_size)
        key = (per_chunk, triton.next_power_of_2(chunks), chunks == 1, chunks % 16 == 0)
        if key not in seen:
            seen.add(key)
            sizes.append(batch_size)
    return sizes


def _debug_noise(seeds, offsets, width, stream, gumbel):
    batch_size = seeds.shape[0]
    out = torch.empty(batch_size, width, dtype=torch.float32, device=seeds.device)
    block = min(1024, triton.next_power_of_2(width))
    _noise_kernel[(batch_size, triton.cdiv(width, block))](
        seeds.contiguous(),
        offsets.contiguous(),
        out,
        width,
        stream & _MASK32,
        GUMBEL=gumbel,
        BLOCK=block,
    )
    return out


# ---------------------------------------------------------------- hash and noise, in-kernel


@triton.jit
def _rotl32(x, r: tl.constexpr):
    return (x << r) | (x >> (32 - r))


@triton.jit
def _mix_block(h, word):
    """One MurmurHash3 body step on uint32 values; uint32 multiplies wrap mod 2**32."""
    k = word * 0xCC9E2D51
    k = _rotl32(k, 15)
    k = k * 0x1B873593
    h = _rotl32(h ^ k, 13)
    return h * 5 + 0xE6546B64


@triton.jit
def _fmix32(h):
    h = h ^ (h >> 16)
    h = h * 0x85EBCA6B
    h = h ^ (h >> 13)
    h = h * 0xC2B2AE35
    return h ^ (h >> 16)


@triton.jit
def _row_hash(seeds_ptr, offsets_ptr, row, stream):
    """The hash state after the five per-row words: seed lo/hi, offset lo/hi, stream."""
    seed = tl.load(seeds_ptr + row).to(tl.int64)
    offset = tl.load(offsets_ptr + row).to(tl.int64)
    h = tl.full((), 0x9747B28C, tl.uint32)
    h = _mix_block(h, seed.to(tl.uint32))
    h = _mix_block(h, (seed >> 32).to(tl.uint32))
    h = _mix_block(h, offset.to(tl.uint32))
    h = _mix_block(h, (offset >> 32).to(tl.uint32))
    return _mix_block(h, stream.to(tl.uint32))


@triton.jit
def _uniform(row_hash, columns):
    """(2k + 1) / 2**24 for the top 23 bits k of the hash: exact in float32, inside (0, 1)."""
    h = _mix_block(row_hash, columns.to(tl.uint32))
    h = _fmix32(h ^ 24)  # 24 = the key's length in bytes, as MurmurHash3 appends it
    bits = h >> 9
    return (bits * 2 + 1).to(tl.float32) * 5.9604644775390625e-08


@triton.jit
def _gumbel(u):
    # On CUDA, tl.log gives torch.log's float32 bits for every one of the 2**23 possible u
    # and for the second logarithm of each (checked exhaustively on an H200, Triton 3.6).
    return -tl.log(-tl.log(u))


# `stream` is never specialised: a constant 1 would have no `.to`.
@triton.jit(do_not_specialize=["stream"])
def _noise_kernel(seeds_ptr, offsets_ptr, out_ptr, width, stream, GUMBEL: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    columns = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    noise = _uniform(_row_hash(seeds_ptr, offsets_ptr, row, stream), columns)
    if GUMBEL:
        noise = _gumbel(noise)
    tl.store(out_ptr + row.to(tl.int64) * width + columns, noise, mask=columns < width)


# ---------------------------------------------------------------- argmax, torch.argmax's order


@triton.jit
def _first_argmax(values, indices):
    """(value, index) of the best entry of 1-D tensors: a NaN beats any number, and equal
    values go to the lowest index. Built from max / min reductions, which stay vectorised
    in the interpreter too."""
    no_index = 2**31 - 1
    is_nan = values != values
    nan_index = tl.min(tl.where(is_nan, indices, no_index), axis=0)
    top = tl.max(tl.where(is_nan, float("-inf"), values), axis=0)
    top_index = tl.min(tl.where(values == top, indices, no_index), axis=0)
    has_nan = nan_index != no_index
    return tl.where(has_nan, float("nan"), top), tl.where(has_nan, nan_index, top_index)


@triton.jit
def _chunk_argmax(
    row_ptr,
    start,
    vocab_size,
    temperature,
    row_hash,
    SAMPLE: tl.constexpr,
    BLOCKS_PER_CHUNK: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """(value, index) of the best score in the chunk of columns that begins at start."""
    lanes = tl.arange(0, BLOCK)
    # Each lane keeps its own best; a lane sees its columns in increasing order, so a
    # strictly-greater test already keeps the lowest index among equals.
    best_values = tl.full((BLOCK,), float("-inf"), tl.float32)
    best_indices = start + lanes
    for block in range(BLOCKS_PER_CHUNK):  # a constant trip count, also for the interpreter
        columns = start + block * BLOCK + lanes
        in_vocab = columns < vocab_size
        scores = tl.load(row_ptr + columns, mask=in_vocab, other=float("-inf")).to(tl.float32)
        if SAMPLE:
            noise = _gumbel(_uniform(row_hash, columns))
            scores = tl.where(in_vocab, tl.math.div_rn(scores, temperature) + noise, float("-inf"))
        better = (scores > best_values) | ((scores != scores) & (best_values == best_values))
        best_values = tl.where(better, scores, best_values)
        best_indices = tl.where(better, columns, best_indices)
    return _first_argmax(best_values, best_indices)


@triton.jit(do_not_specialize=["stream"])
def _gumbel_max_chunk_kernel(
    logits_ptr,
    logits_row_stride,
    temperatures_ptr,
    seeds_ptr,
    offsets_ptr,
    greedy_mask_ptr,
    chunk_values_ptr,
    chunk_tokens_ptr,
    vocab_size,
    stream,
    num_chunks,
    BLOCKS_PER_CHUNK: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    start = chunk * (BLOCKS_PER_CHUNK * BLOCK)
    row_ptr = logits_ptr + row.to(tl.int64) * logits_row_stride
    if tl.load(greedy_mask_ptr + row):  # the plain argmax: no temperature, no noise
        value, index = _chunk_argmax(row_ptr, start, vocab_size, 1.0, 0, False, BLOCKS_PER_CHUNK, BLOCK)
    else:
        temperature = tl.load(temperatures_ptr + row).to(tl.float32)
        row_hash = _row_hash(seeds_ptr, offsets_ptr, row, stream)
        value, index = _chunk_argmax(row_ptr, start, vocab_size, temperature, row_hash, True, BLOCKS_PER_CHUNK, BLOCK)
    tl.store(chunk_values_ptr + row * num_chunks + chunk, value)
    tl.store(chunk_tokens_ptr + row * num_chunks + chunk, index.to(tl.int64))


@triton.jit
def _reduce_chunks_kernel(chunk_values_ptr, chunk_tokens_ptr, tokens_ptr, num_chunks, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    chunks = tl.arange(0, BLOCK)
    valid = chunks < num_chunks
    values = tl.load(chunk_values_ptr + row * num_chunks + chunks, mask=valid, other=float("-inf"))
    # Padding never wins: its index is above every real token's.
    tokens = tl.load(chunk_tokens_ptr + row * num_chunks + chunks, mask=valid, other=2**31 - 1)
    _, token = _first_argmax(values, tokens)
    tl.store(tokens_ptr + row, token)
