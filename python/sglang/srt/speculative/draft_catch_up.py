"""The draft's passes outside a decode step, which bring it level with the target: DRAFT_EXTENDs
over a prefill's positions (from that forward's aux hidden states), and over positions it missed
(catch-up's target-only plain steps, a request admitted without the draft), from buffered or
recomputed aux states; and the ForwardBatches of the worker's row-indexed forwards."""

from __future__ import annotations

import dataclasses
import itertools

import torch

from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.utils import host_to_device

# --speculative-draft-sync catch-up: aux hidden states kept per request for this many plain steps;
# a longer plain run is caught up by recomputing them with a target forward.
CATCH_UP_BUFFER = 64


def rows_batch(mode, rows, input_ids, positions, seq_lens, out_cache_loc, lens, **fields) -> ForwardBatch:
    """A forward over request rows (`lens`: new tokens per row, an int where alike), whose lengths
    only the device knows unless `fields` say."""
    lens = lens if isinstance(lens, list) else [lens] * rows.shape[0]
    fields = {"seq_lens_cpu": None, "extend_prefix_lens_cpu": None, "extend_seq_lens_cpu": lens, **fields}
    return ForwardBatch(mode, len(lens), input_ids, positions, rows, seq_lens, out_cache_loc, **fields)


def draft_extend(fb: ForwardBatch, input_ids: torch.Tensor, aux: torch.Tensor, **fields) -> ForwardBatch:
    """The draft's DRAFT_EXTEND over `fb`'s positions, fed `input_ids` and the target's aux states. It
    scores no prompt tokens: the target's logits give a prefill's prompt logprobs."""
    fields.update(forward_mode=ForwardMode.DRAFT_EXTEND, capture_aux_hidden_states=False, input_ids_host=None)
    fields.update(input_logprob_rows=None, input_logprob_targets=None, input_top_logprobs_num=0)
    return dataclasses.replace(fb, input_ids=input_ids, spec_hidden_states=aux, **fields)


def catch_up_pieces(behind: list[tuple[int, int]], cap: int) -> list[list[tuple[int, int, int]]]:
    """Splits a catch-up over (request index, positions behind) into forwards of at most `cap`
    positions: pieces [(index, lo, hi)] (positions counted from the first missed), a request at
    most once per piece and its segments in order."""
    pieces, current, size = [], [], 0
    for i, n in behind:
        lo = 0
        while lo < n:
            if size == cap or (current and current[-1][0] == i):  # a request's segments are consecutive
                pieces.append(current)
                current, size = [], 0
            hi = min(n, lo + cap - size)
            current.append((i, lo, hi))
            size += hi - lo
            lo = hi
    if current:
        pieces.append(current)
    return pieces


