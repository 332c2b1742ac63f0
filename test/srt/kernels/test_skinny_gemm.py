"""sgl_kernel/skinny_gemm.py against its torch reference (interpreter on CPU), and the models'
linear layers routed through it."""

import pytest
import torch

from sgl_kernel.skinny_gemm import MAX_ROWS, Config, skinny_gemm, skinny_gemm_ref
from sgl_kernel.testing import TOLERANCE, relative_error


def operands(rows, n, k, dtype, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g).to(dtype)
    w = (torch.randn(n, k, generator=g) * k**-0.5).to(dtype)
    b = torch.randn(n, generator=g).to(dtype) if bias else None
    return x, w, b


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows", [1, 3, MAX_ROWS])
@pytest.mark.parametrize("n, k", [(64, 512), (37, 300)], ids=["even", "ragged"])
def test_skinny_gemm_matches_the_reference(dtype, rows, n, k):
    x, w, b = operands(rows, n, k, dtype)
    for bias in (b, None):
        out = skinny_gemm(x, w, bias)
        assert out.shape == (rows, n) and out.dtype == dtype
        assert relative_error(out, skinny_gemm_ref(x, w, bias)) < TOLERANCE[dtype]


@pytest.mark.parametrize("config", [Config(4, 128, 4, 2), Config(16, 64, 4, 3), Config(32, 256, 8, 4)])
def test_every_launch_shape_covers_every_output(config):
    """Blocks that do not divide N or K: every column is computed once and none is left unwritten
    (the output starts as uninitialised memory)."""
    x, w, b = operands(5, 70, 200, torch.float32, seed=1)
    for rows in (1, 5):
        out = skinny_gemm(x[:rows], w, b, config=config)
        torch.testing.assert_close(out, skinny_gemm_ref(x[:rows], w, b), rtol=1e-5, atol=1e-5)


def test_skinny_gemm_keeps_leading_dims_and_reads_strided_rows():
    x, w, b = operands(6, 48, 128, torch.float32, seed=2)
    wide = torch.zeros(6, 256)
    wide[:, :128] = x
    strided = wide[:, :128]  # rows 256 apart
    torch.testing.assert_close(skinny_gemm(strided, w, b), skinny_gemm_ref(x, w, b), rtol=1e-5, atol=1e-5)
    batched = x.view(2, 3, 128)
    assert skinny_gemm(batched, w, b).shape == (2, 3, 48)
    assert skinny_gemm(x[:0], w, b).shape == (0, 48)


def test_skinny_gemm_rejects_what_it_cannot_compute():
    x, w, b = operands(MAX_ROWS + 1, 32, 64, torch.float32)
    with pytest.raises(ValueError, match="at most 16 rows"):
        skinny_gemm(x, w)
    with pytest.raises(ValueError, match="last dimension is 64, the weight's K is 32"):
        skinny_gemm(x[:2], w[:, :32].contiguous().t().contiguous())
    with pytest.raises(ValueError, match="bias must be"):
        skinny_gemm(x[:2], w, b[:5])
    with pytest.raises(ValueError, match="is torch.float32 but the weight is torch.bfloat16"):
        skinny_gemm(x[:2], w.bfloat16())
    with pytest.raises(ValueError, match="contiguous last dimension"):
        skinny_gemm(x[:2], w.t().contiguous().t())


def test_the_models_decode_the_same_tokens_through_the_skinny_kernel(tiny_model_paths, tmp_path, monkeypatch, device):
    """A tiny random Llama and an EAGLE-3 draft for it, with every product of at most 16 rows
    routed through the kernel (as CUDA decode steps at small batch are; here under the
    interpreter, in float32) against torch's: the prompts' prefill, the target's verify and the
    draft's steps all go through it, and the logits (lm_head) too, so a wrong column anywhere
    changes the greedy tokens."""
    from sglang.srt.layers import linear
    from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.server_args import ServerArgs
    from sglang.test.runner_utils import run_to_completion
    from sglang.test.tiny_models import make_tiny_eagle3_draft

    target = tiny_model_paths["llama"]
    draft = make_tiny_eagle3_draft(str(tmp_path / "draft"), target, draft_vocab_size=200)
    routed = []

    def route(x, weight):
        skinny = x.numel() <= MAX_ROWS * x.shape[-1]
        routed.append(skinny)
        return skinny

    outputs = {}
    for skinny in (False, True):
        monkeypatch.setattr(linear, "uses_skinny_gemm", route if skinny else (lambda x, weight: False))
        scheduler = Scheduler(
            ServerArgs(
                model_path=target,
                dtype="float32",
                device=device,
                disable_overlap_schedule=True,
                disable_cuda_graph=True,
                max_total_tokens=512,
                speculative_algorithm="EAGLE3",
                speculative_draft_model_path=draft,
                speculative_num_steps=2,
            )
        )
        # r1 decodes alone once r0 is done: products of one row as well as of several.
        for i, (ids, max_new) in enumerate([([5, 17, 300, 41, 9, 77], 4), ([12, 13, 14, 15, 16, 17, 18, 19, 20], 12)]):
            params = SamplingParams(max_new_tokens=max_new, temperature=0, ignore_eos=True)
            scheduler.add_request(TokenizedGenerateReqInput(f"r{i}", ids, params, stream=False))
        outputs[skinny] = {rid: out["ids"] for rid, out in run_to_completion(scheduler).items()}
    assert outputs[True] == outputs[False]
    assert [len(outputs[True][rid]) for rid in ("r0", "r1")] == [4, 12]
    assert sum(routed) > 20
