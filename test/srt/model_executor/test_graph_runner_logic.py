"""The CUDA graph runners' bookkeeping, on the CPU: a stand-in for graph capture re-runs the
captured forward on the runner's static buffers at every replay, so everything around the graph
(bucket choice, padding rows, copying inputs into the static buffers, the hidden-state input of
the draft's graphs, slicing logits / aux / hidden outputs, the extend-shaped modes' per-row
logits) is exercised without a GPU. Plain and speculative decoding (with every shape it
captures: verify, draft chain step, draft extend, the plain step, whole steps) must give the
eager output, batch sizes on and between buckets."""

from __future__ import annotations

import pytest
import torch

from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.model_executor import cuda_graph_runner
from sglang.srt.model_executor.cuda_graph_runner import CudaGraphRunner, PrefillGraphRunner
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs
from sglang.srt.speculative import eagle_cuda_graphs
from sglang.test.runner_utils import fake_cuda_graphs, run_to_completion

BUCKETS = [1, 2, 4, 8]
# Prefill graphs up to 64 tokens hold every prefill here (at most 43 prompt tokens in one pass);
# capturing the default 2048-token range re-runs ~150 forwards of up to 2048 tokens per server.
PREFILL_GRAPH_TOKENS = 64
# The requests hold under 200 tokens of KV: a pool of 4096 (the CPU default, 65536, takes ~2 s to
# allocate per scheduler on the demo pair).
MAX_TOTAL_TOKENS = 4096


@pytest.fixture
def rerun_graphs(monkeypatch):
    replays = []
    fake_cuda_graphs(monkeypatch.setattr, BUCKETS)
    prefill_replay = PrefillGraphRunner.replay

    def counted_prefill(self, fb):
        replays.append(("PREFILL_" + self.forward_mode.name, fb.num_tokens, fb.batch_size))
        return prefill_replay(self, fb)

    monkeypatch.setattr(PrefillGraphRunner, "replay", counted_prefill)
    step_replay = eagle_cuda_graphs.SpecStepGraphs.replay

    def counted_step(self, rows, out_cache_loc, behind=None, opted_out=None):
        replays.append(("STEP" if self.draft else "TARGET_STEP", self.width, len(rows)))
        return step_replay(self, rows, out_cache_loc, behind, opted_out)

    monkeypatch.setattr(eagle_cuda_graphs.SpecStepGraphs, "replay", counted_step)
    original = CudaGraphRunner.replay

    def counted(self, fb):
        replays.append((self.forward_mode.name, self.tokens_per_req, fb.batch_size))
        return original(self, fb)

    monkeypatch.setattr(CudaGraphRunner, "replay", counted)
    return replays


def generate(
    spec: bool,
    choose=None,
    num_reqs: int = 3,
    step_graph: bool = False,
    sampled: bool = False,
    without_draft: tuple = (),
    overlap: bool = False,
    **spec_kwargs,
) -> dict:
    """`without_draft`: rids admitted as if speculation did not pay (the draft skips them).
    `overlap`: each decode step is launched from the tokens the last one left on the device."""
    kwargs = (
        dict(
            speculative_algorithm="EAGLE3",
            speculative_num_steps=3,
            disable_speculative_step_graph=not step_graph,
            **spec_kwargs,
        )
        if spec
        else {}
    )
    scheduler = Scheduler(
        ServerArgs(
            dtype="float32",
            device="cpu",
            disable_overlap_schedule=not overlap,
            prefill_cuda_graph_max_tokens=PREFILL_GRAPH_TOKENS,
            max_total_tokens=MAX_TOTAL_TOKENS,
            **kwargs,
        )
    )
    if without_draft:
        scheduler.spec.draft_reads_prompt = lambda req, joining: req.rid not in without_draft
    if choose is not None:
        steps = []
        scheduler.spec.plan_step = lambda reqs: steps.append(choose(len(steps))) or steps[-1]
    prompts = [[5, 17, 300, 41, 9, 77], [12, 13, 14, 15], list(range(100, 130)), [2000, 7, 7]][:num_reqs]
    for i, ids in enumerate(prompts):
        params = SamplingParams(
            max_new_tokens=[9, 30, 22, 5][i], temperature=0.7 if sampled else 0, ignore_eos=True, sampling_seed=i
        )
        scheduler.add_request(TokenizedGenerateReqInput(f"r{i}", ids, params, stream=False))
    return {rid: out["ids"] for rid, out in run_to_completion(scheduler).items()}


