"""sgl_kernel/extend_attention.py against its torch reference (tiny shapes: interpreter on CPU)."""

import pytest
import torch

from sgl_kernel.extend_attention import extend_attention_fwd, extend_attention_ref
from sgl_kernel.testing import TOLERANCE, make_paged_kv, relative_error

NUM_KV_HEADS = 2
PADDING_TOKENS = 2  # trailing rows of q/o that belong to no request (CUDA-graph padding)


def run_both(prefix_lens, extend_lens, group, head_dim, dtype, device):
    seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens)]
    kv = make_paged_kv(seq_lens, NUM_KV_HEADS, head_dim, dtype, device)
    num_tokens = sum(extend_lens) + PADDING_TOKENS
    q = torch.randn(num_tokens, NUM_KV_HEADS * group, head_dim, generator=torch.Generator().manual_seed(1))
    q = q.to(dtype).to(device)
    extend_seq_lens = torch.tensor(extend_lens, device=device)
    extend_start_loc = torch.cumsum(extend_seq_lens, 0) - extend_seq_lens
    args = (
        kv.k_buffer,
        kv.v_buffer,
        kv.req_to_token,
        kv.req_pool_indices,
        kv.seq_lens,
        extend_seq_lens,
        extend_start_loc,
        max(extend_lens),
        head_dim**-0.5,
    )
    out = extend_attention_fwd(q, torch.full_like(q, 7.0), *args)
    want = extend_attention_ref(q, torch.full_like(q, 7.0), *args)
    return out, want


@pytest.mark.parametrize(
    "dtype, group, head_dim",
    [
        (torch.float32, 1, 32),
        (torch.float32, 4, 16),
        (torch.float32, 3, 16),
        (torch.bfloat16, 8, 32),
        (torch.float16, 2, 16),
    ],
)
def test_extend_matches_reference_over_cached_prefixes(dtype, group, head_dim, device):
    # group 3 leaves rows of each (tokens x heads) tile empty; group 8 tiles 8 tokens at a time.
    # A 70-token prefill with no prefix (two query blocks), a 5-token extend after 60 cached
    # positions, a first token alone, one token after 39 cached, and 4 after 3.
    out, want = run_both([0, 60, 0, 39, 3], [70, 5, 1, 1, 4], group, head_dim, dtype, device)
    assert relative_error(out, want) < TOLERANCE[dtype]


def test_target_verify_shape_and_padding_rows_untouched(device):
    # TARGET_VERIFY: k + 1 = 4 causal tokens per request after its cached prefix.
    out, want = run_both([10, 33, 1], [4, 4, 4], 4, 16, torch.float32, device)
    assert relative_error(out, want) < TOLERANCE[torch.float32]
    assert torch.all(out[-PADDING_TOKENS:] == 7.0)
