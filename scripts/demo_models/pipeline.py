"""Builds the demo model pair end to end: corpus -> tokenizer -> target -> EAGLE-3 draft ->
evaluation, writing OUT/target, OUT/draft, OUT/report.json and OUT/README.md.

    python scripts/demo_models/pipeline.py --out OUT [--seed 0] [--toy]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")

import numpy as np
import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from corpus import build_corpus  # noqa: E402
from draft_model import Eagle3Draft, default_aux_layer_ids, save_draft  # noqa: E402
from evaluate import acceptance_table, heldout_draft_accuracy  # noqa: E402
from readme import write_readme  # noqa: E402
from tokenizer import token_stream, train_tokenizer  # noqa: E402
from train_draft import DraftSpec, pick_draft_vocab, train_draft  # noqa: E402
from train_target import (
    TargetSpec,
    build_target,
    heldout_loss,
    round_to_bfloat16,  # noqa: E402
    save_target,
    train_target,
)

# Sized for one H200 and for the 32 MB the committed pair may take: an 11.7M-parameter target
# (23 MB in bf16) and a ~2M-parameter draft (see the README next to this file for stage times).
DEFAULTS = dict(
    sources="stdlib,torch,transformers",
    max_files=None,
    heldout_fraction=0.05,
    vocab_size=6144,
    hidden_size=256,
    num_layers=10,
    num_heads=4,
    intermediate_size=768,
    seq_len=512,
    batch_size=64,
    target_steps=4000,
    target_lr=2e-3,
    target_warmup=200,
    draft_vocab_size=3072,
    unroll_steps=6,
    step_weight_decay=0.8,
    draft_seq_len=512,
    draft_batch_size=32,
    draft_steps=3000,
    draft_lr=1e-3,
    draft_warmup=100,
    draft_generated_fraction=0.5,
    draft_pool_size=2048,
    eval_windows=256,
    eval_prompts=64,
    prompt_len=128,
    gen_len=128,
    log_every=100,
)
TOY = dict(
    sources="stdlib",
    max_files=30,
    vocab_size=512,
    hidden_size=64,
    num_layers=8,
    num_heads=4,
    intermediate_size=128,
    seq_len=64,
    batch_size=8,
    target_steps=30,
    target_lr=3e-3,
    target_warmup=5,
    draft_vocab_size=256,
    unroll_steps=3,
    draft_seq_len=64,
    draft_batch_size=8,
    draft_steps=20,
    draft_lr=3e-3,
    draft_warmup=5,
    draft_pool_size=8,
    eval_windows=8,
    eval_prompts=4,
    prompt_len=16,
    gen_len=24,
    log_every=10,
)
MAX_K = 5


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--toy", action="store_true", help="tiny sizes that run on a CPU in seconds")
    for name, value in DEFAULTS.items():
        kind = float if isinstance(value, float) else str if isinstance(value, str) else int
        parser.add_argument(
            "--" + name.replace("_", "-"), type=kind, default=None, help=f"default {value} (toy {TOY.get(name, value)})"
        )
    args = parser.parse_args(argv)
    preset = {**DEFAULTS, **(TOY if args.toy else {})}
    for name, value in preset.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class Timer:
    def __init__(self):
        self.seconds = {}

    def run(self, name, fn, *args, **kwargs):
        start = time.time()
        result = fn(*args, **kwargs)
        self.seconds[name] = round(time.time() - start, 2)
        print(f"[pipeline] {name}: {self.seconds[name]:.1f}s", flush=True)
        return result


def target_spec(args) -> TargetSpec:
    return TargetSpec(
        args.hidden_size,
        args.num_layers,
        args.num_heads,
        args.intermediate_size,
        args.seq_len,
        args.batch_size,
        args.target_steps,
        args.target_lr,
        args.target_warmup,
    )


def draft_spec(args) -> DraftSpec:
    return DraftSpec(
        args.draft_vocab_size,
        args.unroll_steps,
        args.step_weight_decay,
        args.draft_seq_len,
        args.draft_batch_size,
        args.draft_steps,
        args.draft_lr,
        args.draft_warmup,
        args.draft_generated_fraction,
        args.draft_pool_size,
    )


def run(args) -> dict:
    seed_everything(args.seed)
    timer, device = Timer(), args.device
    corpus = timer.run(
        "corpus", build_corpus, args.seed, args.heldout_fraction, args.sources.split(","), args.max_files
    )
    print(
        f"[pipeline] corpus: {len(corpus.train_files)} train + {len(corpus.heldout_files)} held-out files, "
        f"file list sha256 {corpus.file_list_sha256}",
        flush=True,
    )
    train_texts, heldout_texts = corpus.texts(corpus.train_files), corpus.texts(corpus.heldout_files)
    tokenizer = timer.run("tokenizer", train_tokenizer, train_texts, args.vocab_size)
    train_stream = timer.run("tokenize", token_stream, tokenizer, train_texts)
    heldout_stream = token_stream(tokenizer, heldout_texts)

    target = build_target(target_spec(args), len(tokenizer), tokenizer.eos_token_id)
    target_losses = timer.run(
        "train_target", train_target, target, train_stream, target_spec(args), args.seed, device, args.log_every
    )
    round_to_bfloat16(target)
    target.requires_grad_(False)
    loss = timer.run(
        "eval_target", heldout_loss, target, heldout_stream, args.seq_len, device, args.eval_windows, args.batch_size
    )
    save_target(target, tokenizer, os.path.join(args.out, "target"))

    torch.manual_seed(args.seed + 1)
    aux_ids = default_aux_layer_ids(args.num_layers)
    vocab_ids = pick_draft_vocab(train_stream, len(tokenizer), min(args.draft_vocab_size, len(tokenizer)))
    draft = Eagle3Draft(target.config, vocab_ids, aux_ids)
    draft_losses = timer.run(
        "train_draft", train_draft, draft, target, train_stream, draft_spec(args), args.seed, device, args.log_every
    )
    save_draft(draft, os.path.join(args.out, "draft"))

    accuracy = timer.run(
        "eval_draft_accuracy",
        heldout_draft_accuracy,
        target,
        draft,
        heldout_stream,
        args.draft_seq_len,
        max(1, args.eval_windows // 16),
        args.unroll_steps,
        device,
    )
    acceptance = timer.run(
        "eval_acceptance",
        acceptance_table,
        target,
        draft,
        heldout_stream,
        args.eval_prompts,
        args.prompt_len,
        args.gen_len,
        MAX_K,
        device,
    )
    report = {
        "seed": args.seed,
        "toy": args.toy,
        "args": vars(args),
        "environment": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "device": device_name(device),
        },
        "corpus": {
            "roots": corpus.roots,
            "file_list_sha256": corpus.file_list_sha256,
            "num_train_files": len(corpus.train_files),
            "num_heldout_files": len(corpus.heldout_files),
            "train_tokens": int(len(train_stream)),
            "heldout_tokens": int(len(heldout_stream)),
        },
        "tokenizer": {"vocab_size": len(tokenizer), "eos_token": tokenizer.eos_token},
        "target": {
            "num_params": sum(p.numel() for p in target.parameters()),
            "num_layers": args.num_layers,
            "hidden_size": args.hidden_size,
            "final_train_loss": target_losses[-1],
            "heldout_loss": loss,
            "heldout_perplexity": math.exp(loss),
        },
        "draft": {
            "num_params": sum(p.numel() for p in draft.parameters()),
            "draft_vocab_size": len(vocab_ids),
            "aux_layer_ids": aux_ids,
            "loss": f"cross-entropy vs the target's greedy token, weight {args.step_weight_decay}**step",
            "unroll_steps": args.unroll_steps,
            "generated_fraction": args.draft_generated_fraction,
            "final_train_loss": draft_losses[-1],
            "heldout_accuracy_per_step": accuracy,
        },
        "acceptance": acceptance,
        "seconds": timer.seconds,
    }
    with open(os.path.join(args.out, "report.json"), "w") as f:
        json.dump(report, f, indent=2)
    write_readme(report, os.path.join(args.out, "README.md"))
    return report


def device_name(device: str) -> str:
    return torch.cuda.get_device_name(device) if device.startswith("cuda") else platform.processor() or "cpu"


def main(argv=None) -> None:
    args = parse_args(argv)
    # Process-wide, so set here rather than in run(), which tests call in-process.
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False
    os.makedirs(args.out, exist_ok=True)
    report = run(args)
    print(
        json.dumps(
            {
                "heldout_loss": report["target"]["heldout_loss"],
                "acceptance": report["acceptance"]["mean_accepted_length"],
                "seconds": report["seconds"],
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
