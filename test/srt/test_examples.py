"""examples/offline_engine.py runs on the shipped demo pair and prints its code, with the draft
producing more than one token per target forward."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_offline_engine_example_prints_the_demo_models_code():
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "offline_engine.py"), "--max-new-tokens", "16"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert out.startswith("def fibonacci(n):\n"), out  # the prompt, then the model's own next lines
    assert out.count("--- sampled:") == 2
    per_forward = re.search(r"16 tokens in (\d+) target forwards: ([\d.]+) tokens each", out)
    assert per_forward and float(per_forward.group(2)) > 1.0, out
