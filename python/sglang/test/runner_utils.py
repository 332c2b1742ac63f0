"""Driving a real ModelRunner directly in tests: one fresh request, one EXTEND forward."""

from __future__ import annotations

import torch

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.server_args import ServerArgs


def make_cpu_runner(path: str, max_total_tokens: int = 1024, context_length: int | None = None) -> ModelRunner:
    args = ServerArgs(
        model_path=path, dtype="float32", device="cpu", max_total_tokens=max_total_tokens, context_length=context_length
    )
    return ModelRunner(ModelConfig.from_path(path, dtype="float32", device="cpu", context_length=context_length), args)


def prefill(runner: ModelRunner, token_ids: list[int], capture_layers=None) -> LogitsProcessorOutput:
    """Logits at every position of a fresh request (and the aux states of `capture_layers`);
    its KV slots and table row are freed again afterwards."""
    if capture_layers is not None:
        runner.model.set_eagle3_layers_to_capture(capture_layers)
    num_tokens = len(token_ids)
    slots = runner.token_to_kv_pool_allocator.alloc(num_tokens)
    row = runner.req_to_token_pool.alloc()
    runner.req_to_token_pool.write(row, 0, slots)
    batch = ForwardBatch(
        forward_mode=ForwardMode.EXTEND,
        batch_size=1,
        input_ids=torch.tensor(token_ids),
        positions=torch.arange(num_tokens),
        req_pool_indices=torch.tensor([row]),
        seq_lens=torch.tensor([num_tokens]),
        out_cache_loc=slots,
        seq_lens_cpu=[num_tokens],
        extend_seq_lens_cpu=[num_tokens],
        extend_prefix_lens_cpu=[0],
        return_all_logits=True,
        capture_aux_hidden_states=capture_layers is not None,
    )
    try:
        return runner.forward(batch)
    finally:
        runner.req_to_token_pool.free(row)
        runner.token_to_kv_pool_allocator.free(slots)


def run_counting_verifies(scheduler) -> tuple[dict[str, list[int]], dict[str, int]]:
    """Steps an in-process Scheduler until it has no work; returns each request's output token
    ids and, on a speculative server, how many verifies it took part in ({rid: ids}, {rid: n})."""
    tokens, verifies = {}, {}
    while scheduler.has_work():
        out = scheduler.step()
        for j, rid in enumerate(out.rids if out else ()):
            tokens.setdefault(rid, []).extend(out.new_token_ids[j])
            if out.spec_verify_ct is not None:
                verifies[rid] = out.spec_verify_ct[j]
    return tokens, verifies


def run_to_completion(scheduler, on_step=None) -> dict[str, dict]:
    """Steps an in-process Scheduler until it has no work; returns each request's output token
    ids and finish reason, {rid: {"ids": [...], "reason": ...}}. `on_step(i)` runs before step i."""
    outputs, step = {}, 0
    while scheduler.has_work():
        if on_step is not None:
            on_step(step)
        out = scheduler.step()
        step += 1
        for rid, ids, reason in zip(out.rids, out.new_token_ids, out.finished_reasons) if out else ():
            entry = outputs.setdefault(rid, {"ids": [], "reason": None})
            entry["ids"].extend(ids)
            entry["reason"] = reason
    return outputs


