"""Speculative decoding on the GPU (issue 6): lossless checks in one device call.

    python benchmark/spec_gpu_check.py --out $OUT

- float32, demo pair and a tiny random pair: greedy tokens with EAGLE-3 (k = 3) == plain
  decoding, for the torch_native and triton backends;
- bfloat16, demo pair, triton: token match rate of speculative vs plain greedy output, and for
  each mismatching request the first differing position with the target's top-2 logit gap there
  (a near-tie explains a flip: verify scores k + 1 tokens in one extend pass, plain decoding one
  token per pass, so bf16 rounding differs).
Writes spec_gpu_check.json under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

import sglang
from sglang import demo
from sglang.test.tiny_models import make_tiny_eagle3_draft, make_tiny_model

DEVICE = "cuda"
PROMPTS = ["def fibonacci(n):", "class Stack:\n    def __init__(self):", "import os\nimport sys\n",
           "for i in range(10):\n    print(", "x = [1, 2, 3]\ny = ", "def parse(text):\n    \"\"\"",
           "with open(path) as f:\n", "try:\n    import numpy as np\nexcept ImportError:"]


def generate(model_path, draft, dtype, backend, max_new):
    kwargs = dict(model_path=model_path, device=DEVICE, dtype=dtype, attention_backend=backend,
                  log_level="warning", disable_overlap_schedule=True, cuda_graph_max_bs=8)
    if draft:
        kwargs.update(speculative_algorithm="EAGLE3", speculative_draft_model_path=draft, speculative_num_steps=3)
    engine = sglang.Engine(**kwargs)
    try:
        start = time.perf_counter()
        out = engine.generate(PROMPTS, {"temperature": 0, "max_new_tokens": max_new, "ignore_eos": True})
        seconds = time.perf_counter() - start
        state = engine.get_server_info()["internal_state"]
    finally:
        engine.shutdown()
    return [o["output_ids"] for o in out], seconds, state.get("avg_spec_accept_length")


def logit_gap(model_path, prompt_ids, prefix):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).to(DEVICE).eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + prefix], device=DEVICE)).logits[0, -1]
    top = logits.topk(2).values
    return float(top[0] - top[1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--workdir", default="/tmp/spec_gpu_check")
    parser.add_argument("--device", default="cuda", help="cpu: a smoke test of this script (torch_native only)")
    args = parser.parse_args()
    global DEVICE
    DEVICE = args.device
    backends = ("torch_native", "triton") if DEVICE == "cuda" else ("torch_native",)
    os.makedirs(args.out, exist_ok=True)
    report = {"device": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu", "torch": torch.__version__,
              "float32": {}}
    path = os.path.join(args.out, "spec_gpu_check.json")

    def save():  # after every part: a call cut short still returns what it finished
        with open(path, "w") as f:
            json.dump(report, f, indent=1)

    def float32_part(name, target, draft, backend):
        plain, _, _ = generate(target, None, "float32", backend, 64)
        spec, _, accept = generate(target, draft, "float32", backend, 64)
        report["float32"][f"{name}/{backend}"] = {"identical": plain == spec, "accept_length": accept}
        print(f"float32 {name} {backend}: identical={plain == spec} accept={accept}", flush=True)
        save()

    float32_part("demo", demo.TARGET_PATH, demo.DRAFT_PATH, backends[-1])
    bfloat16_part(report, backends[-1])
    save()
    tiny = make_tiny_model(os.path.join(args.workdir, "tiny-llama"), "llama")
    tiny_draft = make_tiny_eagle3_draft(os.path.join(args.workdir, "tiny-draft"), tiny, draft_vocab_size=200)
    float32_part("tiny", tiny, tiny_draft, backends[-1])
    if len(backends) > 1:
        float32_part("demo", demo.TARGET_PATH, demo.DRAFT_PATH, backends[0])
        float32_part("tiny", tiny, tiny_draft, backends[0])


def bfloat16_part(report: dict, backend: str) -> None:
    plain, plain_s, _ = generate(demo.TARGET_PATH, None, "bfloat16", backend, 128)
    spec, spec_s, accept = generate(demo.TARGET_PATH, demo.DRAFT_PATH, "bfloat16", backend, 128)
    matched = sum(a == b for p, s in zip(plain, spec) for a, b in zip(p, s))
    total = sum(len(p) for p in plain)
    mismatches = []
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(demo.TARGET_PATH)
    for prompt, p, s in zip(PROMPTS, plain, spec):
        if p != s:
            first = next(i for i, (a, b) in enumerate(zip(p, s)) if a != b)
            gap = logit_gap(demo.TARGET_PATH, tokenizer(prompt).input_ids, p[:first])
            mismatches.append({"prompt": prompt, "first_diff": first, "plain": p[first], "spec": s[first],
                               "float32_top2_logit_gap": gap})
    report["bfloat16"] = {"token_match_rate": matched / total,
                          "requests_identical": sum(p == s for p, s in zip(plain, spec)),
                          "requests": len(PROMPTS), "accept_length": accept, "mismatches": mismatches,
                          "note": "eager speculative steps (no graphs yet) vs plain decode with CUDA graphs; "
                                  "wall seconds are not a speed claim",
                          "plain_s": plain_s, "spec_s": spec_s}
    print(json.dumps(report["bfloat16"], indent=1), flush=True)


if __name__ == "__main__":
    main()
