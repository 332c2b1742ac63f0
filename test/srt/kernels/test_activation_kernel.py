"""sgl_kernel/activation.py against its torch reference (interpreter on CPU)."""

import pytest
import torch

from sgl_kernel.activation import silu_and_mul, silu_and_mul_ref
from sgl_kernel.testing import TOLERANCE, relative_error


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_silu_and_mul_matches_reference(dtype, device):
    # d = 1100 spans two 1024-wide column blocks, the second one masked.
    x = (3 * torch.randn(3, 2 * 1100, generator=torch.Generator().manual_seed(0))).to(dtype).to(device)
    out = silu_and_mul(x)
    assert out.shape == (3, 1100) and out.dtype == dtype
    assert relative_error(out, silu_and_mul_ref(x)) < TOLERANCE[dtype]
