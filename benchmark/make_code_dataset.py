"""Prompts in the demo model's domain (Python source) for bench_serving: windows of Python
standard-library files, written as a ShareGPT-layout JSONL that `bench_serving --dataset-name
sharegpt --dataset-path OUT --sharegpt-output-len N` reads. Random token ids are far outside
what the demo pair was trained on (its draft accepts ~0.05 per position there), so the demo
pair's real acceptance needs prompts like these.

    python benchmark/make_code_dataset.py MODEL OUT.jsonl --num 2048 --input-len 1024
"""

from __future__ import annotations

import argparse
import json

from sglang.benchmark.code_prompts import code_windows


def main() -> None:
    from transformers import AutoTokenizer

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="model directory whose tokenizer measures the windows")
    parser.add_argument("out", help="JSONL file to write")
    parser.add_argument("--num", type=int, default=2048)
    parser.add_argument("--input-len", type=int, default=1024)
    args = parser.parse_args()
    if args.num < 1 or args.input_len < 1:
        parser.error("--num and --input-len must be >= 1")
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    windows = code_windows(tokenizer, args.num, args.input_len)
    if len(windows) < args.num:
        raise SystemExit(
            f"the standard library gives only {len(windows)} windows of {args.input_len} tokens; "
            f"ask for fewer (--num) or shorter ones (--input-len)"
        )
    with open(args.out, "w") as f:
        for ids in windows:
            conversation = [{"from": "human", "value": tokenizer.decode(ids)}, {"from": "gpt", "value": "."}]
            f.write(json.dumps({"conversations": conversation}) + "\n")
    print(f"wrote {len(windows)} prompts of {args.input_len} tokens to {args.out}")


if __name__ == "__main__":
    main()