def decode_shapes(replays: list) -> list:
    return [shape for shape in replays if not shape[0].startswith("PREFILL")]


@pytest.fixture(scope="module")
def eager_outputs():
    return {"plain": generate(False), "spec": generate(True)}


@pytest.mark.parametrize("overlap", [False, True], ids=["token ids from the host", "token ids on the device"])
def test_plain_decode_graphs_replay_like_eager(rerun_graphs, eager_outputs, overlap):
    assert generate(False, overlap=overlap) == eager_outputs["plain"]
    assert {shape[:2] for shape in decode_shapes(rerun_graphs)} == {("DECODE", 1)}
    assert ("PREFILL_EXTEND", 40, 3) in rerun_graphs  # the three prompts, padded to 4 requests, 48 tokens
    assert {bs for _, _, bs in rerun_graphs} >= {3, 2, 1}  # 3 runs padded to the bucket of 4


def test_speculative_graphs_replay_like_eager(rerun_graphs, eager_outputs):
    assert generate(True) == eager_outputs["plain"] == eager_outputs["spec"]
    assert ("PREFILL_EXTEND", 40, 3) in rerun_graphs and ("PREFILL_DRAFT_EXTEND", 40, 3) in rerun_graphs
    shapes = {shape[:2] for shape in decode_shapes(rerun_graphs)}
    assert shapes == {("TARGET_VERIFY", 4), ("DECODE", 1), ("DRAFT_EXTEND", 4)}


def test_whole_step_graphs_replay_like_eager(rerun_graphs, eager_outputs):
    assert generate(True, step_graph=True) == eager_outputs["plain"]
    shapes = {shape[:2] for shape in rerun_graphs}
    assert ("STEP", 4) in shapes and ("TARGET_VERIFY", 4) not in shapes  # verify ran inside the step graph
    assert {bs for kind, _, bs in rerun_graphs if kind == "STEP"} >= {3, 2}  # 3 padded to the bucket of 4


def test_whole_step_graphs_serve_batches_with_requests_the_draft_does_not_follow(rerun_graphs, eager_outputs):
    """r1 (and r2) are admitted without the draft: the speculative steps they share still replay
    the whole-step graph (they take plain decoding's token through its row mask); plain steps of
    a batch the draft follows not at all (r1 alone at the end) replay the target-only step graph."""
    assert (
        generate(True, choose=lambda i: 3 * (i % 2), step_graph=True, without_draft=("r1", "r2"))
        == eager_outputs["plain"]
    )
    assert ("STEP", 4) in {shape[:2] for shape in rerun_graphs}
    assert ("TARGET_STEP", 1, 1) in rerun_graphs  # r1's last plain steps (r0 and r2 are done)
    assert ("STEP", 1, 1) not in rerun_graphs  # the plain step with the draft: never for r1 alone


def test_sampled_steps_skip_the_whole_step_graph(rerun_graphs):
    eager = generate(True, sampled=True)
    rerun_graphs.clear()
    assert generate(True, step_graph=True, sampled=True) == eager  # seeded: the same samples
    kinds = {kind for kind, _, _ in rerun_graphs}
    assert "STEP" not in kinds and "TARGET_VERIFY" in kinds


