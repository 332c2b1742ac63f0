"""The agreement criterion of an FP8 path with its float reference: over 16 prompts, the first
greedy tokens agree on at least MIN_AGREEING, the logits move by at most MAX_NOISE of their spread,
and every token that differs is a near tie that this noise explains (the criterion of
test_fp8_checkpoints, as one object for the tests of the other FP8 paths)."""

from __future__ import annotations

import torch

MIN_AGREEING = 15
# How far quantization may move the logits: the RMS over the vocabulary of the FP8 path's minus the
# reference's logits, in standard deviations of the reference's. On the sharp fixtures
# (make_sharp_tiny_model) e4m3 rounding moves them by about 1%; a misapplied weight or KV-cache scale
# (measured: weight scales doubled, k/v scales 16 times too small) by 10% or more.
MAX_NOISE = 0.03
# A token may differ where the FP8 path's token is within reach of the reference's top token: its
# gap below the difference of two logits each moved by about `noise`, bounded at four standard
# deviations of that difference (sqrt(2) * noise each).
TIE_BOUND = 4 * 2**0.5


class Agreement:
    """First tokens (the argmax of each prompt's last logits) and logits of an FP8 path [P, V]
    against its reference's."""

    def __init__(self, fp8_logits: torch.Tensor, reference: torch.Tensor):
        spread = reference.std(dim=-1)
        self.prompts = reference.shape[0]
        self.noise = (fp8_logits - reference).pow(2).mean(dim=-1).sqrt() / spread  # per prompt
        got, want = fp8_logits.argmax(dim=-1), reference.argmax(dim=-1)
        self.tokens = got.tolist()
        self.differ = (got != want).nonzero().flatten().tolist()
        # the reference's lead of its top token over the FP8 path's, in its logits' deviations
        self.gaps = [((reference[i].max() - reference[i, got[i]]) / spread[i]).item() for i in self.differ]

    @property
    def agreeing(self) -> int:
        return self.prompts - len(self.differ)

    def holds(self) -> bool:
        explained = all(gap < TIE_BOUND * self.noise[i] for i, gap in zip(self.differ, self.gaps))
        return self.noise.max() <= MAX_NOISE and self.agreeing >= MIN_AGREEING and explained

    def summary(self) -> str:
        gaps = ", ".join(f"{gap:.4f} (noise {self.noise[i]:.4f})" for i, gap in zip(self.differ, self.gaps))
        return (
            f"first tokens agree on {self.agreeing} of {self.prompts}; logit noise {self.noise.mean():.4f} "
            f"mean, {self.noise.max():.4f} max; gaps where they differ: [{gaps}]"
        )
