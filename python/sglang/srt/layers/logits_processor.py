"""From final hidden states to the logits the sampler (or the verifier) needs, and the prompt
logprobs of a prefill pass whose requests asked for them."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Optional

import torch
from torch import nn

from sglang.srt.layers.linear import linear

if TYPE_CHECKING:  # layers sit below model_executor: type names only
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

# Prompt logprobs are computed a piece of rows at a time, each piece's float32 logits within
# this many elements (512 MB; at most SCORE_MAX_ROWS rows): an 8K-token prompt on a 128K
# vocabulary would otherwise hold 4 GB of logits at once.
SCORE_MAX_ELEMENTS = 1 << 27
SCORE_MAX_ROWS = 1024


@dataclasses.dataclass
class LogitsProcessorOutput:
    # [bs, vocab] (last token of each request) or [num_tokens, vocab] with return_all_logits; float32.
    next_token_logits: torch.Tensor
    # The captured layers' outputs concatenated: [num_tokens, len(layers) * hidden], or None.
    aux_hidden_states: Optional[torch.Tensor] = None
    # EAGLE-3 draft only: its output before the final norm for every token, [num_tokens, hidden]
    # (the next chain step's hidden input).
    hidden_states: Optional[torch.Tensor] = None
    # Prompt logprobs (ForwardBatch.input_logprob_rows given): per scored row, the logprob of the
    # prompt token after it, float32 [M]; with top N, the N best, float32 [M, N] and int64 ids.
    input_token_logprobs: Optional[torch.Tensor] = None
    input_top_logprobs: Optional[torch.Tensor] = None
    input_top_logprob_ids: Optional[torch.Tensor] = None


class LogitsProcessor(nn.Module):
    def forward(
        self,
        hidden: torch.Tensor,
        lm_head: nn.Module,
        forward_batch: ForwardBatch,
        aux_hidden_states: list[torch.Tensor],
    ) -> LogitsProcessorOutput:
        """`lm_head`: a module with `weight` [vocab, hidden]; a vocabulary-parallel one's logits are
        gathered over the ranks."""
        scored = None
        if forward_batch.input_logprob_rows is not None:
            scored = score_tokens(
                hidden,
                lm_head,
                forward_batch.input_logprob_rows,
                forward_batch.input_logprob_targets,
                forward_batch.input_top_logprobs_num,
            )
        if forward_batch.forward_mode.is_extend() and not forward_batch.return_all_logits:
            hidden = hidden[forward_batch.last_token_indices()]
        logits = _logits(hidden, lm_head)
        out = forward_batch.logits_out
        logits = logits.float() if out is None else out[: logits.shape[0]].copy_(logits)
        aux = None
        if aux_hidden_states:
            out = forward_batch.aux_hidden_out
            if out is None:
                aux = torch.cat(aux_hidden_states, dim=-1)
            else:
                aux = torch.cat(aux_hidden_states, dim=-1, out=out[: aux_hidden_states[0].shape[0]])
        result = LogitsProcessorOutput(next_token_logits=logits, aux_hidden_states=aux)
        if scored is not None:
            result.input_token_logprobs, result.input_top_logprobs, result.input_top_logprob_ids = scored
        return result


def _logits(hidden: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
    logits = linear(hidden, lm_head.weight)
    return lm_head.gather_logits(logits) if hasattr(lm_head, "gather_logits") else logits


def score_tokens(
    hidden: torch.Tensor, lm_head: nn.Module, rows: torch.Tensor, targets: torch.Tensor, top_n: int
) -> tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]:
    """Log-softmax of the raw logits at `rows` of `hidden`, as output logprobs are: of each row's
    target token [M], and (top_n > 0) its top_n best [M, top_n] with their ids. Only those rows go
    through the lm_head, a piece at a time (SCORE_MAX_ELEMENTS), so no [M, vocab] tensor is made."""
    vocab = getattr(lm_head, "full_shape", lm_head.weight.shape)[0]
    step = max(1, min(SCORE_MAX_ROWS, SCORE_MAX_ELEMENTS // vocab))
    token, top, top_ids = [], [], []
    for begin in range(0, rows.shape[0], step):
        logits = _logits(hidden[rows[begin : begin + step]], lm_head).float()
        norm = torch.logsumexp(logits, dim=-1, keepdim=True)
        token.append(logits.gather(1, targets[begin : begin + step, None]).sub_(norm).squeeze(1))
        if top_n > 0:
            values, ids = logits.topk(top_n, dim=-1)
            top.append(values.sub_(norm))
            top_ids.append(ids)
    if top_n <= 0:
        return torch.cat(token), None, None
    return torch.cat(token), torch.cat(top), torch.cat(top_ids)
