"""sgl_kernel/decode_attention.py against its torch reference (tiny shapes: interpreter on CPU)."""

import pytest
import torch

from sgl_kernel.decode_attention import decode_attention_fwd, decode_attention_ref, decode_workspace
from sgl_kernel.testing import TOLERANCE, make_paged_kv, relative_error

NUM_KV_HEADS = 2


def run_both(seq_lens, group, head_dim, dtype, num_kv_splits, device, workspace=None):
    kv = make_paged_kv(seq_lens, NUM_KV_HEADS, head_dim, dtype, device)
    q = torch.randn(len(seq_lens), NUM_KV_HEADS * group, head_dim, generator=torch.Generator().manual_seed(1))
    q = q.to(dtype).to(device)
    args = (kv.k_buffer, kv.v_buffer)
    index = (kv.req_to_token, kv.req_pool_indices, kv.seq_lens, head_dim**-0.5, num_kv_splits)
    out = decode_attention_fwd(q, *args, torch.empty_like(q), *index, workspace=workspace)
    want = decode_attention_ref(q, *args, torch.empty_like(q), *index)
    return out, want


@pytest.mark.parametrize(
    "dtype, group, head_dim, num_kv_splits",
    [
        (torch.float32, 1, 32, 4),
        (torch.float32, 4, 16, 1),
        (torch.float32, 8, 16, 3),
        (torch.float32, 3, 16, 2),
        (torch.bfloat16, 4, 32, 4),
        (torch.bfloat16, 1, 16, 2),
        (torch.float16, 2, 32, 4),
    ],
)
def test_decode_matches_reference_on_ragged_batch(dtype, group, head_dim, num_kv_splits, device):
    # 64 and 65 straddle the kernel's 64-position block.
    out, want = run_both([1, 70, 17, 64, 65], group, head_dim, dtype, num_kv_splits, device)
    assert relative_error(out, want) < TOLERANCE[dtype]


def test_splits_beyond_the_sequence_contribute_nothing(device):
    # 16 splits for at most 5 positions: most splits are empty and never write their part of
    # the workspace, which holds NaN from "an earlier step".
    workspace = decode_workspace(3, 4, 16, 16, device).fill_(float("nan"))
    out, want = run_both([1, 2, 5], 2, 16, torch.float32, 16, device, workspace=workspace)
    assert relative_error(out, want) < TOLERANCE[torch.float32]


def test_padded_request_of_length_zero_gets_zeros(device):
    out, want = run_both([0, 5], 2, 16, torch.float32, 2, device)
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    assert relative_error(out[1], want[1]) < TOLERANCE[torch.float32]


def test_rejects_head_dim_that_is_not_a_power_of_two(device):
    with pytest.raises(ValueError, match="power of two"):
        run_both([3], 1, 24, torch.float32, 1, device)
