"""bench_one_batch on the CPU: every batch size gets a result line with the step timings."""

import json
import os

import pytest
import torch

from sglang import bench_one_batch


def test_reports_prefill_and_every_decode_step(tiny_model_paths, tmp_path):
    out = tmp_path / "result.jsonl"
    results = bench_one_batch.main(
        [
            "--model-path",
            tiny_model_paths["llama"],
            "--device",
            "cpu",
            "--dtype",
            "float32",
            "--batch-size",
            "1",
            "3",
            "--input-len",
            "16",
            "--output-len",
            "5",
            "--result-filename",
            str(out),
            "--warmup-steps",
            "1",
        ]
    )
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["batch_size"] for r in lines] == [1, 3] == [r["batch_size"] for r in results]
    for r in lines:
        assert len(r["decode_step_s"]) == 4
        assert r["prefill_latency_s"] > 0 and r["decode_median_step_s"] > 0
        assert r["decode_throughput_tok_s"] == r["batch_size"] / r["decode_median_step_s"]


def test_profile_steps_list_where_a_decode_step_goes(tiny_model_paths, capsys):
    common = ["--model-path", tiny_model_paths["llama"], "--device", "cpu", "--dtype", "float32", "--input-len", "8"]
    results = bench_one_batch.main(
        common + ["--batch-size", "2", "--output-len", "3", "--warmup-steps", "1", "--profile-steps", "2"]
    )
    (result,) = results
    assert len(result["decode_step_s"]) == 2  # the profiled steps come after the timed ones
    rows = result["profile"]
    assert 0 < len(rows) <= bench_one_batch.PROFILE_TOP
    assert [r["us_per_step"] for r in rows] == sorted((r["us_per_step"] for r in rows), reverse=True)
    assert all(r["us_per_step"] > 0 and r["calls_per_step"] > 0 for r in rows)
    assert any(r["name"] in ("aten::mm", "aten::addmm", "aten::linear", "aten::matmul") for r in rows)
    assert "us/step" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        bench_one_batch.main(common + ["--profile-steps", "-1"])


def test_a_prefill_out_of_device_memory_says_what_to_lower(tiny_model_paths, monkeypatch):
    def out_of_memory(self):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 3.50 GiB")

    monkeypatch.setattr(bench_one_batch.StaticBatch, "prefill", out_of_memory)
    args = ["--model-path", tiny_model_paths["llama"], "--device", "cpu", "--batch-size", "4", "--input-len", "16"]
    with pytest.raises(RuntimeError, match=r"prefill of batch \d+ x 16 tokens .* lower --mem-fraction-static"):
        bench_one_batch.main(args + ["--output-len", "3"])


def test_memory_floor_is_the_weights_and_the_batchs_kv_over_the_copy_bandwidth(tiny_model_paths):
    from sglang.benchmark import memory_floor

    results = bench_one_batch.main(
        [
            "--model-path",
            tiny_model_paths["llama"],
            "--device",
            "cpu",
            "--dtype",
            "float32",
            "--batch-size",
            "1",
            "4",
            "--input-len",
            "16",
            "--output-len",
            "5",
            "--warmup-steps",
            "1",
            "--memory-floor",
        ]
    )
    one, four = results
    bandwidth = one["copy_bandwidth_bytes_per_s"]
    assert bandwidth > 1e8 and four["copy_bandwidth_bytes_per_s"] == bandwidth
    # The KV term grows with the batch: four rows at a mean context of 18.5 tokens.
    runner = bench_one_batch.make_runner(
        bench_one_batch.ServerArgs(
            model_path=tiny_model_paths["llama"], device="cpu", dtype="float32", max_running_requests=4
        )
    )
    weights = memory_floor.parameter_bytes(runner.model)
    kv = memory_floor.kv_bytes_per_token(runner.token_to_kv_pool)
    assert weights > 0 and kv > 0
    assert abs(one["memory_floor_step_s"] - (weights + 1 * 18.5 * kv) / bandwidth) < 1e-12
    assert abs(four["memory_floor_step_s"] - (weights + 4 * 18.5 * kv) / bandwidth) < 1e-12
    for r in results:
        assert r["ratio_to_floor"] == r["decode_median_step_s"] / r["memory_floor_step_s"]


