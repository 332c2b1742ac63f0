"""EAGLEWorkerV2: EAGLE-3 speculative decoding with chain drafting (topk = 1).

Per-request state between steps, kept on the device in rows indexed like the request table:
the draft's guess d_1 for the token after the last verified one, the distribution it was drawn
from, and the draft's hidden output at the last verified position. With it, a decode step is

    draft chain   k - 1 draft forwards (DECODE, one token per request), d_2 .. d_k
    verify        the target over [x, d_1 .. d_k] (TARGET_VERIFY, k + 1 tokens per request)
    accept        greedy or chain rejection sampling (spec_sampling.py): 1 .. k + 1 tokens
    draft extend  the draft over the same k + 1 positions with the verified tokens shifted by
                  one and the target's aux hidden states (DRAFT_EXTEND); its output at the last
                  accepted position gives the next step's d_1 and hidden state.

Positions: the target's KV covers 0 .. m - 1 and x (the last output token) is at m. The chain
writes draft KV at m .. m + k - 2, the verify target KV at m .. m + k, the extend draft KV at
m .. m + k. The scheduler then frees the slots of m + num_out .. m + k (never read: later reads
are causal and stop at the last kept position). The draft's pass over a prefill is DraftCatchUp's.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Optional

import torch

from sglang.srt import bench_hooks
from sglang.srt.bench_hooks import BenchHooks
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.distributed.parallel_state import kv_heads_per_rank, tensor_parallel
from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.managers.tp_worker import GenerationBatchResult, HostCopies, TpModelWorker, token_logprobs
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
from sglang.srt.model_loader.eagle3_formats import draft_model_config
from sglang.srt.model_loader.loader import weight_bytes
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.sampling.penalties import PenaltyCounts
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
from sglang.srt.sampling.simulated_acceptance import SimulatedAcceptance
from sglang.srt.server_args import MAX_SPECULATIVE_STEPS, ServerArgs
from sglang.srt.speculative.spec_sampling import ChainVerdict, draw_draft, filtered_probs, verify_greedy, verify_sampled
from sglang.srt.speculative.spec_grammar import GrammarLookahead, masked_draft_logits
from sglang.srt.speculative.draft_catch_up import DraftCatchUp, draft_extend, rows_batch
from sglang.srt.speculative.eagle_cuda_graphs import capture_graphs
from sglang.srt.speculative.spec_policy import reachable_steps
from sglang.srt.speculative.spec_stats import SpecStats
from sglang.srt.speculative.step_costs import measure_step_costs
from sglang.srt.utils import PhaseTimer, host_to_device

logger = logging.getLogger(__name__)

# Speculative steps whose phases are timed (CUDA events, ~10 us a step): one in this many.
PHASE_TIMED_EVERY = 8


@dataclasses.dataclass
class SpecStepResult(HostCopies):
    """A speculative decode step's outcome; `wait_host` gives host copies of tokens and counts."""

    tokens: torch.Tensor  # int64[bs, k + 1], the first num_out of each row are the output
    num_out: Optional[torch.Tensor]  # int64[bs]; None for a plain step (one token each)
    token_logprobs: Optional[torch.Tensor] = None  # float32[bs, k + 1]
    top_logprobs: Optional[torch.Tensor] = None  # float32[bs, k + 1, N]
    top_logprob_ids: Optional[torch.Tensor] = None
    timer: Optional[PhaseTimer] = None
    # A plain step's free probe: whether the draft's guess d_1 was the target's token (bool[bs]).
    probe_hits: Optional[torch.Tensor] = None

    _HOST_FIELDS = ("tokens", "num_out", "token_logprobs", "top_logprobs", "top_logprob_ids", "probe_hits")


