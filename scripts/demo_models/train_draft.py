"""Draft training: target aux hidden states and greedy tokens computed on the fly from train
windows and from the target's own greedy continuations (a pool generated once, as EAGLE-3
regenerates its data with the target), then a training-time-test unroll of the draft with per-step decaying loss weights.

Loss: cross-entropy against the target's greedy next token (mapped into the draft vocabulary;
positions whose greedy token is outside it are skipped), which is what greedy acceptance
rewards."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from torch.nn import functional as F

from draft_model import Eagle3Draft, unroll
from train_target import autocast, greedy_continuation, random_windows


@dataclass(frozen=True)
class DraftSpec:
    draft_vocab_size: int
    unroll_steps: int
    step_weight_decay: float
    seq_len: int
    batch_size: int
    steps: int
    lr: float
    warmup_steps: int
    generated_fraction: float  # share of each batch taken from the generated pool
    pool_size: int  # generated sequences: a quarter corpus prompt, then greedy tokens


@torch.no_grad()
def target_features(target, tokens: torch.Tensor, aux_layer_ids: list[int], device: str):
    """(aux [batch, seq, 3h] in float32, greedy [batch, seq]: the target's argmax at each position)."""
    with autocast(device):
        out = target(input_ids=tokens, output_hidden_states=True)
    aux = torch.cat([out.hidden_states[i + 1] for i in aux_layer_ids], dim=-1).float()
    return aux, out.logits.argmax(-1)


def shifted(tokens: torch.Tensor, by: int, fill: int = 0) -> torch.Tensor:
    """tokens[:, t + by] at index t, `fill` past the end."""
    out = torch.full_like(tokens, fill)
    out[:, : tokens.shape[1] - by] = tokens[:, by:]
    return out


def unroll_targets(tokens, greedy, num_steps: int):
    """Per step j: the forced embedding input x_{t+1+j} (corpus token; j = 0 is the first input)
    and the label, the target's greedy guess for position t+2+j; labels past the end are -1."""
    inputs = [shifted(tokens, 1 + j) for j in range(num_steps)]
    labels = [shifted(greedy, 1 + j, fill=-1) for j in range(num_steps)]
    return inputs, labels


def draft_losses(draft: Eagle3Draft, embed, aux, tokens, greedy, num_steps: int):
    """(loss per step, accuracy per step) of a teacher-forced unroll."""
    inputs, labels = unroll_targets(tokens, greedy, num_steps)
    all_logits = unroll(draft, embed, aux, inputs[0], num_steps, forced_tokens=inputs[1:])
    losses, accuracies = [], []
    for logits, label in zip(all_logits, labels):
        valid = label >= 0
        draft_label = torch.where(valid, draft.target_to_draft[label.clamp(min=0)], -100)
        losses.append(F.cross_entropy(logits.float().flatten(0, 1), draft_label.flatten(), ignore_index=-100))
        guess = draft.to_target_ids(logits.argmax(-1))
        accuracies.append(((guess == label) & valid).sum().item() / max(1, valid.sum().item()))
    return losses, accuracies


def pick_draft_vocab(train_stream: np.ndarray, vocab_size: int, draft_vocab_size: int) -> torch.Tensor:
    """The most frequent target tokens of the train split (ties broken by id)."""
    counts = torch.bincount(torch.from_numpy(train_stream).long(), minlength=vocab_size)
    order = sorted(range(vocab_size), key=lambda i: (-counts[i].item(), i))
    return torch.tensor(sorted(order[:draft_vocab_size]), dtype=torch.long)


@torch.no_grad()
def generate_pool(
    target, stream: torch.Tensor, spec: DraftSpec, generator, device: str, batch_size: int = 512
) -> torch.Tensor:
    prompt_len = spec.seq_len // 4
    pieces = []
    for start in range(0, spec.pool_size, batch_size):
        count = min(batch_size, spec.pool_size - start)
        prompts = random_windows(stream, prompt_len, count, generator).to(device)
        pieces.append(greedy_continuation(target, prompts, spec.seq_len - prompt_len, device))
    return torch.cat(pieces) if pieces else torch.empty(0, spec.seq_len, dtype=torch.long, device=device)


def training_batch(stream, pool, spec: DraftSpec, generator, device: str) -> torch.Tensor:
    num_generated = round(spec.batch_size * spec.generated_fraction) if len(pool) else 0
    corpus = random_windows(stream, spec.seq_len, spec.batch_size - num_generated, generator).to(device)
    picks = torch.randint(0, max(1, len(pool)), (num_generated,), generator=generator)
    return torch.cat([corpus, pool[picks.to(pool.device)]])


def train_draft(
    draft: Eagle3Draft, target, train_stream: np.ndarray, spec: DraftSpec, seed: int, device: str, log_every: int = 100
) -> list[float]:
    stream = torch.from_numpy(train_stream).long()
    generator = torch.Generator().manual_seed(seed + 1)
    embed = target.get_input_embeddings()
    pool = generate_pool(target, stream, spec, generator, device)
    draft.to(device).train()
    optimizer = torch.optim.AdamW(draft.parameters(), lr=spec.lr, betas=(0.9, 0.95), weight_decay=0.0)
    weights = [spec.step_weight_decay**j for j in range(spec.unroll_steps)]
    history, start = [], time.time()
    for step in range(spec.steps):
        for group in optimizer.param_groups:
            group["lr"] = spec.lr * min(1.0, (step + 1) / spec.warmup_steps) * (1 - 0.9 * step / spec.steps)
        tokens = training_batch(stream, pool, spec, generator, device)
        aux, greedy = target_features(target, tokens, draft.aux_layer_ids, device)
        with autocast(device):
            losses, accuracies = draft_losses(draft, embed, aux, tokens, greedy, spec.unroll_steps)
            loss = sum(w * loss_i for w, loss_i in zip(weights, losses)) / sum(weights)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        history.append(loss.item())
        if log_every and (step % log_every == 0 or step == spec.steps - 1):
            acc = " ".join(f"{a:.2f}" for a in accuracies)
            print(f"[draft] step {step} loss {history[-1]:.4f} acc/step {acc} ({time.time() - start:.0f}s)", flush=True)
    draft.eval()
    return history
