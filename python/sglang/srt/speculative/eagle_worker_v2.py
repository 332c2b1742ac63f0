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

Positions: the step starts with the target's KV covering 0 .. m - 1 and x (the last output
token) at position m. The scheduler allocates slots for m .. m + k; the chain writes its draft
KV at m .. m + k - 2, the verify writes target KV at m .. m + k, the extend overwrites the draft
KV at m .. m + k with its step-0 entries. After acceptance of num_out tokens, the slots of
positions m + num_out .. m + k are freed by the scheduler (their entries are never read: every
later read is causal and stops at the last kept position).

A prefill (EXTEND) runs the target with aux capture, samples the first token, then extends the
draft over the same positions with the tokens shifted by one (the last one is the next prompt
token for a chunk, the sampled token otherwise).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from typing import Optional

import torch

from sglang.srt import bench_hooks
from sglang.srt.bench_hooks import BenchHooks
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.distributed.parallel_state import kv_heads_per_rank, tensor_parallel
from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.managers.tp_worker import GenerationBatchResult, HostCopies, TpModelWorker
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
from sglang.srt.model_loader.eagle3_formats import draft_model_config
from sglang.srt.model_loader.loader import weight_bytes
from sglang.srt.model_executor.cuda_graph_runner import CudaGraphRunner, graph_batch_sizes, maybe_prefill_graph_runner
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.sampling.penalties import PenaltyCounts
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
from sglang.srt.sampling.simulated_acceptance import SimulatedAcceptance
from sglang.srt.server_args import MAX_SPECULATIVE_STEPS, ServerArgs
from sglang.srt.speculative.spec_sampling import (
    ChainVerdict,
    draw_draft,
    filtered_probs,
    verify_greedy,
    verify_sampled,
)
from sglang.srt.speculative.spec_grammar import GrammarLookahead, masked_draft_logits
from sglang.srt.speculative.draft_catch_up import DraftCatchUp
from sglang.srt.speculative.eagle_cuda_graphs import SpecStepGraphs
from sglang.srt.speculative.spec_policy import policy_class, reachable_steps
from sglang.srt.speculative.spec_stats import PhaseTimer, SpecStats
from sglang.srt.speculative.step_costs import measure_step_costs
from sglang.srt.utils import host_to_device

logger = logging.getLogger(__name__)

# Speculative steps whose phases are timed (CUDA events): one in this many.
PHASE_TIMED_EVERY = 8


@dataclasses.dataclass
class SpecStepResult(HostCopies):
    """A speculative decode step's outcome; `wait_host` gives host copies of tokens and counts."""

    tokens: torch.Tensor  # int64[bs, k + 1], the first num_out of each row are the output
    num_out: Optional[torch.Tensor]  # int64[bs]; None for a plain step (one token each)
    token_logprobs: Optional[torch.Tensor] = None  # float32[bs, k + 1]
    top_logprobs: Optional[torch.Tensor] = None  # float32[bs, k + 1, N]
    top_logprob_ids: Optional[torch.Tensor] = None
    timer: Optional["PhaseTimer"] = None
    # A plain step's free probe: whether the draft's guess d_1 was the target's token (bool[bs]).
    probe_hits: Optional[torch.Tensor] = None

    _HOST_FIELDS = ("tokens", "num_out", "token_logprobs", "top_logprobs", "top_logprob_ids", "probe_hits")


