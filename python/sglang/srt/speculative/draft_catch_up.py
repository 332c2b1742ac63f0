"""--speculative-draft-sync catch-up and adoption: the draft brought up to date over positions it
missed (plain steps that ran the target only, or a request admitted without the draft), by
DRAFT_EXTENDs over buffered or recomputed aux hidden states. DraftCatchUp owns the buffers and
updates the worker's row state through its public interface."""

from __future__ import annotations

import itertools

import torch

from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.utils import host_to_device

# --speculative-draft-sync catch-up: aux hidden states kept per request for this many plain steps;
# a longer plain run is caught up by recomputing them with a target forward.
CATCH_UP_BUFFER = 64


def catch_up_pieces(behind: list[tuple[int, int]], cap: int) -> list[list[tuple[int, int, int]]]:
    """Splits a catch-up over (request index, positions behind) into forwards of at most `cap`
    positions: each piece is [(index, lo, hi)] (the request's positions lo .. hi - 1 counted
    from the first it missed), a request at most once per piece and its segments in order."""
    pieces: list[list[tuple[int, int, int]]] = []
    current: list[tuple[int, int, int]] = []
    size = 0
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
    """The draft's passes over positions it missed, for an EAGLEWorkerV2 (`worker`: its runners,
    its rows' state on the device, sampling_info and store_next_draft). `tokens_per_forward`:
    positions per catch-up forward (the prefill chunk size, which the memory plan leaves room
    for); `buffered`: whether plain steps keep their aux states (--speculative-draft-sync
    catch-up), of `aux_width` per position."""

    def __init__(self, worker, rows: int, tokens_per_forward: int, buffered: bool, aux_width: int, aux_dtype):
        self.worker, self.device = worker, worker.device
        self.tokens_per_forward = tokens_per_forward
        self.buffered = buffered
        if buffered:
            # One column more than the buffer holds: positions past it are written there and
            # dropped (the catch-up recomputes them), so a plain step needs no host branch.
            shape = (rows, CATCH_UP_BUFFER + 1)
            self.pending_aux = torch.zeros(*shape, aux_width, dtype=aux_dtype, device=self.device)
            self.pending_tokens = torch.zeros(*shape, dtype=torch.int64, device=self.device)

    def buffer(self, rows: torch.Tensor, aux: torch.Tensor, next_ids: torch.Tensor, behind: torch.Tensor) -> None:
        """A catch-up plain step keeps each row's aux states and sampled token at column `behind`
        of its buffer; past the buffer they go to the spare last column and are dropped (the
        catch-up then recomputes them)."""
        columns = behind.clamp(max=CATCH_UP_BUFFER)
        self.pending_aux[rows, columns] = aux.to(self.pending_aux.dtype)
        self.pending_tokens[rows, columns] = next_ids

    def adopt(self, batch: ScheduleBatch, rows: torch.Tensor) -> None:
        """Requests the draft adopts (Req.draft.adopting; admitted without its pass over their
        prompt): DRAFT_EXTENDs over each one's whole context, from aux states a target forward
        recomputes, so its draft KV, hidden state and guess d_1 are a warm draft's. The host
        knows every position's token: the steps since admission were plain, all processed but
        the one in flight (whose token the device holds). The scheduler (SpecScheduling) marks
        them adopted as the step launches."""
        adopting = [(i, req.kv_len) for i, req in enumerate(batch.reqs) if req.draft.adopting]
        for piece in catch_up_pieces(adopting, self.tokens_per_forward):
            self._piece(batch, rows, piece, dict(adopting), recompute=True)

    def catch_up(self, batch: ScheduleBatch, rows: torch.Tensor) -> None:
        """Before a speculative step: DRAFT_EXTENDs over the positions each request decoded in
        plain steps since the draft last caught up (from the buffered aux states and tokens, or
        from a target forward that recomputes them when a request's run outgrew the buffer), so
        the draft's KV, hidden state and guess d_1 are those a warm draft would have. One
        forward when the positions fit `tokens_per_forward`; more, in position order per request,
        when they do not.
        The scheduler (SpecScheduling) counts them caught up as the step launches."""
        if not self.buffered:
            return
        behind = [(i, req.draft.behind) for i, req in enumerate(batch.reqs) if req.draft.behind > 0]
        for piece in catch_up_pieces(behind, self.tokens_per_forward):
            self._piece(batch, rows, piece, dict(behind))

    def _piece(
        self,
        batch: ScheduleBatch,
        rows: torch.Tensor,
        piece: list[tuple[int, int, int]],
        behind_of: dict[int, int],
        recompute: bool = False,
    ) -> None:
        """One DRAFT_EXTEND over positions m - n + lo .. m - n + hi - 1 of each (request index,
        lo, hi) in `piece`, where m is the request's next position and n = behind_of[index] the
        positions it is behind; aux states from the catch-up buffer, or (`recompute`, or a run past
        the buffer) a target forward."""
        worker, device = self.worker, self.device
        idx = [i for i, _, _ in piece]
        reqs = [batch.reqs[i] for i in idx]
        behind = [behind_of[i] for i in idx]
        lens = [hi - lo for _, lo, hi in piece]
        total = sum(lens)
        rows_sub = rows[host_to_device(idx, device)] if len(idx) < len(batch.reqs) else rows
        lens_dev = host_to_device(lens, device)
        lo_dev = host_to_device([lo for _, lo, _ in piece], device)
        base = worker.next_start[rows_sub] - host_to_device(behind, device)  # m - n
        ends = base + lo_dev + lens_dev  # one past each segment's last position
        local = host_to_device([j for n in lens for j in range(n)], device)
        row_rep = torch.repeat_interleave(rows_sub, lens_dev, output_size=total)
        columns = torch.repeat_interleave(lo_dev, lens_dev, output_size=total) + local  # offsets from m - n
        positions = torch.repeat_interleave(base, lens_dev, output_size=total) + columns
        last = host_to_device([end - 1 for end in itertools.accumulate(lens)], device)
        if not recompute and all(n <= CATCH_UP_BUFFER for n in behind):
            input_ids, aux = self.pending_tokens[row_rep, columns], self.pending_aux[row_rep, columns]
        else:
            input_ids, aux = self._recompute_aux(reqs, behind, piece, rows_sub, ends, positions, last)
        table = worker.model_runner.req_to_token_pool.req_to_token
        fb = ForwardBatch(
            forward_mode=ForwardMode.DRAFT_EXTEND,
            batch_size=len(idx),
            input_ids=input_ids,
            positions=positions,
            req_pool_indices=rows_sub,
            seq_lens=ends,
            out_cache_loc=table[row_rep, positions].to(torch.int64),
            seq_lens_cpu=None,
            extend_seq_lens_cpu=lens,
            extend_prefix_lens_cpu=None,
            spec_hidden_states=aux,
        )
        out = worker.draft_runner.forward(fb)
        info = worker.sampling_info(reqs)
        # Logits come per request (its last position), hidden states per token. A later piece
        # of the same request overwrites what an earlier one stored.
        worker.store_next_draft(
            rows_sub, out.next_token_logits, out.hidden_states[last], info, worker.next_offset[rows_sub]
        )

    def _recompute_aux(self, reqs, behind, piece, rows_sub, ends, positions, last):
        """The aux states of a piece's positions, from a target forward over their tokens
        (host-known: the steps since are plain, and all but the one in flight are processed). Its
        KV goes to the padding slot: the target's own KV stays as decoded. Returns the draft's
        inputs (each position's next token) and the aux states."""
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
        fb = ForwardBatch(
            forward_mode=ForwardMode.EXTEND,
            batch_size=len(reqs),
            input_ids=host_to_device(tokens, self.device),
            positions=positions,
            req_pool_indices=rows_sub,
            seq_lens=ends,
            out_cache_loc=torch.zeros(len(tokens), dtype=torch.int64, device=self.device),
            seq_lens_cpu=seq_ends,
            extend_seq_lens_cpu=[hi - lo for _, lo, hi in piece],
            extend_prefix_lens_cpu=prefix,
            capture_aux_hidden_states=True,
        )
        out = self.worker.model_runner.forward(fb)
        input_ids = host_to_device(shifted, self.device)
        if at_end:
            at = host_to_device(at_end, self.device)
            input_ids[last[at]] = self.worker.next_input[rows_sub[at]]
        return input_ids, out.aux_hidden_states
