"""Exact next-token distributions of a Hugging Face model, for distribution tests of sampling
(speculative sampling must produce the target's distribution, position by position)."""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import torch


def exact_token_distributions(
    model_path: str, prompt_ids: list[int], top_k: int, allowed: Optional[Callable[[list[int]], torch.Tensor]] = None
) -> list[torch.Tensor]:
    """The exact marginal distributions of output tokens 1, 2 and 3 (index 0, 1, 2) when sampling
    at temperature 1 from the top-k of the model's float32 logits. `allowed(output so far)`: a
    constraint's bool mask over the vocabulary, applied before the top-k (as the sampler does)."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    prompt_len = len(prompt_ids)

    def next_probs(seqs: list[list[int]]) -> torch.Tensor:
        with torch.no_grad():
            logits = model(torch.tensor(seqs)).logits[:, -1].float()
        if allowed is not None:
            masks = torch.stack([allowed(seq[prompt_len:]) for seq in seqs])
            logits = logits.masked_fill(~masks[:, : logits.shape[-1]], float("-inf"))
        top = logits.topk(top_k, dim=-1)
        probs = torch.zeros_like(logits)
        return probs.scatter_(1, top.indices, torch.softmax(top.values, dim=-1))

    p1 = next_probs([prompt_ids])[0]
    firsts = p1.nonzero().flatten().tolist()
    p2_given = next_probs([prompt_ids + [t] for t in firsts])
    p2 = (p1[firsts, None] * p2_given).sum(0)
    pairs = [(a, b) for a in firsts for b in p2_given[firsts.index(a)].nonzero().flatten().tolist()]
    p3_given = next_probs([prompt_ids + [a, b] for a, b in pairs])
    weights = torch.tensor([p1[a] * p2_given[firsts.index(a), b] for a, b in pairs])
    p3 = (weights[:, None] * p3_given).sum(0)
    return [p1, p2, p3]


def chi_square_pvalue(samples: list[int], exact: torch.Tensor) -> float:
    """Chi-square p-value of `samples` against `exact`; rare tokens (expected count < 5) are pooled
    into one bin. Raises AssertionError if a sample lies outside the exact distribution's support."""
    from scipy.stats import chisquare

    observed = np.bincount(samples, minlength=len(exact))
    support = exact.nonzero().flatten().numpy()
    assert observed.sum() == observed[support].sum(), "a sampled token lies outside the target's top-k support"
    expected = exact[support].double().numpy() * len(samples)
    keep = expected >= 5
    obs = np.append(observed[support][keep], observed[support][~keep].sum())
    exp = np.append(expected[keep], expected[~keep].sum())
    obs, exp = (obs[:-1], exp[:-1]) if exp[-1] == 0 else (obs, exp)
    return float(chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)
