"""Generate with sglang.Engine, offline, on the demo pair that ships with the package: the
Python code model and its EAGLE-3 draft.

    python3 examples/offline_engine.py [--prompt TEXT] [--max-new-tokens N] [--no-draft]
        [--model-path DIR --draft-model-path DIR] [--device cpu|cuda]

Prints the greedy continuation, how many tokens each target forward produced (accepted drafts
+ 1), and two sampled continuations.
"""

import argparse

import sglang


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompt", default="def fibonacci(n):")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--no-draft", action="store_true", help="plain decoding, without speculation")
    parser.add_argument("--model-path", default=None, help="a target model directory (default: the demo model)")
    parser.add_argument(
        "--draft-model-path", default=None, help="its EAGLE-3 draft (default: the demo draft, with the demo model)"
    )
    parser.add_argument("--device", default=None)
    args = parser.parse_args()
    speculative = (
        {}
        if args.no_draft
        else dict(speculative_algorithm="EAGLE3", speculative_draft_model_path=args.draft_model_path)
    )
    engine = sglang.Engine(model_path=args.model_path, device=args.device, log_level="warning", **speculative)
    try:
        greedy = engine.generate(args.prompt, {"temperature": 0, "max_new_tokens": args.max_new_tokens})
        print(args.prompt + greedy["text"])
        meta = greedy["meta_info"]
        if "spec_accept_length" in meta:
            print(
                f"--- {meta['completion_tokens']} tokens in {meta['spec_verify_ct']} target forwards: "
                f"{meta['spec_accept_length']:.2f} tokens each"
            )
        sampled = engine.generate(
            args.prompt,
            {"temperature": 0.8, "top_p": 0.95, "n": 2, "sampling_seed": 0, "max_new_tokens": args.max_new_tokens},
        )
        for out in sampled:
            print("--- sampled:")
            print(args.prompt + out["text"])
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main()
