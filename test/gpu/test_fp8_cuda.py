"""sgl_kernel's FP8 GEMMs on CUDA at Llama-3.1-8B's linear shapes against their dequantizing torch
references (computed on the GPU from the same e4m3 weights, in float32), the FP8 linear layers'
CUDA path against their CPU path, and the wrappers inside a CUDA graph without host syncs.
Run on the GPU machine: python -m pytest test/gpu/test_fp8_cuda.py -q

Error measure: sgl_kernel.testing.relative_error. Tolerances: sgl_kernel.testing.TOLERANCE where the
product is exact in fp32 (the one-row skinny kernel's fp32 sums, weight-only products) or cuBLAS's
(torch._scaled_mm); FP8_MMA_TOLERANCE where the Triton kernels multiply e4m3 tiles on fp8 tensor
cores, which sum each instruction's products at reduced precision."""

import pytest
import torch

from sgl_kernel.fp8_gemm import block_fp8_gemm, block_fp8_gemm_ref, scaled_fp8_gemm, scaled_fp8_gemm_ref
from sgl_kernel.fp8_reference import FP8, GROUP
from sgl_kernel.fp8_skinny_gemm import MAX_ROWS, block_fp8_skinny_gemm, scaled_fp8_skinny_gemm
from sgl_kernel.testing import FP8_MMA_TOLERANCE, TOLERANCE, relative_error

SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]  # (N, K): qkv, o, gate_up, down
SHAPE_IDS = ["qkv", "o", "gate_up", "down"]
ROWS = [1, 8, 64, 256]
STATIC_SCALE = 4.0 / 448  # inputs past 4 saturate


