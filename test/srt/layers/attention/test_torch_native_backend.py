"""The torch_native backend serves every forward mode: a prefix extend followed by DECODE,
TARGET_VERIFY or DRAFT_EXTEND over the cached prefix gives the logits of one full prefill,
for a batch of requests with different prefix lengths."""

import pytest
import torch

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.server_args import ServerArgs

ATOL = 1e-4


@pytest.fixture(scope="module")
def runner(tiny_model_paths):
    path = tiny_model_paths["qwen3"]
    args = ServerArgs(model_path=path, dtype="float32", device="cpu", max_total_tokens=2048)
    return ModelRunner(ModelConfig.from_path(path, dtype="float32", device="cpu"), args)


def forward(runner, mode, requests, rows, starts, return_all_logits=True):
    """One forward over `requests` (token lists), each continuing its row from `starts[i]`."""
    ids, positions, slots, new_lens, seq_lens = [], [], [], [], []
    for tokens, row, start in zip(requests, rows, starts):
        new = runner.token_to_kv_pool_allocator.alloc(len(tokens))
        runner.req_to_token_pool.write(row, start, new)
        ids += tokens
        positions += range(start, start + len(tokens))
        slots.append(new)
        new_lens.append(len(tokens))
        seq_lens.append(start + len(tokens))
    batch = ForwardBatch(
        forward_mode=mode,
        batch_size=len(requests),
        input_ids=torch.tensor(ids),
        positions=torch.tensor(positions),
        req_pool_indices=torch.tensor(rows),
        seq_lens=torch.tensor(seq_lens),
        out_cache_loc=torch.cat(slots),
        seq_lens_cpu=seq_lens,
        extend_seq_lens_cpu=new_lens,
        extend_prefix_lens_cpu=list(starts),
        return_all_logits=return_all_logits,
    )
    return runner.forward(batch).next_token_logits


def full_prefill_logits(runner, tokens):
    row = runner.req_to_token_pool.alloc()
    try:
        return forward(runner, ForwardMode.EXTEND, [tokens], [row], [0])
    finally:
        runner.req_to_token_pool.free(row)


@pytest.mark.parametrize(
    "mode, new_tokens",
    [
        (ForwardMode.DECODE, 1),
        (ForwardMode.TARGET_VERIFY, 4),
        (ForwardMode.DRAFT_EXTEND, 3),
    ],
)
def test_mode_over_cached_prefix_matches_full_prefill(runner, mode, new_tokens):
    sequences = [list(range(3, 3 + 17)), list(range(40, 40 + 9)), list(range(100, 100 + 30))]
    rows = [runner.req_to_token_pool.alloc() for _ in sequences]
    prefixes = [seq[: len(seq) - new_tokens] for seq in sequences]
    forward(runner, ForwardMode.EXTEND, prefixes, rows, [0] * len(rows), return_all_logits=False)
    tails = [seq[len(seq) - new_tokens :] for seq in sequences]
    logits = forward(runner, mode, tails, rows, [len(p) for p in prefixes])
    assert logits.shape[0] == new_tokens * len(sequences)
    for i, seq in enumerate(sequences):
        expected = full_prefill_logits(runner, seq)[-new_tokens:]
        torch.testing.assert_close(logits[i * new_tokens : (i + 1) * new_tokens], expected, atol=ATOL, rtol=0)
    for row in rows:
        runner.req_to_token_pool.free(row)
