"""bench_one_batch on the CPU: every batch size gets a result line with the step timings."""

import json

from sglang import bench_one_batch


def test_reports_prefill_and_every_decode_step(tiny_model_paths, tmp_path):
    out = tmp_path / "result.jsonl"
    results = bench_one_batch.main([
        "--model-path", tiny_model_paths["llama"], "--device", "cpu", "--dtype", "float32",
        "--batch-size", "1", "3", "--input-len", "16", "--output-len", "5", "--result-filename", str(out),
        "--warmup-steps", "1",
    ])
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["batch_size"] for r in lines] == [1, 3] == [r["batch_size"] for r in results]
    for r in lines:
        assert len(r["decode_step_s"]) == 4
        assert r["prefill_latency_s"] > 0 and r["decode_median_step_s"] > 0
        assert r["decode_throughput_tok_s"] == r["batch_size"] / r["decode_median_step_s"]