class DraftCatchUp:
    """Owns the catch-up buffers; updates the EAGLEWorkerV2's row state through its public interface
    (runners, rows, sampling_info, store_next_draft). `tokens_per_forward`: positions per catch-up
    forward (the prefill chunk size, which the memory plan leaves room for)."""

    def __init__(self, worker, rows: int, server_args, model_config):
        self.worker, self.device = worker, worker.device
        self.tokens_per_forward = server_args.chunked_prefill_size
        if server_args.speculative_draft_sync == "catch-up":
            # A spare last column takes the positions past the buffer (recomputed at the catch-up),
            # so a plain step needs no host branch.
            shape, aux_width = (rows, CATCH_UP_BUFFER + 1), 3 * model_config.hidden_size
            self.pending_aux = torch.zeros(*shape, aux_width, dtype=model_config.dtype, device=self.device)
            self.pending_tokens = torch.zeros(*shape, dtype=torch.int64, device=self.device)

    def prefill(self, batch: ScheduleBatch, fb: ForwardBatch, aux, next_ids, info, offsets, warm: list[int]) -> None:
        """The draft over the prefill `fb`'s positions of the requests `warm` (indices into the
        batch), each position fed the next prompt token (a chunk) or the sampled token (a
        prompt's end); `aux`: the target's aux states of that forward."""
        if not warm:
            return
        input_ids, finals = _shifted_tokens(batch, warm, self.device)
        if len(warm) == batch.batch_size:
            draft_fb = draft_extend(fb, input_ids, aux)
            warm_ids, warm_offsets = next_ids, offsets
        else:
            draft_fb, sub = _warm_part(fb, aux, input_ids, warm, self.device)
            info = self.worker.sampling_info([batch.reqs[i] for i in warm])
            warm_ids, warm_offsets = next_ids[sub], offsets[sub]
        last = draft_fb.last_token_indices()
        if len(finals) == len(warm):  # every prompt ends here (the common case): no row index needed
            input_ids[last] = warm_ids
        elif finals:
            rows = host_to_device(finals, self.device)  # pinned: a plain .to() would wait for the target's forward
            input_ids[last[rows]] = warm_ids[rows]
        out = self.worker.draft_runner.forward(draft_fb)
        self.worker.store_next_draft(
            draft_fb.req_pool_indices, out.next_token_logits, out.hidden_states[last], info, warm_offsets + 1
        )

    def buffer(self, rows: torch.Tensor, aux: torch.Tensor, next_ids: torch.Tensor, behind) -> None:
        """A catch-up plain step keeps each row's aux states and sampled token at column `behind`
        (None: every row at 0)."""
        columns = 0 if behind is None else behind.clamp(max=CATCH_UP_BUFFER)
        self.pending_aux[rows, columns] = aux.to(self.pending_aux.dtype)
        self.pending_tokens[rows, columns] = next_ids

    def adopt(self, batch: ScheduleBatch, rows: torch.Tensor) -> None:
        """Requests the draft adopts (Req.draft.adopting, admitted without its pass): DRAFT_EXTENDs
        over each one's whole context from recomputed aux states, leaving what a warm draft would.
        SpecScheduling marks them adopted as the step launches."""
        adopting = [(i, req.kv_len) for i, req in enumerate(batch.reqs) if req.draft.adopting]
        for piece in catch_up_pieces(adopting, self.tokens_per_forward):
            self._piece(batch, rows, piece, dict(adopting), recompute=True)

    def catch_up(self, batch: ScheduleBatch, rows: torch.Tensor) -> None:
        """Before a speculative step: DRAFT_EXTENDs over the positions each request decoded in plain
        steps since the draft last caught up (buffered, or recomputed past the buffer), leaving what
        a warm draft would. SpecScheduling counts them caught up as the step launches (only catch-up
        plain steps leave a request behind)."""
        behind = [(i, req.draft.behind) for i, req in enumerate(batch.reqs) if req.draft.behind > 0]
        for piece in catch_up_pieces(behind, self.tokens_per_forward):
            self._piece(batch, rows, piece, dict(behind))

    def _piece(self, batch: ScheduleBatch, rows, piece: list[tuple[int, int, int]], behind_of: dict, recompute=False):
        """One DRAFT_EXTEND over positions m - n + lo .. m - n + hi - 1 of each (request index, lo,
        hi) in `piece` (m: its next position, n = behind_of[index]); aux states from the buffer, or
        (`recompute`, or a run past the buffer) a target forward."""
        worker, device = self.worker, self.device
        idx = [i for i, _, _ in piece]
        reqs, behind = [batch.reqs[i] for i in idx], [behind_of[i] for i in idx]
        lens = [hi - lo for _, lo, hi in piece]
        rows_sub = rows[host_to_device(idx, device)] if len(idx) < len(batch.reqs) else rows
        lens_dev, total = host_to_device(lens, device), sum(lens)
        base = worker.next_start[rows_sub] - host_to_device(behind, device)  # m - n
        ends = base + host_to_device([hi for _, _, hi in piece], device)  # one past each segment's last position
        columns = host_to_device([lo + j for _, lo, hi in piece for j in range(hi - lo)], device)  # offsets from m - n
        row_rep = torch.repeat_interleave(rows_sub, lens_dev, output_size=total)
        positions = torch.repeat_interleave(base, lens_dev, output_size=total) + columns
        last = host_to_device([end - 1 for end in itertools.accumulate(lens)], device)
        if not recompute and all(n <= CATCH_UP_BUFFER for n in behind):
            input_ids, aux = self.pending_tokens[row_rep, columns], self.pending_aux[row_rep, columns]
        else:
            input_ids, aux = self._recompute_aux(reqs, behind, piece, rows_sub, ends, positions, last)
        slots = worker.model_runner.req_to_token_pool.req_to_token[row_rep, positions].to(torch.int64)
        fb = rows_batch(
            ForwardMode.DRAFT_EXTEND, rows_sub, input_ids, positions, ends, slots, lens, spec_hidden_states=aux
        )
        out = worker.draft_runner.forward(fb)
        info = worker.sampling_info(reqs)
        # Logits come per request, hidden states per token; a request's later piece overwrites.
        worker.store_next_draft(
            rows_sub, out.next_token_logits, out.hidden_states[last], info, worker.next_offset[rows_sub]
        )

    def _recompute_aux(self, reqs, behind, piece, rows_sub, ends, positions, last):
        """(the draft's inputs, aux states) of a piece's positions, from a target forward over their
        host-known tokens whose KV goes to the padding slot (the target's own KV stays as decoded)."""
        tokens, shifted, prefix, seq_ends, at_end = [], [], [], [], []
        for j, (req, n, (_, lo, hi)) in enumerate(zip(reqs, behind, piece)):
            m = req.kv_len  # no speculative step of this request is in flight
            first, stop = m - n + lo, m - n + hi
            ids = req.all_ids
            tokens.extend(ids[first:stop])
            if stop == m:  # the last one's next token is the one in flight, filled in below
                shifted.extend(ids[first + 1 : stop] + [0])
                at_end.append(j)
            else:
                shifted.extend(ids[first + 1 : stop + 1])
            prefix.append(first)
            seq_ends.append(stop)
        token_ids, padding = host_to_device(tokens, self.device), torch.zeros_like(positions)  # KV to slot 0
        lens = [hi - lo for _, lo, hi in piece]
        fields = dict(seq_lens_cpu=seq_ends, extend_prefix_lens_cpu=prefix, capture_aux_hidden_states=True)
        fb = rows_batch(ForwardMode.EXTEND, rows_sub, token_ids, positions, ends, padding, lens, **fields)
        out = self.worker.model_runner.forward(fb)
        input_ids = host_to_device(shifted, self.device)
        if at_end:
            at = host_to_device(at_end, self.device)
            input_ids[last[at]] = self.worker.next_input[rows_sub[at]]
        return input_ids, out.aux_hidden_states