class EAGLEWorkerV2(TpModelWorker):
    """The speculative worker. Besides TpModelWorker's interface (forward_batch_generation, ...),
    the draft catch-up, the whole-step graphs and the start-up step costs use:
    - `spec_body` / `plain_body`: one speculative / plain step over request rows on the device,
      reading and writing device state only (so a graph can capture it);
    - `store_next_draft`: the draft's guess d_1 and hidden state for the next step of some rows;
    - the rows' state on the device (`next_input`, `next_start`, `next_offset`), the two model
      runners, `scratch_row` (a request-table row no request gets), `reachable_steps` and
      `step_graphs`."""

    def __init__(self, server_args: ServerArgs, model_config: ModelConfig, hooks: BenchHooks = bench_hooks.OFF):
        self.device = server_args.device
        self.model_config = model_config
        self.k = server_args.speculative_num_steps
        draft_config = self._make_runners(server_args, model_config)
        rows = self.model_runner.req_to_token_pool.size
        self.vocab_size = model_config.vocab_size
        self.draft_vocab_size = self.draft_model.draft_vocab_size
        # Penalized requests: penalized in the prefill, the plain step and at every verify position
        # (the drafts before it counted); the drafts themselves are not penalized.
        self.penalty_counts = PenaltyCounts(self.vocab_size, self.device)
        self._make_row_state(rows, draft_config, server_args.grammar_backend != "none")
        # catch-up: plain steps run the target only and keep, per row, the aux states and sampled
        # tokens of their positions for the draft extend that catches up at the next SPEC step.
        self.draft_sync = server_args.speculative_draft_sync
        self.draft_catch_up = DraftCatchUp(
            self,
            rows,
            tokens_per_forward=server_args.chunked_prefill_size,
            buffered=self.draft_sync == "catch-up",
            aux_width=3 * model_config.hidden_size,
            aux_dtype=model_config.dtype,
        )
        self.stats = SpecStats(self.k)
        self._steps_since_timed = 0  # see _phase_timer
        simulated = hooks.simulated_accept_length  # benchmarks only (bench_hooks.SIMULATE_ACC_LEN_ENV)
        self.simulated = None if simulated is None else SimulatedAcceptance(simulated, self.k, rows, self.device)
        # Every k > 0 the speculation policy can choose; graphs are captured for each.
        self.policy_class = policy_class(server_args.speculative_policy)
        self.reachable_steps = reachable_steps(server_args)
        self.step_graphs: dict[int, SpecStepGraphs] = {}
        self.target_step_graphs: Optional[SpecStepGraphs] = None
        self._capture_graphs(draft_config, model_config, server_args)
        logger.info(
            "EAGLE-3: draft %s (%d layer, draft vocabulary %d), k = %d, aux layers %s; policy %s%s",
            server_args.speculative_draft_model_path,
            draft_config.num_hidden_layers,
            self.draft_vocab_size,
            self.k,
            list(self.draft_runner.aux_layer_ids),
            server_args.speculative_policy,
            _policy_steps(self.reachable_steps, self.k),
        )

    def _make_runners(self, server_args: ServerArgs, model_config: ModelConfig) -> ModelConfig:
        """The target's ModelRunner (its memory plan counting the draft) and the draft's; returns
        the draft's config."""
        draft_config = draft_model_config(
            server_args.speculative_draft_model_path,
            server_args.dtype,
            self.device,
            model_config,
            server_args.load_format,
        )
        # Verify and chain positions can run up to k past a request's last kept token: give both
        # rotary tables and the request table that margin.
        margin = MAX_SPECULATIVE_STEPS + 1
        model_config.hf_config.max_position_embeddings = model_config.context_len + margin
        draft_config.hf_config.max_position_embeddings = model_config.context_len + margin
        draft_kv = MHATokenToKVPool.bytes_per_token(
            draft_config.dtype,
            kv_heads_per_rank(draft_config.num_key_value_heads, tensor_parallel().size),
            draft_config.head_dim,
            draft_config.num_hidden_layers,
        )
        draft_weights = weight_bytes(draft_config, server_args.load_format)
        self.model_runner = ModelRunner(
            model_config,
            server_args,
            draft_kv_bytes_per_token=draft_kv,
            extra_positions=margin,
            reserve_bytes=draft_weights,
            extra_rows=1,
            capture_prefill_graphs=False,
        )
        # A request-table row no request gets: the padding rows of the step graphs point at it.
        self.scratch_row = self.model_runner.req_to_token_pool.alloc()
        self.draft_runner = ModelRunner(draft_config, server_args, target=self.model_runner)
        self.draft_model = self.draft_runner.model
        return draft_config

    def _make_row_state(self, rows: int, draft_config: ModelConfig, grammars: bool) -> None:
        """Each request row's state between steps, on the device (see the module docstring)."""
        zeros = dict(device=self.device)
        self.next_draft = torch.zeros(rows, dtype=torch.int64, **zeros)  # d_1, target ids
        self.next_draft_probs = torch.zeros(rows, self.draft_vocab_size, dtype=torch.float32, **zeros)
        # Constrained rows redraw d_1 under their grammar's mask from the draft's logits, kept by
        # the steps of batches with a constrained request (`keep_draft_logits`).
        self.next_draft_logits = None
        if grammars:
            self.next_draft_logits = torch.zeros(rows, self.draft_vocab_size, dtype=draft_config.dtype, **zeros)
            self.draft_to_target = self.draft_model.to_target_ids(torch.arange(self.draft_vocab_size, **zeros))
        self.keep_draft_logits = False  # set per step: whether its batch has a constrained request
        self.next_hidden = torch.zeros(rows, draft_config.hidden_size, dtype=draft_config.dtype, **zeros)
        # The next step's input token x (verified, no KV yet), its position m, and its output
        # index + 1 (the random stream of the step's first new token).
        self.next_input = torch.zeros(rows, dtype=torch.int64, **zeros)
        self.next_start = torch.zeros(rows, dtype=torch.int64, **zeros)
        self.next_offset = torch.zeros(rows, dtype=torch.int64, **zeros)

    def _capture_graphs(self, draft_config: ModelConfig, target_config: ModelConfig, server_args: ServerArgs) -> None:
        """Graphs at every batch-size bucket of plain decode, for every k the policy can reach:
        the target's verify (k + 1 tokens per request, aux captured) and the draft extend (k + 1
        tokens, aux input); the draft's chain step (one token, its own hidden state as input); the
        plain step's two forwards; and (unless disabled) one graph per k for a whole greedy step."""
        sizes = graph_batch_sizes(self.model_runner)
        if sizes is None:
            return
        aux_width = 3 * target_config.hidden_size
        target_runners = [
            CudaGraphRunner(self.model_runner, sizes, ForwardMode.TARGET_VERIFY, k + 1, capture_aux=True)
            for k in self.reachable_steps
        ]
        draft_runners = [
            CudaGraphRunner(self.draft_runner, sizes, ForwardMode.DRAFT_EXTEND, k + 1, spec_hidden_width=aux_width)
            for k in self.reachable_steps
        ]
        if any(k > 1 for k in self.reachable_steps):
            draft_runners.append(
                CudaGraphRunner(
                    self.draft_runner, sizes, ForwardMode.DECODE, 1, spec_hidden_width=draft_config.hidden_size
                )
            )
        # A plain step of this worker: the target decodes with aux capture, the draft extends by one.
        target_runners.append(CudaGraphRunner(self.model_runner, sizes, ForwardMode.DECODE, 1, capture_aux=True))
        draft_runners.append(
            CudaGraphRunner(self.draft_runner, sizes, ForwardMode.DRAFT_EXTEND, 1, spec_hidden_width=aux_width)
        )
        for runner in target_runners + draft_runners:
            runner.capture()
        # Prefills (and the draft's pass over them) of up to --prefill-cuda-graph-max-tokens; last,
        # so that the fixed shapes above take the batches they fit.
        target_runners.append(maybe_prefill_graph_runner(self.model_runner, capture_aux=True))
        draft_runners.append(
            maybe_prefill_graph_runner(self.draft_runner, ForwardMode.DRAFT_EXTEND, spec_hidden_width=aux_width)
        )
        self.model_runner.graph_runners += [runner for runner in target_runners if runner is not None]
        self.draft_runner.graph_runners += [runner for runner in draft_runners if runner is not None]
        if not server_args.disable_speculative_step_graph:
            plain = [0] if self.policy_class.plain_steps_follow_draft else []
            for k in plain + self.reachable_steps:  # k = 0: the plain step
                self.step_graphs[k] = SpecStepGraphs(self, sizes, k)
                self.step_graphs[k].capture()
            # The plain step of a batch the draft follows not at all: the target alone.
            self.target_step_graphs = SpecStepGraphs(self, sizes, 0, draft=False)
            self.target_step_graphs.capture()

    # ---- entry ---------------------------------------------------------------------------

    def forward_batch_generation(self, batch: ScheduleBatch):
        self.keep_draft_logits = batch.grammars is not None
        if not batch.forward_mode.is_decode():
            return self.forward_prefill(batch)
        if batch.spec_steps == 0:
            return self.forward_plain_step(batch)
        return self.forward_spec_step(batch)

    # ---- prefill -------------------------------------------------------------------------

    def prefill_pass_fits(self, num_reqs: int, num_tokens: int) -> Optional[bool]:
        """As TpModelWorker's, for the target's prefill and the draft's pass over it both."""
        target = self.model_runner.prefill_pass_fits(num_reqs, num_tokens)
        if not target:
            return target
        return self.draft_runner.prefill_pass_fits(num_reqs, num_tokens) is not False

    def forward_prefill(self, batch: ScheduleBatch) -> GenerationBatchResult:
        fb, offsets = batch.to_forward_batch(self.device)
        # Requests admitted while speculation does not pay (Req.draft.cold) skip the draft's pass.
        warm = [i for i, req in enumerate(batch.reqs) if not req.draft.cold]
        fb.capture_aux_hidden_states = bool(warm)
        out = self.model_runner.forward(fb)
        info = self.sampling_info(batch.reqs)
        next_ids = self.model_runner.sample(
            self.adjust_logits(out.next_token_logits, batch.grammars, info), info, offsets
        )
        self.penalty_counts.count(next_ids, info.penalties)
        result = GenerationBatchResult(out, next_ids)
        if any(req.return_logprob for req in batch.reqs):
            self._add_logprobs(result, max(req.top_logprobs_num for req in batch.reqs))
        if warm:
            self._draft_prefill(batch, fb, out.aux_hidden_states, next_ids, info, offsets, warm)
        if self.simulated is not None:
            self.simulated.admit(batch.reqs, fb.req_pool_indices)
        # For a request whose prompt is done, the sampled token is the first step's input.
        self.next_input[fb.req_pool_indices] = next_ids
        self.next_start[fb.req_pool_indices] = fb.seq_lens
        self.next_offset[fb.req_pool_indices] = offsets + 1
        result.start_copy_to_host()
        return result

    def _draft_prefill(
        self,
        batch: ScheduleBatch,
        fb: ForwardBatch,
        aux: torch.Tensor,
        next_ids: torch.Tensor,
        info: SamplingBatchInfo,
        offsets: torch.Tensor,
        warm: list[int],
    ) -> None:
        """The draft over the prefill's positions of the requests `warm` (indices into the
        batch), each position fed the token after it: the next prompt token for a chunk, the
        sampled token at a prompt's end."""
        shifted, finals = [], []
        for j, i in enumerate(warm):
            req = batch.reqs[i]
            end = req.kv_len + req.extend_len
            shifted.extend(req.token_slice(req.kv_len + 1, end))
            if end < req.seq_len:  # a chunk: the next prompt token follows
                shifted.extend(req.token_slice(end, end + 1))
            else:
                finals.append(j)
                shifted.append(0)  # the sampled token, filled in on the device below
        input_ids = host_to_device(shifted, self.device)
        if len(warm) == batch.batch_size:
            # The draft scores no prompt tokens: the target's logits give the prompt logprobs.
            draft_fb = dataclasses.replace(
                fb,
                forward_mode=ForwardMode.DRAFT_EXTEND,
                input_ids=input_ids,
                input_ids_host=None,
                capture_aux_hidden_states=False,
                spec_hidden_states=aux,
                input_logprob_rows=None,
                input_logprob_targets=None,
                input_top_logprobs_num=0,
            )
            warm_ids, warm_offsets = next_ids, offsets
        else:
            draft_fb, sub = self._warm_part(fb, aux, input_ids, warm)
            info = self.sampling_info([batch.reqs[i] for i in warm])
            warm_ids, warm_offsets = next_ids[sub], offsets[sub]
        last = draft_fb.last_token_indices()
        if len(finals) == len(warm):  # every prompt ends here (the common case): no row index needed
            input_ids[last] = warm_ids
        elif finals:
            rows = host_to_device(finals, self.device)  # pinned: a plain .to() would wait for the target's forward
            input_ids[last[rows]] = warm_ids[rows]
        draft_out = self.draft_runner.forward(draft_fb)
        self.store_next_draft(
            draft_fb.req_pool_indices,
            draft_out.next_token_logits,
            draft_out.hidden_states[last],
            info,
            warm_offsets + 1,
        )

    def _warm_part(self, fb: ForwardBatch, aux: torch.Tensor, input_ids: torch.Tensor, warm: list[int]):
        """The draft's DRAFT_EXTEND over the prefill `fb`'s requests `warm` (indices into it), and
        those indices on the device."""
        lens = fb.extend_seq_lens_cpu
        starts = [0, *itertools.accumulate(lens)]
        tokens = host_to_device([t for i in warm for t in range(starts[i], starts[i + 1])], self.device)
        sub = host_to_device(warm, self.device)
        draft_fb = ForwardBatch(
            forward_mode=ForwardMode.DRAFT_EXTEND,
            batch_size=len(warm),
            input_ids=input_ids,
            positions=fb.positions[tokens],
            req_pool_indices=fb.req_pool_indices[sub],
            seq_lens=fb.seq_lens[sub],
            out_cache_loc=fb.out_cache_loc[tokens],
            seq_lens_cpu=[fb.seq_lens_cpu[i] for i in warm],
            extend_seq_lens_cpu=[lens[i] for i in warm],
            extend_prefix_lens_cpu=[fb.extend_prefix_lens_cpu[i] for i in warm],
            spec_hidden_states=aux[tokens],
        )
        return draft_fb, sub

    # ---- one speculative step ------------------------------------------------------------

    def forward_spec_step(self, batch: ScheduleBatch) -> SpecStepResult:
        """Reads each request's input token, position and output index from the device rows,
        so it can be launched before the previous step's accepted lengths reach the host. A
        greedy step without logprobs replays one graph for the whole step when one is captured."""
        k = self.k if batch.spec_steps is None else batch.spec_steps
        bs = batch.batch_size
        timer = self._phase_timer()
        row_ids = [req.req_pool_idx for req in batch.reqs]
        rows = self._draft_work(batch, row_ids)
        logprobs = any(req.return_logprob for req in batch.reqs)
        greedy = _graph_sampling(batch.reqs)
        # Requests the draft does not follow (opted out, or admitted without the draft's pass)
        # take plain decoding's token.
        opted = [not req.speculates for req in batch.reqs]
        any_opted = any(opted)
        graphs = self.step_graphs.get(k)
        grammars = batch.grammars  # constrained batches run eagerly: their masks come from the host
        if graphs is not None and grammars is None and graphs.can_run(bs, greedy, logprobs):
            tokens, num_out = graphs.replay(
                row_ids, batch.out_cache_loc_host.numpy(), opted_out=opted if any_opted else None
            )
            if timer is not None:
                timer.mark("step")
            result = SpecStepResult(tokens=tokens, num_out=num_out, timer=timer)
        else:
            rows = host_to_device(row_ids, self.device) if rows is None else rows
            opted_out = host_to_device(opted, self.device).bool() if any_opted else None
            info = self.sampling_info(batch.reqs)
            lookahead = None if grammars is None else GrammarLookahead(grammars, self.vocab_size, self.device)
            tokens, num_out, target_logits = self.spec_body(
                rows, self._device_slots(batch), k, info, timer, opted_out=opted_out, grammar=lookahead
            )
            result = SpecStepResult(tokens=tokens, num_out=num_out, timer=timer)
            if logprobs:
                self._add_step_logprobs(result, target_logits, max(req.top_logprobs_num for req in batch.reqs))
        result.start_copy_to_host()
        return result

    def spec_body(
        self,
        rows: torch.Tensor,
        out_cache_loc: torch.Tensor,
        k: int,
        info: SamplingBatchInfo,
        timer: Optional["PhaseTimer"] = None,
        capturing: bool = False,
        opted_out: Optional[torch.Tensor] = None,
        grammar: Optional[GrammarLookahead] = None,
    ):
        """One speculative step of the requests in `rows` over the slots `out_cache_loc`
        ([bs * (k + 1)]); returns (tokens [bs, k + 1], num_out [bs], target logits). Everything
        else it reads and writes is device state, so the whole step can be captured in a graph
        (`capturing`: sub-forwards run eagerly, inside the capture). `opted_out` (bool[bs]):
        rows whose requests never speculate; they take the target's next token as a plain step
        samples it, and their drafts are dropped. `grammar`: the constrained rows' masks, per
        position, for the drafts and the verification (spec_grammar.py; eager steps only)."""
        bs, width = rows.shape[0], k + 1
        forward_target = self.model_runner.forward_eager if capturing else self.model_runner.forward
        forward_draft = self.draft_runner.forward_eager if capturing else self.draft_runner.forward
        starts = self.next_start[rows]  # m: position of each request's input token
        offsets = self.next_offset[rows]  # output index of each row's first token this step
        slots = out_cache_loc.view(bs, width)
        # The step's slots hold positions m .. m + k: record them in the request table here,
        # on the device, since the host may not know m yet.
        steps = torch.arange(width, device=self.device)
        table = self.model_runner.req_to_token_pool.req_to_token
        table[rows[:, None], starts[:, None] + steps] = slots.to(table.dtype)
        drafts, draft_probs = self._draft_chain(rows, starts, offsets, slots, k, info, forward_draft, grammar)
        if timer is not None:
            timer.mark("draft")
        verify_fb = self._verify_batch(rows, starts, steps, drafts, out_cache_loc)
        verify_out = forward_target(verify_fb)
        target_logits = verify_out.next_token_logits.view(bs, width, -1)
        verdict = self._accept(rows, target_logits, drafts, draft_probs, info, starts, offsets, opted_out, grammar)
        if timer is not None:
            timer.mark("verify")
        # Draft extend over the verified positions, fed the output tokens (shifted by one).
        extend_fb = dataclasses.replace(
            verify_fb,
            forward_mode=ForwardMode.DRAFT_EXTEND,
            input_ids=verdict.tokens.reshape(-1),
            capture_aux_hidden_states=False,
            spec_hidden_states=verify_out.aux_hidden_states,
        )
        self._after_verify(rows, forward_draft(extend_fb), verdict, width, info, starts, offsets)
        if timer is not None:
            timer.mark("extend")
        return verdict.tokens, verdict.num_out, target_logits

    def _verify_batch(self, rows, starts, steps, drafts, out_cache_loc) -> ForwardBatch:
        """The target over [x, d_1 .. d_k] at positions m .. m + k, aux states captured."""
        bs, width = rows.shape[0], len(drafts) + 1
        return ForwardBatch(
            forward_mode=ForwardMode.TARGET_VERIFY,
            batch_size=bs,
            input_ids=torch.cat([self.next_input[rows][:, None], torch.stack(drafts, dim=1)], dim=1).reshape(-1),
            positions=(starts[:, None] + steps).reshape(-1),
            req_pool_indices=rows,
            seq_lens=starts + width,
            out_cache_loc=out_cache_loc,
            seq_lens_cpu=None,
            extend_seq_lens_cpu=[width] * bs,
            extend_prefix_lens_cpu=None,
            return_all_logits=True,
            capture_aux_hidden_states=True,
        )

    def _draft_chain(self, rows, starts, offsets, slots, k: int, info, forward_draft, grammar):
        """d_1 .. d_k (target ids) and, when sampling, q of each: d_1 is stored; each of the k - 1
        draft forwards proposes the next, its KV at positions m .. m + k - 2."""
        bs = rows.shape[0]
        drafts = [self.next_draft[rows]]
        draft_probs = [] if info.is_all_greedy else [self.next_draft_probs[rows]]
        if grammar is not None:  # constrained rows redraw d_1 under their grammar
            grammar.redraw_first_draft(
                self.next_draft_logits[rows],
                self.draft_to_target,
                self.draft_model.to_target_ids,
                info,
                offsets,
                drafts,
                draft_probs,
            )
        hidden = self.next_hidden[rows]
        for j in range(1, k):
            fb = ForwardBatch(
                forward_mode=ForwardMode.DECODE,
                batch_size=bs,
                input_ids=drafts[-1],
                positions=starts + j - 1,
                req_pool_indices=rows,
                seq_lens=starts + j,
                out_cache_loc=slots[:, j - 1].contiguous(),
                seq_lens_cpu=None,
                extend_seq_lens_cpu=[1] * bs,
                extend_prefix_lens_cpu=None,
                spec_hidden_states=hidden,
            )
            out = forward_draft(fb)
            logits = out.next_token_logits
            if grammar is not None:  # d_{j+1} under the mask after d_1 .. d_j
                grammar.advance(drafts[-1])
                logits = masked_draft_logits(logits, grammar.next_mask(), self.draft_to_target)
            drafts.append(self.draft_model.to_target_ids(draw_draft(logits, info, offsets + j)))
            if not info.is_all_greedy:  # q is only read by rejection sampling
                draft_probs.append(filtered_probs(logits, info))
            hidden = out.hidden_states
        return drafts, draft_probs

    def _accept(self, rows, target_logits, drafts, draft_probs, info, starts, offsets, opted_out, grammar):
        """The verdict on the drafts (ChainVerdict): greedy, rejection sampling or simulated, each
        position judged against the distribution plain decoding samples from there (the grammar's
        mask, then the penalties with the drafts before it counted as generated, then logit_bias);
        opted-out rows take plain decoding's token. Counts the accepted tokens for the penalties."""
        bs, k = rows.shape[0], len(drafts)
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
            q = torch.stack(draft_probs, dim=1)  # [bs, k, draft vocab]
            q_full = torch.zeros(bs, k, self.vocab_size, dtype=torch.float32, device=self.device)
            q_full.index_add_(
                2, self.draft_model.to_target_ids(torch.arange(self.draft_vocab_size, device=self.device)), q
            )
            verdict = verify_sampled(target_logits, draft_tokens, q_full, info, offsets)
        if opted_out is not None:
            plain = self.model_runner.sample(target_logits[:, 0], info, offsets)
            tokens = verdict.tokens.clone()
            tokens[:, 0] = torch.where(opted_out, plain, tokens[:, 0])
            verdict = ChainVerdict(tokens=tokens, num_out=torch.where(opted_out, 1, verdict.num_out))
        self.penalty_counts.count_accepted(verdict.tokens, verdict.num_out, info.penalties)
        return verdict

    def _after_verify(self, rows, extend_out, verdict: ChainVerdict, width: int, info, starts, offsets) -> None:
        """The rows' state for the next step: the draft's guess and hidden state at the last
        accepted position, and the last output token (the bonus or the resampled one) as input."""
        last_kept = torch.arange(rows.shape[0], device=self.device) * width + verdict.num_out - 1
        logits, hidden = extend_out.next_token_logits[last_kept], extend_out.hidden_states[last_kept]
        self.store_next_draft(rows, logits, hidden, info, offsets + verdict.num_out)
        self.next_input[rows] = verdict.tokens.gather(1, (verdict.num_out - 1)[:, None]).squeeze(1)
        self.next_start[rows] = starts + verdict.num_out
        self.next_offset[rows] = offsets + verdict.num_out

    def forward_plain_step(self, batch: ScheduleBatch) -> SpecStepResult:
        """A decode step without speculation that leaves the same state a speculative step would:
        the target decodes one token (capturing its aux states), and a one-token draft extend at
        the same position keeps the draft's KV, hidden state and next guess current. So the next
        step can speculate again with no catch-up, and the output is plain decoding's. A batch
        with no request the draft follows (see Req.draft.cold) runs the target alone. Under catch-up
        each followed request falls one position further behind (SpecScheduling counts it, Req.draft)."""
        row_ids = [req.req_pool_idx for req in batch.reqs]
        rows = self._draft_work(batch, row_ids, catch_up=False)
        # No request the draft follows: the target alone, through plain decoding's graphs.
        follow = any(req.speculates for req in batch.reqs)
        behind = None
        if self.draft_sync == "catch-up" and follow:
            behind = [req.draft.behind for req in batch.reqs]
        logprobs = any(req.return_logprob for req in batch.reqs)
        greedy = _graph_sampling(batch.reqs)
        graphs = self.step_graphs.get(0) if follow else self.target_step_graphs
        grammars = batch.grammars
        if graphs is not None and grammars is None and graphs.can_run(batch.batch_size, greedy, logprobs):
            next_ids, hits = graphs.replay(row_ids, batch.out_cache_loc_host.numpy(), behind)
        else:
            rows = host_to_device(row_ids, self.device) if rows is None else rows
            behind = None if behind is None else host_to_device(behind, self.device)
            next_ids, target_logits, hits = self.plain_body(
                rows, self._device_slots(batch), self.sampling_info(batch.reqs), behind, draft=follow, grammars=grammars
            )
        # num_out None: one token each (the host needs no copy to know it); no phase timer.
        result = SpecStepResult(tokens=next_ids[:, None], num_out=None, probe_hits=hits)
        if logprobs:
            self._add_step_logprobs(result, target_logits[:, None], max(r.top_logprobs_num for r in batch.reqs))
        result.start_copy_to_host()
        return result

    def _phase_timer(self) -> Optional["PhaseTimer"]:
        """A phase timer for one speculative step in PHASE_TIMED_EVERY (the first included): the
        phase times are a mean over recent steps, and two timing events cost a step ~10 us."""
        self._steps_since_timed = (self._steps_since_timed + 1) % PHASE_TIMED_EVERY
        return PhaseTimer(self.device) if self._steps_since_timed == 1 % PHASE_TIMED_EVERY else None

    def _draft_work(self, batch: ScheduleBatch, row_ids: list[int], catch_up: bool = True) -> Optional[torch.Tensor]:
        """Before a decode step: the draft's passes that bring requests it adopts (and, before a
        speculative step, requests behind it; `catch_up`) level with the target. Returns the
        rows on the device if it made them for that, else None (a step replayed from a graph
        takes its rows as host values)."""
        if not any(req.draft.adopting or (catch_up and req.draft.behind) for req in batch.reqs):
            return None
        rows = host_to_device(row_ids, self.device)
        self.draft_catch_up.adopt(batch, rows)
        if catch_up:
            self.draft_catch_up.catch_up(batch, rows)
        return rows

    def _device_slots(self, batch: ScheduleBatch) -> torch.Tensor:
        """The decode step's KV slots on the device, for the steps not replayed from a graph
        (which copy the host slots with the rest of their inputs)."""
        if batch.out_cache_loc is None:
            batch.out_cache_loc = batch.out_cache_loc_host.to(self.device, non_blocking=True)
        return batch.out_cache_loc

    def plain_body(
        self,
        rows: torch.Tensor,
        out_cache_loc: torch.Tensor,
        info: SamplingBatchInfo,
        behind: Optional[torch.Tensor] = None,
        capturing: bool = False,
        draft: bool = True,
        grammars: Optional[list] = None,
    ):
        """The plain step of the requests in `rows` over the slots `out_cache_loc` ([bs]): the
        target decodes one token (capturing its aux states), then the draft follows it, warm or
        catch-up. Returns (tokens [bs], target logits, probe hits [bs] or None). `behind`:
        int64[bs] on the device, each row's plain steps since the draft last caught up (catch-up
        only). Like the speculative body it reads and writes device state only, so it can be
        captured (`capturing`: sub-forwards run eagerly, inside the capture). `draft` False:
        no row is followed by the draft; the target decodes alone, without aux states. `grammars`:
        each row's matcher or None (eager steps only), masking the target's token."""
        bs = rows.shape[0]
        forward_target = self.model_runner.forward_eager if capturing else self.model_runner.forward
        forward_draft = self.draft_runner.forward_eager if capturing else self.draft_runner.forward
        starts, offsets = self.next_start[rows], self.next_offset[rows]
        table = self.model_runner.req_to_token_pool.req_to_token
        table[rows, starts] = out_cache_loc.to(table.dtype)
        fb = ForwardBatch(
            forward_mode=ForwardMode.DECODE,
            batch_size=bs,
            input_ids=self.next_input[rows],
            positions=starts,
            req_pool_indices=rows,
            seq_lens=starts + 1,
            out_cache_loc=out_cache_loc,
            seq_lens_cpu=None,
            extend_seq_lens_cpu=[1] * bs,
            extend_prefix_lens_cpu=None,
            capture_aux_hidden_states=draft,
        )
        out = forward_target(fb)
        next_ids = self.model_runner.sample(self.adjust_logits(out.next_token_logits, grammars, info), info, offsets)
        self.penalty_counts.count(next_ids, info.penalties)
        hits = None
        if draft and self.draft_sync == "catch-up":
            if behind is None:
                behind = torch.zeros(bs, dtype=torch.int64, device=self.device)
            self.draft_catch_up.buffer(rows, out.aux_hidden_states, next_ids, behind)
        elif draft:
            hits = self._keep_draft_warm(fb, out, next_ids, info, offsets, forward_draft)
        self.next_input[rows] = next_ids
        self.next_start[rows] = starts + 1
        self.next_offset[rows] = offsets + 1
        return next_ids, out.next_token_logits, hits

    def _keep_draft_warm(self, fb: ForwardBatch, out, next_ids, info, offsets, forward_draft) -> torch.Tensor:
        """A warm plain step's draft: a one-token extend at the same position keeps it current.
        Returns the probe hits (bool[bs]): whether its stored guess d_1 was the target's token, an
        acceptance sample for free."""
        rows, starts = fb.req_pool_indices, fb.positions
        if self.simulated is None:
            hits = self.next_draft[rows] == next_ids
        else:
            hits = self.simulated.probe_hits(starts, rows)
        # One token per row: every token's logits are the last ones (and need no host-made
        # index, which a graph capture could not copy).
        draft_fb = dataclasses.replace(
            fb,
            forward_mode=ForwardMode.DRAFT_EXTEND,
            input_ids=next_ids,
            capture_aux_hidden_states=False,
            spec_hidden_states=out.aux_hidden_states,
            return_all_logits=True,
        )
        draft_out = forward_draft(draft_fb)
        self.store_next_draft(rows, draft_out.next_token_logits, draft_out.hidden_states, info, offsets + 1)
        return hits

    def measure_step_costs(self, repeats: int = 3) -> dict:
        """Seconds per decode step of each shape the policy can choose (step_costs.py)."""
        return measure_step_costs(self, repeats)

    def store_next_draft(self, rows, logits, hidden, info: SamplingBatchInfo, offsets) -> None:
        """Draw d_1 for the step after this one and keep it with q and the hidden state."""
        draft_ids = draw_draft(logits, info, offsets)
        self.next_draft[rows] = self.draft_model.to_target_ids(draft_ids)
        if not info.is_all_greedy:  # a greedy request never reads its q
            self.next_draft_probs[rows] = filtered_probs(logits, info)
        self.next_hidden[rows] = hidden.to(self.next_hidden.dtype)
        if self.keep_draft_logits:
            self.next_draft_logits[rows] = logits.to(self.next_draft_logits.dtype)

    @staticmethod
    def _add_step_logprobs(result: SpecStepResult, target_logits: torch.Tensor, top_n: int) -> None:
        # From the raw logits (before temperature and filters), as the plain worker reports them.
        logprobs = torch.log_softmax(target_logits.float(), dim=-1)
        result.token_logprobs = logprobs.gather(2, result.tokens[:, :, None]).squeeze(2)
        if top_n > 0:
            result.top_logprobs, result.top_logprob_ids = logprobs.topk(top_n, dim=-1)


def _policy_steps(reachable: list[int], k: int) -> str:
    """What the start-up line adds after the policy's name: the k it chooses from, where that is
    more than k alone."""
    if not reachable:
        return " (plain steps only)"
    if reachable == [k]:
        return ""
    return f" (each step plain or k in {reachable})"


def _graph_sampling(reqs) -> bool:
    """Whether every request samples as the whole-step graphs do: greedy, with no logit_bias and
    no penalty (the graphs apply neither); other batches run eagerly."""
    return all(
        req.sampling_params.is_greedy and not req.sampling_params.logit_bias and not req.sampling_params.penalized
        for req in reqs
    )
