"""The Triton Gumbel-max sampler against its torch reference, `Sampler`, under the Triton
interpreter on CPU (conftest.py switches it on): the in-kernel uniforms bit for bit, and
the chosen tokens exactly."""

import pytest
import torch

from sgl_kernel.sampling import _split_vocab, gumbel_max_sample, gumbel_noise_kernel, uniform_kernel
from sglang.srt.layers.sampler import Sampler, gumbel_noise
from sglang.srt.sampling.random import uniform
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
from sglang.srt.sampling.sampling_params import SamplingParams

sampler = Sampler()
SEEDS = torch.tensor([0, 3, 2**63 - 1, -5, -(2**63), 2**32 + 17])
OFFSETS = torch.tensor([0, 2**33, 7, 11, 2**62 + 5, 4095])
# Chunk layouts: one program per row; 2 programs of 4 blocks; 8 programs of 1 block.
LAYOUTS = [dict(), dict(num_chunks=2, block_size=128), dict(num_chunks=8, block_size=128)]


def make_batch(temperatures, vocab_size, seed_base=0):
    params = [SamplingParams(temperature=t) for t in temperatures]
    seeds = [seed_base + 1000 * i for i in range(len(params))]
    return SamplingBatchInfo.from_params(params, seeds, vocab_size, "cpu")


def kernel_tokens(logits, info, offsets, **layout):
    return gumbel_max_sample(logits, info.temperatures, info.seeds, offsets, info.greedy_mask, **layout)


def random_logits(batch_size, vocab_size, seed, scale=3.0):
    return torch.randn(batch_size, vocab_size, generator=torch.Generator().manual_seed(seed)) * scale


@pytest.mark.parametrize("stream", [0, 1, 7, 2**32 - 1])
def test_in_kernel_uniform_equals_random_uniform_bit_for_bit(stream):
    width = 1500  # two blocks of 1024, the second one partial
    got = uniform_kernel(SEEDS, OFFSETS, width, stream)
    assert torch.equal(got, uniform(SEEDS, OFFSETS, width, stream))


