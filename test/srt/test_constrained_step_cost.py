"""python -m sglang.benchmark.constrained_step_cost on the CPU (the GPU run's dry run): every
configuration (no draft and k = 3, unconstrained and constrained) is measured and the ratio of a
constrained step to an unconstrained one is reported."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def test_constrained_step_cost_reports_every_configuration(tmp_path):
    out = tmp_path / "cost.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sglang.benchmark.constrained_step_cost",
            "--out",
            str(out),
            "--batch",
            "1",
            "--steps",
            "2",
            "--device",
            "cpu",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = json.loads(out.read_text())["results"]
    assert len(rows) == 4, rows
    assert all(row["step_ms"] > 0 and row["tokens_per_step"] > 0 for row in rows)
    constrained = [row for row in rows if "constrained_over_unconstrained" in row]
    assert len(constrained) == 2 and all(row["constrained_over_unconstrained"] > 0 for row in constrained)
