"""OUT/README.md, written from the report."""

from __future__ import annotations


def write_readme(report: dict, path: str) -> None:
    corpus, target, draft, acc = report["corpus"], report["target"], report["draft"], report["acceptance"]
    rows = "\n".join(f"| {k} | {v:.3f} |" for k, v in acc["mean_accepted_length"].items())
    steps = ", ".join(f"{a:.3f}" for a in draft["heldout_accuracy_per_step"])
    timings = ", ".join(f"{k} {v:.0f}s" for k, v in report["seconds"].items())
    env = report["environment"]
    roots = ", ".join(f"`{name}` ({root})" for name, root in corpus["roots"].items())
    text = f"""# Demo model pair: a Python code model and its EAGLE-3 draft

Made by `scripts/demo_models/pipeline.py` (seed {report["seed"]}{", toy preset" if report["toy"] else ""})
on {env["device"]} with Python {env["python"]}, torch {env["torch"]}, transformers {env["transformers"]}.

## Corpus
The `.py` files of {roots} (the interpreter's standard library and installed packages,
which exist on every machine here), split by file with the seed: {corpus["num_train_files"]} train files ({corpus["train_tokens"]} tokens),
{corpus["num_heldout_files"]} held-out files ({corpus["heldout_tokens"]} tokens).
File list hash (sha256 of sorted `path<TAB>size` lines): `{corpus["file_list_sha256"]}`.

## target/
`LlamaForCausalLM`, {target["num_layers"]} layers, hidden {target["hidden_size"]},
{target["num_params"] / 1e6:.1f}M parameters, byte-level BPE with {report["tokenizer"]["vocab_size"]} tokens,
saved in bfloat16. Held-out loss {target["heldout_loss"]:.4f} (perplexity {target["heldout_perplexity"]:.2f}).

## draft/
EAGLE-3 (`LlamaForCausalLMEagle3`), {draft["num_params"] / 1e6:.1f}M parameters, draft vocabulary
{draft["draft_vocab_size"]}, aux layers {draft["aux_layer_ids"]}; {draft["loss"]}.
Held-out teacher-forced accuracy per unroll step: {steps}.

## Acceptance (chain drafting against the target's greedy continuation)
{acc["num_prompts"]} held-out prompts of {acc["prompt_len"]} tokens, {acc["gen_len"]} greedy tokens each;
mean tokens per verify step (accepted draft tokens + 1 bonus):

| k | mean accepted length |
|---|---|
{rows}

Time per stage: {timings}.
"""
    with open(path, "w") as f:
        f.write(text)