def test_every_batch_size_of_a_runner_writes_into_one_set_of_outputs(rerun_graphs, eager_outputs):
    """A graph's outputs stay allocated as long as the graph: one set per runner, not one per
    batch size (on an 8B-shaped EAGLE-3 server the per-size float32 logits took about 11 GB).
    The tokens stay plain decoding's."""
    scheduler = Scheduler(
        ServerArgs(
            dtype="float32",
            device="cpu",
            speculative_algorithm="EAGLE3",
            speculative_num_steps=3,
            prefill_cuda_graph_max_tokens=PREFILL_GRAPH_TOKENS,
            max_total_tokens=MAX_TOTAL_TOKENS,
        )
    )
    worker = scheduler.tp_worker
    runners = [r for runner in (worker.model_runner, worker.draft_runner) for r in runner.graph_runners]
    decode = [r for r in runners if isinstance(r, CudaGraphRunner)]
    assert {(r.forward_mode.name, r.tokens_per_req) for r in decode} >= {
        ("TARGET_VERIFY", 4),
        ("DECODE", 1),
        ("DRAFT_EXTEND", 4),
    }
    assert {r.forward_mode.name for r in runners if isinstance(r, PrefillGraphRunner)} == {"EXTEND", "DRAFT_EXTEND"}
    for runner in runners:
        if isinstance(runner, CudaGraphRunner):
            assert set(runner.outputs) == set(BUCKETS)
            assert runner.logits_out.shape[0] == max(BUCKETS) * runner.tokens_per_req
        else:
            assert len(runner.outputs) > 10 and runner.logits_out.shape[0] == runner.max_reqs
        shared = runner.logits_out.untyped_storage().data_ptr()
        for bs, out in runner.outputs.items():
            assert out.next_token_logits.untyped_storage().data_ptr() == shared, (runner.forward_mode, bs)
            if out.aux_hidden_states is not None:
                assert (
                    out.aux_hidden_states.untyped_storage().data_ptr()
                    == runner.aux_hidden_out.untyped_storage().data_ptr()
                )
    assert any(r.aux_hidden_out is not None for r in runners)  # the verify's aux states for the draft
    assert generate(True) == eager_outputs["plain"]


def test_plain_steps_of_the_speculative_worker_replay_their_graphs(rerun_graphs, eager_outputs):
    assert generate(True, choose=lambda i: 3 * (i % 2)) == eager_outputs["plain"]
    shapes = {shape[:2] for shape in rerun_graphs}
    assert {("DECODE", 1), ("DRAFT_EXTEND", 1), ("TARGET_VERIFY", 4), ("DRAFT_EXTEND", 4)} <= shapes


def test_every_k_the_policy_can_reach_has_its_graphs(rerun_graphs, eager_outputs):
    """With candidates 0, 1 and 3, steps of k = 1 and k = 3 replay whole-step graphs of their
    own width and plain steps the plain step's whole-step graph (width 1); the output stays
    plain decoding's. Without whole-step graphs, each forward replays its own graph."""
    choose = lambda i: [0, 1, 3][i % 3]  # noqa: E731
    spec = dict(speculative_policy="cost", speculative_candidate_steps=[0, 1, 3])
    for sync in ("warm", "catch-up"):
        rerun_graphs.clear()
        assert (
            generate(True, choose=choose, step_graph=True, speculative_draft_sync=sync, **spec)
            == eager_outputs["plain"]
        ), sync
        shapes = {shape[:2] for shape in rerun_graphs}
        assert {("STEP", 1), ("STEP", 2), ("STEP", 4)} <= shapes, sync
    rerun_graphs.clear()
    assert generate(True, choose=choose, **spec) == eager_outputs["plain"]  # graph per forward
    shapes = {shape[:2] for shape in rerun_graphs}
    assert {("TARGET_VERIFY", 2), ("TARGET_VERIFY", 4), ("DRAFT_EXTEND", 2), ("DRAFT_EXTEND", 4)} <= shapes


def test_capture_runs_twice_then_captures_with_the_garbage_collector_held_off(monkeypatch):
    """A garbage collection inside a capture can free another engine's CUDA state and so
    invalidate the capture (torch no longer collects before one): the forward is run twice
    outside the graph, captured once with the collector off, and the collector is on again after,
    also when the capture fails."""
    import contextlib
    import gc

    captured = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: "graph")

    @contextlib.contextmanager
    def graph(g, pool=None):
        captured.append(("capture", g, pool))
        yield

    monkeypatch.setattr(torch.cuda, "graph", graph)
    calls = []
    assert gc.isenabled()
    got = cuda_graph_runner.capture_graph(lambda: calls.append(gc.isenabled()) or len(calls), pool="pool")
    assert got == ("graph", 3) and calls == [True, True, False]
    assert captured == [("capture", "graph", "pool")] and gc.isenabled()

    def failing():
        calls.append(gc.isenabled())
        if len(calls) > 5:
            raise RuntimeError("capture failed")

    with pytest.raises(RuntimeError, match="capture failed"):
        cuda_graph_runner.capture_graph(failing, pool=None)
    assert calls[3:] == [True, True, False] and gc.isenabled()
