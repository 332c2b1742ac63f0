"""python -m sglang.benchmark.fp8_gemm: its dry run (tiny shapes, the Triton interpreter on the CPU) times
every path that runs without CUDA, checks each against its reference first, prints the table and
writes the JSON; its arguments parse as documented."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from sglang.benchmark import fp8_gemm as fp8_gemm_gpu


def test_arguments_default_to_every_8b_shape():
    args = fp8_gemm_gpu.parse_args(["--out", "x.json", "--shapes", "o", "down", "--rows", "1", "64"])
    assert (args.shapes, args.rows, args.dry_run) == (["o", "down"], [1, 64], False)
    assert fp8_gemm_gpu.parse_args(["--out", "x.json"]).shapes is None
    assert set(fp8_gemm_gpu.LLAMA_8B) == {"qkv", "o", "gate_up", "down"}


def dry_run(out, *flags):
    """The benchmark's dry run in a subprocess: (its report, its stdout)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "sglang.benchmark.fp8_gemm", "--dry-run", *flags, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(out.read_text()), proc.stdout


def test_dry_run_times_each_path_and_writes_json(tmp_path):
    report, stdout = dry_run(tmp_path / "fp8.json")
    assert report["dry_run"] and report["device"] == "cpu (interpreter)"
    paths = {(r["shape"], r["rows"], r["path"]) for r in report["results"]}
    for shape in fp8_gemm_gpu.DRY_RUN_SHAPES:
        assert {p for s, rows, p in paths if s == shape and rows == 1} == {
            "bf16",
            "block",
            "token_triton",
            "static_triton",
            "block_skinny",
            "token_skinny",
            "static_skinny",
        }
        assert {p for s, rows, p in paths if s == shape and rows == 17} == {
            "bf16",
            "block",
            "token_triton",
            "static_triton",
        }
    assert all(r["us"] > 0 for r in report["results"])
    assert "us per call" in stdout and "token_skinny" in stdout


def test_dry_run_sweep_times_the_skinny_configs_of_one_row(tmp_path):
    report, stdout = dry_run(tmp_path / "sweep.json", "--sweep-skinny")
    assert report["sweep_skinny"]
    rows = report["results"]
    # one row only: 17 rows is past the skinny kernel's limit
    assert {(r["path"], r["rows"]) for r in rows} == {("block_skinny", 1), ("token_skinny", 1)}
    for path in ("block_skinny", "token_skinny"):
        configs = [tuple(r["config"]) for r in rows if r["path"] == path]
        assert len(configs) == len(set(configs)) == 1 + len(fp8_gemm_gpu.DRY_RUN_SWEEP)  # the default and the grid
        assert sum(r["default"] for r in rows if r["path"] == path) == 1
    assert all(r["us"] > 0 for r in rows)
    assert "default" in stdout and "best" in stdout
