"""How often speculative decoding gives plain decoding's greedy tokens, and why it differs where
it does. Runs the same greedy requests (code prompts from the standard library, the demo pair's
domain) through an engine without a draft and through speculative engines, one engine at a time,
and compares each output with plain decoding's token by token.

In float32 the outputs are identical. In bfloat16 a verify pass scores k + 1 positions in one
forward, with other matrix shapes than a decode step, so its logits round differently; where
plain decoding's two best tokens are nearly tied, the two paths can pick different ones and the
texts go apart from there. Each divergence is reported with plain decoding's gap between its top
two log-probabilities at that position, which says whether it was such a near-tie.

    python -m sglang.benchmark.greedy_agreement --dtype bfloat16 --device cuda --out agreement.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys

from sglang.benchmark.code_prompts import code_windows

# Engines compared with plain decoding (a batch of every prompt, no draft): keywords on top of the
# model's; "draft" stands for the draft's. plain-batch1 is the control: plain decoding one request at
# a time, which in bfloat16 rounds differently from the batched run without any speculation.
MODES = {
    "always": {"draft": True},
    "adaptive": {"draft": True, "speculative_adaptive": True},
    "plain-batch1": {"max_running_requests": 1},
}


@dataclasses.dataclass
class Divergence:
    prompt_index: int
    position: int  # index of the first output token that differs
    plain_top2_gap: float | None  # plain decoding's logprob(best) - logprob(second) there
    # whether the speculative token was one of plain decoding's two best there (either, as a tie
    # may list them in any order)
    spec_token_in_plain_top2: bool | None


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first position where a and b differ (a length difference counts), else None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare(plain: list[dict], spec: list[dict]) -> dict:
    """Agreement of each speculative output with plain decoding's: outputs identical, the share of
    tokens before the first difference, and every divergence with plain decoding's top-two gap."""
    shared = total = 0
    divergences = []
    for i, (p, s) in enumerate(zip(plain, spec)):
        p_ids, s_ids = p["output_ids"], s["output_ids"]
        total += len(p_ids)
        at = first_difference(p_ids, s_ids)
        shared += len(p_ids) if at is None else at
        if at is not None:
            divergences.append(_divergence(i, at, p, s_ids))
    gaps = [d.plain_top2_gap for d in divergences if d.plain_top2_gap is not None]
    return {
        "prompts": len(plain),
        "identical_outputs": len(plain) - len(divergences),
        "tokens_before_first_difference": shared,
        "tokens": total,
        "token_share": shared / total if total else 1.0,
        "median_divergence_top2_gap": statistics.median(gaps) if gaps else None,
        "max_divergence_top2_gap": max(gaps) if gaps else None,
        "divergences": [dataclasses.asdict(d) for d in divergences],
    }


def _divergence(index: int, at: int, plain: dict, spec_ids: list[int]) -> Divergence:
    top = plain.get("top_logprobs") or []
    if at >= len(top) or len(top[at]) < 2 or at >= len(spec_ids):
        return Divergence(index, at, None, None)
    (best, best_id), (second, second_id) = top[at][0], top[at][1]
    return Divergence(index, at, round(best - second, 6), spec_ids[at] in (best_id, second_id))


def run_engine(engine_kwargs: dict, prompts: list[list[int]], output_len: int) -> list[dict]:
    """Greedy outputs of one engine: token ids, and plain decoding's top-two log-probabilities."""
    import sglang

    engine = sglang.Engine(**engine_kwargs)
    try:
        outputs = engine.generate(
            input_ids=prompts,
            sampling_params={"temperature": 0, "max_new_tokens": output_len, "ignore_eos": True},
            return_logprob=True,
            top_logprobs_num=2,
        )
    finally:
        engine.shutdown()
    return [
        {
            "output_ids": out["output_ids"],
            "top_logprobs": [
                [(float(lp), int(tok)) for lp, tok, *_ in position]
                for position in out["meta_info"].get("output_top_logprobs", [])
            ],
        }
        for out in outputs
    ]


def measure(args: argparse.Namespace) -> dict:
    from transformers import AutoTokenizer

    from sglang import demo

    model_path = args.model_path or demo.TARGET_PATH
    draft_path = args.draft_model_path or demo.DRAFT_PATH
    prompts = code_windows(AutoTokenizer.from_pretrained(model_path), args.num_prompts, args.input_len)
    if len(prompts) < args.num_prompts:
        raise SystemExit(f"the standard library gives only {len(prompts)} windows of {args.input_len} tokens")
    base = dict(model_path=model_path, dtype=args.dtype, log_level="warning", random_seed=0)
    if args.device:
        base["device"] = args.device
    if args.max_total_tokens:
        base["max_total_tokens"] = args.max_total_tokens
    plain = run_engine(base, prompts, args.output_len)
    draft = dict(
        speculative_algorithm="EAGLE3",
        speculative_draft_model_path=draft_path,
        speculative_num_steps=args.speculative_num_steps,
    )
    results = {}
    for mode in args.modes:
        keywords = dict(MODES[mode])
        if keywords.pop("draft", False):
            keywords.update(draft)
        results[mode] = compare(plain, run_engine({**base, **keywords}, prompts, args.output_len))
    return {
        "model_path": model_path,
        "draft_model_path": draft_path,
        "dtype": args.dtype,
        "device": args.device,
        "num_prompts": args.num_prompts,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "speculative_num_steps": args.speculative_num_steps,
        "modes": results,
    }


def summary_lines(result: dict) -> list[str]:
    lines = []
    for mode, r in result["modes"].items():
        gap = r["median_divergence_top2_gap"]
        lines.append(
            f"{mode}: {r['identical_outputs']}/{r['prompts']} outputs identical, "
            f"{r['token_share']:.4f} of tokens before the first difference"
            + (
                f", median top-2 gap at a divergence {gap:.4f} (max {r['max_divergence_top2_gap']:.4f})"
                if gap is not None
                else ""
            )
        )
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-path", default=None, help="target model (default: the demo code model)")
    parser.add_argument("--draft-model-path", default=None, help="EAGLE-3 draft (default: the demo draft)")
    parser.add_argument("--dtype", default="bfloat16", help="as launch_server's --dtype")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--speculative-num-steps", type=int, default=3)
    parser.add_argument("--max-total-tokens", type=int, default=None, help="KV pool of each engine")
    parser.add_argument(
        "--modes",
        nargs="+",
        default=list(MODES),
        choices=list(MODES),
        help="engines compared with batched plain decoding: always-on and adaptive "
        "speculation, and plain decoding one request at a time (a control)",
    )
    parser.add_argument("--out", default=None, help="write the full result (every divergence) as JSON here")
    args = parser.parse_args(argv)
    if min(args.num_prompts, args.input_len, args.output_len, args.speculative_num_steps) < 1:
        parser.error("--num-prompts, --input-len, --output-len and --speculative-num-steps must be >= 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    result = measure(args)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    print("\n".join(summary_lines(result)))


if __name__ == "__main__":
    main(sys.argv[1:])
