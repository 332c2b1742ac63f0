"""ModelRunner: owns the model, its KV memory and attention backend, and runs one forward."""

from __future__ import annotations

import dataclasses
import logging
from typing import Optional

import torch

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.distributed.parallel_state import kv_heads_per_rank, tensor_model_parallel_min, tensor_parallel
from sglang.srt.layers.attention import create_attention_backend
from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.layers.sampler import Sampler
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool, is_fp8, kv_cache_dtype
from sglang.srt.model_executor.cuda_graph_runner import (
    PrefillGraphRunner,
    maybe_graph_runner,
    maybe_prefill_graph_runner,
)
from sglang.srt.model_executor import tp_mirror
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.model_loader.kv_scales import read_kv_cache_scales
from sglang.srt.model_loader.loader import files_of_format, load_model
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
from sglang.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)

# Without a memory reading to go by (CPU), the KV pool gets at most this much.
CPU_KV_BUDGET_BYTES = 2 << 30
CPU_MAX_TOTAL_TOKENS = 65536
DEFAULT_MAX_RUNNING_REQUESTS = 512
# req_to_token is [rows, context_len] int32; keep it below this size.
REQ_TO_TOKEN_BUDGET_BYTES = 1 << 30


@dataclasses.dataclass(frozen=True)
class MemoryConfig:
    """Pool sizes derived at start-up from the args, the model and the device."""

    max_total_num_tokens: int
    max_running_requests: int
    context_len: int