def fp8_weight(n, k, scales, seed=0):
    """An e4m3 weight [N, K] and float32 scales that differ per 128 x 128 block or per row."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    weight = (torch.randn(n, k, generator=gen, device="cuda") * 100).clamp(-448, 448).to(FP8)
    shape = (-(-n // GROUP), -(-k // GROUP)) if scales == "block" else (n, 1)
    return weight, (torch.rand(shape, generator=gen, device="cuda") + 0.5) * k**-0.5 / 100


def activations(rows, k, dtype, seed=1):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    magnitude = torch.logspace(-2, 1, k, device="cuda")[torch.randperm(k, generator=gen, device="cuda")]
    return (torch.randn(rows, k, generator=gen, device="cuda") * magnitude).to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n, k", SHAPES, ids=SHAPE_IDS)
def test_block_fp8_gemm_at_llama_8b_shapes(dtype, n, k):
    weight, scale = fp8_weight(n, k, "block")
    x = activations(max(ROWS), k, dtype)
    for rows in ROWS:
        ref = block_fp8_gemm_ref(x[:rows], weight, scale)
        error = relative_error(block_fp8_gemm(x[:rows], weight, scale), ref)
        assert error < FP8_MMA_TOLERANCE, (rows, error)
        if rows <= MAX_ROWS:  # one row: fp32 sums; more: an fp8 dot
            error = relative_error(block_fp8_skinny_gemm(x[:rows], weight, scale), ref)
            assert error < (TOLERANCE[dtype] if rows == 1 else FP8_MMA_TOLERANCE), (rows, "skinny", error)


@pytest.mark.parametrize("acts", ["token", "tensor", "static", "none"])
@pytest.mark.parametrize("n, k", SHAPES, ids=SHAPE_IDS)
def test_scaled_fp8_gemm_at_llama_8b_shapes(acts, n, k):
    """Each backend: torch._scaled_mm (bf16, quantized activations) and the Triton kernel."""
    dtype = torch.bfloat16
    weight, scale = fp8_weight(n, k, "channel")
    x, input_scale = activations(max(ROWS), k, dtype), torch.tensor([STATIC_SCALE], device="cuda")
    backends = ["triton"] + (["scaled_mm"] if acts != "none" else [])
    for rows in ROWS:
        ref = scaled_fp8_gemm_ref(x[:rows], weight, scale, acts, input_scale)
        for backend in backends:
            out = scaled_fp8_gemm(x[:rows], weight, scale, acts, input_scale, backend=backend)
            fp8_dot = backend == "triton" and acts != "none"
            error = relative_error(out, ref)
            assert error < (FP8_MMA_TOLERANCE if fp8_dot else TOLERANCE[dtype]), (rows, backend, error)
        if rows <= MAX_ROWS:
            out = scaled_fp8_skinny_gemm(x[:rows], weight, scale, acts, input_scale)
            fp8_dot = rows > 1 and acts != "none"
            error = relative_error(out, ref)
            assert error < (FP8_MMA_TOLERANCE if fp8_dot else TOLERANCE[dtype]), (rows, "skinny", error)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_scaled_fp8_gemm_off_scaled_mm_dtypes_and_ragged_shapes(dtype):
    """Outputs _scaled_mm does not give (fp32, fp16) and N, K not multiples of 16 take the Triton kernel."""
    for n, k in [(4096, 4096), (1000, 1500)]:
        weight, scale = fp8_weight(n, k, "channel")
        bias = torch.randn(n, device="cuda").to(dtype)
        x = activations(100, k, dtype)
        for rows in (1, 5, 100):
            ref = scaled_fp8_gemm_ref(x[:rows], weight, scale, "token", bias=bias)
            error = relative_error(scaled_fp8_gemm(x[:rows], weight, scale, "token", bias=bias), ref)
            assert error < FP8_MMA_TOLERANCE, (n, k, rows, error)


@pytest.mark.parametrize("weights, acts", [("BLOCK", "GROUP"), ("CHANNEL", "TOKEN"), ("TENSOR", "STATIC")])
def test_fp8_linear_layer_on_cuda_equals_its_cpu_reference(weights, acts):
    """The layer as the loader leaves it, moved to the GPU: the kernels it picks for 1 to 256 rows
    give what the CPU reference gives."""
    from sglang.srt.layers.linear import Linear
    from sglang.srt.layers.quantization import fp8

    n, k = 6144, 4096
    layer = Linear(k, n, bias=False)
    layer.quantize(fp8.Fp8LinearMethod(fp8.Fp8Scheme(fp8.WeightScales[weights], fp8.Activations[acts])))
    weight, scale = fp8_weight(n, k, "block" if weights == "BLOCK" else "channel")
    layer.weight.data.copy_(weight.cpu())
    layer.weight_scale.data.copy_(scale.cpu().expand_as(layer.weight_scale))
    if acts == "STATIC":
        layer.input_scale.data.fill_(STATIC_SCALE)
    layer.quant_method.process_weights_after_loading(layer)
    x = activations(max(ROWS), k, torch.bfloat16)
    with torch.no_grad():
        want = layer(x.cpu())
        layer.cuda()
        for rows in ROWS:
            error = relative_error(layer(x[:rows]).cpu(), want[:rows])
            assert error < FP8_MMA_TOLERANCE, (rows, error)


def test_fp8_wrappers_replay_in_a_cuda_graph_without_host_syncs():
    n, k = 4096, 4096
    block_weight, block_scale = fp8_weight(n, k, "block")
    weight, scale = fp8_weight(n, k, "channel")
    input_scale = torch.tensor([STATIC_SCALE], device="cuda")
    x = activations(64, k, torch.bfloat16)
    calls = {
        "block": lambda rows: block_fp8_gemm(x[:rows], block_weight, block_scale),
        "block_skinny": lambda rows: block_fp8_skinny_gemm(x[:1], block_weight, block_scale),
        "block_skinny_rows": lambda rows: block_fp8_skinny_gemm(x[:4], block_weight, block_scale),
        "token": lambda rows: scaled_fp8_gemm(x[:rows], weight, scale, "token"),
        "tensor": lambda rows: scaled_fp8_gemm(x[:rows], weight, scale, "tensor"),
        "static_triton": lambda rows: scaled_fp8_gemm(x[:rows], weight, scale, "static", input_scale, backend="triton"),
        "token_skinny": lambda rows: scaled_fp8_skinny_gemm(x[:4], weight, scale, "token"),
    }
    eager = {name: call(64) for name, call in calls.items()}  # compiles first
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = {name: call(64) for name, call in calls.items()}
    finally:
        torch.cuda.set_sync_debug_mode("default")
    x.copy_(activations(64, k, torch.bfloat16, seed=7))  # new inputs in place, as the graph runner does
    graph.replay()
    for name, call in calls.items():
        assert torch.equal(captured[name], call(64)), name
        assert not torch.equal(captured[name], eager[name]), name
