"""From final hidden states to the logits the sampler (or the verifier) needs."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Optional

import torch
from torch import nn

from sglang.srt.layers.linear import linear

if TYPE_CHECKING:  # layers sit below model_executor: type names only
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch


@dataclasses.dataclass
class LogitsProcessorOutput:
    # [bs, vocab] (last token of each request) or [num_tokens, vocab] with return_all_logits; float32.
    next_token_logits: torch.Tensor
    # The captured layers' outputs concatenated: [num_tokens, len(layers) * hidden], or None.
    aux_hidden_states: Optional[torch.Tensor] = None
    # EAGLE-3 draft only: its output before the final norm for every token, [num_tokens, hidden]
    # (the next chain step's hidden input).
    hidden_states: Optional[torch.Tensor] = None


class LogitsProcessor(nn.Module):
    def forward(self, hidden: torch.Tensor, lm_head: nn.Module, forward_batch: ForwardBatch,
                aux_hidden_states: list[torch.Tensor]) -> LogitsProcessorOutput:
        """`lm_head`: a module with `weight` [vocab, hidden]; a vocabulary-parallel one's logits are
        gathered over the ranks."""
        mode = forward_batch.forward_mode
        if mode.is_extend() and not forward_batch.return_all_logits:
            hidden = hidden[forward_batch.last_token_indices()]
        logits = linear(hidden, lm_head.weight)
        if hasattr(lm_head, "gather_logits"):
            logits = lm_head.gather_logits(logits)
        out = forward_batch.logits_out
        logits = logits.float() if out is None else out[:logits.shape[0]].copy_(logits)
        aux = None
        if aux_hidden_states:
            out = forward_batch.aux_hidden_out
            if out is None:
                aux = torch.cat(aux_hidden_states, dim=-1)
            else:
                aux = torch.cat(aux_hidden_states, dim=-1, out=out[:aux_hidden_states[0].shape[0]])
        return LogitsProcessorOutput(next_token_logits=logits, aux_hidden_states=aux)
