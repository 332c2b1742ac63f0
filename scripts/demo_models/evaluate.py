"""Evaluation without the serving engine: the target's greedy continuation of held-out prompts,
then chain drafting simulated against it (k draft steps, longest matching prefix + 1 bonus)."""

from __future__ import annotations

import numpy as np
import torch

from draft_model import Eagle3Draft, unroll
from train_draft import draft_losses, shifted, target_features
from train_target import autocast, greedy_continuation, heldout_windows


def accepted_lengths(guesses: torch.Tensor, sequence: torch.Tensor, prompt_len: int, k: int) -> list[int]:
    """Walks one sequence verify step by verify step. With tokens 0..n verified (n starts at the
    first generated token), the chain anchored at n - 1 proposes n + 1 .. n + k; guesses[a, j]
    is the step-j proposal of the chain anchored at a. Returns tokens produced per step."""
    produced, n, length = [], prompt_len, len(sequence)
    while n + k + 1 <= length - 1:
        matches = (guesses[n - 1, :k] == sequence[n + 1 : n + 1 + k]).long()
        num_accepted = int(matches.cumprod(0).sum())
        produced.append(num_accepted + 1)
        n += num_accepted + 1
    return produced


@torch.no_grad()
def acceptance_table(
    target,
    draft: Eagle3Draft,
    heldout_stream: np.ndarray,
    num_prompts: int,
    prompt_len: int,
    gen_len: int,
    max_k: int,
    device: str,
) -> dict:
    stream = torch.from_numpy(heldout_stream).long()
    stride = max(prompt_len, (len(stream) - prompt_len) // num_prompts)
    prompts = torch.stack([stream[i * stride : i * stride + prompt_len] for i in range(num_prompts)]).to(device)
    sequences = greedy_continuation(target, prompts, gen_len, device)
    aux, greedy = target_features(target, sequences, draft.aux_layer_ids, device)
    with autocast(device):
        chains = unroll(draft, target.get_input_embeddings(), aux, shifted(sequences, 1), max_k)
    guesses = torch.stack([draft.to_target_ids(logits.argmax(-1)) for logits in chains], dim=-1).cpu()
    sequences = sequences.cpu()
    consistency = (greedy[:, prompt_len - 1 : -1].cpu() == sequences[:, prompt_len:]).float().mean().item()
    table = {}
    for k in range(1, max_k + 1):
        produced = sum((accepted_lengths(g, s, prompt_len, k) for g, s in zip(guesses, sequences)), [])
        table[str(k)] = sum(produced) / len(produced)
    return {
        "mean_accepted_length": table,
        "num_prompts": num_prompts,
        "prompt_len": prompt_len,
        "gen_len": gen_len,
        "greedy_full_forward_agreement": consistency,
    }


@torch.no_grad()
def heldout_draft_accuracy(
    target, draft: Eagle3Draft, heldout_stream: np.ndarray, seq_len: int, max_windows: int, num_steps: int, device: str
) -> list[float]:
    """Teacher-forced per-step accuracy of the draft against the target's greedy tokens."""
    windows = heldout_windows(torch.from_numpy(heldout_stream).long(), seq_len, max_windows).to(device)
    aux, greedy = target_features(target, windows, draft.aux_layer_ids, device)
    with autocast(device):
        _, accuracies = draft_losses(draft, target.get_input_embeddings(), aux, windows, greedy, num_steps)
    return accuracies
