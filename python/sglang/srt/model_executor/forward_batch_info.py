"""ForwardMode and ForwardBatch: what one model forward computes, as the model and the
attention backend see it."""

from __future__ import annotations

import dataclasses
import enum
import itertools
from typing import TYPE_CHECKING, Optional, Sequence

import torch

from sglang.srt.utils import host_to_device

if TYPE_CHECKING:
    from sglang.srt.layers.attention.base import AttentionBackend
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool


class ForwardMode(enum.IntEnum):
    EXTEND = enum.auto()  # prefill of new tokens over a cached prefix (also a prefill chunk)
    DECODE = enum.auto()  # one new token per request
    TARGET_VERIFY = enum.auto()  # k + 1 tokens per request, causal, logits at every token
    DRAFT_EXTEND = enum.auto()  # the draft model over the tokens just accepted
    IDLE = enum.auto()  # nothing to run on this rank

    def is_extend(self) -> bool:
        """Several tokens per request over a cached prefix (causal within the request)."""
        return self in (ForwardMode.EXTEND, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND)

    def is_decode(self) -> bool:
        return self == ForwardMode.DECODE

    def is_target_verify(self) -> bool:
        return self == ForwardMode.TARGET_VERIFY

    def is_draft_extend(self) -> bool:
        return self == ForwardMode.DRAFT_EXTEND

    def is_idle(self) -> bool:
        return self == ForwardMode.IDLE


@dataclasses.dataclass
class ForwardBatch:
    """Inputs of one forward. Tensors are on the model's device; the `*_cpu` lists are host
    copies the scheduler already had (never read back from the device)."""

    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor  # [num_tokens] int64
    positions: torch.Tensor  # [num_tokens] int64
    req_pool_indices: torch.Tensor  # [bs] int64, rows of ReqToTokenPool
    seq_lens: torch.Tensor  # [bs] int64, KV length after this forward (prefix + new tokens)
    out_cache_loc: torch.Tensor  # [num_tokens] int64, KV slots the new tokens write to
    # None where the host does not know them yet (a speculative step launched before the
    # previous one's accepted lengths came back); read `seq_lens` then.
    seq_lens_cpu: Optional[list[int]]
    extend_seq_lens_cpu: list[int]  # new tokens per request (1 per request in DECODE)
    extend_prefix_lens_cpu: Optional[list[int]]  # KV already present per request
    # Logits of every new token (TARGET_VERIFY needs them) instead of the last one per request.
    return_all_logits: bool = False
    # Prompt logprobs (a prefill pass with requests that asked, managers/input_logprobs.py): the
    # new tokens whose logits score the prompt token after them, [M] int64 indices into the token
    # dimension, and those prompt tokens, [M] int64; with the top N alternatives per row. None:
    # nobody asked (the usual case, which costs nothing; graphs never run such a pass).
    input_logprob_rows: Optional[torch.Tensor] = None
    input_logprob_targets: Optional[torch.Tensor] = None
    input_top_logprobs_num: int = 0
    # Return the hidden states of the layers the model was asked to capture (EAGLE-3 aux).
    capture_aux_hidden_states: bool = False
    # EAGLE-3 draft only: the hidden input of each token, [num_tokens, 3 * target_hidden] (the
    # target's aux hidden states, DRAFT_EXTEND) or [num_tokens, hidden] (the draft's own previous
    # output, a chain step).
    spec_hidden_states: Optional[torch.Tensor] = None
    # Device copies of the extend layout, for a graph whose layout changes from replay to replay
    # (a prefill graph): new tokens per request and each request's first token, [bs] int64; with
    # them, `extend_seq_lens_cpu` only bounds the longest request. None: built from the host lists.
    extend_seq_lens: Optional[torch.Tensor] = None
    extend_start_loc: Optional[torch.Tensor] = None
    # [bs] int64 index of each request's last new token, on the device (a prefill graph's input;
    # a scheduler's prefill sends it with its other rows); None: computed from `extend_seq_lens_cpu`.
    last_token_index: Optional[torch.Tensor] = None
    # Host copies of the token rows where the scheduler built them (a prefill's): a prefill graph
    # writes them into its inputs with the layout in one copy, instead of copying each device
    # tensor (each copy costs the host ~10 us on CUDA). None: not known on the host (read the
    # device tensors). Lists or 1-D int64 arrays, equal to the device tensors above.
    input_ids_host: Optional[Sequence[int]] = None
    positions_host: Optional[Sequence[int]] = None
    out_cache_loc_host: Optional[Sequence[int]] = None
    req_pool_indices_host: Optional[Sequence[int]] = None
    # Set by a CUDA graph runner: where the logits processor writes the logits ([num_rows, vocab]
    # float32) and the aux hidden states, views of buffers every batch size of the runner shares
    # (a graph's own outputs would stay allocated once per captured batch size). None: new tensors.
    logits_out: Optional[torch.Tensor] = None
    aux_hidden_out: Optional[torch.Tensor] = None
    # Set by the ModelRunner before the forward.
    req_to_token_pool: Optional["ReqToTokenPool"] = None
    token_to_kv_pool: Optional["MHATokenToKVPool"] = None
    attn_backend: Optional["AttentionBackend"] = None

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    def last_token_indices(self) -> torch.Tensor:
        """Index of each request's last new token in the flattened token dimension."""
        if self.last_token_index is not None:
            return self.last_token_index
        return host_to_device(
            list(itertools.accumulate(self.extend_seq_lens_cpu, initial=-1))[1:], self.input_ids.device
        )
