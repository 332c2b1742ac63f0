"""bench_one_batch on the CPU: every batch size gets a result line with the step timings."""

import json

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
