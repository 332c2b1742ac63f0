"""GPU check for the engine core: greedy float32 tokens of the tiny models with the
torch_native backend on CUDA must equal the same engine's tokens on CPU.

    python test/gpu/engine_cuda_check.py MODELS_DIR OUT_JSON [--expected CPU_JSON]

MODELS_DIR holds one tiny model per architecture (llama, qwen2, qwen3), e.g. written by
`python -m sglang.test.tiny_models`. With --expected, tokens recorded on another machine's
CPU are compared too. Exits non-zero on any mismatch.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import sglang

PROMPTS = [
    "def add(a, b):",
    "The quick brown fox jumps over the lazy dog. A radix tree shares",
    "Hello",
    "import torch\nx = torch.zeros(3, 4)\nfor i in range(10):\n    print(i * i)\n# and then",
]
GREEDY = {"temperature": 0, "max_new_tokens": 48, "ignore_eos": True}
SEEDED = {"temperature": 0.9, "top_p": 0.95, "max_new_tokens": 24, "ignore_eos": True, "sampling_seed": 11}


def run(model_path: str, device: str) -> dict:
    start = time.perf_counter()
    engine = sglang.Engine(model_path=model_path, device=device, dtype="float32", log_level="warning")
    try:
        greedy = [o["output_ids"] for o in engine.generate(PROMPTS, GREEDY)]
        seeded = [o["output_ids"] for o in engine.generate(PROMPTS, SEEDED)]
        state = engine.get_server_info()["internal_state"]
    finally:
        engine.shutdown()
    return {"greedy": greedy, "seeded": seeded, "kv_state": state, "seconds": time.perf_counter() - start}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("models_dir")
    parser.add_argument("out_json")
    parser.add_argument("--expected", default=None)
    parser.add_argument("--devices", default="cuda,cpu")
    args = parser.parse_args()
    expected = json.load(open(args.expected)) if args.expected else {}
    report, ok = {}, True
    for arch in sorted(os.listdir(args.models_dir)):
        path = os.path.join(args.models_dir, arch)
        runs = {device: run(path, device) for device in args.devices.split(",")}
        entry = {"runs": runs}
        base = runs[args.devices.split(",")[-1]]
        for device, result in runs.items():
            entry[f"{device}_greedy_equal"] = result["greedy"] == base["greedy"]
            entry[f"{device}_seeded_equal"] = result["seeded"] == base["seeded"]
            state = result["kv_state"]
            entry[f"{device}_kv_accounting_ok"] = state["free_slots"] + state["cached_slots"] == state["total_slots"]
        if arch in expected:
            entry["greedy_equal_to_expected"] = base["greedy"] == expected[arch]["greedy"]
        checks = [v for k, v in entry.items() if k != "runs"]
        entry["ok"] = all(checks)
        ok &= entry["ok"]
        report[arch] = entry
        print(arch, {k: v for k, v in entry.items() if k != "runs"}, flush=True)
    with open(args.out_json, "w") as f:
        json.dump(report, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