class ModelRunner:
    """With `target` given, this runs an EAGLE-3 draft model: it shares the target's request
    table and slot allocator (one allocation serves both models) and owns a KV pool of its own
    layers indexed by the same slots. The speculative worker captures the draft's graphs."""

    def __init__(
        self,
        model_config: ModelConfig,
        server_args: ServerArgs,
        target: Optional["ModelRunner"] = None,
        draft_kv_bytes_per_token: int = 0,
        extra_positions: int = 0,
        reserve_bytes: int = 0,
        extra_rows: int = 0,
        capture_prefill_graphs: bool = True,
    ):
        """draft_kv_bytes_per_token: KV memory a draft model will need per slot (planned here,
        since the pools share slots). extra_positions: table columns beyond the context length
        (a verify step writes up to k positions past a request's last kept token). reserve_bytes:
        device memory kept out of the KV plan (a draft model loaded after it). extra_rows: request
        table rows beyond the running limit (a speculative worker's padding row).
        capture_prefill_graphs: False where the caller captures its own (a speculative worker's
        target, whose prefills also return the draft's aux hidden states).

        Under tensor parallelism every rank builds the same runners (rank 0 announces each one to
        the others first, see tp_mirror) and holds its share of the heads and KV heads."""
        tp = tensor_parallel()
        self.tp_rank, self.tp_size = tp.rank, tp.size
        self.tp_id = None  # this runner's id among those rank 0 announced (rank 0 only)
        if tp_mirror.drives():
            self.tp_id = tp_mirror.announce_runner(
                model_config,
                dict(
                    draft_kv_bytes_per_token=draft_kv_bytes_per_token,
                    extra_positions=extra_positions,
                    reserve_bytes=reserve_bytes,
                    extra_rows=extra_rows,
                    capture_prefill_graphs=capture_prefill_graphs,
                ),
                target.tp_id if target is not None else None,
            )
        self.num_heads = model_config.num_attention_heads // tp.size
        self.num_kv_heads = kv_heads_per_rank(model_config.num_key_value_heads, tp.size)
        self.model_config = model_config
        self.server_args = server_args
        self.device = server_args.device
        self.is_draft = target is not None
        self.draft_kv_bytes_per_token = draft_kv_bytes_per_token
        self.extra_positions = extra_positions
        self.reserve_bytes = reserve_bytes
        self.extra_rows = extra_rows
        # --kv-cache-dtype is the target's; a draft's (one-layer) KV stays in its model's dtype.
        self.kv_cache_dtype = (
            model_config.dtype if self.is_draft else kv_cache_dtype(server_args.kv_cache_dtype, model_config.dtype)
        )
        torch.manual_seed(server_args.random_seed)
        if target is None and self.tp_rank == 0:
            self._log_model()
        self.model = load_model(model_config, self.device, server_args.load_format)
        self.aux_layer_ids = None  # a draft's: the target layers whose hidden states it reads
        if target is None:
            self.memory = self._plan_memory()
            self._init_pools()
        else:
            self.aux_layer_ids = self.model.attach_to_target(target.model)
            self.memory = target.memory
            self._init_draft_pools(target)
        self.attn_backend = create_attention_backend(server_args.attention_backend, self)
        if hasattr(self.attn_backend, "precompile"):
            self.attn_backend.precompile(self)  # no kernel compiles in the middle of serving
        self.sampler = Sampler()
        if target is None and self.tp_rank == 0:  # only rank 0 samples
            self.sampler.precompile(model_config.vocab_size, self.memory.max_running_requests, self.device)
        # One CUDA graph memory pool per engine: a draft's graphs share its target's.
        self._graph_pool_owner = target if target is not None else self
        self._graph_pool = None
        # Plain decode's graphs; a speculative worker adds its own shapes to `graph_runners`.
        self.graph_runners: list = []
        if target is None:
            runners = [maybe_graph_runner(self)]
            if capture_prefill_graphs:
                runners.append(maybe_prefill_graph_runner(self))
            self.graph_runners += [runner for runner in runners if runner is not None]

    def _log_model(self) -> None:
        """The start-up line that says what is served, where (before the weights load)."""
        cfg = self.model_config
        device = f"cuda:{torch.cuda.current_device()}" if self.device == "cuda" else self.device
        logger.info(
            "Model: %s (%s, %s) on %s%s",
            cfg.path,
            cfg.architecture,
            str(cfg.dtype).removeprefix("torch."),
            device,
            f", tensor parallel over {self.tp_size} ranks" if self.tp_size > 1 else "",
        )

    def graph_memory_pool(self):
        """The memory pool every CUDA graph of this engine is captured into (made on first use).
        Owned by the engine, not the process: a pool whose graphs are all gone cannot be reused."""
        owner = self._graph_pool_owner
        if owner._graph_pool is None:
            owner._graph_pool = torch.cuda.graph_pool_handle()
        return owner._graph_pool

    def _plan_memory(self) -> MemoryConfig:
        cfg, args = self.model_config, self.server_args
        per_token = self._kv_bytes_per_token() + self.draft_kv_bytes_per_token
        detail = ""
        if self.device == "cuda":
            free, total = torch.cuda.mem_get_info()
            budget = free - total * (1 - args.mem_fraction_static) - self.reserve_bytes
            if args.replicas_per_gpu > 1:
                # Replicas sharing this GPU start at once, so what is free says little: each plans
                # from its own share, less what it holds already (its weights).
                share = total * args.mem_fraction_static / args.replicas_per_gpu
                budget = min(share - torch.cuda.memory_reserved(), free) - self.reserve_bytes
            tokens = int(budget // per_token)
            gib = 1 << 30
            detail = (
                f": after loading the model {free / gib:.1f} GiB of {total / gib:.1f} GiB are free, and "
                f"--mem-fraction-static {args.mem_fraction_static} keeps {total * (1 - args.mem_fraction_static) / gib:.1f} "
                f"GiB back (is another process using the GPU?)"
            )
            if args.replicas_per_gpu > 1:
                detail = (
                    f": {args.replicas_per_gpu} replicas share this GPU, so this one plans from 1/"
                    f"{args.replicas_per_gpu} of --mem-fraction-static {args.mem_fraction_static} "
                    f"({share / gib:.1f} GiB), of which it holds {torch.cuda.memory_reserved() / gib:.1f} GiB already"
                )
        else:
            tokens = min(CPU_MAX_TOTAL_TOKENS, CPU_KV_BUDGET_BYTES // per_token)
        if args.max_total_tokens is not None:
            tokens = args.max_total_tokens if self.device != "cuda" else min(tokens, args.max_total_tokens)
        # Every rank holds the same slots: the rank with the least memory sets the pool.
        tokens = tensor_model_parallel_min(tokens, self.device)
        if tokens < 2:
            raise RuntimeError(
                f"not enough memory for the KV cache ({tokens} tokens){detail}; raise --mem-fraction-static "
                "or use a smaller model"
            )
        rows_cap = max(1, REQ_TO_TOKEN_BUDGET_BYTES // (4 * cfg.context_len))
        running = args.max_running_requests or min(DEFAULT_MAX_RUNNING_REQUESTS, rows_cap, tokens)
        return MemoryConfig(max_total_num_tokens=tokens, max_running_requests=running, context_len=cfg.context_len)

    def _init_pools(self) -> None:
        cfg, mem = self.model_config, self.memory
        # One spare row beyond the running limit for a request being chunk-prefilled.
        self.req_to_token_pool = ReqToTokenPool(
            mem.max_running_requests + 1 + self.extra_rows, mem.context_len + self.extra_positions, self.device
        )
        self.token_to_kv_pool = MHATokenToKVPool(
            mem.max_total_num_tokens,
            self.kv_cache_dtype,
            self.num_kv_heads,
            cfg.head_dim,
            cfg.num_hidden_layers,
            self.device,
            kv_scales=self._kv_cache_scales(),
        )
        self.token_to_kv_pool_allocator = TokenToKVPoolAllocator(mem.max_total_num_tokens, self.device)
        if self.tp_rank == 0:
            logger.info(
                "KV cache: %d tokens (%.2f GiB, %s); max running requests %d; context length %d",
                mem.max_total_num_tokens,
                mem.max_total_num_tokens * self._kv_bytes_per_token() / (1 << 30),
                str(self.kv_cache_dtype).removeprefix("torch."),
                mem.max_running_requests,
                mem.context_len,
            )

    def _kv_bytes_per_token(self) -> int:
        cfg = self.model_config
        return MHATokenToKVPool.bytes_per_token(
            self.kv_cache_dtype, self.num_kv_heads, cfg.head_dim, cfg.num_hidden_layers
        )

    def _kv_cache_scales(self) -> dict[int, tuple[float, float]] | None:
        """An FP8 pool's per-layer (k_scale, v_scale) from the checkpoint (kv_scales); None otherwise."""
        if not is_fp8(self.kv_cache_dtype):
            return None
        load_format, layers = self.server_args.load_format, self.model_config.num_hidden_layers
        files = [] if load_format == "dummy" else files_of_format(self.model_config.path, load_format)
        scales = read_kv_cache_scales(files, layers)
        if self.tp_rank == 0:
            logger.info(
                "FP8 KV cache (--kv-cache-dtype %s): k/v scales of %d of %d layers from the checkpoint%s",
                self.server_args.kv_cache_dtype,
                len(scales),
                layers,
                ", 1.0 for the others" if len(scales) < layers else "",
            )
        return scales

    def _init_draft_pools(self, target: "ModelRunner") -> None:
        cfg = self.model_config
        self.req_to_token_pool = target.req_to_token_pool
        self.token_to_kv_pool_allocator = target.token_to_kv_pool_allocator
        self.token_to_kv_pool = MHATokenToKVPool(
            self.memory.max_total_num_tokens,
            self.kv_cache_dtype,
            self.num_kv_heads,
            cfg.head_dim,
            cfg.num_hidden_layers,
            self.device,
        )

    @torch.inference_mode()
    def forward(self, forward_batch: ForwardBatch, eager: bool = False) -> LogitsProcessorOutput:
        """`eager`: without graphs even where one fits (benchmarks that hook the modules)."""
        if self.tp_id is not None:
            tp_mirror.send_forward(self.tp_id, forward_batch, self.req_to_token_pool)
        for runner in () if eager else self.graph_runners:
            if runner.can_run(forward_batch):
                return runner.replay(forward_batch)
        return self.forward_eager(forward_batch)

    def prefill_pass_fits(self, num_reqs: int, num_tokens: int) -> Optional[bool]:
        """Whether a prefill of this many requests and new tokens runs about as cheaply as the
        prefill graphs allow (PrefillGraphRunner.pass_fits); None without prefill graphs."""
        runners = [runner for runner in self.graph_runners if isinstance(runner, PrefillGraphRunner)]
        if not runners:
            return None
        return any(runner.pass_fits(num_reqs, num_tokens) for runner in runners)

    @property
    def graph_runner(self):
        """Plain decode's graph runner (None without graphs)."""
        return self.graph_runners[0] if self.graph_runners else None

    @torch.inference_mode()
    def forward_eager(self, forward_batch: ForwardBatch) -> LogitsProcessorOutput:
        forward_batch.req_to_token_pool = self.req_to_token_pool
        forward_batch.token_to_kv_pool = self.token_to_kv_pool
        forward_batch.attn_backend = self.attn_backend
        self.attn_backend.init_forward_metadata(forward_batch)
        return self.model(forward_batch.input_ids, forward_batch.positions, forward_batch)

    @torch.inference_mode()
    def sample(self, logits: torch.Tensor, sampling_info: SamplingBatchInfo, offsets: torch.Tensor) -> torch.Tensor:
        return self.sampler(logits, sampling_info, offsets)
