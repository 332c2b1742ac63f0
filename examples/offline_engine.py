"""Generate with sglang.Engine, offline.

    python3 examples/offline_engine.py [--model-path DIR] [--prompt TEXT] [--device cpu|cuda]

Without --model-path it writes a tiny random Llama to a temp directory first (its text is
noise, but every part of the engine runs).
"""

import argparse
import tempfile

import sglang
from sglang.test.tiny_models import make_tiny_model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-path", default=None)
    parser.add_argument("--prompt", default="def add(a, b):")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--device", default=None)
    args = parser.parse_args()
    model_path = args.model_path or make_tiny_model(tempfile.mkdtemp(prefix="tiny-llama-"), "llama")
    engine = sglang.Engine(model_path=model_path, device=args.device, log_level="warning")
    try:
        greedy = engine.generate(args.prompt, {"temperature": 0, "max_new_tokens": args.max_new_tokens})
        sampled = engine.generate([args.prompt] * 2, {"temperature": 0.8, "max_new_tokens": args.max_new_tokens})
        print("greedy :", repr(greedy["text"]), greedy["meta_info"])
        for out in sampled:
            print("sampled:", repr(out["text"]), out["meta_info"]["cached_tokens"], "cached prompt tokens")
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main()
