"""sgl_kernel/norm.py against its torch references (interpreter on CPU)."""

import pytest
import torch

from sgl_kernel.norm import fused_add_rmsnorm, fused_add_rmsnorm_ref, rmsnorm, rmsnorm_ref
from sgl_kernel.testing import TOLERANCE, relative_error

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
HIDDEN = 200  # not a power of two: the row block is masked


def random(*shape, dtype, device, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype).to(device)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rmsnorm_matches_reference(dtype, device):
    x = random(5, HIDDEN, dtype=dtype, device=device, seed=0)
    weight = 1 + 0.1 * random(HIDDEN, dtype=dtype, device=device, seed=1)
    assert relative_error(rmsnorm(x, weight, 1e-6), rmsnorm_ref(x, weight, 1e-6)) < TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_add_rmsnorm_updates_x_and_residual_in_place(dtype, device):
    x = random(5, HIDDEN, dtype=dtype, device=device, seed=0)
    residual = random(5, HIDDEN, dtype=dtype, device=device, seed=1)
    weight = 1 + 0.1 * random(HIDDEN, dtype=dtype, device=device, seed=2)
    want_x, want_residual = x.clone(), residual.clone()
    fused_add_rmsnorm_ref(want_x, want_residual, weight, 1e-5)
    fused_add_rmsnorm(x, residual, weight, 1e-5)
    assert relative_error(residual, want_residual) < TOLERANCE[dtype]
    assert relative_error(x, want_x) < TOLERANCE[dtype]


def test_rmsnorm_reads_strided_rows(device):
    wide = random(4, 2 * HIDDEN, dtype=torch.float32, device=device, seed=0)
    x = wide[:, :HIDDEN]  # rows HIDDEN apart in memory, as a slice of a fused projection
    weight = random(HIDDEN, dtype=torch.float32, device=device, seed=1)
    assert relative_error(rmsnorm(x, weight, 1e-6), rmsnorm_ref(x, weight, 1e-6)) < TOLERANCE[torch.float32]
