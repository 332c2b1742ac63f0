"""Sampling on CUDA gives the CPU's bits and tokens, also inside a CUDA graph.
Run on the GPU machine: python -m pytest test/gpu -q"""

import torch

from sglang.srt.layers.sampler import Sampler
from sglang.srt.sampling.random import uniform
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
from sglang.srt.sampling.sampling_params import SamplingParams

sampler = Sampler()


def make_info(params, seeds, vocab_size):
    return SamplingBatchInfo.from_params(params, seeds, vocab_size, "cpu")


def test_cuda_and_cuda_graph_give_the_cpu_bits():
    seeds = torch.tensor([0, 3, 2**63 - 1, -5])
    offsets = torch.tensor([0, 2**33, 7, 11])
    want = uniform(seeds, offsets, 3000, stream=4)
    seeds_gpu, offsets_gpu = seeds.cuda(), offsets.cuda()
    assert torch.equal(uniform(seeds_gpu, offsets_gpu, 3000, stream=4).cpu(), want)
    graph = torch.cuda.CUDAGraph()
    uniform(seeds_gpu, offsets_gpu, 3000, stream=4)  # warm up outside capture
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        captured = uniform(seeds_gpu, offsets_gpu, 3000, stream=4)
    offsets_gpu.add_(1)  # replay reads the new offsets in place
    graph.replay()
    assert torch.equal(captured.cpu(), uniform(seeds, offsets + 1, 3000, stream=4))


def test_cuda_gives_the_cpu_tokens():
    logits = torch.randn(32, 5000, generator=torch.Generator().manual_seed(6)) * 4
    params = [SamplingParams(temperature=[0.0, 0.7, 1.0, 1.3][i % 4], top_k=[-1, 40][i % 2]) for i in range(32)]
    seeds, offsets = list(range(32)), torch.arange(32) * 5
    # Half-precision logits, as a model would give; the sampler upcasts them on both devices.
    logits = logits.half()
    on_cpu = sampler(logits, make_info(params, seeds, 5000), offsets)
    info_gpu = SamplingBatchInfo.from_params(params, seeds, 5000, "cuda")
    on_gpu = sampler(logits.cuda(), info_gpu, offsets.cuda())
    assert torch.equal(on_gpu.cpu(), on_cpu)
