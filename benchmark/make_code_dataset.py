"""Prompts in the demo model's domain (Python source) for bench_serving: windows of Python
standard-library files, written as a ShareGPT-layout JSONL that `bench_serving --dataset-name
sharegpt --dataset-path OUT --sharegpt-output-len N` reads. Random token ids are far outside
what the demo pair was trained on (its draft accepts ~0.05 per position there), so the demo
pair's real acceptance needs prompts like these.

    python benchmark/make_code_dataset.py MODEL OUT.jsonl --num 2048 --input-len 1024
"""

from __future__ import annotations

import argparse
import glob
import json
import os


def stdlib_files() -> list[str]:
    """The standard library's .py files, packages included, installed packages and tests not."""
    root = os.path.dirname(os.__file__)
    skip = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep, os.sep + "test" + os.sep,
            os.sep + "tests" + os.sep, os.sep + "idlelib" + os.sep)
    return sorted(path for path in glob.glob(os.path.join(root, "**", "*.py"), recursive=True)
                  if not any(part in path for part in skip))


def code_windows(tokenizer, num: int, length: int) -> list[list[int]]:
    """`num` distinct windows of `length` token ids, a few per file (past each file's license
    header), files in sorted order; fewer if the library has fewer."""
    windows: list[list[int]] = []
    for path in stdlib_files():
        with open(path, errors="replace") as f:
            ids = tokenizer(f.read()[:200_000]).input_ids
        for start in range(length, len(ids) - length + 1, length):
            windows.append(ids[start:start + length])
            if len(windows) == num:
                return windows
    return windows


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
        raise SystemExit(f"the standard library gives only {len(windows)} windows of {args.input_len} tokens; "
                         f"ask for fewer (--num) or shorter ones (--input-len)")
    with open(args.out, "w") as f:
        for ids in windows:
            conversation = [{"from": "human", "value": tokenizer.decode(ids)}, {"from": "gpt", "value": "."}]
            f.write(json.dumps({"conversations": conversation}) + "\n")
    print(f"wrote {len(windows)} prompts of {args.input_len} tokens to {args.out}")


if __name__ == "__main__":
    main()