def test_in_kernel_gumbel_noise_matches_torch_up_to_log_rounding():
    # numpy's log (the interpreter's) and torch's CPU log can differ in the last bit; on
    # CUDA both call libdevice's logf and agree exactly (test/gpu checks that).
    got = gumbel_noise_kernel(SEEDS, OFFSETS, 700, stream=3)
    torch.testing.assert_close(got, gumbel_noise(SEEDS, OFFSETS, 700, 3), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_tokens_equal_sampler_across_seeds_offsets_and_temperatures(layout):
    temperatures = [1.0, 0.0, 0.3, 0.7, 1.0, 1.5, 2.5, 0.0]
    vocab_size = 1000
    info = make_batch(temperatures, vocab_size, seed_base=11)
    for step in range(2):
        logits = random_logits(len(temperatures), vocab_size, seed=step)
        offsets = torch.arange(len(temperatures)) * 97 + step
        want = sampler(logits, info, offsets)
        assert torch.equal(kernel_tokens(logits, info, offsets, **layout), want)


def test_sampled_tokens_spread_like_the_reference():
    # Same request, many offsets: a flat distribution must give many distinct tokens, all
    # equal to the reference's draws.
    vocab_size, num_draws = 300, 40
    info = make_batch([1.0] * num_draws, vocab_size)
    info.seeds.fill_(42)
    logits = torch.zeros(num_draws, vocab_size)
    offsets = torch.arange(num_draws)
    got = kernel_tokens(logits, info, offsets)
    assert torch.equal(got, sampler(logits, info, offsets))
    assert got.unique().numel() > num_draws // 2


@pytest.mark.parametrize("layout", LAYOUTS)
def test_greedy_ties_take_the_lowest_index_as_torch_argmax(layout):
    vocab_size = 900
    logits = torch.zeros(4, vocab_size)
    logits[0, [5, 400, 899]] = 2.0  # tie across chunks
    logits[1, [700, 701]] = 1.0  # tie inside one chunk, late in the row
    logits[2] = float("-inf")  # nothing finite: torch.argmax returns 0
    logits[3, 899] = float("inf")
    info = make_batch([0.0] * 4, vocab_size)
    got = kernel_tokens(logits, info, torch.zeros(4, dtype=torch.int64), **layout)
    assert got.tolist() == [5, 700, 0, 899]
    assert torch.equal(got, logits.argmax(-1))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_minus_inf_logits_are_never_sampled(layout):
    vocab_size, batch_size = 800, 6
    logits = random_logits(batch_size, vocab_size, seed=5)
    allowed = torch.rand(batch_size, vocab_size, generator=torch.Generator().manual_seed(6)) < 0.05
    allowed[:, 799] = True  # the last column, in the last (partial) block
    logits = logits.masked_fill(~allowed, float("-inf"))
    info = make_batch([1.0, 0.5, 2.0, 0.0, 1.0, 4.0], vocab_size)
    for offset in (0, 9):
        offsets = torch.full((batch_size,), offset)
        got = kernel_tokens(logits, info, offsets, **layout)
        assert allowed.gather(1, got[:, None]).all()
        assert torch.equal(got, sampler(logits, info, offsets))


def test_all_minus_inf_sampled_row_returns_token_zero_as_the_reference():
    logits = torch.full((2, 500), float("-inf"))
    info = make_batch([1.0, 0.8], 500)
    offsets = torch.tensor([3, 4])
    got = kernel_tokens(logits, info, offsets, num_chunks=4, block_size=64)
    assert got.tolist() == [0, 0]
    assert torch.equal(got, sampler(logits, info, offsets))


def test_nan_wins_as_in_torch_argmax():
    logits = random_logits(3, 600, seed=8)
    logits[0, [450, 120]] = float("nan")
    logits[1, 333] = float("nan")
    info = make_batch([1.0, 0.0, 0.7], 600)
    offsets = torch.tensor([1, 2, 3])
    got = kernel_tokens(logits, info, offsets, num_chunks=5, block_size=64)
    assert got[:2].tolist() == [120, 333]
    assert torch.equal(got, sampler(logits, info, offsets))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_logits_give_the_reference_tokens(dtype):
    vocab_size = 1200
    logits = random_logits(5, vocab_size, seed=9).to(dtype)
    info = make_batch([1.0, 0.0, 0.6, 1.2, 0.9], vocab_size, seed_base=3)
    offsets = torch.tensor([0, 1, 2, 3, 2**40])
    want = sampler(logits, info, offsets)
    assert torch.equal(kernel_tokens(logits, info, offsets, num_chunks=2, block_size=256), want)


def test_flat_temperatures_and_other_streams_match_the_torch_formula():
    vocab_size, stream = 700, 5
    logits = random_logits(4, vocab_size, seed=10)
    temperatures = torch.tensor([1.0, 0.5, 2.0, 1.0])
    seeds, offsets = SEEDS[:4], OFFSETS[:4]
    greedy = torch.tensor([False, False, False, True])
    got = gumbel_max_sample(logits, temperatures, seeds, offsets, greedy, stream=stream)
    noisy = logits / temperatures[:, None] + gumbel_noise(seeds, offsets, vocab_size, stream)
    want = torch.where(greedy, logits.argmax(-1), noisy.argmax(-1))
    assert torch.equal(got, want)


def test_non_contiguous_rows_are_read_with_their_stride():
    vocab_size = 512
    padded = random_logits(3, vocab_size + 64, seed=12)
    logits = padded[:, :vocab_size]
    info = make_batch([1.0, 0.0, 0.5], vocab_size)
    offsets = torch.tensor([5, 6, 7])
    got = kernel_tokens(logits, info, offsets, num_chunks=2, block_size=128)
    assert torch.equal(got, sampler(logits.contiguous(), info, offsets))


@pytest.mark.parametrize("batch_size", [1, 7, 64, 256, 4096])
@pytest.mark.parametrize("vocab_size", [300, 128256, 151936])
def test_default_split_covers_the_vocab_with_no_empty_chunk(batch_size, vocab_size):
    block_size = 1024
    num_chunks, blocks_per_chunk = _split_vocab(batch_size, vocab_size, None, block_size)
    chunk_size = blocks_per_chunk * block_size
    assert (num_chunks - 1) * chunk_size < vocab_size <= num_chunks * chunk_size
    if batch_size == 1 and vocab_size > 100_000:
        assert num_chunks >= 64  # a lone row is spread over many programs


@pytest.mark.parametrize("vocab_size, max_batch_size", [(128256, 512), (6144, 256), (151936, 64), (50, 8)])
def test_compile_classes_name_one_batch_size_per_compiled_form(vocab_size, max_batch_size):
    """Sampler.precompile samples once at each of these sizes on CUDA: every batch size up to the
    maximum must share its compiled form (chunk constants, chunk count's specialization) with
    one of them, or the first sampled batch of that size compiles while requests wait."""
    from sgl_kernel.sampling import compile_classes

    def form(bs):
        chunks, per_chunk = _split_vocab(bs, vocab_size, None, 1024)
        return per_chunk, 1 << (chunks - 1).bit_length(), chunks == 1, chunks % 16 == 0

    sizes = compile_classes(vocab_size, max_batch_size)
    assert sizes[0] == 1 and sizes == sorted(set(sizes)) and sizes[-1] <= max_batch_size
    forms = [form(bs) for bs in sizes]
    assert len(set(forms)) == len(forms), "one size per form"
    assert {form(bs) for bs in range(1, max_batch_size + 1)} == set(forms)
    if vocab_size == 128256:
        assert len(sizes) > 4, "a Llama-3 vocabulary takes several forms up to 512 requests"