class OneRank:
    """One rank's greedy or seeded output through a Scheduler in this process: what an Engine with
    --tp-size 1 and the same arguments computes in its scheduler process, without starting the
    engine's processes (each imports torch and transformers anew: seconds of CPU apiece). Prompts
    are tokenized as the engine's tokenizer manager does; requests of one `generate` call are all
    queued before the first step, as a batch sent to an idle engine arrives."""

    def __init__(self, **server_args):
        from sglang.srt.hf_transformers_utils import get_tokenizer
        from sglang.srt.managers.scheduler import Scheduler

        self.server_args = ServerArgs(**server_args)
        self.tokenizer = get_tokenizer(self.server_args.tokenizer_path)
        self.scheduler = Scheduler(self.server_args)
        self.calls = 0

    def generate(self, prompts: list[str], params) -> list[list[int]]:
        """Output token ids per prompt; `params`: one dict of sampling parameters, or one per prompt."""
        from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
        from sglang.srt.sampling.sampling_params import SamplingParams

        params_list = params if isinstance(params, list) else [params] * len(prompts)
        self.calls += 1
        rids = [f"{self.calls}-{i}" for i in range(len(prompts))]
        for rid, prompt, raw in zip(rids, prompts, params_list):
            sampling = SamplingParams.from_dict(raw)
            sampling.verify(self.scheduler.model_config.vocab_size)
            self.scheduler.add_request(
                TokenizedGenerateReqInput(rid, self.tokenizer.encode(prompt), sampling, stream=False)
            )
        outputs = run_to_completion(self.scheduler)
        return [outputs[rid]["ids"] for rid in rids]

    def internal_state(self) -> dict:
        """What an engine's get_server_info()["internal_state"] reports."""
        return self.scheduler.get_internal_state()


class RerunGraph:
    """A stand-in for a captured CUDA graph on the CPU: replays by running the captured forward
    again and writing its results into the tensors the capture returned, as a graph replay
    writes into its output memory."""

    def __init__(self, run, outputs):
        self.run, self.outputs = run, outputs

    @torch.inference_mode()  # as ModelRunner.forward runs it
    def replay(self):
        fresh = self.run()
        for name in ("next_token_logits", "aux_hidden_states", "hidden_states"):
            target = getattr(self.outputs, name)
            if target is not None:
                target.copy_(getattr(fresh, name))


def fake_capture_graph(run, pool):
    """cuda_graph_runner.capture_graph's stand-in: (a RerunGraph, what the forward returned)."""
    outputs = run()
    return RerunGraph(run, outputs), outputs


class RerunStepGraph:
    """SpecStepGraphs' graph stand-in on the CPU: re-runs the captured step and writes each of
    its outputs into the tensors the capture returned."""

    def __init__(self, run, outputs):
        self.run, self.outputs = run, outputs

    def replay(self):
        fresh = self.run()
        with torch.inference_mode():  # outputs made by the sampler are inference tensors
            for target, value in zip(self.outputs, fresh):
                if target is not None:  # a catch-up plain step has no probe hits
                    target.copy_(value)


def fake_cuda_graphs(set_attr, batch_sizes: list[int]) -> None:
    """Every CUDA graph the engine captures (decode and speculative shapes, prefills, whole
    speculative steps) becomes a CPU stand-in that re-runs its forward at each replay, with
    graphs "on" at `batch_sizes` whatever the device, so everything around the graphs runs as on
    CUDA. `set_attr(obj, name, value)`: pytest's monkeypatch.setattr in tests (undone after),
    the builtin setattr in a one-off script."""
    from sglang.srt.model_executor import cuda_graph_runner
    from sglang.srt.model_executor.cuda_graph_runner import CudaGraphRunner
    from sglang.srt.speculative import eagle_cuda_graphs

    def capture_one(self, bs):
        run = lambda: self.model_runner.forward_eager(self._static_batch(bs))  # noqa: E731
        self.outputs[bs] = run()
        self.graphs[bs] = RerunGraph(run, self.outputs[bs])

    def step_capture_one(self, bs):
        self.outputs[bs] = self._run(bs)
        self.graphs[bs] = RerunStepGraph(lambda: self._run(bs), self.outputs[bs])

    set_attr(CudaGraphRunner, "_capture_one", capture_one)
    set_attr(cuda_graph_runner, "capture_graph", fake_capture_graph)  # prefill graphs
    set_attr(ModelRunner, "graph_memory_pool", lambda self: None)
    set_attr(eagle_cuda_graphs.SpecStepGraphs, "_capture_one", step_capture_one)
    for module in (cuda_graph_runner, eagle_cuda_graphs):
        set_attr(module, "graph_batch_sizes", lambda runner: list(batch_sizes))
