"""The README's Engine example, copied into a file and run as a user would, exits 0 and prints
the demo model's text."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def readme_python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)


def test_the_readme_engine_example_runs_as_written(tmp_path):
    blocks = [block for block in readme_python_blocks() if "sglang.Engine(" in block]
    assert len(blocks) == 1, "the README shows one Engine example"
    script = tmp_path / "example.py"
    script.write_text(blocks[0])
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "'finish_reason': {'type': 'length'" in proc.stdout and "'completion_tokens': 24" in proc.stdout
    assert "Traceback" not in proc.stderr