def test_two_tensor_parallel_ranks_report_the_same_way_and_stop(tiny_model_paths):
    import multiprocessing

    before = set(multiprocessing.active_children())  # other tests' engines may live in this process
    results = bench_one_batch.main(
        [
            "--model-path",
            tiny_model_paths["qwen2"],
            "--device",
            "cpu",
            "--dtype",
            "float32",
            "--tp-size",
            "2",
            "--batch-size",
            "2",
            "--input-len",
            "16",
            "--output-len",
            "4",
            "--warmup-steps",
            "1",
            "--memory-floor",
        ]
    )
    assert [(r["batch_size"], r["tp_size"]) for r in results] == [(2, 2)]
    assert len(results[0]["decode_step_s"]) == 3 and results[0]["decode_median_step_s"] > 0
    assert set(multiprocessing.active_children()) - before == set()  # rank 1 stopped with the benchmark


def test_a_moe_models_floor_counts_only_the_routed_experts(tmp_path):
    from sglang.benchmark import memory_floor
    from sglang.test.tiny_moe_models import make_tiny_moe_model

    path = make_tiny_moe_model(str(tmp_path / "qwen3_moe"), "qwen3_moe")  # layers 0 and 2: 8 experts, top 2
    args = ["--model-path", path, "--device", "cpu", "--dtype", "float32", "--batch-size", "1", "4"]
    one, four = bench_one_batch.main(
        args + ["--input-len", "8", "--output-len", "3", "--warmup-steps", "1", "--memory-floor"]
    )
    assert one["routed_experts_per_layer"] == [2, 2]  # one token: its top 2 in each MoE layer
    assert all(2 <= n <= 8 for n in four["routed_experts_per_layer"])
    runner = bench_one_batch.make_runner(
        bench_one_batch.ServerArgs(model_path=path, device="cpu", dtype="float32", max_running_requests=4)
    )
    layers = memory_floor.expert_layers(runner.model)
    per_expert = [memory_floor.parameter_bytes(layer) // 8 for layer in layers]
    dense = memory_floor.parameter_bytes(runner.model) - 8 * sum(per_expert)
    kv = memory_floor.kv_bytes_per_token(runner.token_to_kv_pool)
    for result, batch in ((one, 1), (four, 4)):
        weights = dense + sum(n * b for n, b in zip(result["routed_experts_per_layer"], per_expert))
        expected = (weights + batch * 9.5 * kv) / result["copy_bandwidth_bytes_per_s"]
        assert abs(result["memory_floor_step_s"] - expected) < 1e-12


FLOOR_ARGS = ["--device", "cpu", "--batch-size", "2", "--input-len", "8", "--output-len", "3", "--warmup-steps", "1"]


def floor_weight_bytes(result: dict, runner) -> float:
    """The weight bytes a result's memory floor counts: its floor less the batch's KV reads."""
    from sglang.benchmark import memory_floor

    mean_context = result["input_len"] + result["output_len"] / 2
    kv = result["batch_size"] * mean_context * memory_floor.kv_bytes_per_token(runner.token_to_kv_pool)
    return result["memory_floor_step_s"] * result["copy_bandwidth_bytes_per_s"] - kv


def checkpoint_tensor_bytes(path: str) -> int:
    from safetensors.torch import load_file

    files = [os.path.join(path, f) for f in os.listdir(path) if f.endswith(".safetensors")]
    return sum(t.nbytes for f in files for t in load_file(f).values())


@pytest.mark.parametrize("fp8", ["block", "channel"])
def test_memory_floor_of_an_fp8_checkpoint_counts_its_bytes(tmp_path, monkeypatch, fp8):
    """An FP8 checkpoint's floor reads what the checkpoint holds: one byte per linear weight entry,
    its float32 scales, and the bfloat16 embeddings, head and norms."""
    from sglang.tools import make_random_model as maker

    tiny = dict(
        maker.CONFIGS["llama-3.2-1b"],
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        vocab_size=1024,
        max_position_embeddings=512,
        rope_scaling=None,
        tie_word_embeddings=False,
    )
    monkeypatch.setitem(maker.CONFIGS, "tiny", tiny)
    path = maker.make_random_model(str(tmp_path / fp8), "tiny", device="cpu", fp8=fp8)
    (result,) = bench_one_batch.main(["--model-path", path, *FLOOR_ARGS, "--memory-floor"])
    runner = bench_one_batch.make_runner(bench_one_batch.ServerArgs(model_path=path, device="cpu"))
    assert runner.model.model.layers[0].mlp.down_proj.weight.dtype == torch.float8_e4m3fn
    assert floor_weight_bytes(result, runner) == pytest.approx(checkpoint_tensor_bytes(path), rel=1e-9)


def test_memory_floor_of_an_fp8_moe_checkpoint_counts_its_routed_experts_fp8_bytes(tmp_path, monkeypatch):
    """A block-wise FP8 mixture-of-experts checkpoint (make_random_model --fp8 block): the floor reads
    the checkpoint's other tensors as stored and, of each MoE layer, the routed experts' share of
    its e4m3 weights and float32 block scales."""
    from safetensors.torch import load_file

    from sglang.tools import make_random_model as maker

    shape = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2)
    shape.update(num_key_value_heads=2, head_dim=64, vocab_size=1024, max_position_embeddings=512)
    experts = dict(moe_intermediate_size=128, num_experts=8, num_experts_per_tok=2)
    monkeypatch.setitem(maker.CONFIGS, "tiny-moe", dict(maker.CONFIGS["qwen3-30b-a3b"], **shape, **experts))
    path = maker.make_random_model(str(tmp_path / "moe"), "tiny-moe", device="cpu", fp8="block")
    (result,) = bench_one_batch.main(["--model-path", path, *FLOOR_ARGS, "--memory-floor"])
    runner = bench_one_batch.make_runner(bench_one_batch.ServerArgs(model_path=path, device="cpu"))
    assert runner.model.model.layers[0].mlp.experts.w13_weight.dtype == torch.float8_e4m3fn
    files = [os.path.join(path, f) for f in os.listdir(path) if f.endswith(".safetensors")]
    tensors = {name: t for f in files for name, t in load_file(f).items()}
    per_layer = [sum(t.nbytes for n, t in tensors.items() if f"layers.{i}.mlp.experts." in n) for i in range(2)]
    dense = sum(t.nbytes for t in tensors.values()) - sum(per_layer)
    routed = result["routed_experts_per_layer"]
    assert all(2 <= n <= 8 for n in routed)
    expected = dense + sum(n * layer_bytes / 8 for n, layer_bytes in zip(routed, per_layer))
    assert floor_weight_bytes(result, runner) == pytest.approx(expected, rel=1e-9)


