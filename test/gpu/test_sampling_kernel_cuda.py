"""The Triton Gumbel-max sampler on CUDA: the torch Sampler's tokens at real vocabulary
sizes, the same noise bits, CUDA-graph replay with new offsets, and a timing print.
Run on the GPU machine: python -m pytest test/gpu/test_sampling_kernel_cuda.py -q -s"""

import pytest
import torch

from sgl_kernel.sampling import gumbel_max_sample, gumbel_noise_kernel, uniform_kernel
from sglang.srt.layers.sampler import Sampler, gumbel_noise
from sglang.srt.sampling.random import uniform
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
from sglang.srt.sampling.sampling_params import SamplingParams

sampler = Sampler()
VOCAB_SIZES = [128256, 151936]
TEMPERATURES = [0.0, 0.7, 1.0, 1.3, 0.2, 2.0]


def make_batch(batch_size, vocab_size, temperatures=TEMPERATURES):
    params = [SamplingParams(temperature=temperatures[i % len(temperatures)]) for i in range(batch_size)]
    seeds = [(2**61 + 7919 * i) * (-1) ** i for i in range(batch_size)]
    return SamplingBatchInfo.from_params(params, seeds, vocab_size, "cuda")


def random_logits(batch_size, vocab_size, dtype, seed=0):
    generator = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(batch_size, vocab_size, device="cuda", generator=generator) * 4).to(dtype)


def kernel_tokens(logits, info, offsets):
    return gumbel_max_sample(logits, info.temperatures, info.seeds, offsets, info.greedy_mask)


@pytest.mark.parametrize("stream", [0, 1, 3, 2**32 - 1])
def test_in_kernel_noise_equals_torch_bit_for_bit(stream):
    generator = torch.Generator(device="cuda").manual_seed(stream % 1000)
    seeds = torch.randint(-(2**63), 2**63 - 1, (64,), device="cuda", generator=generator)
    offsets = torch.randint(0, 2**40, (64,), device="cuda", generator=generator)
    width = 151936  # 64 rows of this cover most of the 2**23 possible uniforms
    assert torch.equal(uniform_kernel(seeds, offsets, width, stream), uniform(seeds, offsets, width, stream))
    want = gumbel_noise(seeds, offsets, width, stream)
    assert torch.equal(gumbel_noise_kernel(seeds, offsets, width, stream), want)


@pytest.mark.parametrize("vocab_size", VOCAB_SIZES)
@pytest.mark.parametrize("batch_size", [1, 64, 256])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_tokens_equal_sampler(vocab_size, batch_size, dtype):
    info = make_batch(batch_size, vocab_size, TEMPERATURES[1:] if batch_size == 1 else TEMPERATURES)
    for step in range(3):
        logits = random_logits(batch_size, vocab_size, dtype, seed=step)
        offsets = torch.arange(batch_size, device="cuda") * 13 + step
        assert torch.equal(kernel_tokens(logits, info, offsets), sampler(logits, info, offsets))


def test_greedy_ties_and_masked_logits_follow_torch_argmax():
    vocab_size = 151936
    logits = random_logits(4, vocab_size, torch.float32, seed=5)
    logits[0, [77, 90000, 151935]] = 100.0  # greedy tie across chunks
    logits[1] = float("-inf")  # greedy, nothing finite
    logits[2, 2000:] = float("-inf")  # sampled, only the first 2000 allowed
    logits[3, 123456] = float("nan")
    info = make_batch(4, vocab_size, [0.0, 0.0, 1.0, 1.0])
    offsets = torch.tensor([1, 2, 3, 4], device="cuda")
    got = kernel_tokens(logits, info, offsets)
    assert got[0].item() == 77 and got[1].item() == 0 and got[2].item() < 2000
    assert got[3].item() == 123456
    assert torch.equal(got, sampler(logits, info, offsets))


@pytest.mark.parametrize("vocab_size", VOCAB_SIZES)
def test_cuda_graph_replay_reads_new_offsets_and_logits(vocab_size):
    batch_size = 64
    info = make_batch(batch_size, vocab_size)
    logits = random_logits(batch_size, vocab_size, torch.bfloat16, seed=1)
    offsets = torch.arange(batch_size, device="cuda")
    kernel_tokens(logits, info, offsets)  # compile and warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = kernel_tokens(logits, info, offsets)
    for step in range(1, 4):
        offsets.add_(1)
        logits.copy_(random_logits(batch_size, vocab_size, torch.bfloat16, seed=step + 10))
        graph.replay()
        assert torch.equal(captured, sampler(logits, info, offsets))


def _elapsed_us(fn, iterations=100):
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iterations):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iterations * 1000


def _graph_of(fn):
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


@pytest.mark.parametrize("vocab_size", VOCAB_SIZES)
def test_print_kernel_and_torch_sampler_times(vocab_size):
    """A report, not an assertion: microseconds per call, eager and in a CUDA graph."""
    for batch_size in (1, 64, 256):
        info = make_batch(batch_size, vocab_size, [0.8])  # every row sampled
        logits = random_logits(batch_size, vocab_size, torch.bfloat16)
        offsets = torch.arange(batch_size, device="cuda")

        def kernel():
            return kernel_tokens(logits, info, offsets)

        def reference():
            return sampler(logits, info, offsets)

        times = [_elapsed_us(fn) for fn in (kernel, _graph_of(kernel), reference, _graph_of(reference))]
        print(
            f"\nsampling V={vocab_size} bs={batch_size} bf16 (us): kernel {times[0]:.1f} eager, "
            f"{times[1]:.1f} graph; torch Sampler {times[2]:.1f} eager, {times[3]:.1f} graph"
        )
