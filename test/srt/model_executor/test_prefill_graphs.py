"""Prefill CUDA graphs, on the CPU: a stand-in for capture re-runs the captured forward on the
runner's static buffers at each replay, so the layout handling (request and token buckets, the
padding that joins the last request, prefixes, the per-replay layout copy, logits at each
request's last real token, aux states of the real tokens) must reproduce the eager forward
exactly, for any mix of requests. Which graphs are kept is decided by timing each replay
against an eager launch; that rule is checked with stand-in timings."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
from sglang.srt.model_executor import cuda_graph_runner
from sglang.srt.model_executor.cuda_graph_runner import PrefillGraphRunner, prefill_token_buckets
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.server_args import ServerArgs
from sglang.test.runner_utils import fake_capture_graph, make_cpu_runner


def _captured_runner(model_path: str, backend: str):
    model_runner = make_cpu_runner(model_path, max_total_tokens=4096)
    model_runner.model.set_eagle3_layers_to_capture([0, 2, 1])
    if backend == "triton":
        model_runner.attn_backend = TritonAttnBackend(model_runner)
    prefill = PrefillGraphRunner(model_runner, ForwardMode.EXTEND, max_tokens=64, capture_aux=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cuda_graph_runner, "capture_graph", fake_capture_graph)
        patch.setattr(ModelRunner, "graph_memory_pool", lambda self: None)
        prefill.capture()
    return model_runner, prefill


@pytest.fixture
def runner(tiny_model_paths):
    """A fresh runner on the reference backend, which reads the layout from its host copy."""
    return _captured_runner(tiny_model_paths["llama"], "torch_native")


@pytest.fixture(scope="module")
def triton_runner(tiny_model_paths):
    """The triton backend (run by Triton's interpreter here) reads the layout from the device
    tensors. Captured once for the module: under the interpreter each capture is a forward, and
    its replays then also start from what earlier tests left in the static buffers."""
    return _captured_runner(tiny_model_paths["llama"], "triton")


def make_batch(
    model_runner, layout: list[tuple[int, int]], seed: int, aux: bool = True, host_rows: bool = False
) -> ForwardBatch:
    """Requests with (cached prefix, new tokens) each, in fresh table rows and KV slots; the
    prefix KV is random (both paths read the same). `host_rows`: the batch also carries host
    copies of its token rows and table rows, as a scheduler's prefill does (the graph stages
    those; without them it copies the device tensors)."""
    gen = torch.Generator().manual_seed(seed)
    rows, ids, positions, slots, seq_lens = [], [], [], [], []
    pool = model_runner.token_to_kv_pool
    for prefix, new in layout:
        row = model_runner.req_to_token_pool.alloc()
        row_slots = model_runner.token_to_kv_pool_allocator.alloc(prefix + new)
        model_runner.req_to_token_pool.write(row, 0, row_slots)
        for layer in range(model_runner.model_config.num_hidden_layers):
            for buffer in (pool.get_key_buffer(layer), pool.get_value_buffer(layer)):
                buffer[row_slots[:prefix]] = torch.randn(buffer[row_slots[:prefix]].shape, generator=gen)
        rows.append(row)
        ids += torch.randint(1, 300, (new,), generator=gen).tolist()
        positions += range(prefix, prefix + new)
        slots.append(row_slots[prefix:])
        seq_lens.append(prefix + new)
    fb = ForwardBatch(
        forward_mode=ForwardMode.EXTEND,
        batch_size=len(layout),
        input_ids=torch.tensor(ids),
        positions=torch.tensor(positions),
        req_pool_indices=torch.tensor(rows),
        seq_lens=torch.tensor(seq_lens),
        out_cache_loc=torch.cat(slots),
        seq_lens_cpu=seq_lens,
        extend_seq_lens_cpu=[new for _, new in layout],
        extend_prefix_lens_cpu=[prefix for prefix, _ in layout],
        capture_aux_hidden_states=aux,
    )
    if host_rows:
        fb.input_ids_host, fb.positions_host, fb.req_pool_indices_host = ids, positions, rows
        fb.out_cache_loc_host = fb.out_cache_loc.numpy()
    return fb


LAYOUTS = {
    "one request, padded": [(0, 5)],
    "one request, on a bucket": [(0, 16)],
    "one request after a cached prefix": [(7, 9)],
    "three requests, padded to four": [(0, 3), (4, 10), (0, 1)],
    "two long requests": [(2, 20), (0, 30)],
    "five requests, padded to eight": [(0, 4), (1, 2), (0, 9), (3, 3), (0, 6)],
    "eleven requests, padded to sixteen": [(i % 3, 1 + i % 4) for i in range(11)],
    "the largest graph": [(0, 60), (5, 4)],
}


@pytest.mark.parametrize("backend", ["torch_native", "triton"])
@pytest.mark.parametrize("name", LAYOUTS)
@pytest.mark.parametrize("host_rows", [False, True], ids=["device rows", "host rows"])
def test_replay_gives_the_eager_forward(request, backend, name, host_rows):
    model_runner, prefill = request.getfixturevalue("runner" if backend == "torch_native" else "triton_runner")
    batch = make_batch(model_runner, LAYOUTS[name], seed=len(name), host_rows=host_rows)
    assert prefill.can_run(batch)
    eager = model_runner.forward_eager(batch)
    kv = model_runner.token_to_kv_pool.get_key_buffer(1)[batch.out_cache_loc].clone()
    model_runner.token_to_kv_pool.get_key_buffer(1)[batch.out_cache_loc] = 0
    graphed = prefill.replay(batch)
    assert graphed.next_token_logits.shape == eager.next_token_logits.shape == (batch.batch_size, 384)
    torch.testing.assert_close(graphed.next_token_logits, eager.next_token_logits, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(graphed.aux_hidden_states, eager.aux_hidden_states, rtol=1e-4, atol=1e-5)
    # The real tokens' KV is written where the eager forward writes it.
    torch.testing.assert_close(model_runner.token_to_kv_pool.get_key_buffer(1)[batch.out_cache_loc], kv)


def test_one_runner_serves_batches_without_aux_and_a_padded_replay_after_a_larger_one(runner):
    model_runner, prefill = runner
    large = make_batch(model_runner, [(0, 30), (0, 14)], seed=1)
    prefill.replay(large)  # leaves its tokens in the static buffers past the next batch's end
    small = make_batch(model_runner, [(3, 11)], seed=2, aux=False)
    assert prefill.can_run(small)
    graphed = prefill.replay(small)
    assert graphed.aux_hidden_states is None
    torch.testing.assert_close(
        graphed.next_token_logits, model_runner.forward_eager(small).next_token_logits, rtol=1e-4, atol=1e-5
    )


def test_batches_no_graph_fits_run_eagerly(runner):
    model_runner, prefill = runner
    assert not prefill.can_run(make_batch(model_runner, [(0, 65)], seed=3))  # more tokens than any graph
    assert not prefill.can_run(make_batch(model_runner, [(0, 2)] * 17, seed=4))  # more requests than any graph
    # Past every graph, with no eager launch measured faster (nothing dropped): the scheduler does
    # not grow a pass there (PrefillAdder.pass_fits).
    assert prefill.pass_fits(1, 64) and prefill.pass_fits(16, 64)
    assert not prefill.pass_fits(1, 65) and not prefill.pass_fits(17, 34)
    model_runner.graph_runners.append(prefill)
    assert model_runner.prefill_pass_fits(2, 64) and model_runner.prefill_pass_fits(2, 65) is False
    model_runner.graph_runners.remove(prefill)
    assert model_runner.prefill_pass_fits(2, 64) is None, "without prefill graphs nothing is capped"
    every_logit = make_batch(model_runner, [(0, 5)], seed=5)
    every_logit.return_all_logits = True
    assert not prefill.can_run(every_logit)
    decode = make_batch(model_runner, [(4, 1)], seed=6)
    decode.forward_mode = ForwardMode.DECODE
    assert not prefill.can_run(decode)
    # The padding joins the last request: past the end of its table row there is no room for it.
    width = prefill.row_width
    near_end = make_batch(model_runner, [(width - 20, 17)], seed=7)
    assert not prefill.can_run(near_end)  # 17 tokens pad to 24, and the row ends 3 tokens later
    assert prefill.can_run(make_batch(model_runner, [(width - 24, 17)], seed=8))


def test_a_pass_scoring_prompt_tokens_runs_eagerly_and_scores_every_row(runner):
    model_runner, prefill = runner
    batch = make_batch(model_runner, [(0, 6), (3, 5)], seed=9, aux=False)
    every = model_runner.forward_eager(dataclasses.replace(batch, return_all_logits=True)).next_token_logits
    batch.input_logprob_rows = torch.tensor([0, 1, 2, 3, 4, 7, 8])
    batch.input_logprob_targets = batch.input_ids[[1, 2, 3, 4, 5, 8, 9]]
    batch.input_top_logprobs_num = 2
    assert prefill.can_run(make_batch(model_runner, [(0, 6), (3, 5)], seed=9, aux=False))
    assert not prefill.can_run(batch), "a graph keeps no hidden rows but the last ones"
    model_runner.graph_runners.append(prefill)
    try:
        out = model_runner.forward(batch)
    finally:
        model_runner.graph_runners.remove(prefill)
    expected = torch.log_softmax(every[batch.input_logprob_rows], dim=-1)
    torch.testing.assert_close(
        out.input_token_logprobs, expected.gather(1, batch.input_logprob_targets[:, None]).squeeze(1)
    )
    torch.testing.assert_close(out.input_top_logprobs, expected.topk(2, dim=-1).values)
    torch.testing.assert_close(out.next_token_logits, every[[5, 10]])


def test_graphs_slower_than_an_eager_launch_are_dropped_with_every_larger_one(runner, monkeypatch):
    """Stand-in timings on a stand-in clock: a replay takes 50 us per token, an eager launch
    2 ms, so graphs above 40 tokens lose; 48 and 64 are dropped in every requests bucket, and a
    batch of 44 tokens then runs eagerly."""
    model_runner, prefill = runner
    now = [0.0]

    class TimedGraph:
        def __init__(self, tokens):
            self.tokens = tokens

        def replay(self):
            now[0] += 50e-6 * self.tokens

    def eager_launch(fb):
        now[0] += 2e-3

    for bs, n in prefill.graphs:
        prefill.graphs[bs, n] = TimedGraph(n)
    monkeypatch.setattr(cuda_graph_runner, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(model_runner, "forward_eager", eager_launch)
    prefill._drop_slower_than_eager()
    assert prefill.kept == {bs: [16, 24, 32] for bs in (1, 2, 4, 8, 16)}
    assert set(prefill.graphs) == {(bs, n) for bs in (1, 2, 4, 8, 16) for n in (16, 24, 32)}
    assert prefill.timings[1, 48] == pytest.approx((2.4e-3, 2e-3))
    assert not prefill.can_run(make_batch(model_runner, [(0, 44)], seed=9))
    assert prefill.can_run(make_batch(model_runner, [(0, 30)], seed=10))
    # What the scheduler asks before it puts another request in a pass (PrefillAdder.pass_fits).
    # Where eager launches won (48 tokens on), a pass may grow past the graphs: it costs no more.
    assert prefill.pass_fits(1, 30) and prefill.pass_fits(1, 44) and prefill.pass_fits(1, 200)
    assert prefill.pass_fits(17, 20), "the largest requests bucket had its graphs beaten too"
    prefill.eager_from.pop(16)
    assert not prefill.pass_fits(17, 20) and not prefill.pass_fits(16, 200) and prefill.pass_fits(8, 200)


def test_token_buckets_pad_at_most_half():
    assert prefill_token_buckets(512) == [16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512]
    assert prefill_token_buckets(100) == [16, 24, 32, 48, 64, 96, 100]
    assert prefill_token_buckets(8) == [8]
    for lower, upper in zip(prefill_token_buckets(4096), prefill_token_buckets(4096)[1:]):
        assert upper <= 1.5 * lower


def test_the_flag_is_checked_and_documented():
    with pytest.raises(ValueError, match="--prefill-cuda-graph-max-tokens must be >= 0"):
        ServerArgs(prefill_cuda_graph_max_tokens=-1)
    parser = __import__("argparse").ArgumentParser()
    ServerArgs.add_cli_args(parser)
    assert "--prefill-cuda-graph-max-tokens" in parser.format_help()
    assert (
        ServerArgs.from_cli_args(
            parser.parse_args(["--prefill-cuda-graph-max-tokens", "0"])
        ).prefill_cuda_graph_max_tokens
        == 0
    )