def test_memory_floor_with_online_fp8_counts_the_fp8_checkpoint_of_the_same_weights(tiny_model_paths, tmp_path):
    """--quantization fp8 reaches bench_one_batch's model: the floor counts the bytes of the
    per-channel FP8 checkpoint of the same weights, not the float32 checkpoint's."""
    from sglang.test.fp8_checkpoints import write_fp8_checkpoint

    src = tiny_model_paths["llama"]
    args = ["--model-path", src, *FLOOR_ARGS, "--dtype", "float32", "--quantization", "fp8", "--memory-floor"]
    (result,) = bench_one_batch.main(args)
    runner = bench_one_batch.make_runner(
        bench_one_batch.ServerArgs(model_path=src, device="cpu", dtype="float32", quantization="fp8")
    )
    channel = write_fp8_checkpoint(src, str(tmp_path / "channel"), "ct-channel-dynamic", ["lm_head"])
    assert floor_weight_bytes(result, runner) == pytest.approx(checkpoint_tensor_bytes(channel), rel=1e-9)
    assert checkpoint_tensor_bytes(channel) < 0.6 * checkpoint_tensor_bytes(src)


def test_kv_bytes_per_token_follow_the_pools_dtype():
    """The floor's KV term reads the pool's element size: an FP8 KV cache counts one byte an entry
    whatever the model's dtype."""
    from sglang.benchmark import memory_floor
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    per_token = {
        dtype: memory_floor.kv_bytes_per_token(MHATokenToKVPool(8, dtype, 2, 16, 3, "cpu"))
        for dtype in (torch.float32, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2)
    }
    entries = 2 * 2 * 16 * 3  # K and V, heads, head_dim, layers
    assert per_token == {
        torch.float32: 4 * entries,
        torch.bfloat16: 2 * entries,
        torch.float8_e4m3fn: entries,
        torch.float8_e5m2: entries,
    }