class EAGLEWorkerV2(TpModelWorker):
    """The speculative worker. Besides TpModelWorker's interface, the draft catch-up, the whole-step
    graphs and the start-up step costs use `spec_body` / `plain_body` (one step over request rows,
    device state only, so a graph can capture it), `store_next_draft`, the rows' state
    (`next_input`, `next_start`, `next_offset`), the two runners, `scratch_row` (a request-table
    row no request gets), `reachable_steps` and `step_graphs`."""

    def __init__(self, server_args: ServerArgs, model_config: ModelConfig, hooks: BenchHooks = bench_hooks.OFF):
        self.device, self.model_config, self.k = server_args.device, model_config, server_args.speculative_num_steps
        draft_config = self._make_runners(server_args, model_config)
        rows = self.model_runner.req_to_token_pool.size
        self.vocab_size = model_config.vocab_size
        # Penalties apply in the prefill, the plain step and at every verify position (the drafts
        # before it counted), never to the drafts themselves.
        self.penalty_counts = PenaltyCounts(self.vocab_size, self.device)
        self._make_row_state(rows, draft_config, server_args.grammar_backend != "none")
        self.draft_sync = server_args.speculative_draft_sync
        self.draft_catch_up = DraftCatchUp(self, rows, server_args, model_config)
        self.stats = SpecStats(self.k)
        self._steps_since_timed = 0  # see _phase_timer
        simulated = hooks.simulated_accept_length  # benchmarks only (bench_hooks.SIMULATE_ACC_LEN_ENV)
        self.simulated = None if simulated is None else SimulatedAcceptance(simulated, self.k, rows, self.device)
        self.reachable_steps = reachable_steps(server_args)  # every k > 0 the policy can choose
        self.step_graphs, self.target_step_graphs = capture_graphs(self, draft_config, model_config, server_args)
        steps = self.reachable_steps
        plan = "" if steps == [self.k] else f" (each step plain or k in {steps})" if steps else " (plain steps only)"
        logger.info(
            "EAGLE-3: draft %s (%d layer, draft vocabulary %d), k = %d, aux layers %s; policy %s%s",
            server_args.speculative_draft_model_path,
            draft_config.num_hidden_layers,
            len(self.draft_to_target),
            self.k,
            list(self.draft_runner.aux_layer_ids),
            server_args.speculative_policy,
            plan,
        )

    def _make_runners(self, server_args: ServerArgs, model_config: ModelConfig) -> ModelConfig:
        """The target's ModelRunner (its memory plan counting the draft) and the draft's."""
        path, load_format = server_args.speculative_draft_model_path, server_args.load_format
        draft_config = draft_model_config(path, server_args.dtype, self.device, model_config, load_format)
        # Verify and chain positions run up to k past a request's last kept token.
        margin = MAX_SPECULATIVE_STEPS + 1
        model_config.hf_config.max_position_embeddings = model_config.context_len + margin
        draft_config.hf_config.max_position_embeddings = model_config.context_len + margin
        heads = kv_heads_per_rank(draft_config.num_key_value_heads, tensor_parallel().size)
        draft_kv = MHATokenToKVPool.bytes_per_token(
            draft_config.dtype, heads, draft_config.head_dim, draft_config.num_hidden_layers
        )
        self.model_runner = ModelRunner(
            model_config,
            server_args,
            draft_kv_bytes_per_token=draft_kv,
            extra_positions=margin,
            reserve_bytes=weight_bytes(draft_config, load_format),
            extra_rows=1,
            capture_prefill_graphs=False,
        )
        self.scratch_row = self.model_runner.req_to_token_pool.alloc()
        self.draft_runner = ModelRunner(draft_config, server_args, target=self.model_runner)
        self.draft_model = self.draft_runner.model
        return draft_config

    def _make_row_state(self, rows: int, draft_config: ModelConfig, grammars: bool) -> None:
        zeros, draft_vocab = functools.partial(torch.zeros, device=self.device), self.draft_model.draft_vocab_size
        self.draft_to_target = self.draft_model.to_target_ids(torch.arange(draft_vocab, device=self.device))
        self.next_draft = zeros(rows, dtype=torch.int64)  # d_1, target ids
        self.next_draft_probs = zeros(rows, draft_vocab, dtype=torch.float32)
        # Constrained rows redraw d_1 under their grammar from these logits (kept while a batch has
        # a constrained request).
        self.keep_draft_logits = False
        self.next_draft_logits = zeros(rows, draft_vocab, dtype=draft_config.dtype) if grammars else None
        self.next_hidden = zeros(rows, draft_config.hidden_size, dtype=draft_config.dtype)
        # The next step's input token x (verified, no KV yet), its position m, and its output index.
        self.next_input, self.next_start, self.next_offset = (zeros(rows, dtype=torch.int64) for _ in range(3))

    def _advance_rows(self, rows, next_input, next_start, next_offset) -> None:
        self.next_input[rows] = next_input
        self.next_start[rows] = next_start
        self.next_offset[rows] = next_offset

    def forward_batch_generation(self, batch: ScheduleBatch):
        self.keep_draft_logits = batch.grammars is not None
        if not batch.forward_mode.is_decode():
            return self.forward_prefill(batch)
        if batch.spec_steps == 0:
            return self.forward_plain_step(batch)
        return self.forward_spec_step(batch)

    def prefill_pass_fits(self, num_reqs: int, num_tokens: int) -> Optional[bool]:
        """The target's answer alone. Where the target keeps a graph the draft fits too (same
        buckets; the draft drops a graph only where its eager launch wins). Past the target's graphs
        the target is device-bound, and the draft's eager launches hide behind its work; asking the
        draft there would cap a large target's prefill passes at the graphs' size."""
        return self.model_runner.prefill_pass_fits(num_reqs, num_tokens)

    def forward_prefill(self, batch: ScheduleBatch) -> GenerationBatchResult:
        fb, offsets = batch.to_forward_batch(self.device)
        # Requests admitted while speculation does not pay (Req.draft.cold) skip the draft's pass.
        warm = [i for i, req in enumerate(batch.reqs) if not req.draft.cold]
        fb.capture_aux_hidden_states = bool(warm)
        result, info = self.forward_and_sample(batch, fb, offsets)
        next_ids = result.next_token_ids
        self.draft_catch_up.prefill(batch, fb, result.logits_output.aux_hidden_states, next_ids, info, offsets, warm)
        if self.simulated is not None:
            self.simulated.admit(batch.reqs, fb.req_pool_indices)
        self._advance_rows(fb.req_pool_indices, next_ids, fb.seq_lens, offsets + 1)
        result.start_copy_to_host()
        return result

    def forward_spec_step(self, batch: ScheduleBatch) -> SpecStepResult:
        """Reads each request's input, position and output index from the device rows, so it can
        launch before the previous step's accepted lengths reach the host."""
        k, timer = batch.spec_steps, self._phase_timer()
        row_ids = [req.req_pool_idx for req in batch.reqs]
        rows = self._draft_work(batch, row_ids)
        opted = [not req.speculates for req in batch.reqs]  # rows that take plain decoding's token
        graphs = self.step_graphs.get(k)
        if _replays(graphs, batch):
            tokens, num_out = graphs.replay(row_ids, batch.out_cache_loc_host.numpy(), opted_out=opted)
            if timer is not None:
                timer.mark("step")
            return self._launched(batch, SpecStepResult(tokens=tokens, num_out=num_out, timer=timer))
        rows = host_to_device(row_ids, self.device) if rows is None else rows
        opted_out = host_to_device(opted, self.device).bool() if any(opted) else None
        info, slots = self.sampling_info(batch.reqs), self._device_slots(batch)
        grammar = None if batch.grammars is None else GrammarLookahead(batch.grammars, self.vocab_size, self.device)
        tokens, num_out, target_logits = self.spec_body(
            rows, slots, k, info, timer, opted_out=opted_out, grammar=grammar
        )
        return self._launched(batch, SpecStepResult(tokens=tokens, num_out=num_out, timer=timer), target_logits)

    def spec_body(self, rows, out_cache_loc, k: int, info, timer=None, capturing=False, opted_out=None, grammar=None):
        """One speculative step of `rows` over the slots `out_cache_loc` ([bs * (k + 1)]); returns
        (tokens [bs, k + 1], num_out [bs], target logits). All else it touches is device state, so
        a graph can capture it (`capturing`: sub-forwards run eagerly). `opted_out` (bool[bs]):
        rows that take plain decoding's token. `grammar`: the constrained rows' masks (eager only)."""
        bs, width = rows.shape[0], k + 1
        forward_target = self.model_runner.forward_eager if capturing else self.model_runner.forward
        forward_draft = self.draft_runner.forward_eager if capturing else self.draft_runner.forward
        starts = self.next_start[rows]  # m: position of each request's input token
        offsets = self.next_offset[rows]  # output index of each row's first token this step
        slots = out_cache_loc.view(bs, width)
        # The slots hold positions m .. m + k: the table is written here, as the host may not know m.
        positions = starts[:, None] + torch.arange(width, device=self.device)
        table = self.model_runner.req_to_token_pool.req_to_token
        table[rows[:, None], positions] = slots.to(table.dtype)
        drafts, draft_probs = self._draft_chain(rows, starts, offsets, slots, k, info, forward_draft, grammar)
        if timer is not None:
            timer.mark("draft")
        # The target over [x, d_1 .. d_k] at positions m .. m + k, aux states captured.
        verify_ids = torch.cat([self.next_input[rows][:, None], torch.stack(drafts, dim=1)], dim=1).reshape(-1)
        verify_fb = rows_batch(
            ForwardMode.TARGET_VERIFY, rows, verify_ids, positions.reshape(-1), starts + width, out_cache_loc, width
        )
        verify_fb.return_all_logits = verify_fb.capture_aux_hidden_states = True
        verify_out = forward_target(verify_fb)
        target_logits = verify_out.next_token_logits.view(bs, width, -1)
        verdict = self._accept(rows, target_logits, drafts, draft_probs, info, starts, offsets, opted_out, grammar)
        if timer is not None:
            timer.mark("verify")
        # Draft extend over the verified positions, fed the output tokens (shifted by one).
        extend_fb = draft_extend(verify_fb, verdict.tokens.reshape(-1), verify_out.aux_hidden_states)
        self._after_verify(rows, forward_draft(extend_fb), verdict, width, info, starts, offsets)
        if timer is not None:
            timer.mark("extend")
        return verdict.tokens, verdict.num_out, target_logits

    def _draft_chain(self, rows, starts, offsets, slots, k: int, info, forward_draft, grammar):
        """d_1 .. d_k (target ids) and, when sampling, q of each: d_1 is stored, the k - 1 forwards
        propose the rest."""
        drafts = [self.next_draft[rows]]
        draft_probs = [] if info.is_all_greedy else [self.next_draft_probs[rows]]
        if grammar is not None:  # constrained rows redraw d_1 under their grammar
            grammar.redraw_first_draft(
                self.next_draft_logits[rows], self.draft_to_target, info, offsets, drafts, draft_probs
            )
        hidden = self.next_hidden[rows]
        for j in range(1, k):
            positions, seq_lens, slot = starts + j - 1, starts + j, slots[:, j - 1].contiguous()
            fb = rows_batch(
                ForwardMode.DECODE, rows, drafts[-1], positions, seq_lens, slot, 1, spec_hidden_states=hidden
            )
            out = forward_draft(fb)
            logits = out.next_token_logits
            if grammar is not None:  # d_{j+1} under the mask after d_1 .. d_j
                grammar.advance(drafts[-1])
                logits = masked_draft_logits(logits, grammar.next_mask(), self.draft_to_target)
            drafts.append(self.draft_to_target[draw_draft(logits, info, offsets + j)])
            if not info.is_all_greedy:  # q is only read by rejection sampling
                draft_probs.append(filtered_probs(logits, info))
            hidden = out.hidden_states
        return drafts, draft_probs

    def _accept(self, rows, target_logits, drafts, draft_probs, info, starts, offsets, opted_out, grammar):
        """The verdict on the drafts (ChainVerdict), each position judged against the distribution
        plain decoding samples from there (grammar mask, penalties counting the drafts before it,
        logit_bias); opted-out rows take plain decoding's token."""
        draft_tokens = torch.stack(drafts, dim=1)
        if grammar is not None:
            grammar.advance(drafts[-1])
            grammar.next_mask()
            target_logits = target_logits.masked_fill(~grammar.verify_mask(), float("-inf"))
            grammar.rollback()
        target_logits = self.penalty_counts.apply_verify(target_logits, draft_tokens, info.penalties)
        target_logits = info.apply_logit_bias(target_logits)
        if self.simulated is not None and grammar is None:  # a grammar's batch is verified for real
            verdict = ChainVerdict(*self.simulated.verdict(target_logits, draft_tokens, starts, rows))
        elif info.is_all_greedy:
            verdict = verify_greedy(target_logits, draft_tokens)
        else:
            q = torch.stack(draft_probs, dim=1)  # float32[bs, k, draft vocab], to the target vocabulary:
            q_full = q.new_zeros(*q.shape[:2], self.vocab_size).index_add_(2, self.draft_to_target, q)
            verdict = verify_sampled(target_logits, draft_tokens, q_full, info, offsets)
        if opted_out is not None:
            plain = self.model_runner.sample(target_logits[:, 0], info, offsets)
            tokens = verdict.tokens.clone()
            tokens[:, 0] = torch.where(opted_out, plain, tokens[:, 0])
            verdict = ChainVerdict(tokens=tokens, num_out=torch.where(opted_out, 1, verdict.num_out))
        self.penalty_counts.count_accepted(verdict.tokens, verdict.num_out, info.penalties)
        return verdict

    def _after_verify(self, rows, extend_out, verdict: ChainVerdict, width: int, info, starts, offsets) -> None:
        """The rows' state for the next step, from the last accepted position."""
        last_kept = torch.arange(rows.shape[0], device=self.device) * width + verdict.num_out - 1
        logits, hidden = extend_out.next_token_logits[last_kept], extend_out.hidden_states[last_kept]
        self.store_next_draft(rows, logits, hidden, info, offsets + verdict.num_out)
        last_token = verdict.tokens.gather(1, (verdict.num_out - 1)[:, None]).squeeze(1)
        self._advance_rows(rows, last_token, starts + verdict.num_out, offsets + verdict.num_out)

    def forward_plain_step(self, batch: ScheduleBatch) -> SpecStepResult:
        """A decode step without speculation that leaves the draft current (plain_body), so the next
        step can speculate; a batch with no request the draft follows runs the target alone."""
        row_ids = [req.req_pool_idx for req in batch.reqs]
        rows = self._draft_work(batch, row_ids, catch_up=False)
        follow = any(req.speculates for req in batch.reqs)
        behind = [req.draft.behind for req in batch.reqs] if self.draft_sync == "catch-up" and follow else None
        graphs = self.step_graphs.get(0) if follow else self.target_step_graphs
        target_logits = None
        if _replays(graphs, batch):
            next_ids, hits = graphs.replay(row_ids, batch.out_cache_loc_host.numpy(), behind)
        else:
            rows = host_to_device(row_ids, self.device) if rows is None else rows
            behind = None if behind is None else host_to_device(behind, self.device)
            slots, info = self._device_slots(batch), self.sampling_info(batch.reqs)
            next_ids, target_logits, hits = self.plain_body(
                rows, slots, info, behind, draft=follow, grammars=batch.grammars
            )
        # num_out None: one token each, which the host knows without a copy.
        result = SpecStepResult(tokens=next_ids[:, None], num_out=None, probe_hits=hits)
        return self._launched(batch, result, target_logits)

    def _launched(self, batch: ScheduleBatch, result: SpecStepResult, target_logits=None) -> SpecStepResult:
        """`result` with logprobs where asked (from the raw logits, as the plain worker's), sent host-ward."""
        if any(req.return_logprob for req in batch.reqs):
            logits = target_logits if target_logits.dim() == 3 else target_logits[:, None]  # a plain step's: [bs, V]
            logprobs = token_logprobs(logits, result.tokens, max(req.top_logprobs_num for req in batch.reqs))
            result.token_logprobs, result.top_logprobs, result.top_logprob_ids = logprobs
        result.start_copy_to_host()
        return result

    def _phase_timer(self) -> Optional[PhaseTimer]:
        self._steps_since_timed = (self._steps_since_timed + 1) % PHASE_TIMED_EVERY
        return PhaseTimer(self.device) if self._steps_since_timed == 1 % PHASE_TIMED_EVERY else None

    def _draft_work(self, batch: ScheduleBatch, row_ids: list[int], catch_up: bool = True) -> Optional[torch.Tensor]:
        """The draft's passes that bring the requests it adopts (and with `catch_up` those behind it)
        level before a step; returns the rows on the device if it made them."""
        if not any(req.draft.adopting or (catch_up and req.draft.behind) for req in batch.reqs):
            return None
        rows = host_to_device(row_ids, self.device)
        self.draft_catch_up.adopt(batch, rows)
        if catch_up:
            self.draft_catch_up.catch_up(batch, rows)
        return rows

    def _device_slots(self, batch: ScheduleBatch) -> torch.Tensor:
        if batch.out_cache_loc is None:
            batch.out_cache_loc = batch.out_cache_loc_host.to(self.device, non_blocking=True)
        return batch.out_cache_loc

    def plain_body(self, rows, out_cache_loc, info, behind=None, capturing=False, draft=True, grammars=None):
        """The plain step of `rows` over the slots `out_cache_loc` ([bs]): the target decodes one
        token with aux capture, then the draft follows: a one-token extend (warm), or the aux states
        buffered at column `behind` (catch-up). Returns (tokens, target logits, probe hits or None).
        Capturable like spec_body. `draft` False: the target alone, without aux states."""
        forward_target = self.model_runner.forward_eager if capturing else self.model_runner.forward
        forward_draft = self.draft_runner.forward_eager if capturing else self.draft_runner.forward
        starts, offsets = self.next_start[rows], self.next_offset[rows]
        table = self.model_runner.req_to_token_pool.req_to_token
        table[rows, starts] = out_cache_loc.to(table.dtype)
        fb = rows_batch(ForwardMode.DECODE, rows, self.next_input[rows], starts, starts + 1, out_cache_loc, 1)
        fb.capture_aux_hidden_states = draft
        out = forward_target(fb)
        next_ids = self.model_runner.sample(self.adjust_logits(out.next_token_logits, grammars, info), info, offsets)
        self.penalty_counts.count(next_ids, info.penalties)
        hits = None
        if draft and self.draft_sync == "catch-up":
            self.draft_catch_up.buffer(rows, out.aux_hidden_states, next_ids, behind)
        elif draft:
            hits = self._keep_draft_warm(fb, out, next_ids, info, offsets, forward_draft)
        self._advance_rows(rows, next_ids, starts + 1, offsets + 1)
        return next_ids, out.next_token_logits, hits

    def _keep_draft_warm(self, fb: ForwardBatch, out, next_ids, info, offsets, forward_draft) -> torch.Tensor:
        """A warm plain step's draft extend; returns the probe hits (bool[bs]): whether the stored
        guess d_1 was the target's token, an acceptance sample for free."""
        rows, simulated = fb.req_pool_indices, self.simulated
        hits = self.next_draft[rows] == next_ids if simulated is None else simulated.probe_hits(fb.positions, rows)
        # Every token is its row's last: no host-made index, which a capture could not copy.
        draft_out = forward_draft(draft_extend(fb, next_ids, out.aux_hidden_states, return_all_logits=True))
        self.store_next_draft(rows, draft_out.next_token_logits, draft_out.hidden_states, info, offsets + 1)
        return hits

    def measure_step_costs(self, repeats: int = 3) -> dict:
        return measure_step_costs(self, repeats)

    def store_next_draft(self, rows, logits, hidden, info: SamplingBatchInfo, offsets) -> None:
        """Draw d_1 for the step after this one and keep it with q and the hidden state."""
        self.next_draft[rows] = self.draft_to_target[draw_draft(logits, info, offsets)]
        if not info.is_all_greedy:  # a greedy request never reads its q
            self.next_draft_probs[rows] = filtered_probs(logits, info)
        self.next_hidden[rows] = hidden.to(self.next_hidden.dtype)
        if self.keep_draft_logits:
            self.next_draft_logits[rows] = logits.to(self.next_draft_logits.dtype)


def _graph_sampling(reqs) -> bool:
    """Whether every request samples as the whole-step graphs do: greedy, no logit_bias or penalty."""
    params = [req.sampling_params for req in reqs]
    return all(p.is_greedy and not p.logit_bias and not p.penalized for p in params)


def _replays(graphs, batch: ScheduleBatch) -> bool:
    """Whether a step replays its whole-step graph: one fits, every request samples as it does, and
    none asks for logprobs or a grammar (whose masks are host-made)."""
    if graphs is None or batch.grammars is not None or batch.batch_size > graphs.max_bs:
        return False
    return _graph_sampling(batch.reqs) and not any(req.return_logprob for req in batch.reqs)
