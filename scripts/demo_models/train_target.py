"""The target: a small LlamaForCausalLM trained from scratch on the token stream, then rounded
to bfloat16 so that the model in memory is exactly the checkpoint that gets saved."""

from __future__ import annotations

import json
import math
import os
import time
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

from tokenizer import CHAT_TEMPLATE


@dataclass(frozen=True)
class TargetSpec:
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    seq_len: int
    batch_size: int
    steps: int
    lr: float
    warmup_steps: int


def autocast(device: str):
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.startswith("cuda") else nullcontext()


def build_target(spec: TargetSpec, vocab_size: int, eos_token_id: int) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_heads,
        max_position_embeddings=max(2048, 2 * spec.seq_len),
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        initializer_range=0.02,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=eos_token_id,
        pad_token_id=eos_token_id,
    )
    # Eager attention: its backward is deterministic, unlike the fused SDPA kernels (cuDNN's
    # made two same-seed H200 runs differ by 1.1% in held-out loss), so a re-run reproduces.
    config._attn_implementation = "eager"
    return LlamaForCausalLM(config)


def random_windows(stream: torch.Tensor, length: int, batch_size: int, generator: torch.Generator):
    starts = torch.randint(0, len(stream) - length, (batch_size,), generator=generator)
    return torch.stack([stream[s : s + length] for s in starts.tolist()])


def heldout_windows(stream: torch.Tensor, length: int, max_windows: int) -> torch.Tensor:
    """Up to `max_windows` non-overlapping windows spread evenly over the whole stream."""
    total = len(stream) // length
    picks = torch.linspace(0, total - 1, min(max_windows, total)).long()
    return stream[: total * length].view(total, length)[picks]


def lr_at(step: int, spec: TargetSpec) -> float:
    """Linear warm-up, then cosine decay to a tenth of the peak."""
    if step < spec.warmup_steps:
        return spec.lr * (step + 1) / spec.warmup_steps
    progress = (step - spec.warmup_steps) / max(1, spec.steps - spec.warmup_steps)
    return spec.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))


def train_target(
    model: LlamaForCausalLM, train_stream: np.ndarray, spec: TargetSpec, seed: int, device: str, log_every: int = 100
) -> list[float]:
    stream = torch.from_numpy(train_stream).long()
    generator = torch.Generator().manual_seed(seed)
    model.to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.lr, betas=(0.9, 0.95), weight_decay=0.1)
    losses, start = [], time.time()
    for step in range(spec.steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, spec)
        batch = random_windows(stream, spec.seq_len, spec.batch_size, generator).to(device)
        with autocast(device):
            loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if log_every and (step % log_every == 0 or step == spec.steps - 1):
            print(f"[target] step {step} loss {losses[-1]:.4f} ({time.time() - start:.0f}s)", flush=True)
    model.eval()
    return losses


@torch.no_grad()
def greedy_continuation(target, prompts: torch.Tensor, num_tokens: int, device: str) -> torch.Tensor:
    """prompts [n, p] -> [n, p + num_tokens], decoding with the KV cache and ignoring EOS."""
    with autocast(device):
        out = target(input_ids=prompts, use_cache=True)
        tokens = [out.logits[:, -1].argmax(-1)]
        for _ in range(num_tokens - 1):
            out = target(input_ids=tokens[-1][:, None], past_key_values=out.past_key_values, use_cache=True)
            tokens.append(out.logits[:, -1].argmax(-1))
    return torch.cat([prompts, torch.stack(tokens, dim=1)], dim=1)


def round_to_bfloat16(model: torch.nn.Module) -> None:
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(param.to(torch.bfloat16).float())


@torch.no_grad()
def heldout_loss(
    model: LlamaForCausalLM, heldout_stream: np.ndarray, seq_len: int, device: str, max_windows: int, batch_size: int
) -> float:
    windows = heldout_windows(torch.from_numpy(heldout_stream).long(), seq_len, max_windows)
    total, count = 0.0, 0
    for batch in windows.split(batch_size):
        batch = batch.to(device)
        with autocast(device):
            logits = model(input_ids=batch).logits.float()
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), batch[:, 1:].flatten(), reduction="sum")
        total, count = total + loss.item(), count + batch[:, 1:].numel()
    return total / count


def save_target(model: LlamaForCausalLM, tokenizer, path: str) -> None:
    model.config.dtype = torch.bfloat16
    model.to(torch.bfloat16).save_pretrained(path)
    model.float()
    save_tokenizer(tokenizer, path, model.config.max_position_embeddings)
    GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id, bos_token_id=None
    ).save_pretrained(path)


def save_tokenizer(tokenizer, path: str, max_length: int) -> None:
    """Also writes the chat template and a plain tokenizer class into tokenizer_config.json, so
    that loaders older than transformers' chat_template.jinja file find them."""
    tokenizer.save_pretrained(path)
    config_path = os.path.join(path, "tokenizer_config.json")
    with open(config_path) as f:
        config = json.load(f)
    config.update(tokenizer_class="PreTrainedTokenizerFast", chat_template=CHAT_TEMPLATE, model_max_length=max_length)
    with open(config_path, "w") as f:
        json.dump(config, f, indent=2)
