"""benchmark/spec_envelope_gpu.sh end to end on the CPU (the GPU run's dry run): the demo pair
served three ways (no draft, always, dynamic), each swept by bench_serving, then the envelope
report and plot; the shipped model directories stay as they were (the sweep script once wrote a
random model into a directory it did not recognise)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess

from sglang import demo

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def digest(directory: str) -> str:
    h = hashlib.sha256()
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), "rb") as f:
            h.update(name.encode() + f.read())
    return h.hexdigest()


def test_envelope_script_runs_three_servers_and_reports(tmp_path):
    before = {path: digest(path) for path in (demo.TARGET_PATH, demo.DRAFT_PATH)}
    env = dict(os.environ, LEVELS="1,2", NUM_PROMPTS="2", PER_CONC="1", INPUT_LEN="16", OUTPUT_LEN="8",
               EXTRA_SERVER_ARGS="--device cpu", PORT="30871", SWEEP_TIMEOUT_S="200")
    proc = subprocess.run(["bash", "benchmark/spec_envelope_gpu.sh", str(tmp_path), "demo"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    files = sorted(os.listdir(tmp_path))
    assert files == ["demo_always.jsonl", "demo_dynamic.jsonl", "demo_envelope.json", "demo_envelope.png",
                     "demo_no_draft.jsonl", "demo_servers.tgz"], files  # few files: the device returns 8
    report = json.loads((tmp_path / "demo_envelope.json").read_text())
    assert [p["concurrency"] for p in report["points"]] == [1, 2] and not report["problems"]
    assert all(p["always_accept_length"] > 1 and p["dynamic_step_share_by_k"] for p in report["points"])
    assert report["dynamic_server"]["spec_policy"]["name"] == "cost"
    assert {path: digest(path) for path in before} == before