def _shifted_tokens(batch: ScheduleBatch, warm: list[int], device) -> tuple[torch.Tensor, list[int]]:
    """The draft's input ids (each position's next token; 0 for the token sampled at a prompt's end,
    filled in on the device) and the indices into `warm` of the prompts that end here."""
    shifted, finals = [], []
    for j, i in enumerate(warm):
        req = batch.reqs[i]
        end = req.kv_len + req.extend_len
        if end < req.seq_len:  # a chunk: the next prompt token follows
            shifted.extend(req.token_slice(req.kv_len + 1, end + 1))
        else:  # the prompt's end: the token sampled there follows
            shifted.extend(req.token_slice(req.kv_len + 1, end) + [0])
            finals.append(j)
    return host_to_device(shifted, device), finals


def _warm_part(fb: ForwardBatch, aux: torch.Tensor, input_ids: torch.Tensor, warm: list[int], device):
    """The DRAFT_EXTEND over the prefill `fb`'s requests `warm`, and those indices on the device."""
    starts = [0, *itertools.accumulate(fb.extend_seq_lens_cpu)]
    tokens = host_to_device([t for i in warm for t in range(starts[i], starts[i + 1])], device)
    sub = host_to_device(warm, device)
    lens, seq_lens_cpu, prefix = (
        [host[i] for i in warm] for host in (fb.extend_seq_lens_cpu, fb.seq_lens_cpu, fb.extend_prefix_lens_cpu)
    )
    rows, positions, slots = fb.req_pool_indices[sub], fb.positions[tokens], fb.out_cache_loc[tokens]
    fields = dict(seq_lens_cpu=seq_lens_cpu, extend_prefix_lens_cpu=prefix, spec_hidden_states=aux[tokens])
    return rows_batch(
        ForwardMode.DRAFT_EXTEND, rows, input_ids, positions, fb.seq_lens[sub], slots, lens, **fields
    ), sub
